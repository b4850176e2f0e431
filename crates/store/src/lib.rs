//! Durable `session id -> codex thread id` bindings and the sessions' transcripts.
//!
//! A host that drives `codex app-server` keeps its own session id and transcript; this crate
//! stores, per session, its binding state ([`BindingState`]), the host's `model_config` JSON
//! object (where [`CODEX_THREAD_ID_KEY`] publishes the binding), the transcript rows, the
//! retired threads, the rollout mirror, and which session each thread belongs to. There is one
//! store, [`BindingStore`] (its contracts are on its methods): its rules run over the small
//! [`engine::Engine`] of a backend, four of which are built in, opened by URL with
//! [`open_url`]:
//!
//! | backend | feature | URL | use |
//! |---|---|---|---|
//! | `BindingStore::sqlite` | `sqlite` (default) | `sqlite:PATH` | WAL; several processes share one file (the CLI's default) |
//! | `BindingStore::redb` | `redb` (default) | `redb:PATH` | embedded, one process at a time; checks every page on open ([`OpenOptions::check_redb_integrity_on_open`]) |
//! | `BindingStore::postgres` | `postgres` | `postgres://...` | several hosts share one database |
//! | [`BindingStore::memory`] | always | `memory:` | tests; the reference the others are checked against |
//!
//! A backend of your own implements [`engine::Engine`] and the transaction views it hands
//! operations ([`engine::ReadTxn`], [`engine::WriteTxn`], [`engine::LeaseTxn`]), and gets
//! every rule with [`BindingStore::new`].
//!
//! Each feature builds alone, and the crate builds with none (memory only). Every backend
//! also grants per-session leases ([`BindingStore::acquire_lease`]) whose [`Fence`] writes
//! may carry; SQLite and PostgreSQL keep them in the store, redb and memory in the process.
//! [`conformance`] (feature `conformance`) is the suite every backend passes.
//!
//! # Invariants
//! Every backend holds the contracts on [`BindingStore`]'s methods (the conformance suite and
//! the crash tests check them). Damage never reads as data: a damaged record (every SQLite row
//! and redb value carries a checksum), a record missing beside its rows or a gap in a session's
//! rows is `Corrupt` when touched, and so is a panic inside an engine, after which the store
//! answers `Corrupt` to everything. Opening reads the header and schema only; the whole-store
//! check is [`BindingStore::verify`]. File stores write on one writer thread (a group commit)
//! and read in `spawn_blocking`; PostgreSQL runs each call on one of the store's own threads.
//!
//! # Example
//! ```
//! use rethread_store::{
//!     BindingStore, Retirement, TurnCommit,
//! };
//! use serde_json::json;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), rethread_store::StoreError> {
//! let store = BindingStore::memory();
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
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backends;
mod clock;
mod copy;
pub mod engine;
mod error;
mod key;
mod logic;
mod memory;
mod mirror;
mod open;
mod options;
mod owner;
mod redact;
mod retention;
mod seal;
mod store;
mod types;
mod verify;

#[cfg(any(feature = "redb", feature = "sqlite", feature = "postgres"))]
mod checksum;
#[cfg(any(feature = "redb", feature = "sqlite"))]
mod durable;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redb")]
mod redb;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use clock::Clock;
pub use copy::{copy_sessions, CopyProgress, CopyReport};
pub use error::{time_for_people, BoxError, LeaseLoss, Result, StoreError};
pub use key::{KeyError, StoreKey, KEY_LEN};
pub use memory::MemoryEngine;
pub use mirror::{
    check_mirror_path, crc32_extend, MirrorAppend, MirrorChunk, MirrorOutcome, MirrorState,
    MirrorUpdate, MirroredFile, DEFAULT_MIRROR_CAP,
};
pub use open::{open_url, StoreUrl};
pub use options::{Durability, OpenOptions};
pub use owner::{LeaseOwner, LocalOwner, ProcessIdentity};
pub use redact::redact_url;
pub use retention::{Prune, PruneReport, PrunedSession, StoredBytes, DEFAULT_PRUNE_BATCH};
pub use store::BindingStore;
pub use types::{
    Binding, BindingState, CommitOutcome, Fallback, Fence, GivenUp, ImportOutcome, Lease,
    Retirement, SessionExport, SessionPage, SessionRecord, TranscriptRow, TurnCommit,
    CODEX_THREAD_ID_KEY,
};
pub use verify::{Problem, ProblemKind, VerifyProgress, VerifyReport, MAX_LISTED_PROBLEMS};

/// The schema version this build reads and writes; a store of a newer one is refused with
/// [`StoreError::NewerSchema`]. The store is unpublished: version 1 is the first format.
pub const SCHEMA_VERSION: u64 = 1;

/// What a lock gives (`Mutex::lock`, `RwLock::read`, `Condvar::wait`, `Mutex::into_inner`),
/// poisoned or not: the one way rethread's crates take their locks.
///
/// A lock is poisoned when a thread panicked while holding it. Going on with the data is the
/// choice made here, and it is correct because every critical section taken this way is a
/// plain update that a panic cannot leave half done (an insert, a push, a take, a clone, or a
/// store operation that decides before it writes and whose in-memory writes cannot fail). The
/// panic itself is reported where it happened (its task's join error, the test that failed);
/// refusing the lock after it would turn one failed call into the failure of every later
/// one in a long-running host (a proxy serves many sessions through shared state). A critical
/// section a panic could tear must not take its lock this way.
///
/// ```
/// use rethread_store::Unpoisoned;
/// let shared = std::sync::Mutex::new(vec![1]);
/// shared.lock().unpoisoned().push(2);
/// assert_eq!(*shared.lock().unpoisoned(), [1, 2]);
/// ```
pub trait Unpoisoned<G> {
    /// The guard (or value), whether or not the lock was poisoned.
    fn unpoisoned(self) -> G;
}

impl<G> Unpoisoned<G> for std::sync::LockResult<G> {
    fn unpoisoned(self) -> G {
        self.unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
