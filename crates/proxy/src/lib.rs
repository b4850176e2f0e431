//! The forwarding layer of `rethread app-server`: a drop-in `codex app-server` that passes
//! every line through, both ways, and lets session logic join the conversation through
//! [`SessionHooks`].
//!
//! - [`forward`]: the forwarder over any pair of byte streams (an in-process fake, pipes).
//! - [`run_app_server`]: the process: codex spawned from a [`CodexCommand`] (the runtime's
//!   one description of a codex process, re-exported here), the client on
//!   stdin/stdout, SIGINT/SIGTERM, the exit code.
//! - [`SessionHooks`], [`ClientContext`], [`ServerContext`], [`CodexRequester`]: the seam.
//! - [`NoSession`]: the hooks without a session (pass-through plus one `warning`).
//! - [`BindingHooks`]: the hooks of a session (`RETHREAD_SESSION`): resume on the first
//!   `thread/start`, fall back with one `warning`, commit each completed turn (see
//!   [Sessions](#sessions)).
//! - [`Line`]: a line as read plus its routing facts ([`Peek`]), found without parsing the
//!   line into a tree.
//!
//! # Forwarding
//! - Lines pass through as the bytes that were read, terminator included: the proxy never
//!   re-serialises or copies a line it forwards. Unknown methods and members, `initialize`
//!   (answered by codex itself), server requests (approvals) and the client's answers to
//!   them pass untouched.
//! - A line that is not a JSON-RPC message (not JSON, not an object, no kind) is passed on as
//!   it is and reported on stderr. The client's lines are read as codex reads them, by
//!   serde_json: what the hooks route is exactly what codex will see. Two kinds of client line
//!   are refused, never forwarded: one that is not UTF-8 (codex's line reader fails on it and
//!   codex exits) and one whose `id`, `method`, `params`, `result` or `error` comes twice
//!   (codex refuses it, and it has no single reading: its answer could pass for another
//!   request's). When the line names its sender, the sender gets an error in its place
//!   (`-32700` for UTF-8, `-32600` for a duplicate: the client for a request, codex for the
//!   client's answer to a server request); otherwise it is dropped; either way it is reported.
//!   A line longer than [`ProxyOptions::max_line_length`] (the
//!   protocol crate's limit by default) is never held whole: when its first 4 KiB name its
//!   `id`, whoever waits for it gets a JSON-RPC error in its place (the client for a request
//!   or an answer codex sent it, codex for a server request or the client's answer to one);
//!   otherwise it is dropped. Either way it is reported on stderr. One exception: codex's
//!   answer to the proxy's own `thread/resume` is kept without its `result.thread.turns`
//!   (`LineFramer::eliding`), which the proxy drops anyway. On 0.144.6 a client without
//!   `experimentalApi` gets `excludeTurns` refused, so that answer carries every turn, and a
//!   long thread would otherwise never be resumed through the proxy.
//! - Each direction has one bounded queue (lines and bytes, [`ProxyOptions`]); a reader waits
//!   when its queue is full, so a client that reads slowly slows the reading of codex's
//!   output, and the reverse. Nothing grows without bound.
//!
//! # Ids
//! Requests the proxy makes itself have ids `"rethread-proxy:<n>"` ([`PROXY_ID_PREFIX`]): a
//! string no integer id and no UUID can equal. Their answers are taken off codex's output
//! before anything else sees them and never reach the client (an answer nobody waits for any
//! more is dropped and reported). A client request whose id starts with the prefix is answered
//! with `-32600` and not forwarded, so the two id spaces cannot meet. Server requests keep
//! codex's ids, and the client's answers go back untouched.
//!
//! # The seam for session logic
//! A [`SessionHooks`] implementation is called by the forwarder; the contexts let it act.
//!
//! | hook | when | may |
//! |---|---|---|
//! | [`on_start`](SessionHooks::on_start) | once, before any line is read | fail (the proxy stops) |
//! | [`on_client_message`](SessionHooks::on_client_message) | each client message, in order | forward it, consume it, [`send_to_codex`](ClientContext::send_to_codex), [`send_to_client`](ClientContext::send_to_client), [`request`](ClientContext::request) |
//! | [`on_server_message`](SessionHooks::on_server_message) | each codex message that is not an answer to the proxy, in order | forward it, consume it, [`send_to_client`](ServerContext::send_to_client), [`send_to_codex`](ServerContext::send_to_codex), await other work |
//! | [`on_shutdown`](SessionHooks::on_shutdown) | once, when forwarding ended for any reason, before codex is stopped | release what it holds |
//!
//! Guarantees (each is what a session binding relies on):
//! 1. **Client order.** Client messages reach the hook one at a time in the client's order;
//!    while `on_client_message` runs (including while it awaits its own requests), no later
//!    client line is read or forwarded. A hook can therefore hold the client's first
//!    `thread/start`, resume a thread, and answer or forward the start before the client's
//!    next line (typically its `turn/start`) reaches codex.
//! 2. **Codex order.** Codex messages reach `on_server_message` one at a time in codex's order,
//!    each before it is queued for the client. Awaiting in it (a store commit on
//!    `turn/completed`) holds codex's output back until it returns, so the client sees the line
//!    only after that work finished.
//! 3. **Requests do not block codex's output.** While a hook awaits
//!    [`ClientContext::request`], codex's output keeps flowing to the client through
//!    `on_server_message`; only the answer is diverted to the waiting request.
//! 4. **Everything before an answer is out first.** When a proxy request returns, every codex
//!    line that preceded its answer on codex's stdout has already been through
//!    `on_server_message` and queued for the client.
//! 5. **One queue per direction, in call order.** Lines queued with `send_to_client` (from
//!    either context) and codex lines forwarded reach the client in the order they were
//!    queued. So a hook that, in `on_client_message`, awaits `request("thread/start", ..)`,
//!    then calls `send_to_client(Line::warning(..))`, then
//!    `send_to_client(Line::response(client_id, result))` delivers: codex's `thread/started`
//!    (and anything else codex said before its answer), then the warning, then the answer.
//!    Likewise `send_to_codex` and forwarded client lines reach codex in call order.
//! 6. **No deadlock by construction.** `on_server_message` gets a [`ServerContext`], which has
//!    no `request`: the reader that would deliver an answer is the one running the hook.
//! 7. **Requests are bounded.** A proxy request fails with [`RequestError::Timeout`] after
//!    [`ProxyOptions::request_timeout`], with [`RequestError::Closed`] as soon as codex's
//!    output ends, and leaves nothing behind when its future is dropped. Codex refuses
//!    requests before the client's `initialize`; a hook makes its own only after it has seen
//!    the client's `initialize` answered (the connection's capabilities are the client's:
//!    `excludeTurns` needs its `experimentalApi`).
//! 8. **Shutdown.** `on_shutdown` runs once on every end of [`forward`] (client gone, codex
//!    gone, a signal, a hook error), before codex is stopped; not when the process is killed.
//!    A hook future interrupted by a signal is dropped at an await point: durable work must be
//!    safe to abandon there (the store's commits are). Codex's end does not interrupt a hook:
//!    an `on_client_message` running when codex's output ends finishes (its requests fail with
//!    [`RequestError::Closed`] at once), and what it queued for the client goes out before the
//!    client's output is closed.
//!
//! Lines that are not messages, refused lines and oversized lines never reach the hooks; a hook
//! error stops the proxy (codex is stopped, the process exits 1 with the error as its cause).
//!
//! # Sessions
//! [`BindingHooks`] keep one session's codex thread across restarts, with the runtime's rules
//! (`rethread_runtime::binding`: the resume verdicts, giving a lost thread up in one fenced
//! write, the seed, the projection of a turn into rows, `commit_turn` under the lease's fence)
//! driven from the hooks, so the proxy and the library cannot disagree.
//!
//! | when | the hooks | the client sees |
//! |---|---|---|
//! | [`BindingHooks::open`] (before codex starts) | take the session's lease (waiting up to `lease_wait`; a holder that died on this machine is taken over at once); renewed in the background, released on every end of forwarding | a session a live process holds: `RuntimeError::SessionBusy` (the CLI exits 75 before codex starts) |
//! | the client's first `thread/start`, no binding | forward it; follow the thread it opens | codex's answer |
//! | the client's first `thread/start`, a binding | with the rollout mirror on (`binder.mirror`, the default), first restore the thread's rollout from the store where this `CODEX_HOME` lacks it or holds less (a failed restore: a `warning`, and the resume goes ahead); then `thread/resume` of the bound thread instead (own id; `excludeTurns`, dropped when codex wants the capability for it; the start's members a resume also takes: cwd, model, instructions, approval and sandbox settings, ...) | a `thread/start` result carrying the bound thread (`turns: []`, the resume-only members left out), then `thread/started`; no `warning` (but the failed restore's, right before the result) |
//! | ... codex lost it (gone, incompatible, unreadable) | give it up (one fenced write: binding dropped, thread retired), forward the client's start with the transcript's tail appended to its developer instructions | codex's `thread/started`, then exactly one `warning` `{"message": RESUME_FALLBACK_NOTICE, "threadId": <new>}`, then the answer (`threadId` is `null` if codex refused the start) |
//! | ... busy or temporary past the retries | nothing written, binding kept; the next `thread/start` tries again | a JSON-RPC error: `-32001`, `data.codexErrorInfo: "server_overloaded"`, `data.rethread: {kind, sessionId, threadId, retryable: true}` |
//! | ... another failure (an answer codex is not known to give, the store failing) | nothing written, binding kept | a JSON-RPC error: `-32603`, `data.rethread` with `retryable: false` (`-32001` for a locked store) |
//! | `thread/resume`, `thread/fork`, a later `thread/start` | forward; the session stays on its own thread: another thread's turns are not recorded and the client is told so once (a `warning`); a `thread/resume` of another session's thread is refused; an ephemeral thread is never bound | codex's answer (a refusal: `-32600`, `data.rethread.kind: "thread_taken"`) |
//! | `item/completed` on a followed thread | project the item into its row (kept within [`TurnLimits`]) | the line |
//! | `turn/completed`, completed, on a followed thread | the rows and the binding to that thread in one fenced store commit, with what its rollout grew by (the mirror), awaited before the line goes on | `turn/completed` once the commit is durable; a failed commit: a `warning` first; a rollout that could not be read or the mirror's cap passed: one `warning` |
//! | `turn/completed`, failed or interrupted | nothing written | the line |
//! | the lease found lost (another process took it over after a stall past its TTL, or the session was forgotten) | nothing more written by this process | one `warning` saying which |
//!
//! Every notice also goes to stderr through [`ProxyOptions::reporter`]. The binding never
//! moves: it stays on the session's thread (the one resumed or started for the client's first
//! `thread/start`); threads codex runs for itself (a sub-agent's, say) are not followed.
//!
//! ```no_run
//! use rethread_proxy::{run_app_server, CodexCommand, NoSession, ProxyOptions};
//! # async fn demo() -> Result<(), rethread_proxy::ProxyError> {
//! let command = CodexCommand::new("codex").args(["--listen", "stdio://"]);
//! let code = run_app_server(&command, &NoSession::new(), &ProxyOptions::default()).await?;
//! std::process::exit(code);
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]

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
    ClientAction, ClientContext, CodexRequester, HookError, RequestError, ServerAction,
    ServerContext, SessionHooks, PROXY_ID_PREFIX,
};
pub use line::{peek, peek_prefix, Line, LineKind, Peek};
pub use passthrough::{NoSession, NO_SESSION_WARNING};
pub use process::{run_app_server, spawn_app_server};
pub use rethread_runtime::CodexCommand;
pub use session::{BindingHooks, SessionOptions, TurnLimits};

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
    /// The client's input ended. Codex's input was closed after everything read was
    /// forwarded; `codex_finished` tells whether codex then closed its output (all of it
    /// passed on) within the shutdown grace.
    ClientClosed {
        /// Codex's output ended within the grace.
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

/// Where the proxy says what it did with lines it could not simply forward: one line each.
/// The default writes `rethread app-server: <message>` to stderr.
#[derive(Clone)]
pub struct Reporter(Arc<dyn Fn(&str) + Send + Sync>);

impl Reporter {
    /// A reporter calling `report` with each message.
    pub fn new(report: impl Fn(&str) + Send + Sync + 'static) -> Self {
        Reporter(Arc::new(report))
    }

    /// `rethread app-server: <message>` on stderr.
    pub fn stderr() -> Self {
        // Best effort: a client that closed stderr still gets the session (`eprintln!` panics).
        Reporter::new(|message| {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "rethread app-server: {message}");
        })
    }

    /// Says `message`.
    pub fn report(&self, message: &str) {
        (self.0)(message);
    }
}

impl Default for Reporter {
    fn default() -> Self {
        Reporter::stderr()
    }
}

impl fmt::Debug for Reporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Reporter")
    }
}

/// Bounds and timeouts of the proxy: [`ProxyOptions::default`], then set the fields to
/// change.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProxyOptions {
    /// The longest line passed on (terminator excluded); longer ones are answered or dropped.
    pub max_line_length: usize,
    /// At most this many lines wait in each direction's queue.
    pub queue_lines: usize,
    /// At most this many bytes wait in each direction's queue (one larger line at a time).
    pub queue_bytes: usize,
    /// The read buffer of each side. Lines are split off it without a copy; a line that
    /// outgrows it is moved to a larger one, so lines up to this size are never moved.
    pub read_buffer: usize,
    /// The write buffer of each side; small lines are batched into it, larger ones bypass it.
    pub write_buffer: usize,
    /// How long a proxy request waits for codex's answer.
    pub request_timeout: Duration,
    /// After the client's input ends (or a signal), how long codex gets to exit before it is
    /// killed.
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
