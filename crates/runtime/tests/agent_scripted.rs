//! The resume-or-fallback state machine against a scripted peer: exact wire sequences.

mod support;

use std::sync::Arc;
use std::time::Duration;

use rethread_runtime::{
    BinderOptions, ClientOptions, OpenOutcome, Publication, RuntimeError, SessionBinder,
    StatusKind, StatusRail, TurnReport, RESUME_FALLBACK_NOTICE,
};
use rethread_store::{BindingStore, TurnCommit};
use serde_json::json;
use tokio::task::JoinHandle;

fn options() -> BinderOptions {
    BinderOptions::default()
        .codex_home(Some("/home/codex".into()))
        .retry_backoff(Duration::from_millis(1))
}

/// A binder for session `s` on `store` with the test options and a rail nobody reads.
fn quiet_binder(store: &BindingStore) -> SessionBinder {
    SessionBinder::new("s", store.clone(), StatusRail::default()).with_options(options())
}

/// A fresh session on `store` whose turn codex has started (thread `t1`, turn `u1`): the
/// turn's task and the peer, which ends the turn as the test needs.
async fn a_started_turn(
    store: &BindingStore,
) -> (JoinHandle<Result<TurnReport, RuntimeError>>, support::Peer) {
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut agent = quiet_binder(store);
    let run = tokio::spawn(async move {
        let mut session = agent.open(&client).await?;
        session.run_turn("boom").await
    });
    peer.start_thread("t1").await;
    peer.accept_turn("u1").await;
    (run, peer)
}

async fn bound_store(thread: &str) -> BindingStore {
    let store = BindingStore::memory();
    let rows = vec![
        json!({"role": "user", "text": "remember the word PAPAYA"}),
        json!({"role": "assistant", "text": "ok"}),
    ];
    store
        .commit_turn(TurnCommit::new("s", thread, rows))
        .await
        .unwrap();
    store
}

#[tokio::test]
async fn a_fresh_session_starts_a_thread_and_publishes_after_the_rows() {
    let store = BindingStore::memory();
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let (rail, recorded) = StatusRail::recording();
    let mut agent = SessionBinder::new("s", store.clone(), rail).with_options(options());
    let run = tokio::spawn(async move {
        let mut session = agent.open(&client).await?;
        let report = session.run_turn("hello").await?;
        Ok::<_, RuntimeError>((session.outcome().clone(), report))
    });
    peer.start_thread("t1").await;
    peer.run_turn("t1", "u1", "hi there").await;
    let (outcome, report) = run.await.unwrap().unwrap();
    assert_eq!(
        outcome,
        OpenOutcome::Started {
            thread_id: "t1".into()
        }
    );
    assert_eq!(report.reply, "hi there");
    assert_eq!(report.publication, Publication::Published);
    let record = store.session("s").await.unwrap().unwrap();
    assert_eq!(record.thread_id(), Some("t1"));
    assert_eq!(
        record.binding().unwrap().codex_home.as_deref(),
        Some("/home/codex")
    );
    assert_eq!(record.row_count, 2);
    assert!(recorded.messages(StatusKind::Lifecycle).is_empty());
}

#[tokio::test]
async fn a_live_binding_is_resumed_before_the_turn_without_a_notice() {
    let store = bound_store("t1").await;
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let (rail, recorded) = StatusRail::recording();
    let mut agent = SessionBinder::new("s", store.clone(), rail).with_options(options());
    let run = tokio::spawn(async move {
        let mut session = agent.open(&client).await?;
        session.run_turn("again").await?;
        Ok::<_, RuntimeError>(session.outcome().clone())
    });
    let (id, params) = peer.expect("thread/resume").await;
    assert_eq!(params, json!({"threadId": "t1", "excludeTurns": true}));
    peer.reply(id, json!({"thread": support::thread("t1")}))
        .await;
    peer.run_turn("t1", "u2", "yes").await;
    assert_eq!(
        run.await.unwrap().unwrap(),
        OpenOutcome::Resumed {
            thread_id: "t1".into()
        }
    );
    assert!(recorded
        .events()
        .iter()
        .all(|e| e.kind != StatusKind::Lifecycle));
    assert_eq!(store.session("s").await.unwrap().unwrap().row_count, 4);
}

/// What the host set for its thread (codex's own settings, passed through) goes with the
/// resume after a restart, and a turn's own settings with its `turn/start`.
#[tokio::test]
async fn the_hosts_thread_settings_go_with_the_resume_and_turn_settings_with_the_turn() {
    let store = bound_store("t1").await;
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut options = options();
    options.thread_start = rethread_protocol::messages::ThreadStartParams::default()
        .cwd("/srv/work")
        .developer_instructions("be brief")
        .setting("sandbox", json!("read-only"))
        .setting("approvalPolicy", json!("never"))
        .setting("serviceName", json!("start only"));
    let mut agent =
        SessionBinder::new("s", store.clone(), StatusRail::default()).with_options(options);
    let run = tokio::spawn(async move {
        let mut session = agent.open(&client).await?;
        let input =
            rethread_runtime::TurnInput::text("again").with_setting("effort", json!("high"));
        session.run_turn(input).await
    });
    let (id, params) = peer.expect("thread/resume").await;
    assert_eq!(
        params,
        json!({"threadId": "t1", "excludeTurns": true, "cwd": "/srv/work",
               "developerInstructions": "be brief", "sandbox": "read-only", "approvalPolicy": "never"})
    );
    peer.reply(id, json!({"thread": support::thread("t1")}))
        .await;
    let (client_side, mut peer) = (run, peer);
    let turn = tokio::spawn(async move {
        let params = peer.accept_turn("u2").await;
        peer.notify(
            "turn/completed",
            json!({"threadId": "t1", "turn": {"id": "u2", "status": "completed", "items": []}}),
        )
        .await;
        (params, peer)
    });
    let (params, _peer) = turn.await.unwrap();
    assert_eq!(params["effort"], "high");
    assert_eq!(params["input"][0]["text"], "again");
    client_side.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_dead_binding_falls_back_once_on_the_same_client_and_rotates_after_commit() {
    let store = bound_store("dead").await;
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let (rail, recorded) = StatusRail::recording();
    let mut agent = SessionBinder::new("s", store.clone(), rail).with_options(options());
    let probe = store.clone();
    let run = tokio::spawn(async move {
        let mut session = agent.open(&client).await?;
        // Between the fallback and the commit the binding is gone, never the dead one.
        assert_eq!(probe.session("s").await.unwrap().unwrap().thread_id(), None);
        session.run_turn("still there?").await?;
        Ok::<_, RuntimeError>(session.outcome().clone())
    });
    let (id, _) = peer.expect("thread/resume").await;
    peer.fail(id, -32600, "no rollout found for thread id dead")
        .await;
    let start = peer.start_thread("fresh").await;
    let seed = start["developerInstructions"].as_str().unwrap();
    assert!(
        seed.contains("PAPAYA"),
        "the fresh thread is seeded from the transcript: {seed}"
    );
    peer.run_turn("fresh", "u1", "hello again").await;
    let outcome = run.await.unwrap().unwrap();
    assert!(
        matches!(outcome, OpenOutcome::FellBack { ref previous_thread_id, reason: rethread_protocol::ResumeFailure::Gone, seeded: true, .. } if previous_thread_id == "dead")
    );
    assert_eq!(
        recorded.messages(StatusKind::Lifecycle),
        vec![RESUME_FALLBACK_NOTICE.to_string()]
    );
    let record = store.session("s").await.unwrap().unwrap();
    assert_eq!(record.thread_id(), Some("fresh"));
    assert!(record.is_retired("dead"));
    assert_eq!(record.row_count, 4);
}

#[tokio::test]
async fn capability_required_is_never_a_dead_thread() {
    let store = bound_store("t1").await;
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let (rail, recorded) = StatusRail::recording();
    let mut agent = SessionBinder::new("s", store.clone(), rail).with_options(options());
    let run = tokio::spawn(async move { agent.open(&client).await.map(|s| s.outcome().clone()) });
    let (id, _) = peer.expect("thread/resume").await;
    peer.fail(
        id,
        -32600,
        "thread/resume.excludeTurns requires experimentalApi capability",
    )
    .await;
    let (id, params) = peer.expect("thread/resume").await;
    assert_eq!(params, json!({"threadId": "t1"}));
    peer.reply(id, json!({"thread": support::thread("t1")}))
        .await;
    assert_eq!(
        run.await.unwrap().unwrap(),
        OpenOutcome::Resumed {
            thread_id: "t1".into()
        }
    );
    assert!(recorded.messages(StatusKind::Lifecycle).is_empty());
    assert_eq!(
        store.session("s").await.unwrap().unwrap().thread_id(),
        Some("t1")
    );
}

/// Issue 12, "a burst of overload retires a healthy thread forever": four `-32001` answers
/// (the first try and the three default retries) used to fall back and retire the thread.
#[tokio::test]
async fn overload_past_the_retries_is_retryable_and_keeps_the_binding() {
    let store = bound_store("t1").await;
    let before = store.export_session("s").await.unwrap();
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let (rail, recorded) = StatusRail::recording();
    let mut agent = SessionBinder::new("s", store.clone(), rail).with_options(options());
    let run = tokio::spawn(async move {
        let result = agent.open(&client).await.map(|s| s.outcome().clone());
        drop(agent);
        (result, client)
    });
    for _ in 0..4 {
        let (id, _) = peer.expect("thread/resume").await;
        peer.fail(id, -32001, "Server overloaded; retry later.")
            .await;
    }
    let (result, client) = run.await.unwrap();
    match result {
        Err(error @ RuntimeError::ResumeUnavailable { .. }) => {
            assert!(error.is_retryable(), "{error}");
            assert!(matches!(
                error,
                RuntimeError::ResumeUnavailable {
                    failure: rethread_protocol::ResumeFailure::Overloaded,
                    attempts: 4,
                    ..
                }
            ));
        }
        other => panic!("expected ResumeUnavailable, got {other:?}"),
    }
    // Nothing else was sent (no `thread/start`), nothing written, no notice.
    drop(client);
    assert!(
        peer.next_line().await.is_none(),
        "a request after giving up"
    );
    assert_eq!(store.export_session("s").await.unwrap(), before);
    assert!(recorded.messages(StatusKind::Lifecycle).is_empty());
}

#[tokio::test]
async fn overloaded_then_success_resumes() {
    let store = bound_store("t1").await;
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut agent = quiet_binder(&store);
    let run = tokio::spawn(async move { agent.open(&client).await.map(|s| s.outcome().clone()) });
    let (id, _) = peer.expect("thread/resume").await;
    peer.fail(id, -32001, "overloaded").await;
    let (id, _) = peer.expect("thread/resume").await;
    peer.reply(id, json!({"thread": support::thread("t1")}))
        .await;
    assert_eq!(
        run.await.unwrap().unwrap(),
        OpenOutcome::Resumed {
            thread_id: "t1".into()
        }
    );
}

#[tokio::test]
async fn an_active_writer_elsewhere_is_busy_and_the_store_is_untouched() {
    let store = bound_store("t1").await;
    let before = store.export_session("s").await.unwrap();
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut agent = SessionBinder::new("s", store.clone(), StatusRail::default())
        .with_options(options().transient_retries(1));
    let run = tokio::spawn(async move { agent.open(&client).await.map(|s| s.outcome().clone()) });
    for _ in 0..2 {
        let (id, _) = peer.expect("thread/resume").await;
        peer.fail(id, -32600, "thread t1 already has an active writer")
            .await;
    }
    assert!(matches!(
        run.await.unwrap(),
        Err(RuntimeError::ThreadBusy { .. })
    ));
    assert_eq!(store.export_session("s").await.unwrap(), before);
}

#[tokio::test]
async fn an_unclassified_resume_error_keeps_the_binding() {
    let store = bound_store("t1").await;
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut agent = quiet_binder(&store);
    let run = tokio::spawn(async move { agent.open(&client).await.map(|s| s.outcome().clone()) });
    let (id, _) = peer.expect("thread/resume").await;
    peer.fail(id, -32603, "disk on fire").await;
    assert!(matches!(
        run.await.unwrap(),
        Err(RuntimeError::Resume { .. })
    ));
    assert_eq!(
        store.session("s").await.unwrap().unwrap().thread_id(),
        Some("t1")
    );
}

#[tokio::test]
async fn a_failed_turn_writes_nothing() {
    let store = BindingStore::memory();
    let (run, mut peer) = a_started_turn(&store).await;
    peer.notify("turn/completed", json!({"threadId": "t1", "turn": {"id": "u1", "status": "failed", "items": [], "error": {"message": "model exploded"}}})).await;
    match run.await.unwrap() {
        Err(RuntimeError::TurnFailed {
            status, message, ..
        }) => {
            assert_eq!(status, "failed");
            assert_eq!(message, "model exploded");
        }
        other => panic!("{other:?}"),
    }
    assert!(store.session("s").await.unwrap().is_none());
}

#[tokio::test]
async fn a_server_dying_mid_turn_is_a_typed_error_and_writes_nothing() {
    let store = BindingStore::memory();
    let (run, peer) = a_started_turn(&store).await;
    peer.hang_up();
    assert!(matches!(
        run.await.unwrap(),
        Err(RuntimeError::Client(
            rethread_runtime::ClientError::Closed { .. }
        ))
    ));
    assert!(store.session("s").await.unwrap().is_none());
}

#[tokio::test]
async fn a_retired_thread_commits_rows_but_is_not_published() {
    let store = BindingStore::memory();
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut agent = quiet_binder(&store);
    let probe = store.clone();
    let run = tokio::spawn(async move {
        let mut session = agent.open(&client).await?;
        let lost = rethread_store::Retirement::Lost {
            reason: "gone".into(),
            message: "another host gave it up".into(),
        };
        probe.retire_thread("s", "t1", lost, None).await.unwrap();
        session.run_turn("late").await
    });
    peer.start_thread("t1").await;
    peer.run_turn("t1", "u1", "hi").await;
    assert_eq!(
        run.await.unwrap().unwrap().publication,
        Publication::RetiredNotPublished
    );
    let record = store.session("s").await.unwrap().unwrap();
    assert_eq!(record.thread_id(), None);
    assert_eq!(record.row_count, 2);
}

#[tokio::test]
async fn a_later_session_of_the_same_agent_starts_fresh() {
    let store = bound_store("t1").await;
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut agent = quiet_binder(&store);
    let run = tokio::spawn(async move {
        let first = agent.open(&client).await?;
        first.retire().await?;
        let second = agent.open(&client).await?;
        Ok::<_, RuntimeError>(second.outcome().clone())
    });
    let (id, _) = peer.expect("thread/resume").await;
    peer.reply(id, json!({"thread": support::thread("t1")}))
        .await;
    peer.start_thread("t2").await;
    assert_eq!(
        run.await.unwrap().unwrap(),
        OpenOutcome::Started {
            thread_id: "t2".into()
        }
    );
}

/// A host that keeps its own transcript and says whether it is durable.
#[derive(Debug, Default)]
struct HostTranscript {
    durable: bool,
    rows: std::sync::Mutex<Vec<serde_json::Value>>,
}

#[async_trait::async_trait]
impl rethread_runtime::TranscriptSink for HostTranscript {
    async fn persist_turn(
        &self,
        _session: &str,
        rows: &[serde_json::Value],
    ) -> Result<rethread_runtime::SinkDurability, rethread_runtime::BoxError> {
        self.rows.lock().unwrap().extend_from_slice(rows);
        Ok(if self.durable {
            rethread_runtime::SinkDurability::Durable
        } else {
            rethread_runtime::SinkDurability::NotDurable
        })
    }

    async fn recent_rows(
        &self,
        _session: &str,
        limit: u64,
    ) -> Result<Vec<serde_json::Value>, rethread_runtime::BoxError> {
        let rows = self.rows.lock().unwrap();
        Ok(rows[rows.len().saturating_sub(limit as usize)..].to_vec())
    }
}

async fn host_sink_turn(durable: bool) -> (BindingStore, Arc<HostTranscript>, Publication) {
    let store = BindingStore::memory();
    let sink = Arc::new(HostTranscript {
        durable,
        ..Default::default()
    });
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut agent = SessionBinder::new("s", store.clone(), StatusRail::default())
        .with_options(options())
        .with_transcript_sink(sink.clone());
    let run = tokio::spawn(async move {
        let mut session = agent.open(&client).await?;
        session.run_turn("hi").await
    });
    peer.start_thread("t1").await;
    peer.run_turn("t1", "u1", "hello").await;
    let publication = run.await.unwrap().unwrap().publication;
    (store, sink, publication)
}

#[tokio::test]
async fn a_host_sink_that_reports_durability_gets_the_binding_and_keeps_the_rows() {
    let (store, sink, publication) = host_sink_turn(true).await;
    assert_eq!(publication, Publication::Published);
    let record = store.session("s").await.unwrap().unwrap();
    assert_eq!(record.thread_id(), Some("t1"));
    assert_eq!(
        record.row_count, 0,
        "the rows live in the host's transcript"
    );
    assert_eq!(sink.rows.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn no_durable_report_no_binding() {
    let (store, sink, publication) = host_sink_turn(false).await;
    assert_eq!(publication, Publication::NotDurable);
    assert!(store.session("s").await.unwrap().is_none());
    assert_eq!(sink.rows.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_failed_first_open_still_resumes_on_the_next_try() {
    let store = bound_store("t1").await;
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut agent = SessionBinder::new("s", store.clone(), StatusRail::default())
        .with_options(options().transient_retries(0));
    let run = tokio::spawn(async move {
        let busy = agent.open(&client).await.map(|s| s.outcome().clone());
        let retried = agent.open(&client).await.map(|s| s.outcome().clone());
        (busy, retried)
    });
    let (id, _) = peer.expect("thread/resume").await;
    peer.fail(id, -32600, "thread t1 already has an active writer")
        .await;
    let (id, _) = peer.expect("thread/resume").await;
    peer.reply(id, json!({"thread": support::thread("t1")}))
        .await;
    let (busy, retried) = run.await.unwrap();
    assert!(matches!(busy, Err(RuntimeError::ThreadBusy { .. })));
    assert_eq!(
        retried.unwrap(),
        OpenOutcome::Resumed {
            thread_id: "t1".into()
        }
    );
}

#[tokio::test]
async fn a_fallback_whose_start_fails_says_the_notice_once_and_the_retry_starts_quietly() {
    let store = bound_store("dead").await;
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let (rail, recorded) = StatusRail::recording();
    let mut agent = SessionBinder::new("s", store.clone(), rail).with_options(options());
    let run = tokio::spawn(async move {
        let failed = agent.open(&client).await.map(|s| s.outcome().clone());
        let retried = agent.open(&client).await.map(|s| s.outcome().clone());
        (failed, retried)
    });
    let (id, _) = peer.expect("thread/resume").await;
    peer.fail(id, -32600, "no rollout found for thread id dead")
        .await;
    let (id, _) = peer.expect("thread/start").await;
    peer.fail(id, -32603, "disk full").await;
    peer.start_thread("fresh").await;
    let (failed, retried) = run.await.unwrap();
    assert!(matches!(failed, Err(RuntimeError::Client(_))));
    // The user had the notice (the rail took it) when the thread was given up: the retry
    // starts the replacement (seeded) and says nothing again.
    assert_eq!(
        retried.unwrap(),
        OpenOutcome::Started {
            thread_id: "fresh".into()
        }
    );
    assert_eq!(
        recorded.messages(StatusKind::Lifecycle),
        [RESUME_FALLBACK_NOTICE]
    );
    let record = store.session("s").await.unwrap().unwrap();
    assert!(record.is_retired("dead"));
}

/// "No limit" is a value a host may well pass: `Duration::MAX` for the timeouts and waits,
/// `usize::MAX` for the bounds. None of them panics; each means as good as no limit.
#[tokio::test]
async fn limits_at_their_maximum_mean_no_limit_and_never_panic() {
    let store = BindingStore::memory();
    let client_options = ClientOptions::default()
        .request_timeout(Duration::MAX)
        .max_pending_requests(usize::MAX)
        .notification_buffer(usize::MAX);
    let (client, mut peer, _) = support::connect(client_options).await;
    let options = options()
        .turn_timeout(Duration::MAX)
        .lease_wait(Duration::MAX)
        .lease_ttl(Some(Duration::MAX));
    let mut agent =
        SessionBinder::new("s", store.clone(), StatusRail::default()).with_options(options);
    let run = tokio::spawn(async move {
        let mut session = agent.open(&client).await?;
        session.run_turn("hello").await
    });
    peer.start_thread("t1").await;
    peer.run_turn("t1", "u1", "hi there").await;
    let report = run.await.expect("no panic").unwrap();
    assert_eq!(report.reply, "hi there");
    assert_eq!(store.session("s").await.unwrap().unwrap().row_count, 2);
}

/// A host that drops a turn while codex has not yet answered its `turn/start` (a client
/// timeout, a cancelled request) still has the turn interrupted once codex names it: codex
/// would otherwise run it to the end unobserved, into the rollout but not the transcript,
/// and refuse the session's next `turn/start` while it runs.
#[tokio::test]
async fn a_turn_dropped_before_codex_answered_its_start_is_interrupted() {
    let store = BindingStore::memory();
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut agent = quiet_binder(&store);
    // The host's client lives on past the dropped turn.
    let _host_client = client.clone();
    let (opened_tx, opened_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        let mut session = agent.open(&client).await.unwrap();
        opened_tx.send(()).unwrap();
        // Never answered while this task lives: it is aborted first.
        let _ = session.run_turn("hello").await;
    });
    peer.start_thread("t1").await;
    opened_rx.await.unwrap();
    let (id, _) = peer.expect("turn/start").await;
    run.abort();
    let _ = run.await;
    peer.reply(
        id,
        json!({"turn": {"id": "u1", "status": "inProgress", "items": []}}),
    )
    .await;
    let (_, params) = tokio::time::timeout(Duration::from_secs(5), peer.expect("turn/interrupt"))
        .await
        .expect("the abandoned turn was never interrupted");
    assert_eq!(params, json!({"threadId": "t1", "turnId": "u1"}));
}
