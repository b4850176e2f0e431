//! `rethread migrate`: copy every session between backends, then verify.
//!
//! Each session is imported whole in one transaction, and importing an identical session is a
//! no-op, so an interrupted migration rerun completes without duplicates.

use rethread_store::{redact_url, BindingStore, BindingStoreExt, ImportOutcome};

use crate::{open_store_url, output, CliResult};

pub(crate) async fn run(from: &str, to: &str) -> CliResult {
    if from == to {
        return Err("--from and --to name the same store".into());
    }
    let source = open_store_url(from).await?;
    let target = open_store_url(to).await?;
    // Only ever shown without their passwords.
    let (from, to) = (redact_url(from), redact_url(to));
    let sessions = source.all_sessions().await?;
    let bar = output::progress(sessions.len() as u64, "migrating");
    let (mut copied, mut present) = (0usize, 0usize);
    for record in &sessions {
        let export = source
            .export_session(&record.session_id)
            .await?
            .ok_or_else(|| {
                format!(
                    "session {} vanished from the source during the migration",
                    record.session_id
                )
            })?;
        match target
            .import_session(export)
            .await
            .map_err(|e| format!("session {}: {e}", record.session_id))?
        {
            ImportOutcome::Imported => copied += 1,
            _ => present += 1,
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    // Verification: every session reads back identical from the target.
    let bar = output::progress(sessions.len() as u64, "verifying");
    for record in &sessions {
        let expected = source.export_session(&record.session_id).await?;
        let actual = target.export_session(&record.session_id).await?;
        if expected != actual {
            return Err(format!(
                "verification failed: session {} differs in {to}",
                record.session_id
            )
            .into());
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    println!(
        "migrated {} session(s) from {from} to {to}: {copied} copied, {present} already present; verified",
        sessions.len()
    );
    Ok(())
}
