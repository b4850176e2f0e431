//! Durable `session id -> codex thread id` bindings and the sessions' transcripts.
//!
//! A host that drives `codex app-server` keeps its own session id and transcript; this crate
//! stores, per session, its binding state ([`BindingState`]: unbound, bound to a thread, or
//! given up from a lost thread with the fallback notice owed), the host's `model_config` JSON
//! object (where [`CODEX_THREAD_ID_KEY`] is the store's published view of the binding), the
//! transcript rows, the threads that were retired, and which session each thread belongs to.
//! The [`BindingStore`] trait has four backends:
//!
//! | backend | feature | URL | use |
//! |---|---|---|---|
//! | [`SqliteStore`] | `sqlite` (default) | `sqlite:PATH` | WAL; several processes share one file (the CLI's default) |
//! | [`RedbStore`] | `redb` (default) | `redb:PATH` | embedded, one process at a time; checks every page on open ([`OpenOptions::check_redb_integrity_on_open`]) |
//! | `PostgresStore` | `postgres` | `postgres://...` | several hosts share one database (the `postgres` crate on the store's threads) |
//! | [`MemoryStore`] | always | `memory:` | tests; the reference the others are checked against |
//!
//! Each feature builds alone, and the crate builds with none (memory only).
//!
//! Every backend also grants per-session leases ([`BindingStore::acquire_lease`]): the
//! runtime takes one before it resumes or starts a session's codex thread, so two hosts never
//! drive one thread at once, and writes may carry the lease's [`Fence`], refused
//! ([`StoreError::LeaseLost`], saying why: [`LeaseLoss`]) once a newer grant exists. SQLite and
//! PostgreSQL keep leases in the store (several processes); redb and memory in the process.
//!
//! # Public API
//! - The trait: [`BindingStore`] (the methods each backend must get right, with their
//!   contracts) and [`BindingStoreExt`] (conveniences, implemented for every store); both are
//!   implemented for `Arc<S>`, `Box<S>` and `&S`.
//! - Opening: [`open_url`] and [`StoreUrl`] (the URL grammar), [`OpenOptions`] and
//!   [`Durability`]; the backends [`RedbStore`], [`SqliteStore`], `PostgresStore`,
//!   [`MemoryStore`], each with its own `open`/`new` and `close`.
//! - Data: [`SessionRecord`], [`BindingState`], [`Binding`], [`GivenUp`], [`Retirement`],
//!   [`TranscriptRow`], [`TurnCommit`], [`CommitOutcome`], [`SessionPage`], [`SessionExport`],
//!   [`ImportOutcome`], [`CODEX_THREAD_ID_KEY`], [`SCHEMA_VERSION`].
//! - The rollout mirror: [`MirrorState`] and [`MirroredFile`] (in each record),
//!   [`MirrorUpdate`] and [`MirrorAppend`] (what a commit appends), [`MirrorOutcome`],
//!   [`MirrorChunk`] (in exports), [`BindingStoreExt::mirror_file`] (a file's bytes) and
//!   [`BindingStore::write_mirror_file`] (the same streamed into a writer, to restore it),
//!   [`DEFAULT_MIRROR_CAP`], [`crc32_extend`], [`check_mirror_path`].
//! - Leases: [`Lease`], [`Fence`], [`LeaseOwner`], [`LocalOwner`], [`ProcessIdentity`].
//! - Copying: [`copy_sessions`], [`CopyReport`], [`CopyProgress`].
//! - Checking a whole store: [`BindingStore::verify`], [`VerifyReport`], [`Problem`],
//!   [`ProblemKind`], [`VerifyProgress`], [`MAX_LISTED_PROBLEMS`].
//! - Errors: [`StoreError`] (variants by meaning), [`LeaseLoss`], [`BoxError`], [`redact_url`].
//! - [`conformance`] (feature `conformance`): the suite every backend passes, for third-party
//!   backends.
//!
//! # Invariants
//! Every backend holds these, and the conformance suite (feature `conformance`) and the crash
//! tests check them:
//! - A session is bound in the same transaction as its turn's rows
//!   ([`BindingStore::commit_turn`]): a bound thread always has its last committed turn
//!   durable. `model_config[CODEX_THREAD_ID_KEY]` is written with every state change (present
//!   iff bound) and is never read back as truth; a patch naming it is refused.
//! - A retired thread is never published. Retirement is persisted, so a late commit (from any
//!   process) cannot resurrect it; its rows still commit.
//! - The give-up is one write and a compare-and-set ([`BindingStore::retire_thread`] with
//!   [`Retirement::Lost`]): only a binding to the lost thread becomes
//!   [`BindingState::GivenUp`], and the notice stays owed until it is marked delivered or a new
//!   thread commits.
//! - A thread belongs to at most one session ([`StoreError::ThreadTaken`],
//!   [`BindingStore::thread_session`]) until that session is deleted.
//! - A fenced write is accepted iff its grant is the session's newest and not released:
//!   expiry alone never refuses it, a newer grant always does. A delete is refused while the
//!   lease is live and leaves the lease granted to nobody, so it is never undone.
//! - Every `model_config` write is an atomic merge-patch; keys a write does not name are never
//!   lost, also under concurrent writers.
//! - Transcript rows are never lost or duplicated: `seq` is `0..row_count`, contiguous.
//! - A thread's rollout mirror is written in the same transaction as the turn it holds: a
//!   mirror, when present, holds the thread's rollout as of its last committed turn. An append
//!   that does not extend the stored file is refused ([`StoreError::MirrorMismatch`]), never
//!   spliced; a commit without a mirror drops the thread's (it would be stale), a retired
//!   thread's is dropped, and past the per-session cap mirroring stops for the session with
//!   its mirror dropped, the turn still committed.
//! - A corrupt, foreign, newer or locked store is a typed [`StoreError`], never an empty store;
//!   a damaged record (every SQLite row and redb value carries a checksum) is `Corrupt` when
//!   it is read, never served; a session record missing beside its rows and a gap in a
//!   session's rows are `Corrupt` too, never a missing or shorter session.
//! - A store path that is not a regular file is refused before anything opens it; a store
//!   opened without [`OpenOptions::create`] is never created ([`StoreError::NoStore`]); a file
//!   deleted or replaced under a live store takes no more commits ([`StoreError::Gone`]).
//! - Opening a SQLite store takes the same time whatever it holds: it reads the header and the
//!   schema version only. redb checks every page on open unless
//!   [`OpenOptions::check_redb_integrity_on_open`] is `false` (a damaged redb file can make
//!   redb abort the process on a later commit). The whole-store check is
//!   [`BindingStore::verify`], on request.
//! - A panic inside an engine (redb trusts a cleanly closed file) never reaches the caller: it
//!   is `Corrupt`, and the store answers `Corrupt` to everything after it. An I/O error makes
//!   redb reopen the file, so the store goes on once the cause is gone.
//! - No engine call runs on an async runtime thread: each file store has one writer thread, a
//!   plain group-commit loop (a channel, a batch, one transaction, the replies: each caller is
//!   answered once its write is durable); reads run in `spawn_blocking`; PostgreSQL runs each
//!   call on one of the store's own threads, each with its connection.
//!
//! # Example
//! ```
//! use rethread_store::{
//!     BindingStore, BindingStoreExt, MemoryStore, Retirement, TurnCommit,
//! };
//! use serde_json::json;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), rethread_store::StoreError> {
//! let store = MemoryStore::new();
//! let outcome = store
//!     .commit_turn(
//!         TurnCommit::new("chat-42", "thr_1", vec![json!({"role": "user", "text": "hi"}), json!({"role": "assistant", "text": "hello"})])
//!             .codex_home(Some("/home/me/.codex".into())),
//!     )
//!     .await?;
//! assert!(outcome.is_published());
//! assert_eq!((outcome.first_seq(), outcome.row_count()), (0, 2));
//! assert_eq!(store.thread_id("chat-42").await?.as_deref(), Some("thr_1"));
//!
//! // The codex thread could not be resumed: give it up (compare-and-set, one write).
//! let lost = Retirement::Lost { reason: "gone".into(), message: "no rollout found".into() };
//! store.retire_thread("chat-42", "thr_1", lost, None).await?;
//! let record = store.require_session("chat-42").await?;
//! assert_eq!(record.binding(), None);
//! assert_eq!(record.pending_notice().map(|g| g.thread_id.as_str()), Some("thr_1"));
//! assert_eq!(store.all_rows("chat-42").await?.len(), 2);
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod adapter;
mod copy;
mod error;
mod logic;
mod memory;
mod mirror;
mod open;
mod options;
mod owner;
mod redact;
mod store;
mod types;
mod verify;

#[cfg(any(feature = "redb", feature = "sqlite"))]
mod checksum;
#[cfg(any(feature = "redb", feature = "sqlite"))]
mod durable;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redb")]
mod redb;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql_columns;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "conformance")]
pub mod conformance;

#[cfg(feature = "redb")]
pub use crate::redb::RedbStore;
pub use copy::{copy_sessions, CopyProgress, CopyReport};
pub use error::{BoxError, LeaseLoss, Result, StoreError};
pub use memory::MemoryStore;
pub use mirror::{
    check_mirror_path, crc32_extend, MirrorAppend, MirrorChunk, MirrorOutcome, MirrorState,
    MirrorUpdate, MirroredFile, DEFAULT_MIRROR_CAP,
};
pub use open::{open_url, StoreUrl};
pub use options::{Durability, OpenOptions};
pub use owner::{LeaseOwner, LocalOwner, ProcessIdentity};
#[cfg(feature = "postgres")]
pub use postgres::PostgresStore;
pub use redact::redact_url;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;
pub use store::{BindingStore, BindingStoreExt};
pub use types::{
    Binding, BindingState, CommitOutcome, Fallback, Fence, GivenUp, ImportOutcome, Lease,
    Retirement, SessionExport, SessionPage, SessionRecord, TranscriptRow, TurnCommit,
    CODEX_THREAD_ID_KEY,
};
pub use verify::{Problem, ProblemKind, VerifyProgress, VerifyReport, MAX_LISTED_PROBLEMS};

/// The schema version this build reads and writes; a store of a newer one is refused with
/// [`StoreError::NewerSchema`]. The store is unpublished: version 1 is the first format.
pub const SCHEMA_VERSION: u64 = 1;

/// Refuses a store whose schema version is `found`, unless it is [`SCHEMA_VERSION`].
#[cfg_attr(
    not(any(feature = "redb", feature = "sqlite", feature = "postgres")),
    allow(dead_code)
)]
fn check_schema_version(path: &str, found: u64) -> Result<()> {
    if found > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: path.to_string(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found < SCHEMA_VERSION {
        let detail = format!("unknown schema version {found}");
        return Err(StoreError::corrupt(path, detail));
    }
    Ok(())
}
