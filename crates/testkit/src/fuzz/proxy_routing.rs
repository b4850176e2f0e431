//! Target `proxy_routing`: arbitrary and mutated JSON-RPC lines through the proxy's two
//! readers and through `rethread_proxy::forward`, judged against serde_json's reading of each.
//!
//! The oracle reads a line the way codex does, written here independently of the protocol
//! crate: UTF-8, a `serde_json::Value`, a serde-derived struct to find a duplicate of `id`,
//! `method`, `params`, `result` or `error`, then the JSON-RPC rules (a `method` with an integer
//! or string `id` is a request, without one a notification, an `error` object an error answer,
//! a `result` with an `id` an answer).
//!
//! Properties (each a panic when violated):
//! - Codex's side ([`peek`]): on every line that is JSON, the kind, `id` and `method` are the
//!   oracle's (a duplicate or a non-message is `Other`); [`peek_prefix`] of any cut of a
//!   message never names another id, and calls it a request only when it is one.
//! - The client's side, through `forward` with a hook that records what it is given and a codex
//!   that records what it reads: the hook sees exactly the oracle's messages, in order, with
//!   the oracle's kind, `id` and `method` (requests in the proxy's id space excepted: they are
//!   refused); codex reads exactly the client's lines that are messages or not JSON at all, in
//!   order and unchanged, plus the proxy's own error answers in place of refused client
//!   answers; never a line that is not UTF-8, has a duplicate member or is over the limit;
//!   the client gets only error answers (codex says nothing here); and forwarding ends cleanly.
#![allow(dead_code, unreachable_pub)]

use rethread_store::Unpoisoned;
use std::sync::Mutex;
use std::time::Duration;

use rethread_protocol::codec::decode_line;
use rethread_protocol::{Message, RequestId};
use rethread_proxy::{
    forward, peek, peek_prefix, ClientAction, ClientContext, Ended, HookError, Line, LineKind,
    ProxyOptions, Reporter, SessionHooks, PROXY_ID_PREFIX,
};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::fuzz::input::Input;

/// What a line is, read as codex reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading {
    /// A message: its kind, `id` and `method`.
    Message(LineKind, Option<RequestId>, Option<String>),
    /// JSON (UTF-8), but not a message: not an object, no kind, a member of the wrong type.
    NotAMessage,
    /// JSON whose `id`, `method`, `params`, `result` or `error` comes twice.
    Duplicate,
    /// UTF-8 but not JSON.
    NotJson,
    /// Not UTF-8.
    NotUtf8,
}

/// Finds a duplicate of the members the envelope reads (serde-derived: "duplicate field").
#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct EnvelopeMembers {
    id: Option<serde::de::IgnoredAny>,
    method: Option<serde::de::IgnoredAny>,
    params: Option<serde::de::IgnoredAny>,
    result: Option<serde::de::IgnoredAny>,
    error: Option<serde::de::IgnoredAny>,
}

/// The oracle: `line` without its terminator.
pub fn oracle(line: &[u8]) -> Reading {
    let Ok(text) = std::str::from_utf8(line) else {
        return Reading::NotUtf8;
    };
    let Ok(value) = serde_json::from_str::<Value>(text) else {
        return Reading::NotJson;
    };
    let Value::Object(object) = value else {
        return Reading::NotAMessage;
    };
    if serde_json::from_str::<EnvelopeMembers>(text).is_err() {
        return Reading::Duplicate;
    }
    let id = match object.get("id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(RequestId::String(id.clone())),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(id) => Some(RequestId::Integer(id)),
            None => return Reading::NotAMessage,
        },
        Some(_) => return Reading::NotAMessage,
    };
    if let Some(method) = object.get("method") {
        let Value::String(method) = method else {
            return Reading::NotAMessage;
        };
        let kind = if id.is_some() {
            LineKind::Request
        } else {
            LineKind::Notification
        };
        return Reading::Message(kind, id, Some(method.clone()));
    }
    if let Some(error) = object.get("error") {
        let is_error_object = error.get("code").is_some_and(Value::is_i64)
            && error.get("message").is_some_and(Value::is_string);
        return if is_error_object {
            Reading::Message(LineKind::Error, id, None)
        } else {
            Reading::NotAMessage
        };
    }
    if object.contains_key("result") {
        return match id {
            Some(id) => Reading::Message(LineKind::Response, Some(id), None),
            None => Reading::NotAMessage,
        };
    }
    Reading::NotAMessage
}

/// `line` without one trailing `\r` (what both readers see of a line ended by `\r\n`).
fn content(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let limit = match input.byte() {
        0..=191 => rethread_protocol::codec::DEFAULT_MAX_LINE_LENGTH,
        n => 16 + usize::from(n - 191) * 8,
    };
    let mut lines = Vec::new();
    while !input.is_empty() && lines.len() < 64 {
        lines.push(next_line(&mut input));
    }
    for line in &lines {
        check_codex_side(content(line));
    }
    check_client_side(&lines, limit);
}

/// The reader of codex's lines against the oracle.
fn check_codex_side(line: &[u8]) {
    let reading = oracle(line);
    let seen = peek(line);
    let shown = String::from_utf8_lossy(line);
    match &reading {
        Reading::Message(kind, id, method) => {
            assert_eq!(
                (&seen.kind, &seen.id, &seen.method),
                (kind, id, method),
                "peek differs from serde_json on {shown}"
            );
            for cut in [
                1,
                line.len() / 3,
                line.len() / 2,
                line.len().saturating_sub(1),
            ] {
                if let Some(partial) = peek_prefix(&line[..cut.min(line.len())]) {
                    assert_eq!(&partial.id, id, "peek_prefix names another id: {shown}");
                    if partial.kind == LineKind::Request {
                        assert_eq!(*kind, LineKind::Request, "not a request: {shown}");
                    }
                }
            }
        }
        Reading::NotAMessage | Reading::Duplicate => {
            assert_eq!(
                seen.kind,
                LineKind::Other,
                "peek routes {reading:?}: {shown}"
            );
        }
        // Codex writes JSON; a line that is not is judged by the client, unrouted or not.
        Reading::NotJson | Reading::NotUtf8 => {}
    }
}

/// A line's kind, `id` and `method`.
type Routed = (LineKind, Option<RequestId>, Option<String>);

/// What the hooks were given.
#[derive(Debug, Default)]
struct Recording {
    seen: Mutex<Vec<Routed>>,
}

impl SessionHooks for Recording {
    async fn on_client_message(
        &self,
        line: &Line,
        _ctx: &ClientContext,
    ) -> Result<ClientAction, HookError> {
        let seen = (
            line.kind(),
            line.id().cloned(),
            line.method().map(str::to_string),
        );
        self.seen.lock().unpoisoned().push(seen);
        Ok(ClientAction::Forward)
    }
}

/// The client's lines through `forward`, against a codex that reads everything and says
/// nothing.
fn check_client_side(lines: &[Vec<u8>], limit: usize) {
    let mut expected_hooks = Vec::new();
    let mut expected_codex: Vec<&[u8]> = Vec::new();
    for line in lines {
        let over = content(line).len() > limit;
        match oracle(content(line)) {
            _ if over => {}
            Reading::Message(kind, id, method) => {
                let reserved = kind == LineKind::Request
                    && matches!(&id, Some(RequestId::String(s)) if s.starts_with(PROXY_ID_PREFIX));
                if !reserved {
                    expected_hooks.push((kind, id, method));
                    expected_codex.push(line);
                }
            }
            Reading::NotAMessage | Reading::NotJson => expected_codex.push(line),
            Reading::Duplicate | Reading::NotUtf8 => {}
        }
    }
    let mut client_bytes = Vec::new();
    for line in lines {
        client_bytes.extend_from_slice(line);
        client_bytes.push(b'\n');
    }
    let hooks = Recording::default();
    let (codex_got, client_got, ended) = drive(&hooks, client_bytes, limit);
    assert!(
        matches!(
            ended,
            Ok(Ended::ClientClosed {
                codex_finished: true
            })
        ),
        "forwarding ended {ended:?}"
    );
    let seen = hooks.seen.into_inner().unpoisoned();
    assert_eq!(
        seen, expected_hooks,
        "the hooks saw other than serde_json reads"
    );

    let mut wanted = expected_codex.iter().peekable();
    for heard in split_lines(&codex_got) {
        if wanted.peek().is_some_and(|w| **w == heard) {
            wanted.next();
            continue;
        }
        // Otherwise only an error the proxy sent codex in place of a refused client answer.
        let text = String::from_utf8_lossy(heard);
        match decode_line(content(heard)) {
            Ok(Message::Error(answer))
                if answer.error.message.starts_with("the client's answer") => {}
            _ => panic!("codex read a line it should not have: {text}"),
        }
    }
    let missing: Vec<_> = wanted.map(|l| String::from_utf8_lossy(l)).collect();
    assert!(missing.is_empty(), "codex never read: {missing:?}");
    for heard in split_lines(&client_got) {
        assert!(
            matches!(decode_line(content(heard)), Ok(Message::Error(_))),
            "the client got other than an error answer: {}",
            String::from_utf8_lossy(heard)
        );
    }
}

fn split_lines(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    bytes
        .strip_suffix(b"\n")
        .unwrap_or(bytes)
        .split(|b| *b == b'\n')
        .filter(|_| !bytes.is_empty())
}

/// Runs `forward` over in-memory pipes: the client writes `client_bytes` and closes; codex reads
/// until its input is closed, then closes its output. Returns what codex and the client read.
fn drive(
    hooks: &Recording,
    client_bytes: Vec<u8>,
    limit: usize,
) -> (Vec<u8>, Vec<u8>, Result<Ended, rethread_proxy::ProxyError>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let (mut client, proxy_client) = tokio::io::duplex(64 * 1024);
        let (mut codex, proxy_codex) = tokio::io::duplex(64 * 1024);
        let (client_in, client_out) = tokio::io::split(proxy_client);
        let (codex_out, codex_in) = tokio::io::split(proxy_codex);
        let mut options = ProxyOptions::default();
        options.max_line_length = limit;
        options.reporter = Reporter::new(|_| {});
        options.shutdown_grace = Duration::from_secs(30);
        let proxy = forward(
            hooks,
            &options,
            client_in,
            client_out,
            codex_out,
            codex_in,
            std::future::pending(),
        );
        let (mut client_read, mut client_write) = tokio::io::split(&mut client);
        let client_side = async {
            client_write
                .write_all(&client_bytes)
                .await
                .expect("client writes");
            client_write.shutdown().await.expect("client closes");
            let mut got = Vec::new();
            client_read
                .read_to_end(&mut got)
                .await
                .expect("client reads");
            got
        };
        let codex_side = async {
            let mut got = Vec::new();
            codex.read_to_end(&mut got).await.expect("codex reads");
            codex.shutdown().await.expect("codex closes");
            got
        };
        let run = async { tokio::join!(proxy, client_side, codex_side) };
        let (ended, client_got, codex_got) = tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("forwarding hangs");
        (codex_got, client_got, ended)
    })
}

/// The next line of the input: raw bytes, or a JSON-RPC message with mutations. Never holds a
/// `\n` (lines are joined with one).
fn next_line(input: &mut Input<'_>) -> Vec<u8> {
    let mut line = match input.byte() % 4 {
        0 => input.chunk(160).to_vec(),
        _ => mutated_message(input),
    };
    for byte in &mut line {
        if *byte == b'\n' {
            *byte = b' ';
        }
    }
    line
}

const IDS: [&str; 12] = [
    "1",
    "0",
    "-7",
    "\"u-1\"",
    "\"rethread-proxy:1\"",
    "null",
    "1.5",
    "1e2",
    "18446744073709551615",
    "[1]",
    "{\"a\":1}",
    "\"\\u0072ethread-proxy:2\"",
];

const METHODS: [&str; 8] = [
    "\"thread/start\"",
    "\"turn/start\"",
    "\"initialized\"",
    "\"thread/resume\"",
    "\"a\\/b\"",
    "1",
    "null",
    "\"\"",
];

const PAYLOADS: [&str; 12] = [
    "{}",
    "{\"cwd\":\"/tmp\",\"input\":[{\"type\":\"text\",\"text\":\"hi\"}]}",
    "null",
    "[1,2,{\"id\":3,\"method\":\"x\"}]",
    "\"text with \\\"quotes\\\" and \\\\ and }\"",
    "{\"a\":tru}",
    "1e999",
    "\"\\ud800\"",
    "{\"a\":[1 2]}",
    "-0.0",
    "{\"nested\":{\"id\":9,\"error\":{}}}",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
];

const ERRORS: [&str; 5] = [
    "{\"code\":-32600,\"message\":\"m\"}",
    "{\"code\":-32603,\"message\":\"m\",\"data\":{\"x\":1}}",
    "{\"code\":1.5,\"message\":\"m\"}",
    "{\"message\":\"m\"}",
    "\"oops\"",
];

const NAMES: [&str; 7] = [
    "id", "method", "params", "result", "error", "jsonrpc", "trace",
];

/// A message built member by member (so that members can repeat), then mutated.
fn mutated_message(input: &mut Input<'_>) -> Vec<u8> {
    let mut members: Vec<(String, String)> = Vec::new();
    let shape = input.byte() % 4;
    let id = input.pick(&IDS).to_string();
    match shape {
        0 => {
            members.push(("id".into(), id));
            members.push(("method".into(), input.pick(&METHODS).to_string()));
            members.push(("params".into(), input.pick(&PAYLOADS).to_string()));
        }
        1 => {
            members.push(("method".into(), input.pick(&METHODS).to_string()));
            members.push(("params".into(), input.pick(&PAYLOADS).to_string()));
        }
        2 => {
            members.push(("id".into(), id));
            members.push(("result".into(), input.pick(&PAYLOADS).to_string()));
        }
        _ => {
            members.push(("id".into(), id));
            members.push(("error".into(), input.pick(&ERRORS).to_string()));
        }
    }
    // Up to four mutations of the member list.
    for _ in 0..input.byte() % 5 {
        match input.byte() % 6 {
            // A member twice (the same or another value).
            0 if !members.is_empty() => {
                let (name, value) = members[input.below(members.len())].clone();
                let value = if input.byte().is_multiple_of(2) {
                    value
                } else {
                    input.pick(&PAYLOADS).to_string()
                };
                let at = input.below(members.len() + 1);
                members.insert(at, (name, value));
            }
            // Another member, known or not.
            1 => {
                let name = input.pick(&NAMES).to_string();
                let value = input.pick(&PAYLOADS).to_string();
                let at = input.below(members.len() + 1);
                members.insert(at, (name, value));
            }
            // A name written with an escape.
            2 if !members.is_empty() => {
                let at = input.below(members.len());
                let name = &members[at].0;
                if let Some(first) = name.chars().next() {
                    members[at].0 = format!("\\u{:04x}{}", first as u32, &name[first.len_utf8()..]);
                }
            }
            // Members swapped.
            3 if members.len() > 1 => {
                let a = input.below(members.len());
                let b = input.below(members.len());
                members.swap(a, b);
            }
            // A member dropped.
            4 if !members.is_empty() => {
                members.remove(input.below(members.len()));
            }
            _ => {}
        }
    }
    let spaced = input.byte().is_multiple_of(3);
    let separator = if spaced { ", " } else { "," };
    let body: Vec<String> = members
        .iter()
        .map(|(name, value)| {
            if spaced {
                format!("\"{name}\" : {value}")
            } else {
                format!("\"{name}\":{value}")
            }
        })
        .collect();
    let mut line = format!("{{{}}}", body.join(separator)).into_bytes();
    // Byte-level damage: a byte that is not UTF-8, a cut, a trailing `\r` or garbage.
    match input.byte() % 8 {
        0 if !line.is_empty() => {
            let at = input.below(line.len());
            line.insert(at, *input.pick(&[0xff, 0xc3, 0x80, 0xe9]));
        }
        1 if !line.is_empty() => line.truncate(input.below(line.len())),
        2 => line.push(b'\r'),
        3 => line.extend_from_slice(b" x"),
        _ => {}
    }
    line
}
