//! The connection's shared state and the tasks that own the server's streams: the reader
//! (responses to their waiters, notifications to their thread's subscribers, server requests to
//! the handler), the writer, and the stderr tail.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::{SinkExt, StreamExt};
use rethread_protocol::jsonrpc::{Notification, Request as RawRequest, Response};
use rethread_protocol::messages::{ServerNotification, ServerRequest};
use rethread_protocol::{ErrorCode, FrameError, Message, NdjsonCodec, RequestId, RpcError};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_util::codec::{FramedRead, FramedWrite};

use super::{AnsweredRequest, ClientError, ServerRequestHandler, ThreadEvent};
use crate::rail::{StatusEvent, StatusKind, StatusRail};
use crate::telemetry;

pub(super) type Pending = HashMap<RequestId, oneshot::Sender<Result<Value, RpcError>>>;

/// How a subscription takes what the reader hands it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Delivery {
    /// The reader waits for room: nothing is lost, and a consumer that stops reading stalls
    /// the connection. Only the runtime's own turn driver, which always reads, uses it.
    Lossless,
    /// The reader never waits: a subscription whose buffer is full is cut off (it reads what
    /// it buffered, then [`ClientError::Lagged`]).
    CutOffWhenFull,
}

/// One subscriber of a thread.
#[derive(Debug, Clone)]
pub(super) struct Route {
    pub(super) id: u64,
    pub(super) tx: mpsc::Sender<ThreadEvent>,
    pub(super) delivery: Delivery,
    /// Set when the subscription was cut off for lagging; read by its receiver.
    pub(super) lagged: Arc<AtomicBool>,
}

/// The subscribers of each thread. Copied on write, so the reader delivers from a snapshot
/// without holding the lock across an await.
pub(super) type Routes = HashMap<String, Arc<Vec<Route>>>;

/// What the client and its I/O tasks share: the waiters, the routes, whether the connection
/// is closed, the stderr tail.
pub(super) struct Shared {
    pub(super) pending: Mutex<Pending>,
    pub(super) routes: Mutex<Routes>,
    pub(super) closed: Mutex<Option<String>>,
    pub(super) stderr: Mutex<StderrTail>,
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here is a map insert/remove; a panic cannot tear the data.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    pub(super) fn closed_error(&self) -> Option<ClientError> {
        lock(&self.closed)
            .as_ref()
            .map(|reason| ClientError::Closed {
                reason: reason.clone(),
                stderr: self.stderr_tail(),
            })
    }

    pub(super) fn stderr_tail(&self) -> String {
        lock(&self.stderr).text()
    }

    /// Adds a subscriber to `thread_id`, unless the connection is closed.
    pub(super) fn add_route(&self, thread_id: &str, route: Route) -> Result<(), ClientError> {
        let mut routes = lock(&self.routes);
        // Checked under the routes lock, which `close` takes too: a subscription made after
        // the close would never be woken.
        if let Some(error) = self.closed_error() {
            return Err(error);
        }
        let entry = routes.entry(thread_id.to_string()).or_default();
        Arc::make_mut(entry).push(route);
        Ok(())
    }

    /// Removes subscriber `id` of `thread_id` (a dropped subscription, or one cut off).
    pub(super) fn remove_route(&self, thread_id: &str, id: u64) {
        let mut routes = lock(&self.routes);
        if let Some(entry) = routes.get_mut(thread_id) {
            Arc::make_mut(entry).retain(|route| route.id != id);
            if entry.is_empty() {
                routes.remove(thread_id);
            }
        }
    }

    /// Hands `event` to every subscriber of `thread_id`: a lossless one is waited for, one
    /// that is cut off when full is never waited for.
    pub(super) async fn deliver(&self, thread_id: &str, event: ThreadEvent) {
        let Some(routes) = lock(&self.routes).get(thread_id).cloned() else {
            return;
        };
        for route in routes.iter() {
            let delivered = match route.delivery {
                // Awaiting here applies backpressure: the reader slows down to the consumer.
                Delivery::Lossless => route.tx.send(event.clone()).await.is_ok(),
                Delivery::CutOffWhenFull => match route.tx.try_send(event.clone()) {
                    Ok(()) => true,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        route.lagged.store(true, Ordering::Release);
                        metrics::counter!(telemetry::SUBSCRIBERS_CUT_OFF_TOTAL).increment(1);
                        tracing::debug!(
                            thread_id,
                            buffer = route.tx.max_capacity(),
                            "cut off a thread subscriber that fell behind"
                        );
                        false
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => false,
                },
            };
            if !delivered {
                self.remove_route(thread_id, route.id);
            }
        }
    }

    /// Marks the connection closed and fails everything waiting on it.
    pub(super) fn close(&self, reason: String) {
        {
            let mut closed = lock(&self.closed);
            if closed.is_some() {
                return;
            }
            *closed = Some(reason);
        }
        // Dropping the senders wakes every waiter with "closed".
        lock(&self.pending).clear();
        lock(&self.routes).clear();
    }
}

/// A bounded tail of the server's stderr.
#[derive(Debug)]
pub(super) struct StderrTail {
    pub(super) capacity: usize,
    pub(super) bytes: std::collections::VecDeque<u8>,
}

impl StderrTail {
    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend(chunk);
        let excess = self.bytes.len().saturating_sub(self.capacity);
        self.bytes.drain(..excess);
    }

    fn text(&self) -> String {
        let (a, b) = self.bytes.as_slices();
        let mut all = Vec::with_capacity(a.len() + b.len());
        all.extend_from_slice(a);
        all.extend_from_slice(b);
        String::from_utf8_lossy(&all).into_owned()
    }
}

/// The task that owns the server's output.
pub(super) struct ReaderTask {
    pub(super) shared: Arc<Shared>,
    pub(super) outgoing: mpsc::Sender<Message>,
    pub(super) rail: StatusRail,
    pub(super) handler: Arc<dyn ServerRequestHandler>,
    pub(super) max_bad_lines: usize,
    /// Server requests being answered at once; when all permits are taken the reader waits,
    /// so a flood of server requests cannot pile up tasks.
    pub(super) answering: Arc<Semaphore>,
}

impl ReaderTask {
    pub(super) async fn run<R: AsyncRead + Unpin>(self, mut frames: FramedRead<R, NdjsonCodec>) {
        let mut bad_lines = 0usize;
        let reason = loop {
            match frames.next().await {
                None => break "the server closed its output".to_string(),
                Some(Err(io)) => break format!("reading from the server failed: {io}"),
                Some(Ok(Err(bad))) => {
                    bad_lines += 1;
                    self.warn_bad_line(&bad);
                    if bad_lines > self.max_bad_lines {
                        break format!("the server sent {bad_lines} malformed lines (last: {bad})");
                    }
                }
                Some(Ok(Ok(message))) => self.dispatch(message).await,
            }
        };
        self.shared.close(reason);
    }

    fn warn_bad_line(&self, error: &FrameError) {
        self.rail.emit(
            StatusEvent::new(
                StatusKind::Warn,
                format!("Ignored a malformed line from codex: {error}"),
            )
            .with("error", error.to_string()),
        );
    }

    async fn dispatch(&self, message: Message) {
        match message {
            Message::Response(Response { id, result }) => self.complete(id, Ok(result)),
            Message::Error(error) => match error.id {
                Some(id) => self.complete(id, Err(error.error)),
                None => self.rail.emit(StatusEvent::new(
                    StatusKind::Warn,
                    format!("codex reported an error for no request: {}", error.error),
                )),
            },
            Message::Notification(raw) => self.route(raw).await,
            Message::Request(raw) => self.answer(raw).await,
        }
    }

    fn complete(&self, id: RequestId, result: Result<Value, RpcError>) {
        match lock(&self.shared.pending).remove(&id) {
            // The waiter may have timed out meanwhile; nothing else to do then.
            Some(waiter) => drop(waiter.send(result)),
            None => self.rail.emit(
                StatusEvent::new(
                    StatusKind::Warn,
                    format!("Ignored a response to unknown request id {id}"),
                )
                .with("id", serde_json::to_value(&id).unwrap_or(Value::Null)),
            ),
        }
    }

    async fn route(&self, raw: Notification) {
        let notification = match ServerNotification::from_raw(&raw) {
            Ok(notification) => notification,
            Err(error) => {
                self.rail.emit(StatusEvent::new(
                    StatusKind::Warn,
                    format!("Ignored a malformed `{}` notification: {error}", raw.method),
                ));
                return;
            }
        };
        match &notification {
            ServerNotification::DeprecationNotice(n) => {
                self.rail.emit(StatusEvent::new(
                    StatusKind::Warn,
                    format!("codex: {}", n.summary),
                ));
            }
            ServerNotification::Warning(n) if n.thread_id.is_none() => {
                self.rail.emit(StatusEvent::new(
                    StatusKind::Warn,
                    format!("codex: {}", n.message),
                ));
            }
            _ => {}
        }
        let Some(thread_id) = notification.thread_id().map(str::to_string) else {
            return;
        };
        self.shared
            .deliver(&thread_id, ThreadEvent::Notification(notification))
            .await;
    }

    async fn answer(&self, raw: RawRequest) {
        let Ok(permit) = self.answering.clone().acquire_owned().await else {
            return;
        };
        let handler = self.handler.clone();
        let rail = self.rail.clone();
        let outgoing = self.outgoing.clone();
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let result = match ServerRequest::from_raw(&raw) {
                Ok(request) => {
                    let answer = handler.handle(request.clone(), &rail).await;
                    // The thread's subscribers hear of the request and its answer before the
                    // answer goes out, so before anything codex does in response.
                    if let Some(thread_id) = request.thread_id().map(str::to_string) {
                        let answered = AnsweredRequest {
                            id: raw.id.clone(),
                            request,
                            answer: answer.clone(),
                        };
                        shared
                            .deliver(&thread_id, ThreadEvent::ServerRequest(answered))
                            .await;
                    }
                    answer
                }
                Err(error) => Err(RpcError::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("invalid params: {error}"),
                )),
            };
            let reply = match result {
                Ok(value) => Message::Response(Response {
                    id: raw.id,
                    result: value,
                }),
                Err(error) => Message::error(Some(raw.id), error),
            };
            let _ = outgoing.send(reply).await;
            drop(permit);
        });
    }
}

pub(super) async fn write_loop<W: AsyncWrite + Unpin>(
    writer: W,
    mut outgoing: mpsc::Receiver<Message>,
    shared: Arc<Shared>,
) {
    let mut frames = FramedWrite::new(writer, NdjsonCodec::new());
    while let Some(message) = outgoing.recv().await {
        if let Err(error) = frames.send(message).await {
            shared.close(format!("writing to the server failed: {error}"));
            return;
        }
    }
}

pub(super) async fn read_stderr<E: AsyncRead + Unpin>(mut stderr: E, shared: Arc<Shared>) {
    let mut chunk = [0u8; 4096];
    loop {
        match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => lock(&shared.stderr).push(&chunk[..n]),
        }
    }
}
