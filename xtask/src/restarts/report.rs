//! What a backend run counted, and the summary table.

use std::time::Duration;

/// Where a kill landed, read after the kill from the fake's event log and the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Before codex was asked to resume or start a thread (start-up, store, lease).
    BeforeOpen = 0,
    /// During the resume (or the fallback's give-up and `thread/start`), before the turn.
    Open = 1,
    /// The turn was running in codex.
    MidTurn = 2,
    /// The turn was done in codex; its rows and binding were not yet committed.
    Commit = 3,
    /// Committed, but the host died before acknowledging the turn.
    AfterCommit = 4,
}

/// The table's column names, in [`Phase`] order.
const PHASES: [&str; 5] = ["pre-open", "open", "mid-turn", "commit", "post-commit"];

/// The counts of one backend run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stats {
    /// Stops (SIGKILL, SIGINT, SIGTERM), by [`Phase`].
    pub(crate) kills_by_phase: [u32; 5],
    /// Of them, hosts stopped by SIGINT or SIGTERM that exited `130` / `143` as promised.
    pub(crate) interrupts: u32,
    /// Of them, hosts killed alone (SIGKILL to the pid, not the group), and for each how long
    /// after it was reaped its codex was gone.
    pub(crate) kills_alone: u32,
    pub(crate) codex_gone: Vec<Duration>,
    /// Threads made unresumable.
    pub(crate) lost: u32,
    /// Give-up writes (the store's retired threads grew).
    pub(crate) fallbacks: u32,
    /// Fallback notices in acknowledged turns.
    pub(crate) notices: u32,
    /// Notices said only by a stopped host: one killed after its commit and before its
    /// report, or one that recorded the notice delivered and was stopped before its turn.
    pub(crate) notices_unacked: u32,
    /// Acknowledged turns by outcome.
    pub(crate) resumes: u32,
    pub(crate) starts: u32,
    pub(crate) fell_back: u32,
    /// Wall time of each host started right after a kill.
    pub(crate) restarts: Vec<Duration>,
    /// Wall time of the other whole turns.
    pub(crate) turns: Vec<Duration>,
    /// The run's wall time.
    pub(crate) wall: Duration,
}

impl Stats {
    /// All kills.
    pub(crate) fn kills(&self) -> u32 {
        self.kills_by_phase.iter().sum()
    }
}

fn percentile(values: &[Duration], p: f64) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[index]
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1000.0)
}

/// The summary: one row per backend.
pub(crate) fn table(rows: &[(&str, &Stats)]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "| backend | kills | int/term | killed alone | codex gone max ms | {} | lost | fallbacks | notices | unacked | resumed | started \
         | fell back | restart p50 ms | restart max ms | turn p50 ms | wall s |\n",
        PHASES.join(" | ")
    ));
    out.push_str(&format!("|{}\n", "---|".repeat(21)));
    for (backend, s) in rows {
        let phases: Vec<String> = s.kills_by_phase.iter().map(u32::to_string).collect();
        out.push_str(&format!(
            "| {backend} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} |\n",
            s.kills(),
            s.interrupts,
            s.kills_alone,
            ms(s.codex_gone.iter().copied().max().unwrap_or_default()),
            phases.join(" | "),
            s.lost,
            s.fallbacks,
            s.notices,
            s.notices_unacked,
            s.resumes,
            s.starts,
            s.fell_back,
            ms(percentile(&s.restarts, 0.5)),
            ms(s.restarts.iter().copied().max().unwrap_or_default()),
            ms(percentile(&s.turns, 0.5)),
            s.wall.as_secs_f64(),
        ));
    }
    out
}

/// Where a stop of an `app-server` host landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProxyPhase {
    /// Codex had not been asked for a thread (start-up, store, lease, codex start, handshake).
    BeforeOpen = 0,
    /// A resume or start asked for, no turn yet.
    Open = 1,
    /// A turn running in codex.
    MidTurn = 2,
    /// A turn done in codex, its `turn/completed` not yet at the client (the commit).
    Commit = 3,
    /// Between turns, or after the last one.
    Idle = 4,
}

/// The table's phase columns, in [`ProxyPhase`] order.
const PROXY_PHASES: [&str; 5] = ["pre-open", "open", "mid-turn", "commit", "idle"];

/// The counts of one backend's `app-server` run.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProxyStats {
    /// SIGKILLs to the host's group; to its pid alone, and for each of those how long after
    /// the host was reaped its codex was gone.
    pub(crate) kills: u32,
    pub(crate) kills_alone: u32,
    pub(crate) codex_gone: Vec<Duration>,
    pub(crate) terms: u32,
    /// SIGSTOPs with nobody competing, and with a rival meanwhile.
    pub(crate) pauses_alone: u32,
    pub(crate) pauses_rival: u32,
    pub(crate) phases: [u32; 5],
    /// Rivals that took the session's lease (the others were refused: session or store held).
    pub(crate) rivals_took: u32,
    /// Rivals that waited for a lock the stopped host held, so that it was continued first.
    pub(crate) rivals_waited: u32,
    /// Stopped hosts that, continued after a rival took the session, said they lost it.
    pub(crate) lost_to_rival: u32,
    /// Stopped hosts with nobody competing that said they lost the session (issue 19.2).
    pub(crate) lost_alone: u32,
    /// Threads made unresumable; give-up writes; fallback warnings clients got; of them,
    /// said again after one reached a client (issue 19.7).
    pub(crate) lost: u32,
    pub(crate) fallbacks: u32,
    pub(crate) warnings: u32,
    pub(crate) repeated: u32,
    /// Warnings said again because the host that told them was stopped before it recorded
    /// the delivery (allowed: at least once, never lost).
    pub(crate) retold_after_stop: u32,
    /// `thread/start` outcomes of hosts that were not stopped first.
    pub(crate) resumed: u32,
    pub(crate) started: u32,
    pub(crate) fell_back: u32,
    /// Turns a client saw completed, found kept.
    pub(crate) turns_kept: u32,
    /// From spawn to the lease held (codex started), for hosts right after a stop.
    pub(crate) restarts: Vec<Duration>,
    pub(crate) wall: Duration,
}

impl ProxyStats {
    /// Every stop sent.
    pub(crate) fn stops(&self) -> u32 {
        self.kills + self.kills_alone + self.terms + self.pauses_alone + self.pauses_rival
    }

    /// Counts a stop of kind `name` that landed in `phase`.
    pub(crate) fn count_stop(&mut self, name: &str, phase: ProxyPhase) {
        match name {
            "kill" => self.kills += 1,
            "kill alone" => self.kills_alone += 1,
            "term" => self.terms += 1,
            "stop alone" => self.pauses_alone += 1,
            _ => self.pauses_rival += 1,
        }
        self.phases[phase as usize] += 1;
    }
}

/// The summary of the `app-server` runs: one row per backend.
pub(crate) fn proxy_table(rows: &[(&str, &ProxyStats)]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "| backend | stops | kill | killed alone | codex gone max ms | term | stop alone | \
         stop + rival | {} | rival took | \
         rival waited | lost to rival | lost alone | lost | fallbacks | warnings | repeated | \
         retold after a stop | resumed | started | fell back | turns kept | lease p50 ms | lease max ms | wall s |\n",
        PROXY_PHASES.join(" | ")
    ));
    out.push_str(&format!("|{}\n", "---|".repeat(29)));
    for (backend, s) in rows {
        let phases: Vec<String> = s.phases.iter().map(u32::to_string).collect();
        out.push_str(&format!(
            "| {backend} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} \
             | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} |\n",
            s.stops(),
            s.kills,
            s.kills_alone,
            ms(s.codex_gone.iter().copied().max().unwrap_or_default()),
            s.terms,
            s.pauses_alone,
            s.pauses_rival,
            phases.join(" | "),
            s.rivals_took,
            s.rivals_waited,
            s.lost_to_rival,
            s.lost_alone,
            s.lost,
            s.fallbacks,
            s.warnings,
            s.repeated,
            s.retold_after_stop,
            s.resumed,
            s.started,
            s.fell_back,
            s.turns_kept,
            ms(percentile(&s.restarts, 0.5)),
            ms(s.restarts.iter().copied().max().unwrap_or_default()),
            s.wall.as_secs_f64(),
        ));
    }
    out
}
