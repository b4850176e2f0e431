//! The seam where session logic joins the forwarder: [`SessionHooks`], the contexts it is
//! handed, and the proxy's own requests to codex ([`CodexRequester`]). The order guarantees
//! are stated once, in the crate docs.

use std::future::Future;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rethread_protocol::jsonrpc::Request as RawRequest;
use rethread_protocol::{Message, RequestId};
use rethread_runtime::{ClientError, Waiters};
use serde_json::Value;
use tokio::sync::{oneshot, watch};

use crate::line::{Line, LineKind};
use crate::queue::Queue;
use crate::{ProxyError, Reporter};

/// The prefix of every request id the proxy originates. Clients use integers or UUID strings;
/// a string with this prefix is neither (letters past `f`, a colon), and a client request
/// using it anyway is refused (see the crate docs).
pub const PROXY_ID_PREFIX: &str = "rethread-proxy:";

/// The error a hook returns to stop the proxy: codex is shut down and `rethread app-server`
/// exits non-zero with this as its cause. A hook that can carry on (answer the client with an
/// error, say) does that instead.
pub type HookError = Box<dyn std::error::Error + Send + Sync>;

/// What becomes of a client line once [`SessionHooks::on_client_message`] has seen it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAction {
    /// Pass the line to codex unchanged (the very bytes the client sent).
    Forward,
    /// The hook dealt with it (answered it, sent codex a rewritten line, or dropped it).
    Consumed,
}

/// What becomes of a codex line once [`SessionHooks::on_server_message`] has seen it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerAction {
    /// Pass the line to the client unchanged.
    Forward,
    /// The hook dealt with it (sent it itself, say, followed by a line of its own).
    Consumed,
}

/// Session logic plugged into the forwarder; every method has a pass-through default.
///
/// # Contract
/// When each method is called, what it may do and the order it is guaranteed are stated once,
/// in the crate docs ("The seam for session logic"); a returned error stops the proxy.
pub trait SessionHooks: Send + Sync {
    /// Called once before any line is read.
    fn on_start(&self, _ctx: &ClientContext) -> impl Future<Output = Result<(), HookError>> + Send {
        async { Ok(()) }
    }

    /// A message from the client (it may await [`ClientContext::request`]).
    fn on_client_message(
        &self,
        _line: &Line,
        _ctx: &ClientContext,
    ) -> impl Future<Output = Result<ClientAction, HookError>> + Send {
        async { Ok(ClientAction::Forward) }
    }

    /// A message from codex that is not an answer to the proxy, before it is queued for the
    /// client (awaiting here holds codex's output back).
    fn on_server_message(
        &self,
        _line: &Line,
        _ctx: &ServerContext,
    ) -> impl Future<Output = Result<ServerAction, HookError>> + Send {
        async { Ok(ServerAction::Forward) }
    }

    /// Called once when forwarding has ended, whatever the reason, before codex is stopped.
    fn on_shutdown(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// State shared by the forwarder and the contexts.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) to_codex: Queue,
    pub(crate) to_client: Queue,
    /// The waiting requests by number; closed once codex's output ended.
    pending: Waiters<u64, Line>,
    next_id: AtomicU64,
    request_timeout: Duration,
    pub(crate) reporter: Reporter,
    /// Set once codex's output ended.
    codex_gone: watch::Sender<bool>,
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
            pending: Waiters::new(usize::MAX),
            next_id: AtomicU64::new(1),
            request_timeout,
            reporter,
            codex_gone: watch::Sender::new(false),
        })
    }

    /// Resolves once codex's output has ended ([`Link::close`]).
    pub(crate) async fn codex_gone(&self) {
        let _ = self.codex_gone.subscribe().wait_for(|gone| *gone).await;
    }

    /// Hands an answer in the proxy's id space to its waiter. False when no request waits for
    /// it (answered after its timeout, or never asked).
    pub(crate) fn deliver(&self, id: &str, line: Line) -> bool {
        let number = id
            .strip_prefix(PROXY_ID_PREFIX)
            .and_then(|n| n.parse::<u64>().ok());
        number.is_some_and(|number| self.pending.deliver(&number, line))
    }

    /// [`Link::deliver`], reporting an answer nobody waits for.
    pub(crate) fn deliver_or_report(&self, id: &str, line: Line) {
        if !self.deliver(id, line) {
            self.reporter.report(&format!(
                "dropped codex's answer to {id:?}: the proxy no longer waits for it"
            ));
        }
    }

    /// Codex's output ended: every waiting request fails with `Closed`, and so will new ones.
    pub(crate) fn close(&self) {
        self.pending.close();
        self.codex_gone.send_replace(true);
    }
}

/// Sends the proxy's own requests to codex and waits for their answers; cheap to clone, and
/// may be moved into a task of the hook's own. Ids are `"rethread-proxy:<n>"`
/// ([`PROXY_ID_PREFIX`]); the answers never reach the hooks or the client.
#[derive(Debug, Clone)]
pub struct CodexRequester {
    link: Arc<Link>,
}

impl CodexRequester {
    /// Sends `method` with `params` to codex and returns the answer's `result`.
    pub async fn request(&self, method: &str, params: Option<Value>) -> Result<Value, ClientError> {
        let method_string = || method.to_string();
        let closed = |reason: &str| ClientError::Closed {
            reason: format!("{method}: {reason}"),
            stderr: String::new(),
        };
        let number = self.link.next_id.fetch_add(1, Ordering::Relaxed);
        let waiter = self.link.pending.wait(number);
        let mut waiter = waiter.map_err(|_| closed("codex's output ended"))?;
        let line = Line::from_message(&Message::Request(RawRequest {
            id: RequestId::String(format!("{PROXY_ID_PREFIX}{number}")),
            method: method_string(),
            params,
        }));
        let answer = tokio::time::timeout(self.link.request_timeout, async {
            let sent = self.link.to_codex.send(line.into_bytes()).await;
            sent.map_err(|_| closed("codex's input is closed"))?;
            let answer = waiter.answer().await;
            answer.ok_or_else(|| closed("codex's output ended"))
        })
        .await
        .map_err(|_| ClientError::Timeout {
            method: method_string(),
            after: self.link.request_timeout,
        })??;
        // Garbage where an answer belongs: the connection is of no more use, as the runtime's
        // client reads it.
        let garbage = |what: String| closed(&format!("codex sent {what} in place of an answer"));
        match answer.message().map_err(|e| garbage(e.to_string()))? {
            Message::Response(response) => Ok(response.result),
            Message::Error(error) => Err(ClientError::Rpc {
                method: method_string(),
                error: error.error,
            }),
            other => Err(garbage(other.to_line())),
        }
    }
}

/// What [`SessionHooks::on_server_message`] may do besides returning an action. No requests:
/// the reader that would deliver their answers is the one running the hook.
#[derive(Debug, Clone)]
pub struct ServerContext {
    link: Arc<Link>,
}

impl ServerContext {
    /// Queues a line for the client, in order with the codex lines forwarded around it (before
    /// the line being handled, when that one is then forwarded).
    pub async fn send_to_client(&self, line: Line) -> Result<(), ProxyError> {
        let sent = self.link.to_client.send(line.into_bytes()).await;
        sent.map_err(|_| ProxyError::ClientClosed)
    }

    /// Queues a line for codex, after every client line forwarded before it.
    pub async fn send_to_codex(&self, line: Line) -> Result<(), ProxyError> {
        let sent = self.link.to_codex.send(line.into_bytes()).await;
        sent.map_err(|_| ProxyError::CodexClosed)
    }

    /// A receiver that resolves once every line queued for the client before this call is
    /// written and flushed (how a hook learns a notice was delivered).
    pub async fn client_flushed(&self) -> Result<oneshot::Receiver<()>, ProxyError> {
        let flushed = self.link.to_client.flushed().await;
        flushed.map_err(|_| ProxyError::ClientClosed)
    }

    /// Says something on the proxy's stderr (through the configured reporter).
    pub fn report(&self, message: &str) {
        self.link.reporter.report(message);
    }
}

/// What [`SessionHooks::on_client_message`] (and `on_start`) may do besides returning an
/// action: everything a [`ServerContext`] may, and requests of the proxy's own.
#[derive(Debug, Clone)]
pub struct ClientContext {
    server: ServerContext,
}

impl ClientContext {
    pub(crate) fn new(link: Arc<Link>) -> (ClientContext, ServerContext) {
        let server = ServerContext { link };
        let client = ClientContext {
            server: server.clone(),
        };
        (client, server)
    }

    /// A request of the proxy's own to codex (see [`CodexRequester`]).
    pub async fn request(&self, method: &str, params: Option<Value>) -> Result<Value, ClientError> {
        self.requester().request(method, params).await
    }

    /// A handle for the proxy's own requests that outlives this call.
    pub fn requester(&self) -> CodexRequester {
        CodexRequester {
            link: self.server.link.clone(),
        }
    }
}

impl Deref for ClientContext {
    type Target = ServerContext;

    fn deref(&self) -> &ServerContext {
        &self.server
    }
}

/// The id of `line` when it is an answer in the proxy's own id space.
pub(crate) fn proxy_answer_id(line: &Line) -> Option<&str> {
    match line.id() {
        Some(RequestId::String(id)) if line.kind().is_answer() && is_proxy_id(id) => Some(id),
        _ => None,
    }
}

/// True when `line` is a client request whose id lies in the proxy's id space.
pub(crate) fn uses_reserved_id(line: &Line) -> bool {
    let reserved = matches!(line.id(), Some(RequestId::String(id)) if is_proxy_id(id));
    line.kind() == LineKind::Request && reserved
}

fn is_proxy_id(id: &str) -> bool {
    id.starts_with(PROXY_ID_PREFIX)
}
