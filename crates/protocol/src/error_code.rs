//! JSON-RPC error codes used by codex app-server.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A JSON-RPC error code. Known codes have associated constants; any other integer is kept.
///
/// ```
/// use rethread_protocol::ErrorCode;
/// assert_eq!(ErrorCode::from(-32601), ErrorCode::METHOD_NOT_FOUND);
/// assert_eq!(serde_json::to_string(&ErrorCode::OVERLOADED).unwrap(), "-32001");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ErrorCode(pub i64);

impl ErrorCode {
    /// -32700: the line was not valid JSON.
    pub const PARSE_ERROR: ErrorCode = ErrorCode(-32700);
    /// -32600: codex uses it for "gone", "busy", "not initialized" and capability errors alike.
    pub const INVALID_REQUEST: ErrorCode = ErrorCode(-32600);
    /// -32601: unknown method, or (0.144.6) `paginated_threads is not supported yet`.
    pub const METHOD_NOT_FOUND: ErrorCode = ErrorCode(-32601);
    /// -32602: params did not decode.
    pub const INVALID_PARAMS: ErrorCode = ErrorCode(-32602);
    /// -32603: the server failed internally (unreadable rollout, unknown history mode, ...).
    pub const INTERNAL_ERROR: ErrorCode = ErrorCode(-32603);
    /// -32001: the server is overloaded; retry later.
    pub const OVERLOADED: ErrorCode = ErrorCode(-32001);

    /// The integer on the wire.
    pub fn code(self) -> i64 {
        self.0
    }

    /// The conventional name, if the code is one of the known ones.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            ErrorCode::PARSE_ERROR => "parse error",
            ErrorCode::INVALID_REQUEST => "invalid request",
            ErrorCode::METHOD_NOT_FOUND => "method not found",
            ErrorCode::INVALID_PARAMS => "invalid params",
            ErrorCode::INTERNAL_ERROR => "internal error",
            ErrorCode::OVERLOADED => "overloaded",
            _ => return None,
        })
    }
}

impl From<i64> for ErrorCode {
    fn from(code: i64) -> Self {
        ErrorCode(code)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{} ({name})", self.0),
            None => write!(f, "{}", self.0),
        }
    }
}
