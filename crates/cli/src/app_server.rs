//! `rethread app-server`: a drop-in `codex app-server` (the `rethread-proxy` crate) with the
//! settings [`HELP`] lists; everything else after `app-server` goes to codex verbatim. codex's
//! own `-c`, `--enable` and `--disable` are taken before `app-server` too and passed on in the
//! same place: clients such as the Python SDK put their config overrides there. With a
//! session, the store is opened and the lease taken before codex starts
//! ([`BindingHooks::open`]); a session that cannot be kept is a usage error before then.

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use rethread_proxy::{
    run_app_server, BindingHooks, CodexCommand, NoSession, NoticeDelivery, ProxyOptions,
    SessionOptions,
};
use rethread_runtime::BinderOptions;

use crate::output::{self, UsageError};
use crate::CliResult;

/// What `rethread help app-server` says after the options: rethread's settings.
pub(crate) const HELP: &str = "\
rethread's own settings (everything else goes to `codex app-server` verbatim):
  --session ID             the session to keep; also taken anywhere among ARGS before `--`
  RETHREAD_SESSION         the session to keep when --session is not given; unset or empty:
                           with a store, each thread kept by its own id (no transcript),
                           else a pass-through that keeps nothing (either said once)
  RETHREAD_SESSION_VAR     the variable holding the session id when RETHREAD_SESSION is unset
                           (Hermes: HERMES_SESSION_ID); that variable unset, empty or not
                           a session id: refused
  RETHREAD_NOTICE          `warning` (default): the fallback notice is a `warning`; `item`:
                           also an agentMessage item in the new thread's first turn, for
                           clients that drop warnings (Hermes, the Python SDK)
  RETHREAD_SESSION_WAIT    seconds to wait for a session another live process holds
                           (default 2), then exit 75
  RETHREAD_STORE           the store (--store): sqlite:PATH, redb:PATH, postgres://..., memory:
  RETHREAD_CODEX_BIN       the real codex (--codex-bin; default `codex` on PATH)
  RETHREAD_LEASE_TTL       the session lease's time to live in seconds (default 30)
  RETHREAD_MIRROR          `on` (default) or `off` (--no-mirror): mirror the session's rollout
                           into the store and restore it from there
  RETHREAD_MIRROR_CAP      the session's cap of mirrored rollout bytes (--mirror-cap BYTES;
                           default 1 GiB): past it mirroring stops for its thread, and starts
                           again for the next one

Also taken before `app-server` (`rethread -c k=v app-server`, where a client that starts
codex puts them): --session ID, --no-mirror, --mirror-cap BYTES, and codex's
-c/--config key=value, --enable FEATURE and --disable FEATURE, passed to codex before
`app-server`.

`rethread app-server --help` prints codex's own help.";

/// `app-server`'s own arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct AppServerArgs {
    /// The session to keep (default: `RETHREAD_SESSION`).
    #[arg(long = "session", value_name = "ID",
          value_parser = clap::builder::NonEmptyStringValueParser::new())]
    session: Option<String>,
    #[command(flatten)]
    pub(crate) store: crate::StoreArg,
    #[command(flatten)]
    pub(crate) codex_bin: crate::CodexBinArg,
    /// Do not mirror the session's rollout into the store (nor restore it from there); also
    /// `RETHREAD_MIRROR=off`.
    #[arg(long = "no-mirror")]
    no_mirror: bool,
    /// The session's cap of mirrored rollout bytes (default 1 GiB; also `RETHREAD_MIRROR_CAP`):
    /// past it mirroring stops for the session's thread, and starts again for the next one.
    #[arg(long, value_name = "BYTES", value_parser = rethread_runtime::parse_mirror_cap)]
    mirror_cap: Option<u64>,
    /// Arguments for `codex app-server`, verbatim (`--listen stdio://`, `-c k=v`, ...).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    args: Vec<OsString>,
}

impl AppServerArgs {
    /// `codex app-server ARGS` as rethread installed as `codex` receives it: every argument is
    /// codex's but rethread's `--session`, and the store comes from `RETHREAD_STORE`.
    pub(crate) fn verbatim(store: Option<String>, args: Vec<OsString>) -> Self {
        AppServerArgs {
            session: None,
            // The key file is `RETHREAD_STORE_KEY_FILE`, read by `as_codex` before this.
            store: crate::StoreArg {
                url: store,
                key_file: None,
            },
            codex_bin: crate::CodexBinArg::default(),
            no_mirror: false,
            mirror_cap: None,
            args,
        }
    }
}

/// Takes rethread's `--session ID` / `--session=ID` out of codex's `args` (only before a
/// `--`, after which everything is codex's): the session named, if any. Named twice, without
/// an ID, empty or not UTF-8: a usage error.
fn take_session(args: &mut Vec<OsString>) -> Result<Option<String>, String> {
    let mut found: Option<String> = None;
    let mut kept = Vec::with_capacity(args.len());
    let mut drained = std::mem::take(args).into_iter();
    while let Some(arg) = drained.next() {
        if arg == "--" {
            kept.push(arg);
            kept.extend(drained.by_ref());
            break;
        }
        let value = if arg == "--session" {
            Some(drained.next().ok_or("--session needs a session ID")?)
        } else {
            arg.to_str()
                .and_then(|a| a.strip_prefix("--session="))
                .map(OsString::from)
        };
        let Some(value) = value else {
            kept.push(arg);
            continue;
        };
        let session = value
            .into_string()
            .map_err(|_| "--session is not UTF-8; a session id must be text".to_string())?;
        if session.is_empty() {
            return Err("--session is empty; name a session or leave it out".into());
        }
        if found.replace(session).is_some() {
            return Err("--session is given twice".into());
        }
    }
    *args = kept;
    Ok(found)
}

/// Options of `rethread` that only `app-server` uses, given before the subcommand (where a
/// client that starts `codex` puts them); listed in `rethread help app-server` ([`HELP`]), not
/// in the top-level help.
#[derive(Debug, Default, clap::Args)]
pub(crate) struct AppServerGlobals {
    /// app-server: the session to keep (default: `RETHREAD_SESSION`).
    #[arg(long = "session", value_name = "ID", hide = true,
          value_parser = clap::builder::NonEmptyStringValueParser::new())]
    session: Option<String>,
    /// app-server: a codex config override, passed to codex before `app-server`.
    #[arg(short = 'c', long = "config", value_name = "key=value", hide = true)]
    config: Vec<String>,
    /// app-server: a codex feature to enable, passed to codex before `app-server`.
    #[arg(long = "enable", value_name = "FEATURE", hide = true)]
    enable: Vec<String>,
    /// app-server: a codex feature to disable, passed to codex before `app-server`.
    #[arg(long = "disable", value_name = "FEATURE", hide = true)]
    disable: Vec<String>,
    /// app-server: do not mirror the session's rollout into the store (nor restore it from
    /// there); also `RETHREAD_MIRROR=off`.
    #[arg(long = "no-mirror", hide = true)]
    no_mirror: bool,
    /// app-server: the session's cap of mirrored bytes (also `RETHREAD_MIRROR_CAP`).
    #[arg(long, value_name = "BYTES", hide = true,
          value_parser = rethread_runtime::parse_mirror_cap)]
    mirror_cap: Option<u64>,
}

impl AppServerGlobals {
    /// Refuses these options on a command other than `app-server`.
    pub(crate) fn ensure_unused(&self) -> Result<(), String> {
        let used = self.session.is_some()
            || !self.config.is_empty()
            || !self.enable.is_empty()
            || !self.disable.is_empty()
            || self.no_mirror
            || self.mirror_cap.is_some();
        match used {
            true => Err(
                "--session, -c/--config, --enable, --disable, --no-mirror and --mirror-cap \
                         (before the command) apply to app-server only"
                    .into(),
            ),
            false => Ok(()),
        }
    }

    fn codex_global_args(&self) -> Vec<OsString> {
        let flags = [
            ("--config", &self.config),
            ("--enable", &self.enable),
            ("--disable", &self.disable),
        ];
        let pairs = flags
            .into_iter()
            .flat_map(|(flag, values)| values.iter().flat_map(move |value| [flag, value.as_str()]));
        pairs.map(OsString::from).collect()
    }
}

/// The variable that names the variable holding the session id, for hosts that export their
/// own (Hermes: `HERMES_SESSION_ID`) and cannot be told to set `RETHREAD_SESSION`.
const SESSION_VAR_ENV: &str = "RETHREAD_SESSION_VAR";

/// The session the environment names: `RETHREAD_SESSION`; unset or empty, the variable
/// `RETHREAD_SESSION_VAR` names; neither, no session (the documented pass-through). A value
/// that is not UTF-8 or not a session id cannot be kept: a usage error, never read as unset.
/// Named through `RETHREAD_SESSION_VAR`, an unset or empty variable is refused too: the user
/// asked for the host's session to be kept, and keeping nothing would be silent.
pub(crate) fn session_env() -> Result<Option<String>, UsageError> {
    let text = "; a session id must be text";
    if let Some(session) = crate::env_var("RETHREAD_SESSION", text)? {
        return user_session(Some(session)).map_err(UsageError);
    }
    let Some(name) = crate::env_var(SESSION_VAR_ENV, "; name an environment variable")? else {
        return Ok(None);
    };
    if name.contains(['=', '\0']) {
        let cause = format!("{SESSION_VAR_ENV}=`{name}` is not the name of a variable");
        return Err(UsageError(cause));
    }
    let named = |cause: String| UsageError(format!("{name} (named by {SESSION_VAR_ENV}) {cause}"));
    let hint = format!(" (named by {SESSION_VAR_ENV}){text}");
    match crate::env_var(&name, &hint)? {
        None => Err(named(
            "is unset or empty: the session to keep is not known; set it, or unset \
             RETHREAD_SESSION_VAR"
                .into(),
        )),
        Some(session) => {
            user_session(Some(session)).map_err(|cause| named(format!("is refused: {cause}")))
        }
    }
}

/// A session named by the user (`chat --session`, `app-server --session`,
/// `RETHREAD_SESSION`): none of the kept threads' key space (`thread:...`). The one check of
/// every command that takes a session; its error is a usage error (exit 2).
pub(crate) fn user_session(session: Option<String>) -> Result<Option<String>, String> {
    match session
        .as_deref()
        .map(rethread_runtime::kept::check_session_id)
    {
        Some(Err(error)) => Err(error.to_string()),
        _ => Ok(session),
    }
}

/// `RETHREAD_NOTICE`: how the fallback notice reaches the client, `warning` (also when unset
/// or empty) or `item`; anything else is a usage error.
fn notice_env() -> Result<NoticeDelivery, UsageError> {
    const NOTICE_ENV: &str = "RETHREAD_NOTICE";
    match crate::env_var(NOTICE_ENV, "; give `warning` or `item`")?.as_deref() {
        None | Some("warning") => Ok(NoticeDelivery::Warning),
        Some("item") => Ok(NoticeDelivery::Item),
        Some(other) => Err(UsageError(format!(
            "{NOTICE_ENV}=`{other}` is neither `warning` nor `item`"
        ))),
    }
}

/// The session settings of `app-server` and `exec`: [`crate::binder_options`] with the wait
/// `RETHREAD_SESSION_WAIT` sets (a finite, non-negative number of seconds; default 2 s, also
/// when empty: long enough for a client that restarts its app-server to outlast the previous
/// one's shutdown).
pub(crate) fn env_options(no_mirror: bool) -> Result<BinderOptions, UsageError> {
    const SESSION_WAIT_ENV: &str = "RETHREAD_SESSION_WAIT";
    let hint = "; give a number of seconds between 0 and 86400";
    let wait = match crate::env_var(SESSION_WAIT_ENV, hint)? {
        None => Duration::from_secs(2),
        Some(text) => crate::parse_wait(&text)
            .map(Duration::from_secs_f64)
            .map_err(|cause| UsageError(format!("{SESSION_WAIT_ENV}: {cause}")))?,
    };
    crate::binder_options(wait, no_mirror)
}

/// Runs the proxy on its own single-threaded runtime and returns the process's exit code.
/// The runtime is shut down without waiting for a blocked read of our stdin (the client may
/// keep it open after codex exited).
pub(crate) fn main(codex: &Path, globals: &AppServerGlobals, mut args: AppServerArgs) -> ExitCode {
    let named = take_session(&mut args.args).and_then(|in_args| {
        match [globals.session.clone(), args.session.take(), in_args] {
            [None, None, None] => session_env().map_err(|e| e.0),
            [Some(one), None, None] | [None, Some(one), None] | [None, None, Some(one)] => {
                user_session(Some(one))
            }
            _ => Err("--session is given twice".to_string()),
        }
    });
    // codex's help is no JSON-RPC: codex prints it in this process's place, no proxy between.
    let mut before_dashes = args.args.iter().take_while(|a| *a != "--");
    if named.is_ok() && before_dashes.any(|a| a == "--help" || a == "-h") {
        output::eprint_line(
            "rethread: codex's own help follows; rethread's settings: rethread help app-server",
        );
        let mut argv = globals.codex_global_args();
        argv.push("app-server".into());
        argv.extend(args.args);
        return crate::hand_over(codex, &argv);
    }
    let no_mirror = globals.no_mirror || args.no_mirror;
    let cap = match (globals.mirror_cap, args.mirror_cap) {
        (Some(_), Some(_)) => Err("--mirror-cap is given twice".to_string()),
        (one, other) => Ok(one.or(other)),
    };
    let settings = named.and_then(|session| {
        let mut options = SessionOptions::default();
        options.binder = env_options(no_mirror).map_err(|e| e.0)?;
        if let Some(cap) = cap? {
            options.binder.mirror_cap = cap;
        }
        options.notice = notice_env().map_err(|e| e.0)?;
        Ok((session, options))
    });
    let (session, options) = match settings {
        Ok(settings) => settings,
        Err(cause) => return output::fail(&cause, output::EXIT_USAGE),
    };
    let command = crate::codex_child::codex_command(codex)
        .global_args(globals.codex_global_args())
        .args(args.args);
    let store = args.store.url;
    let work = async move {
        let code = run(&command, store.as_deref(), session, options)
            .await
            .map_err(|error| output::with_wait_hint(error, SESSION_WAIT_HINT))?;
        Ok(u8::try_from(code).unwrap_or(1))
    };
    let runtime = tokio::runtime::Builder::new_current_thread();
    output::run_to_exit(runtime, Duration::ZERO, "app-server: ", work)
}

/// How long a proxy that cannot open its session waits for the client's first request
/// (`initialize`, which a client sends as soon as it starts) to answer it with the refusal.
const FIRST_REQUEST_WAIT: Duration = Duration::from_secs(2);

/// How `app-server` and `exec` wait for a session another live process holds.
pub(crate) const SESSION_WAIT_HINT: &str =
    "retry later, or wait longer for it with RETHREAD_SESSION_WAIT=SECS";

async fn run(
    command: &CodexCommand,
    store: Option<&str>,
    session: Option<String>,
    session_options: SessionOptions,
) -> CliResult<i32> {
    let options = ProxyOptions::default();
    let binder = session_options.binder.clone();
    let Some(session) = session else {
        // With a store, each thread is kept by its own id (a pass-through with the mirror off).
        let hooks = match store {
            Some(store) => {
                let store = crate::open_store(Some(store), crate::Access::Write(Duration::ZERO));
                NoSession::keeping(store.await?, binder)
            }
            None => NoSession::new(),
        };
        return Ok(run_app_server(command, &hooks, &options).await?);
    };
    let store = crate::open_store(store, crate::Access::Write(Duration::ZERO)).await?;
    // The lease first: a session held elsewhere is refused before codex starts.
    let hooks = match BindingHooks::open(session.clone(), store, session_options).await {
        Ok(hooks) => hooks,
        Err(error) => {
            // The client is told too, on its first request, before this process exits.
            let refusal = rethread_proxy::open_refused(&error, &session);
            rethread_proxy::answer_first_request(refusal, FIRST_REQUEST_WAIT).await;
            return Err(error.into());
        }
    };
    let result = run_app_server(command, &hooks, &options).await;
    // Forwarding released the lease when it ended; this covers a codex that never started.
    let _ = hooks.close().await;
    Ok(result?)
}
