//! One `rethread app-server` host of the restart harness, and the small JSON-RPC client that
//! drives it as an app-server client would: `initialize`, `initialized`, `thread/start`, then
//! turns (`turn/start`, waiting for `turn/completed`), then end of input.
//!
//! The host runs `fake-codex` for the session named by `RETHREAD_SESSION`, in a process group
//! of its own, so one signal reaches the host and its codex; or it is killed alone (SIGKILL to
//! its pid), after which no process of its group (its codex) may be left running. The client runs on a thread of
//! its own and writes down everything it was told, with times; the harness judges it after
//! the host ended.

use rethread_store::Unpoisoned;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::host::{self, Binaries};

/// The `warning` the proxy sends when another process took the session's lease.
pub(crate) const LEASE_LOST: &str = "rethread lost this session to another process";
/// The start of the `warning` the proxy sends when a turn's commit failed.
pub(crate) const NOT_RECORDED: &str = "rethread could not record this turn";

/// How long the client waits for one message: longer than any stop the harness makes.
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(60);

/// Milliseconds since the Unix epoch (the fake's event log uses the same clock).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What one host is asked to do.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) store_url: String,
    pub(crate) session: String,
    /// `RETHREAD_LEASE_TTL`, seconds.
    pub(crate) lease_ttl: f64,
    /// `RETHREAD_SESSION_WAIT`, seconds.
    pub(crate) session_wait: f64,
    pub(crate) codex_home: PathBuf,
    /// The fake's event log for this host (removed before it starts).
    pub(crate) event_log: PathBuf,
    /// The fake's fault script (inline JSON).
    pub(crate) faults: String,
    /// The messages of its turns, in order.
    pub(crate) messages: Vec<String>,
}

/// A warning the client got, with when.
#[derive(Debug, Clone)]
pub(crate) struct Warning {
    pub(crate) message: String,
    pub(crate) at_ms: u64,
}

/// A turn the client asked for.
#[derive(Debug, Clone)]
pub(crate) struct Turn {
    pub(crate) message: String,
    pub(crate) thread: String,
    pub(crate) sent_ms: u64,
    /// `turn/completed` arrived: its status and when.
    pub(crate) completed: Option<(String, u64)>,
}

/// Everything the client saw.
#[derive(Debug, Default, Clone)]
pub(crate) struct Seen {
    /// The `thread/start` answer: the thread, or the error's code and message.
    pub(crate) start: Option<Result<String, (i64, String)>>,
    pub(crate) warnings: Vec<Warning>,
    pub(crate) turns: Vec<Turn>,
    /// Why the client stopped before its script ended (end of output, a timeout).
    pub(crate) cut_short: Option<String>,
}

impl Seen {
    /// The warnings whose message starts with `prefix`.
    pub(crate) fn warned(&self, prefix: &str) -> Vec<&Warning> {
        self.warnings
            .iter()
            .filter(|w| w.message.starts_with(prefix))
            .collect()
    }
}

/// Set once the harness sent SIGCONT to a stopped host: the client then makes sure one turn
/// is sent after it (a host that continued must show whether it still records: a turn that
/// merely completed after the SIGCONT may have been committed before the SIGSTOP).
#[derive(Debug, Default)]
pub(crate) struct Gate {
    continued_ms: Mutex<Option<u64>>,
    changed: Condvar,
}

impl Gate {
    pub(crate) fn open(&self, at_ms: u64) {
        *self.continued_ms.lock().unpoisoned() = Some(at_ms);
        self.changed.notify_all();
    }

    fn wait(&self) -> u64 {
        let mut guard = self.continued_ms.lock().unpoisoned();
        loop {
            if let Some(at) = *guard {
                return at;
            }
            guard = self.changed.wait(guard).unpoisoned();
        }
    }
}

/// A running host with its client.
pub(crate) struct Running {
    /// The host's first message: names it in the harness's reports.
    label: String,
    child: Child,
    pub(crate) spawned_ms: u64,
    client: Option<std::thread::JoinHandle<Seen>>,
    stderr: Option<std::thread::JoinHandle<String>>,
    /// It was sent SIGKILL to its pid alone ([`Running::kill_alone`]).
    killed_alone: bool,
}

/// How a host ended.
#[derive(Debug)]
pub(crate) struct Ended {
    /// The host's first message.
    pub(crate) label: String,
    pub(crate) status: ExitStatus,
    pub(crate) seen: Seen,
    pub(crate) stderr: String,
    pub(crate) spawned_ms: u64,
    /// The fake's events: `(unix ms, event)`.
    pub(crate) events: Vec<(u64, String)>,
    /// A host killed alone: how long after it was reaped the last other process of its group
    /// (its codex) was gone.
    pub(crate) codex_gone: Option<Duration>,
}

impl Ended {
    /// The exit code, or `None` when a signal ended the host.
    pub(crate) fn code(&self) -> Option<i32> {
        if self.status.signal().is_some() {
            None
        } else {
            self.status.code()
        }
    }

    /// Milliseconds from the spawn to the fake's first event (codex starts only once the
    /// session's lease is held), if it started.
    pub(crate) fn lease_ms(&self) -> Option<u64> {
        self.events
            .first()
            .map(|(at, _)| at.saturating_sub(self.spawned_ms))
    }
}

/// Starts `spec`'s host and its client. With a `gate`, the client waits at the end of its
/// script until the gate opens, then runs one more turn unless one was sent after it.
pub(crate) fn spawn(
    binaries: &Binaries,
    spec: &Spec,
    gate: Option<Arc<Gate>>,
) -> Result<Running, String> {
    let _ = std::fs::remove_file(&spec.event_log);
    let mut command = Command::new(&binaries.rethread);
    command
        .arg("--store")
        .arg(&spec.store_url)
        .arg("--codex-bin")
        .arg(&binaries.fake_codex)
        .arg("app-server")
        .env("RETHREAD_SESSION", &spec.session)
        .env("RETHREAD_LEASE_TTL", spec.lease_ttl.to_string())
        .env("RETHREAD_SESSION_WAIT", spec.session_wait.to_string())
        .env("CODEX_HOME", &spec.codex_home)
        .env("FAKE_CODEX_EVENT_LOG", &spec.event_log)
        .env("FAKE_CODEX_FAULTS", &spec.faults)
        .env("RUST_LOG", "error")
        .env_remove("RETHREAD_STORE")
        .env_remove("RETHREAD_CODEX_BIN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, led by the host: one signal reaches the host and its codex.
        .process_group(0);
    let spawned_ms = now_ms();
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binaries.rethread.display()))?;
    let stdin = child.stdin.take().ok_or("no stdin")?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut err = child.stderr.take().ok_or("no stderr")?;
    let (lines, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let value = serde_json::from_str(&line).unwrap_or(Value::String(line));
            if lines.send((value, now_ms())).is_err() {
                break;
            }
        }
    });
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = err.read_to_string(&mut text);
        text
    });
    let messages = spec.messages.clone();
    let client = std::thread::spawn(move || {
        let mut client = Client {
            stdin: Some(stdin),
            rx,
            next_id: 0,
            seen: Seen::default(),
        };
        if let Err(why) = client.script(&messages, gate.as_deref()) {
            client.seen.cut_short = Some(why);
        }
        // End of input: the host's clean exit.
        client.stdin = None;
        client.seen
    });
    Ok(Running {
        label: spec.messages.first().cloned().unwrap_or_default(),
        child,
        spawned_ms,
        client: Some(client),
        stderr: Some(stderr),
        killed_alone: false,
    })
}

impl Running {
    /// Sends `signal` to the host's process group, if the host is still running.
    pub(crate) fn signal(&mut self, signal: i32) -> Result<bool, String> {
        self.send(signal, true)
    }

    /// Sends SIGKILL to the host's pid alone, not its group (as a supervisor or the OOM killer
    /// does), if the host is still running: [`Running::wait`] then waits for its codex to go.
    pub(crate) fn kill_alone(&mut self) -> Result<bool, String> {
        let sent = self.send(libc::SIGKILL, false)?;
        self.killed_alone |= sent;
        Ok(sent)
    }

    fn send(&mut self, signal: i32, group: bool) -> Result<bool, String> {
        if self
            .child
            .try_wait()
            .map_err(|e| format!("cannot poll the host: {e}"))?
            .is_some()
        {
            return Ok(false);
        }
        let pid = i32::try_from(self.child.id()).map_err(|_| "pid out of range".to_string())?;
        // SAFETY: `kill` has no memory effects; the pid (and the group it leads) is the
        // unreaped child's own, so it cannot have been reused.
        unsafe {
            libc::kill(if group { -pid } else { pid }, signal);
        }
        Ok(true)
    }

    /// Waits for the host and its client to end; for a host killed alone, then until no other
    /// process of its group is left ([`host::wait_until_group_gone`]: past its bound, the
    /// group is killed and this fails).
    pub(crate) fn wait(mut self, event_log: &Path) -> Result<Ended, String> {
        // Reaped first: codex's time to go counts from the host's death.
        let status = self
            .child
            .wait()
            .map_err(|e| format!("cannot wait for the host: {e}"))?;
        let codex_gone = if self.killed_alone {
            Some(host::wait_until_group_gone(self.child.id())?)
        } else {
            None
        };
        let seen = self
            .client
            .take()
            .map(|c| c.join().unwrap_or_default())
            .unwrap_or_default();
        let stderr = self
            .stderr
            .take()
            .map(|s| s.join().unwrap_or_default())
            .unwrap_or_default();
        Ok(Ended {
            label: std::mem::take(&mut self.label),
            status,
            seen,
            stderr,
            spawned_ms: self.spawned_ms,
            events: read_events(event_log),
            codex_gone,
        })
    }
}

impl Drop for Running {
    /// A host left behind by a failed check (stopped by SIGSTOP, say) is killed with its
    /// codex, so that it holds no lease, lock or connection after the harness.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.signal(libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// The fake's event log: `<unix ms> <event>` lines.
pub(crate) fn read_events(path: &Path) -> Vec<(u64, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (ms, event) = line.split_once(' ')?;
            Some((ms.parse().ok()?, event.to_string()))
        })
        .collect()
}

struct Client {
    stdin: Option<ChildStdin>,
    rx: Receiver<(Value, u64)>,
    next_id: i64,
    seen: Seen,
}

impl Client {
    fn script(&mut self, messages: &[String], gate: Option<&Gate>) -> Result<(), String> {
        let init = json!({"clientInfo": {"name": "rethread-restarts", "version": "0"}});
        let answer = self.request("initialize", init)?;
        if answer.get("error").is_some() {
            return Err(format!("initialize refused: {answer}"));
        }
        self.send(&json!({"method": "initialized"}))?;
        let answer = self.request("thread/start", json!({"cwd": "/tmp"}))?;
        let thread = match answer["result"]["thread"]["id"].as_str() {
            Some(thread) => thread.to_string(),
            None => {
                let error = &answer["error"];
                let refusal = (
                    error["code"].as_i64().unwrap_or_default(),
                    error["message"].as_str().unwrap_or_default().to_string(),
                );
                self.seen.start = Some(Err(refusal));
                return Ok(());
            }
        };
        self.seen.start = Some(Ok(thread.clone()));
        for message in messages {
            self.turn(&thread, message)?;
        }
        if let Some(gate) = gate {
            let continued = gate.wait();
            let sent_after = self.seen.turns.iter().any(|t| t.sent_ms >= continued);
            if !sent_after {
                let last = messages.last().cloned().unwrap_or_default();
                self.turn(&thread, &format!("{last} (after SIGCONT)"))?;
            }
        }
        Ok(())
    }

    /// `turn/start`, then everything up to its `turn/completed`.
    fn turn(&mut self, thread: &str, message: &str) -> Result<(), String> {
        let params = json!({"threadId": thread, "input": [{"type": "text", "text": message}]});
        // Written down before it is sent: a host stopped meanwhile may still have run it.
        self.seen.turns.push(Turn {
            message: message.to_string(),
            thread: thread.to_string(),
            sent_ms: now_ms(),
            completed: None,
        });
        let answer = self.request("turn/start", params)?;
        let Some(turn) = answer["result"]["turn"]["id"].as_str().map(str::to_string) else {
            return Err(format!("turn/start refused: {answer}"));
        };
        loop {
            let (message, at) = self.next()?;
            if message["method"] == "turn/completed" && message["params"]["turn"]["id"] == turn {
                let status = message["params"]["turn"]["status"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                if let Some(last) = self.seen.turns.last_mut() {
                    last.completed = Some((status, at));
                }
                return Ok(());
            }
        }
    }

    fn send(&mut self, message: &Value) -> Result<(), String> {
        let stdin = self.stdin.as_mut().ok_or("input closed")?;
        let mut line = message.to_string();
        line.push('\n');
        stdin
            .write_all(line.as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("cannot write to the host: {e}"))
    }

    fn request(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"id": id, "method": method, "params": params}))?;
        loop {
            let (message, _) = self.next()?;
            if message["id"] == id && message.get("method").is_none() {
                return Ok(message);
            }
        }
    }

    /// The next message; warnings are written down on the way.
    fn next(&mut self) -> Result<(Value, u64), String> {
        let started = Instant::now();
        let (message, at) = match self.rx.recv_timeout(MESSAGE_TIMEOUT) {
            Ok(received) => received,
            Err(RecvTimeoutError::Timeout) => {
                return Err(format!("no message for {:?}", started.elapsed()))
            }
            Err(RecvTimeoutError::Disconnected) => return Err("end of output".to_string()),
        };
        if message["method"] == "warning" {
            self.seen.warnings.push(Warning {
                message: message["params"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                at_ms: at,
            });
        }
        Ok((message, at))
    }
}
