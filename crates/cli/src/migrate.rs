//! `rethread migrate`: copy every session between backends, verified (`copy_sessions`): one
//! at a time, page by page; importing an identical session is a no-op, so an interrupted
//! migration rerun completes without duplicates. Each side has its own key file (or none):
//! a copy seals, unseals or moves to a new key.

use std::path::Path;

use rethread_store::{copy_sessions, redact_url, StoreKey};
use serde_json::json;

use crate::output::{self, outln};
use crate::{open_store_url, Access, CliResult};

/// Copies every session of `from` into `to`, each a store URL and its key file, if any. With
/// `json`, one object on stdout (passwords redacted).
pub(crate) async fn run(
    (from, from_key_file): (&str, Option<&Path>),
    (to, to_key_file): (&str, Option<&Path>),
    json: bool,
) -> CliResult {
    // Options that do not go together: a usage error, before either store is opened.
    if from == to {
        return Err(output::UsageError("--from and --to name the same store".into()).into());
    }
    // Both keys are read before either store is opened: a refused key file changes nothing.
    let read_key = |path: Option<&Path>| {
        path.map(StoreKey::read)
            .transpose()
            .map_err(|error| output::UsageError(error.to_string()))
    };
    let (from_key, to_key) = (read_key(from_key_file)?, read_key(to_key_file)?);
    let source = open_store_url(from, Access::Read, from_key).await?;
    let target = open_store_url(to, Access::Write(std::time::Duration::ZERO), to_key).await?;
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
