//! One line of the wire, kept as the bytes that were read, plus its envelope as one serde pass
//! read it (`rethread_protocol::codec`, by [`rethread_protocol::Message`]'s rules: `id`,
//! `method`, `params`, `result` and `error` at most once): its routing facts ([`Peek`]: kind,
//! `id`, `method`) and where its `params` and `result` are, for the hooks to read.
//!
//! - Codex's lines ([`Line::new`], [`peek`]): the payloads are skipped, not copied nor checked
//!   as a tree (`read_envelope`), so a large line costs a scan of its bytes.
//! - The client's lines ([`Line::from_client`]) are read as codex reads them
//!   (`decode_envelope`): what the proxy routes is what codex sees.

use std::ops::Range;

use bytes::Bytes;
use rethread_protocol::codec::{
    decode_envelope, decode_line, decode_sender, read_envelope, trim_line,
};
use rethread_protocol::jsonrpc::Response;
use rethread_protocol::{
    Envelope, EnvelopeError, ErrorCode, FrameError, Message, MessageKind, RequestId, RpcError,
};
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use serde_json::Value;

/// What a line is, as far as routing goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LineKind {
    /// Has a `method` and an `id`: must be answered.
    Request,
    /// Has a `method` and no `id`.
    Notification,
    /// Has a `result` and an `id`, no `method`.
    Response,
    /// Has an `error`, no `method` (the `id` may be absent or `null`).
    Error,
    /// Not a JSON-RPC message of the dialect (not JSON, no kind, a bad or duplicate member).
    Other,
}

impl LineKind {
    /// A response or an error response.
    pub fn is_answer(self) -> bool {
        matches!(self, LineKind::Response | LineKind::Error)
    }
}

/// The routing facts of a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peek {
    /// The kind.
    pub kind: LineKind,
    /// The `id`, for requests and answers that carry one.
    pub id: Option<RequestId>,
    /// The `method`, for requests and notifications.
    pub method: Option<String>,
}

impl Peek {
    const OTHER: Peek = Peek {
        kind: LineKind::Other,
        id: None,
        method: None,
    };
}

impl From<Envelope<'_>> for Peek {
    fn from(envelope: Envelope<'_>) -> Peek {
        let kind = match envelope.kind {
            MessageKind::Request => LineKind::Request,
            MessageKind::Notification => LineKind::Notification,
            MessageKind::Response => LineKind::Response,
            MessageKind::Error => LineKind::Error,
        };
        Peek {
            kind,
            id: envelope.id,
            method: envelope.method,
        }
    }
}

/// A client line the forwarder refuses (see the crate docs): the code its sender gets, what is
/// wrong with it ("is not UTF-8 ..."), and who to answer, when the line names one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) code: ErrorCode,
    pub(crate) problem: String,
    pub(crate) sender: Option<Peek>,
}

/// One line: the bytes as read (terminator included), its [`Peek`] and where its payloads
/// are. Cheap to clone.
#[derive(Clone, PartialEq, Eq)]
pub struct Line {
    bytes: Bytes,
    peek: Peek,
    params: Option<Range<usize>>,
    result: Option<Range<usize>>,
}

impl std::fmt::Debug for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const SHOWN: usize = 200;
        let text = String::from_utf8_lossy(&self.json()[..self.json().len().min(SHOWN)]);
        f.debug_struct("Line")
            .field("kind", &self.peek.kind)
            .field("id", &self.peek.id)
            .field("method", &self.peek.method)
            .field("len", &self.bytes.len())
            .field("text", &text)
            .finish()
    }
}

impl Line {
    /// A line read from codex (terminator included if any), routed by [`read_envelope`].
    pub fn new(bytes: Bytes) -> Line {
        Line::read(&bytes, read_envelope(trim_line(&bytes)).ok())
    }

    /// `bytes` with `envelope`, their reading (`None`: not a message).
    fn read(bytes: &Bytes, envelope: Option<Envelope<'_>>) -> Line {
        // Where a payload borrowed from `bytes` is in them.
        let range = |raw: Option<&RawValue>| {
            let raw = raw?.get();
            let start = raw.as_ptr() as usize - bytes.as_ptr() as usize;
            Some(start..start + raw.len())
        };
        let (params, result) = envelope.as_ref().map_or((None, None), |envelope| {
            (range(envelope.params), range(envelope.result))
        });
        Line {
            bytes: bytes.clone(),
            peek: envelope.map_or(Peek::OTHER, Peek::from),
            params,
            result,
        }
    }

    /// A line read from the client, routed by codex's reading of it; one codex would die of
    /// (not UTF-8) or with no single reading (a duplicate member) is refused.
    pub(crate) fn from_client(bytes: Bytes) -> Result<Line, Refused> {
        let json = trim_line(&bytes);
        let (code, problem) = match decode_envelope(json) {
            Ok(envelope) => return Ok(Line::read(&bytes, Some(envelope))),
            // Codex's line reader fails on it, and codex exits.
            Err(FrameError::InvalidUtf8 { valid_up_to }) => (
                ErrorCode::PARSE_ERROR,
                format!("is not UTF-8 (invalid byte at offset {valid_up_to})"),
            ),
            // Codex refuses it, and it has no single reading.
            Err(FrameError::InvalidMessage(EnvelopeError::DuplicateMember { member })) => (
                ErrorCode::INVALID_REQUEST,
                format!("has a duplicate `{member}` member"),
            ),
            // Codex keeps the last of them: the guard would read what codex does not do.
            Err(FrameError::InvalidMessage(EnvelopeError::DuplicateInParams { member })) => (
                ErrorCode::INVALID_REQUEST,
                format!("has a duplicate `{member}` member in its params"),
            ),
            Err(_) => return Ok(Line::read(&bytes, None)),
        };
        let sender = decode_sender(json, false).map(Peek::from);
        Err(Refused {
            code,
            problem,
            sender,
        })
    }

    /// A line made by the proxy (a message of its own), newline-terminated.
    pub fn from_message(message: &Message) -> Line {
        let mut text = message.to_line().into_bytes();
        text.push(b'\n');
        Line::new(Bytes::from(text))
    }

    /// A `warning` notification, `{"message": .., "threadId": ..}` (`null` without a thread):
    /// the channel clients already render for codex's own warnings.
    pub fn warning(message: &str, thread_id: Option<&str>) -> Line {
        let params = serde_json::json!({ "message": message, "threadId": thread_id });
        Line::from_message(&Message::notification("warning", Some(params)))
    }

    /// An error answer to `id`.
    pub fn error_response(id: Option<RequestId>, error: RpcError) -> Line {
        Line::from_message(&Message::error(id, error))
    }

    /// A successful answer to `id`.
    pub fn response(id: RequestId, result: Value) -> Line {
        Line::from_message(&Message::Response(Response { id, result }))
    }

    /// The bytes, consuming the line.
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    /// The line without its terminator.
    pub fn json(&self) -> &[u8] {
        trim_line(&self.bytes)
    }

    /// The kind.
    pub fn kind(&self) -> LineKind {
        self.peek.kind
    }

    /// The `id`, for requests and answers.
    pub fn id(&self) -> Option<&RequestId> {
        self.peek.id.as_ref()
    }

    /// The `method`, for requests and notifications.
    pub fn method(&self) -> Option<&str> {
        self.peek.method.as_deref()
    }

    /// The `params` member's JSON, as read with the line (whatever its kind).
    pub fn params_json(&self) -> Option<&[u8]> {
        Some(&self.bytes[self.params.clone()?])
    }

    /// The `params`, read as a `P` (`None`: absent, or not a `P`).
    pub fn params<P: DeserializeOwned>(&self) -> Option<P> {
        serde_json::from_slice(self.params_json()?).ok()
    }

    /// The `result`, likewise.
    pub fn result<R: DeserializeOwned>(&self) -> Option<R> {
        serde_json::from_slice(&self.bytes[self.result.clone()?]).ok()
    }

    /// The whole message, decoded (a full parse).
    pub fn message(&self) -> Result<Message, FrameError> {
        decode_line(self.json())
    }

    /// The line's JSON as a tree (a full parse), whatever its shape.
    pub fn value(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_slice(self.json())
    }
}

/// The routing facts of one line (without its terminator), as [`Line::new`] reads them.
pub fn peek(line: &[u8]) -> Peek {
    read_envelope(line).map_or(Peek::OTHER, Peek::from)
}

/// What the first bytes of a line too long to keep tell: its kind and `id` when they come
/// before the cut (codex and the clients seen write `id` first). `None` when they do not.
pub fn peek_prefix(prefix: &[u8]) -> Option<Peek> {
    decode_sender(prefix, true).map(Peek::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(text: &str) -> LineKind {
        peek(text.as_bytes()).kind
    }

    #[test]
    fn routes_the_four_kinds_like_the_protocol_crate() {
        let request = peek(br#"{"id":"a-1","method":"thread/start","params":{"cwd":"/"}}"#);
        assert_eq!(request.kind, LineKind::Request);
        assert_eq!(request.id, Some(RequestId::from("a-1")));
        assert_eq!(request.method.as_deref(), Some("thread/start"));
        assert_eq!(
            kind(r#"{"method":"turn/started","params":{"turn":{"id":"t"}}}"#),
            LineKind::Notification
        );
        assert_eq!(kind(r#"{"id":3,"result":null}"#), LineKind::Response);
        assert_eq!(
            kind(r#"{"id":null,"error":{"code":-1,"message":"m"}}"#),
            LineKind::Error
        );
        // Member order does not matter; escapes in names and values are read.
        let late = peek(br#"{"params":{"id":9,"method":"x"},"me\u0074hod":"a\/b","id":7}"#);
        assert_eq!(late.kind, LineKind::Request);
        assert_eq!(late.id, Some(RequestId::Integer(7)));
        assert_eq!(late.method.as_deref(), Some("a/b"));
    }

    #[test]
    fn anything_else_is_other() {
        for text in [
            "",
            "not json",
            "[1,2]",
            "{}",
            r#"{"params":{}}"#,
            r#"{"id":1}"#,
            r#"{"result":1}"#,
            r#"{"id":1.5,"method":"m"}"#,
            r#"{"id":[1],"method":"m"}"#,
            r#"{"method":1}"#,
            r#"{"method":"a","method":"b"}"#,
            r#"{"id":1,"id":2,"result":{}}"#,
            r#"{"method":"m"} trailing"#,
            r#"{"method":"m","params":{"a":"unterminated}"#,
            r#"{"method":"m","params":{"a":1}"#,
        ] {
            assert_eq!(kind(text), LineKind::Other, "{text}");
        }
    }

    #[test]
    fn nested_values_are_skipped_not_validated() {
        // Routing does not need them; the receiver judges the line as it would without us:
        // what a tree would refuse (a number out of range, a lone surrogate) is still routed.
        assert_eq!(
            kind(r#"{"method":"m","params":{"a":1e999,"b":"\ud800"}}"#),
            LineKind::Notification
        );
        // A line that is not JSON inside them is not routed (it is passed on unrouted).
        assert_eq!(
            kind(r#"{"method":"m","params":{"a":tru}}"#),
            LineKind::Other
        );
    }

    #[test]
    fn every_member_counts_up_to_the_end_of_the_line() {
        // As serde_json reads it (codex refuses such lines): a member routing reads that comes
        // twice, after the `id` and `method` too, or an `error` that is not an error object.
        for text in [
            r#"{"id":1,"method":"a","method":"b"}"#,
            r#"{"id":1,"method":"m","params":{},"params":{}}"#,
            r#"{"id":1,"result":{},"result":{}}"#,
            r#"{"error":{"code":1,"message":"m"},"error":{"code":2,"message":"n"}}"#,
            r#"{"id":1,"error":"not an error object"}"#,
        ] {
            assert_eq!(kind(text), LineKind::Other, "{text}");
        }
        // A `method` wins: the `error` member of a notification is not read.
        assert_eq!(
            kind(r#"{"method":"initialized","error":-0.0}"#),
            LineKind::Notification
        );
        // A line cut inside its params is not routed whole; its prefix still names its sender.
        let cut = br#"{"id":1,"method":"m","params":{"huge":"...cut here"#;
        assert_eq!(peek(cut).kind, LineKind::Other);
        assert_eq!(peek_prefix(cut).unwrap().kind, LineKind::Request);
    }

    #[test]
    fn a_prefix_tells_the_id_when_it_comes_first() {
        let prefix = br#"{"id":"u-1","method":"turn/start","params":{"input":[{"text":"aaaa"#;
        let seen = peek_prefix(prefix).unwrap();
        assert_eq!(seen.kind, LineKind::Request);
        assert_eq!(seen.id, Some(RequestId::from("u-1")));
        let answer = peek_prefix(br#"{"id":4,"result":{"thread":{"turns":[{"#).unwrap();
        assert_eq!(answer.kind, LineKind::Response);
        assert!(peek_prefix(br#"{"method":"item/completed","params":{"#).is_none());
        // The cut may fall inside the id: `1` of `1000`.
        assert!(peek_prefix(br#"{"result":[],"id":1"#).is_none());
        assert!(peek_prefix(br#"{"params":{"a":"b"#).is_none());
        assert!(peek_prefix(b"garbage").is_none());
    }
}
