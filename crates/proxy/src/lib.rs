//! The forwarding layer of `rethread app-server`: a drop-in `codex app-server` that passes
//! every line through, both ways, and lets session logic join the conversation through
//! [`SessionHooks`].
//!
//! - [`forward`]: the forwarder over any pair of byte streams; [`run_app_server`]: the process
//!   (codex spawned from a [`CodexCommand`], the client on stdin/stdout, signals, exit code).
//! - [`SessionHooks`], [`ClientContext`], [`ServerContext`], [`CodexRequester`]: the seam.
//! - [`NoSession`]: pass-through plus one `warning` (with a store, [`NoSession::keeping`]: each
//!   thread kept by its own id); [`BindingHooks`]: the hooks of a session (`RETHREAD_SESSION`,
//!   see [Sessions](#sessions)).
//! - [`Line`]: a line as read plus its routing facts ([`Peek`]), found without parsing it into
//!   a tree.
//!
//! # Forwarding
//! - Lines pass through as the bytes that were read, terminator included, never re-serialised
//!   or copied. Unknown methods and members, `initialize`, server requests (approvals) and the
//!   client's answers to them pass untouched.
//! - A line that is not a JSON-RPC message (not JSON, not an object, no kind) is passed on and
//!   reported on stderr. The client's lines are read as codex reads them (serde_json), so what
//!   the hooks route is what codex sees. Two kinds of client line are refused, never forwarded:
//!   one that is not UTF-8 (codex's line reader fails and codex exits) and one whose `id`,
//!   `method`, `params`, `result` or `error` comes twice (codex refuses it, and its answer
//!   could pass for another request's), or with a member named twice in one object anywhere
//!   inside its `params` (codex keeps the last one, which a guard reading the first would not
//!   see).
//! - A line longer than [`ProxyOptions::max_line_length`] is never held whole. One exception:
//!   codex's answer to the proxy's own `thread/resume` is kept without `result.thread.turns`
//!   (`LineFramer::eliding`), which the proxy drops anyway: on 0.144.6 a client without
//!   `experimentalApi` gets `excludeTurns` refused, and a long thread could not be resumed.
//! - A refused or oversized line is answered in its place when it names an `id` (the client for
//!   its request, or for codex's answer to one; codex for its request, or for the client's
//!   answer to one: `-32700` for UTF-8, `-32600` for a duplicate or the client's oversized
//!   line, `-32603` for codex's), else dropped; either way reported on stderr.
//! - Each direction has one bounded queue (lines and bytes, [`ProxyOptions`]); a reader waits
//!   while its queue is full, so a slow reader on one side slows the other side's reading.
//!
//! # Ids
//! The proxy's own requests have ids `"rethread-proxy:<n>"` ([`PROXY_ID_PREFIX`]), which no
//! integer or UUID id can equal. Their answers are taken off codex's output before anything
//! else sees them (one nobody waits for any more is dropped and reported). A client request
//! with an id of that prefix is answered with `-32600` and not forwarded. Server requests keep
//! codex's ids.
//!
//! # The seam for session logic
//! | hook | when | may |
//! |---|---|---|
//! | [`on_start`](SessionHooks::on_start) | once, before any line is read | fail (the proxy stops) |
//! | [`on_client_message`](SessionHooks::on_client_message) | each client message, in order | forward it, consume it, [`send_to_codex`](ServerContext::send_to_codex), [`send_to_client`](ServerContext::send_to_client), [`request`](ClientContext::request) |
//! | [`on_server_message`](SessionHooks::on_server_message) | each codex message that is not an answer to the proxy, in order | forward it, consume it, `send_to_client`, `send_to_codex`, await other work |
//! | [`on_shutdown`](SessionHooks::on_shutdown) | once, when forwarding ended for any reason, before codex is stopped | release what it holds |
//!
//! The two message hooks run concurrently, interleaved at the await points of one task.
//! Guarantees (what a session binding relies on):
//! 1. **Client order.** Client messages reach the hook one at a time, in order; while
//!    `on_client_message` runs (its own requests included), no later client line is read or
//!    forwarded. So a hook can hold the first `thread/start`, resume a thread, and answer the
//!    start before the client's next line (its `turn/start`) reaches codex.
//! 2. **Codex order.** Codex messages reach `on_server_message` one at a time, in order, each
//!    before it is queued for the client: awaiting there (a commit on `turn/completed`) holds
//!    codex's output back, so the client sees the line only after that work.
//! 3. **Requests do not block codex's output.** While a hook awaits
//!    [`ClientContext::request`], codex's output keeps flowing through `on_server_message`;
//!    only the answer is diverted.
//! 4. **Everything before an answer is out first.** When a proxy request returns, every codex
//!    line before its answer has been through `on_server_message` and queued for the client.
//! 5. **One queue per direction, in call order.** Lines queued with `send_to_client` (from
//!    either context) and codex lines forwarded reach the client in the order they were
//!    queued (so after `request("thread/start", ..)`, a `warning` then the answer reach the
//!    client after codex's `thread/started`); likewise toward codex.
//! 6. **No deadlock by construction.** [`ServerContext`] has no `request`: the reader that
//!    would deliver its answer is the one running the hook.
//! 7. **Requests are bounded.** A proxy request fails with [`ClientError::Timeout`] after
//!    [`ProxyOptions::request_timeout`], with [`ClientError::Closed`] as soon as codex's
//!    output ends, and leaves nothing behind when dropped. Codex refuses requests before the
//!    client's `initialize`: a hook makes its own only after that was answered (the
//!    connection's capabilities are the client's: `excludeTurns` needs its `experimentalApi`).
//! 8. **Shutdown.** `on_shutdown` runs once on every end of [`forward`], before codex is
//!    stopped; not when the process is killed. A hook interrupted by a signal is dropped at an
//!    await point (durable work must be safe to abandon there, as the store's commits are).
//!    Codex's end does not interrupt a hook: its requests fail at once, and what it queued for
//!    the client goes out before the client's output is closed.
//!
//! Lines that are not messages, refused and oversized lines never reach the hooks. A hook error
//! stops the proxy (codex is stopped, the process exits 1 with the error as its cause).
//!
//! # Sessions
//! [`BindingHooks`] drive the runtime's session rules (`rethread_runtime::binding`: resume
//! verdicts, the fenced give-up, the seed, the projection of turns, `commit_turn`), so the
//! proxy and the library cannot disagree.
//!
//! | when | the hooks | the client sees |
//! |---|---|---|
//! | [`BindingHooks::open`] (before codex starts) | take the session's lease (waiting up to `lease_wait`; a holder that died on this machine is taken over at once), renewed in the background, released on every end | a session a live process holds: `RuntimeError::SessionBusy` (the CLI answers the client's first request with [`open_refused`] through [`answer_first_request`], then exits 75) |
//! | the client's first `thread/start`, no binding | forward it; follow the thread it opens | codex's answer |
//! | the client's first `thread/start`, a binding | with the mirror on (`binder.mirror`), first restore the thread's rollout where this `CODEX_HOME` lacks it or holds less (failed: a `warning`, the resume goes ahead); then `thread/resume` of the bound thread instead (own id; `excludeTurns`, dropped when codex wants the capability; the start's members a resume takes) | a `thread/start` result carrying the bound thread (`turns: []`, resume-only members left out), then `thread/started`; no `warning` (but a failed restore's, before the result) |
//! | ... codex lost it (gone, incompatible, unreadable, another account's) | give it up (one fenced write), forward the start with the transcript's tail appended to its developer instructions | codex's `thread/started`, then exactly one `warning` `{"message": RESUME_FALLBACK_NOTICE, "threadId": <new>}` (`null` if codex refused the start), then the answer; with [`NoticeDelivery::Item`], also the notice's own `agentMessage` item before the first item of the new thread's next turn |
//! | ... busy or temporary past the retries | nothing written; the next `thread/start` tries again | `-32001`, `data.codexErrorInfo: "server_overloaded"`, `data.rethread: {kind, sessionId, threadId, retryable: true}` |
//! | ... another failure (an unknown answer, the store failing) | nothing written | `-32603`, `data.rethread` with `retryable: false` (`-32001` for a locked store) |
//! | `thread/resume`, `thread/fork`, a later `thread/start` | forward (a resume's or fork's thread first restored from the session's mirror where this `CODEX_HOME` lacks it or holds less, as for the first `thread/start`); another thread's turns are not recorded, and the client is told once (a `warning`); an ephemeral thread is never bound | codex's answer (a thread codex refuses even so: codex's error, the binding kept) |
//! | any request naming another session's thread (`threadId` in any spelling codex reads; `rethread_runtime::binding::client_thread` decides) | not forwarded | `-32600`, `data.rethread: {kind: "thread_taken", sessionId, threadId, ownerSessionId}` |
//! | `item/completed` on a followed thread | project the item into its row (within [`TurnLimits`]; a turn with no user input, a compaction, has no user row) | the line |
//! | `turn/completed`, completed, on a followed thread | the rows, the binding and the rollout's growth (the mirror) in one fenced commit, awaited before the line goes on | the line once the commit is durable; a failed commit: a `warning` first; an unreadable rollout or the mirror's cap passed: one `warning` |
//! | `turn/completed`, failed or interrupted | nothing written | the line |
//! | ... failed, the first turn after the session's resume, as another account's thread (`invalid_encrypted_content`) | give the thread up (one fenced write) | one `warning` `RESUME_FALLBACK_NOTICE` (with [`NoticeDelivery::Item`]: the replacement's item instead), then the line |
//! | then a request naming the given-up thread (its `turn/start`) | open a replacement: the proxy's own `thread/start` with the session start's params, seeded; this and every later request naming the given-up thread go to it (`threadId` rewritten, a new line) | codex's `thread/started` of the new thread, then its answers and notifications, naming the new thread |
//! | the lease found lost (taken over after a stall past its TTL, or the session forgotten) | nothing more written | one `warning` saying which |
//!
//! Every notice also goes to stderr ([`ProxyOptions::reporter`]). The binding stays on the
//! session's thread (the one resumed or started for the first `thread/start`); threads codex
//! runs for itself (a sub-agent's) are not followed.
//!
//! ```no_run
//! use rethread_proxy::{run_app_server, CodexCommand, NoSession, ProxyOptions};
//! # async fn demo() -> Result<(), rethread_proxy::ProxyError> {
//! let command = CodexCommand::new("codex").args(["--listen", "stdio://"]);
//! let code = run_app_server(&command, &NoSession::new(), &ProxyOptions::default()).await?;
//! std::process::exit(code);
//! # }
//! ```

mod forward;
mod hooks;
mod line;
mod passthrough;
mod process;
mod queue;
mod session;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use forward::forward;
pub use hooks::{
    ClientAction, ClientContext, CodexRequester, HookError, ServerAction, ServerContext,
    SessionHooks, PROXY_ID_PREFIX,
};
pub use line::{peek, peek_prefix, Line, LineKind, Peek};
pub use passthrough::{NoSession, KEPT_THREADS_WARNING, NO_SESSION_WARNING};
pub use process::{answer_first_request, run_app_server, spawn_app_server};
/// What the proxy's own requests fail with: the runtime client's error.
pub use rethread_runtime::{ClientError, CodexCommand};
pub use session::{open_refused, BindingHooks, NoticeDelivery, SessionOptions, TurnLimits};

/// Errors of the proxy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// Codex could not be started.
    #[error("could not start `{program}`: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A hook stopped the proxy.
    #[error("{0}")]
    Hook(#[source] HookError),
    /// Codex's input is closed: the line was not sent.
    #[error("codex app-server's input is closed")]
    CodexClosed,
    /// The client's output is closed: the line was not sent.
    #[error("the client's output is closed")]
    ClientClosed,
}

/// How [`forward`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ended {
    /// The client's input ended: everything read was forwarded, then codex's input closed.
    ClientClosed {
        /// Codex then closed its output (all of it passed on) within the shutdown grace.
        codex_finished: bool,
    },
    /// Writing to the client failed: it is gone.
    ClientGone,
    /// Codex's output ended; everything it wrote, and what a hook call running at that moment
    /// queued for the client, was passed on and flushed.
    CodexClosed,
    /// The stop future resolved with this signal number.
    Stopped {
        /// The signal (2 for SIGINT, 15 for SIGTERM).
        signal: i32,
    },
}

/// Where the proxy reports what it could not simply forward, one line each.
#[derive(Clone)]
pub struct Reporter(Arc<dyn Fn(&str) + Send + Sync>);

impl Reporter {
    /// A reporter calling `report` with each message.
    pub fn new(report: impl Fn(&str) + Send + Sync + 'static) -> Self {
        Reporter(Arc::new(report))
    }

    /// Says `message`.
    pub fn report(&self, message: &str) {
        (self.0)(message);
    }
}

impl Default for Reporter {
    /// `rethread app-server: <message>` on stderr.
    fn default() -> Self {
        // Best effort: a client that closed stderr still gets the session (`eprintln!` panics).
        Reporter::new(|message| {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "rethread app-server: {message}");
        })
    }
}

impl fmt::Debug for Reporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Reporter")
    }
}

/// Bounds and timeouts of the proxy: [`ProxyOptions::default`], then set the fields.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProxyOptions {
    /// The longest line passed on (terminator excluded); longer ones are answered or dropped.
    pub max_line_length: usize,
    /// At most this many lines wait in each direction's queue.
    pub queue_lines: usize,
    /// At most this many bytes wait in each direction's queue (one larger line at a time).
    pub queue_bytes: usize,
    /// The read buffer of each side: lines up to this size are split off it, never moved.
    pub read_buffer: usize,
    /// The write buffer of each side; small lines are batched into it, larger ones bypass it.
    pub write_buffer: usize,
    /// How long a proxy request waits for codex's answer.
    pub request_timeout: Duration,
    /// After the client's input ends (or a signal), how long codex gets to exit.
    pub shutdown_grace: Duration,
    /// Where unforwardable lines are reported.
    pub reporter: Reporter,
}

impl Default for ProxyOptions {
    fn default() -> Self {
        ProxyOptions {
            max_line_length: rethread_protocol::codec::DEFAULT_MAX_LINE_LENGTH,
            queue_lines: 256,
            queue_bytes: 1024 * 1024,
            read_buffer: 64 * 1024,
            write_buffer: 64 * 1024,
            request_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(3),
            reporter: Reporter::default(),
        }
    }
}
