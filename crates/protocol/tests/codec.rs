//! NDJSON framing: limits, bad lines, continuation.

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use rethread_protocol::codec::{Frame, LineFramer, PREFIX_KEPT};
use rethread_protocol::{FrameError, Message, NdjsonCodec};
use tokio_util::codec::{Decoder, Encoder, FramedRead};

fn decode_all(codec: &mut NdjsonCodec, input: &[u8]) -> Vec<Result<Message, FrameError>> {
    let mut buf = BytesMut::from(input);
    let mut out = Vec::new();
    while let Some(item) = codec.decode(&mut buf).unwrap() {
        out.push(item);
    }
    while let Some(item) = codec.decode_eof(&mut buf).unwrap() {
        out.push(item);
    }
    out
}

#[test]
fn a_bad_line_is_typed_and_the_stream_continues() {
    let input =
        b"{\"method\":\"a\"}\nnot json\n\xff\xfe\n[1]\n\n\r\n{\"id\":1,\"result\":null}\r\n";
    let items = decode_all(&mut NdjsonCodec::new(), input);
    assert_eq!(items.len(), 5);
    assert!(matches!(items[0], Ok(Message::Notification(_))));
    assert!(matches!(items[1], Err(FrameError::InvalidJson { .. })));
    assert!(matches!(
        items[2],
        Err(FrameError::InvalidUtf8 { valid_up_to: 0 })
    ));
    assert!(matches!(items[3], Err(FrameError::InvalidMessage(_))));
    assert!(matches!(items[4], Ok(Message::Response(_))));
}

#[test]
fn an_oversized_line_is_reported_once_and_skipped() {
    let mut input = vec![b'x'; 100];
    input.extend_from_slice(b"\n{\"method\":\"ok\"}\n");
    let items = decode_all(&mut NdjsonCodec::with_max_line_length(32), &input);
    assert_eq!(items.len(), 2);
    assert_eq!(items[0], Err(FrameError::LineTooLong { limit: 32 }));
    assert_eq!(items[1].as_ref().unwrap().method(), Some("ok"));
}

#[test]
fn an_endless_line_does_not_grow_the_buffer() {
    let mut codec = NdjsonCodec::with_max_line_length(24);
    let mut buf = BytesMut::new();
    let mut errors = 0;
    for _ in 0..1000 {
        buf.extend_from_slice(&[b'y'; 64]);
        while let Some(item) = codec.decode(&mut buf).unwrap() {
            assert_eq!(item, Err(FrameError::LineTooLong { limit: 24 }));
            errors += 1;
        }
        assert!(buf.len() <= 64, "buffer grew to {}", buf.len());
    }
    assert_eq!(errors, 1, "one oversized line is one error");
    buf.extend_from_slice(b"\n{\"method\":\"after\"}\n");
    assert_eq!(
        codec.decode(&mut buf).unwrap().unwrap().unwrap().method(),
        Some("after")
    );
}

#[test]
fn a_line_split_across_reads_decodes_once() {
    let mut codec = NdjsonCodec::new();
    let mut buf = BytesMut::from(&b"{\"method\":"[..]);
    assert!(codec.decode(&mut buf).unwrap().is_none());
    buf.extend_from_slice(b"\"x\"}\n");
    assert_eq!(
        codec.decode(&mut buf).unwrap().unwrap().unwrap().method(),
        Some("x")
    );
}

#[test]
fn a_torn_last_line_at_eof_is_an_error_not_silence() {
    let items = decode_all(
        &mut NdjsonCodec::new(),
        b"{\"method\":\"a\"}\n{\"id\":1,\"res",
    );
    assert_eq!(items.len(), 2);
    assert!(matches!(items[1], Err(FrameError::InvalidJson { .. })));
}

#[test]
fn encoding_appends_one_newline() {
    let mut buf = BytesMut::new();
    NdjsonCodec::new()
        .encode(Message::notification("initialized", None), &mut buf)
        .unwrap();
    assert_eq!(&buf[..], b"{\"method\":\"initialized\"}\n");
}

#[tokio::test]
async fn framed_read_yields_errors_and_keeps_going() {
    let input: &[u8] = b"garbage\n{\"method\":\"a\"}\n";
    let mut framed = FramedRead::new(input, NdjsonCodec::new());
    assert!(framed.next().await.unwrap().unwrap().is_err());
    assert!(framed.next().await.unwrap().unwrap().is_ok());
    assert!(framed.next().await.is_none());
}

// The line framer the codec and the proxy share (issue 20, item 4).

fn frames(limit: usize, chunks: &[&[u8]]) -> Vec<Frame> {
    let mut framer = LineFramer::new(limit);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        while let Some(frame) = framer.decode(&mut buf).unwrap() {
            out.push(frame);
        }
    }
    while let Some(frame) = framer.decode_eof(&mut buf).unwrap() {
        out.push(frame);
    }
    out
}

fn line(text: &str) -> Frame {
    Frame::Line(Bytes::copy_from_slice(text.as_bytes()))
}

#[test]
fn framed_lines_keep_their_terminators_and_the_last_one_may_lack_one() {
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
fn an_oversized_frame_keeps_only_its_prefix_and_the_next_line_survives() {
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
    // A short line over a small limit keeps its content, not its terminator.
    assert_eq!(
        frames(4, &[b"abcdefgh\r\nok\n"]),
        vec![
            Frame::TooLong {
                prefix: Bytes::from_static(b"abcdefgh")
            },
            line("ok\n")
        ]
    );
    // An endless line is cut without growing the buffer past the limit.
    let mut framer = LineFramer::new(64);
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&[b'z'; 65]);
    assert!(matches!(
        framer.decode(&mut buf).unwrap(),
        Some(Frame::TooLong { .. })
    ));
    for _ in 0..10 {
        buf.extend_from_slice(&[b'z'; 1000]);
        assert_eq!(framer.decode(&mut buf).unwrap(), None);
        assert!(buf.is_empty());
    }
    buf.extend_from_slice(b"zz\nok\n");
    assert_eq!(
        framer.decode(&mut buf).unwrap(),
        Some(Frame::Line(Bytes::from_static(b"ok\n")))
    );
}
