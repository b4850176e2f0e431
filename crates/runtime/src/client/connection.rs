//! The connection's shared state and the tasks that own the server's streams: the reader
//! (responses to their waiters, notifications to their thread's subscribers, server requests to
//! the handler), the writer, and the stderr tail.

use rethread_store::Unpoisoned;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::{SinkExt, StreamExt};
use rethread_protocol::jsonrpc::{Notification, Request as RawRequest, Response};
use rethread_protocol::messages::{ServerNotification, ServerRequest};
use rethread_protocol::{ErrorCode, Message, NdjsonCodec, RequestId, RpcError};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::{mpsc, Semaphore};
use tokio_util::codec::{FramedRead, FramedWrite};

use super::{AnsweredRequest, ClientError, ServerRequestHandler, ThreadEvent, Waiters};
use crate::rail::{StatusEvent, StatusKind, StatusRail};
use crate::telemetry;

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

/// What the client and its I/O tasks share.
pub(super) struct Shared {
    pub(super) pending: Waiters<RequestId, Result<Value, RpcError>>,
    /// The subscribers of each thread, copied on write: the reader delivers from a snapshot
    /// without holding the lock across an await.
    routes: Mutex<HashMap<String, Arc<Vec<Route>>>>,
    pub(super) closed: Mutex<Option<String>>,
    /// A bounded tail of the server's stderr, and its bound.
    stderr: Mutex<(VecDeque<u8>, usize)>,
}

impl Shared {
    pub(super) fn new(stderr_capacity: usize, max_pending: usize) -> Self {
        Shared {
            pending: Waiters::new(max_pending),
            routes: Mutex::default(),
            closed: Mutex::default(),
            stderr: Mutex::new((VecDeque::new(), stderr_capacity)),
        }
    }

    pub(super) fn closed_error(&self) -> Option<ClientError> {
        let reason = self.closed.lock().unpoisoned().clone()?;
        Some(ClientError::Closed {
            reason,
            stderr: self.stderr_tail(),
        })
    }

    pub(super) fn stderr_tail(&self) -> String {
        let tail: Vec<u8> = self.stderr.lock().unpoisoned().0.iter().copied().collect();
        String::from_utf8_lossy(&tail).into_owned()
    }

    /// Adds a subscriber to `thread_id`, unless the connection is closed.
    pub(super) fn add_route(&self, thread_id: &str, route: Route) -> Result<(), ClientError> {
        let mut routes = self.routes.lock().unpoisoned();
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
        let mut routes = self.routes.lock().unpoisoned();
        if let Some(entry) = routes.get_mut(thread_id) {
            Arc::make_mut(entry).retain(|route| route.id != id);
            if entry.is_empty() {
                routes.remove(thread_id);
            }
        }
    }

    /// Hands `event` to every subscriber of `thread_id`: a lossless one is waited for (the
    /// reader slows down to it), one that is cut off when full never is.
    async fn deliver(&self, thread_id: &str, event: ThreadEvent) {
        let Some(routes) = self.routes.lock().unpoisoned().get(thread_id).cloned() else {
            return;
        };
        for route in routes.iter() {
            let delivered = match route.delivery {
                Delivery::Lossless => route.tx.send(event.clone()).await.is_ok(),
                Delivery::CutOffWhenFull => match route.tx.try_send(event.clone()) {
                    Ok(()) => true,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        route.lagged.store(true, Ordering::Release);
                        metrics::counter!(telemetry::SUBSCRIBERS_CUT_OFF_TOTAL).increment(1);
                        let buffer = route.tx.max_capacity();
                        tracing::debug!(
                            thread_id,
                            buffer,
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
        self.closed.lock().unpoisoned().get_or_insert(reason);
        self.pending.close();
        self.routes.lock().unpoisoned().clear();
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
                    let message = format!("Ignored a malformed line from codex: {bad}");
                    self.rail.emit(
                        StatusEvent::new(StatusKind::Warn, message).with("error", bad.to_string()),
                    );
                    if bad_lines > self.max_bad_lines {
                        break format!("the server sent {bad_lines} malformed lines (last: {bad})");
                    }
                }
                Some(Ok(Ok(message))) => self.dispatch(message).await,
            }
        };
        self.shared.close(reason);
    }

    fn warn(&self, message: String) {
        self.rail.emit(StatusEvent::new(StatusKind::Warn, message));
    }

    async fn dispatch(&self, message: Message) {
        match message {
            Message::Response(Response { id, result }) => self.complete(id, Ok(result)),
            Message::Error(error) => match error.id {
                Some(id) => self.complete(id, Err(error.error)),
                None => self.warn(format!(
                    "codex reported an error for no request: {}",
                    error.error
                )),
            },
            Message::Notification(raw) => self.route(raw).await,
            Message::Request(raw) => self.answer(raw).await,
        }
    }

    fn complete(&self, id: RequestId, result: Result<Value, RpcError>) {
        // A waiter that timed out meanwhile is gone: its answer is unknown then.
        if !self.shared.pending.deliver(&id, result) {
            self.rail.emit(
                StatusEvent::new(
                    StatusKind::Warn,
                    format!("Ignored a response to unknown request id {id}"),
                )
                .with("id", serde_json::to_value(&id).unwrap_or(Value::Null)),
            );
        }
    }

    async fn route(&self, raw: Notification) {
        let notification = match ServerNotification::from_raw(&raw) {
            Ok(notification) => notification,
            Err(error) => {
                return self.warn(format!(
                    "Ignored a malformed `{}` notification: {error}",
                    raw.method
                ))
            }
        };
        match &notification {
            ServerNotification::DeprecationNotice(n) => self.warn(format!("codex: {}", n.summary)),
            ServerNotification::Warning(n) if n.thread_id.is_none() => {
                self.warn(format!("codex: {}", n.message))
            }
            _ => {}
        }
        if let Some(thread_id) = notification.thread_id().map(str::to_string) {
            let event = ThreadEvent::Notification(notification);
            self.shared.deliver(&thread_id, event).await;
        }
    }

    async fn answer(&self, raw: RawRequest) {
        let Ok(permit) = self.answering.clone().acquire_owned().await else {
            return;
        };
        let (handler, rail) = (self.handler.clone(), self.rail.clone());
        let (outgoing, shared) = (self.outgoing.clone(), self.shared.clone());
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
                        let event = ThreadEvent::ServerRequest(answered);
                        shared.deliver(&thread_id, event).await;
                    }
                    answer
                }
                Err(error) => Err(RpcError::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("invalid params: {error}"),
                )),
            };
            let reply = match result {
                Ok(result) => Message::Response(Response { id: raw.id, result }),
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
            return shared.close(format!("writing to the server failed: {error}"));
        }
    }
}

pub(super) async fn read_stderr<E: AsyncRead + Unpin>(mut stderr: E, shared: Arc<Shared>) {
    let mut chunk = [0u8; 4096];
    while let Ok(n @ 1..) = stderr.read(&mut chunk).await {
        let (tail, capacity) = &mut *shared.stderr.lock().unpoisoned();
        tail.extend(&chunk[..n]);
        let excess = tail.len().saturating_sub(*capacity);
        tail.drain(..excess);
    }
}
