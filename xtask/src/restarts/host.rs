//! One host process of the restart harness: `rethread chat --json`, or `rethread exec
//! --experimental-json` (the prompt on stdin, as the TypeScript SDK runs it), for one session
//! and one turn against `fake-codex`, in a process group of its own so that a SIGKILL takes
//! the host and its codex down together, as a crash of the machine's container would; or
//! the host's pid alone, as a supervisor or the OOM killer kills it, after which no process
//! of its group (its codex) may be left running.

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// The lease TTL the shipped `rethread chat` uses (`BinderOptions::default`): a restart that
/// waited for the dead holder's lease would take about this long.
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(30);

/// How long a host may wait for a busy session (`chat --wait`): longer than the TTL, so a
/// lease that is not taken over at once shows as a restart of ~30 s, not as a refusal.
const WAIT_SECS: &str = "40";

/// The two binaries a host needs.
#[derive(Debug, Clone)]
pub(crate) struct Binaries {
    /// `rethread`.
    pub(crate) rethread: PathBuf,
    /// `fake-codex`, passed as `--codex-bin`.
    pub(crate) fake_codex: PathBuf,
}

/// The kind of one-turn host process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `rethread chat --json --session S MESSAGE`.
    Chat,
    /// `RETHREAD_SESSION=S rethread exec --experimental-json`, the message on stdin.
    Exec,
}

/// The notice, as `rethread exec` says it (the TypeScript SDK returns it in `items`).
const NOTICE: &str = "Codex thread could not be resumed; starting a new one.";

/// What one host process is asked to do.
#[derive(Debug)]
pub(crate) struct HostSpec<'a> {
    pub(crate) kind: Kind,
    pub(crate) store_url: &'a str,
    pub(crate) session: &'a str,
    pub(crate) message: &'a str,
    /// The fake's `CODEX_HOME`, shared by every host of a backend run (threads survive).
    pub(crate) codex_home: &'a Path,
    /// The fake's event log for this process (removed before it starts).
    pub(crate) event_log: &'a Path,
    /// The fake's fault script (inline JSON).
    pub(crate) faults: &'a str,
}

/// How the harness stops a host: as a crash (SIGKILL), or as a terminal's Ctrl-C or a
/// supervisor's stop would (SIGINT, SIGTERM). Each goes to the host's whole process group, its
/// codex included, as a terminal or a container's stop sends it; except `KillAlone`, a
/// SIGKILL to the host's pid alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    Kill,
    KillAlone,
    Interrupt,
    Terminate,
}

/// How long the processes of a host killed alone (its codex) may take to die with it.
const CODEX_GONE_LIMIT: Duration = Duration::from_secs(5);

impl Stop {
    fn signal(self) -> i32 {
        match self {
            Stop::Kill | Stop::KillAlone => libc::SIGKILL,
            Stop::Interrupt => libc::SIGINT,
            Stop::Terminate => libc::SIGTERM,
        }
    }

    /// The exit code `chat` promises for the signal (`128 + n`); none for SIGKILL.
    fn exit_code(self) -> Option<i32> {
        match self {
            Stop::Kill | Stop::KillAlone => None,
            Stop::Interrupt | Stop::Terminate => Some(128 + self.signal()),
        }
    }
}

/// How a host process ended.
#[derive(Debug)]
pub(crate) enum Ended {
    /// It exited on its own.
    Exited {
        status: ExitStatus,
        /// Its stdout, parsed (`chat --json` prints one object), or `None` if it was not JSON.
        output: Option<Value>,
        stdout: String,
        stderr: String,
        /// From spawn to exit.
        elapsed: Duration,
    },
    /// It died of a signal (SIGKILL, or SIGINT/SIGTERM before its handlers were installed).
    Killed {
        /// What it wrote on stderr before it died (notices print there as they happen).
        stderr: String,
    },
    /// Stopped by the SIGINT or SIGTERM sent to it, it exited with `128 + n` as `chat`
    /// promises.
    Interrupted {
        /// Its stdout, parsed (`chat --json` prints one object, a failure included).
        output: Option<Value>,
        stderr: String,
    },
}

/// How far the fake got, in milliseconds after the host was spawned (from its event log).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Progress {
    /// The first `thread/resume` or `thread/start` arrived.
    pub(crate) opened_ms: Option<u64>,
    /// `turn/start` arrived.
    pub(crate) turn_ms: Option<u64>,
    /// The turn's reply was decided (the turn is done on codex's side).
    pub(crate) done_ms: Option<u64>,
    /// A host killed alone: how long after it was reaped the last other process of its group
    /// (its codex) was gone.
    pub(crate) codex_gone: Option<Duration>,
}

/// Runs one host; stops it (and its process group) as `stop` says, `delay` after the spawn, if
/// it is still running then. Returns how it ended and the fake's progress.
pub(crate) fn run(
    binaries: &Binaries,
    spec: &HostSpec<'_>,
    stop: Option<(Duration, Stop)>,
) -> Result<(Ended, Progress), String> {
    let _ = std::fs::remove_file(spec.event_log);
    let mut command = Command::new(&binaries.rethread);
    command
        .arg("--store")
        .arg(spec.store_url)
        .arg("--codex-bin")
        .arg(&binaries.fake_codex);
    match spec.kind {
        Kind::Chat => {
            command
                .args(["chat", "--json", "--wait", WAIT_SECS, "--session"])
                .arg(spec.session)
                .arg(spec.message)
                .stdin(Stdio::null());
        }
        Kind::Exec => {
            command
                .args(["exec", "--experimental-json", "--skip-git-repo-check"])
                .env("RETHREAD_SESSION", spec.session)
                .env("RETHREAD_SESSION_WAIT", WAIT_SECS)
                .stdin(Stdio::piped());
        }
    }
    command
        .env("CODEX_HOME", spec.codex_home)
        .env("FAKE_CODEX_EVENT_LOG", spec.event_log)
        .env("FAKE_CODEX_FAULTS", spec.faults)
        .env_remove("RETHREAD_STORE")
        .env_remove("RETHREAD_CODEX_BIN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, led by the host: one signal reaches the host and its codex.
        .process_group(0);
    let spawned_at = SystemTime::now();
    let started = Instant::now();
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binaries.rethread.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A host stopped before it read its prompt is not a failure of the harness.
        let _ = stdin.write_all(spec.message.as_bytes());
    }
    let mut sent = None;
    if let Some((delay, stop)) = stop {
        std::thread::sleep(delay);
        let running = child
            .try_wait()
            .map_err(|e| format!("cannot poll the host: {e}"))?
            .is_none();
        if running {
            let group = i32::try_from(child.id()).map_err(|_| "pid out of range".to_string())?;
            let target = if stop == Stop::KillAlone {
                group
            } else {
                -group
            };
            // SAFETY: `kill` has no memory effects; the group is the unreaped child's own, so
            // its id cannot have been reused.
            unsafe {
                libc::kill(target, stop.signal());
            }
            sent = Some(stop);
        }
    }
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut stdout);
    }
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    let status = child
        .wait()
        .map_err(|e| format!("cannot wait for the host: {e}"))?;
    let elapsed = started.elapsed();
    let mut progress = read_progress(spec.event_log, spawned_at);
    if sent == Some(Stop::KillAlone) {
        progress.codex_gone = Some(wait_until_group_gone(child.id())?);
    }
    let interrupted = sent
        .and_then(Stop::exit_code)
        .is_some_and(|code| status.code() == Some(code));
    let output = match spec.kind {
        Kind::Chat => serde_json::from_str(stdout.trim()).ok(),
        Kind::Exec => exec_report(&stdout, &stderr, interrupted),
    };
    let ended = if status.signal().is_some() {
        Ended::Killed { stderr }
    } else if interrupted {
        Ended::Interrupted { output, stderr }
    } else {
        Ended::Exited {
            status,
            output,
            stdout,
            stderr,
            elapsed,
        }
    };
    Ok((ended, progress))
}

/// What an exec host's JSONL says, in the shape of `chat --json`'s report, so that one set of
/// checks judges both: `thread_id` (its `thread.started`), `reply` (its agent message),
/// `notices` (its `error` items that are the notice), `outcome` (`fell_back` when it said
/// the notice, else `resumed` or `started`: the checks compare the thread with the binding
/// before), and for an interrupted host `error.kind` `interrupted` (what it said on stderr).
fn exec_report(stdout: &str, stderr: &str, interrupted: bool) -> Option<Value> {
    let events: Vec<Value> = stdout
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let notices: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "item.completed" && e["item"]["type"] == "error")
        .filter_map(|e| e["item"]["message"].as_str())
        .filter(|m| *m == NOTICE)
        .collect();
    if interrupted {
        return stderr
            .contains("interrupted by")
            .then(|| serde_json::json!({"error": {"kind": "interrupted"}, "notices": notices}));
    }
    let thread = events.iter().find(|e| e["type"] == "thread.started")?["thread_id"].clone();
    let reply = events
        .iter()
        .rev()
        .filter(|e| e["type"] == "item.completed" && e["item"]["type"] == "agent_message")
        .find_map(|e| e["item"]["text"].as_str())?;
    events.iter().find(|e| e["type"] == "turn.completed")?;
    let outcome = if notices.is_empty() {
        "resumed_or_started"
    } else {
        "fell_back"
    };
    Some(serde_json::json!({
        "thread_id": thread, "reply": reply, "notices": notices, "outcome": outcome,
    }))
}

/// Waits until no process of group `group` but zombies is left (the host was reaped): how
/// long that took. Past [`CODEX_GONE_LIMIT`] the group is killed and the check fails. Used
/// for the `app-server` hosts killed alone too (`client.rs`).
pub(crate) fn wait_until_group_gone(group: u32) -> Result<Duration, String> {
    let started = Instant::now();
    loop {
        let left = live_members(group);
        if left.is_empty() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > CODEX_GONE_LIMIT {
            // SAFETY: as in `run`; a group with live members cannot have been reused.
            unsafe {
                libc::kill(-(group as i32), libc::SIGKILL);
            }
            return Err(format!(
                "a host killed alone (SIGKILL to its pid, not its group) left its codex running \
                 after {CODEX_GONE_LIMIT:?}: {}",
                left.join("; ")
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The command lines of the live (not zombie) processes of group `group`, from `/proc`.
fn live_members(group: u32) -> Vec<String> {
    let mut left = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let dir = entry.path();
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp ...`: after the last `)`.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
        let live = fields
            .first()
            .is_some_and(|state| !matches!(*state, "Z" | "X"));
        if live && fields.get(2) == Some(&group.to_string().as_str()) {
            let cmdline = std::fs::read(dir.join("cmdline")).unwrap_or_default();
            left.push(String::from_utf8_lossy(&cmdline).replace('\0', " "));
        }
    }
    left
}

/// Reads the fake's event log (`<unix ms> <event>` lines) relative to the host's spawn.
fn read_progress(path: &Path, spawned_at: SystemTime) -> Progress {
    let base = spawned_at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut progress = Progress::default();
    let text = std::fs::read_to_string(path).unwrap_or_default();
    for line in text.lines() {
        let Some((ms, event)) = line.split_once(' ') else {
            continue;
        };
        let Ok(ms) = ms.parse::<u64>() else { continue };
        let at = Some(ms.saturating_sub(base));
        let slot = match event {
            "request thread/resume" | "request thread/start" => &mut progress.opened_ms,
            "request turn/start" => &mut progress.turn_ms,
            e if e.starts_with("turn-done ") => &mut progress.done_ms,
            _ => continue,
        };
        if slot.is_none() {
            *slot = at;
        }
    }
    progress
}

/// A small seeded generator (SplitMix64): the same seed draws the same kill points.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Uniform in `[low, high]` milliseconds.
    pub(crate) fn between_ms(&mut self, low: f64, high: f64) -> Duration {
        let high = high.max(low);
        Duration::from_secs_f64((low + (high - low) * self.unit()) / 1000.0)
    }
}
