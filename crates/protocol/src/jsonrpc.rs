//! The JSON-RPC envelope as codex speaks it: one JSON object per line, no `"jsonrpc"` member
//! required on input and none sent.

use std::fmt;

use serde::de::{self, DeserializeOwned};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::ErrorCode;

mod members;
pub(crate) use members::{Members, Unique};

/// A request id: codex accepts integers and strings.
///
/// ```
/// use rethread_protocol::RequestId;
/// assert_eq!(serde_json::to_string(&RequestId::from(3)).unwrap(), "3");
/// assert_eq!(serde_json::to_string(&RequestId::from("a")).unwrap(), r#""a""#);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RequestId {
    /// An integer id (what rethread sends).
    Integer(i64),
    /// A string id.
    String(String),
}

impl From<i64> for RequestId {
    fn from(id: i64) -> Self {
        RequestId::Integer(id)
    }
}

impl From<&str> for RequestId {
    fn from(id: &str) -> Self {
        RequestId::String(id.to_string())
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::Integer(id) => write!(f, "{id}"),
            RequestId::String(id) => write!(f, "{id:?}"),
        }
    }
}

/// The `error` member of an error response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{message} (code {code})")]
pub struct RpcError {
    /// The error code.
    pub code: ErrorCode,
    /// The human-readable message; codex's messages carry meaning (see
    /// [`classify_resume_error`](crate::classify_resume_error)).
    pub message: String,
    /// Optional structured data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    /// An error with no data.
    pub fn new(code: impl Into<ErrorCode>, message: impl Into<String>) -> Self {
        RpcError {
            code: code.into(),
            message: message.into(),
            data: None,
        }
    }
}

/// A request: an `id` and a `method`. A server request (an approval, `item/tool/call`, ...)
/// must be answered or the turn waits forever.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Request {
    /// Correlates the response.
    pub id: RequestId,
    /// The method name, e.g. `thread/resume`.
    pub method: String,
    /// Parameters; omitted on the wire when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
}

/// A notification: a `method` and no `id`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Notification {
    /// The method name, e.g. `turn/completed`.
    pub method: String,
    /// Parameters; omitted on the wire when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
}

/// A successful response.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Response {
    /// The id of the request answered.
    pub id: RequestId,
    /// The result value (possibly `null` or `{}`).
    pub result: Value,
}

/// An error response. The id is absent (`null`) when the server could not read the request's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorResponse {
    /// The id of the request answered, if known.
    pub id: Option<RequestId>,
    /// What went wrong.
    pub error: RpcError,
}

/// One line of the codex dialect.
///
/// Decoding is structural: a `method` with an `id` is a [`Request`], a `method` without one a
/// [`Notification`], an `error` an [`ErrorResponse`], a `result` with an `id` a [`Response`].
/// Unknown members (`"jsonrpc"`, codex's `emittedAtMs`, ...) are ignored, even repeated; a
/// member the envelope reads must come at most once ([`EnvelopeError::DuplicateMember`]).
///
/// ```
/// use rethread_protocol::Message;
/// let msg: Message = serde_json::from_str(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#).unwrap();
/// assert!(matches!(msg, Message::Response(_)));
/// assert_eq!(msg.to_line(), r#"{"id":1,"result":{}}"#);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Message {
    /// A request (client to server, or a server request).
    Request(Request),
    /// A notification.
    Notification(Notification),
    /// A successful response.
    Response(Response),
    /// An error response.
    Error(ErrorResponse),
}

/// Why a JSON value is not a message of the dialect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// The value was not a JSON object.
    #[error("a message must be a JSON object")]
    NotAnObject,
    /// It had none of `method`, `result`, `error`.
    #[error("a message needs `method`, `result` or `error`")]
    NoKind,
    /// A response (`result`) without an `id`.
    #[error("a response needs an `id`")]
    ResponseWithoutId,
    /// A member the envelope reads (`id`, `method`, `params`, `result`, `error`) came twice:
    /// codex refuses such a line, where a JSON tree would silently keep the last one.
    #[error("duplicate member `{member}`")]
    DuplicateMember {
        /// Which member.
        member: &'static str,
    },
    /// A member name came twice in one object inside `params`, at any depth: codex keeps the
    /// last one, so what a reader of the first would check is not what codex would do.
    #[error("duplicate member `{member}` in `params`")]
    DuplicateInParams {
        /// The member's name.
        member: String,
    },
    /// A member had the wrong type.
    #[error("invalid `{member}`: {reason}")]
    InvalidMember {
        /// Which member.
        member: &'static str,
        /// What was wrong with it.
        reason: String,
    },
}

impl Message {
    /// A request with typed params.
    pub fn request<P: Serialize>(
        id: impl Into<RequestId>,
        method: impl Into<String>,
        params: &P,
    ) -> Result<Message, serde_json::Error> {
        Ok(Message::Request(Request {
            id: id.into(),
            method: method.into(),
            params: Some(serde_json::to_value(params)?),
        }))
    }

    /// A notification with optional params.
    pub fn notification(method: impl Into<String>, params: Option<Value>) -> Message {
        Message::Notification(Notification {
            method: method.into(),
            params,
        })
    }

    /// A successful response with a typed result.
    pub fn response<R: Serialize>(
        id: impl Into<RequestId>,
        result: &R,
    ) -> Result<Message, serde_json::Error> {
        Ok(Message::Response(Response {
            id: id.into(),
            result: serde_json::to_value(result)?,
        }))
    }

    /// An error response.
    pub fn error(id: Option<RequestId>, error: RpcError) -> Message {
        Message::Error(ErrorResponse { id, error })
    }

    /// The method, for requests and notifications.
    pub fn method(&self) -> Option<&str> {
        match self {
            Message::Request(r) => Some(&r.method),
            Message::Notification(n) => Some(&n.method),
            _ => None,
        }
    }

    /// The id, for requests and responses.
    pub fn id(&self) -> Option<&RequestId> {
        match self {
            Message::Request(r) => Some(&r.id),
            Message::Response(r) => Some(&r.id),
            Message::Error(e) => e.id.as_ref(),
            Message::Notification(_) => None,
        }
    }

    /// The kind of this message.
    pub fn kind(&self) -> MessageKind {
        match self {
            Message::Request(_) => MessageKind::Request,
            Message::Notification(_) => MessageKind::Notification,
            Message::Response(_) => MessageKind::Response,
            Message::Error(_) => MessageKind::Error,
        }
    }

    /// The compact single-line JSON encoding (without the trailing newline).
    pub fn to_line(&self) -> String {
        // Serializing a tree of strings, numbers and `Value`s cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| unreachable!("message serialization"))
    }

    /// Classifies a decoded JSON value, which has already lost any duplicate member: decode
    /// lines with [`codec::decode_line`](crate::codec::decode_line), which refuses them.
    pub fn from_value(value: Value) -> Result<Message, EnvelopeError> {
        let Value::Object(object) = value else {
            return Err(EnvelopeError::NotAnObject);
        };
        Members::from_object(object).into_message()
    }
}

/// What kind of message a line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// A `method` and an `id`.
    Request,
    /// A `method` and no `id`.
    Notification,
    /// A `result` and an `id`.
    Response,
    /// An `error` (the `id` may be absent or `null`).
    Error,
}

/// A message's envelope, read by [`Message`]'s rules in one pass that borrows from the line
/// ([`codec::read_envelope`](crate::codec::read_envelope)): its routing facts, and its payload
/// as the line's own bytes, skipped by the reader and never copied.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Envelope<'a> {
    /// The kind.
    pub kind: MessageKind,
    /// The `id`, for requests, responses and error responses that carry one.
    pub id: Option<RequestId>,
    /// The `method`, for requests and notifications.
    pub method: Option<String>,
    /// The `params` member, whatever the kind.
    pub params: Option<&'a RawValue>,
    /// The `result` member, whatever the kind.
    pub result: Option<&'a RawValue>,
}

fn invalid(member: &'static str, reason: &str) -> EnvelopeError {
    EnvelopeError::InvalidMember {
        member,
        reason: reason.to_string(),
    }
}

fn request_id(id: Option<Value>) -> Result<Option<RequestId>, EnvelopeError> {
    match id {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(id)) => Ok(Some(RequestId::String(id))),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(id) => Ok(Some(RequestId::Integer(id))),
            None => Err(invalid("id", "not an integer")),
        },
        Some(_) => Err(invalid("id", "must be an integer or a string")),
    }
}

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut members = Members::<Value>::default();
        deserializer.deserialize_any(&mut members)?;
        members.into_message().map_err(de::Error::custom)
    }
}

impl Response {
    /// Decodes the result as `R`.
    pub fn result_as<R: DeserializeOwned>(&self) -> Result<R, serde_json::Error> {
        R::deserialize(&self.result)
    }
}
