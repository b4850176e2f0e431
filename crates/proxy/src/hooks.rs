//! The seam where session logic joins the forwarder: [`SessionHooks`], the contexts it is
//! handed, and the proxy's own requests to codex ([`CodexRequester`]).
//!
//! The crate documentation states the order guarantees; each item here restates the ones it
//! is responsible for.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rethread_protocol::jsonrpc::Request as RawRequest;
use rethread_protocol::messages::Request;
use rethread_protocol::{Message, RequestId, RpcError};
use serde_json::Value;
use tokio::sync::{oneshot, watch};

use crate::line::{Line, LineKind};
use crate::queue::Queue;
use crate::{ProxyError, Reporter};

/// The prefix of every request id the proxy originates. Clients use integers (JSON numbers) or
/// UUID strings (hex digits and hyphens); a string with this prefix is neither, having letters
/// past `f` and a colon. A client request whose id starts with it anyway is refused with an
/// error (see the crate docs), so the two id spaces never meet.
pub const PROXY_ID_PREFIX: &str = "rethread-proxy:";

/// True for an id in the proxy's own id space.
pub fn is_proxy_id(id: &RequestId) -> bool {
    matches!(id, RequestId::String(s) if s.starts_with(PROXY_ID_PREFIX))
}

/// The error a hook returns to stop the proxy: codex is shut down and `rethread app-server`
/// exits non-zero with this as its one-line cause. A hook that can carry on (answer the
/// client with an error, say) does that instead of returning an error.
pub type HookError = Box<dyn std::error::Error + Send + Sync>;

/// What becomes of a client line once [`SessionHooks::on_client_message`] has seen it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAction {
    /// Pass the line to codex unchanged (the very bytes the client sent).
    Forward,
    /// The hook dealt with it: answered the client itself, sent codex a rewritten line, or
    /// dropped it on purpose.
    Consumed,
}

/// What becomes of a codex line once [`SessionHooks::on_server_message`] has seen it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerAction {
    /// Pass the line to the client unchanged.
    Forward,
    /// The hook dealt with it (for instance sent it itself, followed by a notification of its
    /// own, through [`ServerContext::send_to_client`]).
    Consumed,
}

/// Session logic plugged into the forwarder. [`NoSession`](crate::NoSession) is the
/// pass-through; a session binding implements the same trait.
///
/// # Contract
/// - [`on_client_message`](Self::on_client_message) is called for every client line that is
///   a message (request, notification, answer to a server request), one at a time, in the
///   order the client sent them; no later client line is read or forwarded until it returns.
///   It may await [`ClientContext::request`] (codex's lines keep flowing meanwhile).
/// - [`on_server_message`](Self::on_server_message) is called for every codex line that is a
///   message and is not an answer to one of the proxy's own requests, one at a time, in
///   codex's order, before the line is queued for the client; no later codex line is read
///   until it returns. It has no way to make requests to codex (the reader that would deliver
///   the answer is the one waiting); it may await other work (a store write), which holds
///   codex's output back meanwhile.
/// - The two run concurrently with each other (from one task, interleaved at await points).
/// - Lines that are not messages ([`LineKind::Other`]), client lines the forwarder refuses
///   (not UTF-8, a duplicate member) and lines over the length limit never reach the hooks.
/// - A returned error stops the proxy.
pub trait SessionHooks: Send + Sync {
    /// Called once before any line is read from either side.
    fn on_start(&self, _ctx: &ClientContext) -> impl Future<Output = Result<(), HookError>> + Send {
        async { Ok(()) }
    }

    /// A message from the client. By default it is forwarded.
    fn on_client_message(
        &self,
        _line: &Line,
        _ctx: &ClientContext,
    ) -> impl Future<Output = Result<ClientAction, HookError>> + Send {
        async { Ok(ClientAction::Forward) }
    }

    /// A message from codex for the client. By default it is forwarded.
    fn on_server_message(
        &self,
        _line: &Line,
        _ctx: &ServerContext,
    ) -> impl Future<Output = Result<ServerAction, HookError>> + Send {
        async { Ok(ServerAction::Forward) }
    }

    /// Called once when forwarding has ended, whatever the reason (client gone, codex gone,
    /// a signal, a hook error), before codex is stopped. Not called if the proxy process is
    /// killed.
    fn on_shutdown(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Why one of the proxy's own requests got no result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// Codex answered with an error.
    #[error("{method} failed: {error}")]
    Rpc {
        /// The method.
        method: String,
        /// Codex's error, whole (classify it with `rethread_protocol::classify_resume_error`).
        error: RpcError,
    },
    /// No answer within the request timeout.
    #[error("{method} got no answer within {after:?}")]
    Timeout {
        /// The method.
        method: String,
        /// The timeout.
        after: Duration,
    },
    /// Codex's input or output is closed; no answer can come.
    #[error("{method}: codex app-server connection closed")]
    Closed {
        /// The method.
        method: String,
    },
    /// The answer is not a result of the expected shape.
    #[error("{method} returned an unexpected answer: {reason}")]
    Decode {
        /// The method.
        method: String,
        /// Why.
        reason: String,
    },
}

/// State shared by the forwarder and the contexts.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) to_codex: Queue,
    pub(crate) to_client: Queue,
    pending: Mutex<Pending>,
    next_id: AtomicU64,
    request_timeout: Duration,
    pub(crate) reporter: Reporter,
    /// Set once codex's output ended.
    codex_gone: watch::Sender<bool>,
}

#[derive(Debug, Default)]
struct Pending {
    waiters: HashMap<u64, oneshot::Sender<Line>>,
    /// Codex's output ended: no answer will come.
    closed: bool,
}

impl Link {
    pub(crate) fn new(
        to_codex: Queue,
        to_client: Queue,
        request_timeout: Duration,
        reporter: Reporter,
    ) -> Arc<Link> {
        Arc::new(Link {
            to_codex,
            to_client,
            pending: Mutex::new(Pending::default()),
            next_id: AtomicU64::new(1),
            request_timeout,
            reporter,
            codex_gone: watch::Sender::new(false),
        })
    }

    /// Resolves once codex's output has ended ([`Link::close`]).
    pub(crate) async fn codex_gone(&self) {
        let mut gone = self.codex_gone.subscribe();
        let _ = gone.wait_for(|gone| *gone).await;
    }

    /// Queues a hook's line for codex; fails once codex's input is gone.
    async fn send_to_codex(&self, line: Line) -> Result<(), ProxyError> {
        self.to_codex
            .send(line.into_bytes())
            .await
            .map_err(|_| ProxyError::CodexClosed)
    }

    /// Queues a hook's line for the client; fails once the client's output is gone.
    pub(crate) async fn send_to_client(&self, line: Line) -> Result<(), ProxyError> {
        self.to_client
            .send(line.into_bytes())
            .await
            .map_err(|_| ProxyError::ClientClosed)
    }

    /// Resolves once every line queued for the client so far is written and flushed.
    pub(crate) async fn client_flushed(&self) -> Result<oneshot::Receiver<()>, ProxyError> {
        self.to_client
            .flushed()
            .await
            .map_err(|_| ProxyError::ClientClosed)
    }

    fn pending(&self) -> MutexGuard<'_, Pending> {
        // Only plain inserts and removes happen under the lock.
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Hands an answer in the proxy's id space to its waiter. Returns the line back when no
    /// request waits for it (answered after its timeout, or never asked).
    pub(crate) fn deliver(&self, id: &str, line: Line) -> Result<(), Line> {
        let number = id
            .strip_prefix(PROXY_ID_PREFIX)
            .and_then(|n| n.parse::<u64>().ok());
        let waiter = number.and_then(|n| self.pending().waiters.remove(&n));
        match waiter {
            Some(waiter) => waiter.send(line),
            None => Err(line),
        }
    }

    /// Codex's output ended: every waiting request fails with `Closed`, and so will new ones.
    pub(crate) fn close(&self) {
        {
            let mut pending = self.pending();
            pending.closed = true;
            pending.waiters.clear();
        }
        self.codex_gone.send_replace(true);
    }
}

/// Sends the proxy's own requests to codex and waits for their answers. Cheap to clone; may
/// be moved into a task of the hook's own.
///
/// Ids are `"rethread-proxy:<n>"` ([`PROXY_ID_PREFIX`]); the answers are taken off codex's
/// output before the hooks see it and never reach the client. Everything codex wrote before
/// an answer has been queued for the client (and passed through
/// [`SessionHooks::on_server_message`]) by the time the request returns.
#[derive(Debug, Clone)]
pub struct CodexRequester {
    link: Arc<Link>,
}

struct PendingGuard<'a> {
    link: &'a Link,
    number: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        // A request abandoned (timeout, cancelled future) leaves no waiter behind.
        self.link.pending().waiters.remove(&self.number);
    }
}

impl CodexRequester {
    /// Sends `method` with `params` to codex and returns the answer's `result`.
    pub async fn request(
        &self,
        method: &str,
        params: Option<Value>,
    ) -> Result<Value, RequestError> {
        let number = self.link.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = self.link.pending();
            if pending.closed {
                return Err(RequestError::Closed {
                    method: method.to_string(),
                });
            }
            pending.waiters.insert(number, tx);
        }
        let _guard = PendingGuard {
            link: &self.link,
            number,
        };
        let line = Line::from_message(&Message::Request(RawRequest {
            id: RequestId::String(format!("{PROXY_ID_PREFIX}{number}")),
            method: method.to_string(),
            params,
        }));
        let closed = || RequestError::Closed {
            method: method.to_string(),
        };
        let answer = tokio::time::timeout(self.link.request_timeout, async {
            self.link
                .to_codex
                .send(line.into_bytes())
                .await
                .map_err(|_| closed())?;
            rx.await.map_err(|_| closed())
        })
        .await
        .map_err(|_| RequestError::Timeout {
            method: method.to_string(),
            after: self.link.request_timeout,
        })??;
        let decode = |reason: String| RequestError::Decode {
            method: method.to_string(),
            reason,
        };
        match answer.message().map_err(|e| decode(e.to_string()))? {
            Message::Response(response) => Ok(response.result),
            Message::Error(error) => Err(RequestError::Rpc {
                method: method.to_string(),
                error: error.error,
            }),
            other => Err(decode(format!("not an answer: {}", other.to_line()))),
        }
    }

    /// [`request`](Self::request) with the protocol crate's typed params and result.
    pub async fn call<R: Request>(&self, params: &R::Params) -> Result<R::Result, RequestError> {
        let decode = |reason: String| RequestError::Decode {
            method: R::METHOD.to_string(),
            reason,
        };
        let params = serde_json::to_value(params).map_err(|e| decode(e.to_string()))?;
        let result = self.request(R::METHOD, Some(params)).await?;
        serde_json::from_value(result).map_err(|e| decode(e.to_string()))
    }
}

/// What [`SessionHooks::on_client_message`] (and `on_start`) may do besides returning an
/// action.
#[derive(Debug, Clone)]
pub struct ClientContext {
    link: Arc<Link>,
}

impl ClientContext {
    pub(crate) fn new(link: Arc<Link>) -> Self {
        ClientContext { link }
    }

    /// The link the context speaks through (what the session's sayings need of either).
    pub(crate) fn link(&self) -> &Link {
        &self.link
    }

    /// Queues a line for codex (after every client line forwarded before it).
    pub async fn send_to_codex(&self, line: Line) -> Result<(), ProxyError> {
        self.link.send_to_codex(line).await
    }

    /// Queues a line for the client. It reaches the client after every codex line queued
    /// before this call, and before any queued after it.
    pub async fn send_to_client(&self, line: Line) -> Result<(), ProxyError> {
        self.link.send_to_client(line).await
    }

    /// A receiver that resolves once every line queued for the client before this call is
    /// written to it and flushed (how a hook learns a notice was delivered).
    pub async fn client_flushed(&self) -> Result<oneshot::Receiver<()>, ProxyError> {
        self.link.client_flushed().await
    }

    /// A request of the proxy's own to codex (see [`CodexRequester`]).
    pub async fn request(
        &self,
        method: &str,
        params: Option<Value>,
    ) -> Result<Value, RequestError> {
        self.requester().request(method, params).await
    }

    /// A handle for the proxy's own requests that outlives this call.
    pub fn requester(&self) -> CodexRequester {
        CodexRequester {
            link: self.link.clone(),
        }
    }

    /// Says something on the proxy's stderr (through the configured reporter).
    pub fn report(&self, message: &str) {
        self.link.reporter.report(message);
    }
}

/// What [`SessionHooks::on_server_message`] may do besides returning an action. No requests:
/// see the trait's contract.
#[derive(Debug, Clone)]
pub struct ServerContext {
    link: Arc<Link>,
}

impl ServerContext {
    pub(crate) fn new(link: Arc<Link>) -> Self {
        ServerContext { link }
    }

    /// The link the context speaks through (what the session's sayings need of either).
    pub(crate) fn link(&self) -> &Link {
        &self.link
    }

    /// Queues a line for the client, in order with the codex lines forwarded around it: before
    /// the line being handled if that one is then forwarded, after everything before it.
    pub async fn send_to_client(&self, line: Line) -> Result<(), ProxyError> {
        self.link.send_to_client(line).await
    }

    /// A receiver that resolves once every line queued for the client before this call is
    /// written to it and flushed (how a hook learns a notice was delivered).
    pub async fn client_flushed(&self) -> Result<oneshot::Receiver<()>, ProxyError> {
        self.link.client_flushed().await
    }

    /// Queues a line for codex (an answer to a server request the hook handles itself).
    pub async fn send_to_codex(&self, line: Line) -> Result<(), ProxyError> {
        self.link.send_to_codex(line).await
    }

    /// Says something on the proxy's stderr (through the configured reporter).
    pub fn report(&self, message: &str) {
        self.link.reporter.report(message);
    }
}

/// True when `line` is an answer in the proxy's own id space.
pub(crate) fn proxy_answer_id(line: &Line) -> Option<&str> {
    if !line.kind().is_answer() {
        return None;
    }
    match line.id() {
        Some(RequestId::String(id)) if id.starts_with(PROXY_ID_PREFIX) => Some(id),
        _ => None,
    }
}

/// True when `line` is a client request whose id lies in the proxy's id space.
pub(crate) fn uses_reserved_id(line: &Line) -> bool {
    line.kind() == LineKind::Request && line.id().is_some_and(is_proxy_id)
}
