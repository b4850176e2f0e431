//! Splitting a byte stream into lines without copying them, within a length limit.
//!
//! Each line is split off the read buffer as it is (`BytesMut::split_to`, then frozen): the
//! `Bytes` that reach the writer are the bytes that were read, terminator included. A line
//! longer than the limit is never held whole: once the buffer passes the limit, its first
//! [`PREFIX_KEPT`] bytes are kept (so its `id` may still be read and its sender answered) and
//! the rest of the line is discarded as it arrives.

use std::io;

use bytes::{Bytes, BytesMut};
use tokio_util::codec::Decoder;

/// How many bytes of an oversized line are kept to find out who sent it.
pub const PREFIX_KEPT: usize = 4096;

/// One item of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    /// A line, terminator included (absent only for a last line cut by the end of the stream).
    Line(Bytes),
    /// A line longer than the limit: its first bytes; the rest was discarded.
    TooLong {
        /// The first [`PREFIX_KEPT`] bytes (fewer if the line ended sooner).
        prefix: Bytes,
    },
}

/// The line splitter (a `tokio_util` decoder).
#[derive(Debug)]
pub(crate) struct LineSplitter {
    max_line_length: usize,
    /// Bytes of the buffer already searched for a newline.
    scanned: usize,
    /// Inside an oversized line that was already reported.
    discarding: bool,
}

impl LineSplitter {
    /// Lines longer than `max_line_length` bytes (terminator excluded) are [`Frame::TooLong`].
    pub(crate) fn new(max_line_length: usize) -> Self {
        LineSplitter {
            max_line_length,
            scanned: 0,
            discarding: false,
        }
    }

    fn too_long(&mut self, buf: &mut BytesMut, line_end: Option<usize>) -> Frame {
        let kept = PREFIX_KEPT.min(line_end.unwrap_or(buf.len()));
        let prefix = buf.split_to(kept).freeze();
        match line_end {
            Some(end) => {
                let _ = buf.split_to(end - kept);
            }
            None => {
                buf.clear();
                self.discarding = true;
            }
        }
        self.scanned = 0;
        Frame::TooLong { prefix }
    }
}

fn content_length(line: &[u8]) -> usize {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line).len()
}

impl Decoder for LineSplitter {
    type Item = Frame;
    type Error = io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, io::Error> {
        loop {
            match memchr::memchr(b'\n', &buf[self.scanned..]) {
                Some(offset) => {
                    let end = self.scanned + offset + 1;
                    self.scanned = 0;
                    if std::mem::take(&mut self.discarding) {
                        // The tail of a line already reported as too long.
                        let _ = buf.split_to(end);
                        continue;
                    }
                    if content_length(&buf[..end]) > self.max_line_length {
                        return Ok(Some(self.too_long(buf, Some(end))));
                    }
                    return Ok(Some(Frame::Line(buf.split_to(end).freeze())));
                }
                None if self.discarding => {
                    buf.clear();
                    self.scanned = 0;
                    return Ok(None);
                }
                // A line of exactly the limit may still be waiting for the `\n` of its `\r\n`.
                None if buf.len()
                    > self
                        .max_line_length
                        .saturating_add(usize::from(buf.last() == Some(&b'\r'))) =>
                {
                    return Ok(Some(self.too_long(buf, None)));
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
        if buf.is_empty() || std::mem::take(&mut self.discarding) {
            buf.clear();
            return Ok(None);
        }
        // A last line without its newline: passed on as it is, like everything else.
        Ok(Some(Frame::Line(buf.split().freeze())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(limit: usize, chunks: &[&[u8]]) -> Vec<Frame> {
        let mut splitter = LineSplitter::new(limit);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for chunk in chunks {
            buf.extend_from_slice(chunk);
            while let Some(frame) = splitter.decode(&mut buf).unwrap() {
                out.push(frame);
            }
        }
        while let Some(frame) = splitter.decode_eof(&mut buf).unwrap() {
            out.push(frame);
        }
        out
    }

    fn line(text: &str) -> Frame {
        Frame::Line(Bytes::copy_from_slice(text.as_bytes()))
    }

    #[test]
    fn lines_keep_their_terminators_and_the_last_one_may_lack_one() {
        assert_eq!(
            frames(100, &[b"{\"a\":1}\n{\"b\"", b":2}\r\n\n", b"tail"]),
            vec![
                line("{\"a\":1}\n"),
                line("{\"b\":2}\r\n"),
                line("\n"),
                line("tail")
            ]
        );
    }

    #[test]
    fn an_oversized_line_keeps_only_its_prefix_and_the_next_line_survives() {
        let long = format!(
            "{{\"id\":1,\"method\":\"m\",\"p\":\"{}\"}}\n",
            "x".repeat(10_000)
        );
        let got = frames(
            8000,
            &[
                long.as_bytes()[..5000].as_ref(),
                &long.as_bytes()[5000..],
                b"{}\n",
            ],
        );
        assert_eq!(got.len(), 2);
        let Frame::TooLong { prefix } = &got[0] else {
            panic!("{got:?}")
        };
        assert_eq!(&prefix[..], &long.as_bytes()[..PREFIX_KEPT]);
        assert_eq!(got[1], line("{}\n"));
        // Exactly at the limit (with `\r\n`) is fine.
        let exact = format!("{}\r\n", "y".repeat(8000));
        assert_eq!(frames(8000, &[exact.as_bytes()]), vec![line(&exact)]);
        // An endless line is cut without growing the buffer past the limit.
        let mut splitter = LineSplitter::new(64);
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&[b'z'; 65]);
        assert!(matches!(
            splitter.decode(&mut buf).unwrap(),
            Some(Frame::TooLong { .. })
        ));
        for _ in 0..10 {
            buf.extend_from_slice(&[b'z'; 1000]);
            assert_eq!(splitter.decode(&mut buf).unwrap(), None);
            assert!(buf.is_empty());
        }
        buf.extend_from_slice(b"zz\nok\n");
        assert_eq!(
            splitter.decode(&mut buf).unwrap(),
            Some(Frame::Line(Bytes::from_static(b"ok\n")))
        );
    }
}
