//! The data a store keeps.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::LeaseOwner;

/// The `model_config` key that holds the bound codex thread id.
pub const CODEX_THREAD_ID_KEY: &str = "codex_thread_id";

/// The reserved `model_config` key that records a fallback notice still to be shown: set by
/// [`BindingStore::retire_thread`](crate::BindingStore::retire_thread) (the give-up) in the
/// same transaction, removed by the next [`BindingStore::commit_turn`](crate::BindingStore::commit_turn)
/// that publishes a binding. Hosts must not write it: a `patch_config` naming it is refused.
/// Read it through [`SessionRecord::pending_notice`].
pub const PENDING_NOTICE_KEY: &str = "rethread_pending_notice";

/// A fallback notice recorded as pending ([`SessionRecord::pending_notice`]): the session's
/// thread was given up and no new binding has been published since, so the host has maybe
/// not yet shown `Codex thread could not be resumed; starting a new one.`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingNotice {
    /// The thread given up (retired).
    pub thread_id: String,
}

impl PendingNotice {
    /// The value kept under [`PENDING_NOTICE_KEY`].
    pub(crate) fn to_value(&self) -> Value {
        serde_json::json!({ "thread_id": self.thread_id })
    }
}

/// A session's binding to a codex thread.
///
/// The thread id is also present in [`SessionRecord::model_config`] under
/// [`CODEX_THREAD_ID_KEY`]; the store keeps both in agreement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    /// The codex thread id.
    pub thread_id: String,
    /// The `CODEX_HOME` the binding was made under, for diagnostics.
    pub codex_home: Option<String>,
    /// When the binding to this thread was first made (milliseconds since the Unix epoch).
    pub bound_at_ms: i64,
}

/// One session as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// The host's session id.
    pub session_id: String,
    /// The host's configuration object; holds `codex_thread_id` beside the host's own keys.
    pub model_config: Map<String, Value>,
    /// The published binding, if any (agrees with `model_config["codex_thread_id"]`).
    pub binding: Option<Binding>,
    /// How many transcript rows the session has; rows are numbered `0..row_count`.
    pub row_count: u64,
    /// Threads retired for this session, in retirement order; never published again.
    pub retired_threads: Vec<String>,
    /// When the session was created (milliseconds since the Unix epoch).
    pub created_at_ms: i64,
    /// When the session was last written (milliseconds since the Unix epoch).
    pub updated_at_ms: i64,
}

impl SessionRecord {
    /// An empty session created at `now_ms`.
    pub fn new(session_id: impl Into<String>, now_ms: i64) -> Self {
        SessionRecord {
            session_id: session_id.into(),
            model_config: Map::new(),
            binding: None,
            row_count: 0,
            retired_threads: Vec::new(),
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
        }
    }

    /// The bound thread id, if any.
    pub fn thread_id(&self) -> Option<&str> {
        self.binding.as_ref().map(|b| b.thread_id.as_str())
    }

    /// The fallback notice pending for this session, if its thread was given up
    /// ([`BindingStore::retire_thread`](crate::BindingStore::retire_thread)) and no binding
    /// was published since. `None` also when the value under [`PENDING_NOTICE_KEY`] is not a
    /// notice (the store never writes one that is not).
    pub fn pending_notice(&self) -> Option<PendingNotice> {
        let value = self.model_config.get(PENDING_NOTICE_KEY)?;
        serde_json::from_value(value.clone()).ok()
    }

    /// Whether `thread_id` was retired for this session.
    pub fn is_retired(&self, thread_id: &str) -> bool {
        self.retired_threads.iter().any(|t| t == thread_id)
    }
}

/// One transcript row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TranscriptRow {
    /// The row's position in its session: 0-based and contiguous.
    pub seq: u64,
    /// The row itself, as the host gave it.
    pub body: Value,
}

/// One turn to commit: its rows and the thread that produced them.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnCommit {
    /// The host's session id (created if absent).
    pub session_id: String,
    /// The codex thread the turn ran on; published as the binding unless retired.
    pub thread_id: String,
    /// The `CODEX_HOME` the turn ran under.
    pub codex_home: Option<String>,
    /// The turn's transcript rows, appended in order. May be empty (publish only).
    pub rows: Vec<Value>,
    /// The session lease the turn ran under. `Some`: the commit is refused with
    /// [`StoreError::LeaseLost`](crate::StoreError::LeaseLost), writing nothing, unless that
    /// grant is still the session's live lease. `None`: an unfenced write, for a host that
    /// keeps one writer per session by its own means.
    pub fence: Option<Fence>,
}

/// What [`commit_turn`](crate::BindingStore::commit_turn) did.
///
/// In both cases the turn's rows are `first_seq..row_count` and are durable. A closed set:
/// a commit either publishes its thread or does not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommitOutcome {
    /// The rows were appended and the binding now names the turn's thread.
    Published {
        /// The sequence number of the turn's first row.
        first_seq: u64,
        /// The session's row count after the commit.
        row_count: u64,
    },
    /// The rows were appended, but the thread is retired so the binding was left as it was.
    RetiredNotPublished {
        /// The sequence number of the turn's first row.
        first_seq: u64,
        /// The session's row count after the commit.
        row_count: u64,
    },
}

impl CommitOutcome {
    /// The sequence number of the turn's first row.
    pub fn first_seq(&self) -> u64 {
        match self {
            CommitOutcome::Published { first_seq, .. }
            | CommitOutcome::RetiredNotPublished { first_seq, .. } => *first_seq,
        }
    }

    /// The session's row count after the commit.
    pub fn row_count(&self) -> u64 {
        match self {
            CommitOutcome::Published { row_count, .. }
            | CommitOutcome::RetiredNotPublished { row_count, .. } => *row_count,
        }
    }

    /// Whether the binding was published.
    pub fn is_published(&self) -> bool {
        matches!(self, CommitOutcome::Published { .. })
    }
}

/// One page of [`list_sessions`](crate::BindingStore::list_sessions).
#[derive(Clone, Debug, PartialEq)]
pub struct SessionPage {
    /// Sessions in ascending session-id order.
    pub sessions: Vec<SessionRecord>,
    /// Pass this as `after` to get the next page; `None` when this is the last page.
    pub next_after: Option<String>,
}

/// A whole session, for `migrate`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionExport {
    /// The session record, timestamps included.
    pub record: SessionRecord,
    /// All its rows, `0..record.row_count`.
    pub rows: Vec<TranscriptRow>,
}

/// What [`import_session`](crate::BindingStore::import_session) did.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImportOutcome {
    /// The session did not exist and was written.
    Imported,
    /// An identical session was already present; nothing was written.
    AlreadyPresent,
}

/// A session's lease as granted: who holds it, since when, and until when.
///
/// A lease is free once `expires_at_ms` has passed (by the store's clock) or it was released;
/// the holder keeps it by renewing it before then.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The session the lease is for.
    pub session_id: String,
    /// The holder.
    pub owner: LeaseOwner,
    /// When this owner acquired it (milliseconds since the Unix epoch, store clock).
    pub acquired_at_ms: i64,
    /// When it expires unless renewed (milliseconds since the Unix epoch, store clock).
    pub expires_at_ms: i64,
    /// Fencing token: grows by one with every grant of the session's lease (a re-acquire by
    /// the same owner included), so the grants of one session are totally ordered.
    pub fence: u64,
}

impl Lease {
    /// The proof of this grant that fenced writes carry.
    pub fn fence(&self) -> Fence {
        Fence {
            owner: self.owner.clone(),
            token: self.fence,
        }
    }
}

/// Proof that a write comes from the current holder of the session's lease: the holder and
/// the `fence` of its grant (a fencing token).
///
/// A write that carries a `Fence` ([`TurnCommit::fence`], and the `fence` argument of
/// [`patch_config`](crate::BindingStore::patch_config),
/// [`drop_binding_if`](crate::BindingStore::drop_binding_if) and
/// [`retire_thread`](crate::BindingStore::retire_thread)) is checked inside its own
/// transaction: unless the session's lease is live, held by `owner` and still at `token`, the
/// write is refused with [`StoreError::LeaseLost`](crate::StoreError::LeaseLost) and nothing is
/// written. So a holder that stalled past its TTL (a paused process, a suspended laptop, a
/// network partition) can never write over the holder that took the session over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    /// Who holds the lease.
    pub owner: LeaseOwner,
    /// The `fence` of the grant.
    pub token: u64,
}
