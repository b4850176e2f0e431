//! Opening stores: new files, reopening, and every way a file can be refused (never read as
//! empty).

use std::os::unix::fs::PermissionsExt;

use rethread_store::{
    open_url, BindingStore, Durability, OpenOptions, Retirement, StoreError, TurnCommit,
    SCHEMA_VERSION,
};
use serde_json::json;

fn commit(session: &str, thread: &str) -> TurnCommit {
    TurnCommit::new(session, thread, vec![json!({"thread": thread})])
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn redb_new_file_is_owner_only_and_reopens_with_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let store = BindingStore::redb(&path, OpenOptions::new()).await.unwrap();
    assert_eq!(mode(&path), 0o600);
    store.commit_turn(commit("a", "t1")).await.unwrap();
    store.close().await;
    let store = BindingStore::redb(&path, OpenOptions::new().create(false))
        .await
        .unwrap();
    assert_eq!(store.thread_id("a").await.unwrap().as_deref(), Some("t1"));
    assert_eq!(store.all_rows("a").await.unwrap().len(), 1);
}

#[tokio::test]
async fn redb_held_by_another_handle_is_locked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let first = BindingStore::redb(&path, OpenOptions::new()).await.unwrap();
    let second = BindingStore::redb(&path, OpenOptions::new()).await;
    assert!(
        matches!(second, Err(StoreError::Locked { .. })),
        "{second:?}"
    );
    first.close().await;
    BindingStore::redb(&path, OpenOptions::new()).await.unwrap();
}

#[tokio::test]
async fn missing_file_without_create_is_no_store() {
    let dir = tempfile::tempdir().unwrap();
    let r = BindingStore::redb(dir.path().join("no.redb"), OpenOptions::new().create(false)).await;
    assert!(matches!(r, Err(StoreError::NoStore { .. })), "{r:?}");
    let r = BindingStore::sqlite(dir.path().join("no.db"), OpenOptions::new().create(false)).await;
    assert!(matches!(r, Err(StoreError::NoStore { .. })), "{r:?}");
    assert!(!dir.path().join("no.db").exists());
}

#[tokio::test]
async fn garbage_files_are_corrupt_not_empty() {
    let dir = tempfile::tempdir().unwrap();
    let garbage: Vec<u8> = (0..20_000u32).map(|i| (i * 7919 % 251) as u8).collect();
    let redb_path = dir.path().join("g.redb");
    std::fs::write(&redb_path, &garbage).unwrap();
    let r = BindingStore::redb(&redb_path, OpenOptions::new()).await;
    assert!(matches!(r, Err(StoreError::Corrupt { .. })), "{r:?}");
    let sqlite_path = dir.path().join("g.db");
    std::fs::write(&sqlite_path, &garbage).unwrap();
    let r = BindingStore::sqlite(&sqlite_path, OpenOptions::new()).await;
    assert!(matches!(r, Err(StoreError::Corrupt { .. })), "{r:?}");
    // The files were not overwritten.
    assert_eq!(std::fs::read(&redb_path).unwrap(), garbage);
    assert_eq!(std::fs::read(&sqlite_path).unwrap(), garbage);
}

#[tokio::test]
async fn truncated_redb_store_is_an_error_not_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.redb");
    let store = BindingStore::redb(&path, OpenOptions::new()).await.unwrap();
    for i in 0..50 {
        store
            .commit_turn(commit(&format!("s{i}"), &format!("t{i}")))
            .await
            .unwrap();
    }
    store.close().await;
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 3]).unwrap();
    match BindingStore::redb(&path, OpenOptions::new()).await {
        Err(_) => {}
        Ok(store) => {
            // If redb recovers a prefix, it must still not claim to be empty silently: every
            // listed session has to read back whole.
            let sessions = store.all_sessions().await;
            assert!(
                sessions.is_err() || !sessions.unwrap().is_empty(),
                "a truncated store read as empty"
            );
        }
    }
}

#[tokio::test]
async fn foreign_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let redb_path = dir.path().join("f.redb");
    {
        let db = redb::Database::create(&redb_path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let def: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("other");
            txn.open_table(def).unwrap().insert("k", 1).unwrap();
        }
        txn.commit().unwrap();
    }
    let r = BindingStore::redb(&redb_path, OpenOptions::new()).await;
    assert!(matches!(r, Err(StoreError::Corrupt { .. })), "{r:?}");

    // Refused before anything is written: another program's database keeps its journal mode
    // (SQLite keeps WAL in the file's header) and gets no `-wal` or `-shm` beside it.
    let sqlite_path = dir.path().join("f.db");
    rusqlite::Connection::open(&sqlite_path)
        .unwrap()
        .execute_batch("CREATE TABLE other (x INTEGER);")
        .unwrap();
    let before = std::fs::read(&sqlite_path).unwrap();
    for create in [false, true] {
        let r = BindingStore::sqlite(&sqlite_path, OpenOptions::new().create(create)).await;
        assert!(matches!(r, Err(StoreError::Corrupt { .. })), "{r:?}");
        let after = std::fs::read(&sqlite_path).unwrap();
        assert!(after == before, "create {create}: the file was written");
        for beside in ["f.db-wal", "f.db-shm", "f.db-journal"] {
            assert!(!dir.path().join(beside).exists(), "{beside}");
        }
    }
}

#[tokio::test]
async fn newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let redb_path = dir.path().join("n.redb");
    BindingStore::redb(&redb_path, OpenOptions::new())
        .await
        .unwrap()
        .close()
        .await;
    {
        let db = redb::Database::open(&redb_path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let def: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("rethread_meta");
            txn.open_table(def)
                .unwrap()
                .insert("schema_version", SCHEMA_VERSION + 1)
                .unwrap();
        }
        txn.commit().unwrap();
    }
    let r = BindingStore::redb(&redb_path, OpenOptions::new()).await;
    assert!(
        matches!(r, Err(StoreError::NewerSchema { found, supported, .. }) if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION),
        "{r:?}"
    );

    let sqlite_path = dir.path().join("n.db");
    BindingStore::sqlite(&sqlite_path, OpenOptions::new())
        .await
        .unwrap()
        .close()
        .await;
    rusqlite::Connection::open(&sqlite_path)
        .unwrap()
        .execute_batch(&format!("PRAGMA user_version = {};", SCHEMA_VERSION + 1))
        .unwrap();
    let r = BindingStore::sqlite(&sqlite_path, OpenOptions::new()).await;
    assert!(matches!(r, Err(StoreError::NewerSchema { .. })), "{r:?}");
}

/// The store is unpublished: schema 1 is its first format, and a file stamped with any other
/// version is refused, never initialised over.
#[tokio::test]
async fn a_store_stamped_with_an_unknown_older_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let redb_path = dir.path().join("o.redb");
    {
        let db = redb::Database::create(&redb_path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let def: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("rethread_meta");
            txn.open_table(def)
                .unwrap()
                .insert("schema_version", 0)
                .unwrap();
        }
        txn.commit().unwrap();
    }
    let r = BindingStore::redb(&redb_path, OpenOptions::new()).await;
    assert!(matches!(r, Err(StoreError::Corrupt { .. })), "{r:?}");
    assert_eq!(SCHEMA_VERSION, 1);
}

#[tokio::test]
async fn sqlite_new_file_is_owner_only_and_shared_by_two_handles() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let a = BindingStore::sqlite(&path, OpenOptions::new())
        .await
        .unwrap();
    let b = BindingStore::sqlite(&path, OpenOptions::new())
        .await
        .unwrap();
    assert_eq!(mode(&path), 0o600);
    // Two writers on one file (as two processes would be): interleaved patches of distinct
    // keys and commits all survive.
    let (ra, rb) = futures::join!(
        futures::future::join_all((0..20).map(|i| {
            let key = format!("a{i}");
            let s = &a;
            async move { s.set_config_key("s", &key, Some(json!(i))).await }
        })),
        futures::future::join_all((0..20).map(|i| {
            let key = format!("b{i}");
            let s = &b;
            async move { s.set_config_key("s", &key, Some(json!(i))).await }
        })),
    );
    ra.into_iter().chain(rb).for_each(|r| {
        r.unwrap();
    });
    let (ca, cb) = futures::join!(
        futures::future::join_all((0..10).map(|i| a.commit_turn(commit("s", &format!("a{i}"))))),
        futures::future::join_all((0..10).map(|i| b.commit_turn(commit("s", &format!("b{i}"))))),
    );
    ca.into_iter().chain(cb).for_each(|r| {
        r.unwrap();
    });
    let rec = b.session("s").await.unwrap().unwrap();
    assert_eq!(rec.model_config.len(), 41, "{:?}", rec.model_config);
    assert_eq!(rec.row_count, 20);
    let rows = a.all_rows("s").await.unwrap();
    assert_eq!(
        rows.iter().map(|r| r.seq).collect::<Vec<_>>(),
        (0..20).collect::<Vec<_>>()
    );
    // A retirement written through one handle is honoured by the other.
    b.retire_thread("s", "late", Retirement::Ended, None)
        .await
        .unwrap();
    assert!(!a
        .commit_turn(commit("s", "late"))
        .await
        .unwrap()
        .is_published());
    for wal in ["s.db-wal", "s.db-shm"] {
        let p = dir.path().join(wal);
        if p.exists() {
            assert_eq!(mode(&p) & 0o077, 0, "{wal} readable by others");
        }
    }
}

#[tokio::test]
async fn relaxed_durability_is_opt_in_and_works() {
    let dir = tempfile::tempdir().unwrap();
    let options = OpenOptions::new().durability(Durability::Relaxed);
    let path = dir.path().join("r.redb");
    let store = BindingStore::redb(&path, options.clone()).await.unwrap();
    store.commit_turn(commit("a", "t1")).await.unwrap();
    store.close().await;
    let store = BindingStore::redb(&path, OpenOptions::new()).await.unwrap();
    assert_eq!(store.thread_id("a").await.unwrap().as_deref(), Some("t1"));
    let path = dir.path().join("r.db");
    let store = BindingStore::sqlite(&path, options).await.unwrap();
    store.commit_turn(commit("a", "t1")).await.unwrap();
    store.close().await;
    let store = BindingStore::sqlite(&path, OpenOptions::new())
        .await
        .unwrap();
    assert_eq!(store.thread_id("a").await.unwrap().as_deref(), Some("t1"));
}

#[tokio::test]
async fn open_url_schemes() {
    let dir = tempfile::tempdir().unwrap();
    let memory = open_url("memory:", OpenOptions::new()).await.unwrap();
    memory.commit_turn(commit("a", "t")).await.unwrap();
    let redb = format!("redb:{}", dir.path().join("u.redb").display());
    open_url(&redb, OpenOptions::new()).await.unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("u.db").display());
    open_url(&sqlite, OpenOptions::new()).await.unwrap();
    let mut bad_urls = vec!["mysql://x", "no-scheme", "redb:"];
    if cfg!(feature = "postgres") {
        // Recognised, but not a valid libpq URL.
        bad_urls.push("postgres://user@localhost:notaport/x");
    } else {
        bad_urls.push("postgres://localhost/x");
    }
    for bad in bad_urls {
        let r = open_url(bad, OpenOptions::new()).await;
        assert!(
            matches!(r, Err(StoreError::UnsupportedUrl { .. })),
            "{bad}: {r:?}"
        );
    }
    // The memory store is also constructible directly.
    let _ = BindingStore::memory();
}

/// Issue 35 item 12: a new file store's missing directory is made by the library, as the CLI
/// needs it (owner-only); `create_dirs(false)` refuses instead, and an open that may not
/// create (read-only, `create(false)`) makes no directory either.
#[tokio::test]
async fn open_url_makes_a_new_store_directory_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        format!("redb:{}", dir.path().join("a/b/s.redb").display()),
        format!("sqlite://{}", dir.path().join("c/d/s.db").display()),
    ] {
        let path = rethread_store::StoreUrl::parse(&url).unwrap();
        let (file, parent) = (path.path().unwrap(), path.path().unwrap().parent().unwrap());
        let refused = open_url(&url, OpenOptions::new().create_dirs(false)).await;
        assert!(
            matches!(refused, Err(StoreError::Io { .. })),
            "{url}: {refused:?}"
        );
        for reads in [
            OpenOptions::new().read_only(true),
            OpenOptions::new().create(false),
        ] {
            let refused = open_url(&url, reads).await;
            assert!(
                matches!(refused, Err(StoreError::NoStore { .. })),
                "{url}: {refused:?}"
            );
        }
        assert!(!parent.exists(), "{url}: nothing created");
        let store = open_url(&url, OpenOptions::new()).await.unwrap();
        store.commit_turn(commit("a", "t1")).await.unwrap();
        assert_eq!(mode(parent), 0o700, "{url}");
        assert_eq!(mode(file), 0o600, "{url}");
    }
}

#[tokio::test]
async fn store_urls_name_their_store_without_a_password() {
    use rethread_store::StoreUrl;
    let url = StoreUrl::parse("postgresql://alice:s3cret@db.example:5433/app?schema=x").unwrap();
    assert!(matches!(url, StoreUrl::Postgres(_)));
    assert!(!url.to_string().contains("s3cret"));
    assert_eq!(url.path(), None);
    let url: StoreUrl = "redb:relative/dir/s.redb".parse().unwrap();
    assert_eq!(
        url.path(),
        Some(std::path::Path::new("relative/dir/s.redb"))
    );
}

/// Hosts that start together open a new SQLite store together. Switching a new file to WAL
/// takes an exclusive lock, and SQLite answers the losers `database is locked` at once instead
/// of waiting out its busy timeout; every open must still succeed (found when `chat` and a
/// test's probe created one store at the same moment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_creating_one_sqlite_store_together_all_open_it() {
    for _ in 0..30 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.sqlite");
        let opens = (0..4).map(|_| BindingStore::sqlite(path.clone(), OpenOptions::new()));
        for opened in futures::future::join_all(opens).await {
            let store = opened.expect("a concurrent first open");
            store.close().await;
        }
    }
}
