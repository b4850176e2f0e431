//! The codex app-server client: spawn or connect, handshake, correlate requests, route
//! notifications per thread, answer server requests.
//!
//! Architecture: one reader task owns the server's stdout and one writer task its stdin.
//! Requests wait on a oneshot keyed by id; notifications go to the subscriber of their thread
//! (bounded channel: a slow consumer slows the reader instead of growing memory). When the
//! stream ends or turns to garbage, every pending request and every subscriber fails with a
//! typed [`ClientError::Closed`] that carries the tail of the server's stderr.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicI64, Ordering};
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
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_util::codec::FramedRead;

use crate::rail::{StatusEvent, StatusKind, StatusRail};

mod connection;

use connection::{lock, read_stderr, write_loop, ReaderTask, Shared, StderrTail};

/// How the client behaves. Every wait is bounded.
#[derive(Debug, Clone)]
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
    /// Notifications buffered per subscribed thread before the reader waits for the consumer.
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

/// Errors of the client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The codex binary could not be started.
    #[error("could not start `{program}`: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The server answered with an error.
    #[error("{method} failed: {error}")]
    Rpc {
        /// The method called.
        method: String,
        /// The server's error.
        error: RpcError,
    },
    /// No response in time.
    #[error("{method} got no response within {after:?}")]
    Timeout {
        /// The method called.
        method: String,
        /// The timeout.
        after: Duration,
    },
    /// The connection is gone: the process died, the stream ended or turned to garbage.
    #[error("codex app-server connection closed: {reason}{}", stderr_suffix(.stderr))]
    Closed {
        /// Why.
        reason: String,
        /// The tail of the server's stderr, if any.
        stderr: String,
    },
    /// Too many requests in flight.
    #[error("too many pending requests (limit {limit})")]
    TooManyPending {
        /// The limit.
        limit: usize,
    },
    /// A response did not decode as the method's result type.
    #[error("{method} returned an unexpected result: {source}")]
    Decode {
        /// The method called.
        method: String,
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.trim().is_empty() {
        String::new()
    } else {
        format!("; server stderr: {}", stderr.trim())
    }
}

impl ClientError {
    /// The server's error, when the server answered with one.
    pub fn rpc_error(&self) -> Option<&RpcError> {
        match self {
            ClientError::Rpc { error, .. } => Some(error),
            _ => None,
        }
    }
}

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

/// How to start codex: `<program> app-server`, inheriting the environment (so `CODEX_HOME`
/// reaches it) plus any overrides.
#[derive(Debug, Clone)]
pub struct CodexCommand {
    /// The codex binary.
    pub program: PathBuf,
    /// Extra arguments after `app-server`.
    pub args: Vec<String>,
    /// Environment overrides (e.g. `CODEX_HOME`).
    pub env: Vec<(String, String)>,
    /// Working directory of the process.
    pub cwd: Option<PathBuf>,
}

impl CodexCommand {
    /// `<program> app-server` with the inherited environment.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        CodexCommand {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
        }
    }

    /// Sets an environment variable for the process.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
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
        let mut cmd = Command::new(&command.program);
        cmd.arg("app-server")
            .args(&command.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (key, value) in &command.env {
            cmd.env(key, value);
        }
        if let Some(cwd) = &command.cwd {
            cmd.current_dir(cwd);
        }
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
            answering: Arc::new(Semaphore::new(self.options.max_pending_requests.max(1))),
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
        let deadline = tokio::time::Instant::now() + after;
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

    /// Subscribes to the notifications of one thread. Subscribe **before** starting a turn so
    /// none of its notifications are missed. Dropping the subscription unsubscribes.
    /// A second subscription to the same thread replaces the first.
    pub fn subscribe(&self, thread_id: &str) -> Result<ThreadEvents, ClientError> {
        let (tx, rx) = mpsc::channel(self.inner.options.notification_buffer);
        let mut routes = lock(&self.inner.shared.routes);
        if let Some(error) = self.inner.shared.closed_error() {
            return Err(error);
        }
        routes.insert(thread_id.to_string(), tx);
        Ok(ThreadEvents {
            rx,
            client: self.clone(),
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

/// The notifications of one thread, in arrival order.
#[derive(Debug)]
pub struct ThreadEvents {
    rx: mpsc::Receiver<ServerNotification>,
    client: AppServerClient,
}

impl ThreadEvents {
    /// The next notification; `Err(Closed)` once the connection is gone.
    pub async fn next(&mut self) -> Result<ServerNotification, ClientError> {
        match self.rx.recv().await {
            Some(notification) => Ok(notification),
            None => Err(self.client.closed_or("the thread's subscription ended")),
        }
    }
}
