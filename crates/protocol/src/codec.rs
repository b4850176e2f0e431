//! Newline-delimited JSON framing for tokio (`FramedRead` / `FramedWrite`).
//!
//! Each item the decoder yields is a `Result<Message, FrameError>`: a bad line (too long, not
//! UTF-8, not JSON, not a message) is reported as a value and the stream continues with the
//! next line. Only I/O errors end the stream. Memory is bounded: a line longer than the limit
//! is reported as soon as the limit is passed and the rest of it is discarded unbuffered.

use std::io;

use bytes::{BufMut, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::jsonrpc::{EnvelopeError, Message};

/// The default maximum line length: 16 MiB (a resumed thread with many turns is large).
pub const DEFAULT_MAX_LINE_LENGTH: usize = 16 * 1024 * 1024;

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

/// Decodes one line (without its newline) into a message.
pub fn decode_line(line: &[u8]) -> Result<Message, FrameError> {
    let text = std::str::from_utf8(line).map_err(|e| FrameError::InvalidUtf8 {
        valid_up_to: e.valid_up_to(),
    })?;
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| FrameError::InvalidJson {
            reason: e.to_string(),
        })?;
    Ok(Message::from_value(value)?)
}

/// The NDJSON codec.
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
    max_line_length: usize,
    /// Bytes of the buffer already searched for a newline.
    scanned: usize,
    /// Inside an oversized line whose error was already reported.
    discarding: bool,
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
            max_line_length,
            scanned: 0,
            discarding: false,
        }
    }

    /// The configured limit.
    pub fn max_line_length(&self) -> usize {
        self.max_line_length
    }
}

fn trim_line(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

impl Decoder for NdjsonCodec {
    type Item = Result<Message, FrameError>;
    type Error = io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Self::Item>, io::Error> {
        loop {
            let newline = buf[self.scanned..].iter().position(|b| *b == b'\n');
            match newline {
                Some(offset) => {
                    let end = self.scanned + offset + 1;
                    let line = buf.split_to(end);
                    self.scanned = 0;
                    if std::mem::take(&mut self.discarding) {
                        // The tail of a line already reported as too long.
                        continue;
                    }
                    let line = trim_line(&line);
                    if line.len() > self.max_line_length {
                        return Ok(Some(Err(FrameError::LineTooLong {
                            limit: self.max_line_length,
                        })));
                    }
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    return Ok(Some(decode_line(line)));
                }
                None if self.discarding => {
                    buf.clear();
                    self.scanned = 0;
                    return Ok(None);
                }
                // A line of exactly the limit may be waiting for the `\n` of its `\r\n`.
                None if buf.len()
                    > self
                        .max_line_length
                        .saturating_add(usize::from(buf.last() == Some(&b'\r'))) =>
                {
                    // Report now and drop the bytes so an endless line cannot grow the buffer.
                    buf.clear();
                    self.scanned = 0;
                    self.discarding = true;
                    return Ok(Some(Err(FrameError::LineTooLong {
                        limit: self.max_line_length,
                    })));
                }
                None => {
                    self.scanned = buf.len();
                    return Ok(None);
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Self::Item>, io::Error> {
        if let Some(item) = self.decode(buf)? {
            return Ok(Some(item));
        }
        if buf.is_empty() || self.discarding {
            buf.clear();
            self.discarding = false;
            return Ok(None);
        }
        // A last line without a newline (a peer that died mid-write is reported, not dropped).
        let line = buf.split();
        self.scanned = 0;
        let line = trim_line(&line);
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        Ok(Some(decode_line(line)))
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
