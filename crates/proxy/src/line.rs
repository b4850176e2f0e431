//! One line of the wire, kept as the bytes that were read, plus the routing facts of its
//! envelope ([`Peek`]: kind, `id`, `method`), by the protocol crate's rules
//! ([`rethread_protocol::Message`]; `id`, `method`, `params`, `result` and `error` at most once).
//!
//! - The client's lines are read by serde_json in one pass that keeps nothing
//!   (`rethread_protocol::codec::decode_envelope`), as codex reads them: what the proxy routes
//!   is what codex sees.
//! - Codex's lines ([`Line::new`], [`peek`]) get a lexical scan of the top-level members, at
//!   `memchr` speed over string contents (most of a large line); nested values are skipped by
//!   counting brackets, not validated. On a line that is JSON it reads what serde_json reads.

use std::borrow::Cow;

use bytes::Bytes;
use rethread_protocol::codec::{decode_envelope, decode_line, trim_line};
use rethread_protocol::jsonrpc::Response;
use rethread_protocol::{
    Envelope, EnvelopeError, ErrorCode, FrameError, Message, MessageKind, RequestId, RpcError,
};
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

impl From<Envelope> for Peek {
    fn from(envelope: Envelope) -> Peek {
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
/// wrong with it ("is not UTF-8 ..."), and who to answer, when the lexical scan finds one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) code: ErrorCode,
    pub(crate) problem: String,
    pub(crate) sender: Option<Peek>,
}

/// One line: the bytes as read (terminator included) and its [`Peek`]. Cheap to clone.
#[derive(Clone, PartialEq, Eq)]
pub struct Line {
    bytes: Bytes,
    peek: Peek,
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
    /// A line read from codex (terminator included if any), routed by the lexical scan.
    pub fn new(bytes: Bytes) -> Line {
        let peek = peek(trim_line(&bytes));
        Line { bytes, peek }
    }

    /// A line read from the client, routed by serde_json's reading of it; one codex would die
    /// of (not UTF-8) or with no single reading (a duplicate member) is refused.
    pub(crate) fn from_client(bytes: Bytes) -> Result<Line, Refused> {
        let json = trim_line(&bytes);
        let (code, problem) = match decode_envelope(json) {
            Ok(envelope) => {
                let peek = envelope.into();
                return Ok(Line { bytes, peek });
            }
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
            Err(_) => {
                let peek = Peek::OTHER;
                return Ok(Line { bytes, peek });
            }
        };
        let sender = scan_members(json).sender();
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

    /// The whole message, decoded (a full parse).
    pub fn message(&self) -> Result<Message, FrameError> {
        decode_line(self.json())
    }

    /// The line's JSON as a tree (a full parse), whatever its shape.
    pub fn value(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_slice(self.json())
    }
}

/// The routing facts of one line (without its terminator) by the lexical scan, which agrees
/// with serde_json's reading on a line that is JSON, duplicates included. Nested values are
/// skipped, not validated: a line that is not JSON inside one may still be routed.
pub fn peek(line: &[u8]) -> Peek {
    let scan = scan_members(line);
    if scan.stop.is_some() {
        return Peek::OTHER;
    }
    scan.into_peek().unwrap_or(Peek::OTHER)
}

/// What the first bytes of a line too long to keep tell: its kind and `id` when they come
/// before the cut (codex and the clients seen write `id` first). `None` when they do not.
pub fn peek_prefix(prefix: &[u8]) -> Option<Peek> {
    let scan = scan_members(prefix);
    if matches!(scan.stop, Some(Stop::Malformed)) || matches!(scan.method, Seen::Invalid) {
        return None;
    }
    scan.sender()
}

/// A member seen zero, one or several times (or with a value of the wrong type).
#[derive(Debug, Default)]
enum Seen<T> {
    #[default]
    Never,
    Once(T),
    Invalid,
}

impl<T> Seen<T> {
    /// The next occurrence of the member, whose value reads as `value` (`None`: invalid).
    fn again(self, value: impl FnOnce() -> Option<T>) -> Seen<T> {
        match self {
            Seen::Never => value().map_or(Seen::Invalid, Seen::Once),
            _ => Seen::Invalid,
        }
    }

    /// The member's value, if any; `None` when it is invalid.
    fn value(self) -> Option<Option<T>> {
        match self {
            Seen::Never => Some(None),
            Seen::Once(value) => Some(Some(value)),
            Seen::Invalid => None,
        }
    }
}

#[derive(Debug, Default)]
struct Scan {
    id: Seen<Option<RequestId>>,
    method: Seen<String>,
    /// Counted when the member's name is read, before its value (a prefix may end inside it).
    params: u8,
    result: u8,
    error: u8,
    /// An `error` member is not an error object.
    bad_error: bool,
    /// Why the scan stopped before the object's end, if it did.
    stop: Option<Stop>,
}

impl Scan {
    fn into_peek(self) -> Option<Peek> {
        if self.params > 1 || self.result > 1 || self.error > 1 {
            return None;
        }
        let id = self.id.value()?.flatten();
        let method = self.method.value()?;
        let kind = match (&method, &id) {
            (Some(_), Some(_)) => LineKind::Request,
            (Some(_), None) => LineKind::Notification,
            // An `error` (an error object) is only read without a `method`.
            (None, _) if self.error > 0 && self.bad_error => return None,
            (None, _) if self.error > 0 => LineKind::Error,
            (None, Some(_)) if self.result > 0 => LineKind::Response,
            _ => return None,
        };
        Some(Peek { kind, id, method })
    }

    /// Who to answer in a line's place: its one `id`, as a request (it has a `method`,
    /// however malformed) or an answer; its `method` when it has a valid one.
    fn sender(self) -> Option<Peek> {
        let Seen::Once(Some(id)) = self.id else {
            return None;
        };
        let kind = match self.method {
            Seen::Never if self.error > 0 => LineKind::Error,
            Seen::Never if self.result > 0 => LineKind::Response,
            Seen::Never => return None,
            _ => LineKind::Request,
        };
        let method = self.method.value().flatten();
        let id = Some(id);
        Some(Peek { kind, id, method })
    }
}

/// Scans the top-level members of a JSON object.
fn scan_members(bytes: &[u8]) -> Scan {
    let mut scan = Scan::default();
    let mut cursor = Cursor { bytes, pos: 0 };
    let outcome = (|| -> Result<(), Stop> {
        cursor.whitespace();
        cursor.expect(b'{')?;
        cursor.whitespace();
        if cursor.peek_byte()? == b'}' {
            return Ok(());
        }
        loop {
            cursor.whitespace();
            let key_start = cursor.pos;
            cursor.skip_string()?;
            let name = member_name(&bytes[key_start..cursor.pos]);
            cursor.whitespace();
            cursor.expect(b':')?;
            cursor.whitespace();
            match name.as_deref() {
                Some("params") => scan.params = scan.params.saturating_add(1),
                Some("result") => scan.result = scan.result.saturating_add(1),
                Some("error") => scan.error = scan.error.saturating_add(1),
                _ => {}
            }
            let value_start = cursor.pos;
            cursor.skip_value()?;
            let value = &bytes[value_start..cursor.pos];
            match name.as_deref() {
                Some("id") => scan.id = std::mem::take(&mut scan.id).again(|| parse_id(value)),
                Some("method") => {
                    scan.method = std::mem::take(&mut scan.method)
                        .again(|| serde_json::from_slice::<String>(value).ok());
                }
                // An error answer must carry an error object, as the protocol crate reads it.
                Some("error") if serde_json::from_slice::<RpcError>(value).is_err() => {
                    scan.bad_error = true;
                }
                _ => {}
            }
            cursor.whitespace();
            match cursor.next_byte()? {
                b',' => continue,
                b'}' => break,
                _ => return Err(Stop::Malformed),
            }
        }
        cursor.whitespace();
        if cursor.pos != bytes.len() {
            return Err(Stop::Malformed);
        }
        Ok(())
    })();
    scan.stop = outcome.err();
    scan
}

/// A member name (`key` with its quotes); `None` for one that is not valid JSON text.
fn member_name(key: &[u8]) -> Option<Cow<'_, str>> {
    let inner = &key[1..key.len() - 1];
    if memchr::memchr(b'\\', inner).is_none() {
        return std::str::from_utf8(inner).ok().map(Cow::Borrowed);
    }
    serde_json::from_slice::<String>(key).ok().map(Cow::Owned)
}

/// An `id` value: an integer, a string, or `null` (no id). `None` for anything else.
fn parse_id(value: &[u8]) -> Option<Option<RequestId>> {
    match serde_json::from_slice::<Value>(value).ok()? {
        Value::Null => Some(None),
        Value::String(id) => Some(Some(RequestId::String(id))),
        Value::Number(n) => n.as_i64().map(|id| Some(RequestId::Integer(id))),
        _ => None,
    }
}

#[derive(Debug)]
enum Stop {
    /// Not JSON (as far as the scan can tell).
    Malformed,
    /// The input ended inside a value.
    End,
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\r' | b'\n') = self.bytes.get(self.pos) {
            self.pos += 1;
        }
    }

    fn peek_byte(&self) -> Result<u8, Stop> {
        self.bytes.get(self.pos).copied().ok_or(Stop::End)
    }

    fn next_byte(&mut self) -> Result<u8, Stop> {
        let byte = self.peek_byte()?;
        self.pos += 1;
        Ok(byte)
    }

    fn expect(&mut self, byte: u8) -> Result<(), Stop> {
        if self.next_byte()? == byte {
            Ok(())
        } else {
            Err(Stop::Malformed)
        }
    }

    /// Skips a string starting at the current position (its opening quote).
    fn skip_string(&mut self) -> Result<(), Stop> {
        self.expect(b'"')?;
        loop {
            let rest = &self.bytes[self.pos..];
            let found = memchr::memchr2(b'"', b'\\', rest).ok_or(Stop::End)?;
            if rest[found] == b'"' {
                self.pos += found + 1;
                return Ok(());
            }
            // The escaped character cannot end the string, whatever it is.
            self.pos += found + 2;
            if self.pos > self.bytes.len() {
                return Err(Stop::End);
            }
        }
    }

    /// Skips one value: a string, an object or array (by counting brackets outside strings),
    /// or a scalar (up to the next delimiter, and valid JSON).
    fn skip_value(&mut self) -> Result<(), Stop> {
        match self.peek_byte()? {
            b'"' => self.skip_string(),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match self.peek_byte()? {
                        b'"' => {
                            self.skip_string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.pos += 1;
                                return Ok(());
                            }
                        }
                        _ => {}
                    }
                    self.pos += 1;
                }
            }
            b'}' | b']' | b',' | b':' => Err(Stop::Malformed),
            _ => {
                let start = self.pos;
                let rest = &self.bytes[start..];
                let len = rest
                    .iter()
                    .position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\r' | b'\n'))
                    .ok_or(Stop::End)?;
                self.pos += len;
                serde_json::from_slice::<Value>(&rest[..len]).map_err(|_| Stop::Malformed)?;
                Ok(())
            }
        }
    }
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
        // Routing does not need them; the receiver judges the line as it would without us.
        assert_eq!(
            kind(r#"{"method":"m","params":{"a":tru}}"#),
            LineKind::Notification
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
        assert!(peek_prefix(br#"{"params":{"a":"b"#).is_none());
        assert!(peek_prefix(b"garbage").is_none());
    }
}
