//! The runtime's calls into a host's `TranscriptSink`, expected exactly (a mockall mock): which
//! calls it makes, with what, in which order, how often, and which it never makes. The mock
//! checks its expectations when it is dropped, at the end of the binder's task.

mod support;

use std::sync::Arc;

use mockall::{mock, Sequence};
use rethread_runtime::{
    BinderOptions, BoxError, ClientOptions, OpenOutcome, Publication, RuntimeError, SeedOptions,
    SessionBinder, SinkDurability, StatusKind, StatusRail, TranscriptSink, TurnReport,
    RESUME_FALLBACK_NOTICE,
};
use rethread_store::{BindingStore, TurnCommit};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

mock! {
    Sink {}

    #[async_trait::async_trait]
    impl TranscriptSink for Sink {
        async fn persist_turn(
            &self,
            session_id: &str,
            rows: &[Value],
        ) -> Result<SinkDurability, BoxError>;

        async fn recent_rows(&self, session_id: &str, limit: u64) -> Result<Vec<Value>, BoxError>;
    }
}

// `TranscriptSink` requires `Debug`, which mockall leaves to the mock's author.
impl std::fmt::Debug for MockSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MockSink")
    }
}

fn options() -> BinderOptions {
    BinderOptions::default().retry_backoff(std::time::Duration::from_millis(1))
}

/// The rows of the scripted turn: the message, then codex's reply.
fn is_the_turn(session: &str, rows: &[Value], message: &str, reply: &str) -> bool {
    session == "s"
        && rows.len() == 2
        && rows[0]["role"] == "user"
        && rows[0]["text"] == message
        && rows[1]["role"] == "assistant"
        && rows[1]["text"] == reply
}

/// Opens session `s` with `sink` as its transcript and runs one turn with `message`, in a task;
/// the peer plays codex. The task ends with the open's outcome and the turn's report.
async fn spawn_turn(
    store: &BindingStore,
    sink: MockSink,
    rail: StatusRail,
    message: &'static str,
) -> (
    JoinHandle<Result<(OpenOutcome, TurnReport), RuntimeError>>,
    support::Peer,
) {
    let (client, peer, _) = support::connect(ClientOptions::default()).await;
    let mut binder = SessionBinder::new("s", store.clone(), rail)
        .with_options(options())
        .with_transcript_sink(Arc::new(sink));
    let run = tokio::spawn(async move {
        let mut session = binder.open(&client).await?;
        let report = session.run_turn(message).await?;
        Ok((session.outcome().clone(), report))
    });
    (run, peer)
}

/// Codex as it answers for a lost thread: the resume of `dead` fails (`no rollout found`), and
/// the fallback's `thread/start` gets thread `fresh`. Returns that start's parameters.
async fn lose_dead_and_start_fresh(peer: &mut support::Peer) -> Value {
    let (id, _) = peer.expect("thread/resume").await;
    peer.fail(id, -32600, "no rollout found for thread id dead")
        .await;
    peer.start_thread("fresh").await
}

/// A store whose session `s` is bound to `thread`; the rows are the host's, not the store's.
async fn bound_store(thread: &str) -> BindingStore {
    let store = BindingStore::memory();
    store
        .commit_turn(TurnCommit::new("s", thread, Vec::new()))
        .await
        .unwrap();
    store
}

#[tokio::test]
async fn a_sink_error_gets_the_turn_once_and_publishes_nothing() {
    let store = BindingStore::memory();
    let mut sink = MockSink::new();
    sink.expect_persist_turn()
        .withf(|session, rows| is_the_turn(session, rows, "hi", "hello"))
        .times(1)
        .returning(|_, _| Err("disk full".into()));
    // A fresh session has no lost thread to seed a replacement for.
    sink.expect_recent_rows().never();
    let (run, mut peer) = spawn_turn(&store, sink, StatusRail::default(), "hi").await;
    peer.start_thread("t1").await;
    peer.run_turn("t1", "u1", "hello").await;
    match run.await.unwrap() {
        Err(RuntimeError::Sink(source)) => assert_eq!(source.to_string(), "disk full"),
        other => panic!("expected a sink error, got {other:?}"),
    }
    assert!(store.session("s").await.unwrap().is_none());
}

#[tokio::test]
async fn a_failed_turn_never_reaches_the_sink() {
    let store = BindingStore::memory();
    let mut sink = MockSink::new();
    sink.expect_persist_turn().never();
    sink.expect_recent_rows().never();
    let (run, mut peer) = spawn_turn(&store, sink, StatusRail::default(), "boom").await;
    peer.start_thread("t1").await;
    peer.accept_turn("u1").await;
    peer.notify(
        "turn/completed",
        json!({"threadId": "t1", "turn": {"id": "u1", "status": "failed", "items": [],
               "error": {"message": "model exploded"}}}),
    )
    .await;
    assert!(matches!(
        run.await.unwrap(),
        Err(RuntimeError::TurnFailed { .. })
    ));
    assert!(store.session("s").await.unwrap().is_none());
}

#[tokio::test]
async fn a_fallback_seeds_from_the_sink_once_then_persists_the_turn_on_the_new_thread() {
    let store = bound_store("dead").await;
    let max_rows = SeedOptions::default().max_rows;
    let mut order = Sequence::new();
    let mut sink = MockSink::new();
    sink.expect_recent_rows()
        .withf(move |session, limit| session == "s" && *limit == max_rows)
        .times(1)
        .in_sequence(&mut order)
        .returning(|_, _| {
            Ok(vec![
                json!({"role": "user", "text": "remember the word PAPAYA"}),
                json!({"role": "assistant", "text": "ok"}),
            ])
        });
    sink.expect_persist_turn()
        .withf(|session, rows| is_the_turn(session, rows, "still there?", "yes"))
        .times(1)
        .in_sequence(&mut order)
        .returning(|_, _| Ok(SinkDurability::Durable));
    let (rail, recorded) = StatusRail::recording();
    let (run, mut peer) = spawn_turn(&store, sink, rail, "still there?").await;
    let start = lose_dead_and_start_fresh(&mut peer).await;
    let seed = start["developerInstructions"].as_str().unwrap_or_default();
    assert!(seed.contains("PAPAYA"), "seeded from the sink: {start}");
    peer.run_turn("fresh", "u1", "yes").await;
    let (outcome, report) = run.await.unwrap().unwrap();
    assert!(
        matches!(&outcome, OpenOutcome::FellBack { previous_thread_id, seeded: true, .. } if previous_thread_id == "dead"),
        "{outcome:?}"
    );
    assert_eq!(report.publication, Publication::Published);
    assert_eq!(
        recorded.messages(StatusKind::Lifecycle),
        [RESUME_FALLBACK_NOTICE]
    );
    let record = store.session("s").await.unwrap().unwrap();
    assert_eq!(record.thread_id(), Some("fresh"));
    assert!(record.is_retired("dead"));
    assert_eq!(record.row_count, 0, "the rows are the host's");
}

#[tokio::test]
async fn a_sink_that_cannot_give_the_seed_costs_only_the_seed() {
    let store = bound_store("dead").await;
    let mut sink = MockSink::new();
    sink.expect_recent_rows()
        .times(1)
        .returning(|_, _| Err("transcript offline".into()));
    sink.expect_persist_turn()
        .withf(|session, rows| is_the_turn(session, rows, "hi", "hello"))
        .times(1)
        .returning(|_, _| Ok(SinkDurability::Durable));
    let (rail, recorded) = StatusRail::recording();
    let (run, mut peer) = spawn_turn(&store, sink, rail, "hi").await;
    let start = lose_dead_and_start_fresh(&mut peer).await;
    assert!(
        start
            .get("developerInstructions")
            .is_none_or(Value::is_null),
        "no seed: {start}"
    );
    peer.run_turn("fresh", "u1", "hello").await;
    let (outcome, _) = run.await.unwrap().unwrap();
    assert!(
        matches!(&outcome, OpenOutcome::FellBack { seeded: false, .. }),
        "{outcome:?}"
    );
    assert!(
        recorded
            .messages(StatusKind::Warn)
            .iter()
            .any(|m| m.contains("transcript offline")),
        "{:?}",
        recorded.messages(StatusKind::Warn)
    );
    assert_eq!(
        recorded.messages(StatusKind::Lifecycle),
        [RESUME_FALLBACK_NOTICE]
    );
    assert_eq!(
        store.session("s").await.unwrap().unwrap().thread_id(),
        Some("fresh")
    );
}
