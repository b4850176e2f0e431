//! The codex app-server client: spawn or connect, handshake, correlate requests, route
//! notifications per thread, answer server requests.
//!
//! Architecture: one reader task owns the server's stdout and one writer task its stdin.
//! Requests wait on a oneshot keyed by id; notifications go to every subscriber of their
//! thread, and so does each server request once the [`ServerRequestHandler`] answered it. Every
//! subscription is a bounded channel. The runtime's own turn driver is waited for (a slow
//! consumer slows the reader instead of growing memory); any other subscriber
//! ([`AppServerClient::subscribe`]) is never waited for: one that falls a whole buffer behind
//! is cut off ([`ClientError::Lagged`]). When the stream ends or turns to garbage, every
//! pending request and every subscriber fails with a typed [`ClientError::Closed`] that carries
//! the tail of the server's stderr.

use std::collections::HashMap;
use std::fmt;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rethread_protocol::codec::DEFAULT_MAX_LINE_LENGTH;
use rethread_protocol::jsonrpc::{Notification, Request as RawRequest};
use rethread_protocol::messages::{
    ClientInfo, Initialize, InitializeCapabilities, InitializeParams, Request, ServerNotification,
    ServerRequest, INITIALIZED,
};
use rethread_protocol::{ErrorCode, Message, NdjsonCodec, RequestId, RpcError};
use serde::Deserialize as _;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::process::Child;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_util::codec::FramedRead;

use crate::rail::{StatusEvent, StatusKind, StatusRail};

mod command;
mod connection;
mod error;

pub use command::CodexCommand;
pub use error::ClientError;

use connection::{lock, read_stderr, write_loop, Delivery, ReaderTask, Route, Shared, StderrTail};

/// How the client behaves. Every wait is bounded. Set with the builder methods
/// (`ClientOptions::default().request_timeout(..)`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientOptions {
    /// `clientInfo.name` sent in `initialize`.
    pub client_name: String,
    /// `clientInfo.version` sent in `initialize`.
    pub client_version: String,
    /// Declare the `experimentalApi` capability (needed for `excludeTurns` on 0.144.6).
    pub experimental_api: bool,
    /// How long one request may wait for its response.
    pub request_timeout: Duration,
    /// The longest line accepted from the server.
    pub max_line_length: usize,
    /// At most this many requests may be waiting for a response at once; also the most
    /// server requests answered at once (beyond that the reader waits for an answer to go
    /// out before it reads more).
    pub max_pending_requests: usize,
    /// Events buffered per subscription. The runtime's own turn driver makes the reader wait
    /// when its buffer is full; any other subscriber is cut off then
    /// ([`ClientError::Lagged`]).
    pub notification_buffer: usize,
    /// Bad lines (not JSON, not a message, too long) tolerated before the stream is treated
    /// as garbage and closed.
    pub max_bad_lines: usize,
    /// Bytes of the server's stderr kept for error reports.
    pub stderr_capacity: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            client_name: "rethread".to_string(),
            client_version: env!("CARGO_PKG_VERSION").to_string(),
            experimental_api: true,
            request_timeout: Duration::from_secs(60),
            max_line_length: DEFAULT_MAX_LINE_LENGTH,
            max_pending_requests: 1024,
            notification_buffer: 1024,
            max_bad_lines: 16,
            stderr_capacity: 16 * 1024,
        }
    }
}

setters!(ClientOptions {
    client_name: String,
    client_version: String,
    experimental_api: bool,
    request_timeout: Duration,
    max_line_length: usize,
    max_pending_requests: usize,
    notification_buffer: usize,
    max_bad_lines: usize,
    stderr_capacity: usize,
});

/// Answers the requests the server sends (approvals, tool calls, ...). A request left
/// unanswered makes its turn wait forever, so every request gets an answer.
#[async_trait]
pub trait ServerRequestHandler: Send + Sync + fmt::Debug {
    /// Returns the result, or an error that is sent back to the server.
    async fn handle(&self, request: ServerRequest, rail: &StatusRail) -> Result<Value, RpcError>;
}

/// The default handler: declines every approval (and says so on the rail), and answers any
/// other server request with a "not supported" error.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeclineAll;

#[async_trait]
impl ServerRequestHandler for DeclineAll {
    async fn handle(&self, request: ServerRequest, rail: &StatusRail) -> Result<Value, RpcError> {
        match request.decline_result() {
            Some(result) => {
                if let ServerRequest::Approval { method, params } = &request {
                    let mut event = StatusEvent::new(
                        StatusKind::Warn,
                        format!(
                            "Declined an approval request ({method}): rethread runs unattended."
                        ),
                    )
                    .with("method", method.clone());
                    if let Some(thread) = &params.thread_id {
                        event = event.with("thread_id", thread.clone());
                    }
                    rail.emit(event);
                }
                Ok(result)
            }
            None => {
                let method = match &request {
                    ServerRequest::Other { method, .. } => method.clone(),
                    _ => "unknown".to_string(),
                };
                Err(RpcError::new(
                    ErrorCode::METHOD_NOT_FOUND,
                    format!("rethread does not handle server request `{method}`"),
                ))
            }
        }
    }
}

/// What the server said about itself in `initialize`.
#[derive(Debug, Clone, Default)]
pub struct ServerInfo {
    /// The user agent string (carries the codex version).
    pub user_agent: Option<String>,
}

/// A connection to one `codex app-server`. Clones share the connection; the process (when
/// spawned) is killed when the last clone is dropped.
#[derive(Clone)]
pub struct AppServerClient {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    outgoing: mpsc::Sender<Message>,
    next_id: AtomicI64,
    next_subscription: AtomicU64,
    options: ClientOptions,
    rail: StatusRail,
    server: ServerInfo,
    child: Mutex<Option<Child>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        if let Some(child) = lock(&self.child).as_mut() {
            let _ = child.start_kill();
        }
    }
}

impl fmt::Debug for AppServerClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppServerClient")
            .field("server", &self.inner.server)
            .field("closed", &*lock(&self.inner.shared.closed))
            .finish_non_exhaustive()
    }
}

/// Builds a client: options, rail, server-request handler.
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    options: ClientOptions,
    rail: StatusRail,
    handler: Arc<dyn ServerRequestHandler>,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            options: ClientOptions::default(),
            rail: StatusRail::default(),
            handler: Arc::new(DeclineAll),
        }
    }
}

impl ClientBuilder {
    /// Sets the options.
    pub fn options(mut self, options: ClientOptions) -> Self {
        self.options = options;
        self
    }

    /// Sets the status rail.
    pub fn rail(mut self, rail: StatusRail) -> Self {
        self.rail = rail;
        self
    }

    /// Sets the server-request handler.
    pub fn handler(mut self, handler: impl ServerRequestHandler + 'static) -> Self {
        self.handler = Arc::new(handler);
        self
    }

    /// Spawns `<program> app-server` and performs the handshake.
    pub async fn spawn(self, command: &CodexCommand) -> Result<AppServerClient, ClientError> {
        let mut cmd = command.command("app-server");
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let program = command.program.display().to_string();
        let mut child = cmd.spawn().map_err(|source| ClientError::Spawn {
            program: program.clone(),
            source,
        })?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(ClientError::Spawn {
                program,
                source: std::io::Error::other("stdio was not piped"),
            });
        };
        self.start(stdout, stdin, Some(stderr), Some(child)).await
    }

    /// Connects over any reader/writer pair (an in-process fake, a socket, ...) and performs
    /// the handshake.
    pub async fn connect<R, W>(self, reader: R, writer: W) -> Result<AppServerClient, ClientError>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        self.start(reader, writer, None::<tokio::io::Empty>, None)
            .await
    }

    async fn start<R, W, E>(
        self,
        reader: R,
        writer: W,
        stderr: Option<E>,
        child: Option<Child>,
    ) -> Result<AppServerClient, ClientError>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
        E: AsyncRead + Unpin + Send + 'static,
    {
        let shared = Arc::new(Shared {
            pending: Mutex::new(HashMap::new()),
            routes: Mutex::new(HashMap::new()),
            closed: Mutex::new(None),
            stderr: Mutex::new(StderrTail {
                capacity: self.options.stderr_capacity,
                bytes: Default::default(),
            }),
        });
        let (outgoing, outgoing_rx) = mpsc::channel::<Message>(64);
        let mut tasks = Vec::new();
        if let Some(stderr) = stderr {
            tasks.push(tokio::spawn(read_stderr(stderr, shared.clone())));
        }
        tasks.push(tokio::spawn(write_loop(
            writer,
            outgoing_rx,
            shared.clone(),
        )));
        let reader_task = ReaderTask {
            shared: shared.clone(),
            outgoing: outgoing.clone(),
            rail: self.rail.clone(),
            handler: self.handler.clone(),
            max_bad_lines: self.options.max_bad_lines,
            answering: Arc::new(Semaphore::new(
                (self.options.max_pending_requests).clamp(1, Semaphore::MAX_PERMITS),
            )),
        };
        let codec = NdjsonCodec::with_max_line_length(self.options.max_line_length);
        tasks.push(tokio::spawn(
            reader_task.run(FramedRead::new(reader, codec)),
        ));

        let mut client = AppServerClient {
            inner: Arc::new(Inner {
                shared,
                outgoing,
                next_id: AtomicI64::new(1),
                next_subscription: AtomicU64::new(1),
                options: self.options,
                rail: self.rail,
                server: ServerInfo::default(),
                child: Mutex::new(child),
                tasks,
            }),
        };
        let params = InitializeParams {
            client_info: ClientInfo {
                name: client.inner.options.client_name.clone(),
                version: client.inner.options.client_version.clone(),
                title: None,
            },
            capabilities: Some(InitializeCapabilities {
                experimental_api: client.inner.options.experimental_api,
            }),
        };
        let response = client.request::<Initialize>(&params).await?;
        client.notify(INITIALIZED, None).await?;
        // No clone exists yet, so the server info can be filled in place.
        if let Some(inner) = Arc::get_mut(&mut client.inner) {
            inner.server.user_agent = response.user_agent;
        }
        Ok(client)
    }
}

impl AppServerClient {
    /// A builder with default options, the tracing rail and [`DeclineAll`].
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// Spawns `<program> app-server` with default settings.
    pub async fn spawn(command: &CodexCommand) -> Result<Self, ClientError> {
        Self::builder().spawn(command).await
    }

    /// What the server said about itself.
    pub fn server_info(&self) -> &ServerInfo {
        &self.inner.server
    }

    /// The options in force.
    pub fn options(&self) -> &ClientOptions {
        &self.inner.options
    }

    /// The status rail the client reports on.
    pub fn rail(&self) -> &StatusRail {
        &self.inner.rail
    }

    /// The tail of the server's stderr (spawned servers only).
    pub fn stderr_tail(&self) -> String {
        self.inner.shared.stderr_tail()
    }

    /// Whether the connection is closed, and why.
    pub fn closed_reason(&self) -> Option<String> {
        lock(&self.inner.shared.closed).clone()
    }

    /// Sends a typed request and waits (bounded) for its typed result.
    pub async fn request<R: Request>(&self, params: &R::Params) -> Result<R::Result, ClientError> {
        let params = serde_json::to_value(params).map_err(|source| ClientError::Decode {
            method: R::METHOD.to_string(),
            source,
        })?;
        let value = self.request_value(R::METHOD, Some(params)).await?;
        R::Result::deserialize(&value).map_err(|source| ClientError::Decode {
            method: R::METHOD.to_string(),
            source,
        })
    }

    /// Sends a request with raw params and waits (bounded) for its raw result.
    pub async fn request_value(
        &self,
        method: &str,
        params: Option<Value>,
    ) -> Result<Value, ClientError> {
        let shared = &self.inner.shared;
        let id = RequestId::Integer(self.inner.next_id.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = oneshot::channel();
        {
            // Checked under the pending lock so a concurrent close cannot strand this waiter.
            let mut pending = lock(&shared.pending);
            if let Some(error) = shared.closed_error() {
                return Err(error);
            }
            if pending.len() >= self.inner.options.max_pending_requests {
                return Err(ClientError::TooManyPending {
                    limit: self.inner.options.max_pending_requests,
                });
            }
            pending.insert(id.clone(), tx);
        }
        let message = Message::Request(RawRequest {
            id: id.clone(),
            method: method.to_string(),
            params,
        });
        // One deadline for queueing the request and for its answer: a server that stops
        // reading its input must not hang the caller either.
        let after = self.inner.options.request_timeout;
        let deadline = crate::deadline(tokio::time::Instant::now(), after);
        match tokio::time::timeout_at(deadline, self.inner.outgoing.send(message)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                lock(&shared.pending).remove(&id);
                return Err(self.closed_or("the writer stopped"));
            }
            Err(_elapsed) => {
                lock(&shared.pending).remove(&id);
                return Err(ClientError::Timeout {
                    method: method.to_string(),
                    after,
                });
            }
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(error))) => Err(ClientError::Rpc {
                method: method.to_string(),
                error,
            }),
            Ok(Err(_dropped)) => Err(self.closed_or("the connection closed")),
            Err(_elapsed) => {
                lock(&shared.pending).remove(&id);
                Err(ClientError::Timeout {
                    method: method.to_string(),
                    after,
                })
            }
        }
    }

    /// Sends a notification.
    pub async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), ClientError> {
        if let Some(error) = self.inner.shared.closed_error() {
            return Err(error);
        }
        let after = self.inner.options.request_timeout;
        let message = Message::Notification(Notification {
            method: method.to_string(),
            params,
        });
        match tokio::time::timeout(after, self.inner.outgoing.send(message)).await {
            Ok(sent) => sent.map_err(|_| self.closed_or("the writer stopped")),
            Err(_elapsed) => Err(ClientError::Timeout {
                method: method.to_string(),
                after,
            }),
        }
    }

    /// Subscribes to the events of one thread: its notifications, and the server requests
    /// about it with their answers. Subscribe **before** starting a turn so none of its events
    /// are missed. Dropping the subscription unsubscribes.
    ///
    /// Any number of subscriptions may watch one thread; none takes events from another (nor
    /// from the runtime's own turn driver). Each buffers up to
    /// [`ClientOptions::notification_buffer`] events and is never waited for: a subscriber
    /// that falls that far behind is cut off, reads what it buffered, then
    /// [`ClientError::Lagged`]. So a slow or forgotten subscriber never stalls a turn and never
    /// grows memory.
    pub fn subscribe(&self, thread_id: &str) -> Result<ThreadEvents, ClientError> {
        self.subscribe_with(thread_id, Delivery::CutOffWhenFull)
    }

    /// The runtime's own subscription for a turn it drives: the reader waits for it, so no
    /// event is lost. Its consumer must keep reading (or drop it).
    pub(crate) fn subscribe_lossless(&self, thread_id: &str) -> Result<ThreadEvents, ClientError> {
        self.subscribe_with(thread_id, Delivery::Lossless)
    }

    fn subscribe_with(
        &self,
        thread_id: &str,
        delivery: Delivery,
    ) -> Result<ThreadEvents, ClientError> {
        // A bound past what tokio can count is as good as none.
        let buffer = (self.inner.options.notification_buffer).clamp(1, Semaphore::MAX_PERMITS);
        let (tx, rx) = mpsc::channel(buffer);
        let id = self.inner.next_subscription.fetch_add(1, Ordering::Relaxed);
        let lagged = Arc::new(AtomicBool::new(false));
        self.inner.shared.add_route(
            thread_id,
            Route {
                id,
                tx,
                delivery,
                lagged: lagged.clone(),
            },
        )?;
        Ok(ThreadEvents {
            rx,
            client: self.clone(),
            thread_id: thread_id.to_string(),
            id,
            lagged,
            buffer,
        })
    }

    fn closed_or(&self, fallback: &str) -> ClientError {
        self.inner
            .shared
            .closed_error()
            .unwrap_or_else(|| ClientError::Closed {
                reason: fallback.to_string(),
                stderr: self.inner.shared.stderr_tail(),
            })
    }

    /// Kills the spawned process (if any) and waits for it to exit.
    pub async fn shutdown(&self) {
        let child = lock(&self.inner.child).take();
        if let Some(mut child) = child {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
        self.inner.shared.close("the client shut down".to_string());
    }
}

/// A server request about a thread, and how the [`ServerRequestHandler`] answered it.
#[derive(Debug, Clone, PartialEq)]
pub struct AnsweredRequest {
    /// The request's id.
    pub id: RequestId,
    /// The request (an approval, a tool call, ...).
    pub request: ServerRequest,
    /// The answer sent back: the result, or the error.
    pub answer: Result<Value, RpcError>,
}

/// One event of a thread, as a subscription sees it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ThreadEvent {
    /// A notification naming the thread.
    Notification(ServerNotification),
    /// A server request naming the thread, after the handler answered it (and before the
    /// answer was sent).
    ServerRequest(AnsweredRequest),
}

/// The events of one thread, in arrival order ([`AppServerClient::subscribe`]).
#[derive(Debug)]
pub struct ThreadEvents {
    rx: mpsc::Receiver<ThreadEvent>,
    client: AppServerClient,
    thread_id: String,
    id: u64,
    lagged: Arc<AtomicBool>,
    buffer: usize,
}

impl ThreadEvents {
    /// The next event; `Err(Lagged)` once the subscription was cut off for falling behind
    /// (after the events buffered before the cut), `Err(Closed)` once the connection is gone.
    pub async fn next(&mut self) -> Result<ThreadEvent, ClientError> {
        match self.rx.recv().await {
            Some(event) => Ok(event),
            None if self.lagged.load(Ordering::Acquire) => Err(ClientError::Lagged {
                thread_id: self.thread_id.clone(),
                buffer: self.buffer,
            }),
            None => Err(self.client.closed_or("the thread's subscription ended")),
        }
    }

    /// The thread subscribed to.
    pub fn thread_id(&self) -> &str {
        &self.thread_id
    }
}

impl Drop for ThreadEvents {
    fn drop(&mut self) {
        // At once, so that the reader stops handing events to a subscription nobody reads.
        self.client
            .inner
            .shared
            .remove_route(&self.thread_id, self.id);
    }
}
