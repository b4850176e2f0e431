//! One `codex exec` process: started with the run's prompt on its stdin, its stdout read line
//! by line (bytes as codex wrote them), its stderr held back until the run is known to be the
//! one that goes on (a resume that fails is answered on stderr, and not the client's to see),
//! then relayed as it comes.

use rethread_runtime::CodexCommand;
use rethread_store::Unpoisoned;
use std::io::Write;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdout};
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

/// The tail of a child's stderr held back, or `None` once it is relayed as it comes.
type Held = Arc<Mutex<Option<Vec<u8>>>>;

/// A running `codex exec`.
#[derive(Debug)]
pub(super) struct Process {
    child: Child,
    stdout: BufReader<ChildStdout>,
    held: Held,
    /// The task that reads its stderr.
    relay: Option<JoinHandle<()>>,
}

impl Process {
    /// Starts `codex exec` as `command` describes it, with `stdin` written to its stdin and
    /// closed (`None`: this process's stdin).
    pub(super) fn spawn(command: &CodexCommand, stdin: Option<&[u8]>) -> std::io::Result<Process> {
        let mut child = command
            .command("exec")
            .stdin(stdin.map_or(Stdio::inherit(), |_| Stdio::piped()))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
            let bytes = bytes.to_vec();
            // A codex that exits without reading its stdin must not fail the write loudly.
            tokio::spawn(async move {
                let _ = pipe.write_all(&bytes).await;
            });
        }
        let stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
        let mut stderr = child.stderr.take().expect("stderr is piped");
        let held: Held = Arc::new(Mutex::new(Some(Vec::new())));
        let shared = held.clone();
        let relay = tokio::spawn(async move {
            let mut chunk = vec![0u8; 8192];
            while let Ok(read @ 1..) = stderr.read(&mut chunk).await {
                match shared.lock().unpoisoned().as_mut() {
                    None => write_stderr(&chunk[..read]),
                    Some(held) => {
                        held.extend_from_slice(&chunk[..read]);
                        held.drain(..held.len().saturating_sub(HELD_STDERR));
                    }
                }
            }
        });
        let relay = Some(relay);
        Ok(Process {
            child,
            stdout,
            held,
            relay,
        })
    }

    /// Reads until `thread.started` (or the end of its output, then its exit).
    pub(super) async fn first(&mut self) -> std::io::Result<First> {
        let mut lines = Vec::new();
        while let Some(line) = self.next_line().await? {
            lines.extend_from_slice(&line);
            if field(&line, "type").as_deref() == Some("thread.started") {
                let thread_id = field(&line, "thread_id").unwrap_or_default();
                return Ok(First::Started { thread_id, lines });
            }
        }
        let (code, stderr) = self.exit().await?;
        let stdout = lines;
        Ok(First::Exited(Exit {
            code,
            stdout,
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
        let mut held = self.held.lock().unpoisoned();
        write_stderr(&held.take().unwrap_or_default());
    }

    /// Waits for it to exit: its exit code, once its stderr is relayed.
    pub(super) async fn wait(&mut self) -> std::io::Result<u8> {
        let (code, held) = self.exit().await?;
        write_stderr(&held);
        Ok(code)
    }

    /// Waits for it to exit and for the end of its stderr: its exit code (128 + N for signal
    /// N, like a shell) and what is still held back of its stderr.
    async fn exit(&mut self) -> std::io::Result<(u8, Vec<u8>)> {
        let status = self.child.wait().await?;
        let code = u8::try_from(CodexCommand::exit_code(status)).unwrap_or(u8::MAX);
        if let Some(relay) = self.relay.take() {
            // A grandchild may hold the pipe open past codex's exit: not waited for long.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), relay).await;
        }
        let held = self.held.lock().unpoisoned().as_mut().map(std::mem::take);
        Ok((code, held.unwrap_or_default()))
    }

    /// Stops it at once.
    pub(super) async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }
}

/// A top-level string member of a JSON line (`type`: the event's).
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
