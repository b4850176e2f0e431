//! Newline-delimited JSON framing for tokio (`FramedRead` / `FramedWrite`).
//!
//! Two layers, one framer:
//! - [`LineFramer`] splits a byte stream into lines without copying them: each [`Frame::Line`]
//!   is the bytes as read (terminator included), split off the read buffer. A line longer than
//!   the limit is never held whole: once the buffer passes the limit, its first
//!   [`PREFIX_KEPT`] bytes are kept ([`Frame::TooLong`], so that its `id` may still be read and
//!   its sender answered) and the rest of the line is discarded as it arrives. The proxy
//!   forwards these frames as they are.
//! - [`NdjsonCodec`] decodes each line of that framer into a [`Message`]. Each item is a
//!   `Result<Message, FrameError>`: a bad line (too long, not UTF-8, not JSON, not a message) is
//!   reported as a value and the stream continues with the next line; blank lines are skipped.
//!   Only I/O errors end the stream.
//!
//! Memory is bounded either way: while waiting for a newline the framer holds at most the limit
//! plus one byte (a `\r` that may be the start of the line's `\r\n`).

use std::io;

use bytes::{BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::elide::Elider;
use crate::jsonrpc::{Checked, Envelope, EnvelopeError, Members, MembersVisitor, Message};

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

/// Decodes one line (without its newline) into a message: UTF-8, then one pass of serde_json
/// over it. A member the envelope reads that comes twice makes the line not a message
/// ([`crate::EnvelopeError::DuplicateMember`]).
pub fn decode_line(line: &[u8]) -> Result<Message, FrameError> {
    Ok(members::<serde_json::Value>(line)?.into_message()?)
}

/// The kind, `id` and `method` of one line, by exactly the rules and checks of
/// [`decode_line`] (it succeeds on the same lines, with the same errors), without keeping the
/// payload: what a router needs.
///
/// ```
/// use rethread_protocol::codec::decode_envelope;
/// use rethread_protocol::{MessageKind, RequestId};
///
/// let envelope = decode_envelope(br#"{"id":"a","method":"turn/start","params":{}}"#).unwrap();
/// assert_eq!(envelope.kind, MessageKind::Request);
/// assert_eq!(envelope.id, Some(RequestId::from("a")));
/// assert!(decode_envelope(br#"{"id":1,"id":2,"result":{}}"#).is_err());
/// ```
pub fn decode_envelope(line: &[u8]) -> Result<Envelope, FrameError> {
    Ok(members::<Checked>(line)?.into_envelope()?)
}

fn members<'a, P: serde::Deserialize<'a>>(line: &'a [u8]) -> Result<Members<P>, FrameError> {
    let text = std::str::from_utf8(line).map_err(|e| FrameError::InvalidUtf8 {
        valid_up_to: e.valid_up_to(),
    })?;
    let invalid_json = |e: serde_json::Error| FrameError::InvalidJson {
        reason: e.to_string(),
    };
    let mut reader = serde_json::Deserializer::from_str(text);
    let members = serde::Deserializer::deserialize_any(&mut reader, MembersVisitor::new())
        .map_err(invalid_json)?;
    reader.end().map_err(invalid_json)?;
    Ok(members)
}

/// One item of [`LineFramer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A line, terminator included (absent only for a last line cut by the end of the stream).
    Line(Bytes),
    /// A line longer than the limit: its first bytes; the rest was discarded.
    TooLong {
        /// The first [`PREFIX_KEPT`] bytes of the line (fewer if it ended sooner), without its
        /// terminator.
        prefix: Bytes,
        /// With [`LineFramer::eliding`]: the whole line (terminator excluded) with the array at
        /// the framer's path emptied, when that is within the limit. Always `None` otherwise.
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
    /// With [`LineFramer::eliding`]: the path whose array an oversized line is kept without.
    elide: Option<&'static [&'static str]>,
    /// Inside an oversized line being elided: its prefix, and the copy so far.
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
    /// `elided`). Such a line is then reported when it ends (or when its copy passes the
    /// limit), not as soon as it passes the limit; memory stays bounded by the limit.
    ///
    /// The proxy frames codex's output this way: codex's answer to its own `thread/resume`
    /// carries every turn when `excludeTurns` was refused, and the proxy needs all of that
    /// answer but its `result.thread.turns`.
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

    /// The configured limit.
    pub fn max_line_length(&self) -> usize {
        self.max_line_length
    }

    /// Splits off the prefix of an oversized line and discards the rest of it (`line_end`: the
    /// end of the line, terminator included, when it is in the buffer). `None` while the line
    /// is being elided and has not ended.
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

    /// The tail of an oversized line being elided (`end`: its terminator's end, when in the
    /// buffer): the frame once the line ends or its copy passes the limit.
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
                        match self.elide_tail(trim_line(&tail), true) {
                            Some(frame) => return Ok(Some(frame)),
                            None => continue,
                        }
                    }
                    if trim_line(&buf[..end]).len() > self.max_line_length {
                        match self.too_long(buf, Some(end)) {
                            Some(frame) => return Ok(Some(frame)),
                            None => continue,
                        }
                    }
                    return Ok(Some(Frame::Line(buf.split_to(end).freeze())));
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
                    // Report now (or elide) and drop the bytes so an endless line cannot grow
                    // the buffer.
                    match self.too_long(buf, None) {
                        Some(frame) => return Ok(Some(frame)),
                        None => return Ok(None),
                    }
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

/// The NDJSON codec: [`LineFramer`]'s lines decoded into messages.
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

    /// The configured limit.
    pub fn max_line_length(&self) -> usize {
        self.framer.max_line_length()
    }

    /// The item of one frame; `None` for a blank line.
    fn item(&self, frame: Frame) -> Option<Result<Message, FrameError>> {
        match frame {
            Frame::Line(line) => {
                let line = trim_line(&line);
                (!line.iter().all(u8::is_ascii_whitespace)).then(|| decode_line(line))
            }
            Frame::TooLong { .. } => Some(Err(FrameError::LineTooLong {
                limit: self.max_line_length(),
            })),
        }
    }
}

impl Decoder for NdjsonCodec {
    type Item = Result<Message, FrameError>;
    type Error = io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Self::Item>, io::Error> {
        while let Some(frame) = self.framer.decode(buf)? {
            if let Some(item) = self.item(frame) {
                return Ok(Some(item));
            }
        }
        Ok(None)
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Self::Item>, io::Error> {
        while let Some(frame) = self.framer.decode_eof(buf)? {
            if let Some(item) = self.item(frame) {
                return Ok(Some(item));
            }
        }
        Ok(None)
    }
}

impl Encoder<&Message> for NdjsonCodec {
    type Error = io::Error;

    fn encode(&mut self, item: &Message, dst: &mut BytesMut) -> Result<(), io::Error> {
        let line = serde_json::to_vec(item).map_err(io::Error::other)?;
        dst.reserve(line.len() + 1);
        dst.put_slice(&line);
        dst.put_u8(b'\n');
        Ok(())
    }
}

impl Encoder<Message> for NdjsonCodec {
    type Error = io::Error;

    fn encode(&mut self, item: Message, dst: &mut BytesMut) -> Result<(), io::Error> {
        self.encode(&item, dst)
    }
}
