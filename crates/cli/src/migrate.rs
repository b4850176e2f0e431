//! `rethread migrate`: copy every session between backends, verified (`copy_sessions`): one
//! at a time, page by page; importing an identical session is a no-op, so an interrupted
//! migration rerun completes without duplicates.

use rethread_store::{copy_sessions, redact_url};
use serde_json::json;

use crate::output::{self, outln};
use crate::{open_store_url, Access, CliResult};

/// Copies every session of `from` into `to`. With `json`, one object on stdout (passwords
/// redacted).
pub(crate) async fn run(from: &str, to: &str, json: bool) -> CliResult {
    // Options that do not go together: a usage error, before either store is opened.
    if from == to {
        return Err(output::UsageError("--from and --to name the same store".into()).into());
    }
    let source = open_store_url(from, Access::Read).await?;
    let target = open_store_url(to, Access::Write(std::time::Duration::ZERO)).await?;
    let (from, to) = (redact_url(from), redact_url(to));
    let bar = output::progress(source.count_sessions().await?, "migrating");
    let report = copy_sessions(&source, &target, &mut |_| bar.inc(1))
        .await
        .map_err(|e| format!("migrating from {from} to {to}: {e}"))?;
    output::finish(&bar);
    if json {
        let report = json!({
            "from": from,
            "to": to,
            "sessions": report.sessions,
            "copied": report.copied,
            "already_present": report.already_present,
            "rows_copied": report.rows_copied,
            "mirror_bytes_copied": report.mirror_bytes_copied,
            // copy_sessions returns only once every copy read back identical.
            "verified": true,
        });
        outln!("{report}");
    } else {
        outln!(
            "migrated {} session(s) from {from} to {to}: {} copied, {} already present; verified",
            report.sessions,
            report.copied,
            report.already_present
        );
    }
    Ok(())
}
