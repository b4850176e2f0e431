//! Issue 39, "another account fails closed, once": a thread restored onto a home logged into
//! another account resumes, and its first turn fails (`invalid_encrypted_content`). The
//! library's binder gives the thread up once, says the notice once, and runs the session's
//! next turn on a fresh thread seeded from the transcript; no turn fails after that.

mod support;

use std::time::Duration;

use rethread_fake_appserver::{FakeAppServer, Fault, FaultScript};
use rethread_runtime::{
    BinderOptions, OpenOutcome, RuntimeError, SessionBinder, StatusKind, StatusRail,
    RESUME_FALLBACK_NOTICE,
};
use rethread_store::BindingStore;
use support::client_on;

fn options(home: &std::path::Path) -> BinderOptions {
    BinderOptions::default()
        .codex_home(Some(home.display().to_string()))
        .retry_backoff(Duration::from_millis(1))
}

#[tokio::test]
async fn another_accounts_first_turn_drops_the_binding_and_the_next_turn_runs_fresh() {
    let store = BindingStore::memory();
    let home = tempfile::tempdir().unwrap();
    let (stream, fake) = FakeAppServer::builder()
        .codex_home(home.path())
        .spawn_in_process()
        .unwrap();
    let client = client_on(stream).await;

    // A bound thread with a committed turn, made "at home".
    let (rail, _) = StatusRail::recording();
    let mut home_binder =
        SessionBinder::new("s", store.clone(), rail).with_options(options(home.path()));
    let mut session = home_binder.open(&client).await.unwrap();
    let old = session.run_turn("remember PAPAYA").await.unwrap().thread_id;
    drop(session);
    home_binder.close().await.unwrap();

    // On a home of another account the resume succeeds and the first turn (the fake's second)
    // is refused.
    fake.set_faults(FaultScript::of([Fault::InvalidEncryptedContent {
        turn: 2,
    }]));
    let (rail, said) = StatusRail::recording();
    let mut binder =
        SessionBinder::new("s", store.clone(), rail).with_options(options(home.path()));
    let mut session = binder.open(&client).await.unwrap();
    assert!(
        matches!(session.outcome(), OpenOutcome::Resumed { .. }),
        "{:?}",
        session.outcome()
    );
    let failed = session.run_turn("what was the fruit?").await.unwrap_err();
    assert!(
        matches!(failed, RuntimeError::TurnFailed { .. }),
        "{failed:?}"
    );

    // The binding is dropped, the notice said once with its reason, and recorded delivered.
    let record = store.session("s").await.unwrap().unwrap();
    assert_eq!(record.thread_id(), None);
    let given_up = record.given_up().expect("given up");
    assert_eq!(
        (given_up.thread_id.as_str(), given_up.reason.as_str()),
        (old.as_str(), "account_mismatch")
    );
    assert!(given_up.notice_delivered);
    assert_eq!(
        said.messages(StatusKind::Lifecycle),
        [RESUME_FALLBACK_NOTICE]
    );
    assert_eq!(said.events()[0].fields["reason"], "account_mismatch");

    // The next turn runs on a fresh thread seeded from the transcript, and so does every
    // later one; the notice is not said again.
    let report = session.run_turn("and now?").await.unwrap();
    assert_ne!(report.thread_id, old);
    match session.outcome() {
        OpenOutcome::FellBack {
            previous_thread_id,
            reason,
            seeded,
            thread_id,
            ..
        } => {
            assert_eq!(previous_thread_id, &old);
            assert_eq!(reason.as_str(), "account_mismatch");
            assert!(seeded);
            assert_eq!(thread_id, &report.thread_id);
        }
        other => panic!("expected a fallback, got {other:?}"),
    }
    let seen = fake.model_requests().last().unwrap().conversation.clone();
    assert!(
        seen.iter().any(|m| m.text.contains("PAPAYA")),
        "the seed: {seen:?}"
    );
    session.run_turn("once more").await.unwrap();
    assert_eq!(
        said.messages(StatusKind::Lifecycle),
        [RESUME_FALLBACK_NOTICE]
    );
    let record = store.session("s").await.unwrap().unwrap();
    assert_eq!(record.thread_id(), Some(report.thread_id.as_str()));
    let from = record.binding().unwrap().fell_back_from.clone().unwrap();
    assert_eq!(
        (from.thread_id.as_str(), from.reason.as_str()),
        (old.as_str(), "account_mismatch")
    );
}
