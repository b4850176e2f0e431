//! Request parameters, read with the wording codex's own decoder uses for a bad request, and
//! the typed result of a request handler.

use rethread_protocol::ErrorCode;
use serde_json::Value;

/// A JSON-RPC error the fake answers with: codex's code and message.
pub(super) type Failure = (ErrorCode, String);

/// What a request handler returns.
pub(super) type Handled = Result<Answer, Failure>;

/// How a request handler answered a request that did not fail.
#[derive(Debug)]
pub(super) enum Answer {
    /// Send this as the `result`.
    Reply(Value),
    /// The handler already sent the response itself, because notifications must follow it
    /// (`thread/start`, `thread/resume`, `turn/start`).
    Sent,
    /// Never answered: 0.144.6 leaves a repeated `turn/interrupt` of an interrupted turn
    /// pending forever.
    Never,
}

pub(super) fn invalid(detail: &str) -> Failure {
    (
        ErrorCode::INVALID_REQUEST,
        format!("Invalid request: {detail}"),
    )
}

pub(super) fn field_str(params: &Value, name: &str) -> Result<String, Failure> {
    match params.get(name) {
        Some(Value::String(s)) => Ok(s.clone()),
        None | Some(Value::Null) => Err(invalid(&format!("missing field `{name}`"))),
        Some(other) => Err(invalid(&format!(
            "invalid type: {}, expected a string",
            kind_of(other)
        ))),
    }
}

pub(super) fn field_bool(params: &Value, name: &str) -> Result<Option<bool>, Failure> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(invalid(&format!(
            "invalid type: {}, expected a boolean",
            kind_of(other)
        ))),
    }
}

pub(super) fn kind_of(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean `{b}`"),
        Value::Number(n) => format!("integer `{n}`"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "sequence".into(),
        Value::Object(_) => "map".into(),
    }
}
