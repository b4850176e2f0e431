//! A long-running host whose codex child dies goes on with the same conversation: the binder it
//! keeps opens again on a new client and gets the same thread back, with its memory; only the
//! host's own retire starts fresh.

mod support;

use std::time::Duration;

use rethread_fake_appserver::FakeAppServer;
use rethread_runtime::{BinderOptions, OpenOutcome, SessionBinder, StatusKind, StatusRail};
use rethread_store::BindingStore;
use support::client_on;

fn options(home: &std::path::Path) -> BinderOptions {
    BinderOptions::default()
        .codex_home(Some(home.display().to_string()))
        .retry_backoff(Duration::from_millis(1))
}

#[tokio::test]
async fn a_binder_reopened_after_codex_died_resumes_the_same_thread() {
    let home = tempfile::tempdir().unwrap();
    let store: BindingStore = BindingStore::memory();
    let (stream, fake) = FakeAppServer::builder()
        .codex_home(home.path())
        .spawn_in_process()
        .unwrap();
    let (rail, events) = StatusRail::recording();
    let mut binder =
        SessionBinder::new("s", store.clone(), rail).with_options(options(home.path()));

    let client = client_on(stream).await;
    let mut session = binder.open(&client).await.unwrap();
    let first = session.thread_id().to_string();
    session.run_turn("remember PAPAYA").await.unwrap();

    // Codex dies under the host; the host starts a new one and opens the session again with
    // the binder it keeps.
    fake.kill().await;
    drop(session);
    let client = client_on(fake.restart().await.unwrap()).await;
    let mut session = binder.open(&client).await.unwrap();
    assert_eq!(
        session.outcome(),
        &OpenOutcome::Resumed {
            thread_id: first.clone()
        }
    );
    let report = session.run_turn("what fruit?").await.unwrap();
    assert_eq!(report.thread_id, first);
    assert!(
        events.messages(StatusKind::Lifecycle).is_empty(),
        "no notice"
    );
    let record = store.session("s").await.unwrap().unwrap();
    assert_eq!(record.row_count, 4, "both turns in one conversation");

    // The host's own retire is the one way to start fresh.
    session.retire().await.unwrap();
    let session = binder.open(&client).await.unwrap();
    assert!(matches!(session.outcome(), OpenOutcome::Started { .. }));
    assert_ne!(session.thread_id(), first);
    assert!(
        events.messages(StatusKind::Lifecycle).is_empty(),
        "no notice"
    );
}

#[tokio::test]
async fn a_new_binder_takes_over_once_the_old_one_and_its_sessions_are_dropped() {
    let home = tempfile::tempdir().unwrap();
    let store: BindingStore = BindingStore::memory();
    let (stream, fake) = FakeAppServer::builder()
        .codex_home(home.path())
        .spawn_in_process()
        .unwrap();
    let client = client_on(stream).await;
    let mut old = SessionBinder::new("s", store.clone(), StatusRail::default())
        .with_options(options(home.path()));
    let mut session = old.open(&client).await.unwrap();
    let thread = session.thread_id().to_string();
    session.run_turn("hello").await.unwrap();
    fake.kill().await;
    drop((session, old));

    let client = client_on(fake.restart().await.unwrap()).await;
    let mut new = SessionBinder::new("s", store.clone(), StatusRail::default())
        .with_options(options(home.path()));
    let session = new.open(&client).await.expect("the old holder is gone");
    assert_eq!(
        session.outcome(),
        &OpenOutcome::Resumed { thread_id: thread }
    );
}
