//! [`BindingHooks`]: the session logic of `rethread app-server`, built from the runtime's
//! rules ([`rethread_runtime::binding`], [`SessionLease`], the projection) and plugged into
//! the forwarder through [`SessionHooks`]. What they do and what the client sees in each case
//! is tabled in the crate docs ("Sessions").

mod start;
mod turns;

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use rethread_protocol::messages::{ItemNotification, TurnNotification, TurnStatus};
use rethread_protocol::{Message, RequestId};
use rethread_runtime::binding::{
    announce_pending_fallback, commit_turn, give_up_thread, pending_fallback, seed_text,
    LostThread, ResumeAttempts, ResumeVerdict, TurnRows,
};
use rethread_runtime::{
    BinderOptions, Publication, RuntimeError, SessionLease, StatusEvent, StatusRail, Transcript,
    RESUME_FALLBACK_NOTICE,
};
use rethread_store::{BindingStore, LocalOwner};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::hooks::{
    ClientAction, ClientContext, HookError, RequestError, ServerAction, ServerContext,
};
use crate::line::{Line, LineKind};
use crate::{ProxyError, SessionHooks};

use start::{as_start_result, resume_params, seeded_start, start_params, start_refused};
pub use turns::TurnLimits;
use turns::{turn_rows, Forgot, Pending, Tracker};

/// The `warning` a client gets once when the proxy lost the session's lease (another process
/// took the session over after this one stalled past the lease's TTL): from then on nothing
/// this proxy sees is recorded.
pub const LEASE_LOST_WARNING: &str = "rethread lost this session to another process: turns on \
     this connection are no longer recorded.";

/// How [`BindingHooks`] behave.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// The runtime's options, as a [`SessionBinder`](rethread_runtime::SessionBinder) reads
    /// them: the resume policy (`exclude_turns`, `transient_retries`, `retry_backoff`),
    /// seeding, the lease (`lease_ttl`, `lease_wait`) and the `codex_home` recorded with each
    /// binding. `turn_timeout` and `thread_start` are not used: the client drives its turns
    /// and starts its threads itself.
    pub binder: BinderOptions,
    /// What the hooks keep in memory.
    pub limits: TurnLimits,
}

/// The session logic of `rethread app-server` for one session id (see the module docs).
///
/// ```no_run
/// # async fn demo(store: std::sync::Arc<dyn rethread_store::BindingStore>) -> Result<(), Box<dyn std::error::Error>> {
/// use rethread_proxy::{run_app_server, AppServerCommand, BindingHooks, ProxyOptions, SessionOptions};
///
/// // Takes the session's lease now: a session held elsewhere fails here, before codex starts.
/// let hooks = BindingHooks::open("chat-42", store, SessionOptions::default()).await?;
/// let command = AppServerCommand::new("codex");
/// let code = run_app_server(&command, &hooks, &ProxyOptions::default()).await?;
/// hooks.close().await?; // already done when forwarding ended; a no-op then
/// std::process::exit(code);
/// # }
/// ```
#[derive(Debug)]
pub struct BindingHooks {
    session_id: String,
    store: Arc<dyn BindingStore>,
    options: SessionOptions,
    lease: Option<SessionLease>,
    state: Mutex<State>,
    /// The context `on_start` was given: where `on_shutdown` reports.
    reporter: OnceLock<ClientContext>,
}

#[derive(Debug)]
struct State {
    /// The client's first `thread/start` is still to come (a failed resume leaves it so).
    first_start: bool,
    /// The lease was found lost (and said so).
    lease_lost: bool,
    tracker: Tracker,
}

impl BindingHooks {
    /// Takes `session_id`'s lease in `store` (unless `options.binder.lease_ttl` is `None`),
    /// waiting up to `options.binder.lease_wait` for a live holder to let it go.
    ///
    /// # Errors
    /// [`RuntimeError::SessionBusy`] naming the holder when the lease stays held; a store
    /// failure. A holder that died on this machine is taken over at once.
    pub async fn open(
        session_id: impl Into<String>,
        store: Arc<dyn BindingStore>,
        options: SessionOptions,
    ) -> Result<BindingHooks, RuntimeError> {
        let session_id = session_id.into();
        let lease = match options.binder.lease_ttl {
            Some(ttl) => Some(
                SessionLease::acquire(
                    store.clone(),
                    &session_id,
                    Arc::new(LocalOwner::new()),
                    ttl,
                    options.binder.lease_wait,
                )
                .await?,
            ),
            None => None,
        };
        let tracker = Tracker::new(options.limits.clone());
        Ok(BindingHooks {
            session_id,
            store,
            options,
            lease,
            state: Mutex::new(State {
                first_start: true,
                lease_lost: false,
                tracker,
            }),
            reporter: OnceLock::new(),
        })
    }

    /// The session id.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The session's lease, as last granted or renewed (`None` without one).
    pub fn lease(&self) -> Option<rethread_store::Lease> {
        self.lease.as_ref().map(SessionLease::lease)
    }

    /// Releases the session's lease now (the forwarder's end does it; calling it again is a
    /// no-op). Returns whether it was still held.
    pub async fn close(&self) -> Result<bool, RuntimeError> {
        match &self.lease {
            Some(lease) => lease.release().await,
            None => Ok(false),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section is a plain update of the tracker or a flag.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn on_thread_start(
        &self,
        line: &Line,
        ctx: &ClientContext,
    ) -> Result<ClientAction, HookError> {
        let Some(id) = line.id().cloned() else {
            return Ok(ClientAction::Forward);
        };
        let intercept = {
            let state = self.state();
            state.first_start && !state.lease_lost
        };
        if !intercept {
            self.expect(ctx, id, Pending::Opens);
            return Ok(ClientAction::Forward);
        }
        let record = match self.store.session(&self.session_id).await {
            Ok(record) => record,
            Err(error) => {
                self.refuse(ctx, id, &error.into(), None).await?;
                return Ok(ClientAction::Consumed);
            }
        };
        let bound = record
            .as_ref()
            .and_then(|r| r.binding())
            .map(|b| b.thread_id.clone());
        let Some(bound) = bound else {
            if let Some(pending) = record.as_ref().and_then(pending_fallback) {
                // A give-up whose notice an earlier process may not have shown: the same
                // warning, the same seeded start, as if this process had given it up.
                let (rail, events) = StatusRail::recording();
                announce_pending_fallback(&rail, &self.session_id, &pending);
                return self
                    .start_replacement(ctx, id, start_params(line), rail, events)
                    .await;
            }
            self.state().first_start = false;
            self.expect(ctx, id, Pending::Opens);
            return Ok(ClientAction::Forward);
        };
        let params = start_params(line);
        let mut attempts = ResumeAttempts::new(bound.clone(), &self.options.binder.resume_policy());
        let lost = loop {
            let resume = resume_params(attempts.params(), &params);
            let verdict = match ctx.request("thread/resume", Some(resume)).await {
                Ok(result) => return self.resumed(ctx, id, result).await,
                Err(RequestError::Rpc { error, .. }) => attempts.on_error(&error),
                Err(RequestError::Timeout { after, .. }) => attempts.on_timeout(after),
                Err(other) => {
                    // Codex is gone (its output ended) or answered nonsense: the client learns
                    // it the way it would from codex, by an error answer; nothing was written.
                    let error = rethread_protocol::RpcError::new(
                        rethread_protocol::ErrorCode::INTERNAL_ERROR,
                        format!("rethread could not resume the session's thread: {other}"),
                    );
                    ctx.send_to_client(Line::error_response(Some(id), error))
                        .await?;
                    return Ok(ClientAction::Consumed);
                }
            };
            match verdict {
                ResumeVerdict::Retry { delay } => tokio::time::sleep(delay).await,
                ResumeVerdict::Lost(lost) => break lost,
                ResumeVerdict::Stop(error) => {
                    self.refuse(ctx, id, &error, Some(&bound)).await?;
                    return Ok(ClientAction::Consumed);
                }
            }
        };
        self.fall_back(ctx, id, params, &lost).await
    }

    /// The bound thread is back: the client's `thread/start` is answered with it.
    async fn resumed(
        &self,
        ctx: &ClientContext,
        id: RequestId,
        result: Value,
    ) -> Result<ClientAction, HookError> {
        let result = as_start_result(result);
        let thread = result.get("thread").cloned().unwrap_or(Value::Null);
        let thread_id = thread.get("id").and_then(Value::as_str).unwrap_or_default();
        let forgot = {
            let mut state = self.state();
            state.first_start = false;
            state.tracker.add_thread(thread_id)
        };
        say_forgot(ctx, forgot);
        ctx.report(&format!(
            "session {}: resumed thread {thread_id}",
            self.session_id
        ));
        ctx.send_to_client(Line::response(id, result.clone()))
            .await?;
        // Codex follows a started thread's answer with `thread/started`; so does this one.
        let started = Message::notification("thread/started", Some(json!({ "thread": thread })));
        ctx.send_to_client(Line::from_message(&started)).await?;
        Ok(ClientAction::Consumed)
    }

    /// The bound thread is lost: given up in one write, then the client's start goes to codex,
    /// seeded; the warning goes right before its answer (see `on_answer`).
    async fn fall_back(
        &self,
        ctx: &ClientContext,
        id: RequestId,
        params: serde_json::Map<String, Value>,
        lost: &LostThread,
    ) -> Result<ClientAction, HookError> {
        let fence = match &self.lease {
            Some(lease) => match lease.ensure_fresh().await {
                Ok(fence) => Some(fence),
                Err(error) => {
                    self.refuse(ctx, id, &error, Some(&lost.thread_id)).await?;
                    return Ok(ClientAction::Consumed);
                }
            },
            None => None,
        };
        let (rail, events) = StatusRail::recording();
        let given_up = give_up_thread(
            self.store.as_ref(),
            &rail,
            &self.session_id,
            lost,
            fence.as_ref(),
        )
        .await;
        if let Err(error) = given_up {
            // The write did nothing: the binding is kept and the next start judges it again.
            self.refuse(ctx, id, &error, Some(&lost.thread_id)).await?;
            return Ok(ClientAction::Consumed);
        }
        self.start_replacement(ctx, id, params, rail, events).await
    }

    /// After a give-up (this process's, or an earlier one's whose notice is pending): the
    /// client's start goes to codex, seeded; the warning goes right before its answer (see
    /// `on_answer`), once per process (later starts are the client's own).
    async fn start_replacement(
        &self,
        ctx: &ClientContext,
        id: RequestId,
        params: serde_json::Map<String, Value>,
        rail: StatusRail,
        events: rethread_runtime::RecordedEvents,
    ) -> Result<ClientAction, HookError> {
        {
            let mut state = self.state();
            state.first_start = false;
        }
        self.expect(ctx, id.clone(), Pending::FallbackStart);
        let seed = match &self.options.binder.seed {
            Some(options) => {
                seed_text(
                    self.store.as_ref(),
                    &Transcript::Store,
                    &self.session_id,
                    options,
                    &rail,
                )
                .await
            }
            None => None,
        };
        for event in events.take() {
            ctx.report(&describe(&event));
        }
        match seed {
            Some(seed) => {
                ctx.send_to_codex(seeded_start(id, params, seed)).await?;
                Ok(ClientAction::Consumed)
            }
            None => Ok(ClientAction::Forward),
        }
    }

    /// Answers the client's `thread/start` with an error; nothing was written.
    async fn refuse(
        &self,
        ctx: &ClientContext,
        id: RequestId,
        error: &RuntimeError,
        thread_id: Option<&str>,
    ) -> Result<(), ProxyError> {
        if matches!(error, RuntimeError::LeaseLost { .. }) {
            self.lease_lost(ctx, None).await?;
        }
        let refusal = start_refused(error, &self.session_id, thread_id);
        ctx.report(&format!(
            "session {}: answered the client's thread/start with an error ({}): {error}",
            self.session_id,
            refusal.code.code()
        ));
        ctx.send_to_client(Line::error_response(Some(id), refusal))
            .await
    }

    fn expect(&self, ctx: &impl Speak, id: RequestId, what: Pending) {
        let forgot = self.state().tracker.expect(id, what);
        say_forgot(ctx, forgot);
    }

    /// Says once, on stderr and to the client, that the lease is gone.
    async fn lease_lost(
        &self,
        ctx: &impl Speak,
        thread_id: Option<&str>,
    ) -> Result<(), ProxyError> {
        let first = !std::mem::replace(&mut self.state().lease_lost, true);
        if first {
            ctx.report(&format!(
                "session {}: the session's lease was lost (another process took it over); \
                 nothing more is recorded by this process",
                self.session_id
            ));
            ctx.send_to_client(Line::warning(LEASE_LOST_WARNING, thread_id))
                .await?;
        }
        Ok(())
    }

    async fn on_answer(
        &self,
        line: &Line,
        pending: Pending,
        ctx: &ServerContext,
    ) -> Result<ServerAction, HookError> {
        let ok = line.kind() == LineKind::Response;
        match pending {
            Pending::Opens => {
                if let Some(thread) = ok.then(|| answered_thread(line)).flatten() {
                    let forgot = self.state().tracker.add_thread(&thread);
                    say_forgot(ctx, forgot);
                }
            }
            Pending::TurnStart { thread_id, input } => {
                if let Some(turn) = ok.then(|| answered_turn(line)).flatten() {
                    let forgot = self.state().tracker.turn_started(&thread_id, &turn, input);
                    say_forgot(ctx, forgot);
                }
            }
            Pending::FallbackStart => {
                let thread = ok.then(|| answered_thread(line)).flatten();
                if let Some(thread) = &thread {
                    let forgot = self.state().tracker.add_thread(thread);
                    say_forgot(ctx, forgot);
                }
                // Exactly once per fallback, right before the answer (an error answer too:
                // the thread was given up either way, and the next start just starts).
                ctx.send_to_client(Line::warning(RESUME_FALLBACK_NOTICE, thread.as_deref()))
                    .await?;
            }
        }
        Ok(ServerAction::Forward)
    }

    fn on_item(&self, line: &Line, ctx: &ServerContext) {
        if !self.state().tracker.follows_threads() {
            return;
        }
        let Ok(Params { params }) = serde_json::from_slice::<Params<ItemNotification>>(line.json())
        else {
            return;
        };
        let forgot =
            self.state()
                .tracker
                .item_completed(&params.thread_id, &params.turn_id, &params.item);
        say_forgot(ctx, forgot);
    }

    async fn on_turn_completed(
        &self,
        line: &Line,
        ctx: &ServerContext,
    ) -> Result<ServerAction, HookError> {
        if !self.state().tracker.follows_threads() {
            return Ok(ServerAction::Forward);
        }
        let Ok(Params { params: completed }) =
            serde_json::from_slice::<Params<TurnNotification>>(line.json())
        else {
            return Ok(ServerAction::Forward);
        };
        let (thread_id, turn) = (completed.thread_id, completed.turn);
        let (open, followed, lease_lost) = {
            let mut state = self.state();
            (
                state.tracker.take_turn(&turn.id),
                state.tracker.is_client_thread(&thread_id),
                state.lease_lost,
            )
        };
        // A failed or interrupted turn writes nothing; neither does a proxy without the lease.
        if !followed || turn.status != TurnStatus::Completed || lease_lost {
            return Ok(ServerAction::Forward);
        }
        let (rows, dropped) = turn_rows(
            &thread_id,
            &turn.id,
            open,
            &turn.items,
            &self.options.limits,
        );
        if dropped > 0 {
            ctx.report(&format!(
                "session {}: turn {} on thread {thread_id}: {dropped} rows past the limits \
                 ({} rows, {} bytes) were not recorded",
                self.session_id,
                turn.id,
                self.options.limits.max_rows,
                self.options.limits.max_bytes
            ));
        }
        // Awaited before the line goes on: the client sees `turn/completed` only once the
        // rows and the binding are durable (or the commit failed and was said).
        let committed = commit_turn(
            self.store.as_ref(),
            &Transcript::Store,
            self.lease.as_ref(),
            TurnRows {
                session_id: &self.session_id,
                thread_id: &thread_id,
                codex_home: self.options.binder.codex_home.as_deref(),
                rows: &rows,
            },
        )
        .await;
        match committed {
            Ok(Publication::Published) => {}
            Ok(publication) => ctx.report(&format!(
                "session {}: turn {} recorded; thread {thread_id} was given up for this \
                 session, so it is not its binding ({publication:?})",
                self.session_id, turn.id
            )),
            Err(RuntimeError::LeaseLost { .. }) => {
                self.lease_lost(ctx, Some(&thread_id)).await?;
            }
            Err(error) => {
                let message =
                    format!("rethread could not record this turn of the session: {error}");
                ctx.report(&format!("session {}: {message}", self.session_id));
                ctx.send_to_client(Line::warning(&message, Some(&thread_id)))
                    .await?;
            }
        }
        Ok(ServerAction::Forward)
    }
}

impl SessionHooks for BindingHooks {
    async fn on_start(&self, ctx: &ClientContext) -> Result<(), HookError> {
        let _ = self.reporter.set(ctx.clone());
        Ok(())
    }

    async fn on_client_message(
        &self,
        line: &Line,
        ctx: &ClientContext,
    ) -> Result<ClientAction, HookError> {
        if line.kind() != LineKind::Request {
            return Ok(ClientAction::Forward);
        }
        let Some(id) = line.id() else {
            return Ok(ClientAction::Forward);
        };
        match line.method() {
            Some("thread/start") => self.on_thread_start(line, ctx).await,
            Some("thread/resume" | "thread/fork") => {
                // A client that opens threads by id manages them itself: its later
                // `thread/start` is its own business.
                self.state().first_start = false;
                self.expect(ctx, id.clone(), Pending::Opens);
                Ok(ClientAction::Forward)
            }
            Some("turn/start") => {
                if let Ok(Params { params }) =
                    serde_json::from_slice::<Params<TurnStartInput>>(line.json())
                {
                    let input = turns::input_text(&params.input).unwrap_or_default();
                    let what = Pending::TurnStart {
                        thread_id: params.thread_id,
                        input,
                    };
                    self.expect(ctx, id.clone(), what);
                }
                Ok(ClientAction::Forward)
            }
            _ => Ok(ClientAction::Forward),
        }
    }

    async fn on_server_message(
        &self,
        line: &Line,
        ctx: &ServerContext,
    ) -> Result<ServerAction, HookError> {
        match line.kind() {
            LineKind::Response | LineKind::Error => {
                let pending = {
                    let mut state = self.state();
                    match line.id() {
                        Some(id) if state.tracker.awaits_answers() => state.tracker.answered(id),
                        _ => None,
                    }
                };
                match pending {
                    Some(pending) => self.on_answer(line, pending, ctx).await,
                    None => Ok(ServerAction::Forward),
                }
            }
            LineKind::Notification => match line.method() {
                Some("item/completed") => {
                    self.on_item(line, ctx);
                    Ok(ServerAction::Forward)
                }
                Some("turn/completed") => self.on_turn_completed(line, ctx).await,
                _ => Ok(ServerAction::Forward),
            },
            _ => Ok(ServerAction::Forward),
        }
    }

    async fn on_shutdown(&self) {
        if let Err(error) = self.close().await {
            if let Some(ctx) = self.reporter.get() {
                ctx.report(&format!(
                    "session {}: releasing the session's lease failed ({error}); it expires on \
                     its own",
                    self.session_id
                ));
            }
        }
    }
}

/// The two contexts, as far as saying things goes.
trait Speak: Sync {
    fn report(&self, message: &str);
    fn send_to_client(&self, line: Line) -> impl Future<Output = Result<(), ProxyError>> + Send;
}

impl Speak for ClientContext {
    fn report(&self, message: &str) {
        ClientContext::report(self, message);
    }
    fn send_to_client(&self, line: Line) -> impl Future<Output = Result<(), ProxyError>> + Send {
        ClientContext::send_to_client(self, line)
    }
}

impl Speak for ServerContext {
    fn report(&self, message: &str) {
        ServerContext::report(self, message);
    }
    fn send_to_client(&self, line: Line) -> impl Future<Output = Result<(), ProxyError>> + Send {
        ServerContext::send_to_client(self, line)
    }
}

fn say_forgot(ctx: &impl Speak, forgot: Option<Forgot>) {
    let Some(forgot) = forgot else { return };
    let what = match forgot {
        Forgot::Request(id) => format!("the answer to the client's request {id}"),
        Forgot::Thread(thread) => format!("thread {thread} (its turns are no longer recorded)"),
        Forgot::Turn(turn) => format!("turn {turn} (it will not be recorded)"),
    };
    ctx.report(&format!(
        "over the session's memory limits: no longer following {what}"
    ));
}

/// A rail event as one stderr line: the message, then its fields.
fn describe(event: &StatusEvent) -> String {
    let fields: Vec<String> = event
        .fields
        .iter()
        .map(|(key, value)| match value {
            Value::String(text) => format!("{key}: {text}"),
            other => format!("{key}: {other}"),
        })
        .collect();
    if fields.is_empty() {
        event.message.clone()
    } else {
        format!("{} ({})", event.message, fields.join(", "))
    }
}

/// The `params` of a message.
#[derive(Deserialize)]
struct Params<P> {
    params: P,
}

/// What the hooks read of `turn/start` params.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TurnStartInput {
    thread_id: String,
    #[serde(default)]
    input: Vec<Value>,
}

#[derive(Deserialize)]
struct Answer<R> {
    result: R,
}

#[derive(Deserialize)]
struct ThreadOf {
    thread: IdOf,
}

#[derive(Deserialize)]
struct TurnOf {
    turn: IdOf,
}

#[derive(Deserialize)]
struct IdOf {
    id: String,
}

/// The thread an answer (`thread/start`, `thread/resume`, `thread/fork`) names.
fn answered_thread(line: &Line) -> Option<String> {
    serde_json::from_slice::<Answer<ThreadOf>>(line.json())
        .ok()
        .map(|answer| answer.result.thread.id)
}

/// The turn a `turn/start` answer names.
fn answered_turn(line: &Line) -> Option<String> {
    serde_json::from_slice::<Answer<TurnOf>>(line.json())
        .ok()
        .map(|answer| answer.result.turn.id)
}
