//! rethread keeps a host's conversation and its codex model-side thread together across
//! restarts: it stores `session id -> codex thread id` durably, once the turn's transcript rows
//! are durable; the next host process resumes the thread before its first turn; and when codex
//! cannot hand the thread back it fails closed: it drops the binding, starts a fresh thread and
//! says so exactly once ([`RESUME_FALLBACK_NOTICE`]).
//!
//! This crate is the one dependency a host needs. It re-exports [`runtime`]
//! ([`AppServerClient`] drives `codex app-server`; [`SessionBinder`] and [`CodexSession`]
//! resume or fall back and run turns; [`StatusRail`] carries every notice; the rules as pieces
//! in [`binding`]), [`store`] ([`open_url`], the [`BindingStore`] trait and its backends, chosen
//! with this crate's features: `redb` and `sqlite` (default), `postgres`), [`protocol`] (codex
//! app-server's typed JSON-RPC dialect) and, with the `proxy` feature, `proxy` (the `rethread
//! app-server` session proxy).
//!
//! ```no_run
//! use rethread::{open_url, AppServerClient, CodexCommand, OpenOptions, SessionBinder, StatusRail};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let store = open_url("redb:/var/lib/my-host/rethread.redb", OpenOptions::default()).await?;
//! let client = AppServerClient::spawn(&CodexCommand::new("codex")).await?;
//! let mut binder = SessionBinder::new("chat-42", store, StatusRail::default());
//! let mut session = binder.open(&client).await?;
//! let report = session.run_turn("What did we decide yesterday?").await?;
//! println!("{}", report.reply);
//! binder.close().await?;
//! # Ok(()) }
//! ```
//!
//! The binder restores a thread's rollout into the `CODEX_HOME` codex runs with, which it takes
//! to be the environment's `CODEX_HOME`, else `~/.codex` ([`BinderOptions::codex_home`]): give
//! it the home you give codex. Offline, on `fake-codex`, set `CODEX_HOME`: without it the fake
//! keeps its threads in a temporary home it removes when it exits, and every restart falls
//! back to a new thread.
#![forbid(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]

pub use rethread_protocol as protocol;
#[cfg(feature = "proxy")]
pub use rethread_proxy as proxy;
pub use rethread_runtime as runtime;
pub use rethread_store as store;

pub use rethread_protocol::{HistoryMode, ResumeFailure, RpcError};
pub use rethread_runtime::{
    binding, machine, probe_thread, projection, telemetry, AnsweredRequest, AppServerClient,
    BinderOptions, BoxError, ClientBuilder, ClientError, ClientOptions, CodexCommand, CodexSession,
    DeclineAll, OpenOutcome, Publication, RecordedEvents, RuntimeError, SeedOptions, ServerInfo,
    ServerRequestHandler, SessionBinder, SessionLease, SinkDurability, StatusEvent, StatusKind,
    StatusRail, StatusSink, ThreadEvent, ThreadEvents, ThreadHealth, ThreadProbe, Transcript,
    TranscriptSink, TurnEnd, TurnEvent, TurnInput, TurnReport, TurnStream, RESUME_FALLBACK_NOTICE,
};
pub use rethread_store::{
    open_url, Binding, BindingState, BindingStore, CommitOutcome, Durability, Fence, GivenUp,
    Lease, LeaseLoss, LeaseOwner, LocalOwner, OpenOptions, Retirement, SessionExport, SessionPage,
    SessionRecord, StoreError, StoreUrl, TranscriptRow, TurnCommit,
};

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
