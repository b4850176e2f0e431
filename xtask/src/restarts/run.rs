//! One backend's run: host processes for one session at a time, SIGKILLed at random points of
//! their turn, each kill followed at once by a new host for the same session, with the checks
//! of issue 12 after every process.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rethread_store::SessionRecord;
use serde_json::{json, Value};

use super::host::{self, Binaries, Ended, HostSpec, Kind, Progress, Rng, Stop, LEASE_TTL};
use super::report::{Phase, Stats};
use super::view::StoreView;

/// The notice the user must see once per thread given up (`RESUME_FALLBACK_NOTICE`).
const NOTICE: &str = "Codex thread could not be resumed; starting a new one.";
/// A restart slower than this waited for the dead holder's lease (TTL 30 s) instead of taking
/// it over at once.
const RESTART_LIMIT: Duration = Duration::from_secs(10);
/// Iterations per session: a new session keeps codex's threads (and the fake's model log) short.
const ITERATIONS_PER_SESSION: u32 = 40;
/// How often an iteration first makes the bound thread unresumable ("no rollout found").
const LOSE_CHANCE: f64 = 0.12;
/// How often a kill is followed by a second kill before a host may finish.
const DOUBLE_KILL_CHANCE: f64 = 0.25;
/// How often a host is stopped by SIGINT (a terminal's Ctrl-C) and by SIGTERM (a supervisor's
/// stop) instead of SIGKILL.
const INTERRUPT_CHANCE: f64 = 0.15;
const TERMINATE_CHANCE: f64 = 0.15;
/// How often a host is killed alone (SIGKILL to its pid, not its group, as a supervisor or the
/// OOM killer kills it): its codex must die with it.
const KILL_ALONE_CHANCE: f64 = 0.2;
/// The fake's turn in a host killed alone: longer than the harness waits for its codex to be
/// gone, so a codex left running by its host is found running.
const KILLED_ALONE_TURN_MS: u64 = 30_000;

/// What one backend run does.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// `chat` or `exec` hosts.
    pub(crate) kind: Kind,
    /// The backend's name (`sqlite`, `redb`, `postgres`).
    pub(crate) backend: &'static str,
    /// Its store URL.
    pub(crate) store_url: String,
    /// The URL host processes get: `store_url`, on PostgreSQL under the hosts' application
    /// name ([`super::view::host_store_url`]).
    pub(crate) host_store_url: String,
    /// A directory of its own (the fake's `CODEX_HOME`, event logs, an embedded store).
    pub(crate) dir: PathBuf,
    /// Sessions are named `<prefix>-<n>`.
    pub(crate) session_prefix: String,
    /// Stop after this many kills.
    pub(crate) kills: u32,
    pub(crate) seed: u64,
    /// How long each fake turn takes, so that kills land mid-turn.
    pub(crate) slow_turn_ms: u64,
}

/// Runs the plan; `Err` names the first check that failed.
pub(crate) fn execute(plan: &Plan, binaries: &Binaries) -> Result<Stats, String> {
    let tag = match plan.kind {
        Kind::Chat => "chat",
        Kind::Exec => "exec",
    };
    let view = StoreView::open(&plan.store_url, tag)?;
    let mut runner = Runner {
        plan,
        binaries,
        view,
        rng: Rng::new(plan.seed),
        lost: Vec::new(),
        sessions: Vec::new(),
        owed: 0,
        acked: Vec::new(),
        calibration: VecDeque::new(),
        stats: Stats::default(),
        messages: 0,
    };
    let started = Instant::now();
    let result = runner.run();
    runner.stats.wall = started.elapsed();
    if result.is_ok() && plan.store_url.starts_with("postgres") {
        for session in runner.sessions.clone() {
            runner.view.delete(&session)?;
        }
    }
    result.map(|()| runner.stats)
}

struct Runner<'a> {
    plan: &'a Plan,
    binaries: &'a Binaries,
    view: StoreView,
    rng: Rng,
    /// Threads made unresumable so far (every host's fake refuses to resume them).
    lost: Vec<String>,
    /// Sessions used, the current one last.
    sessions: Vec<String>,
    /// Give-up writes of the current session whose notice has not reached the user yet.
    owed: u32,
    /// Turns acknowledged to the user: (session, message).
    acked: Vec<(String, String)>,
    /// (opened, turn started, turn done, exited) in ms, of recent hosts that ran to the end.
    calibration: VecDeque<[f64; 4]>,
    stats: Stats,
    messages: u64,
}

/// How many times a `chat --json` report lists the notice.
fn notices_in(report: &Value) -> u32 {
    report["notices"].as_array().map_or(0, |n| {
        n.iter().filter(|n| n.as_str() == Some(NOTICE)).count()
    }) as u32
}

/// How many times `stderr` says the notice.
fn said_on(stderr: &str) -> u32 {
    stderr.matches(NOTICE).count() as u32
}

/// How a host ran, for the checks.
struct Outcome {
    before: Option<SessionRecord>,
    after: SessionRecord,
    ended: Ended,
    progress: Progress,
    message: String,
}

impl Runner<'_> {
    fn run(&mut self) -> Result<(), String> {
        self.new_session()?;
        // A few whole turns first, to learn how long each phase of a turn takes.
        for _ in 0..3 {
            self.host(None, false)?;
        }
        let mut iterations = 0;
        let mut reported = 0;
        while self.stats.kills() < self.plan.kills {
            if iterations > 0 && iterations % ITERATIONS_PER_SESSION == 0 {
                self.finish_session()?;
                self.new_session()?;
            }
            iterations += 1;
            self.maybe_lose_thread()?;
            let victims = if self.rng.chance(DOUBLE_KILL_CHANCE) {
                2
            } else {
                1
            };
            let mut killed = false;
            for _ in 0..victims {
                let stop = (self.kill_delay(), self.pick_stop());
                killed |= self.host(Some(stop), killed)?;
            }
            // The restart: a new host for the same session, at once.
            self.host(None, killed)?;
            if self.stats.kills() >= reported + 100 {
                reported = self.stats.kills() / 100 * 100;
                eprintln!("restarts {}: {reported} kills", self.plan.backend);
            }
        }
        self.finish_session()?;
        self.check_transcripts()
    }

    fn session(&self) -> &str {
        self.sessions.last().map_or("", String::as_str)
    }

    fn new_session(&mut self) -> Result<(), String> {
        let id = format!("{}-{}", self.plan.session_prefix, self.sessions.len());
        self.sessions.push(id);
        self.owed = 0;
        Ok(())
    }

    /// A last whole turn, after which every give-up of the session must have been told.
    fn finish_session(&mut self) -> Result<(), String> {
        self.host(None, false)?;
        if self.owed > 0 {
            return Err(format!(
                "session {}: {} fallback(s) never told (no notice in any acknowledged turn, \
                 and no unacknowledged commit)",
                self.session(),
                self.owed
            ));
        }
        Ok(())
    }

    /// Sometimes makes the bound thread unresumable from now on, as a lost rollout would.
    fn maybe_lose_thread(&mut self) -> Result<(), String> {
        let session = self.session().to_string();
        let bound = self
            .view
            .session(&session)?
            .and_then(|r| r.binding().cloned())
            .map(|b| b.thread_id);
        if let Some(thread) = bound {
            if !self.lost.contains(&thread) && self.rng.chance(LOSE_CHANCE) {
                self.lost.push(thread);
                self.stats.lost += 1;
            }
        }
        Ok(())
    }

    /// A kill point: a phase of the turn picked uniformly, then a moment inside its typical
    /// window (medians of recent whole runs). Where the kill lands is read afterwards.
    fn kill_delay(&mut self) -> Duration {
        let median = |i: usize| {
            let mut values: Vec<f64> = self.calibration.iter().map(|c| c[i]).collect();
            values.sort_by(f64::total_cmp);
            values.get(values.len() / 2).copied().unwrap_or(50.0)
        };
        let edges = [0.0, median(0), median(1), median(2), median(3)];
        let phase = (self.rng.unit() * 4.0) as usize;
        self.rng.between_ms(edges[phase], edges[phase + 1])
    }

    /// SIGKILL to the group mostly; sometimes SIGINT or SIGTERM, or SIGKILL to the host alone.
    fn pick_stop(&mut self) -> Stop {
        let draw = self.rng.unit();
        if draw < INTERRUPT_CHANCE {
            Stop::Interrupt
        } else if draw < INTERRUPT_CHANCE + TERMINATE_CHANCE {
            Stop::Terminate
        } else if draw < INTERRUPT_CHANCE + TERMINATE_CHANCE + KILL_ALONE_CHANCE {
            Stop::KillAlone
        } else {
            Stop::Kill
        }
    }

    fn faults(&self, turn_ms: u64) -> String {
        let mut faults = vec![json!({"kind": "slow_turn", "millis": turn_ms})];
        if !self.lost.is_empty() {
            faults.push(json!({"kind": "fail_resume", "thread_ids": self.lost}));
        }
        json!({ "faults": faults }).to_string()
    }

    /// Runs one host (stopped as `stop` says, if given) and checks what it left. `after_kill`:
    /// it is the restart right after a stop. Returns whether it was stopped.
    fn host(&mut self, stop: Option<(Duration, Stop)>, after_kill: bool) -> Result<bool, String> {
        self.messages += 1;
        let message = format!("{} turn {}", self.plan.backend, self.messages);
        let session = self.session().to_string();
        let before = self.view.session(&session)?;
        let turn_ms = match stop {
            Some((_, Stop::KillAlone)) => KILLED_ALONE_TURN_MS,
            _ => self.plan.slow_turn_ms,
        };
        let faults = self.faults(turn_ms);
        let event_log = self.plan.dir.join("events.log");
        let spec = HostSpec {
            kind: self.plan.kind,
            store_url: &self.plan.host_store_url,
            session: &session,
            message: &message,
            codex_home: &self.plan.dir.join("codex-home"),
            event_log: &event_log,
            faults: &faults,
        };
        let (ended, progress) = host::run(self.binaries, &spec, stop)?;
        // A COMMIT the killed host had sent may still be running in the PostgreSQL server:
        // its effects are this host's, so they must be in before the record is read.
        self.view.wait_for_hosts_gone()?;
        // A host killed early may not have created the session yet.
        let after = self
            .view
            .session(&session)?
            .unwrap_or_else(|| SessionRecord::new(session.clone(), 0));
        let outcome = Outcome {
            before,
            after,
            ended,
            progress,
            message,
        };
        let killed = matches!(
            outcome.ended,
            Ended::Killed { .. } | Ended::Interrupted { .. }
        );
        self.check(outcome, after_kill)
            .map_err(|e| format!("{} session {session}: {e}", self.plan.backend))?;
        Ok(killed)
    }

    fn check(&mut self, o: Outcome, after_kill: bool) -> Result<(), String> {
        let before_rows = o.before.as_ref().map_or(0, |r| r.row_count);
        let before_retired = o.before.as_ref().map_or(0, |r| r.retired_threads.len());
        // (4) No retired thread is ever bound.
        if let Some(binding) = o.after.binding() {
            if o.after.retired_threads.contains(&binding.thread_id) {
                return Err(format!("retired thread {} is bound", binding.thread_id));
            }
        }
        let gave_up = o.after.retired_threads.len().saturating_sub(before_retired) as u32;
        if gave_up > 1 {
            return Err(format!("{gave_up} threads retired by one host"));
        }
        let new_rows = o.after.row_count.saturating_sub(before_rows);
        if new_rows != 0 && new_rows != 2 {
            return Err(format!("one host added {new_rows} rows (a turn is 2)"));
        }
        self.stats.fallbacks += gave_up;
        self.owed += gave_up;
        match &o.ended {
            Ended::Killed { stderr } => {
                if let Some(gone) = o.progress.codex_gone {
                    self.stats.kills_alone += 1;
                    self.stats.codex_gone.push(gone);
                }
                self.check_stopped(&o, stderr, new_rows)
            }
            Ended::Interrupted { output, stderr } => {
                self.stats.interrupts += 1;
                // One JSON object that names the interrupt, with the notices said so far.
                let Some(output) = output
                    .as_ref()
                    .filter(|v| v["error"]["kind"] == "interrupted")
                else {
                    return Err(format!(
                        "an interrupted host printed no `interrupted` report: {output:?}; \
                         stderr: {}",
                        stderr.trim()
                    ));
                };
                // `chat` reports an interrupted turn as not committed: the user may retry it.
                if new_rows > 0 {
                    return Err(format!(
                        "a host reported its turn {:?} as interrupted, but committed it \
                         (a retry would add it twice)",
                        o.message
                    ));
                }
                let reported = notices_in(output);
                if reported != said_on(stderr) {
                    return Err(format!(
                        "{reported} notice(s) in the interrupted report, {} on stderr",
                        said_on(stderr)
                    ));
                }
                self.check_stopped(&o, stderr, new_rows)
            }
            Ended::Exited {
                status,
                output,
                stdout,
                stderr,
                elapsed,
            } => {
                let Some(output) = output.as_ref().filter(|_| status.success()) else {
                    return Err(format!(
                        "host exited {status} without a reply (after a kill: {after_kill}); \
                         stdout: {} stderr: {}",
                        stdout.trim(),
                        stderr.trim()
                    ));
                };
                if after_kill {
                    let elapsed = *elapsed;
                    self.stats.restarts.push(elapsed);
                    // (1) The dead holder's lease was taken over at once.
                    if elapsed >= RESTART_LIMIT {
                        return Err(format!(
                            "the restart took {elapsed:?}: it waited for the dead holder's lease \
                             (TTL {LEASE_TTL:?}) instead of taking it over"
                        ));
                    }
                } else {
                    self.stats.turns.push(*elapsed);
                }
                if let (Some(opened), Some(turn), Some(done)) =
                    (o.progress.opened_ms, o.progress.turn_ms, o.progress.done_ms)
                {
                    let exit = elapsed.as_secs_f64() * 1000.0;
                    self.calibration
                        .push_back([opened as f64, turn as f64, done as f64, exit]);
                    if self.calibration.len() > 32 {
                        self.calibration.pop_front();
                    }
                }
                self.check_acknowledged(&o, output, stderr, new_rows, gave_up)
            }
        }
    }

    /// A host that was stopped (killed, or interrupted and exited as promised): where the stop
    /// landed, and (5) for a commit it made without acknowledging it.
    fn check_stopped(&mut self, o: &Outcome, stderr: &str, new_rows: u64) -> Result<(), String> {
        let phase = if new_rows > 0 {
            Phase::AfterCommit
        } else if o.progress.done_ms.is_some() {
            Phase::Commit
        } else if o.progress.turn_ms.is_some() {
            Phase::MidTurn
        } else if o.progress.opened_ms.is_some() {
            Phase::Open
        } else {
            Phase::BeforeOpen
        };
        self.stats.kills_by_phase[phase as usize] += 1;
        // The host said the notice and recorded it delivered before it was stopped: told (the
        // user had it), and never said again (design rule 4). Stopped between saying it and
        // that record, it stays pending and the next host says it once more.
        let delivered = o
            .after
            .given_up()
            .is_some_and(|given_up| given_up.notice_delivered);
        if new_rows == 0 && self.owed > 0 && said_on(stderr) > 0 && delivered {
            self.stats.notices_unacked += self.owed;
            self.owed = 0;
        }
        if new_rows > 0 && self.owed > 0 {
            // The commit that published the new thread cleared the pending notice and the host
            // stopped before its report: the notice must have been said on stderr when the
            // thread was given up, before that commit.
            if said_on(stderr) == 0 {
                return Err(format!(
                    "a fallback's notice was lost: {} give-up write(s), then a turn committed \
                     on the new thread by a host stopped before its report that never said \
                     the notice on stderr",
                    self.owed
                ));
            }
            self.stats.notices_unacked += self.owed;
            self.owed = 0;
        }
        Ok(())
    }

    /// (2), (3) and (5) for a host that acknowledged its turn.
    fn check_acknowledged(
        &mut self,
        o: &Outcome,
        output: &Value,
        stderr: &str,
        new_rows: u64,
        gave_up: u32,
    ) -> Result<(), String> {
        let text = |key: &str| output[key].as_str().unwrap_or_default().to_string();
        let (thread, mut outcome, reply) = (text("thread_id"), text("outcome"), text("reply"));
        if outcome == "resumed_or_started" {
            // An exec host prints no outcome: it resumed when it ran on the bound thread.
            let bound = o
                .before
                .as_ref()
                .and_then(|r| r.binding())
                .map(|b| &b.thread_id);
            outcome = if bound == Some(&thread) {
                "resumed"
            } else {
                "started"
            }
            .to_string();
        }
        let notices = notices_in(output);
        // The report's notices were said on stderr too, as they happened.
        if said_on(stderr) != notices {
            return Err(format!(
                "{notices} notice(s) in the report, {} on stderr (turn {:?})",
                said_on(stderr),
                o.message
            ));
        }
        let bound_before = o
            .before
            .as_ref()
            .and_then(|r| r.binding())
            .map(|b| b.thread_id.clone());
        let pending = o
            .before
            .as_ref()
            .is_some_and(|r| r.pending_notice().is_some());
        // (2) It resumes the bound thread unless that thread was lost.
        let expected = match &bound_before {
            Some(bound) if self.lost.contains(bound) => "fell_back",
            Some(_) => "resumed",
            None if pending => "fell_back",
            None => "started",
        };
        if outcome != expected {
            return Err(format!(
                "outcome {outcome}, expected {expected} (bound before: {bound_before:?}, \
                 pending notice: {pending}, lost: {})",
                bound_before.as_ref().is_some_and(|b| self.lost.contains(b))
            ));
        }
        match (&bound_before, outcome.as_str()) {
            (Some(bound), "resumed") if *bound != thread => {
                return Err(format!("resumed {thread}, but {bound} was bound"));
            }
            (Some(bound), "fell_back") if *bound == thread || gave_up != 1 => {
                return Err(format!(
                    "fell back from {bound} to {thread} with {gave_up} thread(s) retired"
                ));
            }
            _ => {}
        }
        match outcome.as_str() {
            "resumed" => self.stats.resumes += 1,
            "started" => self.stats.starts += 1,
            _ => self.stats.fell_back += 1,
        }
        // (3) The acknowledged turn is in the transcript, on the thread now bound.
        let bound_after = o.after.binding().map(|b| b.thread_id.as_str());
        if bound_after != Some(thread.as_str()) {
            return Err(format!(
                "acknowledged a turn on {thread}, but {bound_after:?} is bound"
            ));
        }
        if new_rows != 2 {
            return Err(format!(
                "acknowledged turn {:?} added {new_rows} rows",
                o.message
            ));
        }
        let rows = self.view.rows(&o.after.session_id)?;
        let tail: Vec<&Value> = rows.iter().rev().take(2).rev().map(|r| &r.body).collect();
        let row_ok = |row: &Value, role: &str, text: &str| {
            row["role"] == role && row["text"] == text && row["thread_id"] == thread.as_str()
        };
        if tail.len() != 2
            || !row_ok(tail[0], "user", &o.message)
            || !row_ok(tail[1], "assistant", &reply)
        {
            return Err(format!(
                "acknowledged turn {:?} is not the transcript's tail: {tail:?}",
                o.message
            ));
        }
        self.acked
            .push((o.after.session_id.clone(), o.message.clone()));
        // (5) Each give-up reaches the user once, with the first acknowledged turn after it.
        self.stats.notices += notices;
        match (notices, self.owed) {
            (0, 0) => Ok(()),
            (1, 1) => {
                self.owed = 0;
                Ok(())
            }
            (0, owed) => Err(format!(
                "a fallback's notice never reached the user: {owed} give-up write(s), then \
                 turn {:?} acknowledged on the new thread {thread} ({outcome}) without a notice",
                o.message
            )),
            (n, owed) => Err(format!(
                "{n} notice(s) for {owed} untold give-up write(s) (turn {:?})",
                o.message
            )),
        }
    }

    /// (3) over the whole run: every acknowledged turn is in its session's transcript, once.
    fn check_transcripts(&mut self) -> Result<(), String> {
        for session in self.sessions.clone() {
            let session = &session;
            let rows = self.view.rows(session)?;
            let users: Vec<&str> = rows
                .iter()
                .filter(|r| r.body["role"] == "user")
                .filter_map(|r| r.body["text"].as_str())
                .collect();
            for (_, message) in self.acked.iter().filter(|(s, _)| s == session) {
                let count = users.iter().filter(|u| **u == message.as_str()).count();
                if count != 1 {
                    return Err(format!(
                        "{} session {session}: acknowledged turn {message:?} is in the \
                         transcript {count} times",
                        self.plan.backend
                    ));
                }
            }
        }
        Ok(())
    }
}
