//! A harness for driving the **real** `codex app-server` (and anything that speaks like it,
//! such as the `fake-codex` binary) from tests.
//!
//! - [`find_codex`] / [`codex_or_skip`]: locate a release's binary. `cargo xtask ci` sets
//!   `RETHREAD_CODEX_<version>` (dots as underscores) for every supported release; otherwise the binary is looked up
//!   under `target/codex/<version>/` in the workspace (`cargo xtask codex --version V` installs
//!   it). When it is missing a test skips with a message, unless `RETHREAD_REQUIRE_REAL_CODEX=1`
//!   or `CI=true`, in which case it fails.
//! - [`CodexHome`]: a temporary `CODEX_HOME` with the offline `config.toml` pointing at a
//!   [`ResponsesStandIn`].
//! - [`AppServerProcess`]: `codex app-server` spawned with `CODEX_HOME` set, spoken to through
//!   a [`WirePeer`] (newline-delimited JSON, raw [`serde_json::Value`]s so nothing the server
//!   sends is lost to decoding).
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use rethread_testkit::real::{codex_or_skip, AppServerProcess, CodexHome};
//! use rethread_testkit::responses::ResponsesStandIn;
//! use rethread_testkit::CURRENT;
//! let Some(codex) = codex_or_skip(CURRENT) else { return Ok(()) };
//! let model = ResponsesStandIn::start()?;
//! let home = CodexHome::new(&model)?;
//! let mut server = AppServerProcess::spawn(&codex, home.path()).await?;
//! server.peer.initialize(false).await?;
//! let started = server.peer.request("thread/start", Some(serde_json::json!({"cwd": "/tmp"}))).await?;
//! # Ok(()) }
//! ```

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::responses::{offline_config_toml, ResponsesStandIn};

/// How long a [`WirePeer`] waits for one message before giving up.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The workspace root (two levels above this crate's manifest).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Canonical, so a crate reached through a symlink still finds the real workspace.
    let manifest = manifest
        .canonicalize()
        .unwrap_or_else(|_| manifest.to_path_buf());
    manifest
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The environment variable naming the binary of `version`, e.g. `RETHREAD_CODEX_0_169_0`.
pub fn env_var_for(version: &str) -> String {
    format!("RETHREAD_CODEX_{}", version.replace('.', "_"))
}

/// Where `cargo xtask codex --version V` installs the binary.
pub fn installed_path(version: &str) -> PathBuf {
    workspace_root()
        .join("target")
        .join("codex")
        .join(version)
        .join("node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex")
}

/// Locates the pinned codex `version`: the env var first, then the workspace install.
/// The error says why it was not found and how to install it.
pub fn find_codex(version: &str) -> Result<PathBuf, String> {
    let var = env_var_for(version);
    if let Some(path) = std::env::var_os(&var) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{var}={} does not name a file", path.display()))
        };
    }
    let path = installed_path(version);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "codex {version} not found: {var} is unset and {} does not exist \
             (run `cargo xtask codex --version {version}`)",
            path.display()
        ))
    }
}

/// True when a missing real codex must fail the test (`RETHREAD_REQUIRE_REAL_CODEX=1` or
/// `CI=true`).
pub fn real_codex_required() -> bool {
    std::env::var("RETHREAD_REQUIRE_REAL_CODEX").is_ok_and(|v| v == "1")
        || std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The binary of `version`, or `None` after printing why the test is skipped.
///
/// # Panics
/// When the binary is missing and [`real_codex_required`] holds: a CI run must never skip
/// silently.
pub fn codex_or_skip(version: &str) -> Option<PathBuf> {
    match find_codex(version) {
        Ok(path) => Some(path),
        Err(why) if real_codex_required() => {
            panic!("real codex required (RETHREAD_REQUIRE_REAL_CODEX=1 or CI=true): {why}")
        }
        Err(why) => {
            eprintln!("skipping: {why}");
            None
        }
    }
}

/// A temporary `CODEX_HOME` holding the offline `config.toml`. Removed on drop.
#[derive(Debug)]
pub struct CodexHome {
    dir: tempfile::TempDir,
}

impl CodexHome {
    /// A new home whose model provider is `model`.
    pub fn new(model: &ResponsesStandIn) -> io::Result<Self> {
        Self::with_base_url(&model.base_url())
    }

    /// A new home whose model provider is the Responses API at `base_url`.
    pub fn with_base_url(base_url: &str) -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("rethread-codex-home")
            .tempdir()?;
        write_offline_config(dir.path(), base_url)?;
        Ok(CodexHome { dir })
    }

    /// The directory to pass as `CODEX_HOME`.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Switches the offline `config.toml` in `codex_home` from `approval_policy = "never"` to
/// `"on-request"`, so that an escalated command asks the client to approve it.
pub fn ask_for_approvals(codex_home: &Path) -> io::Result<()> {
    let config = codex_home.join("config.toml");
    let text = std::fs::read_to_string(&config)?;
    std::fs::write(
        &config,
        text.replace(
            "approval_policy = \"never\"",
            "approval_policy = \"on-request\"",
        ),
    )
}

/// Runs `<codex> app-server generate-json-schema` into a new temporary directory (with a
/// throwaway `CODEX_HOME`) and returns it: the schema the pinned binary itself publishes.
pub fn generate_json_schema(codex: &Path) -> io::Result<tempfile::TempDir> {
    let out = tempfile::tempdir()?;
    let home = tempfile::tempdir()?;
    let status = std::process::Command::new(codex)
        .args(["app-server", "generate-json-schema", "--out"])
        .arg(out.path())
        .env("CODEX_HOME", home.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if status.success() {
        Ok(out)
    } else {
        Err(io::Error::other(format!(
            "generate-json-schema failed with {status}"
        )))
    }
}

/// Every rollout file under `<home>/sessions` (`rollout-*.jsonl`, any day folder), sorted.
pub fn rollout_files(home: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path
                .file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with("rollout-"))
            {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&home.join("sessions"), &mut out);
    out.sort();
    out
}

/// Writes the offline `config.toml` (model provider at `base_url`) into `home`.
pub fn write_offline_config(home: &Path, base_url: &str) -> io::Result<()> {
    std::fs::create_dir_all(home)?;
    std::fs::write(home.join("config.toml"), offline_config_toml(base_url))
}

/// A spawned `<binary> app-server` with `CODEX_HOME` set. Killed on drop.
#[derive(Debug)]
pub struct AppServerProcess {
    child: Child,
    /// The wire to the process.
    pub peer: WirePeer<ChildStdout, ChildStdin>,
}

impl AppServerProcess {
    /// Spawns `binary app-server` with `CODEX_HOME=codex_home`; its stderr goes to
    /// `<codex_home>/app-server-stderr.log`.
    pub async fn spawn(binary: &Path, codex_home: &Path) -> io::Result<Self> {
        Self::spawn_with(binary, codex_home, &[], &[]).await
    }

    /// Like [`AppServerProcess::spawn`] with extra arguments after `app-server` and extra
    /// environment variables.
    pub async fn spawn_with(
        binary: &Path,
        codex_home: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> io::Result<Self> {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(codex_home.join("app-server-stderr.log"))?;
        let mut child = Command::new(binary)
            .arg("app-server")
            .args(extra)
            .env("CODEX_HOME", codex_home)
            .env("RUST_LOG", "error")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| io::Error::other("no stdin"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| io::Error::other("no stdout"))?;
        Ok(AppServerProcess {
            child,
            peer: WirePeer::new(stdout, stdin),
        })
    }

    /// The OS process id, if still running.
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// Waits for the process to exit by itself.
    pub async fn wait(&mut self) -> io::Result<std::process::ExitStatus> {
        self.child.wait().await
    }

    /// Kills the process (like a crash) and reaps it.
    pub async fn kill(&mut self) -> io::Result<()> {
        self.child.kill().await
    }

    /// Closes stdin (the polite shutdown codex honours) and waits up to `timeout` for the
    /// process to exit, killing it after that.
    pub async fn shutdown(mut self, timeout: Duration) -> io::Result<()> {
        self.peer.close_writer().await;
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => status.map(|_| ()),
            Err(_) => self.child.kill().await,
        }
    }
}

/// A newline-delimited JSON peer: the client side of an app-server connection.
///
/// Every message received is kept in [`WirePeer::log`]; notifications and server requests that
/// arrive while waiting for a response are also queued for [`WirePeer::next_message`] and
/// [`WirePeer::wait_for`].
#[derive(Debug)]
pub struct WirePeer<R, W> {
    reader: BufReader<R>,
    writer: Option<W>,
    next_id: i64,
    queue: VecDeque<Value>,
    /// Everything received, in order (lines that are not JSON are kept as JSON strings).
    pub log: Vec<Value>,
    /// Every line sent, in order.
    pub sent: Vec<Value>,
    /// How long to wait for one message.
    pub timeout: Duration,
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin> WirePeer<R, W> {
    /// A peer reading from `reader` and writing to `writer`.
    pub fn new(reader: R, writer: W) -> Self {
        WirePeer {
            reader: BufReader::with_capacity(64 * 1024, reader),
            writer: Some(writer),
            next_id: 0,
            queue: VecDeque::new(),
            log: Vec::new(),
            sent: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Writes one JSON value as a line.
    pub async fn send(&mut self, message: &Value) -> io::Result<()> {
        self.sent.push(message.clone());
        let mut line = serde_json::to_vec(message)?;
        line.push(b'\n');
        self.send_raw(&line).await
    }

    /// Writes raw bytes (for garbage-line tests).
    pub async fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        let writer = self
            .writer
            .as_mut()
            .ok_or_else(|| io::Error::other("writer closed"))?;
        writer.write_all(bytes).await?;
        writer.flush().await
    }

    /// Closes the writing half (end of input for the server).
    pub async fn close_writer(&mut self) {
        if let Some(mut writer) = self.writer.take() {
            let _ = writer.shutdown().await;
        }
    }

    /// Reads the next line from the wire; `Ok(None)` at end of stream.
    async fn read_wire(&mut self) -> io::Result<Option<Value>> {
        let mut line = String::new();
        let read = tokio::time::timeout(self.timeout, self.reader.read_line(&mut line))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no message from app-server"))??;
        if read == 0 {
            return Ok(None);
        }
        let trimmed = line.trim_end_matches(['\n', '\r']);
        let value = serde_json::from_str(trimmed).unwrap_or_else(|_| Value::String(trimmed.into()));
        self.log.push(value.clone());
        Ok(Some(value))
    }

    /// The next message: a queued one first, else from the wire. `Ok(None)` at end of stream.
    pub async fn next_message(&mut self) -> io::Result<Option<Value>> {
        if let Some(message) = self.queue.pop_front() {
            return Ok(Some(message));
        }
        self.read_wire().await
    }

    /// Takes every message queued so far (notifications and server requests that arrived while
    /// waiting for responses and were not consumed yet).
    pub fn drain_queued(&mut self) -> Vec<Value> {
        self.queue.drain(..).collect()
    }

    /// Sends a request with the next integer id and waits for its response (the whole
    /// `{"id", "result"|"error"}` object). Other messages meanwhile are queued.
    pub async fn request(&mut self, method: &str, params: Option<Value>) -> io::Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method});
        if let Some(params) = params {
            message["params"] = params;
        }
        self.send(&message).await?;
        self.response_to(&json!(id)).await
    }

    /// Waits for the response carrying `id`, queueing everything else.
    pub async fn response_to(&mut self, id: &Value) -> io::Result<Value> {
        if let Some(pos) = self.queue.iter().position(|m| is_response_to(m, id)) {
            return Ok(self.queue.remove(pos).unwrap_or_default());
        }
        loop {
            match self.read_wire().await? {
                None => return Err(eof()),
                Some(message) if is_response_to(&message, id) => return Ok(message),
                Some(message) => self.queue.push_back(message),
            }
        }
    }

    /// Sends a notification.
    pub async fn notify(&mut self, method: &str, params: Option<Value>) -> io::Result<()> {
        let mut message = json!({"method": method});
        if let Some(params) = params {
            message["params"] = params;
        }
        self.send(&message).await
    }

    /// `thread/start` in `/tmp`; returns the answer (an error answer included).
    pub async fn start_thread(&mut self) -> io::Result<Value> {
        self.request("thread/start", Some(json!({"cwd": "/tmp"})))
            .await
    }

    /// `initialize` (with `capabilities.experimentalApi` when asked) then `initialized`;
    /// returns the `initialize` response.
    pub async fn initialize(&mut self, experimental_api: bool) -> io::Result<Value> {
        let mut params = json!({"clientInfo": {"name": "rethread-test", "version": "0"}});
        if experimental_api {
            params["capabilities"] = json!({"experimentalApi": true});
        }
        let response = self.request("initialize", Some(params)).await?;
        self.notify("initialized", None).await?;
        Ok(response)
    }

    /// Waits for a message whose `method` is `method` (a notification or server request);
    /// every message before it is returned too, in order, the match last.
    pub async fn wait_for(&mut self, method: &str) -> io::Result<Vec<Value>> {
        let mut seen = Vec::new();
        loop {
            let message = self.next_message().await?.ok_or_else(eof)?;
            let done = message.get("method").and_then(Value::as_str) == Some(method);
            seen.push(message);
            if done {
                return Ok(seen);
            }
        }
    }

    /// Runs one text turn: `turn/start`, then every message up to `turn/completed`.
    /// Server requests met on the way are answered with `approval` (e.g.
    /// `{"decision": "accept"}`) when given.
    pub async fn run_turn(
        &mut self,
        thread_id: &str,
        text: &str,
        approval: Option<Value>,
    ) -> io::Result<TurnRun> {
        let params = json!({"threadId": thread_id, "input": [{"type": "text", "text": text}]});
        let response = self.request("turn/start", Some(params)).await?;
        let mut messages = Vec::new();
        if response.get("error").is_some() {
            return Ok(TurnRun {
                response,
                messages,
                completed: None,
            });
        }
        loop {
            let message = self.next_message().await?.ok_or_else(eof)?;
            let method = message
                .get("method")
                .and_then(Value::as_str)
                .map(str::to_string);
            if let (Some(answer), Some(id)) = (&approval, message.get("id")) {
                if method.is_some() {
                    let reply = json!({"id": id, "result": answer});
                    self.send(&reply).await?;
                }
            }
            messages.push(message.clone());
            if method.as_deref() == Some("turn/completed") {
                return Ok(TurnRun {
                    response,
                    messages,
                    completed: Some(message),
                });
            }
        }
    }
}

/// What one [`WirePeer::run_turn`] saw.
#[derive(Debug, Clone)]
pub struct TurnRun {
    /// The `turn/start` response.
    pub response: Value,
    /// Every message after it, up to and including `turn/completed`.
    pub messages: Vec<Value>,
    /// The `turn/completed` notification, if the turn started.
    pub completed: Option<Value>,
}

impl TurnRun {
    /// The methods of the messages after the response, in order.
    pub fn methods(&self) -> Vec<String> {
        self.messages
            .iter()
            .filter_map(|m| m.get("method").and_then(Value::as_str).map(str::to_string))
            .collect()
    }

    /// The `status` of the completed turn.
    pub fn status(&self) -> Option<String> {
        let completed = self.completed.as_ref()?;
        completed
            .pointer("/params/turn/status")
            .and_then(Value::as_str)
            .map(str::to_string)
    }

    /// The text of the agent messages completed during the turn.
    pub fn agent_text(&self) -> Vec<String> {
        self.messages
            .iter()
            .filter(|m| m.get("method").and_then(Value::as_str) == Some("item/completed"))
            .filter_map(|m| m.pointer("/params/item"))
            .filter(|item| item.get("type").and_then(Value::as_str) == Some("agentMessage"))
            .filter_map(|item| item.get("text").and_then(Value::as_str).map(str::to_string))
            .collect()
    }
}

fn is_response_to(message: &Value, id: &Value) -> bool {
    message.get("id") == Some(id) && message.get("method").is_none()
}

fn eof() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "app-server closed its output")
}

/// The id of the thread in a `thread/start` or `thread/resume` answer; panics (a test
/// failure) when the answer holds none.
pub fn thread_id(answer: &Value) -> String {
    answer["result"]["thread"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a thread: {answer}"))
        .to_string()
}

/// The `error` object of a response, if it is an error response.
pub fn error_of(response: &Value) -> Option<(i64, String)> {
    let error = response.get("error")?;
    Some((
        error
            .get("code")
            .and_then(Value::as_i64)
            .unwrap_or_default(),
        error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
    ))
}
