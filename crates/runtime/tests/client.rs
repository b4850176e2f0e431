//! The client against a scripted peer: correlation, bounds, hostile streams.

mod support;

use std::time::Duration;

use rethread_protocol::messages::{ServerNotification, ThreadRead, ThreadReadParams};
use rethread_runtime::{ClientError, ClientOptions, StatusKind, ThreadEvent};
use serde_json::json;
use support::connect;

fn read(id: &str) -> ThreadReadParams {
    ThreadReadParams {
        thread_id: id.into(),
        include_turns: false,
    }
}

#[tokio::test]
async fn responses_are_correlated_by_id_even_out_of_order() {
    let (client, mut peer, _) = connect(ClientOptions::default()).await;
    let c1 = client.clone();
    let c2 = client.clone();
    let first = tokio::spawn(async move { c1.request::<ThreadRead>(&read("a")).await });
    let (id_a, _) = peer.expect("thread/read").await;
    let second = tokio::spawn(async move { c2.request::<ThreadRead>(&read("b")).await });
    let (id_b, _) = peer.expect("thread/read").await;
    peer.reply(id_b, json!({"thread": support::thread("b")}))
        .await;
    peer.reply(id_a, json!({"thread": support::thread("a")}))
        .await;
    assert_eq!(first.await.unwrap().unwrap().thread.id, "a");
    assert_eq!(second.await.unwrap().unwrap().thread.id, "b");
}

#[tokio::test]
async fn an_error_response_is_typed_with_the_method() {
    let (client, mut peer, _) = connect(ClientOptions::default()).await;
    let call = tokio::spawn(async move { client.request::<ThreadRead>(&read("x")).await });
    let (id, _) = peer.expect("thread/read").await;
    peer.fail(id, -32600, "no rollout found for thread id x")
        .await;
    match call.await.unwrap() {
        Err(ClientError::Rpc { method, error }) => {
            assert_eq!(method, "thread/read");
            assert_eq!(error.code.code(), -32600);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_stalled_server_times_out_and_a_late_answer_is_ignored() {
    let options = ClientOptions::default().request_timeout(Duration::from_millis(100));
    let (client, mut peer, recorded) = connect(options).await;
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.request::<ThreadRead>(&read("x")).await }
    });
    let (id, _) = peer.expect("thread/read").await;
    assert!(matches!(
        call.await.unwrap(),
        Err(ClientError::Timeout { .. })
    ));
    peer.reply(id, json!({"thread": support::thread("x")}))
        .await;
    // The connection still works after the late answer.
    let next = tokio::spawn(async move { client.request::<ThreadRead>(&read("y")).await });
    let (id, _) = peer.expect("thread/read").await;
    peer.reply(id, json!({"thread": support::thread("y")}))
        .await;
    assert_eq!(next.await.unwrap().unwrap().thread.id, "y");
    assert!(recorded
        .messages(StatusKind::Warn)
        .iter()
        .any(|m| m.contains("unknown request id")));
}

#[tokio::test]
async fn a_dead_server_fails_every_pending_request() {
    let (client, mut peer, _) = connect(ClientOptions::default()).await;
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.request::<ThreadRead>(&read(&i.to_string())).await })
        })
        .collect();
    for _ in 0..3 {
        peer.expect("thread/read").await;
    }
    peer.hang_up();
    for call in calls {
        assert!(matches!(
            call.await.unwrap(),
            Err(ClientError::Closed { .. })
        ));
    }
    assert!(matches!(
        client.request::<ThreadRead>(&read("z")).await,
        Err(ClientError::Closed { .. })
    ));
}

#[tokio::test]
async fn a_garbage_printing_server_is_closed_after_the_bound() {
    let options = ClientOptions::default().max_bad_lines(3);
    let (client, mut peer, recorded) = connect(options).await;
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.request::<ThreadRead>(&read("x")).await }
    });
    peer.expect("thread/read").await;
    for _ in 0..4 {
        peer.send_raw("\u{1b}[31mgarbage").await;
    }
    match call.await.unwrap() {
        Err(ClientError::Closed { reason, .. }) => {
            assert!(reason.contains("malformed"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(recorded.messages(StatusKind::Warn).len(), 4);
}

#[tokio::test]
async fn a_line_past_the_limit_is_skipped_and_the_stream_goes_on() {
    let options = ClientOptions::default().max_line_length(256);
    let (client, mut peer, recorded) = connect(options).await;
    let call = tokio::spawn(async move { client.request::<ThreadRead>(&read("x")).await });
    let (id, _) = peer.expect("thread/read").await;
    peer.notify("warning", json!({"message": "x".repeat(10_000)}))
        .await;
    peer.reply(id, json!({"thread": support::thread("x")}))
        .await;
    assert_eq!(call.await.unwrap().unwrap().thread.id, "x");
    assert!(recorded
        .messages(StatusKind::Warn)
        .iter()
        .any(|m| m.contains("longer than the limit")));
}

#[tokio::test]
async fn pending_requests_are_bounded() {
    let options = ClientOptions::default().max_pending_requests(2);
    let (client, mut peer, _) = connect(options).await;
    for i in 0..2 {
        let client = client.clone();
        tokio::spawn(async move { client.request::<ThreadRead>(&read(&i.to_string())).await });
        peer.expect("thread/read").await;
    }
    assert!(matches!(
        client.request::<ThreadRead>(&read("3")).await,
        Err(ClientError::TooManyPending { limit: 2 })
    ));
}

#[tokio::test]
async fn approvals_are_declined_and_unknown_server_requests_get_an_error() {
    let (_client, mut peer, recorded) = connect(ClientOptions::default()).await;
    peer.send_raw(r#"{"id":"s1","method":"item/commandExecution/requestApproval","params":{"threadId":"t","turnId":"u","itemId":"i","startedAtMs":1}}"#).await;
    match peer.recv().await {
        rethread_protocol::Message::Response(r) => {
            assert_eq!(r.id, "s1".into());
            assert_eq!(r.result, json!({"decision": "decline"}));
        }
        other => panic!("{other:?}"),
    }
    assert!(recorded
        .messages(StatusKind::Warn)
        .iter()
        .any(|m| m.contains("Declined an approval")));
    peer.send_raw(r#"{"id":7,"method":"item/tool/call","params":{}}"#)
        .await;
    match peer.recv().await {
        rethread_protocol::Message::Error(e) => {
            assert_eq!(e.id, Some(7.into()));
            assert_eq!(e.error.code.code(), -32601);
        }
        other => panic!("{other:?}"),
    }
}

/// A subscriber that does not keep up is cut off once its buffer is full: it reads what it
/// buffered, in order, then `Lagged`; the reader never waited for it (the answer after the
/// flood arrived while it was not reading) and nothing beyond its buffer was held.
#[tokio::test]
async fn a_subscriber_that_falls_a_buffer_behind_is_cut_off_not_waited_for() {
    let options = ClientOptions::default().notification_buffer(8);
    let (client, mut peer, _) = connect(options).await;
    let mut slow = client.subscribe("t").unwrap();
    let reading = {
        let client = client.clone();
        tokio::spawn(async move { client.request::<ThreadRead>(&read("t")).await })
    };
    let (id, _) = peer.expect("thread/read").await;
    for i in 0..200 {
        peer.notify(
            "item/agentMessage/delta",
            json!({"threadId": "t", "turnId": "u", "itemId": "i", "delta": i.to_string()}),
        )
        .await;
    }
    peer.reply(id, json!({"thread": support::thread("t")}))
        .await;
    // Answered although the subscriber read nothing: the reader went past it.
    reading.await.unwrap().unwrap();
    for i in 0..8 {
        match slow.next().await.unwrap() {
            ThreadEvent::Notification(ServerNotification::AgentMessageDelta(d)) => {
                assert_eq!(d.delta, i.to_string())
            }
            other => panic!("{other:?}"),
        }
    }
    match slow.next().await {
        Err(ClientError::Lagged { thread_id, buffer }) => {
            assert_eq!((thread_id.as_str(), buffer), ("t", 8))
        }
        other => panic!("{other:?}"),
    }
    // A new subscription goes on from here.
    let mut again = client.subscribe("t").unwrap();
    peer.notify(
        "item/agentMessage/delta",
        json!({"threadId": "t", "turnId": "u", "itemId": "i", "delta": "after"}),
    )
    .await;
    assert!(matches!(
        again.next().await.unwrap(),
        ThreadEvent::Notification(ServerNotification::AgentMessageDelta(d)) if d.delta == "after"
    ));
}

/// Several subscribers of one thread each get every event, and neither takes from another.
#[tokio::test]
async fn every_subscriber_of_a_thread_gets_every_event() {
    let (client, mut peer, _) = connect(ClientOptions::default()).await;
    let mut first = client.subscribe("t").unwrap();
    let mut second = client.subscribe("t").unwrap();
    let mut other_thread = client.subscribe("elsewhere").unwrap();
    for i in 0..3 {
        peer.notify(
            "item/agentMessage/delta",
            json!({"threadId": "t", "turnId": "u", "itemId": "i", "delta": i.to_string()}),
        )
        .await;
    }
    peer.notify(
        "turn/started",
        json!({"threadId": "elsewhere", "turn": {"id": "v", "status": "inProgress"}}),
    )
    .await;
    for events in [&mut first, &mut second] {
        for i in 0..3 {
            assert!(matches!(
                events.next().await.unwrap(),
                ThreadEvent::Notification(ServerNotification::AgentMessageDelta(d)) if d.delta == i.to_string()
            ));
        }
    }
    assert!(matches!(
        other_thread.next().await.unwrap(),
        ThreadEvent::Notification(ServerNotification::TurnStarted(_))
    ));
    // Dropping one leaves the other subscribed.
    drop(first);
    peer.notify(
        "item/agentMessage/delta",
        json!({"threadId": "t", "turnId": "u", "itemId": "i", "delta": "later"}),
    )
    .await;
    assert!(matches!(
        second.next().await.unwrap(),
        ThreadEvent::Notification(ServerNotification::AgentMessageDelta(d)) if d.delta == "later"
    ));
}

/// A server request about a thread reaches its subscribers with the handler's answer, before
/// the answer goes out.
#[tokio::test]
async fn subscribers_see_server_requests_with_their_answers() {
    let (client, mut peer, _) = connect(ClientOptions::default()).await;
    let mut events = client.subscribe("t").unwrap();
    peer.send_raw(r#"{"id":"s1","method":"item/commandExecution/requestApproval","params":{"threadId":"t","turnId":"u","itemId":"i","startedAtMs":1}}"#).await;
    match events.next().await.unwrap() {
        ThreadEvent::ServerRequest(answered) => {
            assert_eq!(answered.id, "s1".into());
            assert!(answered.request.is_approval());
            assert_eq!(answered.answer, Ok(json!({"decision": "decline"})));
        }
        other => panic!("{other:?}"),
    }
    match peer.recv().await {
        rethread_protocol::Message::Response(r) => assert_eq!(r.id, "s1".into()),
        other => panic!("{other:?}"),
    }
}
