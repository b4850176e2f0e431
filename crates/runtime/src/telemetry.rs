//! What the runtime tells an operator: `tracing` spans and `metrics` counters and histograms.
//! The names are this module's constants; the library installs no subscriber and no exporter
//! (the host chooses them; the `rethread` CLI installs a `tracing-subscriber` on stderr).
//!
//! # Spans
//!
//! All at level `INFO`, target `rethread_runtime::...`. Fields left empty when a span opens are
//! recorded before it closes.
//!
//! | span | where | fields |
//! |---|---|---|
//! | [`SPAN_OPEN`] | [`SessionBinder::open`](crate::SessionBinder::open) | `session_id`, `thread_id`, `outcome` (`resumed`, `started`, `fell_back`, `failed`), `reason` |
//! | [`SPAN_RESUME`] | the `thread/resume` attempts of an open | `session_id`, `thread_id`, `outcome` (`resumed`, `lost`, `failed`), `attempts` |
//! | [`SPAN_FALLBACK`] | giving a lost thread up and starting its replacement | `session_id`, `previous_thread_id`, `reason`, `thread_id`, `seeded`, `outcome` |
//! | [`SPAN_TURN`] | a turn of a [`CodexSession`](crate::CodexSession), from `turn/start` to its commit | `session_id`, `thread_id`, `turn_id`, `outcome` (`completed`, `failed`, `interrupted`, `timeout`, `error`, `abandoned`) |
//! | [`SPAN_COMMIT`] | [`binding::commit_turn`](crate::binding::commit_turn) | `session_id`, `thread_id`, `rows`, `outcome` (`published`, `retired_not_published`, `not_durable`, `error`) |
//! | [`SPAN_LEASE`] | [`SessionLease::acquire`](crate::SessionLease::acquire) | `session_id`, `outcome` (`acquired`, `busy`, `error`) |
//!
//! # Metrics
//!
//! Through the [`metrics`] facade: whatever recorder the host installed receives them
//! ([`describe_metrics`] registers their units and descriptions with it).
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | [`OPENS_TOTAL`] | counter | `outcome` (`resumed`, `started`, `fell_back`, `failed`), `reason` (a fallback's `gone` / `incompatible` / `unreadable`, a failure's error kind such as `session_busy`, else `none`) |
//! | [`FALLBACKS_TOTAL`] | counter | `reason` |
//! | [`RESUME_SECONDS`] | histogram | `outcome` (`resumed`, `lost`, `failed`) |
//! | [`COMMIT_SECONDS`] | histogram | `outcome` (as [`SPAN_COMMIT`]) |
//! | [`LEASE_WAIT_SECONDS`] | histogram | `outcome` (`acquired`, `busy`, `error`) |
//! | [`TURNS_TOTAL`] | counter | `outcome` (as [`SPAN_TURN`]) |
//! | [`TURN_SECONDS`] | histogram | `outcome` |
//! | [`SUBSCRIBERS_CUT_OFF_TOTAL`] | counter | - |
//!
//! Labels never carry a session or thread id: their number would grow without bound. The ids
//! are on the spans.

use metrics::Unit;

/// Span: a binder opens a codex session for a host session.
pub const SPAN_OPEN: &str = "rethread.open";
/// Span: the `thread/resume` attempts of an open.
pub const SPAN_RESUME: &str = "rethread.resume";
/// Span: a lost thread is given up and a new one started.
pub const SPAN_FALLBACK: &str = "rethread.fallback";
/// Span: one turn, from `turn/start` to its commit.
pub const SPAN_TURN: &str = "rethread.turn";
/// Span: a completed turn's rows and binding are committed.
pub const SPAN_COMMIT: &str = "rethread.commit";
/// Span: a session's lease is taken.
pub const SPAN_LEASE: &str = "rethread.lease";

/// Counter: opens, by `outcome` and `reason`.
pub const OPENS_TOTAL: &str = "rethread_opens_total";
/// Counter: threads given up because codex could not hand them back, by `reason`.
pub const FALLBACKS_TOTAL: &str = "rethread_fallbacks_total";
/// Histogram (seconds): from the first `thread/resume` to its verdict, by `outcome`.
pub const RESUME_SECONDS: &str = "rethread_resume_seconds";
/// Histogram (seconds): committing a completed turn (rows, then the binding), by `outcome`.
pub const COMMIT_SECONDS: &str = "rethread_commit_seconds";
/// Histogram (seconds): taking a session's lease, waits for a busy one included, by `outcome`.
pub const LEASE_WAIT_SECONDS: &str = "rethread_lease_wait_seconds";
/// Counter: turns, by `outcome`.
pub const TURNS_TOTAL: &str = "rethread_turns_total";
/// Histogram (seconds): a turn from `turn/start` to its commit, by `outcome`.
pub const TURN_SECONDS: &str = "rethread_turn_seconds";
/// Counter: thread subscriptions cut off for falling a whole buffer behind.
pub const SUBSCRIBERS_CUT_OFF_TOTAL: &str = "rethread_subscribers_cut_off_total";

/// Registers the unit and a description of every metric above with the installed recorder.
/// Optional: a recorder records them without it; exporters that print help text use it.
pub fn describe_metrics() {
    metrics::describe_counter!(
        OPENS_TOTAL,
        Unit::Count,
        "Codex sessions opened for host sessions, by outcome and reason."
    );
    metrics::describe_counter!(
        FALLBACKS_TOTAL,
        Unit::Count,
        "Bound threads codex could not hand back, given up and replaced, by reason."
    );
    metrics::describe_histogram!(
        RESUME_SECONDS,
        Unit::Seconds,
        "Time from the first thread/resume of a bound thread to its verdict."
    );
    metrics::describe_histogram!(
        COMMIT_SECONDS,
        Unit::Seconds,
        "Time to make a completed turn's rows durable and publish the binding."
    );
    metrics::describe_histogram!(
        LEASE_WAIT_SECONDS,
        Unit::Seconds,
        "Time to take a session's lease, waiting for another holder included."
    );
    metrics::describe_counter!(TURNS_TOTAL, Unit::Count, "Turns run, by outcome.");
    metrics::describe_histogram!(
        TURN_SECONDS,
        Unit::Seconds,
        "Time from turn/start to the turn's commit (or its failure)."
    );
    metrics::describe_counter!(
        SUBSCRIBERS_CUT_OFF_TOTAL,
        Unit::Count,
        "Thread subscriptions cut off for falling a whole buffer behind."
    );
}
