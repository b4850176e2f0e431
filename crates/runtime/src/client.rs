//! The codex app-server client. One reader task owns the server's stdout and one writer task
//! its stdin; requests wait on a oneshot keyed by id; notifications, and server requests once
//! answered, go to every subscriber of their thread (`connection.rs`). When the stream ends or
//! turns to garbage, every waiter fails with [`ClientError::Closed`] and the stderr tail.

use rethread_store::Unpoisoned;
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
use tokio::sync::{mpsc, Semaphore};
use tokio_util::codec::FramedRead;

use crate::rail::{StatusEvent, StatusKind, StatusRail};

mod command;
mod connection;
mod error;
mod waiters;

pub use command::{stop_signal, CodexCommand};
pub use error::ClientError;
pub use waiters::{WaitRefused, Waiter, Waiters};

use connection::{read_stderr, write_loop, Delivery, ReaderTask, Route, Shared};

/// How the client behaves; every wait is bounded. Set with the builder methods
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
    /// The most requests waiting for a response at once, and the most server requests being
    /// answered at once (beyond that the reader waits).
    pub max_pending_requests: usize,
    /// Events buffered per subscription ([`AppServerClient::subscribe`]).
    pub notification_buffer: usize,
    /// Bad lines (not JSON, not a message, too long) tolerated before the connection closes.
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
        let Some(result) = request.decline_result() else {
            let message = format!(
                "rethread does not handle server request `{}`",
                request.method()
            );
            return Err(RpcError::new(ErrorCode::METHOD_NOT_FOUND, message));
        };
        if let ServerRequest::Approval { method, params } = &request {
            let message =
                format!("Declined an approval request ({method}): rethread runs unattended.");
            let mut event =
                StatusEvent::new(StatusKind::Warn, message).with("method", method.as_str());
            if let Some(thread) = &params.thread_id {
                event = event.with("thread_id", thread.as_str());
            }
            rail.emit(event);
        }
        Ok(result)
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
        if let Some(child) = self.child.lock().unpoisoned().as_mut() {
            let _ = child.start_kill();
        }
    }
}

impl fmt::Debug for AppServerClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppServerClient")
            .field("server", &self.inner.server)
            .field("closed", &*self.inner.shared.closed.lock().unpoisoned())
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

setters!(ClientBuilder {
    options: ClientOptions,
    rail: StatusRail,
});

impl ClientBuilder {
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
        let failed = |source| ClientError::Spawn {
            program: command.program.display().to_string(),
            source,
        };
        let mut child = cmd.spawn().map_err(failed)?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(failed(std::io::Error::other("stdio was not piped")));
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
        let shared = Arc::new(Shared::new(
            self.options.stderr_capacity,
            self.options.max_pending_requests,
        ));
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
            answering: Arc::new(Semaphore::new(bounded(self.options.max_pending_requests))),
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
        let options = &client.inner.options;
        let params = InitializeParams {
            client_info: ClientInfo {
                name: options.client_name.clone(),
                version: options.client_version.clone(),
                title: None,
            },
            capabilities: Some(InitializeCapabilities {
                experimental_api: options.experimental_api,
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
        self.inner.shared.closed.lock().unpoisoned().clone()
    }

    /// Sends a typed request and waits (bounded) for its typed result.
    pub async fn request<R: Request>(&self, params: &R::Params) -> Result<R::Result, ClientError> {
        let decode = |source| ClientError::Decode {
            method: R::METHOD.to_string(),
            source,
        };
        let params = serde_json::to_value(params).map_err(decode)?;
        let value = self.request_value(R::METHOD, Some(params)).await?;
        R::Result::deserialize(&value).map_err(decode)
    }

    /// Sends a request with raw params and waits (bounded) for its raw result.
    pub async fn request_value(
        &self,
        method: &str,
        params: Option<Value>,
    ) -> Result<Value, ClientError> {
        let (shared, options) = (&self.inner.shared, &self.inner.options);
        let id = RequestId::Integer(self.inner.next_id.fetch_add(1, Ordering::Relaxed));
        let mut waiter = shared
            .pending
            .wait(id.clone())
            .map_err(|refused| match refused {
                WaitRefused::Full { limit } => ClientError::TooManyPending { limit },
                _ => self.closed_or("the connection closed"),
            })?;
        let message = Message::Request(RawRequest {
            id: id.clone(),
            method: method.to_string(),
            params,
        });
        // One deadline for queueing the request and for its answer: a server that stops
        // reading its input must not hang the caller either.
        let after = options.request_timeout;
        let answer = async {
            let sent = self.inner.outgoing.send(message).await;
            sent.map_err(|_| self.closed_or("the writer stopped"))?;
            let answer = waiter.answer().await;
            answer.ok_or_else(|| self.closed_or("the connection closed"))
        };
        let deadline = crate::deadline(tokio::time::Instant::now(), after);
        let answer = tokio::time::timeout_at(deadline, answer)
            .await
            .unwrap_or_else(|_elapsed| {
                Err(ClientError::Timeout {
                    method: method.to_string(),
                    after,
                })
            });
        answer?.map_err(|error| ClientError::Rpc {
            method: method.to_string(),
            error,
        })
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
    /// [`ClientOptions::notification_buffer`] events and is never waited for: one that falls
    /// that far behind is cut off, reads what it buffered, then [`ClientError::Lagged`].
    pub fn subscribe(&self, thread_id: &str) -> Result<ThreadEvents, ClientError> {
        self.subscribe_with(thread_id, Delivery::CutOffWhenFull)
    }

    /// The runtime's own subscription for a turn it drives: the reader waits for it (no event
    /// is lost), so its consumer must keep reading or drop it.
    pub(crate) fn subscribe_lossless(&self, thread_id: &str) -> Result<ThreadEvents, ClientError> {
        self.subscribe_with(thread_id, Delivery::Lossless)
    }

    fn subscribe_with(
        &self,
        thread_id: &str,
        delivery: Delivery,
    ) -> Result<ThreadEvents, ClientError> {
        let buffer = bounded(self.inner.options.notification_buffer);
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
        let child = self.inner.child.lock().unpoisoned().take();
        if let Some(mut child) = child {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
        self.inner.shared.close("the client shut down".to_string());
    }
}

/// `limit` as a channel or semaphore size: at least 1, and past what tokio can count as good
/// as none.
fn bounded(limit: usize) -> usize {
    limit.clamp(1, Semaphore::MAX_PERMITS)
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
        self.client
            .inner
            .shared
            .remove_route(&self.thread_id, self.id);
    }
}
