//! Issue 39, "another account fails closed, once", through `rethread app-server`'s session:
//! the bound thread resumes for the client's `thread/start`, and its first turn fails as on a
//! home logged into another account (`invalid_encrypted_content`). The session gives the thread
//! up, says the notice once, and the client's next turn (still naming the thread it was
//! given) runs on a fresh thread seeded from the transcript.

mod support;

use std::sync::Arc;
use std::time::Duration;

use rethread_fake_appserver::{Fault, FaultScript};
use rethread_proxy::{BindingHooks, NoticeDelivery, SessionOptions};
use rethread_runtime::RESUME_FALLBACK_NOTICE;
use rethread_store::BindingStore;
use serde_json::{json, Value};
use support::*;
use tokio::io::DuplexStream;

const SESSION: &str = "chat-39";

async fn connect(store: &BindingStore, notice: NoticeDelivery, stream: DuplexStream) -> Proxied {
    let mut options = SessionOptions::default();
    options.binder.retry_backoff = Duration::from_millis(5);
    options.binder.mirror = false;
    options.notice = notice;
    let hooks = BindingHooks::open(SESSION, store.clone(), options)
        .await
        .expect("the session is free");
    support::connect(Arc::new(hooks), stream)
}

fn warnings(log: &[Value]) -> usize {
    let notice = json!(RESUME_FALLBACK_NOTICE);
    let warning = |m: &&Value| m["method"] == "warning" && m["params"]["message"] == notice;
    log.iter().filter(warning).count()
}

fn notice_items(log: &[Value]) -> usize {
    let notice = json!(RESUME_FALLBACK_NOTICE);
    let item =
        |m: &&Value| m["method"] == "item/completed" && m["params"]["item"]["text"] == notice;
    log.iter().filter(item).count()
}

#[tokio::test]
async fn another_accounts_first_turn_is_given_up_once_and_the_next_turn_runs_fresh() {
    for notice in [NoticeDelivery::Warning, NoticeDelivery::Item] {
        let store = BindingStore::memory();
        let (stream, fake) = FakeAppServer::builder().spawn_in_process().unwrap();
        let mut proxied = connect(&store, notice, stream).await;
        let old = open_thread(&mut proxied.client).await;
        proxied
            .client
            .run_turn(&old, "remember PAPAYA", None)
            .await
            .unwrap();
        finish(proxied).await;

        // The next connection (another home, another account): resumed, and its first turn
        // refused.
        fake.set_faults(FaultScript::of([Fault::InvalidEncryptedContent {
            turn: 2,
        }]));
        let mut proxied = connect(&store, notice, fake.restart().await.unwrap()).await;
        let client = &mut proxied.client;
        assert_eq!(
            open_thread(client).await,
            old,
            "resumed as the start's answer"
        );
        let failed = client
            .run_turn(&old, "what was the fruit?", None)
            .await
            .unwrap();
        assert_eq!(failed.status().as_deref(), Some("failed"), "{notice:?}");
        let record = store.session(SESSION).await.unwrap().unwrap();
        assert_eq!(
            record.thread_id(),
            None,
            "{notice:?}: the binding is dropped"
        );
        let given_up = record.given_up().expect("given up");
        assert_eq!(given_up.reason, "account_mismatch");

        // The client goes on with the thread it knows: the turn runs on a fresh thread,
        // seeded, and so does the next.
        let turn = client.run_turn(&old, "and now?", None).await.unwrap();
        assert_eq!(
            turn.status().as_deref(),
            Some("completed"),
            "{notice:?}: {:?}",
            turn.messages
        );
        let completed = turn.completed.clone().unwrap();
        let new = completed["params"]["threadId"]
            .as_str()
            .unwrap()
            .to_string();
        assert_ne!(new, old);
        let seen = fake.model_requests().last().unwrap().conversation.clone();
        assert_eq!(fake.model_requests().last().unwrap().thread_id, new);
        assert!(
            seen.iter().any(|m| m.text.contains("PAPAYA")),
            "the seed: {seen:?}"
        );
        let again = client.run_turn(&old, "once more", None).await.unwrap();
        assert_eq!(again.status().as_deref(), Some("completed"));
        match notice {
            NoticeDelivery::Warning => assert_eq!(warnings(&client.log), 1, "{:#?}", client.log),
            _ => {
                assert_eq!(warnings(&client.log), 1, "{:#?}", client.log);
                assert_eq!(notice_items(&client.log), 1, "{:#?}", client.log);
            }
        }
        finish(proxied).await;
        let record = store.session(SESSION).await.unwrap().unwrap();
        assert_eq!(record.thread_id(), Some(new.as_str()));
        let from = record.binding().unwrap().fell_back_from.clone().unwrap();
        assert_eq!(
            (from.thread_id.as_str(), from.reason.as_str()),
            (old.as_str(), "account_mismatch")
        );
        assert_eq!(record.pending_notice(), None);
    }
}

/// A client that starts a thread itself after the failed turn gets the seeded replacement as
/// the session's thread (the notice not said again), and a request still naming the given-up
/// thread goes to that thread too.
#[tokio::test]
async fn a_client_that_starts_again_after_the_failed_turn_gets_the_replacement() {
    let store = BindingStore::memory();
    let (stream, fake) = FakeAppServer::builder().spawn_in_process().unwrap();
    let mut proxied = connect(&store, NoticeDelivery::Warning, stream).await;
    let old = open_thread(&mut proxied.client).await;
    proxied
        .client
        .run_turn(&old, "remember PAPAYA", None)
        .await
        .unwrap();
    finish(proxied).await;

    fake.set_faults(FaultScript::of([Fault::InvalidEncryptedContent {
        turn: 2,
    }]));
    let mut proxied = connect(
        &store,
        NoticeDelivery::Warning,
        fake.restart().await.unwrap(),
    )
    .await;
    let client = &mut proxied.client;
    assert_eq!(open_thread(client).await, old);
    let failed = client
        .run_turn(&old, "what was the fruit?", None)
        .await
        .unwrap();
    assert_eq!(failed.status().as_deref(), Some("failed"));
    let new = thread_id(&start_thread(client).await);
    assert_ne!(new, old);
    let turn = client.run_turn(&old, "and now?", None).await.unwrap();
    assert_eq!(turn.completed.unwrap()["params"]["threadId"], new.as_str());
    assert_eq!(warnings(&client.log), 1, "{:#?}", client.log);
    finish(proxied).await;
    let record = store.session(SESSION).await.unwrap().unwrap();
    assert_eq!(record.thread_id(), Some(new.as_str()));
    let from = record.binding().unwrap().fell_back_from.clone().unwrap();
    assert_eq!(from.reason, "account_mismatch");
}
