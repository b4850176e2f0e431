//! `rethread sessions prune --idle DURATION [--dry-run] [--json]`.

use std::sync::Arc;
use std::time::Duration;

use comfy_table::{Cell, CellAlignment};
use rethread_store::{BindingStore, Prune};
use serde_json::json;

use super::format_ms;
use crate::output::{self, for_people, outln};
use crate::{CliResult, StoreArg};

#[derive(Debug, clap::Args)]
pub(crate) struct PruneArgs {
    #[command(flatten)]
    pub(super) store: StoreArg,
    /// Remove the sessions idle at least this long (last written that long ago): a span such
    /// as `30d`, `12h`, `90s`, `1w`, `1h 30m` (a day is 24 hours).
    #[arg(long, value_name = "DURATION", value_parser = parse_span)]
    idle: Duration,
    /// Remove nothing; list what would be removed.
    #[arg(long)]
    dry_run: bool,
    /// Print one JSON object: `dry_run`, `idle_secs`, `removed` (each `kind`: `session`, or
    /// `thread` for a thread kept without a session, with `thread` (null for a session),
    /// `session` (its record), `updated_at_ms`, `row_count`, `stored_bytes`, `row_bytes`,
    /// `mirror_bytes`; or `lease`, a lease record left without a session, with `session`),
    /// `stored_bytes` (the sessions' total), `kept_leased` (idle sessions a live host holds).
    #[arg(long)]
    json: bool,
}

/// A span for `--idle`: jiff's friendly format (`30d`, `12h`, `90s`, `1w 2d`) or ISO 8601
/// (`P30D`), days and weeks taken as 24 hours and 7 days; months and years are refused (their
/// length depends on the date), and so is a negative span.
fn parse_span(text: &str) -> Result<Duration, String> {
    let refused = |why: String| format!("`{text}` is not a span such as 30d, 12h or 90s: {why}");
    let span: jiff::Span = text.trim().parse().map_err(|e| refused(format!("{e}")))?;
    let duration = span
        .to_duration(jiff::SpanRelativeTo::days_are_24_hours())
        .map_err(|e| refused(format!("{e}")))?;
    Duration::try_from(duration).map_err(|_| refused("it is negative".to_string()))
}

impl PruneArgs {
    /// What `--json` prints when the prune fails, before its `error` is added: `dry_run` and
    /// `idle_secs` (`None` without `--json`).
    pub(super) fn json_failure(&self) -> Option<serde_json::Value> {
        self.json
            .then(|| json!({"dry_run": self.dry_run, "idle_secs": self.idle.as_secs()}))
    }
}

/// Prunes (or, with `--dry-run`, lists) the idle sessions, and says what went.
pub(super) async fn run(store: Arc<dyn BindingStore>, args: PruneArgs) -> CliResult {
    let prune = Prune::idle(args.idle).dry_run(args.dry_run);
    let report = store.prune_sessions(prune).await?;
    let total: u64 = report.sessions.iter().map(|p| p.bytes.total()).sum();
    if args.json {
        let removed: Vec<_> = report
            .sessions
            .iter()
            .map(|p| {
                // A thread kept without a session is a record of its own kind.
                let thread = rethread_runtime::kept::thread_of(&p.session_id);
                json!({
                    "kind": if thread.is_some() { "thread" } else { "session" },
                    "thread": thread,
                    "session": p.session_id,
                    "updated_at_ms": p.updated_at_ms,
                    "row_count": p.row_count,
                    "stored_bytes": p.bytes.total(),
                    "row_bytes": p.bytes.rows,
                    "mirror_bytes": p.bytes.mirror,
                })
            })
            .chain((report.leases.iter()).map(|id| json!({"kind": "lease", "session": id})))
            .collect();
        let out = json!({
            "dry_run": args.dry_run,
            "idle_secs": args.idle.as_secs(),
            "removed": removed,
            "stored_bytes": total,
            "kept_leased": report.kept_leased,
        });
        outln!("{out}");
        return Ok(());
    }
    if !report.sessions.is_empty() || !report.leases.is_empty() {
        // One row per record, of the kinds `--json` names: a lease record left without a
        // session is listed by its session id, with nothing else to say of it.
        let mut table = output::table();
        table.set_header(["KIND", "SESSION", "LAST WRITTEN", "ROWS", "BYTES"]);
        table.add_rows(report.sessions.iter().map(|p| {
            let kind = match rethread_runtime::kept::thread_of(&p.session_id) {
                Some(_) => "thread",
                None => "session",
            };
            [
                Cell::new(kind),
                Cell::new(for_people(&p.session_id)),
                Cell::new(format_ms(p.updated_at_ms)),
                Cell::new(p.row_count).set_alignment(CellAlignment::Right),
                Cell::new(p.bytes.total()).set_alignment(CellAlignment::Right),
            ]
        }));
        table.add_rows(report.leases.iter().map(|id| {
            [
                Cell::new("lease"),
                Cell::new(for_people(id)),
                Cell::new("-"),
                Cell::new("-"),
                Cell::new("-"),
            ]
        }));
        output::print_table(&mut table);
    }
    let verb = if args.dry_run {
        "would remove"
    } else {
        "removed"
    };
    let n = report.sessions.len();
    let sessions = if n == 1 { "session" } else { "sessions" };
    outln!("{verb} {n} idle {sessions} ({total} bytes)");
    if !report.leases.is_empty() {
        let n = report.leases.len();
        outln!("{verb} {n} lease record(s) left without a session");
    }
    for kept in &report.kept_leased {
        outln!("kept {} (a live host holds it)", for_people(kept));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::parse_span;

    #[test]
    fn idle_spans_read_as_people_write_them() {
        let secs = |text| parse_span(text).map(|d| d.as_secs());
        assert_eq!(secs("30d"), Ok(30 * 86_400));
        assert_eq!(secs("12h"), Ok(12 * 3_600));
        assert_eq!(secs("90s"), Ok(90));
        assert_eq!(secs("1w"), Ok(7 * 86_400));
        assert_eq!(secs("1h 30m"), Ok(5_400));
        assert_eq!(secs("P2D"), Ok(2 * 86_400));
        assert_eq!(parse_span("0s"), Ok(Duration::ZERO));
        for bad in ["", "30", "thirty days", "1mo", "1y", "-1d", "d30"] {
            assert!(parse_span(bad).is_err(), "{bad}");
        }
    }
}
