//! Target `runtime_hostile`: the runtime (client + agent) driven by a scripted server that
//! emits valid-but-hostile messages and arbitrary bytes: wrong ids, duplicated responses,
//! responses to requests never sent, errors of every kind, notifications for unknown threads
//! and turns, turns that never complete or complete as failed, huge lines, garbage, server
//! requests, floods, stalls, a server that stops reading, a hang-up.
//!
//! One input in eight is instead the server's entire output, arbitrary bytes written in
//! arbitrary pieces (the client must answer, or fail typed, and never hang).
//!
//! The store starts with a committed turn (2 rows on `thr_old`, a host key). The agent opens
//! up to two codex sessions (the second resumes the first's thread) and runs one turn on each. Time is virtual (tokio's paused clock),
//! so stalls cost nothing. Properties:
//! - The host never hangs: everything ends within a bound derived from the timeouts.
//! - A binding is published only for a turn that completed: every published report names a
//!   `(thread, turn)` for which the server sent `turn/completed` with status `completed`;
//!   the final binding is the last published thread, or the original one, or none after a
//!   fallback (never some other thread).
//! - Committed rows are never lost or duplicated: the store holds the 2 original rows and
//!   then exactly the rows of the reported turns, in order; the host key survives.
//! - The fallback notice is emitted exactly once per fallback, and only a lost thread (gone,
//!   incompatible, unreadable) falls back: a temporary failure never gives a thread up.
//! - No panic on any task.
#![allow(dead_code, unreachable_pub)]

use rethread_store::Unpoisoned;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rethread_protocol::codec::decode_line;
use rethread_protocol::{Message, RequestId};
use rethread_runtime::{
    AppServerClient, BinderOptions, ClientOptions, OpenOutcome, Publication, SessionBinder,
    StatusKind, StatusRail, TurnReport, RESUME_FALLBACK_NOTICE,
};
use rethread_store::{BindingStore, TurnCommit};
use serde_json::{json, Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::fuzz::input::{panicked, watch_panics, Input};

/// The line limit of the client under test.
pub const MAX_LINE: usize = 2048;
const SESSION: &str = "s";
const OLD_THREAD: &str = "thr_old";
/// The bound on the whole run, in virtual time.
const HANG_BOUND: Duration = Duration::from_secs(300);

const ERRORS: [(i64, &str); 10] = [
    (-32600, "no rollout found for thread id thr_old"),
    (-32600, "thread thr_old already has an active writer"),
    (-32001, "Server overloaded; retry later."),
    (
        -32600,
        "Invalid request: excludeTurns requires experimentalApi capability",
    ),
    (-32601, "paginated_threads is not supported by this release"),
    (-32603, "failed to read thread thr_old"),
    (-32603, "internal error"),
    (-32600, "invalid thread id"),
    (7, ""),
    // An I/O error on codex's side: temporary, never a lost thread.
    (
        -32603,
        "failed to read thread thr_old: Permission denied (os error 13)",
    ),
];

/// What the scripted server did that the properties need.
#[derive(Debug, Default)]
struct ServerLog {
    /// `(thread, turn)` pairs announced as completed successfully.
    completed: HashSet<(String, String)>,
}

struct Server<'a> {
    input: Input<'a>,
    reader: BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>,
    writer: Option<tokio::io::WriteHalf<tokio::io::DuplexStream>>,
    log: Arc<Mutex<ServerLog>>,
    current: Option<(RequestId, String, Value)>,
    last_line: Option<Vec<u8>>,
    thread: String,
    turn: String,
    next_server_id: i64,
    next_turn: u32,
}

impl Server<'_> {
    async fn send(&mut self, line: Vec<u8>) {
        let Some(writer) = self.writer.as_mut() else {
            return;
        };
        let mut bytes = line.clone();
        bytes.push(b'\n');
        // A write the client does not read within a while is given up (the script goes on).
        let _ = tokio::time::timeout(Duration::from_secs(30), writer.write_all(&bytes)).await;
        self.last_line = Some(line);
    }

    async fn send_json(&mut self, value: Value) {
        self.send(value.to_string().into_bytes()).await;
    }

    async fn recv(&mut self) {
        let mut line = Vec::new();
        match tokio::time::timeout(
            Duration::from_secs(3),
            self.reader.read_until(b'\n', &mut line),
        )
        .await
        {
            Ok(Ok(n)) if n > 0 => {
                let line = line.strip_suffix(b"\n").unwrap_or(&line);
                let message = decode_line(line).unwrap_or_else(|e| {
                    panic!(
                        "the client wrote a line that is not a message ({e}): {:?}",
                        String::from_utf8_lossy(line)
                    )
                });
                if let Message::Request(r) = message {
                    let params = r.params.unwrap_or(Value::Null);
                    if let Some(t) = params.get("threadId").and_then(Value::as_str) {
                        self.thread = t.to_string();
                    }
                    self.current = Some((r.id, r.method, params));
                }
            }
            _ => {}
        }
    }

    fn thread_choice(&mut self) -> String {
        match self.input.below(6) {
            0 => "thr_unknown".to_string(),
            1 => OLD_THREAD.to_string(),
            _ => self.thread.clone(),
        }
    }

    fn turn_choice(&mut self) -> String {
        match self.input.below(5) {
            0 => "turn_other".to_string(),
            _ => self.turn.clone(),
        }
    }

    /// A plausible result for `method`.
    fn result_for(&mut self, method: &str, params: &Value) -> Value {
        match method {
            "initialize" => json!({"userAgent": "hostile/0.0.1"}),
            "thread/start" => {
                let id = match self.input.below(8) {
                    0 => OLD_THREAD.to_string(),
                    1 => String::new(),
                    n => format!("thr_new{}", n % 3),
                };
                self.thread = id.clone();
                json!({"thread": {"id": id, "historyMode": "paginated", "turns": []}, "model": "m"})
            }
            "thread/resume" => {
                let id = params
                    .get("threadId")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                json!({"thread": {"id": id, "turns": []}})
            }
            "turn/start" => {
                self.next_turn += 1;
                self.turn = format!("turn_{}", self.next_turn);
                json!({"turn": {"id": self.turn, "status": "inProgress", "items": []}})
            }
            "turn/interrupt" => json!({}),
            _ => json!(null),
        }
    }

    async fn step(&mut self) -> bool {
        match self.input.below(16) {
            0..=2 => self.recv().await,
            3 | 4 => {
                if let Some((id, method, params)) = self.current.take() {
                    let result = self.result_for(&method, &params);
                    self.send_json(json!({"id": id, "result": result})).await;
                }
            }
            5 => {
                if let Some((id, _, _)) = self.current.take() {
                    let (code, message) = *self.input.pick(&ERRORS);
                    self.send_json(json!({"id": id, "error": {"code": code, "message": message}}))
                        .await;
                }
            }
            6 => {
                // A response to a wrong id: the next one, a string, or one never sent.
                let (id, method, params) = self.current.clone().unwrap_or((
                    RequestId::Integer(0),
                    "turn/start".into(),
                    Value::Null,
                ));
                let wrong = match (self.input.below(4), &id) {
                    (0, RequestId::Integer(n)) => json!(n + 1),
                    (1, RequestId::Integer(n)) => json!(n - 1),
                    (2, _) => json!(format!("{id}")),
                    _ => json!(987_654),
                };
                let result = self.result_for(&method, &params);
                self.send_json(json!({"id": wrong, "result": result})).await;
            }
            7 => {
                if let Some(line) = self.last_line.clone() {
                    self.send(line).await;
                }
            }
            8 | 9 => {
                let thread = self.thread_choice();
                let turn = self.turn_choice();
                let notification = match self.input.below(8) {
                    0 => {
                        json!({"method": "turn/started", "params": {"threadId": thread, "turn": {"id": turn, "status": "inProgress"}}})
                    }
                    1 | 2 => {
                        let text = String::from_utf8_lossy(self.input.chunk(40)).into_owned();
                        json!({"method": "item/completed", "params": {"threadId": thread, "turnId": turn, "item": {"type": "agentMessage", "id": "m1", "text": text}}})
                    }
                    3 => {
                        json!({"method": "item/agentMessage/delta", "params": {"threadId": thread, "turnId": turn, "itemId": "m1", "delta": "d"}})
                    }
                    4 => {
                        json!({"method": "error", "params": {"threadId": thread, "turnId": turn, "error": {"message": "boom"}, "willRetry": false}})
                    }
                    5 => {
                        json!({"method": "warning", "params": {"message": "careful", "threadId": if self.input.byte() & 1 == 0 { Value::Null } else { json!(thread) }}})
                    }
                    _ => {
                        let status = *self.input.pick(&[
                            "completed",
                            "completed",
                            "failed",
                            "interrupted",
                            "inProgress",
                            "weird",
                        ]);
                        if status == "completed" {
                            self.log
                                .lock()
                                .unpoisoned()
                                .completed
                                .insert((thread.clone(), turn.clone()));
                        }
                        let items = if self.input.byte() & 1 == 0 {
                            json!([])
                        } else {
                            json!([{"type": "agentMessage", "id": "m2", "text": "on completion"}])
                        };
                        json!({"method": "turn/completed", "params": {"threadId": thread, "turn": {"id": turn, "status": status, "items": items, "error": {"message": "why"}}}})
                    }
                };
                self.send_json(notification).await;
            }
            10 => {
                // A huge line: past the client's limit, or just within it.
                let over = self.input.byte() & 1 == 0;
                let thread = self.thread.clone();
                let turn = self.turn.clone();
                let mut message = json!({"method": "item/completed", "params": {"threadId": thread, "turnId": turn, "item": {"type": "agentMessage", "id": "big", "text": ""}}});
                let base = message.to_string().len();
                let size = if over {
                    MAX_LINE + 1 + self.input.below(4 * MAX_LINE)
                } else {
                    MAX_LINE
                };
                message["params"]["item"]["text"] = json!("x".repeat(size.saturating_sub(base)));
                self.send_json(message).await;
            }
            11 => {
                let mut raw = self.input.chunk(64).to_vec();
                raw.retain(|b| *b != b'\n');
                self.send(raw).await;
            }
            12 => {
                self.next_server_id += 1;
                let id = self.next_server_id;
                let method = *self.input.pick(&[
                    "item/commandExecution/requestApproval",
                    "item/fileChange/requestApproval",
                    "item/tool/call",
                    "account/chatgptAuthTokens/refresh",
                ]);
                let thread = self.thread.clone();
                self.send_json(json!({"id": id, "method": method, "params": {"threadId": thread, "turnId": "x", "itemId": "i"}}))
                    .await;
            }
            13 => {
                let ms = *self.input.pick(&[10u64, 500, 2_000, 20_000]);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            14 => {
                // A flood: notifications for a thread nobody subscribed to, or server requests.
                let n = 1 + self.input.below(1024);
                let requests = self.input.byte() & 1 == 1;
                for i in 0..n {
                    if requests {
                        self.next_server_id += 1;
                        let id = self.next_server_id;
                        self.send_json(json!({"id": id, "method": "item/commandExecution/requestApproval", "params": {"threadId": "thr_unknown"}}))
                            .await;
                    } else {
                        self.send_json(json!({"method": "item/agentMessage/delta", "params": {"threadId": "thr_unknown", "turnId": "t", "itemId": "i", "delta": i.to_string()}}))
                            .await;
                    }
                }
            }
            _ => return false,
        }
        true
    }
}

/// What the host side saw.
#[derive(Debug, Default)]
struct HostLog {
    opens: Vec<OpenOutcome>,
    reports: Vec<TurnReport>,
}

async fn host(
    client_read: tokio::io::ReadHalf<tokio::io::DuplexStream>,
    client_write: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    store: BindingStore,
    rail: StatusRail,
) -> HostLog {
    let mut log = HostLog::default();
    let options = ClientOptions::default()
        .request_timeout(Duration::from_secs(1))
        .max_line_length(MAX_LINE)
        .max_pending_requests(4)
        .notification_buffer(4)
        .max_bad_lines(3);
    let client = match AppServerClient::builder()
        .options(options)
        .rail(rail.clone())
        .connect(client_read, client_write)
        .await
    {
        Ok(client) => client,
        Err(_) => return log,
    };
    let options = BinderOptions::default()
        .codex_home(None)
        .transient_retries(1)
        .retry_backoff(Duration::from_millis(10))
        .turn_timeout(Duration::from_secs(5));
    let mut agent = SessionBinder::new(SESSION, store, rail).with_options(options);
    for _ in 0..2 {
        let mut session = match agent.open(&client).await {
            Ok(session) => session,
            Err(_) => continue,
        };
        log.opens.push(session.outcome().clone());
        if let Ok(report) = session.run_turn("hello").await {
            log.reports.push(report);
        }
    }
    log
}

/// What one run came to (for tests that check the seeds reach deep states).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// How each opened codex session was opened (`resumed`, `started`, `fell_back`).
    pub opens: Vec<&'static str>,
    /// The thread of each published turn.
    pub published: Vec<String>,
}

/// Runs one input.
pub fn run(data: &[u8]) {
    run_outcome(data);
}

/// Runs one input and reports what happened.
pub fn run_outcome(data: &[u8]) -> Outcome {
    watch_panics();
    let mut input = Input::new(data);
    let bound = !input.byte().is_multiple_of(4);
    let deaf_after_script = input.byte().is_multiple_of(4);
    // One input in eight is not a script but the server's whole output, byte for byte.
    let raw_output = input.byte() % 8 == 7;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    let outcome = runtime.block_on(async move {
        let store: BindingStore = BindingStore::memory();
        let original_rows = vec![
            json!({"role": "user", "text": "before"}),
            json!({"role": "assistant", "text": "kept"}),
        ];
        if bound {
            store
                .commit_turn(TurnCommit::new(SESSION, OLD_THREAD, original_rows.clone()))
                .await
                .expect("seed commit");
        }
        let mut patch = Map::new();
        patch.insert("host".into(), json!("keep"));
        store
            .patch_config(SESSION, patch, None)
            .await
            .expect("seed patch");

        let (client_end, server_end) = tokio::io::duplex(16 * 1024);
        let (client_read, client_write) = tokio::io::split(client_end);
        let (server_read, server_write) = tokio::io::split(server_end);
        let log = Arc::new(Mutex::new(ServerLog::default()));
        let (rail, recorded) = StatusRail::recording();

        let server_log = log.clone();
        let server = async move {
            let mut server = Server {
                input,
                reader: BufReader::new(server_read),
                writer: Some(server_write),
                log: server_log,
                current: None,
                last_line: None,
                thread: String::new(),
                turn: String::new(),
                next_server_id: 1000,
                next_turn: 0,
            };
            if raw_output {
                let bytes = server.input.rest();
                let mut at = 0;
                while at < bytes.len() {
                    // Arbitrary split points: the first byte of each piece sets its length.
                    let len = 1 + bytes[at] as usize * 4;
                    let end = (at + len).min(bytes.len());
                    if let Some(writer) = server.writer.as_mut() {
                        let _ = writer.write_all(&bytes[at..end]).await;
                    }
                    at = end;
                    tokio::task::yield_now().await;
                }
            }
            let mut steps = 0;
            while !server.input.is_empty() && steps < 200 {
                steps += 1;
                if !server.step().await {
                    // Hang up.
                    server.writer = None;
                    break;
                }
            }
            // The script is over: keep the connection open and either keep reading (a server
            // that stalls) or stop reading too (a server that is wedged).
            if !deaf_after_script {
                let mut sink = Vec::new();
                while server
                    .reader
                    .read_until(b'\n', &mut sink)
                    .await
                    .unwrap_or(0)
                    > 0
                {
                    sink.clear();
                }
            } else {
                std::future::pending::<()>().await;
            }
        };
        let started = tokio::time::Instant::now();
        let host = host(client_read, client_write, store.clone(), rail);
        let host_log = tokio::select! {
            log = tokio::time::timeout(HANG_BOUND, host) => log.unwrap_or_else(|_| {
                panic!("the host did not finish within {HANG_BOUND:?} of virtual time")
            }),
            _ = server => unreachable!("the scripted server never ends by itself"),
        };
        let _elapsed = started.elapsed();

        // Rows: the originals, then exactly the rows of the reported turns, in order.
        let rows: Vec<Value> = store
            .all_rows(SESSION)
            .await
            .expect("rows")
            .into_iter()
            .map(|r| r.body)
            .collect();
        let mut expected: Vec<Value> = if bound { original_rows } else { Vec::new() };
        for report in &host_log.reports {
            if report.publication != Publication::NotDurable {
                expected.extend(report.rows.iter().cloned());
            }
        }
        assert_eq!(
            rows, expected,
            "transcript rows lost, duplicated or invented"
        );

        // Publication only for completed turns.
        let completed = log.lock().unpoisoned().completed.clone();
        for report in &host_log.reports {
            assert!(
                completed.contains(&(report.thread_id.clone(), report.turn_id.clone())),
                "turn {} on {} was reported although the server never completed it: {report:?}",
                report.turn_id,
                report.thread_id
            );
        }
        let record = store
            .session(SESSION)
            .await
            .expect("read")
            .expect("session");
        assert_eq!(
            record.model_config.get("host"),
            Some(&json!("keep")),
            "the host's own model_config key was lost"
        );
        let binding = record.binding().map(|b| b.thread_id.clone());
        let last_published = host_log
            .reports
            .iter()
            .rev()
            .find(|r| r.publication == Publication::Published)
            .map(|r| r.thread_id.clone());
        let fell_back = host_log
            .opens
            .iter()
            .any(|o| matches!(o, OpenOutcome::FellBack { .. }));
        match (&last_published, &binding) {
            (Some(p), Some(b)) => assert_eq!(p, b, "the binding is not the last published thread"),
            // Published, then lost at a later open (the server said it was gone): given up.
            (Some(p), None) => assert!(
                record.retired_threads.contains(p),
                "thread {p} was published but the binding is gone"
            ),
            (None, Some(b)) => assert!(
                bound && b == OLD_THREAD,
                "binding {b} appeared without a published turn"
            ),
            (None, None) => assert!(
                !bound || fell_back || record.retired_threads.iter().any(|t| t == OLD_THREAD),
                "the original binding vanished without a fallback"
            ),
        }
        // Only a definitive loss falls back.
        for open in &host_log.opens {
            if let OpenOutcome::FellBack { reason, .. } = open {
                assert!(
                    reason.thread_is_lost(),
                    "a temporary failure ({reason}) gave the thread up"
                );
            }
        }
        // One notice per fallback.
        let notices = recorded
            .messages(StatusKind::Lifecycle)
            .iter()
            .filter(|m| m.as_str() == RESUME_FALLBACK_NOTICE)
            .count();
        let fallbacks = host_log
            .opens
            .iter()
            .filter(|o| matches!(o, OpenOutcome::FellBack { .. }))
            .count();
        assert!(
            notices >= fallbacks && notices <= fallbacks + 1,
            "{notices} fallback notices for {fallbacks} fallbacks"
        );
        Outcome {
            opens: host_log.opens.iter().map(OpenOutcome::as_str).collect(),
            published: host_log
                .reports
                .iter()
                .filter(|r| r.publication == Publication::Published)
                .map(|r| r.thread_id.clone())
                .collect(),
        }
    });
    drop(runtime);
    assert!(!panicked(), "a task panicked");
    outcome
}

/// Step codes of the scripted server, for writing seeds ([`honest_script`]).
pub mod step {
    /// Read the next client message.
    pub const RECV: u8 = 0;
    /// Answer the current request correctly.
    pub const ANSWER: u8 = 3;
    /// Answer the current request with an error.
    pub const ERROR: u8 = 5;
    /// Send a notification.
    pub const NOTIFY: u8 = 8;
}

/// A seed: a well-behaved server (as codex behaves, recorded in `docs/design.md`) for a
/// session that is bound (resume) or not, optionally losing the thread (`gone`), running one
/// turn per opened session with `reply` as the agent's text.
pub fn honest_script(bound: bool, gone: bool, reply: &[u8]) -> Vec<u8> {
    use crate::fuzz::input::Encoder;
    let mut e = Encoder::default();
    e.byte(if bound { 1 } else { 0 }).byte(1).byte(0);
    // initialize, then the `initialized` notification.
    e.byte(step::RECV).byte(step::ANSWER).byte(step::RECV);
    for round in 0..2 {
        e.byte(step::RECV);
        if round == 0 && bound && gone {
            // thread/resume -> "no rollout found", then thread/start.
            e.byte(step::ERROR).byte(0).byte(step::RECV);
        }
        // After round 0 the session is bound to the thread its turn published: the second
        // open resumes it.
        if round == 1 || (bound && !gone) {
            e.byte(step::ANSWER);
        } else {
            // thread/start answered with thr_new{2}.
            e.byte(step::ANSWER).byte(2);
        }
        // turn/start, item/completed, turn/completed(completed).
        e.byte(step::RECV).byte(step::ANSWER);
        e.byte(step::NOTIFY)
            .byte(2)
            .byte(1)
            .byte(1)
            .chunk(reply, 40);
        e.byte(step::NOTIFY).byte(2).byte(1).byte(7).byte(0).byte(0);
    }
    e.out
}
