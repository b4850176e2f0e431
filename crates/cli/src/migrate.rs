//! `rethread migrate`: copy every session between backends, verified (`copy_sessions`).
//!
//! Sessions are copied one at a time, page by page (memory does not grow with the store);
//! importing an identical session is a no-op, so an interrupted migration rerun completes
//! without duplicates.

use crate::output::outln;
use rethread_store::{copy_sessions, redact_url, BindingStoreExt};
use serde_json::json;

use crate::{open_store_url, output, Access, CliResult};

/// Copies every session of `from` into `to`. With `json`, one object on stdout: `from` and `to`
/// (passwords redacted), `sessions`, `copied`, `already_present`, `rows_copied`,
/// `mirror_bytes_copied` (the sessions' mirrored rollouts go with them), `verified`.
pub(crate) async fn run(from: &str, to: &str, json: bool) -> CliResult {
    // Options that do not go together: a usage error (exit 2), before either store is opened.
    if from == to {
        return Err(output::UsageError("--from and --to name the same store".into()).into());
    }
    let source = open_store_url(from, Access::Read).await?;
    let target = open_store_url(to, Access::Write(std::time::Duration::ZERO)).await?;
    // Only ever shown without their passwords.
    let (from, to) = (redact_url(from), redact_url(to));
    let total = source.count_sessions().await?;
    let bar = output::progress(total, "migrating");
    let report = copy_sessions(source.as_ref(), target.as_ref(), &mut |_| bar.inc(1))
        .await
        .map_err(|e| format!("migrating from {from} to {to}: {e}"))?;
    output::finish(&bar);
    if json {
        outln!(
            "{}",
            json!({
                "from": from,
                "to": to,
                "sessions": report.sessions,
                "copied": report.copied,
                "already_present": report.already_present,
                "rows_copied": report.rows_copied,
                "mirror_bytes_copied": report.mirror_bytes_copied,
                // copy_sessions returns only once every copy read back identical.
                "verified": true,
            })
        );
        return Ok(());
    }
    outln!(
        "migrated {} session(s) from {from} to {to}: {} copied, {} already present; verified",
        report.sessions,
        report.copied,
        report.already_present
    );
    Ok(())
}
