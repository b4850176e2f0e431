//! The checks after every `app-server` host (see `docs/reliability.md`): how it ended, no
//! wait for a dead holder's lease, the `thread/start` outcome and its fallback warning, and
//! every turn a client saw completed kept once. (A host killed alone left no codex running:
//! `client::Running::wait` checks it as it reaps the host; its time is counted here.)

use std::time::Duration;

use rethread_store::TranscriptRow;

use super::super::client::{Ended, LEASE_LOST, NOT_RECORDED};
use super::super::report::ProxyPhase;
use super::{Run, Runner, Stop};

/// The notice a fallback's `warning` carries (`RESUME_FALLBACK_NOTICE`).
pub(super) const NOTICE: &str = "Codex thread could not be resumed; starting a new one.";

impl Runner<'_> {
    /// The checks after every host.
    pub(super) fn check(&mut self, run: &Run<'_>) -> Result<(), String> {
        let session = self.session();
        self.check_host(run).map_err(|e| {
            let role = match (run.rival, run.stop) {
                (true, _) => "a rival".to_string(),
                (_, None) => "not stopped".to_string(),
                (_, Some((stop, at))) => {
                    format!("{} at {:?}", stop_name(stop), phase(run.ended, at))
                }
            };
            let retired = |r: Option<&rethread_store::SessionRecord>| {
                r.map(|r| r.retired_threads.clone()).unwrap_or_default()
            };
            format!(
                "{} session {session}, host {:?} ({role}; retired before {:?}, after {:?}): {e}",
                self.plan.backend,
                run.ended.label,
                retired(run.before.as_ref()),
                retired(Some(&run.after)),
            )
        })
    }

    fn check_host(&mut self, run: &Run<'_>) -> Result<(), String> {
        let ended = run.ended;
        let seen = &ended.seen;
        let what = || format!("stderr: {}", ended.stderr.trim());
        // No retired thread is bound.
        if let Some(binding) = run.after.binding() {
            if run.after.retired_threads.contains(&binding.thread_id) {
                return Err(format!("retired thread {} is bound", binding.thread_id));
            }
        }
        let before_retired = run.before.as_ref().map_or(0, |r| r.retired_threads.len());
        let gave_up = run
            .after
            .retired_threads
            .len()
            .saturating_sub(before_retired + run.others_retired);
        if gave_up > 1 {
            return Err(format!("{gave_up} threads retired by one host"));
        }
        self.stats.fallbacks += gave_up as u32;
        if let Some((stop, at)) = run.stop {
            self.stats.count_stop(stop_name(stop), phase(ended, at));
        }
        self.stats.codex_gone.extend(ended.codex_gone);
        // How it ended.
        match run.stop.map(|(stop, _)| stop) {
            None | Some(Stop::Pause { .. }) => {
                let clean = ended.code() == Some(0) && seen.cut_short.is_none();
                // A rival refused before codex started (the session or the store is held).
                let busy = run.rival && ended.code() == Some(75) && ended.lease_ms().is_none();
                if !clean && !busy {
                    return Err(format!(
                        "a host that was not stopped for good ended {:?} (cut short: {:?}); {}",
                        ended.status,
                        seen.cut_short,
                        what()
                    ));
                }
            }
            Some(Stop::Terminate) => {
                // 143, or killed by it before the handlers were installed, or exit 0 when its
                // client had finished and closed its input first.
                let finished = seen.cut_short.is_none()
                    && seen.start.is_some()
                    && seen.turns.iter().all(|t| t.completed.is_some());
                if !(matches!(ended.code(), None | Some(143))
                    || ended.code() == Some(0) && finished)
                {
                    return Err(format!(
                        "SIGTERM: exit {:?}, not 143; {}",
                        ended.code(),
                        what()
                    ));
                }
            }
            Some(Stop::Kill | Stop::KillAlone) => {}
        }
        // Only a host stopped past its TTL may lose its lease.
        let paused = matches!(run.stop, Some((Stop::Pause { .. }, _)));
        if !paused && !seen.warned(LEASE_LOST).is_empty() {
            return Err(format!(
                "a host that was not stopped past its lease TTL said it lost the session; {}",
                what()
            ));
        }
        // No wait for the lease TTL of a dead holder.
        if let Some(lease_ms) = ended.lease_ms() {
            if run.after_stop {
                self.stats.restarts.push(Duration::from_millis(lease_ms));
                let limit = self.plan.lease_ttl * 1000.0 / 2.0;
                if lease_ms as f64 >= limit {
                    return Err(format!(
                        "the host after a stop took {lease_ms} ms to hold the lease: it waited for \
                         the dead holder's TTL ({} s) instead of taking it over",
                        self.plan.lease_ttl
                    ));
                }
            }
        }
        self.check_start(run, gave_up)?;
        self.check_turns(run)
    }

    /// Counts a fallback warning about the give-up of `subject` that reached `host`'s client
    /// (`stopped`: that host was then stopped). A warning is said once: again only when the
    /// host that told it was stopped before it could record the delivery (at least once,
    /// never lost); a host that ran on must have recorded it.
    ///
    /// `stop_rival` names the rival that ran during this host's SIGSTOP: a host stopped
    /// between its give-up and the delivery's record leaves the notice pending for the rival,
    /// and its own warning, already on its way, goes out after the SIGCONT. The two tells are
    /// one delivery split by the stop (no write can be atomic with a line to a client), counted
    /// as a retell after a stop.
    pub(super) fn told_once(
        &mut self,
        subject: &str,
        host: &str,
        stopped: bool,
        stop_rival: Option<&str>,
    ) {
        self.stats.warnings += 1;
        match self
            .told
            .insert(subject.to_string(), (stopped, host.to_string()))
        {
            None => {}
            Some((true, _)) => self.stats.retold_after_stop += 1,
            Some((false, first)) if stop_rival == Some(first.as_str()) => {
                self.stats.retold_after_stop += 1
            }
            Some((false, first)) => self.known.repeated.push(format!(
                "the fallback from {subject} told again, to host {host:?}, after host {first:?} \
                 had told it and run on"
            )),
        }
    }

    /// The `thread/start` answer: resumed unless lost, else a fallback told once.
    fn check_start(&mut self, run: &Run<'_>, gave_up: usize) -> Result<(), String> {
        let seen = &run.ended.seen;
        let notices = seen.warned(NOTICE);
        if notices.len() > 1 {
            return Err(format!(
                "{} fallback warnings on one connection",
                notices.len()
            ));
        }
        let pending_before = run
            .before
            .as_ref()
            .is_some_and(|r| r.pending_notice().is_some());
        if !notices.is_empty() {
            let told = gave_up == 1 || pending_before || paused_rival(run);
            let subject = run.after.retired_threads.last().filter(|_| told);
            let Some(subject) = subject else {
                return Err("a fallback warning without a thread given up".to_string());
            };
            self.told_once(
                subject,
                &run.ended.label,
                run.stop.is_some(),
                run.stop_rival.as_deref(),
            );
        }
        let Some(start) = &seen.start else {
            // Stopped before the answer, or a rival refused before codex started.
            return if run.stop.is_some() || run.rival {
                Ok(())
            } else {
                Err(format!(
                    "no thread/start answer ({:?}, {:?}); stderr: {}",
                    seen.cut_short,
                    run.ended.status,
                    run.ended.stderr.trim()
                ))
            };
        };
        let paused = matches!(run.stop, Some((Stop::Pause { .. }, _)));
        let thread = match start {
            Ok(thread) => thread,
            // A rival refused (the stopped host's codex holds the thread), or a host that
            // lost its lease while stopped (and said so): nothing written.
            Err(_)
                if (run.rival
                    || paused_rival(run)
                    || paused && !seen.warned(LEASE_LOST).is_empty())
                    && gave_up == 0 =>
            {
                return Ok(());
            }
            // A host stopped for good while it opened: the signal goes to its process group,
            // so codex may die under the resume and the start is answered with that error as
            // the host goes down. Transient: nothing may be given up, the binding is kept.
            Err((code, message))
                if matches!(run.stop, Some((Stop::Terminate | Stop::Kill, _))) && gave_up == 0 =>
            {
                let kept = |r: Option<&rethread_store::SessionRecord>| {
                    r.and_then(|r| r.binding()).map(|b| b.thread_id.clone())
                };
                if kept(run.before.as_ref()) != kept(Some(&run.after)) {
                    return Err(format!(
                        "thread/start refused ({code} {message}) by a stopped host that moved \
                         the binding"
                    ));
                }
                return Ok(());
            }
            Err((code, message)) => {
                return Err(format!(
                    "thread/start refused: {code} {message} ({gave_up} thread(s) retired)"
                ));
            }
        };
        if paused_rival(run) {
            // Its start may have come after the rival changed the session: judged by the
            // stop checks.
            return Ok(());
        }
        let bound = run
            .before
            .as_ref()
            .and_then(|r| r.binding())
            .map(|b| b.thread_id.clone());
        let expected = match &bound {
            Some(bound) if self.lost.contains(bound) => "fell_back",
            Some(_) => "resumed",
            None if pending_before => "fell_back",
            None => "started",
        };
        let outcome = match (&bound, notices.len()) {
            (Some(bound), 0) if bound == thread => "resumed",
            (_, 1) if bound.as_ref() != Some(thread) => "fell_back",
            (None, 0) => "started",
            _ => "inconsistent",
        };
        if outcome != expected {
            return Err(format!(
                "thread/start answered {thread} with {} warning(s): {outcome}, expected \
                 {expected} (bound before: {bound:?}, pending notice: {pending_before})",
                notices.len()
            ));
        }
        if outcome == "fell_back" && bound.is_some() && gave_up != 1 {
            return Err(format!(
                "fell back from {bound:?} with {gave_up} thread(s) retired"
            ));
        }
        match outcome {
            "resumed" => self.stats.resumed += 1,
            "started" => self.stats.started += 1,
            _ => self.stats.fell_back += 1,
        }
        Ok(())
    }

    /// Every turn the client saw completed is kept, once, unless the host said it could not
    /// be; nothing is kept twice.
    fn check_turns(&mut self, run: &Run<'_>) -> Result<(), String> {
        let seen = &run.ended.seen;
        if let Some(warning) = seen.warned(NOT_RECORDED).first() {
            return Err(format!("a turn's commit failed: {}", warning.message));
        }
        let rows = self.view.rows(&run.after.session_id)?;
        let users: Vec<&TranscriptRow> = rows.iter().filter(|r| r.body["role"] == "user").collect();
        let lost_at = seen.warned(LEASE_LOST).first().map(|w| w.at_ms);
        for turn in &seen.turns {
            let kept: Vec<&&TranscriptRow> = users
                .iter()
                .filter(|r| r.body["text"] == turn.message.as_str())
                .collect();
            if kept.len() > 1 {
                return Err(format!(
                    "turn {:?} is kept {} times",
                    turn.message,
                    kept.len()
                ));
            }
            let Some((status, at)) = &turn.completed else {
                continue;
            };
            let told_lost = lost_at.is_some_and(|lost| lost <= *at);
            if status != "completed" || told_lost {
                continue;
            }
            let Some(row) = kept.first() else {
                return Err(format!(
                    "turn {:?} completed for the client (turn/completed) but is not in the store",
                    turn.message
                ));
            };
            if row.body["thread_id"] != turn.thread.as_str() {
                return Err(format!(
                    "turn {:?} ran on {} but is kept on {}",
                    turn.message, turn.thread, row.body["thread_id"]
                ));
            }
            let next = rows.iter().find(|r| r.seq == row.seq + 1);
            if next.is_none_or(|r| {
                r.body["role"] != "assistant" || r.body["turn_id"] != row.body["turn_id"]
            }) {
                return Err(format!("turn {:?} is kept without its reply", turn.message));
            }
            self.stats.turns_kept += 1;
            self.kept
                .push((run.after.session_id.clone(), turn.message.clone()));
        }
        Ok(())
    }

    /// Over the whole run: every turn a client saw completed is in its session once.
    pub(super) fn check_kept(&mut self) -> Result<(), String> {
        for session in self.sessions.clone() {
            let rows = self.view.rows(&session)?;
            for (_, message) in self.kept.iter().filter(|(s, _)| *s == session) {
                let count = rows
                    .iter()
                    .filter(|r| r.body["role"] == "user" && r.body["text"] == message.as_str())
                    .count();
                if count != 1 {
                    return Err(format!(
                        "{} session {session}: turn {message:?} is kept {count} times",
                        self.plan.backend
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Whether `run` is a host stopped by SIGSTOP while a rival ran.
fn paused_rival(run: &Run<'_>) -> bool {
    matches!(run.stop, Some((Stop::Pause { rival: true }, _)))
}

fn stop_name(stop: Stop) -> &'static str {
    match stop {
        Stop::Kill => "kill",
        Stop::KillAlone => "kill alone",
        Stop::Terminate => "term",
        Stop::Pause { rival: false } => "stop alone",
        Stop::Pause { rival: true } => "stop + rival",
    }
}

/// Where a stop at `at` (unix ms) landed, from the fake's events and the client's turns.
fn phase(ended: &Ended, at: u64) -> ProxyPhase {
    let events: Vec<&str> = ended
        .events
        .iter()
        .filter(|(t, _)| *t <= at)
        .map(|(_, e)| e.as_str())
        .collect();
    let opened = events
        .iter()
        .any(|e| *e == "request thread/start" || *e == "request thread/resume");
    let turns = events
        .iter()
        .filter(|e| **e == "request turn/start")
        .count();
    let done = events
        .iter()
        .filter(|e| e.starts_with("turn-done "))
        .count();
    let completed = ended
        .seen
        .turns
        .iter()
        .filter(|t| t.completed.as_ref().is_some_and(|(_, c)| *c <= at))
        .count();
    if !opened {
        ProxyPhase::BeforeOpen
    } else if turns > done {
        ProxyPhase::MidTurn
    } else if done > completed {
        ProxyPhase::Commit
    } else if turns == 0 {
        ProxyPhase::Open
    } else {
        ProxyPhase::Idle
    }
}
