//! The rethread runtime: drives `codex app-server` for a host session and keeps the codex
//! thread bound to it across restarts.
//!
//! - [`AppServerClient`]: spawn `<codex> app-server` (or connect any reader/writer), the
//!   `initialize` handshake with `experimentalApi`, bounded request correlation, per-thread
//!   notification routing, server requests answered by a [`ServerRequestHandler`]
//!   (default [`DeclineAll`]).
//! - [`Agent`] / [`CodexSession`]: the resume-or-fallback state machine and turn commits.
//! - [`StatusRail`]: typed status events for any surface.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use rethread_runtime::{Agent, AppServerClient, CodexCommand, StatusRail};
//! use rethread_store::{open_url, OpenOptions};
//!
//! let store = open_url("redb:/tmp/rethread.redb", OpenOptions::default()).await?;
//! let client = AppServerClient::spawn(&CodexCommand::new("codex")).await?;
//! let mut agent = Agent::new("chat-42", store, StatusRail::default());
//! let mut session = agent.open(&client).await?;
//! let report = session.run_turn("What did I say earlier?").await?;
//! println!("{}", report.reply);
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]
// Errors carry codex's error (message and data) whole for the host to show; they are the cold path.
#![allow(clippy::result_large_err)]

mod agent;
mod client;
mod lease;
pub mod projection;
mod rail;

pub use agent::{
    Agent, AgentOptions, CodexSession, OpenOutcome, Publication, RuntimeError, SeedOptions,
    SinkDurability, TranscriptSink, TurnReport, RESUME_FALLBACK_NOTICE,
};
pub use client::{
    AppServerClient, ClientBuilder, ClientError, ClientOptions, CodexCommand, DeclineAll,
    ServerInfo, ServerRequestHandler, ThreadEvents,
};
pub use lease::flush_lease_releases;
pub use rail::{RecordedEvents, StatusEvent, StatusKind, StatusRail, StatusSink};

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
