//! `rethread app-server [ARGS...]`: a drop-in `codex app-server` (see the `rethread-proxy`
//! crate). Everything after `app-server` goes to `<codex> app-server` verbatim; codex's own
//! options that come before `app-server` (`-c key=value`, `--enable`, `--disable`) are
//! accepted before it here too and passed on in the same place, since clients such as the
//! Python SDK put their config overrides there.
//!
//! With a session key (`--session ID` or `RETHREAD_SESSION`) the store is opened
//! (`--store` / `RETHREAD_STORE`, the CLI's default otherwise) and the session's lease taken
//! *before* codex starts ([`BindingHooks::open`]): a session another live process holds is
//! waited for up to `RETHREAD_SESSION_WAIT` seconds (default 2), then refused with exit 75
//! and one line naming the holder. `RETHREAD_LEASE_TTL` (seconds, default 30) sets the lease's
//! TTL, as for `chat`. The session's rollout is mirrored into the store and restored from it
//! (so the session can move to another machine) unless `--no-mirror` or `RETHREAD_MIRROR=off`.
//! Without a session key it is the pass-through that says once, as a `warning` notification,
//! that nothing is kept.

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

use std::time::Duration;

use rethread_proxy::{
    run_app_server, AppServerCommand, BindingHooks, NoSession, ProxyOptions, SessionOptions,
};

use crate::CliResult;

/// The environment variable naming the session to keep.
pub(crate) const SESSION_ENV: &str = "RETHREAD_SESSION";

/// The environment variable bounding the wait for a session another process holds (seconds).
pub(crate) const SESSION_WAIT_ENV: &str = "RETHREAD_SESSION_WAIT";

/// How long a session held by a live process is waited for by default: long enough for a
/// client that restarts its app-server to outlast the previous one's shutdown.
const DEFAULT_SESSION_WAIT: Duration = Duration::from_secs(2);

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
    /// app-server: do not mirror the session's rollout into the store (nor restore it from
    /// there); also `RETHREAD_MIRROR=off`.
    #[arg(long = "no-mirror")]
    no_mirror: bool,
}

impl AppServerGlobals {
    /// Refuses these options on a command other than `app-server`.
    pub(crate) fn ensure_unused(&self) -> Result<(), String> {
        let used = self.session.is_some()
            || !self.config.is_empty()
            || !self.enable.is_empty()
            || !self.disable.is_empty()
            || self.no_mirror;
        if used {
            Err(
                "--session, -c/--config, --enable, --disable and --no-mirror (before the \
                 command) apply to app-server only"
                    .into(),
            )
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
pub(crate) fn main(
    codex: &Path,
    store: Option<&str>,
    globals: &AppServerGlobals,
    args: Vec<OsString>,
) -> ExitCode {
    let wait = match session_wait() {
        Ok(wait) => wait,
        Err(cause) => return crate::output::fail(&cause, crate::output::EXIT_USAGE),
    };
    let lease_ttl = match crate::lease_ttl() {
        Ok(ttl) => ttl,
        Err(cause) => return crate::output::fail(&cause.0, crate::output::EXIT_USAGE),
    };
    let mirror = match crate::mirror(globals.no_mirror) {
        Ok(mirror) => mirror,
        Err(cause) => return crate::output::fail(&cause.0, crate::output::EXIT_USAGE),
    };
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
    let settings = Settings {
        wait,
        lease_ttl,
        mirror,
    };
    let result = runtime.block_on(run(&command, store, globals.session(), settings));
    runtime.shutdown_background();
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(error) => crate::output::fail(
            &format!("app-server: {error}"),
            crate::output::exit_code(&*error),
        ),
    }
}

/// What the environment and the options before `app-server` set for the session.
struct Settings {
    wait: Duration,
    lease_ttl: Option<Duration>,
    mirror: bool,
}

async fn run(
    command: &AppServerCommand,
    store: Option<&str>,
    session: Option<String>,
    settings: Settings,
) -> CliResult<i32> {
    let options = ProxyOptions::default();
    let Some(session) = session else {
        return Ok(run_app_server(command, &NoSession::new(), &options).await?);
    };
    let store = crate::open_store(store, crate::Access::Write(std::time::Duration::ZERO)).await?;
    let mut session_options = SessionOptions::default();
    session_options.binder.lease_wait = settings.wait;
    session_options.binder.mirror = settings.mirror;
    if let Some(ttl) = settings.lease_ttl {
        session_options.binder.lease_ttl = Some(ttl);
    }
    // The lease first: a session held elsewhere is refused before codex starts.
    let hooks = BindingHooks::open(session, store, session_options).await?;
    let result = run_app_server(command, &hooks, &options).await;
    // Forwarding released the lease when it ended; this covers a codex that never started.
    let _ = hooks.close().await;
    Ok(result?)
}

/// `RETHREAD_SESSION_WAIT`: a finite, non-negative number of seconds (default 2).
fn session_wait() -> Result<Duration, String> {
    match std::env::var(SESSION_WAIT_ENV) {
        Err(_) => Ok(DEFAULT_SESSION_WAIT),
        Ok(text) if text.is_empty() => Ok(DEFAULT_SESSION_WAIT),
        Ok(text) => crate::parse_wait(&text)
            .map(Duration::from_secs_f64)
            .map_err(|cause| format!("{SESSION_WAIT_ENV}: {cause}")),
    }
}
