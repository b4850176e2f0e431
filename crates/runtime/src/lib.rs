//! The rethread runtime: drives `codex app-server` for a host session and keeps the codex
//! thread bound to it across restarts.
//!
//! - [`AppServerClient`]: spawn `<codex> app-server` (or connect any reader/writer), the
//!   `initialize` handshake with `experimentalApi`, bounded request correlation, per-thread
//!   notification routing, server requests answered by a [`ServerRequestHandler`]
//!   (default [`DeclineAll`]).
//! - [`SessionBinder`] / [`CodexSession`]: the resume-or-fallback state machine and turn
//!   commits, under the session's lease ([`SessionLease`]).
//! - [`binding`]: the same rules as pieces for a host that sends its own requests (a proxy):
//!   the resume verdict, giving a lost thread up, seeding, committing a turn.
//! - [`probe_thread`]: a thread's health without resuming it.
//! - [`StatusRail`]: typed status events for any surface.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use rethread_runtime::{AppServerClient, CodexCommand, SessionBinder, StatusRail};
//! use rethread_store::{open_url, OpenOptions};
//!
//! let store = open_url("redb:/tmp/rethread.redb", OpenOptions::default()).await?;
//! let client = AppServerClient::spawn(&CodexCommand::new("codex")).await?;
//! let mut binder = SessionBinder::new("chat-42", store, StatusRail::default());
//! let mut session = binder.open(&client).await?;
//! let report = session.run_turn("What did I say earlier?").await?;
//! println!("{}", report.reply);
//! binder.close().await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]
// Errors carry codex's error (message and data) whole for the host to show; they are the cold path.
#![allow(clippy::result_large_err)]

mod binder;
pub mod binding;
mod client;
mod error;
mod lease;
mod options;
mod probe;
pub mod projection;
mod rail;
mod session;
mod sink;

pub use binder::SessionBinder;
pub use binding::{Publication, RESUME_FALLBACK_NOTICE};
pub use client::{
    AppServerClient, ClientBuilder, ClientError, ClientOptions, CodexCommand, DeclineAll,
    ServerInfo, ServerRequestHandler, ThreadEvents,
};
pub use error::{BoxError, RuntimeError};
pub use lease::SessionLease;
pub use options::{BinderOptions, SeedOptions};
pub use probe::{probe_thread, ThreadHealth, ThreadProbe};
pub use rail::{RecordedEvents, StatusEvent, StatusKind, StatusRail, StatusSink};
pub use session::{CodexSession, OpenOutcome, TurnReport};
pub use sink::{SinkDurability, Transcript, TranscriptSink};
