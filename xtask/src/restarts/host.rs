//! One host process of the restart harness: `rethread chat --json` for one session and one
//! turn against `fake-codex`, in a process group of its own so that a SIGKILL takes the host
//! and its codex down together, as a crash of the machine's container would.

use std::io::Read;
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

/// What one host process is asked to do.
#[derive(Debug)]
pub(crate) struct HostSpec<'a> {
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
/// codex included, as a terminal or a container's stop sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    Kill,
    Interrupt,
    Terminate,
}

impl Stop {
    fn signal(self) -> i32 {
        match self {
            Stop::Kill => libc::SIGKILL,
            Stop::Interrupt => libc::SIGINT,
            Stop::Terminate => libc::SIGTERM,
        }
    }

    /// The exit code `chat` promises for the signal (`128 + n`); none for SIGKILL.
    fn exit_code(self) -> Option<i32> {
        match self {
            Stop::Kill => None,
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
        .arg(&binaries.fake_codex)
        .args(["chat", "--json", "--wait", WAIT_SECS, "--session"])
        .arg(spec.session)
        .arg(spec.message)
        .env("CODEX_HOME", spec.codex_home)
        .env("FAKE_CODEX_EVENT_LOG", spec.event_log)
        .env("FAKE_CODEX_FAULTS", spec.faults)
        .env_remove("RETHREAD_STORE")
        .env_remove("RETHREAD_CODEX_BIN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, led by the host: one signal reaches the host and its codex.
        .process_group(0);
    let spawned_at = SystemTime::now();
    let started = Instant::now();
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binaries.rethread.display()))?;
    let mut sent = None;
    if let Some((delay, stop)) = stop {
        std::thread::sleep(delay);
        let running = child
            .try_wait()
            .map_err(|e| format!("cannot poll the host: {e}"))?
            .is_none();
        if running {
            let group = i32::try_from(child.id()).map_err(|_| "pid out of range".to_string())?;
            // SAFETY: `kill` has no memory effects; the group is the unreaped child's own, so
            // its id cannot have been reused.
            unsafe {
                libc::kill(-group, stop.signal());
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
    let progress = read_progress(spec.event_log, spawned_at);
    let interrupted = sent
        .and_then(Stop::exit_code)
        .is_some_and(|code| status.code() == Some(code));
    let ended = if status.signal().is_some() {
        Ended::Killed { stderr }
    } else if interrupted {
        Ended::Interrupted {
            output: serde_json::from_str(stdout.trim()).ok(),
            stderr,
        }
    } else {
        Ended::Exited {
            status,
            output: serde_json::from_str(stdout.trim()).ok(),
            stdout,
            stderr,
            elapsed,
        }
    };
    Ok((ended, progress))
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
