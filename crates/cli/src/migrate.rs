//! `rethread migrate`: copy every session between backends, verified (`copy_sessions`).
//!
//! Sessions are copied one at a time, page by page (memory does not grow with the store);
//! importing an identical session is a no-op, so an interrupted migration rerun completes
//! without duplicates.

use rethread_store::{copy_sessions, redact_url, BindingStoreExt};

use crate::{open_store_url, output, CliResult};

pub(crate) async fn run(from: &str, to: &str) -> CliResult {
    if from == to {
        return Err("--from and --to name the same store".into());
    }
    let source = open_store_url(from).await?;
    let target = open_store_url(to).await?;
    // Only ever shown without their passwords.
    let (from, to) = (redact_url(from), redact_url(to));
    let total = source.count_sessions().await?;
    let bar = output::progress(total, "migrating");
    let report = copy_sessions(source.as_ref(), target.as_ref(), &mut |_| bar.inc(1))
        .await
        .map_err(|e| format!("migrating from {from} to {to}: {e}"))?;
    bar.finish_and_clear();
    println!(
        "migrated {} session(s) from {from} to {to}: {} copied, {} already present; verified",
        report.sessions, report.copied, report.already_present
    );
    Ok(())
}
