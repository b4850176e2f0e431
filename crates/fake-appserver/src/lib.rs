//! A scripted stand-in for `codex app-server`, with codex's thread-store semantics, plus the
//! pieces needed to drive the **real** codex offline.
//!
//! - [`FakeAppServer`]: the fake, in-process over a duplex pipe
//!   ([`FakeBuilder::spawn_in_process`], observed and scripted through a [`FakeHandle`]) or as
//!   the `fake-codex` binary (`fake-codex app-server [--listen stdio://]`, threads under
//!   `$CODEX_HOME`, a temporary home when it is unset; `fake-codex exec --experimental-json`
//!   for `codex exec`'s JSONL interface, one turn on a fake of its own). It behaves like the real codex wherever the parity suite (`tests/parity.rs`) observes
//!   the real one: the same methods, errors (codes and messages), notification sequence,
//!   paging, `historyMode` rules and writer lock, and the same files on disk. See [`Profile`]
//!   for the releases it imitates and [`faults`] for what it can be told to do wrong.
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
//! # Public API
//!
//! - [`FakeAppServer::builder`] -> [`FakeBuilder`]: `profile`, `faults`, `codex_home`, `reply`,
//!   `answer` ([`AnswerShape`]: streamed in deltas or only completed), `model_log`; then `spawn_in_process` (a [`tokio::io::DuplexStream`] and a [`FakeHandle`])
//!   or `serve(reader, writer)` (what `fake-codex` runs), which ends with [`Ended`].
//! - [`FakeHandle`]: `codex_home`, `requests` / `methods` ([`LoggedRequest`]),
//!   `model_requests` ([`ModelRequest`]), `clear_logs`, `profile` / `set_profile`,
//!   `set_faults`, `set_reply`, `set_answer`, `is_running`, `kill`, `restart`, `rollout_path`,
//!   `corrupt_rollout`, `set_rollout_history_mode`, `set_indexed_history_mode`.
//! - [`Profile`]: `current` (0.171.0, and 0.169.0), `release-n` (0.144.6), `pre-history-mode`.
//! - [`faults`]: [`FaultScript`], [`Fault`], [`Corruption`] (JSON or TOML).
//! - [`model`]: [`Reply`], [`AnswerShape`], [`ConversationMessage`], [`model::echo_reply`],
//!   [`model::stream_pieces`].
//!
//! # The home on disk is codex's
//!
//! A `CODEX_HOME` the fake wrote is one every supported release starts in and resumes from
//! (its model sees the earlier turns), and the fake resumes threads every supported release
//! wrote (`tests/shared_home.rs`):
//! - Rollouts are codex's format; the fake writes the records codex needs and reads the turns
//!   out of real rollouts (see the `store::rollout` module).
//! - `state_5.sqlite` is codex's database, whose tables each release creates through its own
//!   recorded migrations: a release refuses to start where one of its tables already exists
//!   unrecorded (the fake used to make a `threads` table: `failed to migrate state DB ...
//!   table threads already exists`), and ignores tables it does not know. So the fake keeps its
//!   index in a table of its own, `rethread_fake_threads`, reads codex's `threads` table when a
//!   real codex made one, and never writes codex's tables. A real codex finds the fake's
//!   threads by scanning `sessions/` (it lists them once it has resumed them, as it does for
//!   any rollout it has not indexed yet).
//! - Writer locks are the same files (`thread-writer-locks/<id>.lock`).
//!
//! # Parity rows
//!
//! Each scenario of `tests/parity.rs` runs against the fake in-process, the `fake-codex`
//! binary and the real releases; the observation logs must be identical. Last run (all
//! identical):
//!
//! | scenario | `current` vs 0.171.0 | `current` vs 0.169.0 | `release-n` vs 0.144.6 |
//! |---|---|---|---|
//! | handshake and request errors | same | same | same |
//! | memory and developer instructions across a restart, `excludeTurns` | same | same | same |
//! | gone threads (no turn, unknown, malformed, other home, deleted under a live server) | same | same | same |
//! | damaged rollouts (empty, garbage, torn, deleted, moved, unknown mode in rollout / index) | same | same | same |
//! | writer lock (second process) | same | same | same (no lock) |
//! | declined approval | same | same | same |
//! | interrupted turn | same | same | same |
//! | `thread/list` paging (order, `limit`, cursors, errors, `sortKey`) | same | same | same |
//! | paginated thread written by the release, read by 0.144.6 | same | same | - |
//! | the turn's notifications per answer shape (streamed in deltas, only completed) | same | same | same |
//! | a thread restored in another home by its rollout file alone (found, resumed, remembers) | same | same | same |
//!
//! `tests/exec_parity.rs` compares `fake-codex exec --experimental-json` with the real
//! `codex exec` (0.171.0 and 0.169.0; all identical): a new thread and its resume in a second
//! process (the model sees the first turn), a resume of a thread the home never had or whose
//! rollout was deleted (exit 1, `Error: thread/resume: thread/resume failed: no rollout found
//! for thread id <id> (code -32600)` on stderr), an `--image` list before `resume <id>` that
//! swallows it (a new thread), a prompt argument with a piped stdin (a `<stdin>` block), an
//! empty stdin (exit 1), and `-c developer_instructions=...` reaching the model.
//!
//! `tests/shared_home.rs` (each supported release): a thread the fake wrote resumes in the
//! release with its memory and back in the fake; one the release wrote resumes in the fake
//! with its memory and back in the release; 0.144.6 refuses a paginated thread the `current`
//! profile wrote as it refuses one 0.171.0 wrote.
//!
//! The parity rows find no difference between 0.171.0 and 0.169.0, so `current` stands for
//! both (reporting 0.171.0); there is no `previous` profile.
//!
//! A paginated `thread/revert` (0.169+: a head file beside the source rollout) is not
//! served by the fake; the runtime's mirror tests and the real-codex tests cover it.
//!
//! # What the parity suite found beyond the wire notes
//!
//! Observed on the real releases (and imitated by the fake):
//! - A rollout deleted after indexing answers `-32600 no rollout found for thread id <id>`
//!   (never ``failed to resolve rollout path``), on every release. Under 0.169.0 and 0.171.0 a
//!   resume of a *loaded* thread whose rollout was deleted answers `-32600 invalid paginated
//!   history lineage for <id>: missing source rollout`; they also trust their index (a rollout
//!   moved to another day's folder is "no rollout found" on resume), 0.144.6 finds it.
//! - An unknown `history_mode` in the rollout: `-32603 failed to read thread: thread-store
//!   internal error: failed to read session metadata <path>: ...`, ending in
//!   ``invalid session metadata history_mode: unknown variant `<mode>`, expected `legacy` or
//!   `paginated` `` (0.169.0, 0.171.0) or `does not start with session metadata` (0.144.6);
//!   never "unknown thread history mode". An unknown mode in `state_5.sqlite` alone is
//!   corrected from the rollout: the thread stays listed and resumable.
//! - 0.144.6 has no writer lock: a second process resumes a thread another one holds.
//! - `thread/read` of an unknown id: `-32600 thread not loaded: <id>`; malformed:
//!   `-32600 invalid thread id: ...`; `includeTurns` on a paginated thread before its first
//!   turn: `-32601 list_turns is not supported yet`.
//! - Unknown methods: ``-32600 Invalid request: unknown variant `<m>`, expected one of ...``,
//!   even before `initialize`; missing params: ``-32600 Invalid request: missing field
//!   `params` ``. Lines that are not JSON are ignored without an answer.
//! - A model that streams its answer gets one `item/agentMessage/delta` per piece it streamed,
//!   between the agent message's `item/started` and `item/completed`; a model that sends only
//!   the completed message gets no delta (every release). The fake's model streams by default
//!   ([`AnswerShape`]; `FAKE_CODEX_ANSWER` for the binary).
//! - A rollout copied to the same path under another home's `sessions/` is found by the scan,
//!   resumed, and its model sees the earlier turns; the copy grows in place.
//! - A successful `thread/resume` is followed by `thread/status/changed` (when newly loaded)
//!   and `thread/tokenUsage/updated` (when it has turns).
//! - After an interrupt, 0.144.6 treats the interrupted turn as still active: interrupting it
//!   again is never answered, interrupting another id answers `-32600 expected active turn id
//!   <given> but found <interrupted>`.
//! - `thread/list` orders by creation time (newest first) unless `sortKey` says
//!   `updated_at`, answers 25 threads unless `limit` says otherwise (0 counts as 1), and pages
//!   with `nextCursor` (see the `server::list` module); the fake used to ignore `limit` and
//!   `cursor` and order by update time.
//!
//! # Known departures (not observed by any client of ours)
//!
//! - `thread/list` ignores its filters (`cwd`, `modelProviders`, `sourceKinds`, `archived`,
//!   `searchTerm`, `includedThreadIds` and the rest) and answers `readStates` empty; codex
//!   0.169.0 and later fill it per thread with unread turns. 0.144.6's cursor is a bare time;
//!   the fake's carries the thread id on every profile.
//! - Only `initialize`, `thread/start`, `thread/resume`, `thread/read`, `thread/list`,
//!   `turn/start` and `turn/interrupt` are served; the items of a turn are a user message, an
//!   agent message and (with the approval fault) a command execution, none of 0.171.0's newer
//!   `ThreadItem` variants or notifications (`thread/search` partials) are produced.
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
pub use model::{AnswerShape, ConversationMessage, Reply};
pub use profile::Profile;
pub use server::{Ended, FakeAppServer, FakeBuilder, FakeHandle, LoggedRequest, ModelRequest};
