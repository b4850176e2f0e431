//! Target `fake_appserver`: the in-process fake app-server fed arbitrary request streams
//! (well-formed requests on the threads it created, arbitrary params, raw byte lines,
//! notifications, answers to its server requests, an early end of input).
//!
//! Properties:
//! - Every line the fake writes is one valid message of the dialect.
//! - Every request gets exactly one answer: never an answer to an id that was not sent, never
//!   more answers to an id than requests with it; once the input is quiet, every request sent
//!   has its answer (a request the fake drops would hang a real client).
//! - When its input ends the fake flushes and ends its output, without panicking.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use rethread_fake_appserver::{FakeAppServer, Profile};
use rethread_protocol::codec::decode_line;
use rethread_protocol::{Message, RequestId};
use serde_json::{json, Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::fuzz::input::{panicked, watch_panics, Input};

const METHODS: [&str; 10] = [
    "initialize",
    "thread/start",
    "thread/resume",
    "thread/read",
    "thread/list",
    "turn/start",
    "turn/interrupt",
    "thread/archive",
    "",
    "turn/steer",
];

/// How long the fake may take to answer everything sent so far.
const QUIET: Duration = Duration::from_secs(10);

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    })
}

fn small_value(input: &mut Input<'_>) -> Value {
    match input.below(7) {
        0 => Value::Null,
        1 => json!(input.byte() & 1 == 1),
        2 => json!(input.u32() as i64 - (1 << 31)),
        3 => json!(String::from_utf8_lossy(input.chunk(16))),
        4 => json!([small_value(input)]),
        5 => json!({"type": "text", "text": String::from_utf8_lossy(input.chunk(24))}),
        _ => json!(input.u32() as f64 / 7.0),
    }
}

#[derive(Default)]
struct Wire {
    /// Requests sent per id.
    sent: HashMap<RequestId, u32>,
    /// Answers received per id.
    answered: HashMap<RequestId, u32>,
    /// Thread and turn ids the fake reported (used in later requests).
    threads: Vec<String>,
    turns: Vec<String>,
    /// Server requests not yet answered.
    server_requests: Vec<RequestId>,
    lines: usize,
}

impl Wire {
    fn outstanding(&self) -> bool {
        self.sent
            .iter()
            .any(|(id, n)| self.answered.get(id).copied().unwrap_or(0) < *n)
    }

    fn note_sent_line(&mut self, line: &[u8]) {
        for part in line.split(|b| *b == b'\n') {
            if let Ok(Message::Request(r)) = decode_line(part.strip_suffix(b"\r").unwrap_or(part)) {
                *self.sent.entry(r.id).or_insert(0) += 1;
            }
        }
    }

    fn received(&mut self, line: &[u8]) {
        self.lines += 1;
        let message = decode_line(line).unwrap_or_else(|e| {
            panic!(
                "the fake wrote a line that is not a message ({e}): {:?}",
                String::from_utf8_lossy(line)
            )
        });
        match &message {
            Message::Response(r) => {
                self.answer(&r.id);
                collect_ids(&r.result, &mut self.threads, &mut self.turns);
            }
            Message::Error(e) => match &e.id {
                Some(id) => self.answer(id),
                None => panic!("the fake answered with an error for no id: {message:?}"),
            },
            Message::Notification(n) => {
                if let Some(params) = &n.params {
                    collect_ids(params, &mut self.threads, &mut self.turns);
                }
            }
            Message::Request(r) => self.server_requests.push(r.id.clone()),
        }
    }

    fn answer(&mut self, id: &RequestId) {
        let sent = self.sent.get(id).copied().unwrap_or(0);
        let answered = self.answered.entry(id.clone()).or_insert(0);
        *answered += 1;
        assert!(
            *answered <= sent,
            "the fake answered id {id} {answered} times, but it was sent {sent} times"
        );
    }
}

fn collect_ids(value: &Value, threads: &mut Vec<String>, turns: &mut Vec<String>) {
    if let Some(id) = value.pointer("/thread/id").and_then(Value::as_str) {
        if !threads.iter().any(|t| t == id) && threads.len() < 16 {
            threads.push(id.to_string());
        }
    }
    if let Some(id) = value.pointer("/turn/id").and_then(Value::as_str) {
        if !turns.iter().any(|t| t == id) && turns.len() < 16 {
            turns.push(id.to_string());
        }
    }
}

fn request_line(input: &mut Input<'_>, wire: &Wire, next_id: &mut i64) -> Vec<u8> {
    let method = *input.pick(&METHODS);
    *next_id += 1;
    let id = if input.byte().is_multiple_of(4) {
        json!(format!("s{next_id}"))
    } else {
        json!(*next_id)
    };
    let mut params = Map::new();
    let thread = if !wire.threads.is_empty() && !input.byte().is_multiple_of(4) {
        json!(input.pick(&wire.threads))
    } else {
        small_value(input)
    };
    match method {
        "initialize" => {
            params.insert("clientInfo".into(), json!({"name": "fuzz", "version": "0"}));
            if input.byte() & 1 == 1 {
                params.insert(
                    "capabilities".into(),
                    json!({"experimentalApi": input.byte() & 1 == 1}),
                );
            }
        }
        "turn/start" => {
            params.insert("threadId".into(), thread);
            params.insert(
                "input".into(),
                json!([{"type": "text", "text": String::from_utf8_lossy(input.chunk(32))}]),
            );
        }
        "turn/interrupt" => {
            params.insert("threadId".into(), thread);
            let turn = if !wire.turns.is_empty() {
                json!(input.pick(&wire.turns))
            } else {
                small_value(input)
            };
            params.insert("turnId".into(), turn);
        }
        "thread/start" | "thread/list" => {}
        _ => {
            params.insert("threadId".into(), thread);
        }
    }
    // Arbitrary extra members, sometimes in place of the right ones.
    for _ in 0..input.below(3) {
        let key = *input.pick(&[
            "excludeTurns",
            "includeTurns",
            "historyMode",
            "cwd",
            "limit",
            "cursor",
            "threadId",
            "developerInstructions",
        ]);
        params.insert(key.into(), small_value(input));
    }
    let params = if input.byte().is_multiple_of(8) {
        small_value(input)
    } else {
        Value::Object(params)
    };
    let mut line = json!({"id": id, "method": method, "params": params}).to_string();
    line.push('\n');
    line.into_bytes()
}

/// Runs one input.
pub fn run(data: &[u8]) {
    watch_panics();
    let mut input = Input::new(data);
    let profile = *input.pick(&Profile::ALL);
    let handshake = !input.byte().is_multiple_of(8);
    runtime().block_on(async move {
        let (stream, handle) = FakeAppServer::builder()
            .profile(profile)
            .spawn_in_process()
            .expect("spawn the fake");
        let (read, mut write) = tokio::io::split(stream);
        let mut reader = BufReader::new(read);
        let mut wire = Wire::default();
        let mut next_id = 0i64;
        let mut line = Vec::new();
        let mut ended = false;

        let mut script: Vec<Vec<u8>> = Vec::new();
        if handshake {
            script.push(
                br#"{"id":0,"method":"initialize","params":{"clientInfo":{"name":"fuzz","version":"0"},"capabilities":{"experimentalApi":true}}}
{"method":"initialized"}
"#
                .to_vec(),
            );
        }
        let mut steps = 0;
        loop {
            let bytes = if let Some(first) = script.pop() {
                first
            } else {
                if input.is_empty() || steps >= 32 {
                    break;
                }
                steps += 1;
                match input.below(8) {
                    0..=3 => request_line(&mut input, &wire, &mut next_id),
                    4 => {
                        let mut raw = input.chunk(300).to_vec();
                        raw.push(b'\n');
                        raw
                    }
                    5 => {
                        let method = *input.pick(&["initialized", "turn/completed", "x"]);
                        format!("{}\n", json!({"method": method, "params": small_value(&mut input)}))
                            .into_bytes()
                    }
                    6 => {
                        let id = wire
                            .server_requests
                            .pop()
                            .map(|id| serde_json::to_value(id).unwrap_or(Value::Null))
                            .unwrap_or_else(|| json!(input.u16()));
                        let line = if input.byte() & 1 == 0 {
                            json!({"id": id, "result": {"decision": *input.pick(&["decline", "accept", "cancel", ""])}})
                        } else {
                            json!({"id": id, "error": {"code": -32601, "message": "no"}})
                        };
                        format!("{line}\n").into_bytes()
                    }
                    _ => {
                        ended = true;
                        break;
                    }
                }
            };
            wire.note_sent_line(&bytes);
            if write.write_all(&bytes).await.is_err() {
                panic!("the fake stopped reading its input");
            }
            let _ = write.flush().await;
            // Read until everything sent so far is answered.
            let quiet = tokio::time::Instant::now() + QUIET;
            while wire.outstanding() {
                line.clear();
                match tokio::time::timeout_at(quiet, reader.read_until(b'\n', &mut line)).await {
                    Err(_) => panic!(
                        "the fake left requests unanswered for {QUIET:?}: sent {:?}, answered {:?}",
                        wire.sent, wire.answered
                    ),
                    Ok(Err(e)) => panic!("reading the fake failed: {e}"),
                    Ok(Ok(0)) => panic!("the fake ended its output while requests were pending"),
                    Ok(Ok(_)) => {
                        let l = line.strip_suffix(b"\n").unwrap_or(&line);
                        wire.received(l);
                    }
                }
            }
        }
        let _ = ended;
        // End of input: the fake must flush and end its output.
        let _ = write.shutdown().await;
        drop(write);
        let deadline = tokio::time::Instant::now() + QUIET;
        loop {
            line.clear();
            match tokio::time::timeout_at(deadline, reader.read_until(b'\n', &mut line)).await {
                Err(_) => panic!("the fake did not end its output after its input ended"),
                Ok(Err(e)) => panic!("reading the fake failed: {e}"),
                Ok(Ok(0)) => break,
                Ok(Ok(_)) => {
                    let l = line.strip_suffix(b"\n").unwrap_or(&line);
                    wire.received(l);
                }
            }
        }
        assert!(
            !wire.outstanding(),
            "requests left unanswered at the end: sent {:?}, answered {:?}",
            wire.sent,
            wire.answered
        );
        handle.kill().await;
    });
    assert!(!panicked(), "a task of the fake panicked");
}
