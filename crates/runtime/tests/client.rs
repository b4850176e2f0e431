//! The client against a scripted peer: correlation, bounds, hostile streams.

mod support;

use std::time::Duration;

use rethread_protocol::messages::{ThreadRead, ThreadReadParams};
use rethread_runtime::{ClientError, ClientOptions, StatusKind};
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
    let options = ClientOptions {
        request_timeout: Duration::from_millis(100),
        ..Default::default()
    };
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
    let options = ClientOptions {
        max_bad_lines: 3,
        ..Default::default()
    };
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
    let options = ClientOptions {
        max_line_length: 256,
        ..Default::default()
    };
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
    let options = ClientOptions {
        max_pending_requests: 2,
        ..Default::default()
    };
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

#[tokio::test]
async fn a_notification_flood_for_a_slow_consumer_is_bounded_by_backpressure() {
    let options = ClientOptions {
        notification_buffer: 8,
        ..Default::default()
    };
    let (client, mut peer, _) = connect(options).await;
    let mut events = client.subscribe("t").unwrap();
    let flood = tokio::spawn(async move {
        for i in 0..200 {
            peer.notify(
                "item/agentMessage/delta",
                json!({"threadId": "t", "turnId": "u", "itemId": "i", "delta": i.to_string()}),
            )
            .await;
        }
        peer
    });
    // Every notification arrives, in order, although the buffer holds only 8.
    for i in 0..200 {
        match events.next().await.unwrap() {
            rethread_protocol::messages::ServerNotification::AgentMessageDelta(d) => {
                assert_eq!(d.delta, i.to_string())
            }
            other => panic!("{other:?}"),
        }
    }
    flood.await.unwrap();
}
