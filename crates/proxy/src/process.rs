//! `rethread app-server` as a process: codex spawned as a child, the client on our stdin and
//! stdout, signals, and the exit status.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use rethread_protocol::RpcError;
use rethread_runtime::CodexCommand;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::process::Child;

use crate::line::{Line, LineKind};
use crate::{forward, Ended, ProxyError, ProxyOptions, SessionHooks};

/// Spawns `codex app-server` for the proxy: stdin and stdout piped, stderr inherited (codex's
/// logs reach the client's stderr reader as they would without the proxy); killed if dropped.
pub fn spawn_app_server(command: &CodexCommand) -> Result<Child, ProxyError> {
    command
        .command("app-server")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|source| ProxyError::Spawn {
            program: command.program.display().to_string(),
            source,
        })
}

/// Runs the proxy between this process's stdin/stdout and a codex started from `command`
/// until one of them ends or a signal arrives; codex then gets `options.shutdown_grace` to
/// exit before it is killed. Returns this process's exit code: when the client closed its
/// input or stopped reading, `0` (or codex's own status when it exited within the grace);
/// when codex exited, its code (128 + N for a signal N); `130` / `143` for SIGINT / SIGTERM.
pub async fn run_app_server<H: SessionHooks>(
    command: &CodexCommand,
    hooks: &H,
    options: &ProxyOptions,
) -> Result<i32, ProxyError> {
    let mut child = spawn_app_server(command)?;
    let (Some(codex_in), Some(codex_out)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(ProxyError::Spawn {
            program: command.program.display().to_string(),
            source: std::io::Error::other("codex's stdio was not piped"),
        });
    };
    let ended = forward(
        hooks,
        options,
        client_input(),
        client_output(),
        codex_out,
        codex_in,
        rethread_runtime::stop_signal(),
    )
    .await;
    // Codex's input is closed now (the forwarder owned it): a polite codex exits on its own.
    let status = wait_or_kill(&mut child, options.shutdown_grace).await;
    match ended? {
        // Codex exits 0 when its input ends; one that failed on its own (bad arguments, a
        // tooling subcommand) keeps its status.
        Ended::ClientClosed {
            codex_finished: true,
        } => Ok(status.map_or(0, CodexCommand::exit_code)),
        Ended::ClientClosed { .. } | Ended::ClientGone => Ok(0),
        Ended::CodexClosed => Ok(status.map_or(1, CodexCommand::exit_code)),
        Ended::Stopped { signal } => Ok(128 + signal),
    }
}

/// Answers the client's first line with `refusal` when that line is a request (`initialize`),
/// for an app-server that cannot start: the client fails at once with rethread's message
/// instead of waiting out its own timeout for an answer that never comes. Reads for up to
/// `wait` (a client that sends nothing, or something else, gets no answer); returns whether
/// the answer was written.
pub async fn answer_first_request(refusal: RpcError, wait: Duration) -> bool {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    /// A first line longer than this is no `initialize`.
    const MAX_LINE: u64 = 1 << 20;
    let mut first = Vec::new();
    let mut input = tokio::io::BufReader::new(client_input()).take(MAX_LINE);
    let read = tokio::time::timeout(wait, input.read_until(b'\n', &mut first)).await;
    if !matches!(read, Ok(Ok(1..))) {
        return false;
    }
    let Ok(line) = Line::from_client(first.into()) else {
        return false;
    };
    let (LineKind::Request, Some(id)) = (line.kind(), line.id().cloned()) else {
        return false;
    };
    let answer = Line::error_response(Some(id), refusal).into_bytes();
    let mut output = client_output();
    output.write_all(&answer).await.is_ok() && output.flush().await.is_ok()
}

/// Waits up to `grace` for codex to exit, then kills it.
async fn wait_or_kill(child: &mut Child, grace: Duration) -> Option<ExitStatus> {
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status.ok(),
        Err(_) => {
            let _ = child.kill().await;
            child.wait().await.ok()
        }
    }
}

/// Our stdin: a pipe (what clients give codex) is read without a helper thread.
fn client_input() -> Box<dyn AsyncRead + Unpin + Send> {
    #[cfg(unix)]
    if let Some(pipe) = pipe(
        std::io::stdin(),
        tokio::net::unix::pipe::Receiver::from_owned_fd,
    ) {
        return Box::new(pipe);
    }
    Box::new(tokio::io::stdin())
}

/// Our stdout, like [`client_input`].
fn client_output() -> Box<dyn AsyncWrite + Unpin + Send> {
    #[cfg(unix)]
    if let Some(pipe) = pipe(
        std::io::stdout(),
        tokio::net::unix::pipe::Sender::from_owned_fd,
    ) {
        return Box::new(pipe);
    }
    Box::new(tokio::io::stdout())
}

/// `stdio` as a tokio pipe end, when it is a pipe.
#[cfg(unix)]
fn pipe<P>(
    stdio: impl std::os::fd::AsFd,
    open: impl FnOnce(std::os::fd::OwnedFd) -> std::io::Result<P>,
) -> Option<P> {
    open(stdio.as_fd().try_clone_to_owned().ok()?).ok()
}
