//! `TurnStream::finish_unless`: a host's stop (Ctrl-C, shutdown) abandons a turn whose commit
//! has not begun, and never one that is committing: a turn reported as stopped is never in
//! the store.

mod support;

use std::sync::Arc;

use rethread_runtime::{
    BoxError, ClientOptions, SessionBinder, SinkDurability, StatusRail, TranscriptSink, TurnEnd,
};
use rethread_store::BindingStore;
use serde_json::Value;
use tokio::sync::{oneshot, Notify};

/// A host transcript whose `persist_turn` says it began, then waits to be let go.
#[derive(Debug, Default)]
struct HeldSink {
    began: Notify,
    release: Notify,
}

#[async_trait::async_trait]
impl TranscriptSink for HeldSink {
    async fn persist_turn(&self, _: &str, _: &[Value]) -> Result<SinkDurability, BoxError> {
        self.began.notify_one();
        self.release.notified().await;
        Ok(SinkDurability::Durable)
    }

    async fn recent_rows(&self, _: &str, _: u64) -> Result<Vec<Value>, BoxError> {
        Ok(Vec::new())
    }
}

#[tokio::test]
async fn a_stop_before_the_commit_abandons_the_turn_and_commits_nothing() {
    let store = BindingStore::memory();
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut binder = SessionBinder::new("s", store.clone(), StatusRail::default());
    let (stop, stopped) = oneshot::channel::<&str>();
    let run = tokio::spawn(async move {
        let mut session = binder.open(&client).await?;
        let turn = session.run_turn_streamed("hi").await?;
        turn.finish_unless(async { stopped.await.unwrap() }, |_| {})
            .await
            .map(|end| matches!(end, TurnEnd::Stopped("ctrl-c")))
    });
    peer.start_thread("t1").await;
    peer.accept_turn("u1").await;
    stop.send("ctrl-c").unwrap();
    assert!(run.await.unwrap().unwrap(), "reported as stopped");
    // Abandoned: codex is asked to interrupt it.
    let (_, params) = peer.expect("turn/interrupt").await;
    assert_eq!(params["turnId"], "u1");
    assert!(store.session("s").await.unwrap().is_none());
}

#[tokio::test]
async fn a_stop_during_the_commit_lets_it_finish_and_reports_the_turn() {
    let store = BindingStore::memory();
    let sink = Arc::new(HeldSink::default());
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut binder = SessionBinder::new("s", store.clone(), StatusRail::default())
        .with_transcript_sink(sink.clone());
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        let mut session = binder.open(&client).await?;
        let turn = session.run_turn_streamed("hi").await?;
        turn.finish_unless(async { stopped.await.unwrap() }, |_| {})
            .await
    });
    peer.start_thread("t1").await;
    peer.run_turn("t1", "u1", "hello").await;
    // The commit began (the rows are with the host's transcript): the stop comes now.
    sink.began.notified().await;
    stop.send(()).unwrap();
    tokio::task::yield_now().await;
    sink.release.notify_one();
    match run.await.unwrap().unwrap() {
        TurnEnd::Completed(report) => assert_eq!(report.reply, "hello"),
        TurnEnd::Stopped(()) => panic!("a committing turn was reported as stopped"),
    }
    assert_eq!(
        store.session("s").await.unwrap().unwrap().thread_id(),
        Some("t1")
    );
}
