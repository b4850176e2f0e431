//! Pruning idle sessions ([`BindingStore::prune_sessions`](crate::BindingStore::prune_sessions)):
//! a read lists candidates page by page, and a write per batch removes those still idle and
//! not leased, so that a live store's writers wait for one batch at most.
//!
//! Idleness is decided per kind of record; today sessions only. A kind added later (a thread
//! kept without a session) gets its own candidate read and removal here, and a list of its
//! own in [`PruneReport`](crate::PruneReport).

use super::leases::Grant;
use super::{ReadTxn, WriteTxn};
use crate::Result;
use crate::{PrunedSession, StoredBytes};

/// How many records one candidate read looks at, per session of a batch.
const SCAN_PER_BATCH: usize = 8;

/// Up to `batch` sessions after `after` last written before `cutoff`, and where the next read
/// starts (`None`: the end).
pub(crate) fn idle_page(
    txn: &mut dyn ReadTxn,
    after: Option<&str>,
    cutoff: i64,
    batch: usize,
) -> Result<(Vec<String>, Option<String>)> {
    let scan = batch.saturating_mul(SCAN_PER_BATCH);
    let records = txn.list(after, scan)?;
    let mut idle = Vec::new();
    for record in &records {
        if record.updated_at_ms < cutoff {
            idle.push(record.session_id.clone());
            if idle.len() == batch {
                return Ok((idle, Some(record.session_id.clone())));
            }
        }
    }
    let next = (records.len() == scan).then(|| records.last().map(|r| r.session_id.clone()));
    Ok((idle, next.flatten()))
}

/// Up to `batch` sessions after `after` with a lease record last live before `cutoff` and no
/// session record, and where the next read starts (`None`: the end).
pub(crate) fn stale_lease_page(
    txn: &mut dyn ReadTxn,
    after: Option<&str>,
    cutoff: i64,
    batch: usize,
) -> Result<(Vec<String>, Option<String>)> {
    let ids = txn.stale_leases(after.unwrap_or(""), cutoff, batch)?;
    let next = (ids.len() == batch).then(|| ids.last().cloned()).flatten();
    Ok((ids, next))
}

/// What one batch's write removed, and kept for a live lease.
#[derive(Default)]
pub(crate) struct Batch {
    pub(crate) removed: Vec<PrunedSession>,
    pub(crate) leased: Vec<String>,
    /// Lease records removed without a session record.
    pub(crate) leases: Vec<String>,
}

/// Removes the lease record of each of `ids` that still has no session record and was last
/// live before `now - idle_ms` (unless `dry_run`).
pub(crate) fn prune_leases(
    txn: &mut dyn WriteTxn,
    now: i64,
    ids: &[String],
    idle_ms: i64,
    dry_run: bool,
) -> Result<Batch> {
    let cutoff = now.saturating_sub(idle_ms);
    let mut batch = Batch::default();
    for id in ids {
        let grant = txn.leases().load_lease(id)?;
        let stale = grant.is_some_and(|g| g.lease.expires_at_ms < cutoff);
        if !stale || txn.load(id)?.is_some() {
            continue;
        }
        if !dry_run {
            txn.leases().remove_lease(id)?;
        }
        batch.leases.push(id.clone());
    }
    Ok(batch)
}

/// Removes each of `ids` still idle at `now` and whose lease is not live (unless `dry_run`):
/// record, rows, mirror, threads, and lease record.
pub(crate) fn prune_batch(
    txn: &mut dyn WriteTxn,
    now: i64,
    ids: &[String],
    idle_ms: i64,
    dry_run: bool,
) -> Result<Batch> {
    let cutoff = now.saturating_sub(idle_ms);
    let mut batch = Batch::default();
    for id in ids {
        let Some(record) = txn.load(id)? else {
            continue;
        };
        if record.updated_at_ms >= cutoff {
            continue;
        }
        let grant = txn.leases().load_lease(id)?;
        if Grant::refuse_if_busy(grant.as_ref(), None, now).is_err() {
            batch.leased.push(id.clone());
            continue;
        }
        let bytes = StoredBytes {
            rows: txn.row_bytes(id)?,
            mirror: record.mirror.bytes(),
        };
        if !dry_run {
            txn.remove(id)?;
            if grant.is_some() {
                txn.leases().remove_lease(id)?;
            }
        }
        batch.removed.push(PrunedSession {
            session_id: record.session_id,
            updated_at_ms: record.updated_at_ms,
            row_count: record.row_count,
            bytes,
        });
    }
    Ok(batch)
}

/// [`BindingStore::session_bytes`](crate::BindingStore::session_bytes): what each session
/// holds, zero for one not stored.
pub(crate) fn session_bytes(txn: &mut dyn ReadTxn, ids: &[String]) -> Result<Vec<StoredBytes>> {
    ids.iter()
        .map(|id| {
            let Some(record) = txn.load(id)? else {
                return Ok(StoredBytes::default());
            };
            Ok(StoredBytes {
                rows: txn.row_bytes(id)?,
                mirror: record.mirror.bytes(),
            })
        })
        .collect()
}
