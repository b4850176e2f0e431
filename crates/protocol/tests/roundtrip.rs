//! Round-trip property tests for every message type.

use proptest::prelude::*;
use rethread_protocol::messages::*;
use rethread_protocol::{HistoryMode, Message, RequestId, RpcError};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::{json, Map, Value};

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 _\\-/\u{e9}\u{1F600}\"\\\\]{0,12}"
}

fn history_mode() -> impl Strategy<Value = HistoryMode> {
    prop_oneof![
        Just(HistoryMode::Legacy),
        Just(HistoryMode::Paginated),
        "[a-z0-9]{1,8}".prop_map(|s| HistoryMode::parse(&s)),
    ]
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        text().prop_map(Value::from)
    ]
}

fn request_id() -> impl Strategy<Value = RequestId> {
    prop_oneof![
        any::<i64>().prop_map(RequestId::Integer),
        text().prop_map(RequestId::String)
    ]
}

fn turn_status() -> impl Strategy<Value = TurnStatus> {
    prop_oneof![
        Just(TurnStatus::Completed),
        Just(TurnStatus::Interrupted),
        Just(TurnStatus::Failed),
        Just(TurnStatus::InProgress),
        "x[a-z]{1,6}".prop_map(TurnStatus::Other),
    ]
}

fn item() -> impl Strategy<Value = ThreadItem> {
    prop_oneof![
        (text(), text())
            .prop_map(|(id, text)| ThreadItem::Known(KnownItem::AgentMessage { id, text })),
        (text(), text()).prop_map(|(id, t)| ThreadItem::Known(KnownItem::UserMessage {
            id,
            content: vec![json!({"type": "text", "text": t})]
        })),
        (text(), text()).prop_map(|(id, q)| ThreadItem::Other(
            json!({"type": "webSearch", "id": id, "query": q})
        )),
    ]
}

fn turn() -> impl Strategy<Value = Turn> {
    (
        text(),
        turn_status(),
        prop::collection::vec(item(), 0..3),
        prop::option::of(text()),
    )
        .prop_map(|(id, status, items, error)| Turn {
            id,
            status,
            items,
            error: error.map(|message| TurnError { message }),
        })
}

fn thread() -> impl Strategy<Value = Thread> {
    (
        text(),
        history_mode(),
        prop::option::of(text()),
        prop::collection::vec(turn(), 0..2),
        prop::collection::btree_map("z[a-z]{1,5}", json_leaf(), 0..3),
    )
        .prop_map(|(id, history_mode, path, turns, extra)| Thread {
            id,
            history_mode,
            path,
            preview: None,
            turns,
            extra: extra.into_iter().collect::<Map<_, _>>(),
        })
}

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(value: &T) {
    let encoded = serde_json::to_string(value).unwrap();
    let decoded: T = serde_json::from_str(&encoded).unwrap();
    assert_eq!(&decoded, value, "{encoded}");
}

proptest! {
    #[test]
    fn envelopes_round_trip(id in request_id(), method in text(), leaf in json_leaf(), code in any::<i64>(), message in text()) {
        let messages = [
            Message::Request(rethread_protocol::jsonrpc::Request { id: id.clone(), method: method.clone(), params: Some(json!({"k": leaf.clone()})) }),
            Message::notification(method.clone(), Some(json!([leaf.clone()]))),
            Message::notification(method, None),
            Message::Response(rethread_protocol::jsonrpc::Response { id: id.clone(), result: leaf }),
            Message::error(Some(id), RpcError::new(code, message.clone())),
            Message::error(None, RpcError { code: code.into(), message, data: Some(json!({"d": 1})) }),
        ];
        for message in messages {
            let line = message.to_line();
            let decoded = rethread_protocol::codec::decode_line(line.as_bytes()).unwrap();
            prop_assert_eq!(decoded, message);
        }
    }

    #[test]
    fn params_round_trip(id in text(), t in text(), flag in any::<bool>(), limit in prop::option::of(any::<u32>()), mode in prop::option::of(history_mode())) {
        round_trip(&InitializeParams { client_info: ClientInfo { name: t.clone(), version: id.clone(), title: None }, capabilities: Some(InitializeCapabilities { experimental_api: flag }) });
        let mut start = ThreadStartParams::default().cwd(t.clone()).developer_instructions(id.clone()).setting("sandbox", serde_json::json!(t.clone()));
        start.history_mode = mode;
        round_trip(&start);
        round_trip(&ThreadResumeParams::new(id.clone()).exclude_turns(flag).setting("cwd", serde_json::json!(t.clone())));
        round_trip(&ThreadReadParams { thread_id: id.clone(), include_turns: flag });
        round_trip(&ThreadListParams { cursor: Some(t.clone()), limit });
        round_trip(&TurnStartParams::new(id.clone(), vec![UserInput::text(t.clone())]));
        round_trip(&TurnInterruptParams { thread_id: id.clone(), turn_id: t.clone() });
        round_trip(&AgentMessageDeltaNotification { thread_id: id.clone(), turn_id: t.clone(), item_id: t.clone(), delta: id.clone() });
        round_trip(&WarningNotification { message: t.clone(), thread_id: Some(id.clone()) });
        round_trip(&DeprecationNoticeNotification { summary: t.clone(), details: None });
        round_trip(&ErrorNotification { thread_id: id, turn_id: t.clone(), error: TurnError { message: t }, will_retry: flag });
    }

    #[test]
    fn results_and_notifications_round_trip(th in thread(), tu in turn(), it in item(), cursor in prop::option::of(text())) {
        round_trip(&ThreadStartResponse { thread: th.clone(), model: Some("m".into()) });
        round_trip(&ThreadResumeResponse { thread: th.clone(), model: None });
        round_trip(&ThreadReadResponse { thread: th.clone() });
        round_trip(&ThreadListResponse { data: vec![th.clone()], next_cursor: cursor });
        round_trip(&TurnStartResponse { turn: tu.clone() });
        round_trip(&ThreadStartedNotification { thread: th.clone() });
        round_trip(&TurnNotification { thread_id: th.id.clone(), turn: tu.clone() });
        round_trip(&ItemNotification { thread_id: th.id, turn_id: tu.id, item: it });
        round_trip(&InitializeResponse { user_agent: Some("codex/0.169.0".into()) });
        round_trip(&TurnInterruptResponse {});
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = rethread_protocol::codec::decode_line(&bytes);
    }
}
