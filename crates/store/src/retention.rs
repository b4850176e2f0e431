//! Retention: what [`BindingStore::prune_sessions`](crate::BindingStore::prune_sessions) is
//! asked and answers, and what a session holds in the store
//! ([`BindingStore::session_bytes`](crate::BindingStore::session_bytes)).

use std::time::Duration;

use serde::Serialize;

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
