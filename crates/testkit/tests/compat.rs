//! The compatibility table's rows for the supported releases, as the probe measures them: what
//! the README claims about each release is checked here.

use rethread_protocol::ResumeFailure;
use rethread_testkit::compat::{probe, CompatRow, Outcome};
use rethread_testkit::real::codex_or_skip;
use rethread_testkit::{CURRENT, FLOOR, PREVIOUS};

async fn row(version: &str) -> Option<CompatRow> {
    let codex = codex_or_skip(version)?;
    let row = probe(&codex).await.expect("probe");
    eprintln!("{row}");
    assert_eq!(row.version, version);
    assert!(row.wording_mismatches.is_empty(), "{row}");
    Some(row)
}

fn refused_as(outcome: &Outcome, expected: ResumeFailure) -> bool {
    matches!(outcome, Outcome::Refused { class, .. } if *class == expected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn current_and_previous_start_paginated_threads_and_guard_their_writers() {
    for version in [CURRENT, PREVIOUS] {
        let Some(row) = row(version).await else {
            continue;
        };
        assert_eq!(row.default_history_mode, "paginated", "{row}");
        assert_eq!(row.paginated_resume, Outcome::Served, "{row}");
        assert_eq!(row.exclude_turns, Outcome::Served, "{row}");
        assert!(refused_as(&row.second_writer, ResumeFailure::Busy), "{row}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_starts_legacy_threads_and_refuses_paginated_ones() {
    let Some(row) = row(FLOOR).await else {
        return;
    };
    assert_eq!(row.default_history_mode, "legacy", "{row}");
    assert!(
        refused_as(&row.paginated_resume, ResumeFailure::Incompatible),
        "{row}"
    );
    assert!(
        refused_as(&row.exclude_turns, ResumeFailure::CapabilityRequired),
        "{row}"
    );
    assert_eq!(row.second_writer, Outcome::Served, "{row}");
}
