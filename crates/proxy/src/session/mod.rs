//! [`BindingHooks`]: the session logic of `rethread app-server`, a driver of the runtime's
//! [`SessionMachine`] plugged into the forwarder through [`SessionHooks`]. The machine decides
//! every rule; the hooks carry its actions out as JSON-RPC lines and store writes, and tell it
//! what the client and codex did. What the client sees in each case is tabled in the crate
//! docs ("Sessions").

mod speak;
mod start;
mod turns;
mod wire;

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use rethread_protocol::messages::{ItemNotification, TurnNotification, TurnStatus};
use rethread_protocol::{Message, RequestId};
use rethread_runtime::binding::{self, MachineAccess, StoreSide};
use rethread_runtime::machine::DriverAction;
use rethread_runtime::machine::{Action, Say, SessionMachine};
use rethread_runtime::{BinderOptions, RolloutMirror, RuntimeError, SessionLease, Transcript};
use rethread_store::{BindingStore, LocalOwner};
use serde_json::{json, Map, Value};

use crate::hooks::{
    ClientAction, ClientContext, HookError, RequestError, ServerAction, ServerContext,
};
use crate::line::{Line, LineKind};
use crate::{ProxyError, SessionHooks};

use start::{as_start_result, resume_params, seeded_start, start_params, start_refused};
pub use turns::TurnLimits;
use turns::{turn_rows, Pending, Tracker};
use wire::{answered_thread, answered_turn, Params, ThreadIdOf, TurnStartInput};

/// How [`BindingHooks`] behave.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
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
/// use rethread_proxy::{run_app_server, BindingHooks, CodexCommand, ProxyOptions, SessionOptions};
///
/// // Takes the session's lease now: a session held elsewhere fails here, before codex starts.
/// let hooks = BindingHooks::open("chat-42", store, SessionOptions::default()).await?;
/// let command = CodexCommand::new("codex");
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
    /// The rollout mirror (`options.binder.mirror`), restored before the session's resume and
    /// taken by every commit.
    mirror: Option<RolloutMirror>,
}

/// The hooks' machine, reached through their lock one short step at a time.
struct Locked<'a>(&'a Mutex<State>);

impl MachineAccess for Locked<'_> {
    fn with<R>(&mut self, f: impl FnOnce(&mut SessionMachine) -> R) -> R {
        let mut state = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut state.machine)
    }
}

#[derive(Debug)]
struct State {
    machine: SessionMachine,
    tracker: Tracker,
    /// The session's own `thread/start`, forwarded to codex: its answer opens the session's
    /// thread. Never evicted.
    session_start: Option<RequestId>,
    /// What the machine said while opening, said to the client right before the start's
    /// answer (the new thread's id is known then).
    said: Vec<Say>,
    /// The fallback notice went to the client: resolves once its line is written and flushed
    /// (then it is delivered, as `chat`'s is once on stderr).
    notice_written: Option<tokio::sync::oneshot::Receiver<()>>,
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
        let state = State {
            machine: SessionMachine::new(&session_id, options.binder.machine_options()),
            tracker: Tracker::new(options.limits.clone()),
            session_start: None,
            said: Vec::new(),
            notice_written: None,
        };
        Ok(BindingHooks {
            session_id,
            store,
            mirror: options.binder.rollout_mirror(),
            options,
            lease,
            state: Mutex::new(state),
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
        // Every critical section is a plain update of the machine, the tracker or a flag.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The client's `thread/start`. The machine says whether it opens the session's thread
    /// (the open is driven here); any other is the client's own, forwarded.
    async fn on_thread_start(
        &self,
        line: &Line,
        id: RequestId,
        ctx: &ClientContext,
    ) -> Result<ClientAction, HookError> {
        let params = start_params(line);
        let ephemeral = params.get("ephemeral") == Some(&Value::Bool(true));
        let opens_session = self.state().machine.handle_client_start(ephemeral);
        if !opens_session {
            let stored = None;
            self.expect(ctx, id, Pending::ClientThread { ephemeral, stored })
                .await?;
            return Ok(ClientAction::Forward);
        }
        self.drive_open(id, params, ctx).await
    }

    /// Carries out the machine's actions for the session's first `thread/start` until the
    /// start is answered, forwarded or sent seeded: the store-side ones through
    /// [`StoreSide::next_action`], the requests to codex and what is said here.
    async fn drive_open(
        &self,
        id: RequestId,
        params: Map<String, Value>,
        ctx: &ClientContext,
    ) -> Result<ClientAction, HookError> {
        let side = self.store_side();
        let mut machine = Locked(&self.state);
        loop {
            let Some(action) = side.next_action(&mut machine).await else {
                return Ok(ClientAction::Consumed);
            };
            match action {
                DriverAction::Resume(attempt) => {
                    let resume = resume_params(attempt, &params);
                    let answer = ctx.request("thread/resume", Some(resume)).await;
                    let closed = {
                        let mut state = self.state();
                        match answer {
                            Ok(result) => {
                                state.machine.handle_resumed();
                                Ok(result)
                            }
                            Err(RequestError::Rpc { error, .. }) => {
                                state.machine.handle_resume_error(&error);
                                continue;
                            }
                            Err(RequestError::Timeout { after, .. }) => {
                                state.machine.handle_resume_timeout(after);
                                continue;
                            }
                            Err(other) => {
                                state
                                    .machine
                                    .handle_failed(RuntimeError::Internal(other.to_string()));
                                Err(other)
                            }
                        }
                    };
                    match closed {
                        Ok(result) => return self.resumed(ctx, id, result).await,
                        Err(other) => {
                            // Codex is gone (its output ended) or answered nonsense: the client
                            // learns it the way it would from codex, by an error answer.
                            self.drain_open();
                            let error = rethread_protocol::RpcError::new(
                                rethread_protocol::ErrorCode::INTERNAL_ERROR,
                                format!("rethread could not resume the session's thread: {other}"),
                            );
                            ctx.send_to_client(Line::error_response(Some(id), error))
                                .await?;
                            return Ok(ClientAction::Consumed);
                        }
                    }
                }
                DriverAction::Say(say) => self.state().said.push(say),
                DriverAction::Start { seed } => {
                    self.state().session_start = Some(id.clone());
                    return match seed {
                        Some(seed) => {
                            ctx.send_to_codex(seeded_start(id, params, seed)).await?;
                            Ok(ClientAction::Consumed)
                        }
                        None => Ok(ClientAction::Forward),
                    };
                }
                DriverAction::OpenFailed(error) => {
                    self.refuse(ctx, id, &error).await?;
                    return Ok(ClientAction::Consumed);
                }
                // The open ends at the start (forwarded) or the resume, not at `Opened`; no
                // commit or retire comes while opening.
                DriverAction::Opened(_)
                | DriverAction::Commit { .. }
                | DriverAction::Retire { .. } => {}
            }
        }
    }

    /// The store side of this session's actions.
    fn store_side(&self) -> StoreSide<'_> {
        StoreSide {
            store: self.store.as_ref(),
            session_id: &self.session_id,
            lease: self.lease.as_ref(),
            transcript: &Transcript::Store,
            mirror: self.mirror.as_ref(),
            codex_home: self.options.binder.codex_home.as_deref(),
        }
    }

    /// Drops what a failed open left queued (its notices stay pending in the store).
    fn drain_open(&self) {
        let mut state = self.state();
        while state.machine.poll().is_some() {}
        state.said.clear();
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
        // What the open said (a failed restore: the resume went ahead anyway) is taken before
        // `drain_open` clears it, and said right before the answer.
        let said = std::mem::take(&mut self.state().said);
        self.drain_open();
        ctx.report(&format!(
            "session {}: resumed thread {thread_id}",
            self.session_id
        ));
        for say in &said {
            self.say(ctx, say, Some(thread_id)).await?;
        }
        ctx.send_to_client(Line::response(id, result.clone()))
            .await?;
        // Codex follows a started thread's answer with `thread/started`; so does this one.
        let started = Message::notification("thread/started", Some(json!({ "thread": thread })));
        ctx.send_to_client(Line::from_message(&started)).await?;
        Ok(ClientAction::Consumed)
    }

    /// Answers the client's `thread/start` with an error; what a failed open wrote (a
    /// give-up) is the next open's to report.
    async fn refuse(
        &self,
        ctx: &ClientContext,
        id: RequestId,
        error: &RuntimeError,
    ) -> Result<(), ProxyError> {
        let said = std::mem::take(&mut self.state().said);
        for say in &said {
            self.say(ctx, say, None).await?;
        }
        if let RuntimeError::LeaseLost { to, .. } = error {
            self.state().machine.handle_lease_lost(to.clone());
            self.say_queued(ctx, None).await?;
        }
        let refusal = start_refused(error, &self.session_id, bound_thread(error));
        ctx.report(&format!(
            "session {}: answered the client's thread/start with an error ({}): {error}",
            self.session_id,
            refusal.code.code()
        ));
        ctx.send_to_client(Line::error_response(Some(id), refusal))
            .await
    }

    /// Remembers a client request whose answer matters; whatever that forgets is said.
    async fn expect(
        &self,
        ctx: &ClientContext,
        id: RequestId,
        what: Pending,
    ) -> Result<(), ProxyError> {
        let forgot = self.state().tracker.expect(id, what);
        self.say_forgot(ctx, forgot).await
    }

    /// A `thread/resume` of a thread that belongs to another session of the store: refused
    /// (a thread belongs to at most one session; two sessions on one thread would lock each
    /// other out and fork both conversations). `None` lets it through.
    async fn refuse_foreign_thread(&self, line: &Line) -> Option<rethread_protocol::RpcError> {
        let Ok(Params { params }) = serde_json::from_slice::<Params<ThreadIdOf>>(line.json())
        else {
            return None;
        };
        let owner = match self.store.thread_session(&params.thread_id).await {
            Ok(owner) => owner?,
            Err(error) => {
                let message = format!(
                    "rethread could not check which session owns thread {}: {error}",
                    params.thread_id
                );
                return Some(rethread_protocol::RpcError::new(
                    rethread_protocol::ErrorCode::INTERNAL_ERROR,
                    message,
                ));
            }
        };
        if owner == self.session_id {
            return None;
        }
        let message = format!(
            "thread {} belongs to rethread session {owner}; it cannot be resumed in session {}",
            params.thread_id, self.session_id
        );
        Some(rethread_protocol::RpcError {
            code: rethread_protocol::ErrorCode::INVALID_REQUEST,
            message,
            data: Some(json!({"rethread": {
                "kind": "thread_taken",
                "sessionId": self.session_id,
                "threadId": params.thread_id,
                "ownerSessionId": owner,
            }})),
        })
    }

    /// Answers to the client's requests whose answer matters.
    async fn on_answer(&self, line: &Line, ctx: &ServerContext) -> Result<ServerAction, HookError> {
        let ok = line.kind() == LineKind::Response;
        let Some(id) = line.id() else {
            return Ok(ServerAction::Forward);
        };
        let session_start = self.state().session_start.as_ref() == Some(id);
        if session_start {
            let thread = ok.then(|| answered_thread(line)).flatten();
            let said = {
                let mut state = self.state();
                state.session_start = None;
                match &thread {
                    Some(thread) => state.machine.handle_started(thread.as_str()),
                    None => state.machine.handle_failed(RuntimeError::Internal(
                        "codex refused the session's thread/start".into(),
                    )),
                }
                while state.machine.poll().is_some() {}
                std::mem::take(&mut state.said)
            };
            // Exactly once per fallback, right before the answer (an error answer too: the
            // thread was given up either way, and the next start just starts).
            for say in &said {
                self.say(ctx, say, thread.as_deref()).await?;
            }
            return Ok(ServerAction::Forward);
        }
        let pending = self.state().tracker.answered(id);
        match pending {
            Some(Pending::ClientThread { ephemeral, stored }) => {
                if let Some(thread) = ok.then(|| answered_thread(line)).flatten() {
                    self.state()
                        .machine
                        .handle_client_thread(&thread, ephemeral, stored.as_ref());
                    self.say_queued(ctx, Some(&thread)).await?;
                }
            }
            Some(Pending::TurnStart { input }) => {
                if let Some(turn) = ok.then(|| answered_turn(line)).flatten() {
                    let forgot = self.state().tracker.turn_started(&turn, input);
                    self.say_forgot(ctx, forgot).await?;
                }
            }
            None => {}
        }
        Ok(ServerAction::Forward)
    }

    async fn on_item(&self, line: &Line, ctx: &ServerContext) -> Result<(), ProxyError> {
        let Ok(Params { params }) = serde_json::from_slice::<Params<ItemNotification>>(line.json())
        else {
            return Ok(());
        };
        let forgot = {
            let mut state = self.state();
            if state.machine.thread_id() != Some(params.thread_id.as_str()) {
                return Ok(());
            }
            state
                .tracker
                .item_completed(&params.thread_id, &params.turn_id, &params.item)
        };
        self.say_forgot(ctx, forgot).await
    }

    async fn on_turn_completed(
        &self,
        line: &Line,
        ctx: &ServerContext,
    ) -> Result<ServerAction, HookError> {
        let Ok(Params { params: completed }) =
            serde_json::from_slice::<Params<TurnNotification>>(line.json())
        else {
            return Ok(ServerAction::Forward);
        };
        let (thread_id, turn) = (completed.thread_id, completed.turn);
        let open = self.state().tracker.take_turn(&turn.id);
        // A failed or interrupted turn writes nothing.
        if turn.status != TurnStatus::Completed {
            return Ok(ServerAction::Forward);
        }
        let (rows, dropped) = turn_rows(
            &thread_id,
            &turn.id,
            open,
            &turn.items,
            &self.options.limits,
        );
        self.state().machine.handle_turn_completed(&thread_id, rows);
        loop {
            let action = self.state().machine.poll();
            match action {
                None => break,
                Some(Action::Driver(DriverAction::Say(say))) => {
                    self.say(ctx, &say, Some(&thread_id)).await?
                }
                Some(Action::Driver(DriverAction::Commit {
                    thread_id,
                    rows,
                    mirror,
                })) => {
                    if dropped > 0 {
                        let message = format!(
                            "rethread recorded turn {} without {dropped} of its rows: past the \
                             session's limits ({} rows, {} bytes per turn).",
                            turn.id, self.options.limits.max_rows, self.options.limits.max_bytes
                        );
                        ctx.report(&format!("session {}: {message}", self.session_id));
                        ctx.send_to_client(Line::warning(&message, Some(&thread_id)))
                            .await?;
                    }
                    // Awaited before the line goes on: the client sees `turn/completed` only
                    // once the rows and the binding are durable (or the failure was said).
                    let committed = self
                        .store_side()
                        .commit(&mut Locked(&self.state), &thread_id, &rows, mirror)
                        .await;
                    if let Ok(done) = &committed {
                        let publication = done.publication;
                        if publication != rethread_runtime::Publication::Published {
                            ctx.report(&format!(
                                "session {}: turn {} recorded; thread {thread_id} was given up \
                                 for this session, so it is not its binding ({publication:?})",
                                self.session_id, turn.id
                            ));
                        }
                    }
                }
                Some(_) => {}
            }
        }
        Ok(ServerAction::Forward)
    }
}

/// The thread a refusal names (the bound one), when the error says.
fn bound_thread(error: &RuntimeError) -> Option<&str> {
    match error {
        RuntimeError::Resume { thread_id, .. }
        | RuntimeError::ResumeUnavailable { thread_id, .. }
        | RuntimeError::ThreadBusy { thread_id, .. } => Some(thread_id),
        _ => None,
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
        self.record_notice_if_written().await;
        if line.kind() != LineKind::Request {
            return Ok(ClientAction::Forward);
        }
        let Some(id) = line.id().cloned() else {
            return Ok(ClientAction::Forward);
        };
        match line.method() {
            Some("thread/start") => self.on_thread_start(line, id, ctx).await,
            Some(method @ ("thread/resume" | "thread/fork")) => {
                if method == "thread/resume" {
                    if let Some(refusal) = self.refuse_foreign_thread(line).await {
                        ctx.send_to_client(Line::error_response(Some(id), refusal))
                            .await?;
                        return Ok(ClientAction::Consumed);
                    }
                }
                // A thread the client opens itself: the machine decides, on the answer,
                // whether it is the session's.
                let stored = if self.state().machine.thread_id().is_none() {
                    match binding::read_stored(self.store.as_ref(), &self.session_id).await {
                        Ok(stored) => Some(stored),
                        Err(error) => {
                            ctx.report(&format!(
                                "session {}: could not read the session ({error}); the thread \
                                 the client opens is not recorded",
                                self.session_id
                            ));
                            None
                        }
                    }
                } else {
                    None
                };
                let what = Pending::ClientThread {
                    ephemeral: false,
                    stored,
                };
                self.expect(ctx, id, what).await?;
                Ok(ClientAction::Forward)
            }
            Some("turn/start") => {
                if let Ok(Params { params }) =
                    serde_json::from_slice::<Params<TurnStartInput>>(line.json())
                {
                    let session_thread =
                        self.state().machine.thread_id() == Some(params.thread_id.as_str());
                    if session_thread {
                        let input = turns::input_text(&params.input).unwrap_or_default();
                        self.expect(ctx, id, Pending::TurnStart { input }).await?;
                    }
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
        self.record_notice_if_written().await;
        match line.kind() {
            LineKind::Response | LineKind::Error => {
                let awaited = {
                    let state = self.state();
                    state.session_start.is_some() || state.tracker.awaits_answers()
                };
                if awaited {
                    self.on_answer(line, ctx).await
                } else {
                    Ok(ServerAction::Forward)
                }
            }
            LineKind::Notification => match line.method() {
                Some("item/completed") => {
                    self.on_item(line, ctx).await?;
                    Ok(ServerAction::Forward)
                }
                Some("turn/completed") => self.on_turn_completed(line, ctx).await,
                _ => Ok(ServerAction::Forward),
            },
            _ => Ok(ServerAction::Forward),
        }
    }

    async fn on_shutdown(&self) {
        // A notice written to the client before the end is recorded now (before the lease
        // goes, so that the write is fenced).
        let written = self.state().notice_written.take();
        if let Some(written) = written {
            let wait = std::time::Duration::from_millis(500);
            if let Ok(Ok(())) = tokio::time::timeout(wait, written).await {
                self.notice_delivered().await;
            }
        }
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
