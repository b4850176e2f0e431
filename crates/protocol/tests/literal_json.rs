//! Each type pinned to the literal JSON codex sends or accepts.

use rethread_protocol::messages::*;
use rethread_protocol::{HistoryMode, Message, RequestId, RpcError};
use serde_json::{json, Value};

fn line<P: serde::Serialize>(id: i64, method: &str, params: &P) -> String {
    Message::request(id, method, params).unwrap().to_line()
}

#[test]
fn initialize_request_is_pinned() {
    let params = InitializeParams {
        client_info: ClientInfo {
            name: "rethread".into(),
            version: "0.1.0".into(),
            title: None,
        },
        capabilities: Some(InitializeCapabilities {
            experimental_api: true,
        }),
    };
    assert_eq!(
        line(1, Initialize::METHOD, &params),
        r#"{"id":1,"method":"initialize","params":{"clientInfo":{"name":"rethread","version":"0.1.0"},"capabilities":{"experimentalApi":true}}}"#
    );
    assert_eq!(
        Message::notification(INITIALIZED, None).to_line(),
        r#"{"method":"initialized"}"#
    );
}

#[test]
fn thread_requests_are_pinned() {
    let start = ThreadStartParams::default()
        .cwd("/w")
        .history_mode(HistoryMode::Legacy)
        .developer_instructions("seed");
    assert_eq!(
        line(2, ThreadStart::METHOD, &start),
        r#"{"id":2,"method":"thread/start","params":{"cwd":"/w","historyMode":"legacy","developerInstructions":"seed"}}"#
    );
    assert_eq!(
        line(3, ThreadResume::METHOD, &ThreadResumeParams::new("t1")),
        r#"{"id":3,"method":"thread/resume","params":{"threadId":"t1"}}"#
    );
    let read = ThreadReadParams {
        thread_id: "t1".into(),
        include_turns: true,
    };
    assert_eq!(
        line(4, ThreadRead::METHOD, &read),
        r#"{"id":4,"method":"thread/read","params":{"threadId":"t1","includeTurns":true}}"#
    );
    let list = ThreadListParams {
        cursor: Some("c".into()),
        limit: Some(10),
    };
    assert_eq!(
        line(5, ThreadList::METHOD, &list),
        r#"{"id":5,"method":"thread/list","params":{"cursor":"c","limit":10}}"#
    );
    let turns = ThreadTurnsListParams {
        thread_id: "t1".into(),
        limit: Some(1),
    };
    assert_eq!(
        line(7, ThreadTurnsList::METHOD, &turns),
        r#"{"id":7,"method":"thread/turns/list","params":{"threadId":"t1","limit":1}}"#
    );
}

#[test]
fn turn_requests_are_pinned() {
    let start = TurnStartParams::new("t1", vec![UserInput::text("hi")]);
    assert_eq!(
        line(6, TurnStart::METHOD, &start),
        r#"{"id":6,"method":"turn/start","params":{"threadId":"t1","input":[{"type":"text","text":"hi"}]}}"#
    );
    let interrupt = TurnInterruptParams {
        thread_id: "t1".into(),
        turn_id: "u1".into(),
    };
    assert_eq!(
        line(7, TurnInterrupt::METHOD, &interrupt),
        r#"{"id":7,"method":"turn/interrupt","params":{"threadId":"t1","turnId":"u1"}}"#
    );
}

#[test]
fn responses_and_errors_are_pinned() {
    let ok = Message::response(RequestId::from("a"), &TurnInterruptResponse {}).unwrap();
    assert_eq!(ok.to_line(), r#"{"id":"a","result":{}}"#);
    let err = Message::error(Some(3.into()), RpcError::new(-32600, "Not initialized"));
    assert_eq!(
        err.to_line(),
        r#"{"id":3,"error":{"code":-32600,"message":"Not initialized"}}"#
    );
    let null_id = Message::error(None, RpcError::new(-32700, "parse error"));
    assert_eq!(
        null_id.to_line(),
        r#"{"id":null,"error":{"code":-32700,"message":"parse error"}}"#
    );
}

#[test]
fn thread_decodes_with_unknown_fields_and_keeps_them() {
    let wire = json!({
        "id": "019a", "historyMode": "paginated", "path": "/h/rollout.jsonl", "preview": "hi",
        "turns": [], "cliVersion": "0.169.0", "extra": {"x": 1}, "canAcceptDirectInput": true
    });
    let thread: Thread = serde_json::from_value(wire.clone()).unwrap();
    assert_eq!(thread.history_mode, HistoryMode::Paginated);
    assert_eq!(thread.extra["cliVersion"], "0.169.0");
    assert_eq!(serde_json::to_value(&thread).unwrap(), wire);
}

#[test]
fn history_mode_absent_is_legacy_and_unknown_is_kept() {
    let old: Thread = serde_json::from_value(json!({"id": "t"})).unwrap();
    assert_eq!(old.history_mode, HistoryMode::Legacy);
    let odd: Thread = serde_json::from_value(json!({"id": "t", "historyMode": "v3"})).unwrap();
    assert_eq!(odd.history_mode, HistoryMode::Unknown("v3".into()));
    assert!(!odd.history_mode.is_legacy());
    assert_eq!(serde_json::to_value(&odd).unwrap()["historyMode"], "v3");
}

#[test]
fn notifications_decode_typed_or_raw() {
    let completed: Message = serde_json::from_value(json!({
        "method": "turn/completed", "emittedAtMs": 1,
        "params": {"threadId": "t", "turn": {"id": "u", "status": "completed", "items": [
            {"type": "userMessage", "id": "i1", "content": [{"type": "text", "text": "hi"}]},
            {"type": "agentMessage", "id": "i2", "text": "hello", "phase": null},
            {"type": "reasoning", "id": "i3"}
        ]}}
    }))
    .unwrap();
    let Message::Notification(raw) = completed else {
        panic!("not a notification")
    };
    let ServerNotification::TurnCompleted(n) = ServerNotification::from_raw(&raw).unwrap() else {
        panic!("not turn/completed")
    };
    assert_eq!(n.turn.status, TurnStatus::Completed);
    assert_eq!(
        n.turn.items[1],
        ThreadItem::Known(KnownItem::AgentMessage {
            id: "i2".into(),
            text: "hello".into()
        })
    );
    assert_eq!(n.turn.items[2].kind(), Some("reasoning"));

    let other: Message = serde_json::from_value(
        json!({"method": "thread/status/changed", "params": {"threadId": "t", "status": {"type": "idle"}}}),
    )
    .unwrap();
    let Message::Notification(raw) = other else {
        panic!()
    };
    let typed = ServerNotification::from_raw(&raw).unwrap();
    assert!(
        matches!(typed, ServerNotification::Other { ref method, .. } if method == "thread/status/changed")
    );
    assert_eq!(typed.thread_id(), Some("t"));
}

/// As 0.171.0 sends them (it adds `cacheWriteInputTokens`; 0.144.6 and 0.169.0 do not).
#[test]
fn token_usage_and_deltas_decode_typed() {
    let usage = json!({"totalTokens": 2, "inputTokens": 1, "cachedInputTokens": 0,
                       "cacheWriteInputTokens": 0, "outputTokens": 1, "reasoningOutputTokens": 0});
    let raw = rethread_protocol::jsonrpc::Notification {
        method: "thread/tokenUsage/updated".into(),
        params: Some(json!({"threadId": "t", "turnId": "u",
                            "tokenUsage": {"total": usage, "last": usage, "modelContextWindow": 258400}})),
    };
    let ServerNotification::TokenUsageUpdated(n) = ServerNotification::from_raw(&raw).unwrap()
    else {
        panic!("not typed")
    };
    assert_eq!(n.turn_id, "u");
    assert_eq!(n.token_usage.total.total_tokens, 2);
    assert_eq!(n.token_usage.last.output_tokens, 1);
    assert_eq!(n.token_usage.model_context_window, Some(258400));
    assert_eq!(
        ServerNotification::TokenUsageUpdated(n).thread_id(),
        Some("t")
    );
    let without_window: ThreadTokenUsage =
        serde_json::from_value(json!({"total": usage, "last": usage})).unwrap();
    assert_eq!(without_window.model_context_window, None);

    let delta = rethread_protocol::jsonrpc::Notification {
        method: "item/agentMessage/delta".into(),
        params: Some(json!({"threadId": "t", "turnId": "u", "itemId": "m1", "delta": "hel"})),
    };
    let ServerNotification::AgentMessageDelta(d) = ServerNotification::from_raw(&delta).unwrap()
    else {
        panic!("not typed")
    };
    assert_eq!((d.item_id.as_str(), d.delta.as_str()), ("m1", "hel"));
}

#[test]
fn image_inputs_are_pinned() {
    let start = TurnStartParams::new(
        "t1",
        vec![
            UserInput::text("what is this?"),
            UserInput::local_image("/tmp/a.png"),
            UserInput::image_url("https://example.invalid/b.png"),
        ],
    );
    assert_eq!(
        line(8, TurnStart::METHOD, &start),
        r#"{"id":8,"method":"turn/start","params":{"threadId":"t1","input":[{"type":"text","text":"what is this?"},{"type":"localImage","path":"/tmp/a.png"},{"type":"image","url":"https://example.invalid/b.png"}]}}"#
    );
}

#[test]
fn unknown_turn_status_is_kept() {
    let turn: Turn = serde_json::from_value(json!({"id": "u", "status": "paused"})).unwrap();
    assert_eq!(turn.status, TurnStatus::Other("paused".into()));
}

#[test]
fn server_requests_decline_in_their_own_vocabulary() {
    let raw: Message = serde_json::from_value(json!({
        "id": 9, "method": "item/commandExecution/requestApproval",
        "params": {"threadId": "t", "turnId": "u", "itemId": "i", "startedAtMs": 1}
    }))
    .unwrap();
    let Message::Request(raw) = raw else { panic!() };
    let request = ServerRequest::from_raw(&raw).unwrap();
    assert_eq!(
        request.decline_result(),
        Some(json!({"decision": "decline"}))
    );
    let legacy = rethread_protocol::jsonrpc::Request {
        id: 1.into(),
        method: "execCommandApproval".into(),
        params: Some(json!({})),
    };
    assert_eq!(
        ServerRequest::from_raw(&legacy).unwrap().decline_result(),
        Some(json!({"decision": "abort"}))
    );
    let tool = rethread_protocol::jsonrpc::Request {
        id: 2.into(),
        method: "item/tool/call".into(),
        params: None,
    };
    assert_eq!(
        ServerRequest::from_raw(&tool).unwrap().decline_result(),
        None
    );
}

#[test]
fn server_requests_name_their_thread_and_turn() {
    let request = |method: &str, params: Value| {
        ServerRequest::from_raw(&rethread_protocol::jsonrpc::Request {
            id: 1.into(),
            method: method.into(),
            params: Some(params),
        })
        .unwrap()
    };
    let v2 = request(
        "item/fileChange/requestApproval",
        json!({"threadId": "t", "turnId": "u", "itemId": "i"}),
    );
    assert!(v2.is_approval());
    assert_eq!((v2.thread_id(), v2.turn_id()), (Some("t"), Some("u")));
    assert_eq!(v2.method(), "item/fileChange/requestApproval");
    let legacy = request(
        "execCommandApproval",
        json!({"conversationId": "t", "callId": "c"}),
    );
    assert_eq!((legacy.thread_id(), legacy.turn_id()), (Some("t"), None));
    let tool = request("item/tool/call", json!({"threadId": "t", "turnId": "u"}));
    assert!(!tool.is_approval());
    assert_eq!((tool.thread_id(), tool.turn_id()), (Some("t"), Some("u")));
    assert_eq!(request("item/tool/call", json!(7)).thread_id(), None);
}

#[test]
fn envelope_rejects_non_messages_with_reasons() {
    use rethread_protocol::EnvelopeError;
    assert_eq!(
        Message::from_value(json!([1])),
        Err(EnvelopeError::NotAnObject)
    );
    assert_eq!(
        Message::from_value(json!({"id": 1})),
        Err(EnvelopeError::NoKind)
    );
    assert_eq!(
        Message::from_value(json!({"result": 1})),
        Err(EnvelopeError::ResponseWithoutId)
    );
    assert!(matches!(
        Message::from_value(json!({"id": 1.5, "result": 1})),
        Err(EnvelopeError::InvalidMember { member: "id", .. })
    ));
    assert!(matches!(
        Message::from_value(json!({"method": 3})),
        Err(EnvelopeError::InvalidMember {
            member: "method",
            ..
        })
    ));
}
