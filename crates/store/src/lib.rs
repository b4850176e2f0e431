//! Durable `session id -> codex thread id` bindings and the sessions' transcripts.
//!
//! A host that drives `codex app-server` keeps its own session id and transcript; this crate
//! stores, per session, a `model_config` JSON object holding the bound codex thread id
//! ([`CODEX_THREAD_ID_KEY`]) beside the host's own keys, the transcript rows, and the threads
//! that were retired. The [`BindingStore`] trait has four backends:
//!
//! | backend | feature | URL | use |
//! |---|---|---|---|
//! | [`RedbStore`] | `redb` (default) | `redb:PATH` | the embedded default; one process at a time |
//! | [`SqliteStore`] | `sqlite` (default) | `sqlite:PATH` | WAL; several processes share one file |
//! | `PostgresStore` | `postgres` | `postgres://...` | several hosts share one database (tokio-postgres, pooled) |
//! | [`MemoryStore`] | always | `memory:` | tests; the reference the others are checked against |
//!
//! Each feature builds alone, and the crate builds with none (memory only).
//!
//! Every backend also grants per-session leases ([`BindingStore::acquire_lease`]): the
//! runtime takes one before it resumes or starts a session's codex thread, so two hosts never
//! drive one thread at once, and writes that publish or remove a binding may carry the lease's
//! [`Fence`], refused once the lease is lost. SQLite and PostgreSQL keep leases in the store
//! (several processes); redb and memory in the process.
//!
//! # Public API
//! - The trait: [`BindingStore`] (the methods each backend must get right, with their
//!   contracts) and [`BindingStoreExt`] (conveniences, implemented for every store); both are
//!   implemented for `Arc<S>`, `Box<S>` and `&S`.
//! - Opening: [`open_url`] and [`StoreUrl`] (the URL grammar), [`OpenOptions`] and
//!   [`Durability`]; the backends [`RedbStore`], [`SqliteStore`], `PostgresStore`,
//!   [`MemoryStore`], each with its own `open`/`new` and `close`.
//! - Data: [`SessionRecord`], [`Binding`], [`TranscriptRow`], [`TurnCommit`],
//!   [`CommitOutcome`], [`SessionPage`], [`SessionExport`], [`ImportOutcome`],
//!   [`CODEX_THREAD_ID_KEY`], [`SCHEMA_VERSION`].
//! - Leases: [`Lease`], [`Fence`], [`LeaseOwner`], [`LocalOwner`], [`ProcessIdentity`].
//! - Copying: [`copy_sessions`], [`CopyReport`], [`CopyProgress`].
//! - Checking a whole store: [`BindingStore::verify`], [`VerifyReport`], [`Problem`],
//!   [`ProblemKind`], [`VerifyProgress`], [`MAX_LISTED_PROBLEMS`].
//! - Errors: [`StoreError`] (variants by meaning), [`BoxError`], [`redact_url`].
//! - [`conformance`] (feature `conformance`): the suite every backend passes, for third-party
//!   backends.
//!
//! # Invariants
//! Every backend holds these, and the conformance suite (feature `conformance`) and the crash
//! tests check them:
//! - The binding is published in the same transaction as its turn's rows
//!   ([`BindingStore::commit_turn`]): a stored binding always names a thread whose last
//!   committed turn is durable.
//! - A retired thread is never published. Retirement is persisted, so a late commit (from any
//!   process) cannot resurrect it; its rows still commit.
//! - Dropping a binding is compare-and-delete ([`BindingStore::drop_binding_if`]): only the id
//!   that failed is removed.
//! - Every `model_config` write is an atomic merge-patch; keys a write does not name are never
//!   lost, also under concurrent writers.
//! - Transcript rows are never lost or duplicated: `seq` is `0..row_count`, contiguous.
//! - A corrupt, foreign, newer or locked store is a typed [`StoreError`], never an empty store;
//!   a damaged record (every SQLite row and redb value carries a checksum) is `Corrupt` when
//!   it is read, never served; a session record missing beside its rows and a gap in a
//!   session's rows are `Corrupt` too, never a missing or shorter session.
//! - Opening a SQLite store takes the same time whatever it holds: it reads the header and the
//!   schema version only. redb checks every page on open unless
//!   [`OpenOptions::check_redb_integrity_on_open`] is `false` (a damaged redb file can make
//!   redb abort the process on a later commit). The whole-store check is
//!   [`BindingStore::verify`], on request.
//! - A panic inside an engine (redb trusts a cleanly closed file) never reaches the caller: it
//!   is `Corrupt`, and the store answers `Corrupt` to everything after it.
//! - No engine call runs on an async runtime thread: each durable store has one writer thread
//!   fed by a channel (which coalesces concurrent writes into one transaction: group commit,
//!   each caller answered only once its write is durable); reads run in `spawn_blocking`.
//!
//! # Example
//! ```
//! use rethread_store::{
//!     BindingStore, BindingStoreExt, CommitOutcome, MemoryStore, Retirement, TurnCommit,
//! };
//! use serde_json::json;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), rethread_store::StoreError> {
//! let store = MemoryStore::new();
//! let outcome = store
//!     .commit_turn(TurnCommit {
//!         session_id: "chat-42".into(),
//!         thread_id: "thr_1".into(),
//!         codex_home: Some("/home/me/.codex".into()),
//!         rows: vec![json!({"role": "user", "text": "hi"}), json!({"role": "assistant", "text": "hello"})],
//!         fence: None,
//!     })
//!     .await?;
//! assert_eq!(outcome, CommitOutcome::Published { first_seq: 0, row_count: 2 });
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
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "conformance")]
pub mod conformance;

#[cfg(feature = "redb")]
pub use crate::redb::RedbStore;
pub use copy::{copy_sessions, CopyProgress, CopyReport};
pub use error::{BoxError, LeaseLoss, StoreError};
pub use memory::MemoryStore;
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
    Binding, BindingState, CommitOutcome, Fence, GivenUp, ImportOutcome, Lease, Retirement,
    SessionExport, SessionPage, SessionRecord, TranscriptRow, TurnCommit, CODEX_THREAD_ID_KEY,
};
pub use verify::{Problem, ProblemKind, VerifyProgress, VerifyReport, MAX_LISTED_PROBLEMS};

/// The schema version this build reads and writes; a store of a newer one is refused with
/// [`StoreError::NewerSchema`]. The store is unpublished: version 1 is the first format.
pub const SCHEMA_VERSION: u64 = 1;
