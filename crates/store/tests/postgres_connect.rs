//! Issue 22: a PostgreSQL store that cannot be opened says why (refused, a role or database
//! that does not exist, ...), never a bare "error connecting to server" or "db error", and never
//! the URL's password.
//!
//! The refused case needs no server; the others are keyed on `RETHREAD_TEST_POSTGRES_URL`
//! (`rethread_testkit::postgres::server_url`: they skip without it, except in CI) and run in
//! the PostgreSQL stage of `cargo xtask ci`.
#![cfg(feature = "postgres")]

use rethread_store::{BindingStore, OpenOptions};

/// Opens `url` and returns the error as a person reads it.
async fn open_error(url: &str) -> String {
    match BindingStore::postgres(url, OpenOptions::new().create(false)).await {
        Ok(_) => panic!("{url} opened"),
        Err(error) => error.to_string(),
    }
}

fn server_url() -> Option<url::Url> {
    rethread_testkit::postgres::server_url("postgres_connect")
        .map(|base| url::Url::parse(&base).unwrap())
}

#[tokio::test]
async fn a_refused_connection_says_refused_and_never_the_password() {
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let shown = open_error(&format!("postgres://alice:s3cret@127.0.0.1:{port}/db")).await;
    assert!(shown.contains("connection refused"), "{shown}");
    assert!(!shown.ends_with("error connecting to server"), "{shown}");
    assert!(!shown.contains("s3cret"), "{shown}");
}

#[tokio::test]
async fn a_role_or_database_that_does_not_exist_says_so() {
    let Some(base) = server_url() else {
        return;
    };
    let mut no_role = base.clone();
    no_role.set_username("no_such_role_22").unwrap();
    no_role.set_password(Some("s3cret")).unwrap();
    let shown = open_error(no_role.as_str()).await;
    assert!(
        shown.contains(r#"authentication failed: role "no_such_role_22" does not exist"#),
        "{shown}"
    );
    assert!(!shown.contains("db error"), "{shown}");
    assert!(!shown.contains("s3cret"), "{shown}");

    let mut no_database = base;
    no_database.set_path("/no_such_database_22");
    let shown = open_error(no_database.as_str()).await;
    assert!(
        shown.contains(r#"database "no_such_database_22" does not exist"#),
        "{shown}"
    );
    assert!(!shown.contains("db error"), "{shown}");
}
