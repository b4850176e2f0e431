//! `rethread verify`: check the whole store ([`BindingStore::verify`]).
//!
//! Opening a store reads its header only and a read checks what it touches; this reads every
//! record. Exit 0 when the store is clean; 1 ([`output::EXIT_FAILED`]) when damage was found or
//! the check could not reach the end; 75 when the store is locked by another process. With
//! `--json`, one object on stdout also when damage was found.

use crate::output::outln;
use std::sync::Arc;

use anstyle::AnsiColor;
use rethread_store::{BindingStore, Problem, VerifyReport};
use serde_json::{json, Value};

use crate::{output, CliResult};

/// The store held damage: the report was printed; the exit code is [`output::EXIT_FAILED`]
/// (the default of [`output::exit_code`] for an error that is none of its own).
#[derive(Debug)]
pub(crate) struct Damaged {
    /// The store, password redacted.
    store: String,
    /// How many problems were found.
    problems: u64,
    /// Whether the check reached the end of the store.
    complete: bool,
}

impl std::fmt::Display for Damaged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "store {} is damaged: {} problem(s) found",
            self.store, self.problems
        )?;
        if !self.complete {
            write!(
                f,
                "; the check stopped at the damage, the rest is unchecked"
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for Damaged {}

/// Checks `store` (named `label`, password redacted) and prints the report.
pub(crate) async fn run(store: Arc<dyn BindingStore>, label: &str, json: bool) -> CliResult {
    let bar = output::progress(0, "verifying");
    let report = store
        .verify(&mut |progress| {
            if let Some(total) = progress.total_sessions {
                bar.set_length(total);
            }
            bar.set_position(progress.sessions);
        })
        .await?;
    output::finish(&bar);
    if json {
        outln!("{}", report_json(label, &report));
    } else {
        print_human(label, &report);
    }
    if report.is_ok() {
        Ok(())
    } else {
        Err(Box::new(Damaged {
            store: label.to_string(),
            problems: report.problem_count(),
            complete: report.complete,
        }))
    }
}

/// `{"store", "ok", "complete", "sessions", "rows", "leases", "mirror_files", "mirror_bytes",
/// "problems": [{"kind", "session_id", "detail"}], "unlisted_problems"}`.
fn report_json(label: &str, report: &VerifyReport) -> Value {
    json!({
        "store": label,
        "ok": report.is_ok(),
        "complete": report.complete,
        "sessions": report.sessions,
        "rows": report.rows,
        "leases": report.leases,
        "mirror_files": report.mirror_files,
        "mirror_bytes": report.mirror_bytes,
        "problems": report.problems,
        "unlisted_problems": report.unlisted_problems,
    })
}

fn print_human(label: &str, report: &VerifyReport) {
    if !report.problems.is_empty() {
        let mut table = output::table();
        table.set_header(["PROBLEM", "SESSION", "DETAIL"]);
        for problem in &report.problems {
            table.add_row(describe(problem));
        }
        output::print_table(&mut table);
    }
    if report.unlisted_problems > 0 {
        outln!("... and {} more problem(s)", report.unlisted_problems);
    }
    let counts = format!(
        "{} session(s), {} row(s), {} lease(s)",
        report.sessions, report.rows, report.leases
    );
    if report.is_ok() {
        outln!(
            "{} {label}: {counts}, no problems",
            output::paint(output::Stream::Stdout, AnsiColor::Green, "verified")
        );
    } else {
        outln!(
            "{} {label}: {counts} checked, {} problem(s){}",
            output::paint(output::Stream::Stdout, AnsiColor::Red, "damaged"),
            report.problem_count(),
            if report.complete {
                ""
            } else {
                "; the check stopped at the damage"
            }
        );
    }
}

/// One problem as a row: its kind, its session (`-` for none) and its detail on one line, the
/// text for people.
fn describe(problem: &Problem) -> [String; 3] {
    let kind = serde_json::to_value(problem.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{:?}", problem.kind));
    let session = problem.session_id.as_deref().unwrap_or("-");
    let detail = problem
        .detail
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    [
        kind,
        output::for_people(session).into_owned(),
        output::for_people(&detail).into_owned(),
    ]
}
