//! The fake `codex app-server`: the builder, the test's handle, and the state that survives a
//! restart.
//!
//! - `process`: one server "process" per connection: the select loop over input lines, the
//!   outgoing queue and the turn tasks; request faults; dispatch by method.
//! - `threads`: `thread/start`, `thread/resume`, `thread/read`.
//! - `list`: `thread/list`, one page at a time.
//! - `turns`: `turn/start` (the turn task, the model) and `turn/interrupt`.
//! - `params`: request parameters read with codex's error wording, and [`Answer`]-typed
//!   handler results.

mod list;
mod params;
mod process;
mod threads;
mod turns;

use process::run_process;

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rethread_protocol::RequestId;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream};
use tokio::task::JoinHandle;

use crate::faults::{Corruption, FaultScript};
use crate::model::{AnswerShape, ConversationMessage, Reply};
use crate::profile::Profile;
use crate::store::Store;
use crate::util::TempHome;

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
    answer: AnswerShape,
    model_log: Option<PathBuf>,
    event_log: Option<PathBuf>,
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

    /// How the model delivers its answer (default [`AnswerShape::Streamed`]); the turn's
    /// notifications follow it as codex's do.
    pub fn answer(mut self, shape: AnswerShape) -> Self {
        self.answer = shape;
        self
    }

    /// Also append every model request, as a JSON line, to this file (the binary writes
    /// `$CODEX_HOME/fake-model-requests.jsonl`).
    pub fn model_log(mut self, path: impl Into<PathBuf>) -> Self {
        self.model_log = Some(path.into());
        self
    }

    /// Also append one line per event to this file, `<unix ms> <event>`: `request <method>` when
    /// a request arrives, `turn-done <thread>` once a turn's reply is decided (before the turn
    /// is written and `turn/completed` sent). A harness that kills the client reads from it how
    /// far the turn got (the binary writes it when `FAKE_CODEX_EVENT_LOG` names a file).
    pub fn event_log(mut self, path: impl Into<PathBuf>) -> Self {
        self.event_log = Some(path.into());
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
            answer: Mutex::new(self.answer),
            counters: Mutex::new(Counters::default()),
            requests: Mutex::new(Vec::new()),
            model: Mutex::new(Vec::new()),
            model_log: self.model_log,
            event_log: self.event_log,
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
    answer: Mutex<AnswerShape>,
    counters: Mutex<Counters>,
    requests: Mutex<Vec<LoggedRequest>>,
    model: Mutex<Vec<ModelRequest>>,
    model_log: Option<PathBuf>,
    event_log: Option<PathBuf>,
}

impl Shared {
    /// Appends `<unix ms> <event>` to the event log, if there is one (best effort: a log that
    /// cannot be written must not change what the fake answers).
    fn log_event(&self, event: &str) {
        if let Some(path) = &self.event_log {
            use std::io::Write;
            let line = format!("{} {event}\n", crate::util::now_ms());
            let _ = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| f.write_all(line.as_bytes()));
        }
    }
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

    /// Changes how the model delivers its answers, from the next turn on.
    pub fn set_answer(&self, shape: AnswerShape) {
        *lock(&self.shared.answer) = shape;
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
