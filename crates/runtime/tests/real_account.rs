//! Issue 39, "another account fails closed, once", against the real current codex (0.171.0),
//! offline: a thread made on one home follows its session through the store's mirror to an
//! empty home whose model (testkit's Responses stand-in) refuses the restored thread's first
//! request as the Responses API refuses another account's encrypted reasoning (HTTP 400
//! `invalid_encrypted_content`). The resume succeeds, the first turn fails, the binding is
//! dropped with the notice said once (`account_mismatch`), and the next turn runs on a fresh
//! thread seeded from the transcript.

use std::path::Path;
use std::time::Duration;

use rethread_runtime::{
    AppServerClient, BinderOptions, OpenOutcome, RuntimeError, SessionBinder, StatusKind,
    StatusRail, RESUME_FALLBACK_NOTICE,
};
use rethread_store::{BindingStore, OpenOptions};
use rethread_testkit::real::{codex_or_skip, rollout_files, CodexHome};
use rethread_testkit::responses::{invalid_encrypted_content, ResponsesStandIn};
use rethread_testkit::CURRENT;
use tokio::process::{Child, Command};

async fn spawn(binary: &Path, home: &Path, rail: StatusRail) -> (AppServerClient, Child) {
    let mut child = Command::new(binary)
        .arg("app-server")
        .env("CODEX_HOME", home)
        .env("RUST_LOG", "error")
        .current_dir(home)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn codex");
    let (stdout, stdin) = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let client = AppServerClient::builder()
        .rail(rail)
        .connect(stdout, stdin)
        .await
        .expect("initialize the real codex");
    (client, child)
}

fn binder(store: &BindingStore, home: &Path, rail: StatusRail) -> SessionBinder {
    let options = BinderOptions::default()
        .codex_home(Some(home.display().to_string()))
        .retry_backoff(Duration::from_millis(50));
    SessionBinder::new("session-39", store.clone(), rail).with_options(options)
}

#[tokio::test]
async fn a_thread_restored_for_another_account_fails_closed_once() {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = BindingStore::redb(dir.path().join("rethread.redb"), OpenOptions::default())
        .await
        .unwrap();

    // At home: a thread with a committed turn, mirrored into the store.
    let home = CodexHome::new(&model).unwrap();
    let (rail, _) = StatusRail::recording();
    let (client, mut child) = spawn(&codex, home.path(), rail.clone()).await;
    let mut at_home = binder(&store, home.path(), rail);
    let mut session = at_home.open(&client).await.unwrap();
    let old = session
        .run_turn("Please remember the word PAPAYA.")
        .await
        .unwrap()
        .thread_id;
    drop(session);
    at_home.close().await.unwrap();
    child.kill().await.unwrap();

    // Another machine, logged into another account: the rollout is restored and resumed, and
    // the model refuses the thread's first request.
    let other = CodexHome::new(&model).unwrap();
    assert!(rollout_files(other.path()).is_empty());
    let (rail, said) = StatusRail::recording();
    let (client, mut child) = spawn(&codex, other.path(), rail.clone()).await;
    let mut away = binder(&store, other.path(), rail);
    let mut session = away.open(&client).await.unwrap();
    assert_eq!(
        session.outcome(),
        &OpenOutcome::Resumed {
            thread_id: old.clone()
        }
    );
    assert!(
        !rollout_files(other.path()).is_empty(),
        "restored from the mirror"
    );
    model.push_error(400, invalid_encrypted_content());
    let failed = session.run_turn("What was the word?").await.unwrap_err();
    let RuntimeError::TurnFailed {
        status, message, ..
    } = &failed
    else {
        panic!("{failed:?}")
    };
    assert_eq!(status, "failed");
    assert!(message.contains("invalid_encrypted_content"), "{message}");

    // Fails closed: the binding is dropped and the notice said once, with its reason.
    let record = store.session("session-39").await.unwrap().unwrap();
    assert_eq!(record.thread_id(), None);
    let given_up = record.given_up().expect("given up");
    assert_eq!(given_up.thread_id, old);
    assert_eq!(given_up.reason, "account_mismatch");
    assert_eq!(
        said.messages(StatusKind::Lifecycle),
        [RESUME_FALLBACK_NOTICE]
    );
    assert_eq!(said.events()[0].fields["reason"], "account_mismatch");

    // Once: the next turn runs on a fresh thread, seeded from the transcript, and so does the
    // one after it; nothing more is said.
    let report = session.run_turn("And now?").await.unwrap();
    assert_ne!(report.thread_id, old);
    assert!(
        matches!(session.outcome(), OpenOutcome::FellBack { previous_thread_id, seeded: true, .. } if *previous_thread_id == old),
        "{:?}",
        session.outcome()
    );
    let seen = model
        .model_requests()
        .last()
        .unwrap()
        .json()
        .unwrap()
        .to_string();
    assert!(seen.contains("PAPAYA"), "seeded from the transcript");
    session.run_turn("Still there?").await.unwrap();
    assert_eq!(
        said.messages(StatusKind::Lifecycle),
        [RESUME_FALLBACK_NOTICE]
    );
    let record = store.session("session-39").await.unwrap().unwrap();
    assert_eq!(record.thread_id(), Some(report.thread_id.as_str()));
    let from = record.binding().unwrap().fell_back_from.clone().unwrap();
    assert_eq!(
        (from.thread_id, from.reason),
        (old, "account_mismatch".to_string())
    );
    drop(session);
    away.close().await.unwrap();
    child.kill().await.unwrap();
}
