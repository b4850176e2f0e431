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
    let Frame::TooLong {
        prefix,
        elided: None,
    } = &got[0]
    else {
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
                prefix: Bytes::from_static(b"abcdefgh"),
                elided: None,
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

/// The proxy's framer of codex's output keeps an oversized resume answer without its turns
/// (`LineFramer::eliding`), read in any chunks, and still holds no more than the limit.
#[test]
fn an_eliding_framer_keeps_an_oversized_answer_without_its_turns() {
    const PATH: &[&str] = &["result", "thread", "turns"];
    let turns: Vec<_> = (0..400)
        .map(|i| serde_json::json!({"id": i, "items": [{"text": "]}\"[ ".repeat(20)}]}))
        .collect();
    let answer = |turns| {
        serde_json::json!({"id": "rethread-proxy:1",
            "result": {"thread": {"id": "t", "turns": turns, "name": null}, "model": "m"}})
    };
    let short = answer(serde_json::json!([])).to_string();
    let answer = answer(serde_json::Value::from(turns));
    let long = format!("{answer}\r\n");
    assert!(long.len() > 50_000);
    for chunk in [1, 7, 4096, 70_000] {
        let mut framer = LineFramer::new(8000).eliding(PATH);
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for piece in long.as_bytes().chunks(chunk).chain([&b"{}\n"[..]]) {
            buf.extend_from_slice(piece);
            while let Some(frame) = framer.decode(&mut buf).unwrap() {
                got.push(frame);
            }
            assert!(buf.len() <= 8001, "{chunk}");
        }
        let [Frame::TooLong {
            prefix,
            elided: Some(elided),
        }, next] = &got[..]
        else {
            panic!("{chunk}: {got:?}")
        };
        assert_eq!(&prefix[..], &long.as_bytes()[..PREFIX_KEPT], "{chunk}");
        assert_eq!(&elided[..], short.as_bytes(), "{chunk}");
        assert_eq!(*next, line("{}\n"));
    }

    // A copy past the limit: reported as soon as it passes, and the line is discarded.
    let mut framer = LineFramer::new(64).eliding(PATH);
    let mut buf = BytesMut::from(&br#"{"result":{"thread":{"turns":[1]}},"x":""#[..]);
    assert_eq!(framer.decode(&mut buf).unwrap(), None);
    buf.extend_from_slice(&[b'z'; 100]);
    assert!(matches!(
        framer.decode(&mut buf).unwrap(),
        Some(Frame::TooLong { elided: None, .. })
    ));
    buf.extend_from_slice(b"zz\"}\nok\n");
    assert_eq!(framer.decode(&mut buf).unwrap(), Some(line("ok\n")));

    // An oversized line cut by the end of the stream is reported then, with its copy.
    let mut framer = LineFramer::new(40).eliding(PATH);
    let mut buf = BytesMut::from(&br#"{"result":{"thread":{"turns":[1,2,3,4,5,6,7,8,9,10,11]"#[..]);
    assert_eq!(framer.decode(&mut buf).unwrap(), None);
    let Some(Frame::TooLong {
        elided: Some(elided),
        ..
    }) = framer.decode_eof(&mut buf).unwrap()
    else {
        panic!()
    };
    assert_eq!(&elided[..], br#"{"result":{"thread":{"turns":[]"#);
    assert!(buf.is_empty());
    assert_eq!(framer.decode_eof(&mut buf).unwrap(), None);
}

/// Issue 19, item 19: serde_json's `Value` keeps the last of two members of one name, so
/// `{"id":1,"id":2,"method":..}` read as a request with id 2 while codex, whose envelope is
/// derived structs, refuses the line ("duplicate field `id`") and ignores it. A duplicate of a
/// member the envelope reads is not a message, in every reader of the line.
#[test]
fn a_duplicate_envelope_member_makes_a_line_not_a_message() {
    for line in [
        r#"{"id":1,"id":2,"method":"thread/list"}"#,
        r#"{"id":1,"method":"a","method":"b"}"#,
        r#"{"id":1,"method":"m","params":{},"params":{}}"#,
        r#"{"id":1,"result":1,"result":2}"#,
        r#"{"id":1,"error":{"code":1,"message":"a"},"error":{"code":2,"message":"b"}}"#,
        r#"{"id":null,"i\u0064":"rethread-proxy:1","result":{}}"#,
    ] {
        let decoded = rethread_protocol::codec::decode_line(line.as_bytes());
        assert!(
            matches!(&decoded, Err(FrameError::InvalidMessage(e)) if e.to_string().contains("duplicate")),
            "{line}: {decoded:?}"
        );
        assert!(serde_json::from_str::<Message>(line).is_err(), "{line}");
    }
    // Other members may repeat, as codex ignores members it does not know.
    let line = br#"{"jsonrpc":"2.0","jsonrpc":"2.0","method":"m"}"#;
    assert!(rethread_protocol::codec::decode_line(line).is_ok());
}

/// The router's reader (`decode_envelope`) and the full decoder refuse and accept the same
/// lines, for the same reasons, where a lenient skip of the payload would differ from a `Value`
/// parse: numbers out of range, lone surrogates, the nesting limit, trailing bytes.
#[test]
fn the_envelope_reader_agrees_with_the_decoder_on_every_line() {
    use rethread_protocol::codec::{decode_envelope, decode_line};
    let deep = format!(
        r#"{{"id":1,"method":"m","params":{}{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    // The line's object is one level: `params` may nest 126 more, not 127.
    let nested = |n: usize| {
        format!(
            r#"{{"method":"m","params":{}{}}}"#,
            "[".repeat(n),
            "]".repeat(n)
        )
    };
    let (deepest, too_deep) = (nested(126), nested(127));
    let lines: Vec<&[u8]> = vec![
        deepest.as_bytes(),
        too_deep.as_bytes(),
        br#"{"id":1,"method":"m","params":1e999}"#,
        br#"{"id":1,"method":"m","params":"\ud800"}"#,
        br#"{"id":1,"method":"m","params":"\ud83d\ude00"}"#,
        br#"{"id":1,"result":{"a":[1,2,{"b":null}]},"extra":-0.5e-3}"#,
        br#"{"id":1,"method":"m"} x"#,
        br#"{"id":1.0,"method":"m"}"#,
        br#"{"id":18446744073709551615,"result":1}"#,
        br#"{"error":{"code":"x","message":"m"}}"#,
        br#"{"id":null,"error":{"code":-1,"message":"m"}}"#,
        b"[1,{\"id\":2}]",
        b"\"text\"",
        b"{\"method\":\"m\",\"params\":{\"a\":\"\xff\"}}",
        deep.as_bytes(),
    ];
    for line in lines {
        let text = String::from_utf8_lossy(line);
        match (decode_line(line), decode_envelope(line)) {
            (Ok(message), Ok(envelope)) => {
                assert_eq!(envelope.kind, message.kind(), "{text}");
                assert_eq!(envelope.id.as_ref(), message.id(), "{text}");
                assert_eq!(envelope.method.as_deref(), message.method(), "{text}");
            }
            (Err(full), Err(routed)) => assert_eq!(full, routed, "{text}"),
            (full, routed) => panic!("{text}: decode_line {full:?}, decode_envelope {routed:?}"),
        }
    }
}

/// A member name twice in one object inside `params`, at any depth and in any spelling serde
/// reads as the same name, makes the line no message for the router: codex keeps the last one,
/// so a guard reading the first would let through what codex then does (issue 41, item 2).
#[test]
fn a_member_twice_anywhere_in_params_is_refused_by_the_envelope_reader() {
    use rethread_protocol::codec::decode_envelope;
    use rethread_protocol::{EnvelopeError, FrameError};
    let refused = |line: &str| match decode_envelope(line.as_bytes()) {
        Err(FrameError::InvalidMessage(EnvelopeError::DuplicateInParams { member })) => member,
        other => panic!("{line}: {other:?}"),
    };
    let a = "019a0000-0000-7000-8000-00000000000a";
    let b = "019a0000-0000-7000-8000-00000000000b";
    let top = format!(
        r#"{{"id":1,"method":"thread/read","params":{{"threadId":"{a}","threadId":"{b}"}}}}"#
    );
    assert_eq!(refused(&top), "threadId");
    let escaped = format!(
        r#"{{"id":1,"method":"thread/read","params":{{"threadId":"{a}","thread\u0049d":"{b}"}}}}"#
    );
    assert_eq!(refused(&escaped), "threadId");
    let nested = r#"{"id":1,"method":"turn/start","params":{"input":[{"type":"text","text":"a","text":"b"}]}}"#;
    assert_eq!(refused(nested), "text");
    let notification = r#"{"method":"initialized","params":{"x":{"y":1,"y":2}}}"#;
    assert_eq!(refused(notification), "y");
    // Distinct names, the same name in sibling objects, and duplicates outside `params` (what
    // the envelope does not read) are fine.
    for line in [
        r#"{"id":1,"method":"m","params":{"a":{"x":1},"b":{"x":1},"c":[{"x":1},{"x":2}]}}"#,
        r#"{"id":1,"method":"m","params":{"a":1,"A":2}}"#,
        r#"{"id":1,"method":"m","params":{},"extra":{"k":1,"k":2}}"#,
        r#"{"id":1,"result":{"k":1,"k":2}}"#,
    ] {
        assert!(decode_envelope(line.as_bytes()).is_ok(), "{line}");
    }
}
