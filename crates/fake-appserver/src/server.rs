//! The fake `codex app-server`: request dispatch, turns, the model side, faults.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use rethread_protocol::{HistoryMode, Message, NdjsonCodec, RequestId};
use serde_json::{json, Map, Value};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter, DuplexStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::codec::FramedRead;

use crate::faults::{Corruption, Fault, FaultScript, OVERLOADED_MESSAGE};
use crate::model::{ConversationMessage, Reply};
use crate::profile::Profile;
use crate::store::{self, ReadError, Store, ThreadMeta, TurnRecord};
use crate::util::{check_uuid, new_id, now_ms, TempHome};

/// -32600.
const INVALID_REQUEST: i64 = -32600;
/// -32601.
const METHOD_NOT_FOUND: i64 = -32601;
/// -32603.
const INTERNAL_ERROR: i64 = -32603;
/// -32001.
const OVERLOADED: i64 = -32001;

/// The methods the fake serves, in the order its "unknown variant" error lists them.
const METHODS: [&str; 7] = [
    "initialize",
    "thread/start",
    "thread/resume",
    "thread/read",
    "thread/list",
    "turn/start",
    "turn/interrupt",
];

/// The capacity of the in-process duplex pipe in each direction.
const DUPLEX_CAPACITY: usize = 1 << 20;

/// Entry point: `FakeAppServer::builder()`.
#[derive(Debug)]
pub struct FakeAppServer;

impl FakeAppServer {
    /// A builder with the current profile, no faults, the echo model and a temporary
    /// `CODEX_HOME`.
    pub fn builder() -> FakeBuilder {
        FakeBuilder::default()
    }
}

/// Configures a fake app-server.
#[derive(Debug, Clone, Default)]
pub struct FakeBuilder {
    profile: Profile,
    faults: FaultScript,
    codex_home: Option<PathBuf>,
    reply: Option<Reply>,
    model_log: Option<PathBuf>,
}

impl FakeBuilder {
    /// Which codex release to imitate.
    pub fn profile(mut self, profile: Profile) -> Self {
        self.profile = profile;
        self
    }

    /// The faults to inject.
    pub fn faults(mut self, faults: FaultScript) -> Self {
        self.faults = faults;
        self
    }

    /// Where threads live; a temporary directory (removed with the last handle) when unset.
    pub fn codex_home(mut self, dir: impl Into<PathBuf>) -> Self {
        self.codex_home = Some(dir.into());
        self
    }

    /// What the model answers (default [`Reply::Echo`]).
    pub fn reply(mut self, reply: Reply) -> Self {
        self.reply = Some(reply);
        self
    }

    /// Also append every model request, as a JSON line, to this file (the binary writes
    /// `$CODEX_HOME/fake-model-requests.jsonl`).
    pub fn model_log(mut self, path: impl Into<PathBuf>) -> Self {
        self.model_log = Some(path.into());
        self
    }

    fn into_shared(self) -> io::Result<Arc<Shared>> {
        let (home, tempdir) = match self.codex_home {
            Some(home) => {
                std::fs::create_dir_all(&home)?;
                (home, None)
            }
            None => {
                let dir = TempHome::new()?;
                (dir.path().to_path_buf(), Some(dir))
            }
        };
        Ok(Arc::new(Shared {
            home,
            _tempdir: tempdir,
            profile: Mutex::new(self.profile),
            faults: Mutex::new(self.faults),
            reply: Mutex::new(self.reply.unwrap_or(Reply::Echo)),
            counters: Mutex::new(Counters::default()),
            requests: Mutex::new(Vec::new()),
            model: Mutex::new(Vec::new()),
            model_log: self.model_log,
        }))
    }

    /// Starts the fake on the current tokio runtime, connected to the returned stream (the
    /// client's end: write requests, read responses and notifications).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn_in_process(self) -> io::Result<(DuplexStream, FakeHandle)> {
        let shared = self.into_shared()?;
        let handle = FakeHandle {
            shared,
            task: Arc::new(Mutex::new(None)),
        };
        let client = handle.start_process()?;
        Ok((client, handle))
    }

    /// Serves one connection (e.g. stdin/stdout) until the input ends or a fault exits;
    /// says which.
    pub async fn serve<R, W>(self, reader: R, writer: W) -> io::Result<Ended>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let shared = self.into_shared()?;
        run_process(shared, reader, writer).await
    }
}

/// Why a served connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The client closed its end (codex exits when its stdin closes).
    InputClosed,
    /// A fault of the script made the server exit (like a crash).
    Fault,
}

/// One request the fake received.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedRequest {
    /// Its id.
    pub id: RequestId,
    /// Its method.
    pub method: String,
    /// Its params.
    pub params: Option<Value>,
}

/// One turn as the model saw it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelRequest {
    /// The thread.
    pub thread_id: String,
    /// The turn.
    pub turn_id: String,
    /// The whole conversation of the thread the model saw, this turn's user message last.
    pub conversation: Vec<ConversationMessage>,
    /// What the model answered.
    pub reply: String,
}

impl ModelRequest {
    /// True when some message of the conversation contains `text`.
    pub fn saw(&self, text: &str) -> bool {
        self.conversation.iter().any(|m| m.text.contains(text))
    }
}

#[derive(Debug, Default)]
struct Counters {
    requests: u64,
    turns: u64,
    overloaded: HashMap<usize, u32>,
}

/// State that outlives one server "process" (survives kill and restart).
#[derive(Debug)]
struct Shared {
    home: PathBuf,
    _tempdir: Option<TempHome>,
    profile: Mutex<Profile>,
    faults: Mutex<FaultScript>,
    reply: Mutex<Reply>,
    counters: Mutex<Counters>,
    requests: Mutex<Vec<LoggedRequest>>,
    model: Mutex<Vec<ModelRequest>>,
    model_log: Option<PathBuf>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded data is plain state; a panicking holder cannot leave it half-updated in a
    // way later readers would misinterpret.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The test's handle on an in-process fake: observe, script, kill and restart it.
///
/// Cloning it is cheap; every clone controls the same fake.
#[derive(Debug, Clone)]
pub struct FakeHandle {
    shared: Arc<Shared>,
    task: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl FakeHandle {
    fn start_process(&self) -> io::Result<DuplexStream> {
        // Open the store now so a broken home is reported to the caller.
        drop(Store::open(&self.shared.home)?);
        let (client, server) = tokio::io::duplex(DUPLEX_CAPACITY);
        let (read, write) = tokio::io::split(server);
        let shared = self.shared.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = run_process(shared, read, write).await {
                tracing::warn!("fake app-server ended: {e}");
            }
        });
        if let Some(old) = lock(&self.task).replace(task) {
            old.abort();
        }
        Ok(client)
    }

    /// The `CODEX_HOME` the fake keeps its threads in.
    pub fn codex_home(&self) -> &Path {
        &self.shared.home
    }

    /// Every request received so far, across restarts, in arrival order.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        lock(&self.shared.requests).clone()
    }

    /// The methods of [`FakeHandle::requests`].
    pub fn methods(&self) -> Vec<String> {
        lock(&self.shared.requests)
            .iter()
            .map(|r| r.method.clone())
            .collect()
    }

    /// Every model request (one per turn that reached the model), across restarts.
    pub fn model_requests(&self) -> Vec<ModelRequest> {
        lock(&self.shared.model).clone()
    }

    /// Forgets the request log and the model requests recorded so far (a long-running test
    /// keeps memory bounded this way).
    pub fn clear_logs(&self) {
        lock(&self.shared.requests).clear();
        lock(&self.shared.model).clear();
    }

    /// The profile the fake runs (a change applies from the next [`FakeHandle::restart`], like
    /// upgrading or downgrading the binary).
    pub fn profile(&self) -> Profile {
        *lock(&self.shared.profile)
    }

    /// Sets the profile used from the next restart.
    pub fn set_profile(&self, profile: Profile) {
        *lock(&self.shared.profile) = profile;
    }

    /// Replaces the fault script (effective immediately; counters keep counting).
    pub fn set_faults(&self, faults: FaultScript) {
        *lock(&self.shared.faults) = faults;
    }

    /// Replaces what the model answers.
    pub fn set_reply(&self, reply: Reply) {
        *lock(&self.shared.reply) = reply;
    }

    /// Whether the server is running (not killed and not exited by a fault).
    pub fn is_running(&self) -> bool {
        lock(&self.task).as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Kills the server like a crash: its output ends mid-stream, its writer locks are
    /// released, nothing more is written to its rollouts.
    pub async fn kill(&self) {
        let task = lock(&self.task).take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
    }

    /// Kills the server if it runs and starts a fresh one on the same `CODEX_HOME` (a process
    /// restart: loaded threads are forgotten, stored ones remain). Returns the new client end.
    pub async fn restart(&self) -> io::Result<DuplexStream> {
        self.kill().await;
        self.start_process()
    }

    /// The rollout file of `id`, if one exists.
    pub fn rollout_path(&self, id: &str) -> Option<PathBuf> {
        Store::open(&self.shared.home)
            .ok()?
            .find_rollout(id, true)
            .ok()?
    }

    /// Corrupts the rollout of `id`.
    pub fn corrupt_rollout(&self, id: &str, corruption: Corruption) -> io::Result<()> {
        let path = self.rollout_path(id).ok_or_else(|| no_rollout(id))?;
        corruption.apply(&path)
    }

    /// Rewrites `history_mode` in the rollout's `session_meta` line (any string, e.g. an
    /// unknown mode).
    pub fn set_rollout_history_mode(&self, id: &str, mode: &str) -> io::Result<()> {
        let path = self.rollout_path(id).ok_or_else(|| no_rollout(id))?;
        let text = std::fs::read_to_string(&path)?;
        let (first, rest) = text.split_once('\n').unwrap_or((&text, ""));
        let mut meta: Value = serde_json::from_str(first).map_err(io::Error::other)?;
        let payload = meta
            .get_mut("payload")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| io::Error::other("the first line is not a session_meta record"))?;
        payload.insert("history_mode".into(), json!(mode));
        std::fs::write(&path, format!("{meta}\n{rest}"))
    }

    /// Sets `threads.history_mode` of `id` in `state_5.sqlite` (the fake, like codex, corrects
    /// it from the rollout when it next reads the thread).
    pub fn set_indexed_history_mode(&self, id: &str, mode: &str) -> io::Result<()> {
        let changed = Store::open(&self.shared.home)?.set_indexed_mode(id, mode)?;
        if changed == 0 {
            return Err(no_rollout(id));
        }
        Ok(())
    }
}

fn no_rollout(id: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("no rollout for thread {id}"),
    )
}

// ---------------------------------------------------------------------------------------------
// One server process.

#[derive(Debug)]
enum Out {
    Line(String),
    Exit,
}

/// Sends lines to the writer.
#[derive(Debug, Clone)]
struct Emitter {
    out: mpsc::UnboundedSender<Out>,
    timestamps: bool,
}

impl Emitter {
    fn line(&self, line: String) {
        let _ = self.out.send(Out::Line(line));
    }

    fn notify(&self, method: &str, params: Value) {
        let mut message = Map::new();
        message.insert("method".into(), json!(method));
        message.insert("params".into(), params);
        if self.timestamps {
            message.insert("emittedAtMs".into(), json!(now_ms()));
        }
        self.line(Value::Object(message).to_string());
    }

    fn respond(&self, id: &Value, outcome: Result<Value, (i64, String)>) {
        let line = match outcome {
            Ok(result) => json!({"id": id, "result": result}),
            Err((code, message)) => json!({"id": id, "error": {"code": code, "message": message}}),
        };
        self.line(line.to_string());
    }

    fn exit(&self) {
        let _ = self.out.send(Out::Exit);
    }
}

#[derive(Debug)]
struct Loaded {
    meta: ThreadMeta,
    turns: Vec<TurnRecord>,
    materialized: bool,
    _writer_lock: Option<File>,
    active: Option<ActiveTurn>,
    /// The last turn interrupted in this process, until another turn starts (0.144.6 keeps
    /// treating it as active).
    interrupted: Option<String>,
}

#[derive(Debug)]
struct ActiveTurn {
    interrupt: Option<oneshot::Sender<()>>,
}

#[derive(Debug)]
struct Proc {
    shared: Arc<Shared>,
    profile: Profile,
    store: Store,
    initialized: bool,
    experimental: bool,
    threads: HashMap<String, Loaded>,
    pending: HashMap<String, oneshot::Sender<Value>>,
    next_server_request: i64,
}

type ProcRef = Arc<Mutex<Proc>>;
type RpcResult = Result<Value, (i64, String)>;

/// A `thread/tokenUsage/updated` params object (every model response counts 1 in, 1 out).
fn token_usage(thread_id: &str, turn_id: &str) -> Value {
    let usage = json!({"totalTokens": 2, "inputTokens": 1, "cachedInputTokens": 0,
                       "outputTokens": 1, "reasoningOutputTokens": 0});
    json!({"threadId": thread_id, "turnId": turn_id,
           "tokenUsage": {"total": usage, "last": usage, "modelContextWindow": 258400}})
}

/// Releases the process's threads (and their writer locks) however the process ends,
/// including an abort.
struct ReleaseOnDrop(ProcRef);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        let mut proc = lock(&self.0);
        proc.threads.clear();
        proc.pending.clear();
    }
}

async fn run_process<R, W>(shared: Arc<Shared>, reader: R, writer: W) -> io::Result<Ended>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let profile = *lock(&shared.profile);
    let store = Store::open(&shared.home)?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let emitter = Emitter {
        out: tx,
        timestamps: profile.emits_timestamps(),
    };
    let proc = Arc::new(Mutex::new(Proc {
        shared,
        profile,
        store,
        initialized: false,
        experimental: false,
        threads: HashMap::new(),
        pending: HashMap::new(),
        next_server_request: 0,
    }));
    let _release = ReleaseOnDrop(proc.clone());
    let mut tasks = JoinSet::new();
    let mut input = FramedRead::new(reader, NdjsonCodec::new());
    let mut output = BufWriter::with_capacity(64 * 1024, writer);
    loop {
        tokio::select! {
            biased;
            out = rx.recv() => {
                let mut next = out;
                // Drain what is queued, then flush once.
                loop {
                    match next {
                        Some(Out::Line(line)) => {
                            output.write_all(line.as_bytes()).await?;
                            output.write_all(b"\n").await?;
                        }
                        Some(Out::Exit) | None => {
                            output.flush().await?;
                            return Ok(Ended::Fault);
                        }
                    }
                    match rx.try_recv() {
                        Ok(more) => next = Some(more),
                        Err(_) => break,
                    }
                }
                output.flush().await?;
            }
            frame = input.next() => match frame {
                // End of input: codex exits when its stdin closes.
                None => {
                    while let Ok(Out::Line(line)) = rx.try_recv() {
                        output.write_all(line.as_bytes()).await?;
                        output.write_all(b"\n").await?;
                    }
                    output.flush().await?;
                    return Ok(Ended::InputClosed);
                }
                Some(Err(e)) => return Err(e),
                // Codex ignores lines it cannot read; so does the fake.
                Some(Ok(Err(_))) => {}
                Some(Ok(Ok(message))) => handle_message(&proc, &emitter, &mut tasks, message),
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}

fn handle_message(proc: &ProcRef, emitter: &Emitter, tasks: &mut JoinSet<()>, message: Message) {
    match message {
        Message::Request(request) => {
            let id = serde_json::to_value(&request.id).unwrap_or(Value::Null);
            handle_request(
                proc,
                emitter,
                tasks,
                id,
                request.id,
                request.method,
                request.params,
            );
        }
        Message::Response(response) => {
            let key = response.id.to_string();
            if let Some(waiter) = lock(proc).pending.remove(&key) {
                let _ = waiter.send(response.result);
            }
        }
        Message::Error(error) => {
            if let Some(id) = error.id {
                if let Some(waiter) = lock(proc).pending.remove(&id.to_string()) {
                    let _ = waiter.send(json!({"error": error.error.message}));
                }
            }
        }
        // `initialized` and any other client notification need no answer.
        Message::Notification(_) => {}
    }
}

fn handle_request(
    proc: &ProcRef,
    emitter: &Emitter,
    tasks: &mut JoinSet<()>,
    id: Value,
    request_id: RequestId,
    method: String,
    params: Option<Value>,
) {
    let shared = lock(proc).shared.clone();
    let number = {
        let mut counters = lock(&shared.counters);
        counters.requests += 1;
        counters.requests
    };
    lock(&shared.requests).push(LoggedRequest {
        id: request_id,
        method: method.clone(),
        params: params.clone(),
    });
    let faults = lock(&shared.faults).faults.clone();
    if faults
        .iter()
        .any(|f| matches!(f, Fault::ExitAtRequest { n } if *n == number))
    {
        emitter.exit();
        return;
    }
    if !METHODS.contains(&method.as_str()) {
        let expected = METHODS
            .iter()
            .map(|m| format!("`{m}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let message =
            format!("Invalid request: unknown variant `{method}`, expected one of {expected}");
        emitter.respond(&id, Err((INVALID_REQUEST, message)));
        return;
    }
    let initialized = lock(proc).initialized;
    if method != "initialize" && !initialized {
        emitter.respond(&id, Err((INVALID_REQUEST, "Not initialized".into())));
        return;
    }
    for fault in &faults {
        match fault {
            Fault::GarbageLine { at_request } if *at_request == number => {
                emitter.line("this line is not json {".into());
            }
            Fault::OversizedLine { at_request, bytes } if *at_request == number => {
                let padding = "x".repeat(*bytes);
                emitter.notify("warning", json!({"threadId": null, "message": padding}));
            }
            _ => {}
        }
    }
    let answer_id = if faults
        .iter()
        .any(|f| matches!(f, Fault::WrongId { at_request } if *at_request == number))
    {
        match &id {
            Value::Number(n) => json!(n.as_i64().unwrap_or(0).wrapping_add(1000)),
            Value::String(s) => json!(format!("{s}-wrong")),
            other => other.clone(),
        }
    } else {
        id
    };
    for (index, fault) in faults.iter().enumerate() {
        if let Fault::Overloaded {
            method: only,
            attempts,
        } = fault
        {
            if only.as_deref().is_none_or(|m| m == method) {
                let mut counters = lock(&shared.counters);
                let used = counters.overloaded.entry(index).or_insert(0);
                if *used < *attempts {
                    *used += 1;
                    emitter.respond(&answer_id, Err((OVERLOADED, OVERLOADED_MESSAGE.into())));
                    return;
                }
            }
        }
    }
    let delay: u64 = faults
        .iter()
        .filter_map(|f| match f {
            Fault::Delay {
                method: only,
                millis,
            } if only.as_deref().is_none_or(|m| m == method) => Some(*millis),
            _ => None,
        })
        .sum();
    if delay > 0 {
        let proc = proc.clone();
        let emitter = emitter.clone();
        tasks.spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let mut tasks = JoinSet::new();
            dispatch(
                &proc, &emitter, &mut tasks, &answer_id, &method, params, &faults,
            );
            // A turn started after a delay runs to its end within this task.
            while tasks.join_next().await.is_some() {}
        });
        return;
    }
    dispatch(proc, emitter, tasks, &answer_id, &method, params, &faults);
}

fn dispatch(
    proc: &ProcRef,
    emitter: &Emitter,
    tasks: &mut JoinSet<()>,
    id: &Value,
    method: &str,
    params: Option<Value>,
    faults: &[Fault],
) {
    let Some(params) = params else {
        emitter.respond(id, Err(invalid("missing field `params`")));
        return;
    };
    let outcome = match method {
        "initialize" => initialize(&mut lock(proc), &params),
        "thread/start" => thread_start(&mut lock(proc), emitter, id, &params),
        "thread/resume" => thread_resume(&mut lock(proc), emitter, id, &params, faults),
        "thread/read" => thread_read(&mut lock(proc), emitter, &params),
        "thread/list" => thread_list(&mut lock(proc)),
        "turn/start" => turn_start(proc, emitter, tasks, id, &params, faults),
        "turn/interrupt" => turn_interrupt(&mut lock(proc), &params),
        _ => Err((
            METHOD_NOT_FOUND,
            format!("{method} is not served by the fake"),
        )),
    };
    match outcome {
        // `thread/start` answers by itself (its notification follows the response).
        // These answer by themselves (a notification follows the response), or, for
        // `turn/interrupt` on 0.144.6, not at all.
        Ok(Value::Null)
            if matches!(
                method,
                "thread/start" | "thread/resume" | "turn/start" | "turn/interrupt"
            ) => {}
        other => emitter.respond(id, other),
    }
}

fn invalid(detail: &str) -> (i64, String) {
    (INVALID_REQUEST, format!("Invalid request: {detail}"))
}

fn field_str(params: &Value, name: &str) -> Result<String, (i64, String)> {
    match params.get(name) {
        Some(Value::String(s)) => Ok(s.clone()),
        None | Some(Value::Null) => Err(invalid(&format!("missing field `{name}`"))),
        Some(other) => Err(invalid(&format!(
            "invalid type: {}, expected a string",
            kind_of(other)
        ))),
    }
}

fn field_bool(params: &Value, name: &str) -> Result<Option<bool>, (i64, String)> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(invalid(&format!(
            "invalid type: {}, expected a boolean",
            kind_of(other)
        ))),
    }
}

fn kind_of(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean `{b}`"),
        Value::Number(n) => format!("integer `{n}`"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "sequence".into(),
        Value::Object(_) => "map".into(),
    }
}

fn initialize(proc: &mut Proc, params: &Value) -> RpcResult {
    if proc.initialized {
        return Err((INVALID_REQUEST, "Already initialized".into()));
    }
    let info = params
        .get("clientInfo")
        .ok_or_else(|| invalid("missing field `clientInfo`"))?;
    let name = field_str(info, "name")?;
    let version = field_str(info, "version")?;
    proc.experimental = params
        .pointer("/capabilities/experimentalApi")
        .and_then(Value::as_bool)
        == Some(true);
    proc.initialized = true;
    Ok(json!({
        "userAgent": format!("{name}/{} (rethread fake {}; {version})", proc.profile.cli_version(), proc.profile),
        "codexHome": proc.store.home(),
        "platformFamily": "unix",
        "platformOs": "linux",
    }))
}

impl Proc {
    fn thread_json(&self, meta: &ThreadMeta, turns: Option<&[TurnRecord]>, loaded: bool) -> Value {
        let mut thread = json!({
            "id": meta.id,
            "sessionId": meta.id,
            "forkedFromId": null,
            "parentThreadId": null,
            "preview": meta.preview,
            "ephemeral": false,
            "modelProvider": "mock",
            "model": "mock-model",
            "createdAt": meta.created_ms / 1000,
            "updatedAt": meta.updated_ms / 1000,
            "status": {"type": if loaded { "idle" } else { "notLoaded" }},
            "path": meta.path,
            "cwd": meta.cwd,
            "cliVersion": meta.cli_version,
            "source": "vscode",
            "name": null,
            "turns": turns.unwrap_or_default().iter().map(turn_json).collect::<Vec<_>>(),
        });
        if self.profile.has_history_mode() {
            thread["historyMode"] = json!(meta.history_mode.as_str());
        }
        if self.profile == Profile::Current {
            thread["projectId"] = Value::Null;
        }
        thread
    }

    fn thread_response(&self, loaded: &Loaded, include_turns: bool) -> Value {
        let turns = include_turns.then_some(loaded.turns.as_slice());
        json!({
            "thread": self.thread_json(&loaded.meta, turns, true),
            "model": "mock-model",
            "modelProvider": "mock",
            "cwd": loaded.meta.cwd,
            "approvalPolicy": "never",
            "approvalsReviewer": "user",
            "sandbox": {"type": "readOnly", "networkAccess": false},
            "reasoningEffort": null,
        })
    }

    fn lock_writer(&self, id: &str) -> Result<Option<File>, (i64, String)> {
        if !self.profile.has_writer_lock() {
            return Ok(None);
        }
        match store::try_lock_writer(self.store.home(), id) {
            Ok(Some(file)) => Ok(Some(file)),
            Ok(None) => Err((
                INVALID_REQUEST,
                format!("thread {id} already has an active writer"),
            )),
            Err(e) => Err((INTERNAL_ERROR, format!("failed to lock thread {id}: {e}"))),
        }
    }
}

fn turn_json(turn: &TurnRecord) -> Value {
    let mut items = vec![json!({
        "type": "userMessage",
        "id": format!("{}-user", turn.id),
        "content": [{"type": "text", "text": turn.user_text, "text_elements": []}],
    })];
    if let Some(text) = &turn.agent_text {
        items.push(agent_item(&turn.id, text));
    }
    json!({
        "id": turn.id,
        "items": items,
        "itemsView": "full",
        "status": turn.status,
        "error": null,
        "startedAt": turn.started_ms / 1000,
        "completedAt": turn.completed_ms / 1000,
        "durationMs": turn.completed_ms.saturating_sub(turn.started_ms),
    })
}

fn agent_item(turn_id: &str, text: &str) -> Value {
    json!({"type": "agentMessage", "id": format!("{turn_id}-agent"), "text": text, "phase": null})
}

fn thread_start(proc: &mut Proc, emitter: &Emitter, id: &Value, params: &Value) -> RpcResult {
    let requested = match params.get("historyMode") {
        None | Some(Value::Null) => None,
        Some(Value::String(mode)) => match HistoryMode::parse(mode) {
            HistoryMode::Unknown(other) => {
                return Err(invalid(&format!(
                    "unknown variant `{other}`, expected `legacy` or `paginated`"
                )))
            }
            known => Some(known),
        },
        Some(other) => {
            return Err(invalid(&format!(
                "invalid type: {}, expected a string",
                kind_of(other)
            )))
        }
    };
    if requested.is_some() && !proc.experimental {
        return Err((
            INVALID_REQUEST,
            "thread/start.historyMode requires experimentalApi capability".into(),
        ));
    }
    let mode = requested.unwrap_or_else(|| proc.profile.default_history_mode());
    if mode == HistoryMode::Paginated && !proc.profile.serves_paginated() {
        return Err((
            METHOD_NOT_FOUND,
            "paginated_threads is not supported yet".into(),
        ));
    }
    let cwd = match params.get("cwd").and_then(Value::as_str) {
        Some(cwd) => cwd.to_string(),
        None => std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_default(),
    };
    let thread_id = new_id();
    let created_ms = now_ms();
    let meta = ThreadMeta {
        path: proc.store.rollout_path_for(&thread_id, created_ms),
        id: thread_id.clone(),
        history_mode: mode,
        cwd,
        created_ms,
        updated_ms: created_ms,
        preview: String::new(),
        cli_version: proc.profile.cli_version().to_string(),
        developer_instructions: params
            .get("developerInstructions")
            .and_then(Value::as_str)
            .map(str::to_string),
    };
    let writer_lock = proc.lock_writer(&thread_id)?;
    let loaded = Loaded {
        meta,
        turns: Vec::new(),
        materialized: false,
        _writer_lock: writer_lock,
        active: None,
        interrupted: None,
    };
    let response = proc.thread_response(&loaded, false);
    let thread = response["thread"].clone();
    proc.threads.insert(thread_id, loaded);
    emitter.respond(id, Ok(response));
    emitter.notify("thread/started", json!({"thread": thread}));
    Ok(Value::Null)
}

fn no_rollout_error(id: &str) -> (i64, String) {
    (
        INVALID_REQUEST,
        format!("no rollout found for thread id {id}"),
    )
}

fn paginated_unsupported() -> (i64, String) {
    (
        METHOD_NOT_FOUND,
        "paginated_threads is not supported yet".into(),
    )
}

/// Answers `thread/resume`. Like codex, a successful resume is followed by the thread's status
/// (when it was not loaded yet) and its restored token usage (when it has turns).
fn thread_resume(
    proc: &mut Proc,
    emitter: &Emitter,
    id: &Value,
    params: &Value,
    faults: &[Fault],
) -> RpcResult {
    let (response, newly_loaded, last_turn) = resume(proc, params, faults)?;
    let thread_id = response["thread"]["id"].clone();
    emitter.respond(id, Ok(response));
    if newly_loaded {
        emitter.notify(
            "thread/status/changed",
            json!({"threadId": thread_id, "status": {"type": "idle"}}),
        );
    }
    if let Some(turn_id) = last_turn {
        let usage = json!({"totalTokens": 2, "inputTokens": 1, "cachedInputTokens": 0,
                           "outputTokens": 1, "reasoningOutputTokens": 0});
        emitter.notify(
            "thread/tokenUsage/updated",
            json!({"threadId": thread_id, "turnId": turn_id,
                   "tokenUsage": {"total": usage, "last": usage, "modelContextWindow": 258400}}),
        );
    }
    Ok(Value::Null)
}

/// Resumes a thread: the response, whether it was newly loaded, and its last turn's id.
fn resume(
    proc: &mut Proc,
    params: &Value,
    faults: &[Fault],
) -> Result<(Value, bool, Option<String>), (i64, String)> {
    let thread_id = field_str(params, "threadId")?;
    let exclude = field_bool(params, "excludeTurns")?;
    if exclude.is_some() && proc.profile.exclude_turns_is_experimental() && !proc.experimental {
        return Err((
            INVALID_REQUEST,
            "thread/resume.excludeTurns requires experimentalApi capability".into(),
        ));
    }
    let include_turns = exclude != Some(true);
    for fault in faults {
        if let Fault::FailResume {
            thread_ids,
            code,
            message,
        } = fault
        {
            if thread_ids.contains(&thread_id) {
                let message = match message {
                    Some(m) => m.replace("<id>", &thread_id),
                    None => format!("no rollout found for thread id {thread_id}"),
                };
                return Err((*code, message));
            }
        }
    }
    check_uuid(&thread_id).map_err(|e| (INVALID_REQUEST, format!("invalid session id: {e}")))?;
    if let Some(loaded) = proc.threads.get(&thread_id) {
        if !loaded.materialized {
            return Err(no_rollout_error(&thread_id));
        }
        // Resuming a loaded thread still checks its rollout: one deleted under a running
        // server is gone for resume (0.169.0 words it as a broken history lineage).
        if !loaded.meta.path.is_file() {
            return Err(match proc.profile {
                Profile::Current => (
                    INVALID_REQUEST,
                    format!(
                        "invalid paginated history lineage for {thread_id}: missing source rollout"
                    ),
                ),
                _ => no_rollout_error(&thread_id),
            });
        }
        if loaded.meta.history_mode == HistoryMode::Paginated && !proc.profile.serves_paginated() {
            return Err(paginated_unsupported());
        }
        return Ok((
            proc.thread_response(loaded, include_turns),
            false,
            loaded.turns.last().map(|t| t.id.clone()),
        ));
    }
    let path = proc
        .store
        .find_rollout(&thread_id, proc.profile != Profile::Current)
        .map_err(internal)?
        .ok_or_else(|| no_rollout_error(&thread_id))?;
    let rollout = match store::read_rollout(&path) {
        Ok(rollout) => rollout,
        Err(ReadError::Missing) => return Err(no_rollout_error(&thread_id)),
        Err(e) => return Err((INTERNAL_ERROR, e.message(&path, proc.profile, true))),
    };
    let _ = proc
        .store
        .reconcile_mode(&thread_id, &rollout.meta.history_mode);
    if rollout.meta.history_mode == HistoryMode::Paginated && !proc.profile.serves_paginated() {
        return Err(paginated_unsupported());
    }
    let writer_lock = proc.lock_writer(&thread_id)?;
    let mut meta = rollout.meta;
    if let Ok(Some(row)) = proc.store.row(&thread_id) {
        meta.created_ms = row.created_ms;
        meta.updated_ms = row.updated_ms;
    }
    let loaded = Loaded {
        meta,
        turns: rollout.turns,
        materialized: true,
        _writer_lock: writer_lock,
        active: None,
        interrupted: None,
    };
    let response = proc.thread_response(&loaded, include_turns);
    let last_turn = loaded.turns.last().map(|t| t.id.clone());
    proc.threads.insert(thread_id, loaded);
    Ok((response, true, last_turn))
}

fn internal(e: io::Error) -> (i64, String) {
    (INTERNAL_ERROR, e.to_string())
}

fn thread_read(proc: &mut Proc, emitter: &Emitter, params: &Value) -> RpcResult {
    let thread_id = field_str(params, "threadId")?;
    let include_turns = field_bool(params, "includeTurns")?.unwrap_or(false);
    check_uuid(&thread_id).map_err(|e| (INVALID_REQUEST, format!("invalid thread id: {e}")))?;
    let not_loaded = || (INVALID_REQUEST, format!("thread not loaded: {thread_id}"));
    let paginated_check = |mode: &HistoryMode, materialized: bool| -> Result<(), (i64, String)> {
        if include_turns && *mode == HistoryMode::Paginated {
            if !proc.profile.serves_paginated() {
                return Err(paginated_unsupported());
            }
            if !materialized {
                return Err((METHOD_NOT_FOUND, "list_turns is not supported yet".into()));
            }
        }
        Ok(())
    };
    if let Some(loaded) = proc.threads.get(&thread_id) {
        paginated_check(&loaded.meta.history_mode, loaded.materialized)?;
        if include_turns && loaded.meta.history_mode == HistoryMode::Paginated {
            deprecation_notice(emitter);
        }
        let turns = include_turns.then_some(loaded.turns.as_slice());
        return Ok(json!({"thread": proc.thread_json(&loaded.meta, turns, true)}));
    }
    let row = proc.store.row(&thread_id).map_err(internal)?;
    // 0.169.0 reads an indexed thread at its indexed path; 0.144.6 also finds a moved rollout.
    let path = match &row {
        Some(row) if row.path.is_file() || proc.profile == Profile::Current => row.path.clone(),
        Some(row) => proc
            .store
            .find_rollout(&thread_id, true)
            .map_err(internal)?
            .unwrap_or_else(|| row.path.clone()),
        None => proc
            .store
            .find_rollout(&thread_id, true)
            .map_err(internal)?
            .ok_or_else(not_loaded)?,
    };
    match store::read_rollout(&path) {
        Ok(rollout) => {
            let _ = proc
                .store
                .reconcile_mode(&thread_id, &rollout.meta.history_mode);
            paginated_check(&rollout.meta.history_mode, true)?;
            if include_turns && rollout.meta.history_mode == HistoryMode::Paginated {
                deprecation_notice(emitter);
            }
            let mut meta = rollout.meta;
            if let Some(row) = &row {
                meta.created_ms = row.created_ms;
                meta.updated_ms = row.updated_ms;
            }
            let turns = include_turns.then_some(rollout.turns.as_slice());
            Ok(json!({"thread": proc.thread_json(&meta, turns, false)}))
        }
        // 0.169.0 answers a metadata-only read from its index when the rollout is gone;
        // 0.144.6 treats the thread as unknown.
        Err(ReadError::Missing) => match row {
            Some(row) if proc.profile == Profile::Current => {
                if include_turns {
                    return Err((
                        INVALID_REQUEST,
                        format!("invalid paginated history lineage for {thread_id}: missing source rollout"),
                    ));
                }
                let meta = ThreadMeta {
                    id: row.id,
                    history_mode: HistoryMode::parse(&row.history_mode),
                    cwd: row.cwd,
                    created_ms: row.created_ms,
                    updated_ms: row.updated_ms,
                    preview: row.preview,
                    path: row.path,
                    cli_version: row.cli_version,
                    developer_instructions: None,
                };
                Ok(json!({"thread": proc.thread_json(&meta, None, false)}))
            }
            _ => Err(not_loaded()),
        },
        Err(e) => Err((INTERNAL_ERROR, e.message(&path, proc.profile, false))),
    }
}

fn deprecation_notice(emitter: &Emitter) {
    emitter.notify(
        "deprecationNotice",
        json!({"summary": "Full-history hydration is deprecated for paginated threads; omit \
               `includeTurns` or set it to `false`, then page with `thread/turns/list` and \
               `thread/items/list`.", "details": null}),
    );
}

/// Lists the threads whose rollout can be read, wherever under `sessions/` it lies (codex
/// finds a rollout moved to another day's folder), most recently updated first.
fn thread_list(proc: &mut Proc) -> RpcResult {
    let rows: HashMap<String, store::Row> = proc
        .store
        .rows()
        .map_err(internal)?
        .into_iter()
        .map(|row| (row.id.clone(), row))
        .collect();
    let mut listed = Vec::new();
    for path in store::all_rollouts(&proc.store.home().join("sessions")) {
        // A thread whose rollout cannot be read (empty, garbage, unknown mode) is left out:
        // never listed with a guessed mode.
        let Ok(rollout) = store::read_rollout(&path) else {
            continue;
        };
        let mut meta = rollout.meta;
        if let Some(row) = rows.get(&meta.id) {
            let _ = proc.store.reconcile_mode(&meta.id, &meta.history_mode);
            meta.created_ms = row.created_ms;
            meta.updated_ms = row.updated_ms;
        }
        listed.push(meta);
    }
    listed.sort_by(|a, b| {
        b.updated_ms
            .cmp(&a.updated_ms)
            .then_with(|| b.id.cmp(&a.id))
    });
    listed.dedup_by(|a, b| a.id == b.id);
    let data: Vec<Value> = listed
        .iter()
        .map(|meta| proc.thread_json(meta, None, proc.threads.contains_key(&meta.id)))
        .collect();
    let mut result = json!({"data": data, "nextCursor": null, "backwardsCursor": null});
    if proc.profile == Profile::Current {
        result["readStates"] = json!({});
    }
    Ok(result)
}

/// Answers `turn/interrupt`. After an interrupt, 0.144.6 keeps the interrupted turn as its
/// "active" one: an interrupt naming that turn is never answered (observed: the request stays
/// pending; `Ok(Value::Null)` means no answer) and one naming another turn is refused with
/// `expected active turn id <given> but found <interrupted>`.
fn turn_interrupt(proc: &mut Proc, params: &Value) -> RpcResult {
    let thread_id = field_str(params, "threadId")?;
    let turn_id = field_str(params, "turnId")?;
    let profile = proc.profile;
    let Some(thread) = proc.threads.get_mut(&thread_id) else {
        return Err((INVALID_REQUEST, "no active turn to interrupt".into()));
    };
    if let Some(interrupt) = thread.active.as_mut().and_then(|a| a.interrupt.take()) {
        let _ = interrupt.send(());
        return Ok(json!({}));
    }
    if let (false, Some(stale)) = (profile == Profile::Current, &thread.interrupted) {
        if *stale == turn_id {
            return Ok(Value::Null);
        }
        return Err((
            INVALID_REQUEST,
            format!("expected active turn id {turn_id} but found {stale}"),
        ));
    }
    Err((INVALID_REQUEST, "no active turn to interrupt".into()))
}

fn input_text(params: &Value) -> Result<String, (i64, String)> {
    let input = params
        .get("input")
        .ok_or_else(|| invalid("missing field `input`"))?;
    let items = input
        .as_array()
        .ok_or_else(|| invalid("invalid type: expected a sequence"))?;
    Ok(items
        .iter()
        .filter_map(|item| item.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n"))
}

fn turn_start(
    proc_ref: &ProcRef,
    emitter: &Emitter,
    tasks: &mut JoinSet<()>,
    id: &Value,
    params: &Value,
    faults: &[Fault],
) -> RpcResult {
    let thread_id = field_str(params, "threadId")?;
    let text = input_text(params)?;
    let mut proc = lock(proc_ref);
    let turn_id = new_id();
    let (interrupt_tx, interrupt_rx) = oneshot::channel();
    {
        let Some(loaded) = proc.threads.get_mut(&thread_id) else {
            return Err((INVALID_REQUEST, format!("thread not found: {thread_id}")));
        };
        if loaded.active.is_some() {
            return Err((
                INVALID_REQUEST,
                format!("thread {thread_id} already has an active turn"),
            ));
        }
        loaded.interrupted = None;
        loaded.active = Some(ActiveTurn {
            interrupt: Some(interrupt_tx),
        });
    }
    let number = {
        let mut counters = lock(&proc.shared.counters);
        counters.turns += 1;
        counters.turns
    };
    // The rollout appears when the first turn runs, starting with its `session_meta`.
    let profile = proc.profile;
    if let Some(loaded) = proc.threads.get_mut(&thread_id) {
        if !loaded.materialized {
            loaded.materialized = true;
            let meta = loaded.meta.clone();
            if let Err(e) = proc.store.create_rollout(&meta, profile) {
                tracing::warn!("fake app-server: cannot write rollout: {e}");
            }
        }
    }
    drop(proc);
    emitter.respond(
        id,
        Ok(json!({"turn": {"id": turn_id, "items": [], "itemsView": "notLoaded", "status": "inProgress",
                   "error": null, "startedAt": null, "completedAt": null, "durationMs": null}})),
    );
    let run = TurnRun {
        proc: proc_ref.clone(),
        emitter: emitter.clone(),
        thread_id,
        turn_id,
        text,
        number,
        faults: faults.to_vec(),
        profile,
    };
    tasks.spawn(run.run(interrupt_rx));
    Ok(Value::Null)
}

struct TurnRun {
    proc: ProcRef,
    emitter: Emitter,
    thread_id: String,
    turn_id: String,
    text: String,
    number: u64,
    faults: Vec<Fault>,
    profile: Profile,
}

impl TurnRun {
    fn has(&self, check: impl Fn(&Fault) -> bool) -> bool {
        self.faults.iter().any(check)
    }

    async fn run(self, mut interrupt: oneshot::Receiver<()>) {
        let started_ms = now_ms();
        let n = self.number;
        if self.has(|f| matches!(f, Fault::ForeignNotifications { turn } if *turn == n)) {
            self.foreign_notifications();
        }
        let e = &self.emitter;
        let (thread, turn) = (&self.thread_id, &self.turn_id);
        e.notify(
            "thread/status/changed",
            json!({"threadId": thread, "status": {"type": "active", "activeFlags": []}}),
        );
        e.notify(
            "turn/started",
            json!({"threadId": thread, "turn": {"id": turn, "items": [], "itemsView": "notLoaded",
                   "status": "inProgress", "error": null, "startedAt": started_ms / 1000,
                   "completedAt": null, "durationMs": null}}),
        );
        let user_item = json!({"type": "userMessage", "id": format!("{turn}-user"),
                               "content": [{"type": "text", "text": self.text, "text_elements": []}]});
        e.notify(
            "item/started",
            json!({"item": user_item, "threadId": thread, "turnId": turn, "startedAtMs": now_ms()}),
        );
        e.notify(
            "item/completed",
            json!({"item": user_item, "threadId": thread, "turnId": turn, "completedAtMs": now_ms()}),
        );
        if self.has(|f| matches!(f, Fault::ExitMidTurn { turn } if *turn == n)) {
            e.exit();
            return;
        }
        let mut interrupted = false;
        if self.has(|f| matches!(f, Fault::Approval { turn } if *turn == n)) {
            let (answer_tx, answer_rx) = oneshot::channel();
            let request_id = {
                let mut proc = lock(&self.proc);
                let request_id = proc.next_server_request;
                proc.next_server_request += 1;
                proc.pending.insert(request_id.to_string(), answer_tx);
                request_id
            };
            // Like codex: the thread waits on the approval, the command item starts, the
            // request goes out; once answered the request is resolved, the item completes
            // (declined unless accepted), the thread is active again and the model's tool-call
            // response is accounted.
            let item_id = format!("{turn}-exec");
            let command = "/bin/bash -lc 'echo approved'";
            let actions = json!([{"type": "unknown", "command": "echo approved"}]);
            e.notify(
                "thread/status/changed",
                json!({"threadId": thread, "status": {"type": "active", "activeFlags": ["waitingOnApproval"]}}),
            );
            let exec_item = json!({"type": "commandExecution", "id": item_id, "command": command,
                                   "commandActions": actions, "cwd": "/", "status": "inProgress"});
            e.notify(
                "item/started",
                json!({"item": exec_item, "threadId": thread, "turnId": turn, "startedAtMs": now_ms()}),
            );
            e.line(
                json!({"id": request_id, "method": "item/commandExecution/requestApproval",
                       "params": {"kind": "command", "threadId": thread, "turnId": turn,
                                  "itemId": item_id, "startedAtMs": now_ms(),
                                  "reason": "rethread test approval", "command": command,
                                  "cwd": "/", "commandActions": actions,
                                  "availableDecisions": ["accept", "cancel"]}})
                .to_string(),
            );
            tokio::select! {
                answer = answer_rx => {
                    e.notify("serverRequest/resolved", json!({"threadId": thread, "requestId": request_id}));
                    let decision = answer.ok().and_then(|a| a.get("decision").cloned()).unwrap_or(Value::Null);
                    let status = if decision == json!("accept") || decision == json!("acceptForSession") { "completed" } else { "declined" };
                    let item = json!({"type": "commandExecution", "id": item_id, "command": command,
                                      "commandActions": actions, "cwd": "/", "status": status});
                    e.notify("item/completed", json!({"item": item, "threadId": thread, "turnId": turn, "completedAtMs": now_ms()}));
                    e.notify(
                        "thread/status/changed",
                        json!({"threadId": thread, "status": {"type": "active", "activeFlags": []}}),
                    );
                    e.notify("thread/tokenUsage/updated", token_usage(thread, turn));
                }
                _ = &mut interrupt => interrupted = true,
            }
        }
        let slow: u64 = self
            .faults
            .iter()
            .map(|f| {
                if let Fault::SlowTurn { millis } = f {
                    *millis
                } else {
                    0
                }
            })
            .sum();
        if !interrupted && slow > 0 {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(slow)) => {}
                _ = &mut interrupt => interrupted = true,
            }
        }
        let reply = if interrupted {
            None
        } else {
            Some(self.ask_model())
        };
        if let Some(text) = &reply {
            let item = agent_item(turn, text);
            e.notify(
                "item/started",
                json!({"item": item, "threadId": thread, "turnId": turn, "startedAtMs": now_ms()}),
            );
            e.notify(
                "item/completed",
                json!({"item": item, "threadId": thread, "turnId": turn, "completedAtMs": now_ms()}),
            );
            let usage = json!({"totalTokens": 2, "inputTokens": 1, "cachedInputTokens": 0,
                               "outputTokens": 1, "reasoningOutputTokens": 0});
            e.notify(
                "thread/tokenUsage/updated",
                json!({"threadId": thread, "turnId": turn,
                       "tokenUsage": {"total": usage, "last": usage, "modelContextWindow": 258400}}),
            );
            e.notify(
                "account/rateLimits/updated",
                json!({"rateLimits": {"limitId": "codex", "primary": null, "secondary": null}}),
            );
        }
        let status = if interrupted {
            "interrupted"
        } else {
            "completed"
        };
        let completed_ms = now_ms();
        let record = TurnRecord {
            id: turn.clone(),
            user_text: self.text.clone(),
            agent_text: reply.clone(),
            status: status.into(),
            started_ms,
            completed_ms,
        };
        self.persist(&record);
        e.notify(
            "thread/status/changed",
            json!({"threadId": thread, "status": {"type": "idle"}}),
        );
        let (items, view) = match (&reply, self.profile) {
            (Some(text), Profile::Current) => (vec![agent_item(turn, text)], "summary"),
            _ => (Vec::new(), "notLoaded"),
        };
        e.notify(
            "turn/completed",
            json!({"threadId": thread, "turn": {"id": turn, "items": items, "itemsView": view,
                   "status": status, "error": null, "startedAt": started_ms / 1000,
                   "completedAt": completed_ms / 1000,
                   "durationMs": completed_ms.saturating_sub(started_ms)}}),
        );
    }

    /// Builds the conversation the model sees (the thread's whole history plus this turn's
    /// message), records it, and returns the model's reply.
    fn ask_model(&self) -> String {
        let proc = lock(&self.proc);
        let mut conversation = Vec::new();
        if let Some(loaded) = proc.threads.get(&self.thread_id) {
            if let Some(instructions) = &loaded.meta.developer_instructions {
                conversation.push(ConversationMessage {
                    role: "developer".into(),
                    text: instructions.clone(),
                });
            }
            for turn in &loaded.turns {
                conversation.push(ConversationMessage {
                    role: "user".into(),
                    text: turn.user_text.clone(),
                });
                if let Some(text) = &turn.agent_text {
                    conversation.push(ConversationMessage {
                        role: "assistant".into(),
                        text: text.clone(),
                    });
                }
            }
        }
        conversation.push(ConversationMessage {
            role: "user".into(),
            text: self.text.clone(),
        });
        let shared = proc.shared.clone();
        drop(proc);
        let reply = lock(&shared.reply).next_reply(&conversation);
        let request = ModelRequest {
            thread_id: self.thread_id.clone(),
            turn_id: self.turn_id.clone(),
            conversation,
            reply: reply.clone(),
        };
        if let Some(path) = &shared.model_log {
            if let Ok(mut line) = serde_json::to_string(&request) {
                line.push('\n');
                use std::io::Write;
                let _ = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .and_then(|mut f| f.write_all(line.as_bytes()));
            }
        }
        lock(&shared.model).push(request);
        reply
    }

    fn persist(&self, record: &TurnRecord) {
        let mut proc = lock(&self.proc);
        let Some(loaded) = proc.threads.get_mut(&self.thread_id) else {
            return;
        };
        loaded.active = None;
        if loaded.turns.is_empty() {
            loaded.meta.preview = record.user_text.clone();
        }
        loaded.meta.updated_ms = record.completed_ms;
        if record.status == "interrupted" {
            loaded.interrupted = Some(record.id.clone());
        }
        loaded.turns.push(record.clone());
        let meta = loaded.meta.clone();
        if let Err(e) = proc.store.append_turn(&meta, record) {
            tracing::warn!("fake app-server: cannot append to rollout: {e}");
        }
        let n = self.number;
        for fault in &self.faults {
            if let Fault::CorruptRollout {
                after_turn,
                corruption,
            } = fault
            {
                if *after_turn == n {
                    let _ = corruption.apply(&meta.path);
                }
            }
        }
    }

    fn foreign_notifications(&self) {
        let other = new_id();
        let turn = new_id();
        let e = &self.emitter;
        e.notify(
            "turn/started",
            json!({"threadId": other, "turn": {"id": turn, "items": [], "status": "inProgress"}}),
        );
        let item = agent_item(&turn, "not for you");
        e.notify(
            "item/completed",
            json!({"item": item, "threadId": other, "turnId": turn, "completedAtMs": now_ms()}),
        );
        e.notify(
            "turn/completed",
            json!({"threadId": other, "turn": {"id": turn, "items": [item], "status": "completed"}}),
        );
    }
}
