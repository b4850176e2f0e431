//! The parity suite: each scenario runs against the fake (in-process) and against the real
//! codex (the `current` profile against the current and the previous release, `release-n`
//! against the floor; see `rethread_testkit::releases`), and the observable wire results must be identical: method
//! sequences, error codes and messages (ids and paths normalized), `historyMode` values, and
//! whether the model's next request contains the earlier turn after a process restart.
//!
//! Without the real binaries the fake side still runs (and checks what it can on its own);
//! with `RETHREAD_REQUIRE_REAL_CODEX=1` or `CI=true` a missing binary fails the test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rethread_fake_appserver::{
    AnswerShape, FakeAppServer, FakeHandle, Fault, FaultScript, ModelRequest, Profile,
};
use rethread_testkit::real::{
    ask_for_approvals, codex_or_skip, error_of, thread_id, CodexHome, WirePeer,
};
use rethread_testkit::responses::{ConversationMessage, ResponsesStandIn};
use rethread_testkit::{recent_releases, FLOOR};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};

type Peer = WirePeer<Box<dyn AsyncRead + Unpin + Send>, Box<dyn AsyncWrite + Unpin + Send>>;

/// What a scenario runs against: a fake profile or a real binary.
#[derive(Debug, Clone)]
enum Target {
    /// The in-process fake.
    Fake(Profile),
    /// A real codex binary.
    Real(PathBuf),
    /// The `fake-codex` binary, as separate processes.
    FakeBinary(Profile),
}

impl Target {
    /// The program and the arguments after `app-server`, for the process targets.
    fn command(&self) -> Option<(PathBuf, Vec<String>)> {
        match self {
            Target::Fake(_) => None,
            Target::Real(binary) => Some((binary.clone(), Vec::new())),
            Target::FakeBinary(profile) => Some((
                PathBuf::from(env!("CARGO_BIN_EXE_fake-codex")),
                vec!["--profile".to_string(), profile.name().to_string()],
            )),
        }
    }
}

/// The methods whose order is compared (the rest is codex's incidental chatter).
const COMPARED_METHODS: [&str; 7] = [
    "thread/started",
    "thread/status/changed",
    "turn/started",
    "item/started",
    "item/completed",
    "thread/tokenUsage/updated",
    "turn/completed",
];

/// One scenario's world: the model stand-in (for the real codex), the fakes spawned, the homes.
struct Lab {
    model: ResponsesStandIn,
    fakes: Vec<FakeHandle>,
    homes: Vec<CodexHome>,
    log: Vec<String>,
    /// The home of the most recently spawned process.
    last_home: Option<PathBuf>,
    /// Model replies take this long (0: immediate).
    slow_model_ms: u64,
    /// The first turn asks for an approval.
    approval: bool,
    /// How the model delivers its answers (the stand-in for the real codex, the fake's model).
    answer: AnswerShape,
}

struct Proc {
    peer: Peer,
    child: Option<tokio::process::Child>,
    fake: Option<FakeHandle>,
}

impl Proc {
    async fn req(&mut self, method: &str, params: Value) -> Value {
        self.peer
            .request(method, Some(params))
            .await
            .expect("request")
    }

    /// Closes stdin and waits for the process to exit (codex's polite shutdown).
    async fn close(mut self) {
        self.peer.close_writer().await;
        if let Some(mut child) = self.child.take() {
            if tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
        if let Some(fake) = self.fake.take() {
            for _ in 0..200 {
                if !fake.is_running() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            fake.kill().await;
        }
    }

    /// Kills the process like a crash.
    async fn kill(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
        if let Some(fake) = self.fake.take() {
            fake.kill().await;
        }
    }
}

impl Lab {
    fn new() -> Lab {
        Lab {
            model: ResponsesStandIn::start().unwrap(),
            fakes: Vec::new(),
            homes: Vec::new(),
            log: Vec::new(),
            last_home: None,
            slow_model_ms: 0,
            approval: false,
            answer: AnswerShape::Whole,
        }
    }

    /// Sets how the model delivers its answers, for every target.
    fn answer(&mut self, shape: AnswerShape) {
        self.answer = shape;
        self.model.set_stream_deltas(shape == AnswerShape::Streamed);
    }

    fn new_home(&mut self) -> PathBuf {
        let home = CodexHome::new(&self.model).unwrap();
        let path = home.path().to_path_buf();
        self.homes.push(home);
        path
    }

    /// Makes the model slow (for every target), so turns can be interrupted.
    fn slow_model(&mut self, millis: u64) {
        self.slow_model_ms = millis;
        self.model.set_delay(Duration::from_millis(millis));
    }

    /// Makes the first turn ask the client to approve a command: the fake by its fault, the
    /// real codex because the model asks for an escalated command under
    /// `approval_policy = "on-request"`.
    fn approval_on_first_turn(&mut self, home: &Path) {
        self.approval = true;
        self.model.push_escalated_command("echo approved");
        ask_for_approvals(home).unwrap();
    }

    fn faults(&self) -> FaultScript {
        let mut faults = Vec::new();
        if self.slow_model_ms > 0 {
            faults.push(Fault::SlowTurn {
                millis: self.slow_model_ms,
            });
        }
        if self.approval {
            faults.push(Fault::Approval { turn: 1 });
        }
        FaultScript::of(faults)
    }

    async fn spawn(&mut self, target: &Target, home: &Path, experimental: bool) -> Proc {
        self.last_home = Some(home.to_path_buf());
        let faults = self.faults();
        let mut proc = match target {
            Target::Fake(profile) => {
                let (client, handle) = FakeAppServer::builder()
                    .profile(*profile)
                    .faults(faults)
                    .answer(self.answer)
                    .codex_home(home)
                    .spawn_in_process()
                    .unwrap();
                self.fakes.push(handle.clone());
                let (read, write) = tokio::io::split(client);
                Proc {
                    peer: WirePeer::new(Box::new(read), Box::new(write)),
                    child: None,
                    fake: Some(handle),
                }
            }
            process => {
                let (binary, args) = process.command().unwrap();
                let stderr = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(home.join("app-server-stderr.log"))
                    .unwrap();
                let mut child = tokio::process::Command::new(binary)
                    .arg("app-server")
                    .args(args)
                    .env("CODEX_HOME", home)
                    .env("FAKE_CODEX_FAULTS", serde_json::to_string(&faults).unwrap())
                    .env(
                        "FAKE_CODEX_ANSWER",
                        match self.answer {
                            AnswerShape::Whole => "whole",
                            _ => "streamed",
                        },
                    )
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::from(stderr))
                    .kill_on_drop(true)
                    .spawn()
                    .unwrap();
                let stdin = child.stdin.take().unwrap();
                let stdout = child.stdout.take().unwrap();
                Proc {
                    peer: WirePeer::new(Box::new(stdout), Box::new(stdin)),
                    child: Some(child),
                    fake: None,
                }
            }
        };
        proc.peer
            .initialize(experimental)
            .await
            .expect("initialize");
        proc
    }

    /// The conversation of the most recent model request.
    fn last_conversation(&self, target: &Target) -> Vec<ConversationMessage> {
        match target {
            Target::Real(_) => self
                .model
                .model_requests()
                .last()
                .map(|r| r.conversation())
                .unwrap_or_default(),
            Target::FakeBinary(_) => {
                let home = self.last_home.as_ref().expect("a process was spawned");
                let log = std::fs::read_to_string(home.join("fake-model-requests.jsonl"))
                    .unwrap_or_default();
                log.lines()
                    .last()
                    .map(|line| {
                        serde_json::from_str::<ModelRequest>(line)
                            .unwrap()
                            .conversation
                    })
                    .unwrap_or_default()
            }
            Target::Fake(_) => self
                .fakes
                .iter()
                .flat_map(|f| f.model_requests())
                .last()
                .map(|r| r.conversation)
                .unwrap_or_default(),
        }
    }

    /// Notes under `label` whether the model's last conversation on `target` held `needle`.
    fn note_model_saw(&mut self, label: &str, target: &Target, needle: &str) {
        let saw = self
            .last_conversation(target)
            .iter()
            .any(|m| m.text.contains(needle));
        self.note(label, saw.to_string());
    }

    fn note(&mut self, label: &str, value: impl Into<String>) {
        let value = normalize(
            &value.into(),
            &self
                .homes
                .iter()
                .map(|h| h.path().to_path_buf())
                .collect::<Vec<_>>(),
        );
        self.log.push(format!("{label}: {value}"));
    }

    fn note_response(&mut self, label: &str, response: &Value) {
        self.note(label, summary(response));
    }
}

/// A one-line summary of a response: error code and message, or the thread's mode and turns.
fn summary(response: &Value) -> String {
    if let Some((code, message)) = error_of(response) {
        return format!("ERR {code} {message}");
    }
    let result = &response["result"];
    if let Some(thread) = result.get("thread") {
        let mode = thread
            .get("historyMode")
            .and_then(Value::as_str)
            .unwrap_or("<absent>");
        let turns = thread
            .get("turns")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        return format!("OK mode={mode} turns={turns}");
    }
    "OK".to_string()
}

/// Replaces homes, rollout paths and UUIDs, and cuts codex's long method list.
fn normalize(text: &str, homes: &[PathBuf]) -> String {
    let mut out = text.to_string();
    for home in homes {
        out = out.replace(&home.display().to_string(), "<home>");
    }
    // Rollout file paths carry a timestamp: `<home>/sessions/.../rollout-<ts>-<id>.jsonl`.
    while let Some(start) = out.find("<home>/sessions/") {
        let Some(len) = out[start..].find(".jsonl") else {
            break;
        };
        out.replace_range(start..start + len + ".jsonl".len(), "<rollout>");
    }
    let bytes: Vec<char> = out.chars().collect();
    let mut result = String::new();
    let mut i = 0;
    while i < bytes.len() {
        if i + 36 <= bytes.len() && is_uuid(&bytes[i..i + 36]) {
            result.push_str("<id>");
            i += 36;
        } else {
            result.push(bytes[i]);
            i += 1;
        }
    }
    if let Some(cut) = result.find("expected one of") {
        result.truncate(cut + "expected one of".len());
    }
    result
}

fn is_uuid(chars: &[char]) -> bool {
    chars.iter().enumerate().all(|(i, c)| match i {
        8 | 13 | 18 | 23 => *c == '-',
        _ => c.is_ascii_hexdigit(),
    })
}

/// The compared notification methods of a turn, its status and the agent's text.
async fn turn(lab: &mut Lab, proc: &mut Proc, label: &str, id: &str, text: &str) {
    let run = proc.peer.run_turn(id, text, None).await.expect("turn");
    let methods: Vec<String> = run
        .methods()
        .into_iter()
        .filter(|m| COMPARED_METHODS.contains(&m.as_str()))
        .collect();
    lab.note(&format!("{label} turn/start"), summary(&run.response));
    lab.note(&format!("{label} methods"), methods.join(","));
    lab.note(
        &format!("{label} status"),
        format!("{:?} {:?}", run.status(), run.agent_text()),
    );
}

fn rollout_of(home: &Path, id: &str) -> PathBuf {
    fn scan(dir: &Path, suffix: &str) -> Option<PathBuf> {
        for entry in std::fs::read_dir(dir).ok()?.flatten() {
            let path = entry.path();
            if path.is_dir() {
                if let Some(found) = scan(&path, suffix) {
                    return Some(found);
                }
            } else if path.to_string_lossy().ends_with(suffix) {
                return Some(path);
            }
        }
        None
    }
    scan(&home.join("sessions"), &format!("-{id}.jsonl"))
        .unwrap_or_else(|| panic!("no rollout for {id}"))
}

// ---------------------------------------------------------------------------------------------
// Scenarios. Each takes the target(s) and returns the normalized observation log.

async fn handshake_and_errors(target: Target) -> Vec<String> {
    let mut lab = Lab::new();
    let home = lab.new_home();
    let mut p = lab.spawn(&target, &home, false).await;
    // `spawn` initialized; a second initialize is refused.
    let again = p
        .req(
            "initialize",
            json!({"clientInfo": {"name": "x", "version": "0"}}),
        )
        .await;
    lab.note_response("initialize again", &again);
    let bogus = p.req("bogus/method", json!({})).await;
    lab.note_response("unknown method", &bogus);
    let started = p.req("thread/start", json!({"cwd": "/tmp"})).await;
    lab.note_response("thread/start", &started);
    let id = thread_id(&started);
    let with_mode = p
        .req(
            "thread/start",
            json!({"cwd": "/tmp", "historyMode": "legacy"}),
        )
        .await;
    lab.note_response(
        "thread/start historyMode without experimentalApi",
        &with_mode,
    );
    let weird = p
        .req(
            "thread/start",
            json!({"cwd": "/tmp", "historyMode": "weird"}),
        )
        .await;
    lab.note_response("thread/start unknown historyMode", &weird);
    let no_params = p.peer.request("thread/start", None).await.unwrap();
    lab.note_response("thread/start without params", &no_params);
    let no_id = p.req("thread/resume", json!({})).await;
    lab.note_response("thread/resume without threadId", &no_id);
    let read = p.req("thread/read", json!({"threadId": id})).await;
    lab.note_response("thread/read fresh", &read);
    let interrupt = p
        .req("turn/interrupt", json!({"threadId": id, "turnId": "t"}))
        .await;
    lab.note_response("turn/interrupt idle", &interrupt);
    let unknown_turn = p
        .req("turn/start", json!({"threadId": "01a229cb-9f9d-72d3-94ca-4aaee32530ff", "input": [{"type": "text", "text": "x"}]}))
        .await;
    lab.note_response("turn/start unknown thread", &unknown_turn);
    let resume_unmaterialized = p.req("thread/resume", json!({"threadId": id})).await;
    lab.note_response("thread/resume before first turn", &resume_unmaterialized);
    p.close().await;

    // Before `initialize`.
    let mut raw = lab.spawn_uninitialized(&target, &home).await;
    let early = raw.req("thread/list", json!({})).await;
    lab.note_response("thread/list before initialize", &early);
    let early_bogus = raw.req("bogus/method", json!({})).await;
    lab.note_response("unknown method before initialize", &early_bogus);
    // A line that is not JSON gets no answer; the next request is served.
    raw.peer.send_raw(b"this is not json\n").await.unwrap();
    let after_garbage = raw
        .req(
            "initialize",
            json!({"clientInfo": {"name": "x", "version": "0"}}),
        )
        .await;
    lab.note(
        "initialize after a garbage line",
        if after_garbage.get("result").is_some() {
            "OK"
        } else {
            "ERR"
        },
    );
    raw.close().await;

    // With experimentalApi: explicit modes.
    let mut p = lab.spawn(&target, &home, true).await;
    for mode in ["legacy", "paginated"] {
        let started = p
            .req("thread/start", json!({"cwd": "/tmp", "historyMode": mode}))
            .await;
        lab.note_response(
            &format!("thread/start historyMode={mode} (experimental)"),
            &started,
        );
    }
    p.close().await;
    lab.log
}

impl Lab {
    async fn spawn_uninitialized(&mut self, target: &Target, home: &Path) -> Proc {
        // Spawn, then undo nothing: `spawn` always initializes, so build the process by hand.
        match target {
            Target::Fake(profile) => {
                let (client, handle) = FakeAppServer::builder()
                    .profile(*profile)
                    .codex_home(home)
                    .spawn_in_process()
                    .unwrap();
                self.fakes.push(handle.clone());
                let (read, write) = tokio::io::split(client);
                Proc {
                    peer: WirePeer::new(Box::new(read), Box::new(write)),
                    child: None,
                    fake: Some(handle),
                }
            }
            process => {
                let (binary, args) = process.command().unwrap();
                let mut child = tokio::process::Command::new(binary)
                    .arg("app-server")
                    .args(args)
                    .env("CODEX_HOME", home)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .kill_on_drop(true)
                    .spawn()
                    .unwrap();
                let stdin = child.stdin.take().unwrap();
                let stdout = child.stdout.take().unwrap();
                Proc {
                    peer: WirePeer::new(Box::new(stdout), Box::new(stdin)),
                    child: Some(child),
                    fake: None,
                }
            }
        }
    }
}

async fn memory_across_restart(target: Target) -> Vec<String> {
    let mut lab = Lab::new();
    let home = lab.new_home();
    let mut p = lab.spawn(&target, &home, false).await;
    let seed = "Seeded context: the password is swordfish.";
    let started = p
        .req(
            "thread/start",
            json!({"cwd": "/tmp", "developerInstructions": seed}),
        )
        .await;
    lab.note_response("thread/start", &started);
    let id = thread_id(&started);
    turn(&mut lab, &mut p, "first", &id, "remember the word zebra").await;
    lab.note_model_saw("model saw the developer instructions", &target, "swordfish");
    p.close().await;

    let mut p = lab.spawn(&target, &home, false).await;
    let excluded = p
        .req(
            "thread/resume",
            json!({"threadId": id, "excludeTurns": true}),
        )
        .await;
    lab.note_response("thread/resume excludeTurns (no experimentalApi)", &excluded);
    let resumed = p.req("thread/resume", json!({"threadId": id})).await;
    lab.note_response("thread/resume", &resumed);
    turn(&mut lab, &mut p, "second", &id, "which word?").await;
    let conversation = lab.last_conversation(&target);
    let remembered = conversation
        .iter()
        .any(|m| m.text.contains("remember the word zebra"));
    lab.note(
        "model saw the first turn after restart",
        remembered.to_string(),
    );
    let seeded = conversation.iter().any(|m| m.text.contains("swordfish"));
    lab.note(
        "model saw the developer instructions after restart",
        seeded.to_string(),
    );
    let list = p.req("thread/list", json!({})).await;
    let modes: Vec<String> = list["result"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            t.get("historyMode")
                .and_then(Value::as_str)
                .unwrap_or("<absent>")
                .to_string()
        })
        .collect();
    lab.note("thread/list modes", modes.join(","));
    let read = p
        .req(
            "thread/read",
            json!({"threadId": id, "includeTurns": false}),
        )
        .await;
    lab.note_response("thread/read", &read);
    let read_turns = p
        .req("thread/read", json!({"threadId": id, "includeTurns": true}))
        .await;
    lab.note_response("thread/read includeTurns", &read_turns);
    p.close().await;

    // excludeTurns with the capability.
    let mut p = lab.spawn(&target, &home, true).await;
    let excluded = p
        .req(
            "thread/resume",
            json!({"threadId": id, "excludeTurns": true}),
        )
        .await;
    lab.note_response("thread/resume excludeTurns (experimentalApi)", &excluded);
    p.close().await;
    lab.log
}

async fn gone_threads(target: Target) -> Vec<String> {
    let mut lab = Lab::new();
    let home = lab.new_home();
    let other_home = lab.new_home();
    let mut p = lab.spawn(&target, &home, false).await;
    let never = thread_id(&p.req("thread/start", json!({"cwd": "/tmp"})).await);
    let ran = thread_id(&p.req("thread/start", json!({"cwd": "/tmp"})).await);
    turn(&mut lab, &mut p, "ran", &ran, "hello").await;
    p.close().await;

    let mut p = lab.spawn(&target, &home, false).await;
    for (label, id) in [
        ("no turn", never.as_str()),
        ("unknown id", "01a229cb-9f9d-72d3-94ca-4aaee32530ff"),
        ("malformed id", "not-a-uuid"),
    ] {
        let resumed = p.req("thread/resume", json!({"threadId": id})).await;
        lab.note_response(&format!("resume {label}"), &resumed);
        let read = p.req("thread/read", json!({"threadId": id})).await;
        lab.note_response(&format!("read {label}"), &read);
    }
    p.close().await;

    let mut p = lab.spawn(&target, &other_home, false).await;
    let elsewhere = p.req("thread/resume", json!({"threadId": ran})).await;
    lab.note_response("resume in a different CODEX_HOME", &elsewhere);
    p.close().await;

    // The rollout deleted under a server that has the thread loaded.
    let mut p = lab.spawn(&target, &home, false).await;
    let loaded = p.req("thread/resume", json!({"threadId": ran})).await;
    lab.note_response("resume before the rollout is deleted", &loaded);
    std::fs::remove_file(rollout_of(&home, &ran)).unwrap();
    let after = p.req("thread/resume", json!({"threadId": ran})).await;
    lab.note_response(
        "resume of a loaded thread whose rollout was deleted",
        &after,
    );
    p.close().await;
    lab.log
}

async fn damaged_rollouts(target: Target) -> Vec<String> {
    let mut lab = Lab::new();
    let home = lab.new_home();
    let labels = [
        "intact",
        "empty",
        "garbage",
        "torn tail",
        "deleted",
        "unknown mode in rollout",
        "unknown mode in sqlite",
        "moved to another day",
    ];
    let mut ids = BTreeMap::new();
    let mut p = lab.spawn(&target, &home, false).await;
    for label in labels {
        let id = thread_id(&p.req("thread/start", json!({"cwd": "/tmp"})).await);
        let run = p
            .peer
            .run_turn(&id, &format!("hello {label}"), None)
            .await
            .unwrap();
        assert_eq!(run.status().as_deref(), Some("completed"));
        ids.insert(label, id);
    }
    p.close().await;
    for (label, id) in &ids {
        let path = rollout_of(&home, id);
        match *label {
            "empty" => std::fs::write(&path, b"").unwrap(),
            "garbage" => std::fs::write(&path, b"garbage{{{ not json\n").unwrap(),
            "torn tail" => {
                use std::io::Write;
                let mut file = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .unwrap();
                file.write_all(
                    br#"{"timestamp":"2026-11-30T00:12:20.274Z","ordinal":99,"type":"resp"#,
                )
                .unwrap();
            }
            "deleted" => std::fs::remove_file(&path).unwrap(),
            "moved to another day" => {
                let day = home.join("sessions/2020/01/01");
                std::fs::create_dir_all(&day).unwrap();
                std::fs::rename(&path, day.join(path.file_name().unwrap())).unwrap();
            }
            "unknown mode in rollout" => {
                let text = std::fs::read_to_string(&path).unwrap();
                let (first, rest) = text.split_once('\n').unwrap();
                let mut meta: Value = serde_json::from_str(first).unwrap();
                meta["payload"]["history_mode"] = json!("segmented");
                std::fs::write(&path, format!("{meta}\n{rest}")).unwrap();
            }
            "unknown mode in sqlite" => {
                // The index row: codex's table (a real codex's home) or the fake's.
                let db = rusqlite::Connection::open(home.join("state_5.sqlite")).unwrap();
                let codex_made_it: bool = db
                    .query_row(
                        "SELECT count(*) > 0 FROM sqlite_master WHERE name = '_sqlx_migrations'",
                        [],
                        |row| row.get(0),
                    )
                    .unwrap();
                let table = if codex_made_it {
                    "threads"
                } else {
                    "rethread_fake_threads"
                };
                let n = db
                    .execute(
                        &format!("UPDATE {table} SET history_mode = 'segmented' WHERE id = ?1"),
                        [id],
                    )
                    .unwrap();
                assert_eq!(n, 1);
            }
            _ => {}
        }
    }
    let mut p = lab.spawn(&target, &home, true).await;
    let list = p.req("thread/list", json!({})).await;
    let mut listed: Vec<String> = list["result"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let id = t["id"].as_str().unwrap();
            let label = ids
                .iter()
                .find(|(_, v)| v.as_str() == id)
                .map_or("?", |(k, _)| k);
            format!(
                "{label}={}",
                t.get("historyMode")
                    .and_then(Value::as_str)
                    .unwrap_or("<absent>")
            )
        })
        .collect();
    listed.sort();
    lab.note("thread/list", listed.join(","));
    for (label, id) in &ids {
        let read = p.req("thread/read", json!({"threadId": id})).await;
        lab.note_response(&format!("read {label}"), &read);
        let resumed = p.req("thread/resume", json!({"threadId": id})).await;
        lab.note_response(&format!("resume {label}"), &resumed);
    }
    // The torn tail kept the earlier turn: it runs a second turn with memory.
    let torn = ids["torn tail"].clone();
    turn(&mut lab, &mut p, "after torn tail", &torn, "again").await;
    lab.note_model_saw(
        "model saw the turn before the torn tail",
        &target,
        "hello torn tail",
    );
    p.close().await;
    lab.log
}

async fn active_writer(target: Target) -> Vec<String> {
    let mut lab = Lab::new();
    let home = lab.new_home();
    let mut first = lab.spawn(&target, &home, false).await;
    let id = thread_id(&first.req("thread/start", json!({"cwd": "/tmp"})).await);
    turn(&mut lab, &mut first, "holder", &id, "hold this").await;
    let mut second = lab.spawn(&target, &home, false).await;
    let busy = second.req("thread/resume", json!({"threadId": id})).await;
    lab.note_response("resume while another process holds it", &busy);
    let read = second
        .req("thread/read", json!({"threadId": id, "includeTurns": true}))
        .await;
    lab.note_response("read with turns while another process holds it", &read);
    first.kill().await;
    let after = second.req("thread/resume", json!({"threadId": id})).await;
    lab.note_response("resume after the holder was killed", &after);
    second.close().await;
    lab.log
}

async fn declined_approval(target: Target) -> Vec<String> {
    let mut lab = Lab::new();
    let home = lab.new_home();
    lab.approval_on_first_turn(&home);
    let mut p = lab.spawn(&target, &home, false).await;
    let id = thread_id(&p.req("thread/start", json!({"cwd": "/tmp"})).await);
    let started = p
        .req(
            "turn/start",
            json!({"threadId": id, "input": [{"type": "text", "text": "run it"}]}),
        )
        .await;
    lab.note_response("turn/start", &started);
    let turn_id = started["result"]["turn"]["id"].clone();
    let mut methods = Vec::new();
    let mut statuses = Vec::new();
    loop {
        let message = p
            .peer
            .next_message()
            .await
            .unwrap()
            .expect("turn/completed");
        let Some(method) = message.get("method").and_then(Value::as_str) else {
            continue;
        };
        if let Some(request_id) = message.get("id") {
            methods.push(format!("REQUEST {method}"));
            let params = &message["params"];
            lab.note(
                "approval request names the thread, turn and item",
                format!(
                    "{} {} {}",
                    params["threadId"] == json!(id),
                    params["turnId"] == turn_id,
                    params["itemId"].is_string()
                ),
            );
            let answer = json!({"id": request_id, "result": {"decision": "decline"}});
            p.peer.send(&answer).await.unwrap();
            continue;
        }
        // Codex races the command item's completion against the thread's status change, so
        // statuses are compared as their own sequence.
        if method == "thread/status/changed" {
            statuses.push(message["params"]["status"].to_string());
        } else if COMPARED_METHODS.contains(&method) || method == "serverRequest/resolved" {
            methods.push(method.to_string());
        }
        if method == "item/completed" && message["params"]["item"]["type"] == "commandExecution" {
            lab.note(
                "command item after the decline",
                message["params"]["item"]["status"].to_string(),
            );
        }
        if method == "turn/completed" {
            lab.note(
                "turn/completed status",
                message["params"]["turn"]["status"].to_string(),
            );
            break;
        }
    }
    lab.note("methods", methods.join(","));
    lab.note("thread statuses", statuses.join(","));
    p.close().await;
    lab.log
}

async fn interrupted_turn(target: Target) -> Vec<String> {
    let mut lab = Lab::new();
    let home = lab.new_home();
    lab.slow_model(3_000);
    let mut p = lab.spawn(&target, &home, false).await;
    let id = thread_id(&p.req("thread/start", json!({"cwd": "/tmp"})).await);
    let started = p
        .req(
            "turn/start",
            json!({"threadId": id, "input": [{"type": "text", "text": "take your time"}]}),
        )
        .await;
    lab.note_response("turn/start", &started);
    let turn_id = started["result"]["turn"]["id"].clone();
    // Interrupt once the turn has started and recorded the user's message (codex emits the
    // message's items only if the interrupt comes after that; 0.144.6 may send them before
    // `turn/started`).
    let mut seen = Vec::new();
    while !(seen.iter().any(|m: &Value| m["method"] == "turn/started")
        && seen.iter().any(|m: &Value| m["method"] == "item/completed"))
    {
        seen.push(
            p.peer
                .next_message()
                .await
                .unwrap()
                .expect("turn notifications"),
        );
    }
    let interrupted = p
        .req("turn/interrupt", json!({"threadId": id, "turnId": turn_id}))
        .await;
    lab.note_response("turn/interrupt", &interrupted);
    let rest = p.peer.wait_for("turn/completed").await.unwrap();
    seen.extend(rest.iter().cloned());
    // The turn's notifications are compared as a multiset (see above); `turn/completed` comes
    // last.
    let mut methods: Vec<String> = seen
        .iter()
        .filter_map(|m| m.get("method").and_then(Value::as_str))
        .filter(|m| COMPARED_METHODS.contains(m))
        .map(str::to_string)
        .collect();
    methods.sort();
    lab.note(
        "methods of the interrupted turn (sorted)",
        methods.join(","),
    );
    let completed = rest.last().unwrap();
    lab.note(
        "turn/completed status",
        completed["params"]["turn"]["status"].to_string(),
    );
    let other = p
        .req(
            "turn/interrupt",
            json!({"threadId": id, "turnId": "01a229cb-9f9d-72d3-94ca-4aaee32530ff"}),
        )
        .await;
    lab.note_response("turn/interrupt of another turn id", &other);
    // 0.144.6 never answers an interrupt naming the turn it already interrupted.
    p.peer.timeout = Duration::from_secs(2);
    let again = p
        .peer
        .request(
            "turn/interrupt",
            Some(json!({"threadId": id, "turnId": turn_id})),
        )
        .await;
    let again = match again {
        Ok(response) => summary(&response),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => "no answer within 2 s".to_string(),
        Err(e) => panic!("{e}"),
    };
    lab.note("turn/interrupt of the interrupted turn again", again);
    p.close().await;
    lab.log
}

/// A home written by the current release, then opened by the compatibility floor.
async fn paginated_under_release_n(writer: Target, reader: Target) -> Vec<String> {
    let mut lab = Lab::new();
    let home = lab.new_home();
    let mut p = lab.spawn(&writer, &home, true).await;
    let paginated = thread_id(&p.req("thread/start", json!({"cwd": "/tmp"})).await);
    turn(&mut lab, &mut p, "paginated", &paginated, "paged").await;
    let legacy = thread_id(
        &p.req(
            "thread/start",
            json!({"cwd": "/tmp", "historyMode": "legacy"}),
        )
        .await,
    );
    turn(&mut lab, &mut p, "legacy", &legacy, "old school").await;
    p.close().await;

    for experimental in [false, true] {
        let tag = if experimental {
            " (experimentalApi)"
        } else {
            ""
        };
        let mut p = lab.spawn(&reader, &home, experimental).await;
        let list = p.req("thread/list", json!({})).await;
        let mut modes: Vec<String> = list["result"]["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let which = if t["id"] == json!(paginated) {
                    "paginated-thread"
                } else {
                    "legacy-thread"
                };
                format!(
                    "{which}={}",
                    t.get("historyMode")
                        .and_then(Value::as_str)
                        .unwrap_or("<absent>")
                )
            })
            .collect();
        modes.sort();
        lab.note(&format!("thread/list{tag}"), modes.join(","));
        for (label, params) in [
            ("read", json!({"threadId": paginated})),
            (
                "read includeTurns=false",
                json!({"threadId": paginated, "includeTurns": false}),
            ),
            (
                "read includeTurns=true",
                json!({"threadId": paginated, "includeTurns": true}),
            ),
            (
                "resume excludeTurns",
                json!({"threadId": paginated, "excludeTurns": true}),
            ),
            ("resume", json!({"threadId": paginated})),
            ("resume legacy thread", json!({"threadId": legacy})),
        ] {
            let method = if label.starts_with("read") {
                "thread/read"
            } else {
                "thread/resume"
            };
            let response = p.req(method, params).await;
            lab.note_response(&format!("{label}{tag}"), &response);
        }
        if experimental {
            let started = p
                .req(
                    "thread/start",
                    json!({"cwd": "/tmp", "historyMode": "paginated"}),
                )
                .await;
            lab.note_response("thread/start paginated on the floor", &started);
            turn(
                &mut lab,
                &mut p,
                "legacy resumed on the floor",
                &legacy,
                "still there?",
            )
            .await;
            lab.note_model_saw(
                "floor model saw the legacy thread's turn",
                &reader,
                "old school",
            );
        }
        p.close().await;
    }
    lab.log
}

/// `thread/list` one page at a time: three threads created a second apart (0.144.6's cursor
/// has a resolution of one second), the oldest updated last.
async fn paging(target: Target) -> Vec<String> {
    let mut lab = Lab::new();
    let home = lab.new_home();
    let mut p = lab.spawn(&target, &home, false).await;
    let mut labels = BTreeMap::new();
    let mut ids = Vec::new();
    for label in ["A", "B", "C"] {
        let started = p.req("thread/start", json!({"cwd": "/tmp"})).await;
        let id = thread_id(&started);
        p.peer.run_turn(&id, label, None).await.expect("turn");
        labels.insert(id.clone(), label);
        ids.push(id);
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    // A thread without a turn has no rollout and is never listed.
    let unlisted = p.req("thread/start", json!({"cwd": "/tmp"})).await;
    labels.insert(thread_id(&unlisted), "D");
    p.peer
        .run_turn(&ids[0], "A again", None)
        .await
        .expect("turn");
    let page = |response: &Value| -> String {
        if let Some((code, message)) = error_of(response) {
            return format!("ERR {code} {message}");
        }
        let result = &response["result"];
        let data: Vec<&str> = result["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                labels
                    .get(t["id"].as_str().unwrap())
                    .copied()
                    .unwrap_or("?")
            })
            .collect();
        let kind = |v: &Value| match v {
            Value::String(_) => "string",
            Value::Null => "null",
            _ => "other",
        };
        format!(
            "[{}] next={} backwards={}",
            data.join(","),
            kind(&result["nextCursor"]),
            kind(&result["backwardsCursor"])
        )
    };
    let mut notes = Vec::new();
    for (label, params) in [
        ("default", json!({})),
        ("limit 1", json!({"limit": 1})),
        ("limit 0", json!({"limit": 0})),
        ("limit 3", json!({"limit": 3})),
        ("updated_at", json!({"sortKey": "updated_at"})),
        (
            "updated_at limit 2",
            json!({"sortKey": "updated_at", "limit": 2}),
        ),
        ("bad cursor", json!({"cursor": "garbage"})),
        ("negative limit", json!({"limit": -1})),
    ] {
        let response = p.req("thread/list", params).await;
        notes.push((format!("thread/list {label}"), page(&response)));
    }
    // Follow the cursor to the end.
    let mut cursor = Value::Null;
    for n in 1..=3 {
        let response = p
            .req("thread/list", json!({"limit": 2, "cursor": cursor}))
            .await;
        notes.push((format!("thread/list limit 2, page {n}"), page(&response)));
        cursor = response["result"]["nextCursor"].clone();
        if cursor.is_null() {
            break;
        }
    }
    for (label, value) in notes {
        lab.note(&label, value);
    }
    p.close().await;
    lab.log
}

/// The turn's notifications for each shape of model answer: text streamed in deltas (one per
/// piece the model streamed) or only the completed message (no delta).
async fn answer_shapes(target: Target) -> Vec<String> {
    let mut lab = Lab::new();
    for (label, shape) in [
        ("whole", AnswerShape::Whole),
        ("streamed", AnswerShape::Streamed),
    ] {
        lab.answer(shape);
        let home = lab.new_home();
        let mut p = lab.spawn(&target, &home, false).await;
        let id = thread_id(&p.req("thread/start", json!({"cwd": "/tmp"})).await);
        let run = p
            .peer
            .run_turn(&id, "hello there", None)
            .await
            .expect("turn");
        let methods: Vec<String> = run
            .methods()
            .into_iter()
            .filter(|m| COMPARED_METHODS.contains(&m.as_str()) || m == "item/agentMessage/delta")
            .collect();
        lab.note(&format!("{label} methods"), methods.join(","));
        let deltas: Vec<String> = run
            .messages
            .iter()
            .filter(|m| m["method"] == "item/agentMessage/delta")
            .map(|m| {
                m["params"]["delta"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        lab.note(&format!("{label} deltas"), format!("{deltas:?}"));
        lab.note(
            &format!("{label} status"),
            format!("{:?} {:?}", run.status(), run.agent_text()),
        );
        p.close().await;
    }
    lab.log
}

/// A thread moved to another home by its rollout file alone, at the same path under
/// `sessions/` (what rethread's restore writes): the home finds it, resumes it and the model
/// sees the earlier turn; `thread/read` shows its turns; nothing else of the first home goes.
async fn restored_thread(target: Target) -> Vec<String> {
    let mut lab = Lab::new();
    let home = lab.new_home();
    let elsewhere = lab.new_home();
    let mut p = lab.spawn(&target, &home, false).await;
    let id = thread_id(&p.req("thread/start", json!({"cwd": "/tmp"})).await);
    turn(&mut lab, &mut p, "first", &id, "remember the word zebra").await;
    p.close().await;
    let rollout = rollout_of(&home, &id);
    let relative = rollout.strip_prefix(&home).unwrap().to_path_buf();
    let target_path = elsewhere.join(&relative);
    std::fs::create_dir_all(target_path.parent().unwrap()).unwrap();
    std::fs::copy(&rollout, &target_path).unwrap();

    let mut p = lab.spawn(&target, &elsewhere, false).await;
    let listed = p.req("thread/list", json!({})).await;
    lab.note(
        "thread/list before the resume",
        listed["result"]["data"]
            .as_array()
            .map_or(0, Vec::len)
            .to_string(),
    );
    let resumed = p.req("thread/resume", json!({"threadId": id})).await;
    lab.note_response("thread/resume of the restored thread", &resumed);
    turn(&mut lab, &mut p, "second", &id, "which word?").await;
    lab.note_model_saw(
        "model saw the first turn in the other home",
        &target,
        "remember the word zebra",
    );
    let read = p
        .req("thread/read", json!({"threadId": id, "includeTurns": true}))
        .await;
    lab.note_response("thread/read includeTurns", &read);
    p.close().await;
    lab.note(
        "the restored file grew in place",
        (std::fs::metadata(&target_path).unwrap().len()
            > std::fs::metadata(&rollout).unwrap().len())
        .to_string(),
    );
    lab.log
}

// ---------------------------------------------------------------------------------------------
// Comparison.

fn compare(scenario: &str, fake: &[String], real: &[String], real_name: &str) {
    eprintln!("{scenario} against {real_name}:\n  {}", real.join("\n  "));
    if fake == real {
        return;
    }
    let mut report = format!("parity broken in `{scenario}` (fake vs real {real_name}):\n");
    for i in 0..fake.len().max(real.len()) {
        let f = fake.get(i).map_or("<none>", String::as_str);
        let r = real.get(i).map_or("<none>", String::as_str);
        if f != r {
            report.push_str(&format!("  fake: {f}\n  real: {r}\n"));
        }
    }
    panic!("{report}");
}

/// The releases the current profile is compared with: current and previous.
fn current_releases() -> Vec<String> {
    recent_releases()
}

/// The release the `release-n` profile is compared with: the floor.
fn floor_releases() -> Vec<String> {
    vec![FLOOR.to_string()]
}

macro_rules! parity {
    ($name:ident, $scenario:ident, $profile:expr, $versions:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let fake = $scenario(Target::Fake($profile)).await;
            let binary = $scenario(Target::FakeBinary($profile)).await;
            compare(stringify!($scenario), &fake, &binary, "fake-codex binary");
            for version in $versions {
                let Some(codex) = codex_or_skip(&version) else {
                    continue;
                };
                let real = $scenario(Target::Real(codex)).await;
                compare(stringify!($scenario), &fake, &real, &version);
            }
        }
    };
}

parity!(
    handshake_current,
    handshake_and_errors,
    Profile::Current,
    current_releases()
);
parity!(
    handshake_release_n,
    handshake_and_errors,
    Profile::ReleaseN,
    floor_releases()
);
parity!(
    memory_current,
    memory_across_restart,
    Profile::Current,
    current_releases()
);
parity!(
    memory_release_n,
    memory_across_restart,
    Profile::ReleaseN,
    floor_releases()
);
parity!(
    gone_current,
    gone_threads,
    Profile::Current,
    current_releases()
);
parity!(
    gone_release_n,
    gone_threads,
    Profile::ReleaseN,
    floor_releases()
);
parity!(
    damaged_current,
    damaged_rollouts,
    Profile::Current,
    current_releases()
);
parity!(
    damaged_release_n,
    damaged_rollouts,
    Profile::ReleaseN,
    floor_releases()
);
parity!(
    writer_current,
    active_writer,
    Profile::Current,
    current_releases()
);
parity!(
    approval_current,
    declined_approval,
    Profile::Current,
    current_releases()
);
parity!(
    approval_release_n,
    declined_approval,
    Profile::ReleaseN,
    floor_releases()
);
parity!(
    interrupt_current,
    interrupted_turn,
    Profile::Current,
    current_releases()
);
parity!(
    interrupt_release_n,
    interrupted_turn,
    Profile::ReleaseN,
    floor_releases()
);
parity!(paging_current, paging, Profile::Current, current_releases());
parity!(
    paging_release_n,
    paging,
    Profile::ReleaseN,
    floor_releases()
);
parity!(
    writer_release_n,
    active_writer,
    Profile::ReleaseN,
    floor_releases()
);
parity!(
    answer_shapes_current,
    answer_shapes,
    Profile::Current,
    current_releases()
);
parity!(
    answer_shapes_release_n,
    answer_shapes,
    Profile::ReleaseN,
    floor_releases()
);
parity!(
    restored_current,
    restored_thread,
    Profile::Current,
    current_releases()
);
parity!(
    restored_release_n,
    restored_thread,
    Profile::ReleaseN,
    floor_releases()
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paginated_threads_on_the_compatibility_floor() {
    let fake = paginated_under_release_n(
        Target::Fake(Profile::Current),
        Target::Fake(Profile::ReleaseN),
    )
    .await;
    let binary = paginated_under_release_n(
        Target::FakeBinary(Profile::Current),
        Target::FakeBinary(Profile::ReleaseN),
    )
    .await;
    compare(
        "paginated_under_release_n",
        &fake,
        &binary,
        "fake-codex binary",
    );
    for version in current_releases() {
        let (Some(current), Some(floor)) = (codex_or_skip(&version), codex_or_skip(FLOOR)) else {
            continue;
        };
        let real = paginated_under_release_n(Target::Real(current), Target::Real(floor)).await;
        compare(
            "paginated_under_release_n",
            &fake,
            &real,
            &format!("{version} -> {FLOOR}"),
        );
    }
}

/// The fake alone: the pre-history-mode profile never sends `historyMode`.
#[tokio::test]
async fn pre_history_mode_profile_has_no_history_mode() {
    let log = memory_across_restart(Target::Fake(Profile::PreHistoryMode)).await;
    assert!(
        log.iter()
            .any(|l| l == "thread/start: OK mode=<absent> turns=0"),
        "{log:#?}"
    );
    assert!(
        log.iter()
            .any(|l| l == "model saw the first turn after restart: true"),
        "{log:#?}"
    );
}
