//! `rethread verify`: check every record of the store ([`BindingStore::verify`]). Exit 1 when
//! damage was found or the check could not reach the end, 75 when the store is locked by
//! another process; with `--json` one object on stdout, also when damage was found.

use std::io::stdout;

use anstyle::AnsiColor;
use rethread_store::{BindingStore, VerifyReport};
use serde_json::json;

use crate::output::{self, for_people, outln};
use crate::CliResult;

/// Checks `store` (named `label`, password redacted) and prints the report.
pub(crate) async fn run(store: BindingStore, label: &str, json: bool) -> CliResult {
    let bar = output::progress(0, "verifying");
    let report = store
        .verify(&mut |progress| {
            if let Some(total) = progress.total_sessions {
                output::set_length(&bar, total);
            }
            bar.set_position(progress.sessions);
        })
        .await?;
    output::finish(&bar);
    if json {
        outln!(
            "{}",
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
        );
    } else {
        print_human(label, &report);
    }
    if report.is_ok() {
        return Ok(());
    }
    let unchecked = match report.complete {
        true => "",
        false => "; the check stopped at the damage, the rest is unchecked",
    };
    let count = report.problem_count();
    Err(format!("store {label} is damaged: {count} problem(s) found{unchecked}").into())
}

fn print_human(label: &str, report: &VerifyReport) {
    if !report.problems.is_empty() {
        let mut table = output::table();
        table.set_header(["PROBLEM", "SESSION", "DETAIL"]);
        table.add_rows(report.problems.iter().map(|problem| {
            let kind = serde_json::to_value(problem.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| format!("{:?}", problem.kind));
            let session = problem.session_id.as_deref().unwrap_or("-");
            let detail = output::one_line(&problem.detail);
            [
                kind,
                for_people(session).into_owned(),
                for_people(&detail).into_owned(),
            ]
        }));
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
        let verified = output::paint(&stdout(), AnsiColor::Green.on_default(), "verified");
        outln!("{verified} {label}: {counts}, no problems");
    } else {
        let damaged = output::paint(&stdout(), AnsiColor::Red.on_default(), "damaged");
        let stopped = match report.complete {
            true => "",
            false => "; the check stopped at the damage",
        };
        let count = report.problem_count();
        outln!("{damaged} {label}: {counts} checked, {count} problem(s){stopped}");
    }
}
