//! One backend's run of `rethread app-server` hosts (`client.rs`), each stopped at a seeded
//! random point by SIGKILL (to its group, or to its pid alone), SIGTERM or SIGSTOP, with the
//! checks of issue 19 after every host (and of issue 34 after a kill alone: no codex left).
//!
//! A SIGSTOP lasts past the lease TTL, then SIGCONT. Half of them meet a rival meanwhile: a
//! second host for the same session, started once the stopped one's lease expired and run to
//! its end before the SIGCONT. Every stop is followed at once by a whole host.
//!
//! Checks that fail today because of open defects are counted, not stopped at, and fail the
//! run at its end with their count ([`Known`]); every other check fails the run at once.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rethread_store::{SessionRecord, TranscriptRow};
use serde_json::json;

mod checks;

use super::client::{self, Ended, Gate, Spec, LEASE_LOST};
use super::host::{Binaries, Rng};
use super::report::ProxyStats;
use super::view::StoreView;
use checks::NOTICE;

/// Turns per host.
const TURNS: usize = 2;
/// Iterations per session.
const ITERATIONS_PER_SESSION: u32 = 30;
/// How often an iteration first makes the bound thread unresumable.
const LOSE_CHANCE: f64 = 0.12;
/// How a host is stopped: SIGKILL to its group, SIGKILL to its pid alone (as a supervisor or
/// the OOM killer kills it: its codex must die with it), SIGTERM, else SIGSTOP (alone or with a
/// rival, evenly).
const KILL_CHANCE: f64 = 0.25;
const KILL_ALONE_CHANCE: f64 = 0.2;
const TERMINATE_CHANCE: f64 = 0.2;
/// The fake's turns in a host killed alone: longer than the harness waits for its codex to be
/// gone, so a codex left running by its host is found running.
const KILLED_ALONE_TURN_MS: u64 = 30_000;
/// A SIGSTOP lasts this much past the lease TTL (the lease expires at most a TTL after its
/// last renewal, which came before the stop).
const PAST_TTL: Duration = Duration::from_millis(300);
/// How long a rival may take before the stopped host is continued anyway: past SQLite's busy
/// timeout (5 s), after which a rival waiting for the stopped host's write lock gives up.
const RIVAL_DEADLINE: Duration = Duration::from_secs(8);

/// What one backend run does.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) backend: &'static str,
    pub(crate) store_url: String,
    /// The URL hosts get (PostgreSQL: under their own `application_name`).
    pub(crate) host_store_url: String,
    pub(crate) dir: PathBuf,
    pub(crate) session_prefix: String,
    /// Stop after this many stops.
    pub(crate) stops: u32,
    pub(crate) seed: u64,
    pub(crate) slow_turn_ms: u64,
    /// `RETHREAD_LEASE_TTL` of every host, seconds.
    pub(crate) lease_ttl: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Kill,
    KillAlone,
    Terminate,
    Pause { rival: bool },
}

/// The checks that fail today, each until its fix lands; counted with a first example.
#[derive(Debug, Default)]
struct Known {
    /// SIGSTOPs judged as with nobody competing.
    alone: u32,
    /// Issue 19 item 2: a host stopped past its lease TTL with nobody competing must take its
    /// lease back after SIGCONT and go on recording, never say it lost the session.
    lost_alone: Vec<String>,
    /// Issue 19 item 7: a fallback's warning that reached a client through a host that ran on
    /// must never be said again.
    repeated: Vec<String>,
}

/// Runs the plan: its counts and the checks that failed today ([`Known`], one line each with
/// its count and first case); `Err` names the first other check that failed.
pub(crate) fn execute(
    plan: &Plan,
    binaries: &Binaries,
) -> Result<(ProxyStats, Vec<String>), String> {
    let mut runner = Runner {
        plan,
        binaries,
        view: StoreView::open(&plan.store_url, "app-server")?,
        rng: Rng::new(plan.seed),
        lost: Vec::new(),
        sessions: Vec::new(),
        told: HashMap::new(),
        kept: Vec::new(),
        calibration: VecDeque::new(),
        stats: ProxyStats::default(),
        known: Known::default(),
        hosts: 0,
    };
    let started = Instant::now();
    let result = runner.run();
    runner.stats.wall = started.elapsed();
    runner.stats.lost_alone = runner.known.lost_alone.len() as u32;
    runner.stats.repeated = runner.known.repeated.len() as u32;
    if result.is_ok() && plan.store_url.starts_with("postgres") {
        for session in runner.sessions.clone() {
            runner.view.delete(&session)?;
        }
    }
    result?;
    let mut known = Vec::new();
    if let Some(first) = runner.known.lost_alone.first() {
        known.push(format!(
            "{} of {} hosts stopped past the lease TTL with nobody competing lost the session \
             after SIGCONT (issue 19 item 2: a lease whose fence is still the newest is taken \
             back); first: {first}",
            runner.known.lost_alone.len(),
            runner.known.alone
        ));
    }
    if let Some(first) = runner.known.repeated.first() {
        known.push(format!(
            "{} fallback warning(s) said again after they reached a client through a host that \
             ran on (issue 19 item 7: a delivered notice is never said again); first: {first}",
            runner.known.repeated.len()
        ));
    }
    Ok((runner.stats, known))
}

struct Runner<'a> {
    plan: &'a Plan,
    binaries: &'a Binaries,
    view: StoreView,
    rng: Rng,
    /// Threads made unresumable so far.
    lost: Vec<String>,
    sessions: Vec<String>,
    /// Retired threads of the current session whose fallback warning reached a client.
    /// Fallbacks told to a client, and whether the host that told it was then stopped.
    told: HashMap<String, (bool, String)>,
    /// Turns a client saw completed and that must be kept: (session, message).
    kept: Vec<(String, String)>,
    /// (open, turn started, turn done, exit) in ms after the spawn, of recent whole hosts.
    calibration: VecDeque<[f64; 4]>,
    stats: ProxyStats,
    known: Known,
    hosts: u64,
}

/// One host as the checks see it.
struct Run<'a> {
    /// The record before the host, and after it.
    before: Option<SessionRecord>,
    after: SessionRecord,
    ended: &'a Ended,
    /// The stop it got (sent while it ran) and when.
    stop: Option<(Stop, u64)>,
    /// Right after a stopped host.
    after_stop: bool,
    /// A rival during another host's SIGSTOP: refusals are allowed.
    rival: bool,
    /// Threads retired meanwhile by another host (a rival during this one's SIGSTOP).
    others_retired: usize,
    /// The rival that ran during this host's SIGSTOP, by label.
    stop_rival: Option<String>,
}

impl Runner<'_> {
    fn run(&mut self) -> Result<(), String> {
        self.new_session();
        for _ in 0..3 {
            self.whole(false)?;
        }
        let mut iterations = 0;
        while self.stats.stops() < self.plan.stops {
            if iterations > 0 && iterations % ITERATIONS_PER_SESSION == 0 {
                self.finish_session()?;
                self.new_session();
            }
            iterations += 1;
            self.maybe_lose_thread()?;
            let delay = self.stop_delay();
            let stopped = match self.pick_stop() {
                Stop::Pause { rival } => self.paused(delay, rival)?,
                stop => self.stopped(delay, stop)?,
            };
            self.whole(stopped)?;
        }
        self.finish_session()?;
        self.check_kept()
    }

    fn session(&self) -> String {
        self.sessions.last().cloned().unwrap_or_default()
    }

    fn new_session(&mut self) {
        let id = format!("{}-{}", self.plan.session_prefix, self.sessions.len());
        self.sessions.push(id);
        self.told.clear();
    }

    /// A last whole host; then every fallback of the session was told, or is still pending.
    fn finish_session(&mut self) -> Result<(), String> {
        self.whole(false)?;
        let record = self.record()?;
        let pending = record.pending_notice().is_some();
        let untold: Vec<&String> = record
            .retired_threads
            .iter()
            .filter(|t| !self.told.contains_key(*t))
            .collect();
        let last = record.retired_threads.last();
        if untold.iter().any(|t| !(pending && Some(*t) == last)) {
            return Err(format!(
                "session {}: the fallback from {untold:?} never reached a client and is not \
                 pending in the store (told: {:?}; retired: {:?})",
                self.session(),
                self.told,
                record.retired_threads
            ));
        }
        Ok(())
    }

    fn maybe_lose_thread(&mut self) -> Result<(), String> {
        let bound = self.record()?.binding().map(|b| b.thread_id.clone());
        if let Some(thread) = bound {
            if !self.lost.contains(&thread) && self.rng.chance(LOSE_CHANCE) {
                self.lost.push(thread);
                self.stats.lost += 1;
            }
        }
        Ok(())
    }

    /// A phase of a whole host picked uniformly, then a moment inside its typical window.
    fn stop_delay(&mut self) -> Duration {
        let median = |i: usize| {
            let mut values: Vec<f64> = self.calibration.iter().map(|c| c[i]).collect();
            values.sort_by(f64::total_cmp);
            values.get(values.len() / 2).copied().unwrap_or(60.0)
        };
        let edges = [0.0, median(0), median(1), median(2), median(3)];
        let phase = (self.rng.unit() * 4.0) as usize;
        self.rng.between_ms(edges[phase], edges[phase + 1])
    }

    fn pick_stop(&mut self) -> Stop {
        let draw = self.rng.unit();
        if draw < KILL_CHANCE {
            Stop::Kill
        } else if draw < KILL_CHANCE + KILL_ALONE_CHANCE {
            Stop::KillAlone
        } else if draw < KILL_CHANCE + KILL_ALONE_CHANCE + TERMINATE_CHANCE {
            Stop::Terminate
        } else {
            Stop::Pause {
                rival: self.rng.chance(0.5),
            }
        }
    }

    fn record(&mut self) -> Result<SessionRecord, String> {
        let session = self.session();
        Ok(self
            .view
            .session(&session)?
            .unwrap_or_else(|| SessionRecord::new(session, 0)))
    }

    fn spec(&mut self, turns: usize) -> Spec {
        self.spec_with(turns, self.plan.slow_turn_ms)
    }

    /// A host of `turns` turns, each `turn_ms` long in the fake.
    fn spec_with(&mut self, turns: usize, turn_ms: u64) -> Spec {
        self.hosts += 1;
        let messages = (0..turns)
            .map(|turn| format!("{} host {} turn {turn}", self.plan.backend, self.hosts))
            .collect();
        let mut faults = vec![json!({"kind": "slow_turn", "millis": turn_ms})];
        if !self.lost.is_empty() {
            faults.push(json!({"kind": "fail_resume", "thread_ids": self.lost}));
        }
        Spec {
            store_url: self.plan.host_store_url.clone(),
            session: self.session(),
            lease_ttl: self.plan.lease_ttl,
            // Past the TTL: a lease not taken over at once shows as a slow start.
            session_wait: self.plan.lease_ttl * 3.0 + 2.0,
            codex_home: self.plan.dir.join("codex-home"),
            event_log: self.plan.dir.join(format!("events-{}.log", self.hosts % 4)),
            faults: json!({ "faults": faults }).to_string(),
            messages,
        }
    }

    /// A host that runs to its end.
    fn whole(&mut self, after_stop: bool) -> Result<(), String> {
        let before = self.view.session(&self.session())?;
        let spec = self.spec(TURNS);
        let ended = client::spawn(self.binaries, &spec, None)?.wait(&spec.event_log)?;
        self.view.wait_for_hosts_gone()?;
        let after = self.record()?;
        if let Some(calibration) = calibrate(&ended) {
            self.calibration.push_back(calibration);
            if self.calibration.len() > 32 {
                self.calibration.pop_front();
            }
        }
        let run = Run {
            before,
            after,
            ended: &ended,
            stop: None,
            after_stop,
            rival: false,
            others_retired: 0,
            stop_rival: None,
        };
        self.check(&run)
    }

    /// A host stopped by SIGKILL (to its group or its pid alone) or SIGTERM after `delay`.
    /// Returns whether the stop was sent.
    fn stopped(&mut self, delay: Duration, stop: Stop) -> Result<bool, String> {
        let before = self.view.session(&self.session())?;
        let spec = match stop {
            Stop::KillAlone => self.spec_with(TURNS, KILLED_ALONE_TURN_MS),
            _ => self.spec(TURNS),
        };
        let mut running = client::spawn(self.binaries, &spec, None)?;
        std::thread::sleep(delay);
        let sent = match stop {
            Stop::KillAlone => running.kill_alone()?,
            Stop::Kill => running.signal(libc::SIGKILL)?,
            _ => running.signal(libc::SIGTERM)?,
        };
        let sent = sent.then(|| (stop, client::now_ms()));
        let ended = running.wait(&spec.event_log).map_err(|e| {
            format!(
                "{} session {}, host {:?}: {e}",
                self.plan.backend,
                self.session(),
                spec.messages.first().map_or("", String::as_str)
            )
        })?;
        self.view.wait_for_hosts_gone()?;
        let after = self.record()?;
        let run = Run {
            before,
            after,
            ended: &ended,
            stop: sent,
            after_stop: false,
            rival: false,
            others_retired: 0,
            stop_rival: None,
        };
        self.check(&run)?;
        Ok(sent.is_some())
    }

    /// A host stopped by SIGSTOP after `delay`, past the lease TTL, with or without a rival
    /// meanwhile, then continued.
    fn paused(&mut self, delay: Duration, rival: bool) -> Result<bool, String> {
        let before = self.view.session(&self.session())?;
        let spec = self.spec(TURNS);
        let gate = Arc::new(Gate::default());
        let mut running = client::spawn(self.binaries, &spec, Some(Arc::clone(&gate)))?;
        std::thread::sleep(delay);
        let Some(stopped_ms) = running.signal(libc::SIGSTOP)?.then(client::now_ms) else {
            gate.open(client::now_ms());
            return Err("a host ended before its SIGSTOP while its client waited".into());
        };
        std::thread::sleep(Duration::from_secs_f64(self.plan.lease_ttl) + PAST_TTL);
        // The rival, and the store as the stopped host left it before and after it.
        let mut rival_took = false;
        let mut early = false;
        let mut others_retired = 0;
        let mut before_cont: Option<Vec<TranscriptRow>> = None;
        let mut stop_rival = None;
        if rival {
            let readable = self.view.reads_beside_a_host();
            // redb: the stopped host has the file open, unless it was stopped before it
            // opened it, and then it wrote nothing yet.
            let rival_before = if readable {
                self.view.session(&self.session())?
            } else {
                before.clone()
            };
            let rival_spec = self.spec(1);
            let rival_host = client::spawn(self.binaries, &rival_spec, None)?;
            let log = rival_spec.event_log.clone();
            let (done, finished) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = done.send(rival_host.wait(&log));
            });
            let rival_ended = match finished.recv_timeout(RIVAL_DEADLINE) {
                Ok(ended) => ended?,
                Err(_) => {
                    // The stopped host holds a lock the rival waits for (it was stopped
                    // inside a store transaction): continue it, then judge only the rest.
                    early = true;
                    running.signal(libc::SIGCONT)?;
                    finished.recv().map_err(|_| "the rival's waiter died")??
                }
            };
            rival_took = rival_ended.lease_ms().is_some();
            stop_rival = Some(rival_ended.label.clone());
            if early {
                // Who retired what meanwhile is not known: what the rival retired (or the
                // stopped host after its SIGCONT) is not held against the stopped host.
                self.stats.rivals_waited += 1;
                if readable {
                    let record = self.record()?;
                    others_retired = record.retired_threads.len()
                        - rival_before.as_ref().map_or(0, |r| r.retired_threads.len());
                    // Its fallback warning, if it got one, told the give-up of the moment.
                    if let Some(subject) = record.retired_threads.last() {
                        if !rival_ended.seen.warned(NOTICE).is_empty() {
                            self.told_once(subject, &rival_ended.label, false, None);
                        }
                    }
                }
            } else if readable || rival_took {
                // (A rival that took the lease on redb found the file free: readable now.)
                let rival_after = self.record()?;
                others_retired = rival_after.retired_threads.len()
                    - rival_before.as_ref().map_or(0, |r| r.retired_threads.len());
                before_cont = Some(self.view.rows(&self.session())?);
                let run = Run {
                    before: rival_before,
                    after: rival_after,
                    ended: &rival_ended,
                    stop: None,
                    after_stop: false,
                    rival: true,
                    others_retired: 0,
                    stop_rival: None,
                };
                self.check(&run)?;
            } else if rival_ended.code() != Some(75) {
                // redb: the stopped host has the file open; the rival is refused at once.
                return Err(format!(
                    "a rival of a host holding the {} store open ended {:?} (lease taken: \
                     {rival_took}); stderr: {}",
                    self.plan.backend,
                    rival_ended.status,
                    rival_ended.stderr.trim()
                ));
            }
            if rival_took && !early {
                self.stats.rivals_took += 1;
            }
        }
        let continued_ms = client::now_ms();
        if !early {
            running.signal(libc::SIGCONT)?;
        }
        gate.open(continued_ms);
        let ended = running.wait(&spec.event_log)?;
        self.view.wait_for_hosts_gone()?;
        let after = self.record()?;
        let held = ended.events.iter().any(|(at, _)| *at <= stopped_ms);
        let said_lost = ended
            .seen
            .warned(LEASE_LOST)
            .iter()
            .any(|w| w.at_ms >= continued_ms);
        if rival_took && !early {
            // The stopped host recorded nothing after SIGCONT, and said it lost the session.
            let rows = before_cont.unwrap_or_default();
            let mine: HashSet<&str> = ended
                .seen
                .turns
                .iter()
                .map(|t| t.message.as_str())
                .collect();
            let now = self.view.rows(&self.session())?;
            let added: Vec<&str> = now[rows.len().min(now.len())..]
                .iter()
                .filter_map(|r| r.body["text"].as_str())
                .filter(|text| mine.contains(text))
                .collect();
            if held && !added.is_empty() {
                return Err(format!(
                    "a host stopped past its lease TTL while a rival took the session recorded \
                     {added:?} after SIGCONT"
                ));
            }
            if held && ended.seen.start.is_some() && !said_lost {
                return Err(format!(
                    "a host stopped past its lease TTL while a rival took the session did not \
                     say it lost it after SIGCONT; warnings: {:?}",
                    ended.seen.warnings
                ));
            }
            self.stats.lost_to_rival += u32::from(said_lost);
        } else if !early {
            self.known.alone += 1;
        }
        if !(rival_took || early) && said_lost {
            self.known.lost_alone.push(format!(
                "host {} ({} turns after SIGCONT); stderr: {}",
                self.hosts,
                ended
                    .seen
                    .turns
                    .iter()
                    .filter(|t| t.sent_ms >= continued_ms)
                    .count(),
                ended.stderr.trim()
            ));
        }
        let run = Run {
            before,
            after,
            ended: &ended,
            stop: Some((Stop::Pause { rival }, stopped_ms)),
            after_stop: false,
            rival: false,
            others_retired,
            stop_rival,
        };
        // Its turns after losing the lease are not required in the store (it said so).
        self.check(&run)?;
        Ok(true)
    }
}

/// (open, first turn started, first turn done, exit) in ms after the spawn, from a whole host.
fn calibrate(ended: &Ended) -> Option<[f64; 4]> {
    let first = |pred: &dyn Fn(&str) -> bool| {
        ended
            .events
            .iter()
            .find(|(_, e)| pred(e))
            .map(|(at, _)| at.saturating_sub(ended.spawned_ms) as f64)
    };
    let open = first(&|e| e == "request thread/start" || e == "request thread/resume")?;
    let turn = first(&|e| e == "request turn/start")?;
    let done = first(&|e| e.starts_with("turn-done "))?;
    let exit = ended
        .seen
        .turns
        .last()
        .and_then(|t| t.completed.as_ref())
        .map(|(_, at)| at.saturating_sub(ended.spawned_ms) as f64)?;
    Some([open, turn, done, exit])
}
