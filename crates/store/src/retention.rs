//! Retention: what [`BindingStore::prune_sessions`](crate::BindingStore::prune_sessions) is
//! asked and answers, and what a session holds in the store
//! ([`BindingStore::session_bytes`](crate::BindingStore::session_bytes)).

use std::time::Duration;

use serde::Serialize;

use crate::engine::Request;
use crate::logic::{self, ReadTxn, WriteTxn};
use crate::{BindingStore, Result};

/// The default number of sessions one prune transaction removes at most.
pub const DEFAULT_PRUNE_BATCH: usize = 64;

/// Which sessions a prune removes: those idle for at least `idle`.
///
/// ```
/// use std::time::Duration;
/// use rethread_store::Prune;
/// let prune = Prune::idle(Duration::from_secs(30 * 24 * 3600)).dry_run(true);
/// assert!(prune.dry_run);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Prune {
    /// A session is idle when it was last written (its last committed turn, or any later
    /// write of it) at least this long ago, by the store's clock.
    pub idle: Duration,
    /// Remove nothing; report what would go.
    pub dry_run: bool,
    /// At most this many sessions are removed per write transaction (at least 1), so that a
    /// live store's other writers wait for one batch at most.
    pub batch: usize,
}

impl Prune {
    /// Sessions idle for `idle`, removed in batches of [`DEFAULT_PRUNE_BATCH`].
    pub fn idle(idle: Duration) -> Self {
        Prune {
            idle,
            dry_run: false,
            batch: DEFAULT_PRUNE_BATCH,
        }
    }

    /// Sets whether nothing is removed.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// Sets the batch size.
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }
}

/// What a prune removed (or, in a dry run, would remove).
///
/// It lists records by kind: sessions, and lease records left without a session. Records of
/// other kinds the store may keep later (a thread kept without a session) get a list of their
/// own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PruneReport {
    /// The sessions removed, in session-id order: record, rows, mirror, threads and lease.
    pub sessions: Vec<PrunedSession>,
    /// Idle sessions kept because their lease is live, in session-id order.
    pub kept_leased: Vec<String>,
    /// The sessions whose lease record was removed without a session record to go with it
    /// (a session forgotten, or leased and left before its first turn), in session-id order:
    /// records last live (held, or released or forgotten) before the idle span.
    pub leases: Vec<String>,
}

/// One session a prune removed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PrunedSession {
    /// The session id.
    pub session_id: String,
    /// When it was last written (ms since the Unix epoch, store clock).
    pub updated_at_ms: i64,
    /// Its transcript rows.
    pub row_count: u64,
    /// What it held in the store.
    pub bytes: StoredBytes,
}

/// What a session holds in the store: its transcript rows as stored (their JSON text) and
/// its mirrored rollout bytes. Record and index overhead is not counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct StoredBytes {
    /// The bytes of its transcript rows.
    pub rows: u64,
    /// The bytes of its rollout mirror.
    pub mirror: u64,
}

impl StoredBytes {
    /// Rows and mirror together.
    pub fn total(&self) -> u64 {
        self.rows.saturating_add(self.mirror)
    }
}

/// [`BindingStore::prune_sessions`] : a read lists a page of candidates, a write
/// per batch removes those still idle (`logic::prune`); then the backend reclaims what the
/// batches removed ([`Engine::reclaim`](crate::engine::Engine::reclaim)), also after a batch failed.
pub(crate) async fn prune(store: &BindingStore, prune: &Prune) -> Result<PruneReport> {
    let mut report = PruneReport::default();
    let pruned = prune_batches(store, prune, &mut report).await;
    let reclaimed = match report.sessions.is_empty() || prune.dry_run {
        true => Ok(()),
        false => reclaim_all(store).await,
    };
    pruned.and(reclaimed).map(|()| report)
}

/// Reclaims step by step until nothing is left to give back, or a step gave nothing back
/// (readers holding the checkpoint, a failed step: the backend's own upkeep goes on later).
/// Each step is a write of its own, bounded ([`Engine::reclaim`](crate::engine::Engine::reclaim)): other writers wait for
/// one step at most, never for the whole.
async fn reclaim_all(store: &BindingStore) -> Result<()> {
    let mut before = u64::MAX;
    loop {
        let left = store.reclaim().await?;
        if left == 0 || left >= before {
            return Ok(());
        }
        before = left;
    }
}

async fn prune_batches(
    store: &BindingStore,
    prune: &Prune,
    report: &mut PruneReport,
) -> Result<()> {
    type Page = fn(&mut dyn ReadTxn, Option<&str>, i64, usize) -> PageResult;
    type PageResult = Result<(Vec<String>, Option<String>)>;
    type Apply = fn(&mut dyn WriteTxn, i64, &[String], i64, bool) -> Result<logic::prune::Batch>;
    let idle_ms = prune.idle.as_millis().min(i64::MAX as u128) as i64;
    let (batch, dry_run) = (prune.batch.max(1), prune.dry_run);
    // Sessions first; then the lease records left without a session (a pruned session's
    // went with it).
    let kinds: [(Page, Apply); 2] = [
        (logic::prune::idle_page, logic::prune::prune_batch),
        (logic::prune::stale_lease_page, logic::prune::prune_leases),
    ];
    for (page, apply) in kinds {
        let mut after: Option<String> = None;
        loop {
            // Candidates by this host's clock; each write checks again by the store's.
            let cutoff = store.clock().now_ms().saturating_sub(idle_ms);
            let from = after.take();
            let read = move |txn: &mut dyn ReadTxn| page(txn, from.as_deref(), cutoff, batch);
            let (ids, next) = store.read("prune_sessions", read).await?;
            if !ids.is_empty() {
                let locked = ids.clone();
                let request = Request::of("prune_sessions", &locked);
                let write =
                    move |txn: &mut dyn WriteTxn, now| apply(txn, now, &ids, idle_ms, dry_run);
                let done = store.write(request, write).await?;
                report.sessions.extend(done.removed);
                report.kept_leased.extend(done.leased);
                report.leases.extend(done.leases);
            }
            match next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
    }
    Ok(())
}
