//! Newline-delimited JSON framing for tokio (`FramedRead` / `FramedWrite`).
//!
//! - [`LineFramer`] splits a byte stream into lines without copying them ([`Frame::Line`]: the
//!   bytes as read, terminator included). A line longer than the limit is never held whole:
//!   its first [`PREFIX_KEPT`] bytes are kept ([`Frame::TooLong`], so that its sender may still
//!   be answered) and the rest is discarded as it arrives. While waiting for a newline it holds
//!   at most the limit plus one byte (a `\r` that may start the line's `\r\n`).
//! - [`NdjsonCodec`] decodes those lines into messages: a bad line (too long, not UTF-8, not
//!   JSON, not a message) is an `Err` item and the stream goes on; blank lines are skipped.
//!   Only I/O errors end the stream.

use std::io;

use std::borrow::Borrow;

use bytes::{BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::elide::Elider;
use serde::de;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::jsonrpc::{Envelope, EnvelopeError, Members, Message, Unique};

/// The default maximum line length: 16 MiB (a resumed thread with many turns is large).
pub const DEFAULT_MAX_LINE_LENGTH: usize = 16 * 1024 * 1024;

/// How many bytes of an oversized line [`LineFramer`] keeps to find out who sent it.
pub const PREFIX_KEPT: usize = 4096;

/// Why a line is not a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The line passed the configured limit; the rest of it was discarded.
    #[error("line longer than the limit of {limit} bytes")]
    LineTooLong {
        /// The limit in bytes.
        limit: usize,
    },
    /// The line was not valid UTF-8.
    #[error("line is not valid UTF-8 (invalid byte at offset {valid_up_to})")]
    InvalidUtf8 {
        /// Offset of the first invalid byte.
        valid_up_to: usize,
    },
    /// The line was not valid JSON.
    #[error("line is not valid JSON: {reason}")]
    InvalidJson {
        /// The parser's explanation.
        reason: String,
    },
    /// The line was JSON but not a message of the dialect.
    #[error("line is not a JSON-RPC message: {0}")]
    InvalidMessage(#[from] EnvelopeError),
}

/// Decodes one line (without its newline): UTF-8, then one pass of serde_json. A member the
/// envelope reads that comes twice makes it not a message
/// ([`crate::EnvelopeError::DuplicateMember`]).
pub fn decode_line(line: &[u8]) -> Result<Message, FrameError> {
    Ok(members::<Value>(line)?.into_message()?)
}

/// The envelope of one line (without its newline) by [`decode_line`]'s rules, in one pass that
/// keeps `params` and `result` as the line's bytes. The payloads are skipped, not checked as a
/// tree would be: a line that is not JSON inside them may still be read (codex's lines, relayed
/// as they are; see [`decode_envelope`] for a client's).
///
/// ```
/// use rethread_protocol::codec::read_envelope;
/// use rethread_protocol::MessageKind;
///
/// let envelope = read_envelope(br#"{"method":"turn/started","params":{"turn":{}}}"#).unwrap();
/// assert_eq!(envelope.kind, MessageKind::Notification);
/// assert_eq!(envelope.params.unwrap().get(), r#"{"turn":{}}"#);
/// assert!(read_envelope(br#"{"id":1,"id":2,"result":{}}"#).is_err());
/// ```
pub fn read_envelope(line: &[u8]) -> Result<Envelope<'_>, FrameError> {
    Ok(members::<&RawValue>(line)?.into_envelope()?)
}

/// [`read_envelope`] with the payloads checked: the same lines succeed as with [`decode_line`],
/// with the same errors; and one check more, a member name that comes twice in one object
/// anywhere inside `params` ([`EnvelopeError::DuplicateInParams`]), where a tree keeps the
/// last one and a reader of the first would not see what codex does.
///
/// ```
/// use rethread_protocol::codec::decode_envelope;
/// use rethread_protocol::{MessageKind, RequestId};
///
/// let envelope = decode_envelope(br#"{"id":"a","method":"turn/start","params":{}}"#).unwrap();
/// assert_eq!(envelope.kind, MessageKind::Request);
/// assert_eq!(envelope.id, Some(RequestId::from("a")));
/// assert!(decode_envelope(br#"{"id":1,"id":2,"result":{}}"#).is_err());
/// let twice = br#"{"id":1,"method":"thread/read","params":{"threadId":"a","threadId":"b"}}"#;
/// assert!(decode_envelope(twice).is_err());
/// ```
pub fn decode_envelope(line: &[u8]) -> Result<Envelope<'_>, FrameError> {
    // On an error, the one `decode_line` gives (the same position in the line).
    let as_decoded = |error: FrameError| decode_line(line).err().unwrap_or(error);
    let envelope = read_envelope(line).map_err(as_decoded)?;
    let check =
        |raw: Option<&RawValue>| serde_json::from_str::<Unique>(raw.map_or("null", RawValue::get));
    let params = check(envelope.params)
        .and_then(|params| check(envelope.result).map(|_| params))
        .map_err(|e| {
            as_decoded(FrameError::InvalidJson {
                reason: e.to_string(),
            })
        })?;
    // A member twice in `result` is not the guard's concern.
    match params.duplicate {
        Some(member) => Err(EnvelopeError::DuplicateInParams { member }.into()),
        None => Ok(envelope),
    }
}

/// Who to answer in place of a line that is not a message whole (not UTF-8, a duplicate
/// member, cut at a length limit): its one `id` and kind, a request when it has a `method`
/// (its `method` when valid), read from the members before the line goes wrong. With `cut`,
/// a line that goes wrong other than by ending, or whose `method` is malformed, names nobody.
///
/// ```
/// use rethread_protocol::codec::decode_sender;
/// use rethread_protocol::{MessageKind, RequestId};
///
/// let cut = br#"{"id":"u-1","method":"turn/start","params":{"input":[{"text":"aaaa"#;
/// let sender = decode_sender(cut, true).unwrap();
/// assert_eq!((sender.kind, sender.id), (MessageKind::Request, Some(RequestId::from("u-1"))));
/// ```
pub fn decode_sender(line: &[u8], cut: bool) -> Option<Envelope<'static>> {
    // A number at the cut may be the start of a longer one (`"id":1` of `"id":12`): not read.
    let number = |b: &u8| b.is_ascii_digit() || b"+-.eE".contains(b);
    let kept = line.len() - line.iter().rev().take_while(|b| cut && number(b)).count();
    let line = &line[..kept];
    let mut members = Members::<de::IgnoredAny>::default();
    let mut reader = serde_json::Deserializer::from_slice(line);
    let read = de::Deserializer::deserialize_any(&mut reader, &mut members);
    if cut && read.and_then(|()| reader.end()).is_err_and(|e| !e.is_eof()) {
        return None;
    }
    members.sender(cut)
}

fn members<'a, P: de::Deserialize<'a>>(line: &'a [u8]) -> Result<Members<P>, FrameError> {
    let text = std::str::from_utf8(line).map_err(|e| FrameError::InvalidUtf8 {
        valid_up_to: e.valid_up_to(),
    })?;
    let invalid_json = |e: serde_json::Error| FrameError::InvalidJson {
        reason: e.to_string(),
    };
    let mut members = Members::default();
    let mut reader = serde_json::Deserializer::from_str(text);
    de::Deserializer::deserialize_any(&mut reader, &mut members).map_err(invalid_json)?;
    reader.end().map_err(invalid_json)?;
    Ok(members)
}

/// One item of [`LineFramer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A line, terminator included (absent only for a last line cut by the end of the stream).
    Line(Bytes),
    /// A line longer than the limit; the rest of it was discarded.
    TooLong {
        /// Its first [`PREFIX_KEPT`] bytes (fewer if it ended sooner), without the terminator.
        prefix: Bytes,
        /// With [`LineFramer::eliding`]: the whole line (terminator excluded) with the array at
        /// the framer's path emptied, when that is within the limit.
        elided: Option<Bytes>,
    },
}

/// The line framer (a `tokio_util` decoder of [`Frame`]s), within a length limit.
///
/// ```
/// use bytes::BytesMut;
/// use tokio_util::codec::Decoder;
/// use rethread_protocol::codec::{Frame, LineFramer};
///
/// let mut framer = LineFramer::new(8);
/// let mut buf = BytesMut::from(&b"{}\r\nmuch too long\n"[..]);
/// assert_eq!(framer.decode(&mut buf).unwrap(), Some(Frame::Line("{}\r\n".into())));
/// assert!(matches!(framer.decode(&mut buf).unwrap(), Some(Frame::TooLong { .. })));
/// ```
#[derive(Debug, Clone)]
pub struct LineFramer {
    max_line_length: usize,
    /// Bytes of the buffer already searched for a newline.
    scanned: usize,
    /// Inside an oversized line that was already reported, or is being elided.
    discarding: bool,
    /// See [`LineFramer::eliding`].
    elide: Option<&'static [&'static str]>,
    /// Inside an oversized line being elided: its prefix and the copy so far.
    elision: Option<(Bytes, Elider)>,
}

impl LineFramer {
    /// Lines longer than `max_line_length` bytes (terminator excluded) are [`Frame::TooLong`].
    pub fn new(max_line_length: usize) -> Self {
        LineFramer {
            max_line_length,
            scanned: 0,
            discarding: false,
            elide: None,
            elision: None,
        }
    }

    /// Keeps, of each oversized line, a copy without the array at `path` (member names from the
    /// top-level object down) when that copy is within the limit ([`Frame::TooLong`]'s
    /// `elided`). Such a line is reported when it ends or its copy passes the limit; memory
    /// stays bounded by the limit. (The proxy needs its own `thread/resume`'s answer without
    /// `result.thread.turns`, which codex sends when `excludeTurns` was refused.)
    ///
    /// ```
    /// use bytes::BytesMut;
    /// use tokio_util::codec::Decoder;
    /// use rethread_protocol::codec::{Frame, LineFramer};
    ///
    /// let mut framer = LineFramer::new(60).eliding(&["result", "thread", "turns"]);
    /// let mut buf = BytesMut::from(
    ///     &br#"{"id":1,"result":{"thread":{"id":"t","turns":[{"id":"a"},{"id":"b"}]}}}"#[..],
    /// );
    /// buf.extend_from_slice(b"\n");
    /// let Some(Frame::TooLong { elided: Some(elided), .. }) = framer.decode(&mut buf).unwrap()
    /// else { panic!() };
    /// assert_eq!(&elided[..], br#"{"id":1,"result":{"thread":{"id":"t","turns":[]}}}"#);
    /// ```
    pub fn eliding(mut self, path: &'static [&'static str]) -> Self {
        self.elide = Some(path);
        self
    }

    /// Splits off the prefix of an oversized line and discards the rest (`line_end`: its end,
    /// terminator included, when in the buffer). `None` while it is being elided.
    fn too_long(&mut self, buf: &mut BytesMut, line_end: Option<usize>) -> Option<Frame> {
        let content = match line_end {
            Some(end) => trim_line(&buf[..end]).len(),
            None => buf.len(),
        };
        let elider = self.elide.map(|path| {
            let mut elider = Elider::new(path, self.max_line_length);
            elider.push(&buf[..content]);
            elider
        });
        let kept = PREFIX_KEPT.min(content);
        let prefix = buf.split_to(kept).freeze();
        self.scanned = 0;
        match line_end {
            Some(end) => {
                let _ = buf.split_to(end - kept);
                Some(Frame::TooLong {
                    prefix,
                    elided: elider.and_then(Elider::finish).map(Bytes::from),
                })
            }
            None => {
                buf.clear();
                self.discarding = true;
                match elider {
                    Some(elider) if !elider.overflowed() => {
                        self.elision = Some((prefix, elider));
                        None
                    }
                    _ => Some(Frame::TooLong {
                        prefix,
                        elided: None,
                    }),
                }
            }
        }
    }

    /// More of a line being elided (`end`: it ended): its frame once it ends or overflows.
    fn elide_tail(&mut self, tail: &[u8], end: bool) -> Option<Frame> {
        let (_, elider) = self.elision.as_mut()?;
        elider.push(tail);
        if !end && !elider.overflowed() {
            return None;
        }
        let (prefix, elider) = self.elision.take()?;
        Some(Frame::TooLong {
            prefix,
            elided: elider.finish().map(Bytes::from),
        })
    }
}

/// `line` without its `\n` or `\r\n`.
pub fn trim_line(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

impl Decoder for LineFramer {
    type Item = Frame;
    type Error = io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, io::Error> {
        loop {
            match memchr::memchr(b'\n', &buf[self.scanned..]) {
                Some(offset) => {
                    let end = self.scanned + offset + 1;
                    self.scanned = 0;
                    if std::mem::take(&mut self.discarding) {
                        // The tail of a line already reported as too long, or being elided.
                        let tail = buf.split_to(end);
                        let frame = self.elide_tail(trim_line(&tail), true);
                        if frame.is_some() {
                            return Ok(frame);
                        }
                    } else if trim_line(&buf[..end]).len() > self.max_line_length {
                        let frame = self.too_long(buf, Some(end));
                        if frame.is_some() {
                            return Ok(frame);
                        }
                    } else {
                        return Ok(Some(Frame::Line(buf.split_to(end).freeze())));
                    }
                }
                None if self.discarding => {
                    let frame = self.elide_tail(&buf[..], false);
                    buf.clear();
                    self.scanned = 0;
                    return Ok(frame);
                }
                // A line of exactly the limit may still be waiting for the `\n` of its `\r\n`.
                None if buf.len()
                    > self
                        .max_line_length
                        .saturating_add(usize::from(buf.last() == Some(&b'\r'))) =>
                {
                    // Drop the bytes now: an endless line cannot grow the buffer.
                    return Ok(self.too_long(buf, None));
                }
                None => {
                    self.scanned = buf.len();
                    return Ok(None);
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, io::Error> {
        if let Some(frame) = self.decode(buf)? {
            return Ok(Some(frame));
        }
        self.scanned = 0;
        if std::mem::take(&mut self.discarding) {
            // An oversized line cut by the end of the stream: reported now if it was elided.
            let frame = self.elide_tail(&buf[..], true);
            buf.clear();
            return Ok(frame);
        }
        if buf.is_empty() {
            return Ok(None);
        }
        // A last line without its newline (a peer that died mid-write is reported, not dropped).
        Ok(Some(Frame::Line(buf.split().freeze())))
    }
}

/// The NDJSON codec: [`LineFramer`]'s lines decoded into messages (see the module docs).
///
/// ```
/// use bytes::BytesMut;
/// use tokio_util::codec::Decoder;
/// use rethread_protocol::{NdjsonCodec, FrameError};
///
/// let mut codec = NdjsonCodec::with_max_line_length(64);
/// let mut buf = BytesMut::from(&b"not json\n{\"method\":\"initialized\"}\n"[..]);
/// assert!(matches!(codec.decode(&mut buf).unwrap(), Some(Err(FrameError::InvalidJson { .. }))));
/// assert!(matches!(codec.decode(&mut buf).unwrap(), Some(Ok(_))));
/// ```
#[derive(Debug, Clone)]
pub struct NdjsonCodec {
    framer: LineFramer,
}

impl Default for NdjsonCodec {
    fn default() -> Self {
        Self::with_max_line_length(DEFAULT_MAX_LINE_LENGTH)
    }
}

impl NdjsonCodec {
    /// A codec with the default limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// A codec that rejects lines longer than `max_line_length` bytes (newline excluded).
    pub fn with_max_line_length(max_line_length: usize) -> Self {
        NdjsonCodec {
            framer: LineFramer::new(max_line_length),
        }
    }

    /// The next item the framer's frames give (`eof`: the input ended); blank lines are skipped.
    fn next(
        &mut self,
        buf: &mut BytesMut,
        eof: bool,
    ) -> io::Result<Option<<Self as Decoder>::Item>> {
        loop {
            let frame = if eof {
                self.framer.decode_eof(buf)?
            } else {
                self.framer.decode(buf)?
            };
            let line = match frame {
                None => return Ok(None),
                Some(Frame::Line(line)) => line,
                Some(Frame::TooLong { .. }) => {
                    let limit = self.framer.max_line_length;
                    return Ok(Some(Err(FrameError::LineTooLong { limit })));
                }
            };
            let line = trim_line(&line);
            if !line.iter().all(u8::is_ascii_whitespace) {
                return Ok(Some(decode_line(line)));
            }
        }
    }
}

impl Decoder for NdjsonCodec {
    type Item = Result<Message, FrameError>;
    type Error = io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Self::Item>, io::Error> {
        self.next(buf, false)
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Self::Item>, io::Error> {
        self.next(buf, true)
    }
}

/// Encodes a message, or a reference to one, as one line.
impl<M: Borrow<Message>> Encoder<M> for NdjsonCodec {
    type Error = io::Error;

    fn encode(&mut self, item: M, dst: &mut BytesMut) -> Result<(), io::Error> {
        let line = serde_json::to_vec(item.borrow()).map_err(io::Error::other)?;
        dst.reserve(line.len() + 1);
        dst.put_slice(&line);
        dst.put_u8(b'\n');
        Ok(())
    }
}
