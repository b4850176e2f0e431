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
    /// Threads made unresumable.
    pub(crate) lost: u32,
    /// Give-up writes (the store's retired threads grew).
    pub(crate) fallbacks: u32,
    /// Fallback notices in acknowledged turns.
    pub(crate) notices: u32,
    /// Notices said only on stderr by a host killed after its commit and before its report.
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
        "| backend | kills | int/term | {} | lost | fallbacks | notices | unacked | resumed | started \
         | fell back | restart p50 ms | restart max ms | turn p50 ms | wall s |\n",
        PHASES.join(" | ")
    ));
    out.push_str(&format!("|{}\n", "---|".repeat(19)));
    for (backend, s) in rows {
        let phases: Vec<String> = s.kills_by_phase.iter().map(u32::to_string).collect();
        out.push_str(&format!(
            "| {backend} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} |\n",
            s.kills(),
            s.interrupts,
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
