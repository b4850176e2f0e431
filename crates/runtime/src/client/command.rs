//! [`CodexCommand`]: the one description of a codex process.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitStatus;

use tokio::process::Command;

/// How to start codex: `<program> [GLOBAL_ARGS...] <subcommand> [ARGS...]`, inheriting the
/// environment (so `CODEX_HOME` reaches it) plus `env`, in `cwd` when set.
///
/// ```
/// use rethread_runtime::CodexCommand;
/// let codex = CodexCommand::new("codex")
///     .global_args(["-c", "model=o3"])
///     .args(["--listen", "stdio://"])
///     .env("CODEX_HOME", "/srv/codex")
///     .cwd("/srv/work");
/// let command = codex.command("app-server");
/// let args: Vec<_> = command.as_std().get_args().collect();
/// assert_eq!(args, ["-c", "model=o3", "app-server", "--listen", "stdio://"]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CodexCommand {
    /// The codex binary.
    pub program: PathBuf,
    /// Codex options before the subcommand (`-c key=value`, `--enable F`, ...).
    pub global_args: Vec<OsString>,
    /// Everything after the subcommand, verbatim.
    pub args: Vec<OsString>,
    /// Environment overrides (e.g. `CODEX_HOME`).
    pub env: Vec<(OsString, OsString)>,
    /// Working directory of the process (default: this process's).
    pub cwd: Option<PathBuf>,
}

impl CodexCommand {
    /// `<program>` with the inherited environment and nothing else set.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        CodexCommand {
            program: program.into(),
            global_args: Vec::new(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
        }
    }

    /// Appends codex options that go before the subcommand.
    pub fn global_args<I: IntoIterator<Item = S>, S: Into<OsString>>(mut self, args: I) -> Self {
        self.global_args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Appends arguments after the subcommand.
    pub fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable for the process.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Sets the working directory of the process.
    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// The process for `subcommand`, killed if dropped; stdio is the caller's to set.
    pub fn command(&self, subcommand: &str) -> Command {
        let mut command = Command::new(&self.program);
        command
            .args(&self.global_args)
            .arg(subcommand)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .kill_on_drop(true);
        if let Some(cwd) = &self.cwd {
            command.current_dir(cwd);
        }
        command
    }

    /// `status` as a shell reports it: the code, or 128 + the signal that killed the process.
    pub fn exit_code(status: ExitStatus) -> i32 {
        #[cfg(unix)]
        if let Some(signal) = std::os::unix::process::ExitStatusExt::signal(&status) {
            return 128 + signal;
        }
        status.code().unwrap_or(1)
    }
}

/// Installs the SIGINT and SIGTERM handlers now and returns what resolves with the number of
/// the first to arrive (`2` or `15`; never, if they cannot be installed): what stops a
/// rethread process, and with it the codex it started.
pub fn stop_signal() -> impl std::future::Future<Output = i32> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let handlers = signal(SignalKind::interrupt())
            .and_then(|int| Ok((int, signal(SignalKind::terminate())?)));
        async move {
            let Ok((mut int, mut term)) = handlers else {
                return std::future::pending().await;
            };
            tokio::select! {
                _ = int.recv() => 2,
                _ = term.recv() => 15,
            }
        }
    }
    #[cfg(not(unix))]
    async {
        if tokio::signal::ctrl_c().await.is_err() {
            return std::future::pending().await;
        }
        2
    }
}
