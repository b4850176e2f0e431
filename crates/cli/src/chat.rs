//! `rethread chat`: one turn, resumed across invocations.
//!
//! Notices print on stderr as they happen, with `--json` too; the reply prints on stdout as
//! codex writes it (`chat/reply.rs`), or `--json` prints one object, also on failure (`error`
//! and the notices said so far). The session's lease is released however the turn ended:
//! done, failed, or interrupted by SIGINT/SIGTERM (exit 130/143). A release that fails after
//! the turn committed is a warning, never a failure: the turn is durable and must not be
//! retried.

mod reply;

use std::error::Error;
use std::future::Future;
use std::io::Read;
use std::path::PathBuf;
use std::pin::{pin, Pin};
use std::time::Duration;

use rethread_runtime::{
    AppServerClient, BinderOptions, BoxError, ClientError, OpenOutcome, RuntimeError,
    SessionBinder, StatusEvent, StatusKind, StatusRail, TurnEnd, TurnInput, TurnReport,
};
use rethread_store::BindingStore;
use serde_json::{json, Value};

use crate::output::{self, outln, Interrupted, LiveRail, UsageError};
use crate::{open_store, Access, CliResult, CodexBinArg, StoreArg};

#[derive(Debug, clap::Args)]
pub(crate) struct ChatCommand {
    #[command(flatten)]
    pub(crate) store: StoreArg,
    #[command(flatten)]
    pub(crate) codex_bin: CodexBinArg,
    /// The host session id.
    #[arg(long, value_name = "ID", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    session: String,
    /// Print one JSON object instead of the reply: `session`, `thread_id`, `outcome`
    /// (`resumed`, `started`, `fell_back`), `reason` (after a fallback), `notices`, `reply`.
    /// Also on failure: `session`, `error` (`kind`, `message`), `notices`, and `thread_id` /
    /// `outcome` / `reason` when a thread was opened.
    #[arg(long)]
    json: bool,
    /// Wait up to SECS for a session another host holds (default: fail at once, exit 75).
    #[arg(long, value_name = "SECS", default_value_t = 0.0, value_parser = crate::parse_wait)]
    wait: f64,
    /// An image file to send with the message (repeatable); codex reads it and gives the
    /// model its bytes.
    #[arg(long = "image", value_name = "PATH")]
    images: Vec<PathBuf>,
    /// Do not mirror the thread's rollout into the store (nor restore it from there):
    /// the thread then resumes only where codex keeps it. Also `RETHREAD_MIRROR=off`.
    #[arg(long)]
    no_mirror: bool,
    /// The session's cap of mirrored rollout bytes (default 1 GiB; also `RETHREAD_MIRROR_CAP`):
    /// past it mirroring stops for the session's thread, and starts again for the next one.
    #[arg(long, value_name = "BYTES", value_parser = rethread_runtime::parse_mirror_cap)]
    mirror_cap: Option<u64>,
    /// The message; `-` reads it from stdin.
    message: String,
}

/// Reads and checks the arguments, then runs the turn.
pub(crate) async fn main(command: ChatCommand) -> CliResult {
    let wait = Duration::from_secs_f64(command.wait);
    let mut args = ChatArgs {
        session: command.session,
        message: command.message,
        images: command.images,
        json: command.json,
        options: BinderOptions::default(),
    };
    // Everything is read, and refused, before codex starts; under `--json` a failure here is
    // reported as one object too.
    let ready = async {
        crate::app_server::user_session(Some(args.session.clone())).map_err(UsageError)?;
        args.options = crate::binder_options(wait, command.no_mirror)?;
        if let Some(cap) = command.mirror_cap {
            args.options.mirror_cap = cap;
        }
        let codex = command.codex_bin.resolve()?;
        args.images = image_paths(&args.images)?;
        args.message = read_message(std::mem::take(&mut args.message)).await?;
        let store = open_store(command.store.url.as_deref(), Access::Write(wait)).await?;
        Ok((store, codex))
    }
    .await;
    let (store, codex) = match ready {
        Ok(ready) => ready,
        Err(error) => return finish(&args, &[], Conversation::failed(error)),
    };
    let live = LiveRail::default();
    let rail = StatusRail::new(live.clone());
    // Before codex is spawned: a Ctrl-C from here on is this process's to handle, and codex,
    // whose spawn blocks signals until it execs, never outlives it holding a copy of the
    // store's descriptor (redb's lock with it).
    let mut signal = pin!(interrupted());
    let spawned = AppServerClient::builder()
        .rail(rail.clone())
        .spawn(&crate::codex_child::codex_command(&codex))
        .await;
    let conversation = match spawned {
        Ok(client) => {
            let conversation = converse(store, &client, rail, &args, signal.as_mut()).await;
            client.shutdown().await;
            conversation
        }
        Err(error) => {
            Conversation::failed(or_interrupted(RuntimeError::from(error).into(), signal).await)
        }
    };
    finish(&args, &live.notices(), conversation)
}

/// The arguments of `chat`, read and checked.
#[derive(Debug, Clone)]
pub(crate) struct ChatArgs {
    pub(crate) session: String,
    pub(crate) message: String,
    /// Image files sent with the message (absolute paths).
    pub(crate) images: Vec<PathBuf>,
    pub(crate) json: bool,
    /// The lease's wait and TTL, and the mirror.
    pub(crate) options: BinderOptions,
}

/// The most a message read from stdin may hold: 1 MiB, codex's own limit on a turn's text
/// (1,048,576 characters; bytes here, so that stdin is never read further than this plus a
/// line ending).
pub(crate) const MAX_STDIN_MESSAGE: usize = 1024 * 1024;

/// All of stdin (the `what` of `chat -` or `exec`), read no further than
/// [`MAX_STDIN_MESSAGE`] and a `\r\n`: the inner `Err` when it is longer, trailing line
/// endings aside.
pub(crate) fn read_stdin(what: &str) -> std::io::Result<Result<Vec<u8>, UsageError>> {
    let read_at_most = MAX_STDIN_MESSAGE + 3;
    let mut bytes = Vec::new();
    let stdin = std::io::stdin().lock();
    stdin.take(read_at_most as u64).read_to_end(&mut bytes)?;
    let line_ends = bytes
        .iter()
        .rev()
        .take_while(|b| matches!(b, b'\n' | b'\r'));
    if bytes.len() == read_at_most || bytes.len() - line_ends.count() > MAX_STDIN_MESSAGE {
        return Ok(Err(UsageError(format!(
            "the {what} on stdin is longer than 1 MiB ({MAX_STDIN_MESSAGE} bytes), the most \
             codex takes in one turn"
        ))));
    }
    Ok(Ok(bytes))
}

/// The message of `chat`: `message` itself, or for `-` all of stdin (UTF-8, trailing newlines
/// removed, so `echo hi | rethread chat -` sends `hi`). Empty or blank, either way, is a
/// [`UsageError`].
async fn read_message(message: String) -> CliResult<String> {
    let message = match message.as_str() {
        "-" => {
            let cannot =
                |e: &dyn std::fmt::Display| format!("cannot read the message from stdin: {e}");
            // Reading stdin blocks: not on the runtime's threads.
            let read = tokio::task::spawn_blocking(|| read_stdin("message")).await;
            let bytes = read.map_err(|e| cannot(&e))?.map_err(|e| cannot(&e))??;
            let text = String::from_utf8(bytes)
                .map_err(|_| UsageError("the message on stdin is not UTF-8".into()))?;
            text.trim_end_matches(['\n', '\r']).to_string()
        }
        _ => message,
    };
    if message.trim().is_empty() {
        let empty = "the message is empty; give it as the argument, or `-` to read it from stdin";
        return Err(UsageError(empty.into()).into());
    }
    Ok(message)
}

/// The `--image` files, made absolute (codex resolves a relative path against its own working
/// directory); one that is not a readable file is a [`UsageError`], before anything is sent.
fn image_paths(images: &[PathBuf]) -> Result<Vec<PathBuf>, UsageError> {
    let image = |path: &PathBuf| {
        let refused =
            |e: &dyn std::fmt::Display| UsageError(format!("--image {}: {e}", path.display()));
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_file() => std::path::absolute(path).map_err(|e| refused(&e)),
            Ok(_) => Err(refused(&"not a file")),
            Err(e) => Err(refused(&e)),
        }
    };
    images.iter().map(image).collect()
}

/// How one invocation ended.
#[derive(Debug)]
pub(crate) struct Conversation {
    /// How the codex session was opened, if it was.
    pub(crate) opened: Option<OpenOutcome>,
    /// The turn, or why there is none.
    pub(crate) result: Result<TurnReport, BoxError>,
}

impl Conversation {
    /// An invocation that failed before a session was opened.
    fn failed(error: BoxError) -> Self {
        let (opened, result) = (None, Err(error));
        Conversation { opened, result }
    }
}

/// Runs the turn, with the session's lease released afterwards however the turn ended. A
/// signal before the turn's commit began drops the turn (nothing of it is committed); one that
/// comes while the turn is being committed lets the commit finish, and the turn is reported as
/// done: a turn reported as interrupted is never in the store, so retrying it adds it once.
pub(crate) async fn converse(
    store: BindingStore,
    client: &AppServerClient,
    rail: StatusRail,
    args: &ChatArgs,
    signal: impl Future<Output = Interrupted>,
) -> Conversation {
    let mut binder = SessionBinder::new(args.session.clone(), store, rail.clone())
        .with_options(args.options.clone());
    let mut opened = None;
    let mut signal = pin!(signal);
    let result = match turn(&mut binder, client, args, &mut opened, signal.as_mut()).await {
        Err(error) => Err(or_interrupted(error, signal).await),
        Ok(report) => Ok(report),
    };
    if let Err(error) = binder.close().await {
        rail.emit(StatusEvent::new(
            StatusKind::Warn,
            format!("could not release the session's lease (it expires on its own): {error}"),
        ));
    }
    Conversation { opened, result }
}

/// `error`, or the interrupt behind it when codex closed ([`late_signal`]): reported as the
/// user's interrupt (130/143), not as codex closing (1).
async fn or_interrupted(error: BoxError, signal: impl Future<Output = Interrupted>) -> BoxError {
    let codex_closed = matches!(
        error.downcast_ref::<RuntimeError>(),
        Some(RuntimeError::Client(ClientError::Closed { .. }))
    );
    match codex_closed {
        true => late_signal(signal).await.map_or(error, Into::into),
        false => error,
    }
}

async fn turn(
    binder: &mut SessionBinder,
    client: &AppServerClient,
    args: &ChatArgs,
    opened: &mut Option<OpenOutcome>,
    mut signal: Pin<&mut impl Future<Output = Interrupted>>,
) -> Result<TurnReport, BoxError> {
    // A session whose lease another host holds fails here with `SessionBusy` (after
    // `--wait`), whose one-line message names the holder (host, pid, since).
    let mut session = tokio::select! {
        session = binder.open(client) => session?,
        interrupted = signal.as_mut() => return Err(interrupted.into()),
    };
    *opened = Some(session.outcome().clone());
    // Human output: a spinner on a terminal until the reply starts, then the reply on stdout
    // as it is written.
    let mut human = (!args.json).then(|| {
        let spinner = output::Spinner::start("waiting for codex");
        (spinner, reply::ReplyPrinter::new(std::io::stdout()))
    });
    let mut input = TurnInput::text(&args.message);
    for image in &args.images {
        input = input.with_local_image(image);
    }
    let turn = tokio::select! {
        turn = session.run_turn_streamed(input) => turn?,
        interrupted = signal.as_mut() => return Err(interrupted.into()),
    };
    let ended = turn
        .finish_unless(signal, |event| {
            if let Some((spinner, printer)) = &mut human {
                if reply::shows_text(event) {
                    spinner.clear();
                }
                printer.show(event);
            }
        })
        .await;
    let printer = human.map(|(_spinner, printer)| printer);
    match ended? {
        TurnEnd::Completed(report) => {
            if let Some(mut printer) = printer {
                printer.finish(&report.reply);
            }
            Ok(*report)
        }
        TurnEnd::Stopped(interrupted) => Err(interrupted.into()),
    }
}

/// How long an unexplained end of codex waits for the SIGINT or SIGTERM that may have ended it
/// ([`late_signal`]).
pub(crate) const SIGNAL_GRACE: Duration = Duration::from_millis(500);

/// The signal that may have ended codex: a terminal's Ctrl-C reaches codex too (one process
/// group), and codex may die of it before this process sees it.
pub(crate) async fn late_signal(signal: impl Future<Output = Interrupted>) -> Option<Interrupted> {
    tokio::time::timeout(SIGNAL_GRACE, signal).await.ok()
}

/// Installs the SIGINT and SIGTERM handlers now ([`rethread_runtime::stop_signal`]), and
/// returns what resolves when either arrives (never, if they cannot be installed).
pub(crate) fn interrupted() -> impl Future<Output = Interrupted> {
    let stop = rethread_runtime::stop_signal();
    async move {
        let (signal, code) = match stop.await {
            15 => ("SIGTERM", output::EXIT_SIGTERM),
            _ => ("SIGINT", output::EXIT_SIGINT),
        };
        Interrupted { signal, code }
    }
}

/// How `chat` waits for a session another host holds.
const WAIT_HINT: &str = "retry later, or wait for it with `--wait SECS`";

/// Prints the result under `--json` (the reply itself was printed as it came) and returns the
/// error, if any, for `main` to print as one line with its exit code.
pub(crate) fn finish(args: &ChatArgs, notices: &[String], conversation: Conversation) -> CliResult {
    let Conversation { opened, result } = conversation;
    let result = result.map_err(|error| output::with_wait_hint(error, WAIT_HINT));
    if args.json {
        let mut object = match &result {
            Ok(report) => json!({
                "session": args.session,
                "thread_id": report.thread_id,
                "notices": notices,
                "reply": report.reply,
            }),
            Err(error) => failure_json(args, notices, opened.as_ref(), &**error),
        };
        if let Some(outcome) = &opened {
            object["outcome"] = json!(outcome.as_str());
            if let OpenOutcome::FellBack { reason, .. } = outcome {
                object["reason"] = json!(reason.as_str());
            }
        }
        outln!("{object}");
    }
    result.map(drop)
}

/// `{"session", "error": {"kind", "message"}, "notices", ["thread_id"]}`.
fn failure_json(
    args: &ChatArgs,
    notices: &[String],
    opened: Option<&OpenOutcome>,
    error: &(dyn Error + 'static),
) -> Value {
    let mut object = json!({
        "session": args.session,
        "error": output::error_json(error),
        "notices": notices,
    });
    if let Some(outcome) = opened {
        object["thread_id"] = json!(outcome.thread_id());
    }
    object
}

#[cfg(test)]
mod tests {
    use super::*;
    use rethread_fake_appserver::FakeAppServer;
    use rethread_store::BindingStore;

    fn args(session: &str) -> ChatArgs {
        ChatArgs {
            session: session.into(),
            message: "hello".into(),
            images: Vec::new(),
            json: true,
            // The binder's CODEX_HOME is not the fake's: nothing to mirror.
            options: BinderOptions::default().mirror(false),
        }
    }

    /// Issue 12, "a committed turn reported as failed": a lease release that fails after the
    /// commit made `chat` exit 1 without the reply, and a retry duplicated the turn.
    #[tokio::test]
    async fn a_release_failure_after_the_commit_is_a_warning_and_the_turn_stands() {
        let memory = BindingStore::memory();
        let faults = rethread_testkit::faulty_store::Faults::default();
        faults.fail("release_lease", 1);
        let store = rethread_testkit::faulty_store::over(memory.clone(), faults.clone());
        let home = tempfile::tempdir().unwrap();
        let (stream, _fake) = FakeAppServer::builder()
            .codex_home(home.path())
            .spawn_in_process()
            .unwrap();
        let (reader, writer) = tokio::io::split(stream);
        let (rail, recorded) = StatusRail::recording();
        let client = AppServerClient::builder()
            .rail(rail.clone())
            .connect(reader, writer)
            .await
            .unwrap();
        let conversation =
            converse(store, &client, rail, &args("s1"), std::future::pending()).await;
        assert_eq!(faults.calls("release_lease"), 1, "the release was tried");
        let report = conversation.result.as_ref().expect("the turn stands");
        assert_eq!(report.reply, "echo: hello");
        assert!(finish(&args("s1"), &[], conversation).is_ok());
        let warnings = recorded.messages(StatusKind::Warn);
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("could not release the session's lease")),
            "{warnings:?}"
        );
        let record = memory.session("s1").await.unwrap().unwrap();
        assert_eq!(record.row_count, 2, "committed once");
    }
}
