//! The session rules of issue 19 through the proxy, against the in-process fake: the session
//! stays on its own thread (a second `thread/start`, even one sent before the session's own is
//! answered, never moves the binding, and the client is told; a fork or a resume of another
//! thread takes the same path, pinned in `crates/runtime/tests/machine.rs`), an ephemeral thread
//! is never bound, a client that floods the bounded tracking never loses the session's own start
//! or its fallback warning, another session's thread cannot be resumed here, and a stall past the
//! lease's TTL with nobody competing goes on recording.

mod support;

use std::sync::Arc;
use std::time::Duration;

use rethread_fake_appserver::faults::{Fault, FaultScript};
use rethread_fake_appserver::Corruption;
use rethread_proxy::{BindingHooks, SessionOptions};
use rethread_runtime::RESUME_FALLBACK_NOTICE;
use rethread_store::BindingStore;
use serde_json::json;
use support::*;

const SESSION: &str = "rules";

/// The rules without the rollout mirror (`tests/session_mirror.rs` has it).
fn no_mirror() -> SessionOptions {
    let mut options = SessionOptions::default();
    options.binder.mirror = false;
    options
}

async fn hooks(store: &BindingStore) -> Arc<BindingHooks> {
    let mut options = no_mirror();
    options.binder.retry_backoff = Duration::from_millis(5);
    Arc::new(
        BindingHooks::open(SESSION, store.clone(), options)
            .await
            .unwrap(),
    )
}

async fn bound_thread(store: &BindingStore) -> Option<String> {
    store
        .session(SESSION)
        .await
        .unwrap()
        .and_then(|r| r.thread_id().map(str::to_string))
}

#[tokio::test]
async fn a_second_thread_start_never_moves_the_binding_and_the_client_is_told() {
    let store: BindingStore = BindingStore::memory();
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

/// A second `thread/start` sent while the session's own is still unanswered is the client's own
/// thread: forwarded and answered (it was swallowed, as if part of the session's open), and
/// never bound in the session's place.
#[tokio::test]
async fn a_second_thread_start_before_the_first_is_answered_is_the_clients_own() {
    let store: BindingStore = BindingStore::memory();
    let slow_start = FaultScript::of([Fault::Delay {
        method: Some("thread/start".into()),
        millis: 500,
    }]);
    let (mut proxied, _fake) = proxy_fake(
        hooks(&store).await,
        rethread_fake_appserver::FakeAppServer::builder().faults(slow_start),
    );
    let client = &mut proxied.client;
    client.initialize(false).await.unwrap();
    for id in ["a", "b"] {
        client
            .send(&json!({"id": id, "method": "thread/start", "params": {"cwd": "/tmp"}}))
            .await
            .unwrap();
    }
    let answer = tokio::time::timeout(Duration::from_secs(5), client.response_to(&json!("b")))
        .await
        .expect("the second start is answered")
        .unwrap();
    let second = thread_id(&answer);
    let first = thread_id(&client.response_to(&json!("a")).await.unwrap());
    assert_ne!(first, second);
    client.run_turn(&first, "one", None).await.unwrap();
    client.run_turn(&second, "two", None).await.unwrap();
    assert_eq!(bound_thread(&store).await.as_deref(), Some(first.as_str()));
    let record = store.session(SESSION).await.unwrap().unwrap();
    assert_eq!(record.row_count, 2, "only the session's turn is recorded");
    let told = warnings(&client.log);
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0]["threadId"], json!(second));
}

#[tokio::test]
async fn an_ephemeral_thread_is_never_bound() {
    let store: BindingStore = BindingStore::memory();
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
    let store: BindingStore = BindingStore::memory();
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

    let mut proxied = connect(hooks(&store).await, fake.restart().await.unwrap());
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

#[tokio::test]
async fn a_thread_of_another_session_cannot_be_resumed_in_this_one() {
    let store: BindingStore = BindingStore::memory();
    // Session B has a thread with a committed turn.
    let b = Arc::new(
        BindingHooks::open("b", store.clone(), no_mirror())
            .await
            .unwrap(),
    );
    let (mut proxied, fake) = proxy_fake(b, rethread_fake_appserver::FakeAppServer::builder());
    let theirs = open_thread(&mut proxied.client).await;
    proxied
        .client
        .run_turn(&theirs, "mine", None)
        .await
        .unwrap();
    proxied.client.close_writer().await;
    while proxied.client.next_message().await.unwrap().is_some() {}
    proxied.task.await.unwrap().unwrap();

    // Inside session A, the client resumes B's thread by id: refused, nothing forwarded.
    let mut proxied = connect(hooks(&store).await, fake.restart().await.unwrap());
    let client = &mut proxied.client;
    client.initialize(false).await.unwrap();
    // Issue 34: in every spelling codex reads, and whatever the request.
    let upper = theirs.to_uppercase();
    for spelling in [theirs.as_str(), &upper, &theirs.replace('-', "")] {
        for method in [
            "thread/resume",
            "thread/fork",
            "thread/read",
            "thread/turns/list",
        ] {
            let params = json!({"threadId": spelling, "includeTurns": true});
            let answer = client.request(method, Some(params)).await.unwrap();
            assert_eq!(answer["error"]["code"], -32600, "{answer}");
            assert_eq!(answer["error"]["data"]["rethread"]["kind"], "thread_taken");
            assert_eq!(answer["error"]["data"]["rethread"]["ownerSessionId"], "b");
        }
    }
    // A turn sent anyway on B's thread (codex never resumed it here) records nothing for A.
    let _ = client.run_turn(&theirs, "sneaky", None).await;
    assert_eq!(
        bound_thread(&store).await,
        None,
        "A is not bound to B's thread"
    );
    let b_record = store.session("b").await.unwrap().unwrap();
    assert_eq!(b_record.thread_id(), Some(theirs.as_str()));
    assert_eq!(b_record.row_count, 2);
}

/// Issue 19, item 2: a proxy that stalls past its lease's TTL (a laptop asleep) with nobody
/// competing takes the lease back and goes on recording; it says nothing about losing it.
#[tokio::test]
async fn a_stall_past_the_lease_ttl_with_nobody_competing_goes_on_recording() {
    let store: BindingStore = BindingStore::memory();
    let mut options = no_mirror();
    options.binder.lease_ttl = Some(Duration::from_millis(150));
    let hooks = Arc::new(
        BindingHooks::open(SESSION, store.clone(), options)
            .await
            .unwrap(),
    );
    let (mut proxied, _fake) = proxy_fake(hooks, rethread_fake_appserver::FakeAppServer::builder());
    let client = &mut proxied.client;
    let thread = open_thread(client).await;
    client
        .run_turn(&thread, "before the stall", None)
        .await
        .unwrap();
    // The whole process stops (this blocks the test's only runtime thread): no renewal runs,
    // and the lease expires in the store.
    std::thread::sleep(Duration::from_millis(500));
    client
        .run_turn(&thread, "after the stall", None)
        .await
        .unwrap();
    let record = store.session(SESSION).await.unwrap().unwrap();
    assert_eq!(record.row_count, 4, "both turns recorded");
    assert_eq!(record.thread_id(), Some(thread.as_str()));
    assert!(
        warnings(&client.log).is_empty(),
        "{:?}",
        warnings(&client.log)
    );
}

/// Issue 19, item 7: a fallback warning written to the client is delivered, even when the
/// client reads it and goes away without another line: the next connection says nothing.
#[tokio::test]
async fn a_warning_written_to_a_client_that_then_leaves_is_not_said_again() {
    let store: BindingStore = BindingStore::memory();
    let (mut proxied, fake) = proxy_fake(
        hooks(&store).await,
        rethread_fake_appserver::FakeAppServer::builder(),
    );
    let lost = open_thread(&mut proxied.client).await;
    proxied.client.run_turn(&lost, "one", None).await.unwrap();
    proxied.client.close_writer().await;
    while proxied.client.next_message().await.unwrap().is_some() {}
    proxied.task.await.unwrap().unwrap();
    fake.kill().await;
    fake.corrupt_rollout(&lost, Corruption::Delete).unwrap();

    // The fallback: the client gets the warning and the answer, then leaves at once.
    let mut proxied = connect(hooks(&store).await, fake.restart().await.unwrap());
    proxied.client.initialize(false).await.unwrap();
    start_thread(&mut proxied.client).await;
    assert_eq!(warnings(&proxied.client.log).len(), 1);
    proxied.client.close_writer().await;
    while proxied.client.next_message().await.unwrap().is_some() {}
    proxied.task.await.unwrap().unwrap();
    let record = store.session(SESSION).await.unwrap().unwrap();
    assert!(
        record.given_up().is_some_and(|g| g.notice_delivered),
        "{record:?}"
    );

    // The next connection starts the replacement again, and says nothing.
    let mut proxied = connect(hooks(&store).await, fake.restart().await.unwrap());
    proxied.client.initialize(false).await.unwrap();
    let new = thread_id(&start_thread(&mut proxied.client).await);
    proxied.client.run_turn(&new, "two", None).await.unwrap();
    assert!(
        warnings(&proxied.client.log).is_empty(),
        "{:?}",
        warnings(&proxied.client.log)
    );
    assert_eq!(bound_thread(&store).await.as_deref(), Some(new.as_str()));
}
