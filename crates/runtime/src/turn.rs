//! One turn as it runs: its input ([`TurnInput`]), its events ([`TurnEvent`], through a
//! [`TurnStream`]), and the one loop behind [`CodexSession::run_turn`] and
//! [`CodexSession::run_turn_streamed`]. The loop reads the thread through the runtime's own
//! lossless subscription; other subscribers see the same events and cannot stall it.
//!
//! [`CodexSession::run_turn`]: crate::CodexSession::run_turn
//! [`CodexSession::run_turn_streamed`]: crate::CodexSession::run_turn_streamed

use std::fmt;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use rethread_protocol::messages::{
    ServerNotification, ThreadItem, ThreadTokenUsage, Turn, TurnInterrupt, TurnInterruptParams,
    TurnStart, TurnStartParams, TurnStatus, UserInput,
};
use rethread_store::BindingStore;
use serde_json::{Map, Value};
use tracing::Instrument;

use crate::binding::{status_event, Publication, StoreSide};
use crate::client::{AnsweredRequest, AppServerClient, ClientError, ThreadEvent, ThreadEvents};
use crate::error::RuntimeError;
use crate::lease::SessionLease;
use crate::machine::SessionMachine;
use crate::machine::{LeaseLostTo, Say};
use crate::mirror::RolloutMirror;
use crate::options::BinderOptions;
use crate::projection::{project_turn_input, reply_of};
use crate::rail::{StatusEvent, StatusKind, StatusRail};
use crate::sink::Transcript;
use crate::telemetry;

/// What one turn produced.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnReport {
    /// The thread.
    pub thread_id: String,
    /// The turn.
    pub turn_id: String,
    /// The assistant's reply.
    pub reply: String,
    /// The projected transcript rows.
    pub rows: Vec<Value>,
    /// What happened to the binding.
    pub publication: Publication,
    /// Codex's last token count of the turn (`thread/tokenUsage/updated`): `total` for the
    /// thread so far, `last` for the turn's last model request. `None` when codex sent none.
    pub token_usage: Option<ThreadTokenUsage>,
}

/// What the user sends in one turn: text, and images where codex accepts them.
///
/// ```
/// use rethread_runtime::TurnInput;
/// use serde_json::json;
/// let input = TurnInput::text("What is on this picture?")
///     .with_local_image("/tmp/photo.png")
///     .with_setting("effort", json!("high"));
/// assert_eq!(input.items().len(), 2);
/// assert_eq!(input.settings()["effort"], "high");
/// let plain: TurnInput = "hello".into();
/// assert_eq!(plain.text_content(), "hello");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnInput {
    items: Vec<UserInput>,
    settings: Map<String, Value>,
}

impl TurnInput {
    /// Input of these pieces, in order.
    pub fn new(items: Vec<UserInput>) -> Self {
        TurnInput {
            items,
            settings: Map::new(),
        }
    }

    /// Sets one of codex's other `turn/start` members for this turn (`"effort"`,
    /// `"outputSchema"`, `"sandboxPolicy"`, ...), passed through as given.
    pub fn with_setting(mut self, key: impl Into<String>, value: Value) -> Self {
        self.settings.insert(key.into(), value);
        self
    }

    /// The other `turn/start` members set for this turn.
    pub fn settings(&self) -> &Map<String, Value> {
        &self.settings
    }

    /// Plain text.
    pub fn text(text: impl Into<String>) -> Self {
        TurnInput::new(vec![UserInput::text(text)])
    }

    /// Adds an image file that codex reads itself (`localImage`; a relative path is codex's
    /// to resolve).
    pub fn with_local_image(mut self, path: impl AsRef<std::path::Path>) -> Self {
        self.items.push(UserInput::local_image(path));
        self
    }

    /// Adds an image by URL (`image`).
    pub fn with_image_url(mut self, url: impl Into<String>) -> Self {
        self.items.push(UserInput::image_url(url));
        self
    }

    /// The pieces, in order.
    pub fn items(&self) -> &[UserInput] {
        &self.items
    }

    /// The text pieces, joined by newlines.
    pub fn text_content(&self) -> String {
        crate::projection::input_text(&self.items)
    }
}

macro_rules! from_text {
    ($($t:ty),*) => {$(
        impl From<$t> for TurnInput {
            fn from(text: $t) -> Self {
                TurnInput::text(text)
            }
        }
    )*};
}

from_text!(&str, String, &String);

impl From<Vec<UserInput>> for TurnInput {
    fn from(items: Vec<UserInput>) -> Self {
        TurnInput::new(items)
    }
}

impl From<UserInput> for TurnInput {
    fn from(item: UserInput) -> Self {
        TurnInput::new(vec![item])
    }
}

/// One event of a running turn, in the order codex sent it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TurnEvent {
    /// A piece of an agent message, as the model writes it.
    AgentMessageDelta {
        /// The agent message item it belongs to.
        item_id: String,
        /// The text piece.
        delta: String,
    },
    /// An item started: an agent message, a command, a file change, reasoning, ...
    ItemStarted(ThreadItem),
    /// An item completed (an agent message carries its whole text).
    ItemCompleted(ThreadItem),
    /// A server request of this turn, as the client's
    /// [`ServerRequestHandler`](crate::ServerRequestHandler) answered it.
    ServerRequest(AnsweredRequest),
    /// Codex's token count after a model response.
    TokenUsage(ThreadTokenUsage),
    /// Any other notification of the thread during the turn, as codex sent it.
    Notification(ServerNotification),
    /// The turn completed and was committed: its report. The last event of a turn that
    /// succeeded.
    Completed(Box<TurnReport>),
}

/// The events of one running turn
/// ([`CodexSession::run_turn_streamed`](crate::CodexSession::run_turn_streamed)), ending with
/// [`TurnEvent::Completed`] or an error. [`TurnStream::next`] is the [`Stream`] without the
/// trait.
///
/// The turn advances as the stream is read: a host that stops reading holds up this turn
/// (and, once its buffer is full, the connection's other threads). Dropping the stream before
/// the end abandons the turn: `turn/interrupt` is sent in the background, and nothing is
/// committed unless the commit had already begun ([`TurnStream::is_committing`]; the store
/// then finishes it). To stop a turn without that doubt, use [`TurnStream::finish_unless`].
pub struct TurnStream<'a> {
    thread_id: String,
    turn_id: String,
    committing: Arc<AtomicBool>,
    inner: Pin<Box<dyn Stream<Item = Result<TurnEvent, RuntimeError>> + Send + 'a>>,
}

/// How [`TurnStream::finish_unless`] ended.
#[derive(Debug)]
pub enum TurnEnd<S> {
    /// The turn completed and was committed: its report.
    Completed(Box<TurnReport>),
    /// The stop came first, before the turn's commit began: the turn was abandoned (codex is
    /// asked to interrupt it) and nothing of it was committed. The stop's output.
    Stopped(S),
}

impl fmt::Debug for TurnStream<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TurnStream")
            .field("thread_id", &self.thread_id)
            .field("turn_id", &self.turn_id)
            .finish_non_exhaustive()
    }
}

impl TurnStream<'_> {
    /// The thread.
    pub fn thread_id(&self) -> &str {
        &self.thread_id
    }

    /// The turn codex started.
    pub fn turn_id(&self) -> &str {
        &self.turn_id
    }

    /// The next event; `None` after the last one.
    pub async fn next(&mut self) -> Option<Result<TurnEvent, RuntimeError>> {
        self.inner.next().await
    }

    /// Whether the turn's commit has begun: from then on dropping the stream does not undo
    /// it (the store finishes it).
    pub fn is_committing(&self) -> bool {
        self.committing.load(Ordering::SeqCst)
    }

    /// Reads the turn to its end like [`TurnStream::finish_with`], unless `stop` resolves
    /// first (a host's Ctrl-C, a shutdown): then a turn whose commit has not begun is
    /// abandoned, nothing of it committed, and [`TurnEnd::Stopped`] returned; a turn already
    /// committing is read to its end and reported as [`TurnEnd::Completed`]. So a turn reported
    /// as stopped is never in the store, and a host that retries it adds it once.
    pub async fn finish_unless<S: Future>(
        mut self,
        stop: S,
        mut each: impl FnMut(&TurnEvent),
    ) -> Result<TurnEnd<S::Output>, RuntimeError> {
        let mut stop = pin!(stop);
        let mut stopped = false;
        loop {
            let event = if stopped {
                self.next().await
            } else {
                tokio::select! {
                    event = self.next() => event,
                    output = stop.as_mut() => {
                        // A begun commit lives in the stream's state, not in the dropped
                        // `next()`: it goes on when the stream is read again.
                        if !self.is_committing() {
                            return Ok(TurnEnd::Stopped(output));
                        }
                        stopped = true;
                        continue;
                    }
                }
            };
            match event {
                Some(Ok(TurnEvent::Completed(report))) => return Ok(TurnEnd::Completed(report)),
                Some(Ok(event)) => each(&event),
                Some(Err(error)) => return Err(error),
                None => {
                    return Err(RuntimeError::TurnFailed {
                        thread_id: self.thread_id.clone(),
                        turn_id: self.turn_id.clone(),
                        status: "ended".to_string(),
                        message: "the turn's events ended before it completed".to_string(),
                    })
                }
            }
        }
    }

    /// Reads the turn to its end and returns its report (what
    /// [`CodexSession::run_turn`](crate::CodexSession::run_turn) does).
    pub async fn finish(self) -> Result<TurnReport, RuntimeError> {
        self.finish_with(|_| {}).await
    }

    /// Reads the turn to its end, handing every event before the last to `each`, and returns
    /// its report.
    pub async fn finish_with(
        self,
        each: impl FnMut(&TurnEvent),
    ) -> Result<TurnReport, RuntimeError> {
        let never = std::future::pending::<std::convert::Infallible>();
        match self.finish_unless(never, each).await? {
            TurnEnd::Completed(report) => Ok(*report),
            TurnEnd::Stopped(never) => match never {},
        }
    }
}

impl Stream for TurnStream<'_> {
    type Item = Result<TurnEvent, RuntimeError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

/// What a binder shares with the codex sessions it opens.
#[derive(Debug, Clone)]
pub(crate) struct Parts {
    pub(crate) session_id: String,
    pub(crate) store: BindingStore,
    pub(crate) rail: StatusRail,
    pub(crate) options: BinderOptions,
    pub(crate) transcript: Transcript,
    /// The rollout mirror (what this process knows of the thread's files), when on.
    pub(crate) mirror: Option<RolloutMirror>,
}

impl Parts {
    pub(crate) fn side<'a>(&'a self, lease: Option<&'a SessionLease>) -> StoreSide<'a> {
        StoreSide {
            store: &self.store,
            session_id: &self.session_id,
            lease,
            transcript: &self.transcript,
            mirror: self.mirror.as_ref(),
            codex_home: self.options.codex_home.as_deref(),
        }
    }
}

/// A codex session's parts a turn needs (its machine apart).
#[derive(Debug)]
pub(crate) struct TurnContext {
    pub(crate) client: AppServerClient,
    pub(crate) parts: Parts,
    pub(crate) lease: Option<Arc<SessionLease>>,
}

/// Starts a turn on `thread_id`: subscribes (before `turn/start`, so nothing is missed), sends
/// `turn/start`, and returns the stream of its events.
pub(crate) async fn start_turn<'a>(
    session: &'a TurnContext,
    machine: &'a mut SessionMachine,
    thread_id: &str,
    input: TurnInput,
) -> Result<TurnStream<'a>, RuntimeError> {
    // A turn that could never commit is not run: codex would spend a whole turn on it.
    if let Some(lost) = session.lease.as_deref().and_then(SessionLease::lost) {
        return Err(lost);
    }
    let span = tracing::info_span!(
        telemetry::SPAN_TURN,
        session_id = %session.parts.session_id,
        thread_id = %thread_id,
        turn_id = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    let observe = Outcome {
        span: span.clone(),
        started_at: tokio::time::Instant::now(),
    };
    let started = async {
        let events = session.client.subscribe_lossless(thread_id)?;
        let mut params = TurnStartParams::new(thread_id.to_string(), input.items.clone());
        params.settings = input.settings.clone();
        let started = start_or_interrupt(&session.client, params).await?;
        Ok::<_, ClientError>((events, started.turn.id))
    }
    .instrument(span.clone())
    .await;
    let (events, turn_id) = started.inspect_err(|_| observe.record("error"))?;
    span.record("turn_id", turn_id.as_str());
    let committing = Arc::new(AtomicBool::new(false));
    let run = TurnRun {
        deadline: crate::deadline(observe.started_at, session.parts.options.turn_timeout),
        committing: Arc::clone(&committing),
        session,
        machine,
        events: Some(events),
        input,
        thread_id: thread_id.to_string(),
        turn_id: turn_id.clone(),
        items: Vec::new(),
        usage: None,
        done: false,
        observe,
    };
    let inner = futures::stream::unfold(run, |mut run| async move {
        let span = run.observe.span.clone();
        let event = run.next_event().instrument(span).await?;
        Some((event, run))
    });
    Ok(TurnStream {
        thread_id: thread_id.to_string(),
        turn_id,
        committing,
        inner: Box::pin(inner),
    })
}

/// Where a turn's outcome goes: its span, and the turn metrics.
struct Outcome {
    span: tracing::Span,
    started_at: tokio::time::Instant,
}

impl Outcome {
    fn record(&self, outcome: &'static str) {
        self.span.record("outcome", outcome);
        metrics::counter!(telemetry::TURNS_TOTAL, "outcome" => outcome).increment(1);
        metrics::histogram!(telemetry::TURN_SECONDS, "outcome" => outcome)
            .record(self.started_at.elapsed().as_secs_f64());
    }
}

/// The state of one running turn.
struct TurnRun<'a> {
    session: &'a TurnContext,
    machine: &'a mut SessionMachine,
    /// The runtime's own subscription; `None` once the turn ended (dropped at once, so the
    /// reader never waits for a subscription nobody reads).
    events: Option<ThreadEvents>,
    input: TurnInput,
    thread_id: String,
    turn_id: String,
    deadline: tokio::time::Instant,
    /// The turn's completed items, in order.
    items: Vec<ThreadItem>,
    usage: Option<ThreadTokenUsage>,
    done: bool,
    observe: Outcome,
    committing: Arc<AtomicBool>,
}

impl TurnRun<'_> {
    async fn next_event(&mut self) -> Option<Result<TurnEvent, RuntimeError>> {
        loop {
            if self.done {
                return None;
            }
            let events = self.events.as_mut()?;
            let next = match tokio::time::timeout_at(self.deadline, events.next()).await {
                Ok(Ok(next)) => next,
                Ok(Err(error)) => return Some(Err(self.end("error", error.into()))),
                Err(_elapsed) => return Some(Err(self.time_out().await)),
            };
            let turn = self.turn_id.as_str();
            let event = match next {
                ThreadEvent::Notification(notification) => match notification {
                    ServerNotification::AgentMessageDelta(n) if n.turn_id == turn => {
                        TurnEvent::AgentMessageDelta {
                            item_id: n.item_id,
                            delta: n.delta,
                        }
                    }
                    ServerNotification::ItemStarted(n) if n.turn_id == turn => {
                        TurnEvent::ItemStarted(n.item)
                    }
                    ServerNotification::ItemCompleted(n) if n.turn_id == turn => {
                        self.items.push(n.item.clone());
                        TurnEvent::ItemCompleted(n.item)
                    }
                    ServerNotification::TokenUsageUpdated(n) if n.turn_id == turn => {
                        self.usage = Some(n.token_usage);
                        TurnEvent::TokenUsage(n.token_usage)
                    }
                    ServerNotification::TurnCompleted(n) if n.turn.id == turn => {
                        self.events = None;
                        return Some(self.complete(n.turn).await);
                    }
                    // Another turn's (one interrupted earlier, say).
                    ServerNotification::AgentMessageDelta(_)
                    | ServerNotification::ItemStarted(_)
                    | ServerNotification::ItemCompleted(_)
                    | ServerNotification::TokenUsageUpdated(_)
                    | ServerNotification::TurnCompleted(_) => continue,
                    other => TurnEvent::Notification(other),
                },
                ThreadEvent::ServerRequest(answered) => {
                    if answered.request.turn_id().is_some_and(|t| t != turn) {
                        continue;
                    }
                    TurnEvent::ServerRequest(answered)
                }
            };
            return Some(Ok(event));
        }
    }

    /// Ends the turn with `error`, recording `outcome`.
    fn end(&mut self, outcome: &'static str, error: RuntimeError) -> RuntimeError {
        self.done = true;
        self.events = None;
        self.observe.record(outcome);
        error
    }

    fn failed(&self, status: impl Into<String>, message: String) -> RuntimeError {
        RuntimeError::TurnFailed {
            thread_id: self.thread_id.clone(),
            turn_id: self.turn_id.clone(),
            status: status.into(),
            message,
        }
    }

    async fn time_out(&mut self) -> RuntimeError {
        // Unsubscribe first: a turn still streaming would fill the subscription, stall the
        // reader, and the interrupt's answer could never be read.
        self.events = None;
        interrupt(&self.session.client, &self.thread_id, &self.turn_id).await;
        let timeout = self.session.parts.options.turn_timeout;
        let message = format!("no turn/completed within {timeout:?}");
        let error = self.failed("timeout", message);
        self.end("timeout", error)
    }

    /// The turn completed: check its status, project it, commit it and report it.
    async fn complete(&mut self, turn: Turn) -> Result<TurnEvent, RuntimeError> {
        if turn.status != TurnStatus::Completed {
            let status = serde_json::to_value(&turn.status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| "unknown".to_string());
            let outcome = match turn.status {
                TurnStatus::Interrupted => "interrupted",
                _ => "failed",
            };
            let message = turn.error.map(|e| e.message).unwrap_or_default();
            if turn.status == TurnStatus::Failed {
                self.tell_failed(&message).await;
            }
            let error = self.failed(status, message);
            return Err(self.end(outcome, error));
        }
        // The items streamed during the turn; a server that only reports them on completion
        // is served too.
        let items = if self.items.is_empty() {
            turn.items
        } else {
            std::mem::take(&mut self.items)
        };
        let rows = project_turn_input(&self.thread_id, &self.turn_id, self.input.items(), &items);
        self.committing.store(true, Ordering::SeqCst);
        let publication = match self.commit(&rows).await {
            Ok(publication) => publication,
            Err(error) => return Err(self.end("error", error)),
        };
        if publication != Publication::Published {
            let message = format!(
                "The binding to thread {} was not published ({publication:?}).",
                self.thread_id
            );
            let event = StatusEvent::new(StatusKind::Warn, message);
            let event = event.with("thread_id", self.thread_id.as_str());
            self.session.parts.rail.emit(event);
        }
        self.done = true;
        self.observe.record("completed");
        Ok(TurnEvent::Completed(Box::new(TurnReport {
            reply: reply_of(&rows),
            thread_id: self.thread_id.clone(),
            turn_id: self.turn_id.clone(),
            rows,
            publication,
            token_usage: self.usage,
        })))
    }

    /// Tells the machine the turn failed: another account's thread is given up now (the
    /// notice on the rail), and the session's next turn runs on its replacement
    /// ([`CodexSession::run_turn_streamed`](crate::CodexSession::run_turn_streamed)).
    async fn tell_failed(&mut self, message: &str) {
        let (session, parts) = (self.session, &self.session.parts);
        let side = parts.side(session.lease.as_deref());
        let machine = &mut &mut *self.machine;
        let rail = |say: Say| {
            parts.rail.emit(status_event(&parts.session_id, &say));
            // The rail's sinks take an event synchronously: it is delivered.
            true
        };
        if let Some(error) = side
            .turn_failed(machine, &self.thread_id, message, rail)
            .await
        {
            let message = format!(
                "rethread could not give up thread {} after its failed turn ({error}); the \
                 next turn resumes it again.",
                self.thread_id
            );
            let event = StatusEvent::new(StatusKind::Warn, message);
            parts
                .rail
                .emit(event.with("session_id", parts.session_id.as_str()));
        }
    }

    /// Commits the completed turn as the machine decides: with a lost lease nothing is
    /// written and the turn is an error.
    async fn commit(&mut self, rows: &[Value]) -> Result<Publication, RuntimeError> {
        let (session, parts) = (self.session, &self.session.parts);
        let side = parts.side(session.lease.as_deref());
        let machine = &mut &mut *self.machine;
        let (committed, said) = side
            .complete_turn(machine, &self.thread_id, rows.to_vec())
            .await;
        for say in said {
            parts.rail.emit(status_event(&parts.session_id, &say));
        }
        let committed = committed.map(|done| done.map(|c| c.publication));
        committed.unwrap_or_else(|| {
            Err(RuntimeError::LeaseLost {
                session_id: parts.session_id.clone(),
                to: LeaseLostTo::Unknown,
            })
        })
    }
}

/// Asks codex to stop a turn; bounded by the client's request timeout.
async fn interrupt(client: &AppServerClient, thread_id: &str, turn_id: &str) {
    let params = TurnInterruptParams {
        thread_id: thread_id.to_string(),
        turn_id: turn_id.to_string(),
    };
    let _ = client.request::<TurnInterrupt>(&params).await;
}

/// Sends `turn/start` from a task of its own: when the caller is dropped before codex
/// answered (a host's timeout), the task still gets the answer and interrupts the turn, which
/// codex would otherwise run unobserved, refusing the session's next `turn/start` meanwhile.
async fn start_or_interrupt(
    client: &AppServerClient,
    params: TurnStartParams,
) -> Result<rethread_protocol::messages::TurnStartResponse, ClientError> {
    let (answer_tx, answer_rx) = tokio::sync::oneshot::channel();
    let client = client.clone();
    tokio::spawn(async move {
        let answer = client.request::<TurnStart>(&params).await;
        if let Err(Ok(started)) = answer_tx.send(answer) {
            interrupt(&client, &params.thread_id, &started.turn.id).await;
        }
    });
    // The task ends without answering only when the runtime shuts down.
    answer_rx.await.unwrap_or_else(|_| {
        Err(ClientError::Closed {
            reason: "the runtime stopped before codex answered turn/start".to_string(),
            stderr: String::new(),
        })
    })
}

impl Drop for TurnRun<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Abandoned. Before the commit began nothing is committed; during it, the store may
        // still finish it (which is why `finish_unless` never abandons a committing turn).
        // Codex is asked to stop so that the thread is free.
        self.events = None;
        self.observe.record("abandoned");
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let client = self.session.client.clone();
            let (thread_id, turn_id) = (self.thread_id.clone(), self.turn_id.clone());
            drop(handle.spawn(async move { interrupt(&client, &thread_id, &turn_id).await }));
        }
    }
}
