//! The rethread runtime: drives `codex app-server` for a host session and keeps the codex
//! thread bound to it across restarts (the rules: `docs/design.md`).
//!
//! - [`AppServerClient`]: spawn `<codex> app-server` (or connect any reader/writer), handshake,
//!   bounded requests, per-thread events, server requests answered by a
//!   [`ServerRequestHandler`] (default [`DeclineAll`]).
//! - [`SessionBinder`] / [`CodexSession`]: the library driver of the [`machine`]: open (resume
//!   or fall back) under the session's [`SessionLease`], run turns
//!   ([`CodexSession::run_turn_streamed`] yields [`TurnEvent`]s), commit them.
//! - [`binding`]: the store side of the machine's actions, shared with the other drivers.
//! - [`kept`]: threads kept without a session, by their own id ([`kept::Keeper`]).
//! - [`RolloutMirror`]: the thread's rollout files carried through the store
//!   ([`BinderOptions::mirror`]). [`probe_thread`]: a thread's health without resuming it.
//! - [`StatusRail`]: typed status events. [`telemetry`]: span and metric names; the library
//!   installs no subscriber and no exporter.
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

/// Builder-style setters, one per field: `fn field(self, value) -> Self`.
macro_rules! setters {
    ($ty:ty { $($field:ident: $t:ty),* $(,)? }) => {
        impl $ty {
            $(
                #[doc = concat!("Sets `", stringify!($field), "`.")]
                pub fn $field(mut self, $field: $t) -> Self {
                    self.$field = $field;
                    self
                }
            )*
        }
    };
}

mod binder;
pub mod binding;
mod client;
mod error;
pub mod kept;
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
    stop_signal, AnsweredRequest, AppServerClient, ClientBuilder, ClientError, ClientOptions,
    CodexCommand, DeclineAll, ServerInfo, ServerRequestHandler, ThreadEvent, ThreadEvents,
    WaitRefused, Waiter, Waiters,
};
pub use error::{BoxError, RuntimeError};
pub use lease::SessionLease;
pub use machine::{OpenOutcome, SeedOptions, RESUME_FALLBACK_NOTICE};
pub use mirror::{MirrorError, MirrorReport, RestoreFailure, Restored, RolloutMirror};
pub use options::{
    mirror_cap_setting, mirror_setting, parse_mirror_cap, BinderOptions, MIRROR_CAP_ENV, MIRROR_ENV,
};
pub use probe::{probe_thread, ThreadHealth, ThreadProbe};
pub use rail::{RecordedEvents, StatusEvent, StatusKind, StatusRail, StatusSink};
pub use session::CodexSession;
pub use sink::{SinkDurability, Transcript, TranscriptSink};
pub use turn::{TurnEnd, TurnEvent, TurnInput, TurnReport, TurnStream};

/// `now + wait`, `wait` capped at a century: a limit of `Duration::MAX` (none) must not
/// overflow an `Instant`.
fn deadline<I: std::ops::Add<std::time::Duration, Output = I>>(
    now: I,
    wait: std::time::Duration,
) -> I {
    now + wait.min(std::time::Duration::from_secs(100 * 365 * 24 * 60 * 60))
}
