//! A scripted stand-in for `codex app-server`, with codex's thread-store semantics, plus the
//! pieces needed to drive the **real** codex offline.
//!
//! - [`FakeAppServer`]: the fake, in-process over a duplex pipe
//!   ([`FakeBuilder::spawn_in_process`], observed and scripted through a [`FakeHandle`]) or as
//!   the `fake-codex` binary (`fake-codex app-server`, threads under `$CODEX_HOME`).
//!   It behaves like the real codex wherever codex-wire-notes.md says how the real one
//!   behaves: the same methods, errors (codes and messages), notification sequence, rollout
//!   and SQLite layout, `historyMode` rules and writer lock. See [`Profile`] for the releases
//!   it imitates and [`faults`] for what it can be told to do wrong.
//! - [`model`]: what the fake's model answers ([`Reply`]) and the conversation it saw.
//!
//! The harness that drives the real codex, the Responses-API stand-in and the proptest
//! strategies live in the unpublished `rethread-testkit` crate: this library is linked by the
//! shipped `rethread` binary (its `demo`) and carries no test harness.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! use rethread_fake_appserver::{FakeAppServer, Profile};
//! use rethread_testkit::real::WirePeer;
//! use serde_json::json;
//!
//! let (client, handle) = FakeAppServer::builder().profile(Profile::Current).spawn_in_process()?;
//! let (read, write) = tokio::io::split(client);
//! let mut peer = WirePeer::new(read, write);
//! peer.initialize(false).await?;
//! let started = peer.request("thread/start", Some(json!({"cwd": "/tmp"}))).await?;
//! let id = started["result"]["thread"]["id"].as_str().unwrap().to_string();
//! assert_eq!(started["result"]["thread"]["historyMode"], "paginated");
//! let turn = peer.run_turn(&id, "remember zebra", None).await?;
//! assert_eq!(turn.agent_text(), ["echo: remember zebra"]);
//!
//! // A restart forgets loaded threads; the rollout brings the thread back with its memory.
//! let (read, write) = tokio::io::split(handle.restart().await?);
//! let mut peer = WirePeer::new(read, write);
//! peer.initialize(false).await?;
//! peer.request("thread/resume", Some(json!({"threadId": id}))).await?;
//! peer.run_turn(&id, "what did I say?", None).await?;
//! assert!(handle.model_requests()[1].saw("remember zebra"));
//! # Ok(()) }
//! ```
//!
//! # What the parity suite found beyond codex-wire-notes.md
//!
//! Observed on the pinned binaries (and imitated by the fake):
//! - A rollout deleted after indexing answers `-32600 no rollout found for thread id <id>`
//!   (never ``failed to resolve rollout path``), on both releases. Under 0.169.0 a resume of a
//!   *loaded* thread whose rollout was deleted answers `-32600 invalid paginated history
//!   lineage for <id>: missing source rollout`; 0.169.0 also trusts its index (a rollout moved
//!   to another day's folder is "no rollout found" on resume), 0.144.6 finds it.
//! - An unknown `history_mode` in the rollout: `-32603 failed to read thread: thread-store
//!   internal error: failed to read session metadata <path>: ...`, ending in
//!   ``invalid session metadata history_mode: unknown variant `<mode>`, expected `legacy` or
//!   `paginated` `` (0.169.0) or `does not start with session metadata` (0.144.6); never
//!   "unknown thread history mode". An unknown mode in `state_5.sqlite` alone is corrected from
//!   the rollout: the thread stays listed and resumable.
//! - 0.144.6 has no writer lock: a second process resumes a thread another one holds.
//! - `thread/read` of an unknown id: `-32600 thread not loaded: <id>`; malformed:
//!   `-32600 invalid thread id: ...`; `includeTurns` on a paginated thread before its first
//!   turn (0.169.0): `-32601 list_turns is not supported yet`.
//! - Unknown methods: ``-32600 Invalid request: unknown variant `<m>`, expected one of ...``,
//!   even before `initialize`; missing params: ``-32600 Invalid request: missing field
//!   `params` ``. Lines that are not JSON are ignored without an answer.
//! - A successful `thread/resume` is followed by `thread/status/changed` (when newly loaded)
//!   and `thread/tokenUsage/updated` (when it has turns).
//! - After an interrupt, 0.144.6 treats the interrupted turn as still active: interrupting it
//!   again is never answered, interrupting another id answers `-32600 expected active turn id
//!   <given> but found <interrupted>`.
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]

pub mod faults;
pub mod model;
mod profile;
mod server;
mod store;
mod util;

pub use faults::{Corruption, Fault, FaultScript};
pub use model::{ConversationMessage, Reply};
pub use profile::Profile;
pub use server::{Ended, FakeAppServer, FakeBuilder, FakeHandle, LoggedRequest, ModelRequest};
