//! The routing peek agrees with the protocol crate's decoding on every message, whatever the
//! member order and the extra members, and never panics on arbitrary bytes.

use proptest::prelude::*;
use rethread_protocol::codec::decode_line;
use rethread_protocol::{Message, RequestId};
use rethread_proxy::{peek, peek_prefix, LineKind};
use serde_json::{json, Map, Value};

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-1e9f64..1e9).prop_map(|f| json!(f)),
        // Quotes, backslashes, braces and non-ASCII inside strings must not confuse the scan.
        "[a-z\"\\\\{}\\[\\]:,é\\n\\t ]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec(("[a-z\"\\\\]{0,6}", inner), 0..5)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
}

fn request_id() -> impl Strategy<Value = RequestId> {
    prop_oneof![
        any::<i64>().prop_map(RequestId::Integer),
        "[0-9a-f-]{0,36}|rethread-proxy:[0-9]{1,3}|\"\\\\é".prop_map(RequestId::String),
    ]
}

#[derive(Debug, Clone)]
enum Shape {
    Request(RequestId, String),
    Notification(String),
    Response(RequestId),
    Error(Option<RequestId>),
}

fn shape() -> impl Strategy<Value = Shape> {
    let method = "[a-z/]{1,20}|it\"em/\\\\x";
    prop_oneof![
        (request_id(), method).prop_map(|(id, m)| Shape::Request(id, m)),
        method.prop_map(Shape::Notification),
        request_id().prop_map(Shape::Response),
        prop::option::of(request_id()).prop_map(Shape::Error),
    ]
}

fn id_value(id: &RequestId) -> Value {
    serde_json::to_value(id).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn peek_agrees_with_decoding(
        shape in shape(),
        payload in json_value(),
        extras in prop::collection::vec(("[a-z]{1,8}", json_value()), 0..3),
        order in any::<prop::sample::Index>(),
        spaced in any::<bool>(),
    ) {
        let mut members: Vec<(String, Value)> = match &shape {
            Shape::Request(id, m) => vec![("id".into(), id_value(id)), ("method".into(), json!(m)), ("params".into(), payload)],
            Shape::Notification(m) => vec![("method".into(), json!(m)), ("params".into(), payload)],
            Shape::Response(id) => vec![("id".into(), id_value(id)), ("result".into(), payload)],
            Shape::Error(id) => vec![
                ("id".into(), id.as_ref().map_or(Value::Null, id_value)),
                ("error".into(), json!({"code": -32600, "message": "m", "data": payload})),
            ],
        };
        for (key, value) in extras {
            if !["id", "method", "params", "result", "error"].contains(&key.as_str()) {
                members.push((key, value));
            }
        }
        let len = members.len();
        members.rotate_left(order.index(len));
        let object: Map<String, Value> = members.into_iter().collect();
        let text = if spaced {
            serde_json::to_string_pretty(&Value::Object(object)).unwrap()
        } else {
            serde_json::to_string(&Value::Object(object)).unwrap()
        };
        let decoded = decode_line(text.as_bytes()).unwrap();
        let seen = peek(text.as_bytes());
        let expected_kind = match &decoded {
            Message::Request(_) => LineKind::Request,
            Message::Notification(_) => LineKind::Notification,
            Message::Response(_) => LineKind::Response,
            Message::Error(_) => LineKind::Error,
        };
        prop_assert_eq!(seen.kind, expected_kind, "{}", text);
        prop_assert_eq!(seen.id.as_ref(), decoded.id(), "{}", text);
        prop_assert_eq!(seen.method.as_deref(), decoded.method(), "{}", text);
        // Any prefix: no panic, and what it tells is never wrong.
        for cut in [1, text.len() / 3, text.len() / 2, text.len() - 1] {
            if let Some(partial) = peek_prefix(&text.as_bytes()[..cut]) {
                prop_assert_eq!(partial.id.as_ref(), decoded.id(), "{}", text);
                if partial.kind == LineKind::Request {
                    prop_assert_eq!(expected_kind, LineKind::Request);
                }
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let seen = peek(&bytes);
        if decode_line(&bytes).is_err() && !bytes.contains(&b'{') {
            prop_assert_eq!(seen.kind, LineKind::Other);
        }
        let _ = peek_prefix(&bytes);
    }
}
