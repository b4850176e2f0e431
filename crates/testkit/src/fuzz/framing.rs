//! Target `framing`: arbitrary bytes through [`decode_line`] and the [`NdjsonCodec`].
//!
//! Properties (each a panic with a message when violated):
//! - `decode_line` never panics; a bad line is a typed [`FrameError`]; a decoded message
//!   re-encodes to a line that decodes to the same message (no silent change).
//! - The codec, fed the same bytes in arbitrary chunks, yields exactly the items of a
//!   reference model that splits the whole stream at newlines: one item per non-blank line,
//!   in order, a too-long line is one `LineTooLong` and the stream goes on. Nothing is lost,
//!   duplicated or changed by where the chunk boundaries fall.
//! - Memory is bounded: whenever the codec waits for more input it holds at most
//!   `max_line_length + 1` bytes (the `+ 1` is a trailing `\r` of a line of exactly the limit).
//! - The framer as the proxy reads codex with it (`LineFramer::eliding` the answer's
//!   `result.thread.turns`) yields the plain framer's frames, in the same chunks and within the
//!   same bound; each copy of an oversized line is within the limit, and the copy of a line that
//!   is JSON is that value with its turns emptied.
#![allow(dead_code, unreachable_pub)]

use bytes::BytesMut;
use rethread_protocol::codec::{decode_line, Frame, LineFramer};
use rethread_protocol::{FrameError, Message, NdjsonCodec};
use tokio_util::codec::Decoder;

use crate::fuzz::input::Input;

type Item = Result<Message, FrameError>;

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let limit_choice = input.byte();
    let chunk_seed = input.byte();
    let stream = input.rest();
    check_decode_line(stream);
    let max = match limit_choice {
        255 => rethread_protocol::codec::DEFAULT_MAX_LINE_LENGTH,
        n => 1 + n as usize % 96,
    };
    let expected = reference(stream, max);
    let got = chunked(
        NdjsonCodec::with_max_line_length(max),
        stream,
        max,
        chunk_seed,
    );
    assert_eq!(
        got, expected,
        "chunked decoding (limit {max}, chunk seed {chunk_seed}) differs from the line model"
    );
    check_eliding(stream, max, chunk_seed);
}

const TURNS: &[&str] = &["result", "thread", "turns"];

/// The eliding framer against the plain one, and each copy against the line it was made of.
fn check_eliding(stream: &[u8], max: usize, seed: u8) {
    let plain = chunked(LineFramer::new(max), stream, max, seed);
    let eliding = chunked(LineFramer::new(max).eliding(TURNS), stream, max, seed);
    assert_eq!(plain.len(), eliding.len(), "eliding changed the frames");
    let mut oversized = stream
        .split(|b| *b == b'\n')
        .map(trim)
        .filter(|line| line.len() > max);
    for (plain, eliding) in plain.into_iter().zip(eliding) {
        match (plain, eliding) {
            (Frame::Line(a), Frame::Line(b)) => assert_eq!(a, b, "eliding changed a line"),
            (
                Frame::TooLong {
                    prefix: a,
                    elided: None,
                },
                Frame::TooLong { prefix: b, elided },
            ) => {
                assert_eq!(a, b, "eliding changed a prefix");
                let line = oversized.next().expect("one frame per oversized line");
                let Some(copy) = elided else { continue };
                assert!(
                    copy.len() <= max,
                    "a copy of {} bytes, limit {max}",
                    copy.len()
                );
                if let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(line) {
                    if let Some(turns) = value
                        .pointer_mut("/result/thread/turns")
                        .filter(|turns| turns.is_array())
                    {
                        *turns = serde_json::json!([]);
                    }
                    let read: serde_json::Value = serde_json::from_slice(&copy)
                        .unwrap_or_else(|e| panic!("the copy of a JSON line is not JSON: {e}"));
                    assert_eq!(read, value, "the copy is not the line without its turns");
                }
            }
            (a, b) => panic!("eliding changed a frame: {a:?} became {b:?}"),
        }
    }
}

/// `decode_line` on the raw bytes, and the re-encoding round trip of what it accepts.
fn check_decode_line(line: &[u8]) {
    match decode_line(line) {
        Ok(message) => {
            let encoded = message.to_line();
            assert!(
                !encoded.contains('\n'),
                "an encoded message must be one line: {encoded:?}"
            );
            let again = decode_line(encoded.as_bytes())
                .unwrap_or_else(|e| panic!("re-encoded message does not decode: {e}: {encoded}"));
            assert_eq!(
                again.to_line(),
                encoded,
                "a message changed in an encode/decode round trip"
            );
        }
        Err(
            FrameError::InvalidUtf8 { .. }
            | FrameError::InvalidJson { .. }
            | FrameError::InvalidMessage(_),
        ) => {}
        Err(other) => panic!("decode_line cannot report {other:?}"),
    }
}

fn trim(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The model: split the whole stream at `\n`, strip one `\r`, judge each line on its own.
fn reference(stream: &[u8], max: usize) -> Vec<Item> {
    let mut out = Vec::new();
    for line in stream.split(|b| *b == b'\n') {
        let line = trim(line);
        if line.len() > max {
            out.push(Err(FrameError::LineTooLong { limit: max }));
        } else if !line.iter().all(u8::is_ascii_whitespace) {
            out.push(decode_line(line));
        }
    }
    out
}

/// `codec` fed in chunks whose sizes come from `seed`.
fn chunked<D: Decoder<Error = std::io::Error>>(
    mut codec: D,
    stream: &[u8],
    max: usize,
    seed: u8,
) -> Vec<D::Item> {
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut state = u32::from(seed) | 1;
    let mut rest = stream;
    while !rest.is_empty() {
        // A small xorshift: chunk sizes 1..=2*max+2, or everything at once when seed is 0.
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let size = if seed == 0 {
            rest.len()
        } else {
            1 + state as usize % (2 * max.min(4096) + 2)
        };
        let (head, tail) = rest.split_at(size.min(rest.len()));
        rest = tail;
        buf.extend_from_slice(head);
        while let Some(item) = codec
            .decode(&mut buf)
            .expect("the codec never fails on bytes")
        {
            out.push(item);
        }
        assert!(
            buf.len() <= max + 1,
            "the codec buffers {} bytes waiting for a newline, limit {max}",
            buf.len()
        );
    }
    while let Some(item) = codec.decode_eof(&mut buf).expect("eof never fails") {
        out.push(item);
    }
    out
}
