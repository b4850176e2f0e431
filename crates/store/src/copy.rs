//! Copying every session from one store to another: what `rethread migrate` runs.

use serde::Serialize;

use crate::Result;
use crate::{BindingStore, ImportOutcome, StoreError};

/// How many sessions [`copy_sessions`] lists at a time.
const PAGE: usize = 64;

/// What [`copy_sessions`] did.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CopyReport {
    /// Sessions read from the source (each copied or found present, and verified).
    pub sessions: u64,
    /// Sessions written to the target.
    pub copied: u64,
    /// Sessions the target already held, identical (a rerun after an interruption).
    pub already_present: u64,
    /// Transcript rows of the sessions written (not of those already present).
    pub rows_copied: u64,
    /// Mirrored rollout bytes of the sessions written.
    pub mirror_bytes_copied: u64,
}

/// Where [`copy_sessions`] is: passed to its progress callback after each session.
#[non_exhaustive]
#[derive(Clone, Copy, Debug)]
pub struct CopyProgress<'a> {
    /// The session just copied (or found present) and verified.
    pub session_id: &'a str,
    /// Whether it was written or already there.
    pub outcome: ImportOutcome,
    /// The totals so far, this session included.
    pub report: &'a CopyReport,
}

/// Copies every session of `from` into `to` (whole sessions, mirror included), verifies each
/// copy, and reports what it did.
///
/// - It streams: sessions are listed page by page and copied one at a time (export, then
///   import: one transaction each), so memory does not grow with the store.
/// - Resumable: importing a session identical to the target's is a no-op, so a rerun
///   completes an interrupted copy without duplicating anything.
/// - Verified: each session is read back from `to` and must equal what was read from `from`.
/// - `progress` is called after each session.
///
/// Errors: a session of `to` that differs from the source's, or a copy that does not read
/// back identical, is [`StoreError::Conflict`]; a session deleted from the source during the
/// copy is [`StoreError::NotFound`]; either store's errors are returned as they are. Sessions
/// copied before an error stay copied.
pub async fn copy_sessions(
    from: &BindingStore,
    to: &BindingStore,
    progress: &mut (dyn FnMut(&CopyProgress<'_>) + Send),
) -> Result<CopyReport> {
    let mut report = CopyReport::default();
    let mut after: Option<String> = None;
    loop {
        let page = from.list_sessions(after.as_deref(), PAGE).await?;
        for listed in &page.sessions {
            let id = listed.session_id.as_str();
            let export = from
                .export_session(id)
                .await?
                .ok_or_else(|| StoreError::NotFound {
                    what: format!("session {id} (deleted from the source during the copy)"),
                })?;
            let rows = export.rows.len() as u64;
            let mirror_bytes: u64 = export.mirror.iter().map(|c| c.bytes.len() as u64).sum();
            let outcome = to.import_session(export.clone()).await?;
            if to.export_session(id).await?.as_ref() != Some(&export) {
                return Err(StoreError::Conflict {
                    session_id: id.to_string(),
                    detail: "the copy does not read back identical to the source".to_string(),
                });
            }
            report.sessions += 1;
            match outcome {
                ImportOutcome::Imported => {
                    report.copied += 1;
                    report.rows_copied += rows;
                    report.mirror_bytes_copied += mirror_bytes;
                }
                ImportOutcome::AlreadyPresent => report.already_present += 1,
            }
            progress(&CopyProgress {
                session_id: id,
                outcome,
                report: &report,
            });
        }
        match page.next_after {
            Some(next) => after = Some(next),
            None => return Ok(report),
        }
    }
}
