//! [`BindingHooks`]: the session logic of `rethread app-server`, a driver of the runtime's
//! [`SessionMachine`]. The machine decides every rule; the hooks carry its actions out as
//! JSON-RPC lines and store writes, and tell it what the client and codex did. What the client
//! sees in each case is tabled in the crate docs ("Sessions").

mod guard;
mod kept;
mod replace;
mod speak;
mod start;
mod turns;

use rethread_store::Unpoisoned;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use rethread_protocol::messages::ThreadResumeParams;
use rethread_protocol::messages::{ItemNotification, TurnNotification, TurnStatus};
use rethread_protocol::{ErrorCode, Message, RequestId, RpcError, ThreadId};
use rethread_runtime::binding::{self, Answer, MachineAccess, Opened, Opener, StoreSide};
use rethread_runtime::machine::{Say, SessionMachine};
use rethread_runtime::{
    BinderOptions, Publication, RolloutMirror, RuntimeError, SessionLease, Transcript,
};
use rethread_store::{BindingStore, Lease, LocalOwner};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::oneshot;

use crate::hooks::{ClientAction, ClientContext, HookError, ServerAction, ServerContext};
use crate::line::{Line, LineKind};
use crate::{ProxyError, SessionHooks};

pub(crate) use guard::Sessionless;
use guard::{Listings, Named, Viewer};
pub(crate) use kept::KeptThreads;
use replace::Reroute;
pub use speak::NoticeDelivery;
pub use start::open_refused;
use start::{as_start_result, resume_params, seeded_start, start_refused};
pub use turns::TurnLimits;
use turns::{turn_rows, Pending, Tracker};

/// How [`BindingHooks`] behave.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct SessionOptions {
    /// The runtime's options, as a [`SessionBinder`](rethread_runtime::SessionBinder) reads
    /// them (resume policy, seeding, lease, mirror, `codex_home`); `turn_timeout` and
    /// `thread_start` are not used: the client drives its own turns and starts.
    pub binder: BinderOptions,
    /// What the hooks keep in memory.
    pub limits: TurnLimits,
    /// How the fallback notice reaches the client.
    pub notice: NoticeDelivery,
}

/// The session logic of `rethread app-server` for one session id (see the module docs).
///
/// ```no_run
/// # async fn demo(store: rethread_store::BindingStore) -> Result<(), Box<dyn std::error::Error>> {
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
    store: BindingStore,
    options: SessionOptions,
    lease: Option<SessionLease>,
    state: Mutex<State>,
    /// The context `on_start` was given: where `on_shutdown` reports.
    reporter: OnceLock<ClientContext>,
    /// The rollout mirror (`options.binder.mirror`), restored before the resume.
    mirror: Option<RolloutMirror>,
    /// The client's requests whose answers list threads.
    listings: Listings,
}

/// The hooks' machine, reached through their lock one short step at a time.
struct Locked<'a>(&'a BindingHooks);

impl MachineAccess for Locked<'_> {
    fn with<R>(&mut self, f: impl FnOnce(&mut SessionMachine) -> R) -> R {
        f(&mut self.0.state().machine)
    }
}

#[derive(Debug)]
struct State {
    machine: SessionMachine,
    tracker: Tracker,
    /// The session's own `thread/start`, forwarded: its answer opens the session's thread.
    session_start: Option<RequestId>,
    /// What the machine said while opening, said right before the start's answer.
    said: Vec<Say>,
    /// Resolves once the fallback notice's line is flushed (then it is delivered).
    notice_written: Option<oneshot::Receiver<()>>,
    /// The thread whose next turn is to carry the fallback notice as an item
    /// ([`NoticeDelivery::Item`]).
    notice_item: Option<String>,
    /// The params of the client's `thread/start` that opened the session's thread: a
    /// replacement opened later starts with them.
    start_params: Option<Map<String, Value>>,
    /// The session's thread, given up after its failed first turn, until a request naming it
    /// opens its replacement (`replace.rs`).
    given_up: Option<String>,
    /// That thread and its replacement: requests naming the one go to the other.
    replaced: Option<(String, String)>,
}

impl BindingHooks {
    /// Takes `session_id`'s lease in `store` (unless `options.binder.lease_ttl` is `None`),
    /// waiting up to `options.binder.lease_wait` for a live holder to let it go.
    ///
    /// # Errors
    /// [`RuntimeError::SessionBusy`] naming the holder when the lease stays held; a store
    /// failure; a session id of the kept threads' key space (`thread:...`). A holder that died
    /// on this machine is taken over at once.
    pub async fn open(
        session_id: impl Into<String>,
        store: BindingStore,
        options: SessionOptions,
    ) -> Result<BindingHooks, RuntimeError> {
        let session_id = session_id.into();
        rethread_runtime::kept::check_session_id(&session_id)?;
        let lease = match options.binder.lease_ttl {
            Some(ttl) => {
                let owner = Arc::new(LocalOwner::new());
                let wait = options.binder.lease_wait;
                Some(SessionLease::acquire(store.clone(), &session_id, owner, ttl, wait).await?)
            }
            None => None,
        };
        let state = State {
            machine: SessionMachine::new(&session_id, options.binder.machine_options()),
            tracker: Tracker::new(options.limits.clone()),
            session_start: None,
            said: Vec::new(),
            notice_written: None,
            notice_item: None,
            start_params: None,
            given_up: None,
            replaced: None,
        };
        Ok(BindingHooks {
            session_id,
            store,
            mirror: options.binder.rollout_mirror(),
            options,
            lease,
            state: Mutex::new(state),
            reporter: OnceLock::new(),
            listings: Listings::default(),
        })
    }

    /// The session's lease, as last granted or renewed (`None` without one).
    pub fn lease(&self) -> Option<Lease> {
        self.lease.as_ref().map(SessionLease::lease)
    }

    /// Releases the session's lease now, as the forwarder's end does (a second call is a
    /// no-op). Returns whether it was still held.
    pub async fn close(&self) -> Result<bool, RuntimeError> {
        match &self.lease {
            Some(lease) => lease.release().await,
            None => Ok(false),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section is a plain update of the machine, the tracker or a flag.
        self.state.lock().unpoisoned()
    }

    /// The store side of this session's actions.
    fn store_side(&self) -> StoreSide<'_> {
        StoreSide {
            store: &self.store,
            session_id: &self.session_id,
            lease: self.lease.as_ref(),
            transcript: &Transcript::Store,
            mirror: self.mirror.as_ref(),
            codex_home: self.options.binder.codex_home.as_deref(),
        }
    }

    /// Opens the session's thread for the client's first `thread/start` (the runtime's open
    /// loop, `StoreSide::open`): answered by the bound thread's resume, forwarded (seeded),
    /// or refused.
    async fn drive_open(
        &self,
        id: RequestId,
        params: Map<String, Value>,
        ctx: &ClientContext,
    ) -> Result<ClientAction, HookError> {
        self.state().start_params = Some(params.clone());
        let mut opener = StartOpener {
            hooks: self,
            ctx,
            id: id.clone(),
            params,
            forward: false,
            unsent: None,
        };
        let opened = self.store_side().open(&mut Locked(self), &mut opener).await;
        if let Some(error) = opener.unsent {
            return Err(error.into());
        }
        match opened {
            Ok(Opened::Open { open: result, .. }) => self.resumed(ctx, id, result).await,
            Ok(_) if opener.forward => Ok(ClientAction::Forward),
            Ok(_) => Ok(ClientAction::Consumed),
            Err(error) => {
                self.refuse(ctx, id, &error).await?;
                Ok(ClientAction::Consumed)
            }
        }
    }

    /// Drops what an open left queued (a failed one's notices stay pending in the store);
    /// returns what it said.
    fn drain_open(&self) -> Vec<Say> {
        let mut state = self.state();
        while state.machine.poll().is_some() {}
        std::mem::take(&mut state.said)
    }

    /// The bound thread is back: the client's `thread/start` is answered with it, after what
    /// the open said (a failed restore: the resume went ahead anyway).
    async fn resumed(
        &self,
        ctx: &ClientContext,
        id: RequestId,
        result: Value,
    ) -> Result<ClientAction, HookError> {
        let result = as_start_result(result);
        let thread = result.get("thread").cloned().unwrap_or(Value::Null);
        let thread_id = thread.get("id").and_then(Value::as_str).unwrap_or_default();
        let said = self.drain_open();
        let session = &self.session_id;
        ctx.report(&format!("session {session}: resumed thread {thread_id}"));
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

    /// Answers the client's `thread/start` with an error (a give-up it wrote is the next
    /// open's to say).
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
        let refusal = start_refused(error, Some(&self.session_id), bound_thread(error));
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

    /// Who the guard keeps threads for: this session.
    fn viewer(&self) -> Viewer<'_> {
        Viewer::Session {
            store: &self.store,
            session_id: &self.session_id,
        }
    }

    /// The threads a client request names ([`guard::named`]: `threadId`, `...ThreadId`, the
    /// thread at a `path`), unless one is another session's ([`binding::client_thread`]
    /// decides) or the request cannot be read whole: then the refusal to answer it with.
    async fn guard(&self, line: &Line) -> Result<Named, RpcError> {
        let named = guard::named(line, self.options.binder.codex_home.as_deref()).await?;
        let own = self.state().machine.thread_id().map(str::to_string);
        for thread in named.all() {
            if own.as_deref() == Some(thread.as_str()) {
                continue;
            }
            let Err(error) = self.viewer().check(thread.as_str()).await else {
                continue;
            };
            return Err(match start::thread_taken(&error, Some(&self.session_id)) {
                Some(taken) => taken,
                None => RpcError::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!("rethread could not check which session owns thread {thread}: {error}"),
                ),
            });
        }
        Ok(named)
    }

    /// A `thread/resume` or `thread/fork` (its thread restored first,
    /// [`StoreSide::restore_named`]): the machine decides on its answer whether the thread is
    /// the session's, from the store's record while the session has no thread yet. `asked`:
    /// the thread a resume names; an answer with another thread is never the session's.
    async fn client_thread(
        &self,
        ctx: &ClientContext,
        id: RequestId,
        asked: Option<String>,
    ) -> Result<(), HookError> {
        let mut stored = None;
        if self.state().machine.thread_id().is_none() {
            match binding::read_stored(&self.store, &self.session_id).await {
                Ok(read) => stored = Some(read),
                Err(error) => ctx.report(&format!(
                    "session {}: could not read the session ({error}); the thread the client \
                     opens is not recorded",
                    self.session_id
                )),
            }
        }
        let ephemeral = false;
        let pending = Pending::ClientThread {
            ephemeral,
            stored,
            asked,
        };
        self.expect(ctx, id, pending).await?;
        Ok(())
    }

    /// Answers to the client's requests whose answer matters.
    async fn on_answer(&self, line: &Line, ctx: &ServerContext) -> Result<(), HookError> {
        let Some(id) = line.id() else { return Ok(()) };
        let ok = line.kind() == LineKind::Response;
        let session_start = self.state().session_start.as_ref() == Some(id);
        if session_start {
            let thread = ok.then(|| answered_thread(line)).flatten();
            {
                let mut state = self.state();
                state.session_start = None;
                match &thread {
                    Some(thread) => state.machine.handle_started(thread.as_str()),
                    // codex's own error answer goes to the client.
                    None => state.machine.handle_failed(),
                }
            }
            // Exactly once per fallback, right before the answer (an error answer too: the
            // thread was given up either way, and the next start just starts).
            for say in &self.drain_open() {
                self.say(ctx, say, thread.as_deref()).await?;
            }
            return Ok(());
        }
        let pending = self.state().tracker.answered(id);
        match pending {
            Some(Pending::ClientThread {
                ephemeral,
                stored,
                asked,
            }) => {
                let thread = ok.then(|| answered_thread(line)).flatten();
                let thread: Option<String> = thread.map(|thread| ThreadId::new(&thread).into());
                if let (Some(thread), Some(asked)) = (&thread, &asked) {
                    if thread != asked {
                        ctx.report(&format!(
                            "session {}: codex answered the client's resume of thread {asked} \
                             with thread {thread}; it is not taken for the session's",
                            self.session_id
                        ));
                        return Ok(());
                    }
                }
                if let Some(thread) = thread {
                    self.state()
                        .machine
                        .handle_client_thread(&thread, ephemeral, stored.as_ref());
                    self.say_queued(ctx, Some(&thread)).await?;
                }
            }
            Some(Pending::TurnStart { input }) => {
                if let Some(TurnOf { turn }) = ok.then(|| line.result()).flatten() {
                    let forgot = self.state().tracker.turn_started(&turn.id, input);
                    self.say_forgot(ctx, forgot).await?;
                }
            }
            None => {}
        }
        Ok(())
    }

    async fn on_item(&self, line: &Line, ctx: &ServerContext) -> Result<(), ProxyError> {
        let Some(item) = line.params::<ItemNotification>() else {
            return Ok(());
        };
        let forgot = {
            let mut state = self.state();
            if state.machine.thread_id() != Some(item.thread_id.as_str()) {
                return Ok(());
            }
            let tracker = &mut state.tracker;
            tracker.item_completed(&item.thread_id, &item.turn_id, &item.item)
        };
        self.say_forgot(ctx, forgot).await
    }

    async fn on_turn_completed(&self, line: &Line, ctx: &ServerContext) -> Result<(), HookError> {
        let Some(TurnNotification { thread_id, turn }) = line.params() else {
            return Ok(());
        };
        let open = self.state().tracker.take_turn(&turn.id);
        // A failed or interrupted turn writes nothing; a failed one may lose the thread.
        if turn.status != TurnStatus::Completed {
            if turn.status == TurnStatus::Failed {
                let message = turn.error.as_ref().map(|e| e.message.as_str());
                self.turn_failed(&thread_id, message.unwrap_or_default(), ctx)
                    .await?;
            }
            return Ok(());
        }
        let limits = &self.options.limits;
        let (rows, dropped) = turn_rows(&thread_id, &turn.id, open, &turn.items, limits);
        let side = self.store_side();
        let (committed, said) = side
            .complete_turn(&mut Locked(self), &thread_id, rows)
            .await;
        // Awaited before the line goes on: the client sees `turn/completed` only once the rows
        // and the binding are durable (or the failure was said).
        if let Some(committed) = committed {
            let session = &self.session_id;
            if dropped > 0 {
                let message = format!(
                    "rethread recorded turn {} without {dropped} of its rows: past the \
                     session's limits ({} rows, {} bytes per turn).",
                    turn.id, limits.max_rows, limits.max_bytes
                );
                ctx.report(&format!("session {session}: {message}"));
                ctx.send_to_client(Line::warning(&message, Some(&thread_id)))
                    .await?;
            }
            let publication = committed.map_or(Publication::Published, |done| done.publication);
            if publication != Publication::Published {
                ctx.report(&format!(
                    "session {session}: turn {} recorded; thread {thread_id} was given up for \
                     this session, so it is not its binding ({publication:?})",
                    turn.id
                ));
            }
        }
        for say in said {
            self.say(ctx, &say, Some(&thread_id)).await?;
        }
        Ok(())
    }
}

/// The proxy's part of an open: the client's `thread/start` (`id`, `params`) answered by a
/// resume of the bound thread, or sent on to codex (seeded); what is said waits for the
/// start's answer.
struct StartOpener<'a> {
    hooks: &'a BindingHooks,
    ctx: &'a ClientContext,
    id: RequestId,
    params: Map<String, Value>,
    /// The client's own line goes on (a start without a seed).
    forward: bool,
    /// The seeded start could not be sent: forwarding is over.
    unsent: Option<ProxyError>,
}

impl Opener for StartOpener<'_> {
    /// The resume's result.
    type Open = Value;

    async fn resume(&mut self, attempt: ThreadResumeParams) -> Answer<Value> {
        let resume = resume_params(attempt, &self.params);
        Answer::of_resume(self.ctx.request("thread/resume", Some(resume)).await)
    }

    async fn start(&mut self, seed: Option<String>) -> Answer<Value> {
        self.hooks.state().session_start = Some(self.id.clone());
        match seed {
            None => self.forward = true,
            Some(seed) => {
                let params = std::mem::take(&mut self.params);
                let line = seeded_start(self.id.clone(), params, seed);
                if let Err(error) = self.ctx.send_to_codex(line).await {
                    self.unsent = Some(error);
                }
            }
        }
        Answer::Sent
    }

    fn say(&mut self, say: Say) -> bool {
        self.hooks.state().said.push(say);
        false
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
        let (LineKind::Request, Some(id)) = (line.kind(), line.id().cloned()) else {
            return Ok(ClientAction::Forward);
        };
        let named = match self.guard(line).await {
            Ok(named) => named,
            Err(refusal) => {
                ctx.report(&format!("session {}: {}", self.session_id, refusal.message));
                ctx.send_to_client(Line::error_response(Some(id), refusal))
                    .await?;
                return Ok(ClientAction::Consumed);
            }
        };
        self.listings.on_request(line);
        let rerouted = match self.reroute(line, ctx).await? {
            Reroute::Unchanged => None,
            Reroute::To(rerouted) => Some(rerouted),
            Reroute::Answered => return Ok(ClientAction::Consumed),
        };
        let line = rerouted.as_ref().unwrap_or(line);
        match line.method() {
            Some("thread/start") => {
                // Unless it opens the session's thread, it is the client's own.
                let params: Map<String, Value> = line.params().unwrap_or_default();
                let ephemeral = params.get("ephemeral") == Some(&Value::Bool(true));
                if self.state().machine.handle_client_start(ephemeral) {
                    return self.drive_open(id, params, ctx).await;
                }
                let (stored, asked) = (None, None);
                let pending = Pending::ClientThread {
                    ephemeral,
                    stored,
                    asked,
                };
                self.expect(ctx, id, pending).await?;
            }
            Some(method @ ("thread/resume" | "thread/fork")) => {
                let target = named.target().map(|thread| thread.as_str().to_string());
                if let Some(thread) = &target {
                    self.store_side().restore_named(thread).await;
                }
                let asked = target.filter(|_| method == "thread/resume");
                self.client_thread(ctx, id, asked).await?
            }
            Some("turn/start") => {
                if let Some(start) = line.params::<TurnStartInput>() {
                    let session_thread =
                        self.state().machine.thread_id() == Some(start.thread_id.as_str());
                    if session_thread {
                        let input = turns::user_input(&start.input);
                        self.expect(ctx, id, Pending::TurnStart { input }).await?;
                    }
                }
            }
            _ => {}
        }
        if let Some(rerouted) = rerouted {
            ctx.send_to_codex(rerouted).await?;
            return Ok(ClientAction::Consumed);
        }
        Ok(ClientAction::Forward)
    }

    async fn on_server_message(
        &self,
        line: &Line,
        ctx: &ServerContext,
    ) -> Result<ServerAction, HookError> {
        self.record_notice_if_written().await;
        self.say_notice_item(line, ctx).await?;
        if self.listings.concerns(line) {
            if let Some(filtered) = self.listings.filter(line, self.viewer()).await {
                ctx.send_to_client(filtered).await?;
                return Ok(ServerAction::Consumed);
            }
        }
        match (line.kind(), line.method()) {
            (LineKind::Response | LineKind::Error, _) => {
                let awaited = {
                    let state = self.state();
                    state.session_start.is_some() || state.tracker.awaits_answers()
                };
                if awaited {
                    self.on_answer(line, ctx).await?;
                }
            }
            (LineKind::Notification, Some("item/completed")) => self.on_item(line, ctx).await?,
            (LineKind::Notification, Some("turn/completed")) => {
                self.on_turn_completed(line, ctx).await?
            }
            _ => {}
        }
        Ok(ServerAction::Forward)
    }

    async fn on_shutdown(&self) {
        // A notice written before the end is recorded now, fenced before the lease goes.
        let written = self.state().notice_written.take();
        if let Some(written) = written {
            let wait = std::time::Duration::from_millis(500);
            if let Ok(Ok(())) = tokio::time::timeout(wait, written).await {
                self.notice_delivered().await;
            }
        }
        if let (Err(error), Some(ctx)) = (self.close().await, self.reporter.get()) {
            ctx.report(&format!(
                "session {}: releasing the session's lease failed ({error}); it expires on its \
                 own",
                self.session_id
            ));
        }
    }
}

/// What the hooks read of `turn/start` params.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TurnStartInput {
    #[serde(deserialize_with = "canonical")]
    thread_id: String,
    #[serde(default)]
    input: Vec<Value>,
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

/// A thread id member, read in its canonical form.
fn canonical<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(ThreadId::deserialize(d)?.into())
}

/// The thread an answer (`thread/start`, `thread/resume`, `thread/fork`) names.
fn answered_thread(line: &Line) -> Option<String> {
    Some(line.result::<ThreadOf>()?.thread.id)
}

/// The thread an answer's `result` names.
fn answered_thread_of(result: &Value) -> Option<String> {
    Some(ThreadOf::deserialize(result).ok()?.thread.id)
}
