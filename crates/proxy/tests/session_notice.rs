//! The fallback notice for clients that show their user a turn's items only (Hermes, the Python
//! SDK): with `NoticeDelivery::Item` it is also an `agentMessage` item of its own at the start
//! of the new thread's next turn, once, before the model's reply, and never in the transcript;
//! it counts as delivered only once that item is written. And a turn with no user input (a
//! compaction) is recorded without a user row.

mod support;

use std::sync::Arc;
use std::time::Duration;

use rethread_fake_appserver::Corruption;
use rethread_proxy::{BindingHooks, NoticeDelivery, SessionOptions};
use rethread_runtime::RESUME_FALLBACK_NOTICE;
use rethread_store::BindingStore;
use serde_json::{json, Value};
use support::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, DuplexStream};

const SESSION: &str = "hermes-1";

fn options(notice: NoticeDelivery) -> SessionOptions {
    let mut options = SessionOptions::default();
    options.binder.retry_backoff = Duration::from_millis(5);
    options.binder.mirror = false;
    options.notice = notice;
    options
}

async fn connect(store: &BindingStore, notice: NoticeDelivery, stream: DuplexStream) -> Proxied {
    let hooks = BindingHooks::open(SESSION, store.clone(), options(notice))
        .await
        .expect("the session is free");
    support::connect(Arc::new(hooks), stream)
}

/// The notice items the client got: (method, params).
fn notice_items(log: &[Value]) -> Vec<(String, Value)> {
    log.iter()
        .filter(|m| m.pointer("/params/item/text") == Some(&json!(RESUME_FALLBACK_NOTICE)))
        .map(|m| {
            (
                m["method"].as_str().unwrap().to_string(),
                m["params"].clone(),
            )
        })
        .collect()
}

async fn rows(store: &BindingStore) -> Vec<Value> {
    let record = store.session(SESSION).await.unwrap().expect("a session");
    let rows = store.rows(SESSION, 0..record.row_count).await.unwrap();
    rows.into_iter().map(|row| row.body).collect()
}

/// Process 1 remembers a fact; its rollout is then lost: the next open falls back.
async fn a_lost_thread(store: &BindingStore) -> FakeHandle {
    let (stream, fake) = FakeAppServer::builder().spawn_in_process().unwrap();
    let mut proxied = connect(store, NoticeDelivery::Item, stream).await;
    let thread = open_thread(&mut proxied.client).await;
    let turn = proxied.client.run_turn(&thread, "remember zebra", None);
    turn.await.unwrap();
    finish(proxied).await;
    fake.kill().await;
    fake.corrupt_rollout(&thread, Corruption::Delete).unwrap();
    fake
}

#[tokio::test]
async fn the_notice_is_an_item_of_the_new_threads_first_turn_once_and_never_the_models_words() {
    let store: BindingStore = BindingStore::memory();
    let fake = a_lost_thread(&store).await;
    let mut proxied = connect(&store, NoticeDelivery::Item, fake.restart().await.unwrap()).await;
    let client = &mut proxied.client;
    let new = open_thread(client).await;
    assert!(notice_items(&client.log).is_empty(), "not before a turn");
    let turn = client.run_turn(&new, "still there?", None).await.unwrap();
    let turn_id = turn.response["result"]["turn"]["id"].clone();
    let items = notice_items(&client.log);
    let methods: Vec<&str> = items.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(methods, ["item/started", "item/completed"], "{items:?}");
    let params = &items[1].1;
    assert_eq!(params["threadId"], new.as_str());
    assert_eq!(params["turnId"], turn_id);
    assert_eq!(params["item"]["type"], "agentMessage");
    // As codex sends them, which typed clients (the Python SDK) require.
    assert!(items[0].1["startedAtMs"].is_u64(), "{items:?}");
    assert!(params["completedAtMs"].is_u64(), "{items:?}");
    let id = params["item"]["id"].as_str().unwrap();
    assert!(id.starts_with("rethread-notice-"), "an id of its own: {id}");
    // The model's reply is unchanged and comes last: a client taking the last agent message
    // as the reply (Hermes) still gets the model's.
    let texts: Vec<String> = client
        .log
        .iter()
        .filter(|m| m["method"] == "item/completed")
        .filter(|m| m.pointer("/params/item/type") == Some(&json!("agentMessage")))
        .map(|m| m["params"]["item"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(texts, [RESUME_FALLBACK_NOTICE, "echo: still there?"]);
    // The warning is still said, once, before the start's answer.
    let warnings = client.log.iter().filter(|m| m["method"] == "warning");
    assert_eq!(warnings.count(), 1);
    // The next turn carries no notice.
    client.run_turn(&new, "and now?", None).await.unwrap();
    assert_eq!(notice_items(&client.log).len(), 2, "exactly once");
    finish(proxied).await;
    // Never the model's words: not in the session's transcript.
    let rows = rows(&store).await;
    assert!(
        rows.iter().all(|r| r["text"] != RESUME_FALLBACK_NOTICE),
        "{rows:#?}"
    );
    let record = store.session(SESSION).await.unwrap().unwrap();
    assert_eq!(record.pending_notice(), None);
}

/// Said (as a warning) by a process that ended before a turn: not delivered, so the next
/// process says it again, as an item in its first turn.
#[tokio::test]
async fn a_notice_item_never_written_is_owed_to_the_next_process() {
    let store: BindingStore = BindingStore::memory();
    let fake = a_lost_thread(&store).await;
    let mut proxied = connect(&store, NoticeDelivery::Item, fake.restart().await.unwrap()).await;
    let abandoned = open_thread(&mut proxied.client).await;
    let proxied = finish(proxied).await;
    assert!(notice_items(&proxied.client.log).is_empty());
    let record = store.session(SESSION).await.unwrap().unwrap();
    let given_up = record.given_up().expect("given up");
    assert!(
        !given_up.notice_delivered,
        "only a written item delivers it"
    );

    let mut proxied = connect(&store, NoticeDelivery::Item, fake.restart().await.unwrap()).await;
    let client = &mut proxied.client;
    let new = open_thread(client).await;
    assert_ne!(new, abandoned);
    client.run_turn(&new, "hello again", None).await.unwrap();
    assert_eq!(notice_items(&client.log).len(), 2);
    finish(proxied).await;
    let record = store.session(SESSION).await.unwrap().unwrap();
    assert_eq!(record.pending_notice(), None);
}

/// The default (`warning`) writes no item.
#[tokio::test]
async fn by_default_the_notice_is_a_warning_only() {
    let store: BindingStore = BindingStore::memory();
    let fake = a_lost_thread(&store).await;
    let stream = fake.restart().await.unwrap();
    let mut proxied = connect(&store, NoticeDelivery::Warning, stream).await;
    let client = &mut proxied.client;
    let new = open_thread(client).await;
    client.run_turn(&new, "still there?", None).await.unwrap();
    assert!(notice_items(&client.log).is_empty());
    finish(proxied).await;
}

/// `thread/compact/start` (Hermes' `/compress`) runs a turn with no user input: codex is
/// played by the test, as codex 0.171.0 answers a compaction.
#[tokio::test]
async fn a_compaction_turn_is_recorded_without_a_user_row() {
    let store: BindingStore = BindingStore::memory();
    let (codex_end, proxy_end) = tokio::io::duplex(1 << 16);
    let mut proxied = connect(&store, NoticeDelivery::Warning, proxy_end).await;
    let (codex_read, mut codex_write) = tokio::io::split(codex_end);
    let mut codex_lines = tokio::io::BufReader::new(codex_read).lines();
    let codex = tokio::spawn(async move {
        let answer = |line: &str| {
            let request: Value = serde_json::from_str(line).unwrap();
            let id = request["id"].clone();
            let t = json!({"id": "t1", "turns": []});
            let turn = |status: &str| json!({"id": "c1", "items": [], "status": status});
            match request["method"].as_str() {
                Some("initialize") => vec![json!({"id": id, "result": {"userAgent": "x"}})],
                Some("thread/start") => vec![
                    json!({"id": id, "result": {"thread": t}}),
                    json!({"method": "thread/started", "params": {"thread": t}}),
                ],
                Some("thread/compact/start") => {
                    let item = json!({"type": "contextCompaction", "id": "k"});
                    let at = json!({"threadId": "t1", "turnId": "c1", "item": item});
                    vec![
                        json!({"id": id, "result": {}}),
                        json!({"method": "turn/started",
                               "params": {"threadId": "t1", "turn": turn("inProgress")}}),
                        json!({"method": "item/started", "params": at}),
                        json!({"method": "item/completed", "params": at}),
                        json!({"method": "turn/completed",
                               "params": {"threadId": "t1", "turn": turn("completed")}}),
                    ]
                }
                _ => vec![],
            }
        };
        while let Ok(Some(line)) = codex_lines.next_line().await {
            for message in answer(&line) {
                let text = format!("{message}\n");
                codex_write.write_all(text.as_bytes()).await.unwrap();
            }
        }
    });
    let client = &mut proxied.client;
    let thread = open_thread(client).await;
    let params = json!({"threadId": thread});
    let answer = client.request("thread/compact/start", Some(params)).await;
    assert!(answer.unwrap().get("result").is_some());
    client.wait_for("turn/completed").await.unwrap();
    let record = store.session(SESSION).await.unwrap().expect("a session");
    assert_eq!(record.thread_id(), Some("t1"), "the turn was committed");
    let rows = rows(&store).await;
    assert!(rows.iter().all(|r| r["role"] != "user"), "{rows:#?}");
    finish(proxied).await;
    codex.abort();
}
