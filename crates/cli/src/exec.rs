//! `rethread exec [ARGS...]`: a drop-in `codex exec` (the TypeScript SDK's interface: one
//! `codex exec --experimental-json [options] [resume <id>]` process per turn, the prompt on
//! stdin, JSONL events on stdout), the third driver of the runtime's session machine
//! (`exec/driver.rs`).
//!
//! With a session (`RETHREAD_SESSION`), the prompt is read (as `chat -` reads it; an argument
//! prompt with a piped stdin as codex composes it), and the store opened and the lease taken
//! before codex starts. A run that names no subcommand runs on the session's thread (`resume
//! <bound id>`; after a loss, a fresh thread seeded through `-c developer_instructions=...`,
//! the notice an `error` item after its `thread.started`). A run that names its own `resume
//! <id>` or `fork` keeps its bytes; its turns are recorded when the machine adopts the
//! thread. Without a session but with a store (and the mirror on), the run's thread is kept
//! by its own id (`rethread_runtime::kept`): `resume <id>` takes its lease and restores it
//! first, any other run takes the lease of the thread codex starts or picks; each turn commits
//! the rollout's growth, no rows. Without a session or store, and for `--help`, `--version`,
//! `--ephemeral`, `review` and `help`, rethread replaces itself with codex (same bytes, exit
//! code and signals).

mod driver;
mod process;

use std::ffi::{OsStr, OsString};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use rethread_protocol::exec::ExecArgs;
use rethread_protocol::ThreadId;
use rethread_runtime::binding;
use rethread_runtime::BinderOptions;

use crate::output::{self, UsageError};
use crate::{CodexBinArg, StoreArg};

#[derive(Debug, clap::Args)]
pub(crate) struct ExecCommand {
    #[command(flatten)]
    pub(crate) store: StoreArg,
    #[command(flatten)]
    pub(crate) codex_bin: CodexBinArg,
    /// Arguments for `codex exec` (`--experimental-json`, `--cd DIR`, `resume ID`, ...).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    pub(crate) args: Vec<OsString>,
}

/// How a run is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// codex's own run, untouched.
    PassThrough,
    /// The session's thread: resumed, or started (seeded after a loss).
    Session,
    /// A thread the client names itself (`resume <id>`, `fork`).
    Own,
}

fn kind_of(run: &ExecArgs) -> Kind {
    let own_run = ["help", "h", "version", "V", "ephemeral"]
        .iter()
        .any(|flag| run.has_flag(flag));
    match run.subcommand() {
        _ if own_run => Kind::PassThrough,
        None => Kind::Session,
        Some("resume" | "fork") => Kind::Own,
        Some(_) => Kind::PassThrough,
    }
}

/// The prompt of a run: what codex gets on stdin, and the text codex composes from it.
#[derive(Debug, Clone)]
struct Input {
    /// The bytes for codex's stdin; `None`: codex reads this process's stdin (a terminal, with
    /// the prompt given as an argument).
    stdin: Option<Vec<u8>>,
    /// The prompt as the model gets it, trailing newlines removed (the user row's text).
    text: String,
    /// `--image` files, for the user row.
    images: Vec<String>,
}

/// What a run needs besides its arguments.
#[derive(Debug)]
pub(crate) struct Setup {
    /// The real codex.
    codex: PathBuf,
    /// codex's own options before `exec` (`-c`, `--enable`, `--disable` when rethread stands
    /// in for `codex`).
    globals: Vec<OsString>,
    run: ExecArgs,
    input: Input,
    /// The session, or the record key of a thread kept without one (`thread:<id>`; empty
    /// until codex names the thread).
    session: String,
    store: Option<String>,
    /// The lease's wait and TTL, and the mirror.
    options: BinderOptions,
}

/// `[globals...] exec ARGS...`.
fn exec_args(globals: &[OsString], args: &[OsString]) -> Vec<OsString> {
    [globals, &[OsString::from("exec")], args].concat()
}

/// `rethread exec ARGS...` (and `codex [globals] exec ARGS...` when rethread stands in for
/// codex): returns the process's exit code.
pub(crate) fn main(
    codex: &Path,
    store: Option<&str>,
    globals: Vec<OsString>,
    args: Vec<OsString>,
) -> ExitCode {
    let run = resolve_name(ExecArgs::parse(args), store);
    let session = match crate::app_server::session_env() {
        Ok(session) => session,
        Err(cause) => return output::fail(&cause.0, output::EXIT_USAGE),
    };
    let kind = kind_of(&run);
    // Without a session but with a store and the mirror (the record is the rollout), the
    // run's thread is kept by its own id: the key of the thread `resume <id>` names, else
    // found once codex names it (empty until then).
    let session = match session {
        None if store.is_some() && BinderOptions::default().rollout_mirror().is_some() => {
            if let Some(name) = run
                .thread_id()
                .filter(|named| !ThreadId::new(named).is_uuid())
            {
                let unnamed = format!(
                    "`{name}` is not a thread id, and no thread of CODEX_HOME has that name in \
                     codex's name index: codex would look it up itself, and it may be a \
                     session's thread (name it by id)"
                );
                return output::fail(&unnamed, output::EXIT_FAILED);
            }
            Some(kept_key(&run))
        }
        session => session,
    };
    let Some(session) = session.filter(|_| kind != Kind::PassThrough) else {
        return crate::hand_over(codex, &exec_args(&globals, run.args()));
    };
    // codex refuses it; taken for the session's run it would change meaning (`-m` and then
    // `resume <id>` is `-m resume <id>`: a new thread prompted with the id).
    if let Some(option) = run.missing_value() {
        let option = option.to_string_lossy();
        let refused = format!("`{option}` needs a value (codex refuses this command line too)");
        return output::fail(&refused, output::EXIT_USAGE);
    }
    let settings =
        crate::app_server::env_options(false).and_then(|options| Ok((options, read_input(&run)?)));
    let (options, input) = match settings {
        Ok(settings) => settings,
        Err(usage) => return output::fail(&usage.0, output::EXIT_USAGE),
    };
    let setup = Setup {
        codex: codex.to_path_buf(),
        globals,
        run,
        input,
        session,
        store: store.map(str::to_string),
        options,
    };
    let (runtime, linger) = (
        tokio::runtime::Builder::new_current_thread(),
        Duration::from_secs(1),
    );
    let work = async {
        let hint = crate::app_server::SESSION_WAIT_HINT;
        driver::run(setup)
            .await
            .map_err(|error| output::with_wait_hint(error, hint))
    };
    output::run_to_exit(runtime, linger, "exec: ", work)
}

/// The run with a thread name replaced by the id it resolves to in CODEX_HOME
/// ([`binding::thread_named`]), so that the thread is guarded as an id is and codex runs
/// exactly that thread; unchanged without a store, for an id, or for a name nothing has.
fn resolve_name(run: ExecArgs, store: Option<&str>) -> ExecArgs {
    let named = run
        .thread_id()
        .filter(|named| !ThreadId::new(named).is_uuid());
    let (Some(named), Some(_)) = (named, store) else {
        return run;
    };
    let home = BinderOptions::default().codex_home;
    match home.and_then(|home| binding::thread_named(Path::new(&home), named)) {
        Some(thread) => run.with_thread(thread.as_str()),
        None => run,
    }
}

/// The record key of a sessionless run's thread when the run names it by id (`resume <id>`);
/// empty when codex names it (a new thread, `fork`, `resume --last`, a thread name).
fn kept_key(run: &ExecArgs) -> String {
    let named = run.thread_id().map(ThreadId::new);
    match named.filter(|thread| thread.is_uuid() && run.subcommand() == Some("resume")) {
        Some(thread) => rethread_runtime::kept::key(thread.as_str()),
        None => String::new(),
    }
}

/// Reads the run's prompt: stdin (at most 1 MiB, UTF-8, not empty), or the argument with a
/// piped stdin appended as codex appends it (`\n\n<stdin>\n...\n</stdin>`).
fn read_input(run: &ExecArgs) -> Result<Input, UsageError> {
    let images = run.option_values("image").collect();
    let not_utf8 = || UsageError("the prompt argument is not UTF-8".into());
    let given = match run.prompt() {
        Some(prompt) if prompt != OsStr::new("-") => Some(prompt.to_str().ok_or_else(not_utf8)?),
        _ => None,
    };
    let (stdin, text) = match given {
        Some(given) if std::io::stdin().is_terminal() => (None, given.to_string()),
        given => {
            let bytes = crate::chat::read_stdin("prompt")
                .map_err(|e| UsageError(format!("cannot read the prompt from stdin: {e}")))??;
            let piped = std::str::from_utf8(&bytes)
                .map_err(|_| UsageError("the prompt on stdin is not UTF-8".into()))?;
            let text = match given {
                Some(given) if piped.trim_end().is_empty() => given.to_string(),
                Some(given) => format!("{given}\n\n<stdin>\n{}\n</stdin>", piped.trim_end()),
                None if piped.trim().is_empty() => {
                    let empty = "no prompt on stdin (`exec` reads the prompt from stdin, as codex \
                                 exec does)";
                    return Err(UsageError(empty.into()));
                }
                None => piped.to_string(),
            };
            (Some(bytes), text)
        }
    };
    let text = text.trim_end_matches(['\n', '\r']).to_string();
    Ok(Input {
        stdin,
        text,
        images,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_served_by_what_they_name() {
        let kind = |args: &[&str]| kind_of(&ExecArgs::parse(args));
        assert_eq!(kind(&["--experimental-json", "--cd", "/w"]), Kind::Session);
        assert_eq!(kind(&["--experimental-json", "resume", "t1"]), Kind::Own);
        assert_eq!(kind(&["fork", "t1"]), Kind::Own);
        for passed in [
            &["--help"][..],
            &["-V"],
            &["--experimental-json", "--ephemeral"],
            &["review"],
            &["resume", "t1", "--ephemeral"],
        ] {
            assert_eq!(kind(passed), Kind::PassThrough, "{passed:?}");
        }
        // An image list swallows what codex would take as `resume <id>`: a session run.
        assert_eq!(kind(&["--image", "a.png", "resume", "t1"]), Kind::Session);
    }
}
