//! A fallback's notice survives the host that gave the thread up (issue 12, "the notice can
//! vanish") and is never said twice (issue 19, item 7): the give-up write records it as
//! pending with its reason; once the rail took it, the store records it delivered; a host that
//! died in between leaves it pending, and the next open says it, with the recorded reason,
//! once.

mod support;

use rethread_testkit::faulty_store;

use std::time::Duration;

use faulty_store::Faults;
use rethread_fake_appserver::{FakeAppServer, FakeHandle, Fault, FaultScript};
use rethread_runtime::{
    BinderOptions, OpenOutcome, RecordedEvents, SessionBinder, StatusKind, StatusRail,
    RESUME_FALLBACK_NOTICE,
};
use rethread_store::BindingStore;
use support::client_on;

fn options(home: &std::path::Path) -> BinderOptions {
    BinderOptions::default()
        .codex_home(Some(home.display().to_string()))
        .retry_backoff(Duration::from_millis(1))
}

/// A new binder (a new host process) on its own rail.
fn binder(store: BindingStore, home: &std::path::Path) -> (SessionBinder, RecordedEvents) {
    let (rail, recorded) = StatusRail::recording();
    let binder = SessionBinder::new("s", store, rail).with_options(options(home));
    (binder, recorded)
}

fn lose(fake: &FakeHandle, thread: &str) {
    fake.set_faults(FaultScript::of([Fault::FailResume {
        thread_ids: vec![thread.to_string()],
        code: -32600,
        message: None,
    }]));
}

#[tokio::test]
async fn a_host_killed_after_the_give_up_leaves_the_notice_to_the_next_open_once() {
    let store = BindingStore::memory();
    let home = tempfile::tempdir().unwrap();
    let (stream, fake) = FakeAppServer::builder()
        .codex_home(home.path())
        .spawn_in_process()
        .unwrap();
    let client = client_on(stream).await;

    // A bound thread with a committed turn.
    let (mut first, _) = binder(store.clone(), home.path());
    let mut session = first.open(&client).await.unwrap();
    let lost = session.run_turn("remember PAPAYA").await.unwrap().thread_id;
    drop(session);
    first.close().await.unwrap();

    // Its rollout is lost; a host gives it up and dies before the delivery is recorded (its
    // store write never happens) or a turn runs.
    lose(&fake, &lost);
    let faults = Faults::default();
    faults.fail("mark_notice_delivered", 1);
    let dying = faulty_store::over(store.clone(), faults);
    let (mut killed, _) = binder(dying, home.path());
    let outcome = killed.open(&client).await.unwrap().outcome().clone();
    assert!(
        matches!(outcome, OpenOutcome::FellBack { .. }),
        "{outcome:?}"
    );
    drop(killed);
    let record = store.session("s").await.unwrap().unwrap();
    assert_eq!(record.thread_id(), None);
    let pending = record.pending_notice().expect("still pending");
    assert_eq!(pending.thread_id, lost);
    assert_eq!(pending.reason, "gone");

    // The next host reports the fallback and says the notice, once, with its reason.
    let (mut next, said) = binder(store.clone(), home.path());
    let mut session = next.open(&client).await.unwrap();
    match session.outcome() {
        OpenOutcome::FellBack {
            previous_thread_id,
            seeded,
            ..
        } => {
            assert_eq!(previous_thread_id, &lost);
            assert!(seeded, "the replacement is seeded like any fallback's");
        }
        other => panic!("expected a fallback, got {other:?}"),
    }
    assert_eq!(
        said.messages(StatusKind::Lifecycle),
        [RESUME_FALLBACK_NOTICE]
    );
    assert_eq!(said.events()[0].fields["reason"], "gone");
    assert_eq!(said.events()[0].fields["pending"], true);
    let new_thread = session.run_turn("and now?").await.unwrap().thread_id;
    assert_ne!(new_thread, lost);
    assert_eq!(
        said.messages(StatusKind::Lifecycle).len(),
        1,
        "said once per binder"
    );
    drop(session);
    next.close().await.unwrap();
    let record = store.session("s").await.unwrap().unwrap();
    assert_eq!(record.thread_id(), Some(new_thread.as_str()));
    assert_eq!(record.pending_notice(), None, "the commit cleared it");

    // After the commit: resumed, no notice.
    let (mut after, quiet) = binder(store.clone(), home.path());
    let outcome = after.open(&client).await.unwrap().outcome().clone();
    assert_eq!(
        outcome,
        OpenOutcome::Resumed {
            thread_id: new_thread
        }
    );
    assert!(quiet.messages(StatusKind::Lifecycle).is_empty());
    after.close().await.unwrap();
}
