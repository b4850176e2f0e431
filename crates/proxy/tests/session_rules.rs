//! Which thread a proxied session keeps, against the in-process fake: the session stays on its
//! own thread (a second `thread/start` never moves the binding, and the client is told; a
//! fork or a resume of another thread takes the same path, pinned in `runtime/tests/machine.rs`), an ephemeral thread is never bound, and a client that floods the bounded tracking
//! never loses the session's own start or its fallback warning.

mod support;

use std::sync::Arc;
use std::time::Duration;

use rethread_fake_appserver::faults::{Fault, FaultScript};
use rethread_fake_appserver::Corruption;
use rethread_proxy::{BindingHooks, SessionOptions};
use rethread_runtime::RESUME_FALLBACK_NOTICE;
use rethread_store::{BindingStore, MemoryStore};
use serde_json::{json, Value};
use support::*;

const SESSION: &str = "rules";

async fn hooks(store: &Arc<dyn BindingStore>) -> Arc<BindingHooks> {
    let mut options = SessionOptions::default();
    options.binder.retry_backoff = Duration::from_millis(5);
    Arc::new(
        BindingHooks::open(SESSION, store.clone(), options)
            .await
            .unwrap(),
    )
}

fn warnings(log: &[Value]) -> Vec<Value> {
    log.iter()
        .filter(|m| m["method"] == "warning")
        .map(|m| m["params"].clone())
        .collect()
}

async fn bound_thread(store: &Arc<dyn BindingStore>) -> Option<String> {
    store
        .session(SESSION)
        .await
        .unwrap()
        .and_then(|r| r.thread_id().map(str::to_string))
}

#[tokio::test]
async fn a_second_thread_start_never_moves_the_binding_and_the_client_is_told() {
    let store: Arc<dyn BindingStore> = Arc::new(MemoryStore::new());
    let (mut proxied, _fake) = proxy_fake(
        hooks(&store).await,
        rethread_fake_appserver::FakeAppServer::builder(),
    );
    let client = &mut proxied.client;
    let first = open_thread(client).await;
    client.run_turn(&first, "one", None).await.unwrap();
    assert_eq!(bound_thread(&store).await.as_deref(), Some(first.as_str()));

    let second = thread_id(&start_thread(client).await);
    assert_ne!(second, first);
    let turn = client.run_turn(&second, "two", None).await.unwrap();
    assert_eq!(turn.agent_text(), ["echo: two"], "the turn itself runs");
    // The binding stays with the session's thread, and only its turn is in the transcript.
    assert_eq!(bound_thread(&store).await.as_deref(), Some(first.as_str()));
    let record = store.session(SESSION).await.unwrap().unwrap();
    assert_eq!(record.row_count, 2);
    // Said once, on the second thread.
    client.run_turn(&second, "three", None).await.unwrap();
    let told = warnings(&client.log);
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0]["threadId"], json!(second));
    let message = told[0]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("keeps this session on thread {first}")),
        "{message}"
    );
}

#[tokio::test]
async fn an_ephemeral_thread_is_never_bound() {
    let store: Arc<dyn BindingStore> = Arc::new(MemoryStore::new());
    let (mut proxied, _fake) = proxy_fake(
        hooks(&store).await,
        rethread_fake_appserver::FakeAppServer::builder(),
    );
    let client = &mut proxied.client;
    client.initialize(false).await.unwrap();
    let answer = client
        .request(
            "thread/start",
            Some(json!({"cwd": "/tmp", "ephemeral": true})),
        )
        .await
        .unwrap();
    let thread = thread_id(&answer);
    client.run_turn(&thread, "hello", None).await.unwrap();
    assert_eq!(
        bound_thread(&store).await,
        None,
        "codex keeps no rollout of it"
    );
    assert!(warnings(&client.log).is_empty());
    // The next non-ephemeral start is the session's thread.
    let kept = thread_id(&start_thread(client).await);
    client.run_turn(&kept, "kept", None).await.unwrap();
    assert_eq!(bound_thread(&store).await.as_deref(), Some(kept.as_str()));
}

#[tokio::test]
async fn a_flood_of_tracked_requests_never_evicts_the_sessions_start_or_its_warning() {
    let store: Arc<dyn BindingStore> = Arc::new(MemoryStore::new());
    // A session bound to a thread whose rollout is gone; codex is slow to answer starts and
    // resumes, so the client's flood waits for answers beside the session's start.
    let slow_start = FaultScript::of([
        Fault::Delay {
            method: Some("thread/resume".into()),
            millis: 1000,
        },
        Fault::Delay {
            method: Some("thread/start".into()),
            millis: 500,
        },
    ]);
    let (mut proxied, fake) = proxy_fake(
        hooks(&store).await,
        rethread_fake_appserver::FakeAppServer::builder().faults(slow_start),
    );
    let lost = open_thread(&mut proxied.client).await;
    proxied.client.run_turn(&lost, "one", None).await.unwrap();
    proxied.client.close_writer().await;
    while proxied.client.next_message().await.unwrap().is_some() {}
    proxied.task.await.unwrap().unwrap();
    fake.kill().await;
    fake.corrupt_rollout(&lost, Corruption::Delete).unwrap();

    let stream = fake.restart().await.unwrap();
    let (read, write) = tokio::io::split(stream);
    let mut proxied = proxy(hooks(&store).await, read, write, |o| o);
    let client = &mut proxied.client;
    client.initialize(false).await.unwrap();
    // The session's start, then 300 tracked requests before its answer is read.
    client
        .send(&json!({"id": "start", "method": "thread/start", "params": {"cwd": "/tmp"}}))
        .await
        .unwrap();
    for i in 0..300 {
        client
            .send(&json!({"id": format!("r{i}"), "method": "thread/resume", "params": {"threadId": lost}}))
            .await
            .unwrap();
    }
    let answer = client.response_to(&json!("start")).await.unwrap();
    let new = thread_id(&answer);
    let told = warnings(&client.log);
    assert!(
        told.iter()
            .any(|w| w["message"] == RESUME_FALLBACK_NOTICE && w["threadId"] == json!(new)),
        "the fallback warning came: {told:?}"
    );
    client.run_turn(&new, "two", None).await.unwrap();
    assert_eq!(bound_thread(&store).await.as_deref(), Some(new.as_str()));
    // What was forgotten was said to the client.
    assert!(
        warnings(&client.log).iter().any(|w| w["message"]
            .as_str()
            .unwrap_or_default()
            .contains("memory limits")),
        "{:?}",
        warnings(&client.log)
    );
}
