//! One `codex exec` process: started with the run's prompt on its stdin, its stdout read line
//! by line (bytes as codex wrote them), its stderr held back until the run is known to be the
//! one that goes on (a resume that fails is answered on stderr, and not the client's to see),
//! then relayed as it comes.

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};
use tokio::task::JoinHandle;

/// The most of a held-back stderr kept (its end: codex's error is its last lines).
const HELD_STDERR: usize = 256 * 1024;

/// How a process began.
#[derive(Debug)]
pub(super) enum First {
    /// It printed `thread.started` for `thread_id`; `lines` are its output so far, that line
    /// included, to be written as they are.
    Started { thread_id: String, lines: Vec<u8> },
    /// It exited before (a refused resume, bad arguments, a crash).
    Exited(Exit),
}

/// A process that ended before its thread started: what it wrote, and its exit code.
#[derive(Debug)]
pub(super) struct Exit {
    pub(super) code: u8,
    pub(super) stdout: Vec<u8>,
    pub(super) stderr: Vec<u8>,
}

impl Exit {
    pub(super) fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// A running `codex exec`.
#[derive(Debug)]
pub(super) struct Process {
    child: Child,
    stdout: BufReader<ChildStdout>,
    stderr: Relay,
}

impl Process {
    /// Starts `program args...` with `stdin` written to its stdin and closed (`None`: this
    /// process's stdin).
    pub(super) fn spawn(
        program: &Path,
        args: &[OsString],
        stdin: Option<&[u8]>,
    ) -> std::io::Result<Process> {
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn()?;
        if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
            let bytes = bytes.to_vec();
            // A codex that exits without reading its stdin must not fail the write loudly.
            tokio::spawn(async move {
                let _ = pipe.write_all(&bytes).await;
            });
        }
        let stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
        let stderr = Relay::start(child.stderr.take().expect("stderr is piped"));
        Ok(Process {
            child,
            stdout,
            stderr,
        })
    }

    /// Reads until `thread.started` (or the end of its output, then its exit).
    pub(super) async fn first(&mut self) -> std::io::Result<First> {
        let mut lines = Vec::new();
        while let Some(line) = self.next_line().await? {
            lines.extend_from_slice(&line);
            if event_type(&line).as_deref() == Some("thread.started") {
                let thread_id = field(&line, "thread_id").unwrap_or_default();
                return Ok(First::Started { thread_id, lines });
            }
        }
        let code = exit_code(self.child.wait().await?);
        let stderr = self.stderr.finish().await;
        Ok(First::Exited(Exit {
            code,
            stdout: lines,
            stderr,
        }))
    }

    /// The next line of its stdout, with its newline; `None` at the end.
    pub(super) async fn next_line(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        let mut line = Vec::new();
        let read = self.stdout.read_until(b'\n', &mut line).await?;
        Ok((read > 0).then_some(line))
    }

    /// From now on its stderr goes to this process's stderr as it comes (what it held back
    /// first).
    pub(super) fn relay_stderr(&self) {
        self.stderr.go_live();
    }

    /// Waits for it to exit: its exit code (128 + N for signal N), once its stderr is relayed.
    pub(super) async fn wait(&mut self) -> std::io::Result<u8> {
        let code = exit_code(self.child.wait().await?);
        let held = self.stderr.finish().await;
        write_stderr(&held);
        Ok(code)
    }

    /// Stops it at once.
    pub(super) async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }
}

/// 128 + N for a process killed by signal N, like a shell.
fn exit_code(status: ExitStatus) -> u8 {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return 128u8.saturating_add(signal as u8);
        }
    }
    status.code().map_or(1, |code| code as u8)
}

/// The `type` of an exec event line, if it is one.
pub(super) fn event_type(line: &[u8]) -> Option<String> {
    field(line, "type")
}

/// A top-level string member of a JSON line.
pub(super) fn field(line: &[u8], name: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(line).ok()?;
    value.get(name)?.as_str().map(str::to_string)
}

/// Writes `bytes` to this process's stderr, best effort (a client that closed it still gets
/// the run).
pub(super) fn write_stderr(bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(bytes).and_then(|()| stderr.flush());
}

/// A child's stderr: held back (its tail) until [`Relay::go_live`], then copied as it comes.
#[derive(Debug)]
struct Relay {
    state: Arc<Mutex<RelayState>>,
    task: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct RelayState {
    live: bool,
    held: Vec<u8>,
}

fn lock(state: &Mutex<RelayState>) -> MutexGuard<'_, RelayState> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Relay {
    fn start(mut stderr: tokio::process::ChildStderr) -> Relay {
        let state = Arc::new(Mutex::new(RelayState::default()));
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            let mut chunk = vec![0u8; 8192];
            while let Ok(read) = stderr.read(&mut chunk).await {
                if read == 0 {
                    break;
                }
                let mut state = lock(&shared);
                if state.live {
                    write_stderr(&chunk[..read]);
                } else {
                    state.held.extend_from_slice(&chunk[..read]);
                    let excess = state.held.len().saturating_sub(HELD_STDERR);
                    state.held.drain(..excess);
                }
            }
        });
        Relay {
            state,
            task: Some(task),
        }
    }

    fn go_live(&self) {
        let mut state = lock(&self.state);
        state.live = true;
        let held = std::mem::take(&mut state.held);
        write_stderr(&held);
    }

    /// Waits for the end of the stream; returns what is still held back.
    async fn finish(&mut self) -> Vec<u8> {
        if let Some(task) = self.task.take() {
            // A grandchild may hold the pipe open past codex's exit: not waited for long.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), task).await;
        }
        std::mem::take(&mut lock(&self.state).held)
    }
}
