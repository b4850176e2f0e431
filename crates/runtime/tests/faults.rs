//! The fault model (docs/architecture.md, "Fault model"): each fault, what it does to the
//! binding and what the host sees. Against a scripted peer, and over a store that fails at a
//! chosen call (`rethread_testkit::faulty_store`).

use rethread_testkit::faulty_store;
mod support;

use std::time::Duration;

use faulty_store::Faults;
use rethread_protocol::ResumeFailure;
use rethread_runtime::{
    BinderOptions, ClientOptions, OpenOutcome, RuntimeError, SessionBinder, StatusKind, StatusRail,
    RESUME_FALLBACK_NOTICE,
};
use rethread_store::{BindingStore, TurnCommit};
use serde_json::json;
use support::remote_owner;

fn options() -> BinderOptions {
    BinderOptions::default()
        .codex_home(Some("/home/codex".into()))
        .retry_backoff(Duration::from_millis(1))
}

async fn bound(store: &BindingStore, thread: &str) {
    store
        .commit_turn(TurnCommit::new(
            "s",
            thread,
            vec![json!({"role": "user", "text": "remember PAPAYA"})],
        ))
        .await
        .unwrap();
}

/// Issue 12, "I/O errors read as unreadable": codex wraps any I/O error in `failed to read
/// thread ...`; that used to drop and retire an intact thread.
#[tokio::test]
async fn an_io_error_on_codexs_side_is_retried_then_retryable_and_keeps_the_binding() {
    let store = BindingStore::memory();
    bound(&store, "t1").await;
    let before = store.export_session("s").await.unwrap();
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let (rail, recorded) = StatusRail::recording();
    let mut binder = SessionBinder::new("s", store.clone(), rail).with_options(options());
    let run = tokio::spawn(async move {
        let result = binder.open(&client).await.map(|s| s.outcome().clone());
        (result, client)
    });
    for _ in 0..4 {
        let (id, _) = peer.expect("thread/resume").await;
        peer.fail(
            id,
            -32603,
            "failed to read thread: thread-store internal error: failed to read session metadata from /h/x: Permission denied (os error 13)",
        )
        .await;
    }
    let (result, client) = run.await.unwrap();
    let error = result.unwrap_err();
    assert!(
        matches!(
            error,
            RuntimeError::ResumeUnavailable {
                failure: ResumeFailure::Io,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(error.is_retryable());
    drop(client);
    assert!(peer.next_line().await.is_none(), "no thread/start");
    assert_eq!(store.export_session("s").await.unwrap(), before);
    assert!(recorded.messages(StatusKind::Lifecycle).is_empty());
}

/// A resume that never gets an answer is temporary too: retried, then retryable.
#[tokio::test]
async fn a_resume_without_an_answer_is_retryable_and_keeps_the_binding() {
    let store = BindingStore::memory();
    bound(&store, "t1").await;
    let (client, mut peer, _) =
        support::connect(ClientOptions::default().request_timeout(Duration::from_millis(50))).await;
    let mut binder = SessionBinder::new("s", store.clone(), StatusRail::default())
        .with_options(options().transient_retries(1));
    let run = tokio::spawn(async move { binder.open(&client).await.map(|_| ()) });
    for _ in 0..2 {
        peer.expect("thread/resume").await; // never answered
    }
    match run.await.unwrap() {
        Err(RuntimeError::ResumeUnavailable {
            failure: ResumeFailure::Timeout,
            attempts: 2,
            ..
        }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_eq!(
        store.session("s").await.unwrap().unwrap().thread_id(),
        Some("t1")
    );
}

/// A structurally unreadable rollout (no session metadata) is still a lost thread.
#[tokio::test]
async fn a_structurally_unreadable_rollout_falls_back() {
    let store = BindingStore::memory();
    bound(&store, "t1").await;
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let (rail, recorded) = StatusRail::recording();
    let mut binder = SessionBinder::new("s", store.clone(), rail).with_options(options());
    let run = tokio::spawn(async move { binder.open(&client).await.map(|s| s.outcome().clone()) });
    let (id, _) = peer.expect("thread/resume").await;
    peer.fail(id, -32603, "failed to read thread: thread-store internal error: failed to read session metadata /h/x: rollout at /h/x does not start with session metadata").await;
    peer.start_thread("fresh").await;
    assert!(matches!(
        run.await.unwrap().unwrap(),
        OpenOutcome::FellBack {
            reason: ResumeFailure::Unreadable,
            ..
        }
    ));
    assert_eq!(
        recorded.messages(StatusKind::Lifecycle),
        [RESUME_FALLBACK_NOTICE]
    );
}

/// Issue 12, "fallback in two writes": giving a lost thread up is one store write, and the
/// notice goes on the rail only once it succeeded. A store that fails at that call: no notice,
/// the binding kept, a typed error, no `thread/start`; the next open falls back (once).
#[tokio::test]
async fn a_store_failing_at_the_give_up_write_keeps_the_binding_and_says_nothing() {
    let memory = BindingStore::memory();
    bound(&memory, "dead").await;
    let faults = Faults::default();
    faults.fail("retire_thread", 1);
    let store = faulty_store::over(memory.clone(), faults.clone());
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let (rail, recorded) = StatusRail::recording();
    let mut binder = SessionBinder::new("s", store, rail).with_options(options());
    let probe = memory.clone();
    let events = recorded.clone();
    let run = tokio::spawn(async move {
        let failed = binder.open(&client).await.map(|s| s.outcome().clone());
        // Between the two opens: the binding is still there and nothing was said.
        let between = (
            probe.session("s").await.unwrap().unwrap(),
            events.messages(StatusKind::Lifecycle),
        );
        let retried = binder.open(&client).await.map(|s| s.outcome().clone());
        (failed, between, retried)
    });
    let (id, _) = peer.expect("thread/resume").await;
    peer.fail(id, -32600, "no rollout found for thread id dead")
        .await;
    // The failed write sends nothing more; the retry judges the thread again.
    let (id, _) = peer.expect("thread/resume").await;
    peer.fail(id, -32600, "no rollout found for thread id dead")
        .await;
    peer.start_thread("fresh").await;
    let (failed, (record, notices), retried) = run.await.unwrap();
    assert!(matches!(failed, Err(RuntimeError::Store(_))), "{failed:?}");
    assert_eq!(record.thread_id(), Some("dead"), "binding kept");
    assert!(!record.is_retired("dead"));
    assert!(notices.is_empty(), "no notice for a write that failed");
    assert!(matches!(retried.unwrap(), OpenOutcome::FellBack { .. }));
    assert_eq!(
        recorded.messages(StatusKind::Lifecycle),
        [RESUME_FALLBACK_NOTICE]
    );
    assert!(memory
        .session("s")
        .await
        .unwrap()
        .unwrap()
        .is_retired("dead"));
    assert_eq!(faults.calls("retire_thread"), 2);
}

/// Issue 12, "unfenced commits": every write of the runtime that can publish or remove a
/// binding or the notice carries the lease's fence (give up, the delivered notice, commit, the
/// host's own retire).
#[tokio::test]
async fn every_binding_write_carries_the_lease_fence() {
    let memory = BindingStore::memory();
    bound(&memory, "dead").await;
    let faults = Faults::default();
    let store = faulty_store::over(memory.clone(), faults.clone());
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut binder = SessionBinder::new("s", store, StatusRail::default()).with_options(options());
    let run = tokio::spawn(async move {
        let mut session = binder.open(&client).await?;
        session.run_turn("hello").await?;
        let fence = binder.lease().unwrap().fence();
        session.retire().await?;
        Ok::<_, RuntimeError>(fence)
    });
    let (id, _) = peer.expect("thread/resume").await;
    peer.fail(id, -32600, "no rollout found for thread id dead")
        .await;
    peer.start_thread("fresh").await;
    peer.run_turn("fresh", "u1", "hi").await;
    let fence = run.await.unwrap().unwrap();
    let writes = faults.fences();
    let methods: Vec<_> = writes.iter().map(|(m, _)| *m).collect();
    assert_eq!(
        methods,
        [
            "retire_thread",
            "mark_notice_delivered",
            "commit_turn",
            "retire_thread"
        ]
    );
    for (method, carried) in writes {
        assert_eq!(carried.as_ref(), Some(&fence), "{method}");
    }
}

/// The store's fence check, end to end: the lease is taken over while the holder still
/// believes it fresh (a stall the holder's clock did not see); its commit is refused inside the
/// store's transaction and writes nothing.
#[tokio::test]
async fn a_commit_after_a_takeover_is_refused_by_the_store_and_writes_nothing() {
    let store = BindingStore::memory();
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut binder =
        SessionBinder::new("s", store.clone(), StatusRail::default()).with_options(options());
    let open = tokio::spawn(async move {
        let session = binder.open(&client).await.unwrap();
        (binder, session)
    });
    peer.start_thread("t1").await;
    let (_binder, mut session) = open.await.unwrap();
    let lease = session.lease().unwrap();
    // Another host takes the session over within the holder's TTL (30 s): the holder's next
    // freshness check sees a recent renewal and does not ask the store.
    assert!(store.release_lease(&lease).await.unwrap());
    store
        .acquire_lease("s", &remote_owner("thief"), Duration::from_secs(30))
        .await
        .unwrap();
    let turn = tokio::spawn(async move { session.run_turn("hello").await.map(|_| ()) });
    peer.run_turn("t1", "u1", "hi").await;
    assert!(matches!(
        turn.await.unwrap(),
        Err(RuntimeError::LeaseLost { session_id, .. }) if session_id == "s"
    ));
    assert_eq!(store.session("s").await.unwrap(), None, "nothing written");
}

/// A holder that lost its lease (taken over while it believed it fresh) cannot give a thread
/// up either: the store refuses the write, so no notice, and the binding stays.
#[tokio::test]
async fn a_give_up_after_a_takeover_writes_nothing_and_says_nothing() {
    let memory = BindingStore::memory();
    bound(&memory, "dead").await;
    let faults = Faults::default();
    faults.take_over_before("retire_thread");
    let store = faulty_store::over(memory.clone(), faults.clone());
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let (rail, recorded) = StatusRail::recording();
    let mut binder = SessionBinder::new("s", store, rail).with_options(options());
    let run = tokio::spawn(async move { binder.open(&client).await.map(|_| ()) });
    let (id, _) = peer.expect("thread/resume").await;
    peer.fail(id, -32600, "no rollout found for thread id dead")
        .await;
    assert!(matches!(
        run.await.unwrap(),
        Err(RuntimeError::LeaseLost { .. })
    ));
    assert_eq!(faults.calls("retire_thread"), 1);
    let record = memory.session("s").await.unwrap().unwrap();
    assert_eq!(record.thread_id(), Some("dead"));
    assert!(!record.is_retired("dead"));
    assert!(recorded.messages(StatusKind::Lifecycle).is_empty());
}

/// An open with the mirror on restores the thread from the record its `ReadSession` read: the
/// store's session record is read once per open (the restore's chunks come from the store's
/// own snapshot), and the rollout is in place before the resume is sent.
#[tokio::test]
async fn an_open_restores_the_thread_from_the_record_it_read_once() {
    use rethread_runtime::binding::{commit_turn, TurnRows};
    use rethread_runtime::{RolloutMirror, Transcript};
    const THREAD: &str = "01a2329f-e3f7-7240-889a-d40328142d21";
    let rel = format!("sessions/2026/12/01/rollout-2026-12-01T17-21-09-{THREAD}.jsonl");
    let memory = BindingStore::memory();
    let a = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(a.path().join("sessions/2026/12/01")).unwrap();
    std::fs::write(a.path().join(&rel), "{\"type\":\"session_meta\"}\n").unwrap();
    let rows = [json!({"role": "user", "text": "remember PAPAYA"})];
    let on_a = RolloutMirror::new(a.path());
    let turn = TurnRows::new("s", THREAD, &rows).mirror(Some(&on_a));
    commit_turn(&memory, &Transcript::Store, None, turn)
        .await
        .unwrap();
    let faults = Faults::default();
    let store = faulty_store::over(memory.clone(), faults.clone());
    let b = tempfile::tempdir().unwrap();
    let home = b.path().to_str().unwrap().to_string();
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut binder = SessionBinder::new("s", store, StatusRail::default())
        .with_options(options().codex_home(Some(home)).mirror(true));
    let run = tokio::spawn(async move {
        let session = binder.open(&client).await.map(|s| s.outcome().clone());
        (session, client)
    });
    let (id, params) = peer.expect("thread/resume").await;
    assert_eq!(params["threadId"], THREAD);
    assert_eq!(
        std::fs::read(b.path().join(&rel)).unwrap(),
        std::fs::read(a.path().join(&rel)).unwrap()
    );
    peer.reply(id, json!({"thread": support::thread(THREAD)}))
        .await;
    let (outcome, _client) = run.await.unwrap();
    assert!(matches!(outcome.unwrap(), OpenOutcome::Resumed { thread_id } if thread_id == THREAD));
    assert_eq!(faults.calls("session"), 1);
    assert_eq!(faults.calls("write_mirror_file"), 1);
}

/// A restore that fails for a reason that may pass (the store's read, here) on a home that
/// lacks the rollout: codex's "no rollout found" is then no loss. The binding is kept, the
/// open fails with a retryable error and no notice, and the next open restores and resumes.
#[tokio::test]
async fn a_restore_that_failed_for_now_never_gives_the_thread_up() {
    use rethread_runtime::binding::{commit_turn, TurnRows};
    use rethread_runtime::{RolloutMirror, Transcript};
    use rethread_store::BindingStore;
    const THREAD: &str = "01a2329f-e3f7-7240-889a-d40328142d21";
    let rel = format!("sessions/2026/12/01/rollout-2026-12-01T17-21-09-{THREAD}.jsonl");
    let memory = BindingStore::memory();
    let a = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(a.path().join("sessions/2026/12/01")).unwrap();
    std::fs::write(a.path().join(&rel), "{\"type\":\"session_meta\"}\n").unwrap();
    let rows = [json!({"role": "user", "text": "remember PAPAYA"})];
    let on_a = RolloutMirror::new(a.path());
    let turn = TurnRows::new("s", THREAD, &rows).mirror(Some(&on_a));
    commit_turn(&memory, &Transcript::Store, None, turn)
        .await
        .unwrap();
    let faults = Faults::default();
    faults.fail("write_mirror_file", 1);
    let store = faulty_store::over(memory.clone(), faults.clone());
    let b = tempfile::tempdir().unwrap();
    let home = b.path().to_str().unwrap().to_string();
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut binder = SessionBinder::new("s", store, StatusRail::default())
        .with_options(options().codex_home(Some(home)).mirror(true));
    let run = tokio::spawn(async move {
        let first = binder.open(&client).await.map(|s| s.outcome().clone());
        let second = binder.open(&client).await.map(|s| s.outcome().clone());
        (first, second, client)
    });
    let (id, _) = peer.expect("thread/resume").await;
    assert!(!b.path().join(&rel).exists(), "the restore failed");
    peer.fail(
        id,
        -32600,
        &format!("no rollout found for thread id {THREAD}"),
    )
    .await;
    let (id, _) = peer.expect("thread/resume").await;
    assert!(b.path().join(&rel).exists(), "restored by the next open");
    peer.reply(id, json!({"thread": support::thread(THREAD)}))
        .await;
    let (first, second, _client) = run.await.unwrap();
    let error = first.expect_err("the first open fails");
    assert!(error.is_retryable(), "{error:?}");
    // Said once, not by the message and again by the error around it.
    let said = error.to_string();
    assert_eq!(said.matches("the binding is kept").count(), 1, "{said}");
    assert!(matches!(second.unwrap(), OpenOutcome::Resumed { thread_id } if thread_id == THREAD));
    assert_eq!(
        memory.thread_id("s").await.unwrap().as_deref(),
        Some(THREAD),
        "the binding was kept"
    );
}
