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
//!   the resume verdict, giving a lost thread up, seeding, restoring a rollout, committing a
//!   turn.
//! - [`RolloutMirror`] ([`mirror`]): the thread's rollout files under `CODEX_HOME`, mirrored
//!   into the store with each commit and restored from it before a resume, so a session keeps
//!   its thread on any machine on the same store ([`BinderOptions::mirror`], on by default;
//!   `RETHREAD_MIRROR=off`).
//! - [`probe_thread`]: a thread's health without resuming it.
//! - [`StatusRail`]: typed status events for any surface.
//! - [`telemetry`]: the `tracing` spans (`rethread.open`, `rethread.resume`,
//!   `rethread.fallback`, `rethread.lease`, `rethread.turn`, `rethread.commit`, each with its
//!   session id, thread id and outcome) and the `metrics` the runtime records
//!   (`rethread_opens_total`, `rethread_fallbacks_total`, `rethread_resume_seconds`,
//!   `rethread_commit_seconds`, `rethread_lease_wait_seconds`, `rethread_turns_total`,
//!   `rethread_turn_seconds`, `rethread_subscribers_cut_off_total`). The library installs no
//!   subscriber and no exporter: the host does.
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
//!
//! # Streaming a turn
//!
//! [`CodexSession::run_turn_streamed`] yields the turn's [`TurnEvent`]s while it runs: the
//! reply as it is written, items as they start and complete, server requests (approvals) with
//! the answer the [`ServerRequestHandler`] gave, token usage, and last the committed
//! [`TurnReport`] (the same commit as [`CodexSession::run_turn`], which is this stream read to
//! its end). Input may carry images ([`TurnInput`]). Any number of other subscribers may watch
//! the thread ([`AppServerClient::subscribe`]); none takes events from another or from the
//! turn, and one that falls a whole buffer behind is cut off ([`ClientError::Lagged`]) rather
//! than stalling the turn or growing memory.
//!
//! ```no_run
//! # async fn demo(client: rethread_runtime::AppServerClient, store: std::sync::Arc<dyn rethread_store::BindingStore>) -> Result<(), Box<dyn std::error::Error>> {
//! use std::io::Write;
//! use rethread_runtime::{SessionBinder, StatusRail, ThreadEvent, TurnEvent, TurnInput};
//!
//! let mut binder = SessionBinder::new("chat-42", store, StatusRail::default());
//! let mut session = binder.open(&client).await?;
//!
//! // A second view of the same thread, e.g. an audit log, beside the turn's own.
//! let mut audit = client.subscribe(session.thread_id())?;
//! tokio::spawn(async move {
//!     while let Ok(event) = audit.next().await {
//!         if let ThreadEvent::ServerRequest(answered) = event {
//!             eprintln!("codex asked {}: {:?}", answered.request.method(), answered.answer);
//!         }
//!     }
//! });
//!
//! let input = TurnInput::text("What does this chart show?").with_local_image("/srv/chart.png");
//! let mut turn = session.run_turn_streamed(input).await?;
//! while let Some(event) = turn.next().await {
//!     match event? {
//!         TurnEvent::AgentMessageDelta { delta, .. } => {
//!             print!("{delta}");
//!             std::io::stdout().flush()?;
//!         }
//!         TurnEvent::ItemStarted(item) => eprintln!("[{}]", item.kind().unwrap_or("item")),
//!         TurnEvent::Completed(report) => {
//!             // Committed: the rows are durable and the binding published.
//!             println!();
//!             if let Some(usage) = report.token_usage {
//!                 eprintln!("{} tokens so far in this thread", usage.total.total_tokens);
//!             }
//!         }
//!         _ => {}
//!     }
//! }
//! binder.close().await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]
// Errors carry codex's error (message and data) whole for the host to show; they are the cold path.
#![allow(clippy::result_large_err)]

mod setters;

mod binder;
pub mod binding;
mod client;
mod deadline;
mod error;
mod lease;
pub mod machine;
pub mod mirror;
mod options;
mod probe;
pub mod projection;
mod rail;
mod session;
mod sink;
pub mod telemetry;
mod turn;

pub use binder::SessionBinder;
pub use binding::Publication;
pub use client::{
    AnsweredRequest, AppServerClient, ClientBuilder, ClientError, ClientOptions, CodexCommand,
    DeclineAll, ServerInfo, ServerRequestHandler, ThreadEvent, ThreadEvents,
};
pub use error::{BoxError, RuntimeError};
pub use lease::SessionLease;
pub use machine::{OpenOutcome, SeedOptions, RESUME_FALLBACK_NOTICE};
pub use mirror::{MirrorError, MirrorReport, RestoreFailure, Restored, RolloutMirror};
pub use options::{mirror_setting, BinderOptions, MIRROR_ENV};
pub use probe::{probe_thread, ThreadHealth, ThreadProbe};
pub use rail::{RecordedEvents, StatusEvent, StatusKind, StatusRail, StatusSink};
pub use session::CodexSession;
pub use sink::{SinkDurability, Transcript, TranscriptSink};
pub use turn::{TurnEnd, TurnEvent, TurnInput, TurnReport, TurnStream};
