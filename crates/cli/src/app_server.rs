//! `rethread app-server [ARGS...]`: a drop-in `codex app-server` (see the `rethread-proxy`
//! crate). Everything after `app-server` goes to `<codex> app-server` verbatim; codex's own
//! options that come before `app-server` (`-c key=value`, `--enable`, `--disable`) are
//! accepted before it here too and passed on in the same place, since clients such as the
//! Python SDK put their config overrides there.
//!
//! Temporary (phase 1): with a session key (`--session ID` or `RETHREAD_SESSION`) the command
//! refuses to start (exit 2), because nothing would be kept yet; without one it is the
//! pass-through that says so once, as a `warning` notification.

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

use rethread_proxy::{run_app_server, AppServerCommand, NoSession, ProxyOptions};

/// The exit code of a refused start (a usage error, like clap's).
const USAGE: u8 = 2;

/// The environment variable naming the session to keep.
pub(crate) const SESSION_ENV: &str = "RETHREAD_SESSION";

/// Options of `rethread` that only `app-server` uses; they come before the subcommand.
#[derive(Debug, Default, clap::Args)]
pub(crate) struct AppServerGlobals {
    /// app-server: the session to keep (default: `RETHREAD_SESSION`).
    #[arg(long = "session", value_name = "ID")]
    session: Option<String>,
    /// app-server: a codex config override, passed to codex before `app-server`.
    #[arg(short = 'c', long = "config", value_name = "key=value")]
    config: Vec<String>,
    /// app-server: a codex feature to enable, passed to codex before `app-server`.
    #[arg(long = "enable", value_name = "FEATURE")]
    enable: Vec<String>,
    /// app-server: a codex feature to disable, passed to codex before `app-server`.
    #[arg(long = "disable", value_name = "FEATURE")]
    disable: Vec<String>,
}

impl AppServerGlobals {
    /// Refuses these options on a command other than `app-server`.
    pub(crate) fn ensure_unused(&self) -> Result<(), String> {
        let used = self.session.is_some()
            || !self.config.is_empty()
            || !self.enable.is_empty()
            || !self.disable.is_empty();
        if used {
            Err("--session, -c/--config, --enable and --disable apply to app-server only".into())
        } else {
            Ok(())
        }
    }

    fn codex_global_args(&self) -> Vec<OsString> {
        let mut args = Vec::new();
        for (flag, values) in [
            ("--config", &self.config),
            ("--enable", &self.enable),
            ("--disable", &self.disable),
        ] {
            for value in values {
                args.push(OsString::from(flag));
                args.push(OsString::from(value));
            }
        }
        args
    }

    /// The session key: `--session`, else a non-empty `RETHREAD_SESSION`.
    fn session(&self) -> Option<String> {
        self.session
            .clone()
            .or_else(|| std::env::var(SESSION_ENV).ok())
            .filter(|s| !s.is_empty())
    }
}

/// Runs the proxy on its own single-threaded runtime and returns the process's exit code.
/// The runtime is shut down without waiting for a blocked read of our stdin (the client may
/// keep it open after codex exited).
pub(crate) fn main(codex: &Path, globals: &AppServerGlobals, args: Vec<OsString>) -> ExitCode {
    if let Some(session) = globals.session() {
        eprintln!(
            "rethread: app-server: sessions are not wired yet, so session {session:?} would not \
             be kept; unset {SESSION_ENV} (and --session) to run without keeping anything"
        );
        return ExitCode::from(USAGE);
    }
    let command = AppServerCommand {
        program: codex.to_path_buf(),
        global_args: globals.codex_global_args(),
        args,
        env: Vec::new(),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            return crate::output::fail(
                &format!("could not start the async runtime: {error}"),
                crate::output::EXIT_FAILED,
            )
        }
    };
    let result = runtime.block_on(run_app_server(
        &command,
        &NoSession::new(),
        &ProxyOptions::default(),
    ));
    runtime.shutdown_background();
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(error) => {
            crate::output::fail(&format!("app-server: {error}"), crate::output::EXIT_FAILED)
        }
    }
}
