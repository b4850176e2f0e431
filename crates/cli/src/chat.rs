//! `rethread chat`: one turn, resumed across invocations.
//!
//! Notices print on stderr the moment they happen (before the reply), with `--json` too; the
//! reply prints on stdout as codex writes it (`chat/reply.rs`); `--json` prints one object on
//! stdout, also on failure (`error` and the `notices` said so far). The session's
//! lease is released before the process exits, however the turn ended: done, failed, or
//! interrupted by SIGINT/SIGTERM (exit 130/143). A release that fails after the turn committed
//! is a warning, never a failure: the turn is durable and must not be retried.

use crate::output::outln;
use std::error::Error;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::time::Duration;

use rethread_runtime::{
    AppServerClient, BinderOptions, ClientError, CodexCommand, OpenOutcome, RuntimeError,
    SessionBinder, StatusEvent, StatusKind, StatusRail, TurnEnd, TurnInput, TurnReport,
};

mod reply;
use rethread_store::{BindingStore, StoreError};
use serde_json::{json, Value};

use crate::output::{self, Interrupted, LiveRail, UsageError};
use crate::CliResult;

type BoxError = Box<dyn Error + Send + Sync>;

/// The arguments of `chat`.
#[derive(Debug, Clone)]
pub(crate) struct ChatArgs {
    pub(crate) session: String,
    pub(crate) message: String,
    /// Image files sent with the message (absolute paths).
    pub(crate) images: Vec<PathBuf>,
    pub(crate) json: bool,
    /// How long to wait for a session another host holds.
    pub(crate) wait: Duration,
    /// The session lease's TTL (`RETHREAD_LEASE_TTL`); `None`: the library's default.
    pub(crate) lease_ttl: Option<Duration>,
    /// Mirror the thread's rollout into the store (`--no-mirror`, `RETHREAD_MIRROR`).
    pub(crate) mirror: bool,
}

/// The `MESSAGE` that means "read the message from stdin".
pub(crate) const FROM_STDIN: &str = "-";

/// The most a message read from stdin may hold: 1 MiB, codex's own limit on a turn's text
/// (1,048,576 characters; bytes here, so that stdin is never read further than this plus a
/// line ending).
pub(crate) const MAX_STDIN_MESSAGE: usize = 1024 * 1024;

/// The message of `chat`: `message` itself, or for [`FROM_STDIN`] all of stdin (UTF-8,
/// trailing newlines removed, so `echo hi | rethread chat -` sends `hi`). An empty message on
/// stdin, or one over [`MAX_STDIN_MESSAGE`] bytes, is a [`UsageError`]; stdin is read no
/// further than the limit and a `\r\n`.
pub(crate) async fn read_message(message: String) -> Result<String, BoxError> {
    if message != FROM_STDIN {
        return Ok(message);
    }
    const READ_AT_MOST: usize = MAX_STDIN_MESSAGE + 3;
    // Reading stdin blocks: not on the runtime's threads.
    let bytes = tokio::task::spawn_blocking(|| {
        let mut bytes = Vec::new();
        let stdin = std::io::stdin().lock();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(stdin, READ_AT_MOST as u64),
            &mut bytes,
        )
        .map(|_| bytes)
    })
    .await
    .map_err(|e| format!("cannot read the message from stdin: {e}"))?
    .map_err(|e| format!("cannot read the message from stdin: {e}"))?;
    let too_long = || {
        UsageError(format!(
            "the message on stdin is longer than 1 MiB ({MAX_STDIN_MESSAGE} bytes), the most \
             codex takes in one turn"
        ))
    };
    if bytes.len() == READ_AT_MOST {
        return Err(too_long().into());
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| UsageError("the message on stdin is not UTF-8".into()))?;
    let text = text.trim_end_matches(['\n', '\r']);
    if text.len() > MAX_STDIN_MESSAGE {
        return Err(too_long().into());
    }
    if text.trim().is_empty() {
        return Err(Box::new(UsageError(
            "no message on stdin (`chat -` reads the message from stdin)".into(),
        )));
    }
    Ok(text.to_string())
}

/// The `--image` files, made absolute (codex resolves a relative path against its own working
/// directory); one that is not a readable file is a [`UsageError`], before anything is sent.
pub(crate) fn image_paths(images: &[PathBuf]) -> Result<Vec<PathBuf>, BoxError> {
    images
        .iter()
        .map(|path| match std::fs::metadata(path) {
            Ok(meta) if meta.is_file() => std::path::absolute(path).map_err(|e| {
                BoxError::from(UsageError(format!("--image {}: {e}", path.display())))
            }),
            Ok(_) => Err(UsageError(format!("--image {}: not a file", path.display())).into()),
            Err(e) => Err(UsageError(format!("--image {}: {e}", path.display())).into()),
        })
        .collect()
}

/// The turn's input: the message, then the images.
fn turn_input(args: &ChatArgs) -> TurnInput {
    args.images
        .iter()
        .fold(TurnInput::text(&args.message), |input, image| {
            input.with_local_image(image)
        })
}

/// How one invocation ended.
#[derive(Debug)]
pub(crate) struct Conversation {
    /// How the codex session was opened, if it was.
    pub(crate) opened: Option<OpenOutcome>,
    /// The turn, or why there is none.
    pub(crate) result: Result<TurnReport, BoxError>,
}

pub(crate) async fn run(store: Arc<dyn BindingStore>, codex: &Path, args: &ChatArgs) -> CliResult {
    let live = LiveRail::default();
    let rail = StatusRail::new(live.clone());
    // Before codex is spawned: a Ctrl-C from here on is this process's to handle, and codex,
    // whose spawn blocks signals until it execs, never outlives it holding a copy of the
    // store's descriptor (redb's lock with it).
    let mut signal = pin!(interrupted());
    let spawned = AppServerClient::builder()
        .rail(rail.clone())
        .spawn(&CodexCommand::new(codex))
        .await;
    let conversation = match spawned {
        Ok(client) => {
            let conversation = converse(store, &client, rail, args, signal.as_mut()).await;
            client.shutdown().await;
            conversation
        }
        Err(error) => Conversation {
            opened: None,
            result: Err(or_interrupted(RuntimeError::from(error).into(), signal.as_mut()).await),
        },
    };
    finish(args, &live.notices(), conversation)
}

/// Runs the turn, with the session's lease released afterwards however the turn ended. A
/// signal before the turn's commit began drops the turn (nothing of it is committed); one that
/// comes while the turn is being committed lets the commit finish, and the turn is reported as
/// done: a turn reported as interrupted is never in the store, so retrying it adds it once.
pub(crate) async fn converse(
    store: Arc<dyn BindingStore>,
    client: &AppServerClient,
    rail: StatusRail,
    args: &ChatArgs,
    signal: impl Future<Output = Interrupted>,
) -> Conversation {
    let mut options = BinderOptions::default()
        .lease_wait(args.wait)
        .mirror(args.mirror);
    if let Some(ttl) = args.lease_ttl {
        options = options.lease_ttl(Some(ttl));
    }
    let mut binder =
        SessionBinder::new(args.session.clone(), store, rail.clone()).with_options(options);
    let mut opened = None;
    let mut signal = pin!(signal);
    let result = match turn(&mut binder, client, args, &mut opened, signal.as_mut()).await {
        Err(error) => Err(or_interrupted(error, signal.as_mut()).await),
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

/// `error`, or the interrupt behind it. A terminal's Ctrl-C reaches codex too (one process
/// group), and codex may die of it before this process sees the signal: codex's connection
/// closing waits briefly for one, so that the user's interrupt is reported as such (130/143),
/// not as codex closing (1).
async fn or_interrupted(
    error: BoxError,
    signal: Pin<&mut impl Future<Output = Interrupted>>,
) -> BoxError {
    let codex_closed = matches!(
        error.downcast_ref::<RuntimeError>(),
        Some(RuntimeError::Client(ClientError::Closed { .. }))
    );
    if !codex_closed {
        return error;
    }
    match tokio::time::timeout(SIGNAL_GRACE, signal).await {
        Ok(interrupted) => interrupted.into(),
        Err(_) => error,
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
    // as it is written. (Dropped, the spinner clears itself.)
    let mut human = (!args.json).then(|| {
        (
            output::spinner(output::SPINNER_MESSAGE),
            reply::ReplyPrinter::stdout(),
        )
    });
    let turn = tokio::select! {
        turn = session.run_turn_streamed(turn_input(args)) => turn?,
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

/// How long a turn ended by codex closing waits for the SIGINT or SIGTERM that may have ended
/// codex (the same signal, sent to the whole process group, reaching this process later).
pub(crate) const SIGNAL_GRACE: Duration = Duration::from_millis(500);

/// Installs the SIGINT and SIGTERM handlers now, and returns what resolves when either arrives
/// (never, if they cannot be installed).
pub(crate) fn interrupted() -> impl Future<Output = Interrupted> {
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
                _ = int.recv() => Interrupted { signal: "SIGINT", code: output::EXIT_SIGINT },
                _ = term.recv() => Interrupted { signal: "SIGTERM", code: output::EXIT_SIGTERM },
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            if tokio::signal::ctrl_c().await.is_err() {
                return std::future::pending().await;
            }
            Interrupted {
                signal: "SIGINT",
                code: output::EXIT_SIGINT,
            }
        }
    }
}

/// Prints the result (the reply, or under `--json` one object) and returns the error, if any,
/// for `main` to print as one line with its exit code.
pub(crate) fn finish(args: &ChatArgs, notices: &[String], conversation: Conversation) -> CliResult {
    let Conversation { opened, result } = conversation;
    match result {
        Ok(report) => {
            if args.json {
                let mut object = json!({
                    "session": args.session,
                    "thread_id": report.thread_id,
                    "notices": notices,
                    "reply": report.reply,
                });
                describe_open(&mut object, opened.as_ref());
                outln!("{object}");
            }
            // Human output: the reply was printed as it came (`reply::ReplyPrinter`).
            Ok(())
        }
        Err(error) => {
            if args.json {
                outln!("{}", failure_json(args, notices, opened.as_ref(), &*error));
            }
            Err(error)
        }
    }
}

/// Under `--json`, the failure object of an invocation that failed before it could start (the
/// store did not open); returns the error for `main`.
pub(crate) fn report_early_failure(args: &ChatArgs, error: BoxError) -> BoxError {
    if args.json {
        outln!("{}", failure_json(args, &[], None, &*error));
    }
    error
}

/// `{"session", "error": {"kind", "message"}, "notices", ["thread_id", "outcome", "reason"]}`.
fn failure_json(
    args: &ChatArgs,
    notices: &[String],
    opened: Option<&OpenOutcome>,
    error: &(dyn Error + 'static),
) -> Value {
    let mut object = json!({
        "session": args.session,
        "error": {"kind": error_kind(error), "message": one_line(&error.to_string())},
        "notices": notices,
    });
    if let Some(outcome) = opened {
        object["thread_id"] = json!(outcome.thread_id());
    }
    describe_open(&mut object, opened);
    object
}

fn describe_open(object: &mut Value, opened: Option<&OpenOutcome>) {
    let Some(outcome) = opened else { return };
    object["outcome"] = json!(outcome.as_str());
    if let OpenOutcome::FellBack { reason, .. } = outcome {
        object["reason"] = json!(reason.as_str());
    }
}

/// The `error.kind` of a failure: the runtime's kinds, `interrupted`, or `store` / `client`
/// for a store or codex that could not be opened.
fn error_kind(error: &(dyn Error + 'static)) -> &'static str {
    let mut next = Some(error);
    while let Some(error) = next {
        if error.downcast_ref::<Interrupted>().is_some() {
            return "interrupted";
        } else if error.downcast_ref::<UsageError>().is_some() {
            return "usage";
        } else if let Some(error) = error.downcast_ref::<RuntimeError>() {
            return error.kind();
        } else if error.downcast_ref::<StoreError>().is_some() {
            return "store";
        } else if error.downcast_ref::<ClientError>().is_some() {
            return "client";
        }
        next = error.source();
    }
    "failed"
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rethread_fake_appserver::FakeAppServer;
    use rethread_store::MemoryStore;

    fn args(session: &str) -> ChatArgs {
        ChatArgs {
            session: session.into(),
            message: "hello".into(),
            images: Vec::new(),
            json: true,
            wait: Duration::ZERO,
            lease_ttl: None,
            // The binder's CODEX_HOME is not the fake's: nothing to mirror.
            mirror: false,
        }
    }

    /// Issue 12, "a committed turn reported as failed": a lease release that fails after the
    /// commit made `chat` exit 1 without the reply, and a retry duplicated the turn.
    #[tokio::test]
    async fn a_release_failure_after_the_commit_is_a_warning_and_the_turn_stands() {
        let memory = Arc::new(MemoryStore::new());
        let faults = rethread_testkit::faulty_store::Faults::default();
        faults.fail("release_lease", 1);
        let store = Arc::new(rethread_testkit::faulty_store::over(
            memory.clone(),
            faults.clone(),
        ));
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
