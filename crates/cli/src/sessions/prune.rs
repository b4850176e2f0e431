//! `rethread sessions prune --idle DURATION [--dry-run] [--json]`.

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
    /// as `30d`, `12h`, `90s`, `1w`, `1h 30min`; units `s`, `min`, `h`, `d`, `w`, `mo` (30
    /// days), `y` (365 days). A bare `m` (minutes or months?), zero and less than a second are
    /// refused.
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

/// The units of a span ([`parse_span`]) and their seconds: a day is 24 hours, a month 30
/// days, a year 365 days (a span is a length, never read against a calendar).
const SPAN_UNITS: [(&str, u64); 7] = [
    ("s", 1),
    ("min", 60),
    ("h", 3_600),
    ("d", 86_400),
    ("w", 7 * 86_400),
    ("mo", 30 * 86_400),
    ("y", 365 * 86_400),
];

/// What every refused span is told: the form and the units.
const SPAN_FORM: &str = "give whole numbers with units, such as 30d, 12h or 1h 30min (units: \
                         s, min, h, d, w, mo = 30 days, y = 365 days)";

/// Reads a span of time: one or more parts `<whole number><unit>` ([`SPAN_UNITS`], any case),
/// spaces allowed between them (`1h 30min`). A bare `m` is refused as ambiguous (minutes or
/// months: `min` or `mo`), and so is a span under one second (zero, which would take every
/// session not leased). The one reader of a span in the CLI (`sessions prune --idle`); its
/// errors name the form and the units.
pub(crate) fn parse_span(text: &str) -> Result<Duration, String> {
    let refused = |why: &str| format!("`{text}` is not a span{why}; {SPAN_FORM}");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(refused(""));
    }
    let mut secs: u64 = 0;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let number: u64 = match rest[..digits].parse() {
            Ok(number) => number,
            Err(_) if digits == 0 => return Err(refused("")),
            Err(_) => return Err(refused(" (too long)")),
        };
        let after_number = rest[digits..].trim_start();
        let letters = after_number.len()
            - after_number
                .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                .len();
        let unit = after_number[..letters].to_ascii_lowercase();
        if unit == "m" {
            return Err(format!(
                "`{text}`: `m` could be minutes or months; write `min` (minutes) or `mo` \
                 (months of 30 days)"
            ));
        }
        let Some(&(_, per)) = SPAN_UNITS.iter().find(|(name, _)| *name == unit) else {
            return Err(refused(""));
        };
        secs = number
            .checked_mul(per)
            .and_then(|part| secs.checked_add(part))
            .ok_or_else(|| refused(" (too long)"))?;
        rest = after_number[letters..].trim_start();
    }
    if secs == 0 {
        return Err(format!(
            "`{text}` is zero, which would remove every session not leased; the shortest span \
             is 1s"
        ));
    }
    Ok(Duration::from_secs(secs))
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
pub(super) async fn run(store: BindingStore, args: PruneArgs) -> CliResult {
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
    use super::parse_span;

    #[test]
    fn idle_spans_read_as_people_write_them() {
        let secs = |text| parse_span(text).map(|d| d.as_secs());
        assert_eq!(secs("30d"), Ok(30 * 86_400));
        assert_eq!(secs("12h"), Ok(12 * 3_600));
        assert_eq!(secs("90s"), Ok(90));
        assert_eq!(secs("1w"), Ok(7 * 86_400));
        assert_eq!(secs("1h 30min"), Ok(5_400));
        assert_eq!(secs("1h30min"), Ok(5_400));
        assert_eq!(secs(" 2D "), Ok(2 * 86_400));
        assert_eq!(secs("1s"), Ok(1));
        assert_eq!(secs("1min"), Ok(60));
        for bad in [
            "",
            "30",
            "thirty days",
            "-1d",
            "d30",
            "P2D",
            "1.5h",
            "99999999999999y",
        ] {
            let refused = parse_span(bad).unwrap_err();
            assert!(refused.contains("s, min, h, d, w, mo"), "{bad}: {refused}");
        }
    }

    /// Issue 41, item 7: `1m` was a minute where an operator may mean a month; `1M` and `1y`
    /// were refused (`1y` naming `jiff::SpanRelativeTo`); `0` was refused but `0s`, `1ms` and
    /// `1ns` meant everything not leased.
    #[test]
    fn a_span_is_months_or_years_as_said_never_ambiguous_never_under_a_second() {
        let secs = |text| parse_span(text).map(|d| d.as_secs());
        assert_eq!(secs("1mo"), Ok(30 * 86_400));
        assert_eq!(secs("1y"), Ok(365 * 86_400));
        assert_eq!(secs("1Y 1MO"), Ok(395 * 86_400));
        for ambiguous in ["1m", "1M", "1h 30m"] {
            let refused = parse_span(ambiguous).unwrap_err();
            assert!(
                refused.contains("`min`") && refused.contains("`mo`"),
                "{ambiguous}: {refused}"
            );
        }
        for under_a_second in ["0", "0s", "0d 0h", "1ms", "1ns", "1us"] {
            let refused = parse_span(under_a_second).unwrap_err();
            assert!(!refused.contains("jiff"), "{under_a_second}: {refused}");
        }
        assert!(parse_span("0s")
            .unwrap_err()
            .contains("shortest span is 1s"));
        for text in ["1M", "1ms", "5 fortnights"] {
            let refused = parse_span(text).err().unwrap_or_default();
            assert!(
                !refused.contains("jiff") && !refused.contains("Span"),
                "{text}: {refused}"
            );
        }
    }
}
