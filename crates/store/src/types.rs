//! The data a store keeps.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{LeaseOwner, MirrorChunk, MirrorOutcome, MirrorState, MirrorUpdate};

/// The `model_config` key that holds the bound codex thread id: present iff the session is
/// [`BindingState::Bound`], written by the store with every state change, never read back as
/// truth; a patch naming it is refused.
pub const CODEX_THREAD_ID_KEY: &str = "codex_thread_id";

/// A session's binding to a codex thread.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Binding {
    /// The codex thread id.
    pub thread_id: String,
    /// The `CODEX_HOME` the binding was made under, for diagnostics.
    pub codex_home: Option<String>,
    /// When the binding to this thread was first made (ms since the Unix epoch).
    pub bound_at_ms: i64,
    /// The fallback this thread replaced, if it did: a client whose SDK shows no notice
    /// still learns of it (`rethread sessions show --json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fell_back_from: Option<Fallback>,
}

impl Binding {
    /// A binding to `thread_id` made at `bound_at_ms`, replacing no fallback.
    pub fn new(thread_id: impl Into<String>, codex_home: Option<String>, bound_at_ms: i64) -> Self {
        Binding {
            thread_id: thread_id.into(),
            codex_home,
            bound_at_ms,
            fell_back_from: None,
        }
    }
}

/// A fallback, as remembered after its replacement thread was bound.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Fallback {
    /// The thread that was lost and given up.
    pub thread_id: String,
    /// Why (the runtime's reason code: `gone`, `incompatible`, `unreadable`).
    pub reason: String,
    /// When it was given up (ms since the Unix epoch).
    pub at_ms: i64,
}

/// A session whose thread was lost and given up ([`Retirement::Lost`]): the thread is retired,
/// and the fallback notice is owed until it is marked delivered
/// ([`BindingStore::mark_notice_delivered`](crate::BindingStore::mark_notice_delivered)) or a
/// turn on a new thread commits.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GivenUp {
    /// The lost (now retired) thread.
    pub thread_id: String,
    /// The runtime's reason code (`gone`, `incompatible`, `unreadable`, ...), uninterpreted.
    pub reason: String,
    /// codex's error message, for people.
    pub message: String,
    /// When it was given up (ms since the Unix epoch, store clock).
    pub at_ms: i64,
    /// Whether the fallback notice reached the user.
    pub notice_delivered: bool,
}

/// What a session is bound to, as the store holds it.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum BindingState {
    /// No thread: a new session, or one whose thread the host ended.
    #[default]
    Unbound,
    /// Bound to a thread whose last committed turn is durable.
    Bound(Binding),
    /// The thread was lost and given up; no new thread has committed a turn yet.
    GivenUp(GivenUp),
}

/// One session as stored.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// The host's session id.
    pub session_id: String,
    /// The host's configuration object, with [`CODEX_THREAD_ID_KEY`] beside its own keys.
    pub model_config: Map<String, Value>,
    /// The binding state.
    pub state: BindingState,
    /// How many transcript rows the session has; rows are numbered `0..row_count`.
    pub row_count: u64,
    /// Threads retired for this session, in retirement order; never published again.
    pub retired_threads: Vec<String>,
    /// When the session was created (ms since the Unix epoch).
    pub created_at_ms: i64,
    /// When the session was last written (ms since the Unix epoch).
    pub updated_at_ms: i64,
    /// The rollout files mirrored for the session's threads (see [`MirrorState`]).
    #[serde(default, skip_serializing_if = "MirrorState::is_empty")]
    pub mirror: MirrorState,
}

impl SessionRecord {
    /// An empty, unbound session created at `now_ms`.
    pub fn new(session_id: impl Into<String>, now_ms: i64) -> Self {
        SessionRecord {
            session_id: session_id.into(),
            model_config: Map::new(),
            state: BindingState::Unbound,
            row_count: 0,
            retired_threads: Vec::new(),
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            mirror: MirrorState::default(),
        }
    }

    /// The binding, if the session is bound.
    pub fn binding(&self) -> Option<&Binding> {
        match &self.state {
            BindingState::Bound(binding) => Some(binding),
            _ => None,
        }
    }

    /// The bound thread id, if any.
    pub fn thread_id(&self) -> Option<&str> {
        self.binding().map(|b| b.thread_id.as_str())
    }

    /// The give-up, if the session's thread was lost and no new thread committed since.
    pub fn given_up(&self) -> Option<&GivenUp> {
        match &self.state {
            BindingState::GivenUp(given_up) => Some(given_up),
            _ => None,
        }
    }

    /// The give-up whose fallback notice has not reached the user yet.
    pub fn pending_notice(&self) -> Option<&GivenUp> {
        self.given_up().filter(|g| !g.notice_delivered)
    }

    /// Whether `thread_id` was retired for this session.
    pub fn is_retired(&self, thread_id: &str) -> bool {
        self.retired_threads.iter().any(|t| t == thread_id)
    }

    /// The threads this record names: bound or given up, and retired.
    pub(crate) fn named_threads(&self) -> impl Iterator<Item = &str> {
        let current = self
            .thread_id()
            .or(self.given_up().map(|g| g.thread_id.as_str()));
        let retired = self.retired_threads.iter().map(String::as_str);
        current.into_iter().chain(retired)
    }

    /// Sets the state and its published view ([`CODEX_THREAD_ID_KEY`]), as the store does on
    /// every state change; for tools that build records to import.
    pub fn set_state(&mut self, state: BindingState) {
        self.state = state;
        match self.thread_id().map(|t| Value::String(t.to_string())) {
            Some(thread) => self
                .model_config
                .insert(CODEX_THREAD_ID_KEY.to_string(), thread),
            None => self.model_config.remove(CODEX_THREAD_ID_KEY),
        };
    }
}

/// Why a thread is retired ([`BindingStore::retire_thread`](crate::BindingStore::retire_thread)).
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Retirement {
    /// codex cannot hand the thread back: the give-up ([`BindingState::GivenUp`]).
    Lost {
        /// The runtime's reason code (`gone`, `incompatible`, `unreadable`, ...).
        reason: String,
        /// codex's error message, for people.
        message: String,
    },
    /// The host ended the thread itself: a session bound to it becomes unbound, no notice
    /// owed.
    Ended,
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
///
/// ```
/// use rethread_store::TurnCommit;
/// use serde_json::json;
/// let commit = TurnCommit::new("chat-42", "thr_1", vec![json!({"role": "user", "text": "hi"})])
///     .codex_home(Some("/home/me/.codex".into()));
/// assert_eq!(commit.rows.len(), 1);
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TurnCommit {
    /// The host's session id (created if absent).
    pub session_id: String,
    /// The codex thread the turn ran on; published as the binding unless retired.
    pub thread_id: String,
    /// The `CODEX_HOME` the turn ran under.
    pub codex_home: Option<String>,
    /// The turn's transcript rows, appended in order. May be empty (publish only).
    pub rows: Vec<Value>,
    /// The grant of the session lease the turn ran under ([`Fence`]); `None`: unfenced, for a
    /// host that keeps one writer per session by its own means.
    pub fence: Option<Fence>,
    /// What the thread's rollout files grew by; `None` drops the thread's mirror (it would
    /// no longer hold the last committed turn).
    pub mirror: Option<MirrorUpdate>,
}

impl TurnCommit {
    /// The rows of a turn of `session_id` on `thread_id`, unfenced, with no `CODEX_HOME`.
    pub fn new(
        session_id: impl Into<String>,
        thread_id: impl Into<String>,
        rows: Vec<Value>,
    ) -> Self {
        TurnCommit {
            session_id: session_id.into(),
            thread_id: thread_id.into(),
            codex_home: None,
            rows,
            fence: None,
            mirror: None,
        }
    }

    /// Sets the `CODEX_HOME` the turn ran under.
    pub fn codex_home(mut self, codex_home: Option<String>) -> Self {
        self.codex_home = codex_home;
        self
    }

    /// Sets the fence of the lease the turn ran under.
    pub fn fence(mut self, fence: Option<Fence>) -> Self {
        self.fence = fence;
        self
    }

    /// Sets what the thread's rollout files grew by.
    pub fn mirror(mut self, mirror: Option<MirrorUpdate>) -> Self {
        self.mirror = mirror;
        self
    }
}

/// What [`commit_turn`](crate::BindingStore::commit_turn) did. Either way the turn's rows
/// are `first_seq..row_count` and durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommitOutcome {
    /// The rows were appended and the binding now names the turn's thread.
    Published {
        /// The sequence number of the turn's first row.
        first_seq: u64,
        /// The session's row count after the commit.
        row_count: u64,
        /// What became of the mirror.
        mirror: MirrorOutcome,
    },
    /// The rows were appended, but the thread is retired so the state was left as it was.
    RetiredNotPublished {
        /// The sequence number of the turn's first row.
        first_seq: u64,
        /// The session's row count after the commit.
        row_count: u64,
        /// What became of the mirror (a retired thread's is dropped: [`MirrorOutcome::None`]).
        mirror: MirrorOutcome,
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

    /// What became of the mirror.
    pub fn mirror(&self) -> MirrorOutcome {
        match self {
            CommitOutcome::Published { mirror, .. }
            | CommitOutcome::RetiredNotPublished { mirror, .. } => *mirror,
        }
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
    /// Every chunk of its mirrored files (`record.mirror`), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirror: Vec<MirrorChunk>,
    /// Every thread that belongs to the session ([`thread_session`]), in order. Empty (an
    /// older rethread's export, or [`SessionExport::new`]): the threads its record names.
    ///
    /// [`thread_session`]: crate::BindingStore::thread_session
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub threads: Vec<String>,
}

impl SessionExport {
    /// The export of `record` with these rows, no mirror, and the threads its record names.
    pub fn new(record: SessionRecord, rows: Vec<TranscriptRow>) -> Self {
        SessionExport {
            record,
            rows,
            mirror: Vec::new(),
            threads: Vec::new(),
        }
    }
}

/// What [`import_session`](crate::BindingStore::import_session) did.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImportOutcome {
    /// The session did not exist and was written.
    Imported,
    /// An identical session was already present; nothing was written but the claim of the
    /// export's threads it did not own yet.
    AlreadyPresent,
}

/// A session's lease as granted: who holds it, since when, and until when (store clock).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The session the lease is for.
    pub session_id: String,
    /// The holder.
    pub owner: LeaseOwner,
    /// When this owner acquired it (ms since the Unix epoch).
    pub acquired_at_ms: i64,
    /// When it expires unless renewed (ms since the Unix epoch).
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

/// Proof that a write comes from the holder of the session's lease: the holder and the
/// `fence` of its grant (a fencing token).
///
/// # Contract
/// A write that carries a `Fence` is checked inside its own transaction: unless `token` is
/// still the session's newest grant, made to `owner` and not released, it is refused with
/// [`StoreError::LeaseLost`](crate::StoreError::LeaseLost) (saying why) and writes nothing.
/// Expiry alone does not refuse it (time cannot stop a paused holder; grants can): a holder
/// that stalled past its TTL never writes over one that took the session over, and goes on
/// where nobody did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    /// Who holds the lease.
    pub owner: LeaseOwner,
    /// The `fence` of the grant.
    pub token: u64,
}
