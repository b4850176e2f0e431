//! Terminal-aware output, and the exit codes.
//!
//! Colour is decided by each stream for itself ([`colour`], anstream's rules, the ones
//! clap's help follows): `doctor > report.txt` writes no escape codes into the file. Progress
//! bars and spinners are drawn on stderr only when it is a terminal, all through one
//! [`MultiProgress`]; every other line on stderr goes through [`StderrAboveBars`], above them.

use rethread_store::Unpoisoned;
use std::borrow::Cow;
use std::error::Error;
use std::fmt;
use std::future::Future;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anstream::stream::RawStream;
use anstyle::{AnsiColor, Style};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use rethread_runtime::{RuntimeError, StatusEvent, StatusKind, StatusSink};
use rethread_store::StoreError;

use crate::CliResult;

pub(crate) const EXIT_OK: u8 = 0;
/// A failure (the one-line cause says which); the default for an error of no kind known here.
pub(crate) const EXIT_FAILED: u8 = 1;
/// A usage error (clap exits 2 on its own).
pub(crate) const EXIT_USAGE: u8 = 2;
/// Busy or temporary (`EX_TEMPFAIL`): nothing was written; the same command may succeed later.
pub(crate) const EXIT_TEMPORARY: u8 = 75;
/// Interrupted by SIGINT (128 + 2).
pub(crate) const EXIT_SIGINT: u8 = 130;
/// Interrupted by SIGTERM (128 + 15).
pub(crate) const EXIT_SIGTERM: u8 = 143;

/// A command stopped by `signal` (`SIGINT` or `SIGTERM`); it exits with `code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("interrupted by {signal}; the turn was not committed and the session's lease was released")]
pub(crate) struct Interrupted {
    pub(crate) signal: &'static str,
    pub(crate) code: u8,
}

/// Input the command cannot use (exit [`EXIT_USAGE`]): an empty message on stdin, say.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UsageError(pub(crate) String);

/// `error` and the errors behind it, outermost first.
pub(crate) fn chain<'a>(
    error: &'a (dyn Error + 'static),
) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(error), |&error| error.source())
}

/// The exit code of a command that failed with `error`: the first one an error of its chain
/// decides.
pub(crate) fn exit_code(error: &(dyn Error + 'static)) -> u8 {
    let decided = |error: &(dyn Error + 'static)| {
        if let Some(interrupted) = error.downcast_ref::<Interrupted>() {
            Some(interrupted.code)
        } else if error.is::<UsageError>() {
            Some(EXIT_USAGE)
        } else if let Some(error) = error.downcast_ref::<RuntimeError>() {
            Some(if error.is_retryable() {
                EXIT_TEMPORARY
            } else {
                EXIT_FAILED
            })
        } else {
            // What the runtime's mapping makes retryable: a held or lost lease, a locked store.
            error.downcast_ref::<StoreError>().map(|error| match error {
                StoreError::Busy { .. }
                | StoreError::LeaseLost { .. }
                | StoreError::Locked { .. } => EXIT_TEMPORARY,
                // The key given does not fit the store: the command as given cannot run.
                StoreError::KeyRequired { .. }
                | StoreError::WrongKey { .. }
                | StoreError::NotSealed { .. } => EXIT_USAGE,
                _ => EXIT_FAILED,
            })
        }
    };
    chain(error).find_map(decided).unwrap_or(EXIT_FAILED)
}

/// A session another process holds, said with how the command waits for one (`hint`): the
/// runtime's message names the holder, not the command's setting. The runtime's error stays
/// its source, so the exit code (75) and `--json`'s kind (`session_busy`) are unchanged.
#[derive(Debug, thiserror::Error)]
#[error("{source}; {hint}")]
struct BusyWithHint {
    source: rethread_runtime::BoxError,
    hint: &'static str,
}

/// `error` with `hint` said after it when it is a session another process holds.
pub(crate) fn with_wait_hint(
    error: rethread_runtime::BoxError,
    hint: &'static str,
) -> rethread_runtime::BoxError {
    let busy = chain(&*error).any(|e| {
        matches!(
            e.downcast_ref::<RuntimeError>(),
            Some(RuntimeError::SessionBusy { .. })
        ) || matches!(
            e.downcast_ref::<StoreError>(),
            Some(StoreError::Busy { .. })
        )
    });
    match busy {
        true => Box::new(BusyWithHint {
            source: error,
            hint,
        }),
        false => error,
    }
}

/// A failure as the `--json` outputs report it: `{"kind", "message"}`. The kind is the
/// runtime's, `interrupted`, `usage`, or `store` / `client` for a store or codex that could
/// not be opened; else `failed`.
pub(crate) fn error_json(error: &(dyn Error + 'static)) -> serde_json::Value {
    let kind = chain(error).find_map(|error| {
        if error.is::<Interrupted>() {
            Some("interrupted")
        } else if error.is::<UsageError>() {
            Some("usage")
        } else if let Some(error) = error.downcast_ref::<RuntimeError>() {
            Some(error.kind())
        } else if error.is::<StoreError>() {
            Some("store")
        } else {
            error
                .is::<rethread_runtime::ClientError>()
                .then_some("client")
        }
    });
    let message = one_line(&error.to_string());
    serde_json::json!({"kind": kind.unwrap_or("failed"), "message": message})
}

/// Prints `rethread: <cause>` on one line to stderr and returns the exit code `code`.
pub(crate) fn fail(cause: &str, code: u8) -> ExitCode {
    eprint_line(&format!("rethread: {}", for_people(&one_line(cause))));
    ExitCode::from(code)
}

/// `text` with every run of whitespace, newlines included, one space.
pub(crate) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `text` safe to print for a person: every character a terminal would act on or hide
/// (control characters such as ESC or a newline, bidirectional overrides, zero-width and other
/// invisible format characters) written as its Rust escape (`\u{1b}`, `\n`), the rest as it
/// is. Ids come from hosts and may hold anything; JSON output is escaped by JSON instead.
pub(crate) fn for_people(text: &str) -> Cow<'_, str> {
    // `escape_debug` leaves printable characters alone, but also escapes quotes and
    // backslashes, which a terminal shows faithfully.
    let shown_as_is = |c: char| matches!(c, '"' | '\'' | '\\') || c.escape_debug().len() == 1;
    if text.chars().all(shown_as_is) {
        return Cow::Borrowed(text);
    }
    let mut safe = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match shown_as_is(c) {
            true => safe.push(c),
            false => safe.extend(c.escape_debug()),
        }
    }
    Cow::Owned(safe)
}

/// Whether `stream` (stdout, stderr) takes colour: a terminal whose `TERM` has colours, unless
/// `NO_COLOR` is set (non-empty) or `CLICOLOR=0`; `CLICOLOR_FORCE` forces it on a pipe too.
pub(crate) fn colour(stream: &impl RawStream) -> bool {
    anstream::AutoStream::choice(stream) != anstream::ColorChoice::Never
}

/// `text` in `style` when `stream` takes colour, else as it is.
pub(crate) fn paint(stream: &impl RawStream, style: Style, text: &str) -> String {
    match colour(stream) {
        true => format!("{style}{text}{style:#}"),
        false => text.to_string(),
    }
}

/// A table for people, printed with [`print_table`]: no borders, each column as wide as its
/// widest cell, cell colours only when stdout takes colour.
pub(crate) fn table() -> comfy_table::Table {
    let mut table = comfy_table::Table::new();
    table.load_style(comfy_table::presets::NOTHING);
    // comfy-table would ask whether stdout is a terminal itself; `colour` decides.
    table.force_no_tty();
    if colour(&std::io::stdout()) {
        table.enforce_styling();
    }
    table
}

/// The spaces between two columns of a [`table`] (a column's width includes them).
pub(crate) const COLUMN_GAP: u16 = 2;

/// Prints `table` on stdout: [`COLUMN_GAP`] spaces between columns, none after the last.
pub(crate) fn print_table(table: &mut comfy_table::Table) {
    for column in table.column_iter_mut() {
        column.set_padding((0, COLUMN_GAP));
    }
    for line in table.lines() {
        outln!("{}", line.trim_end());
    }
}

/// A warning on stderr.
pub(crate) fn warning(message: &str) {
    let label = paint(
        &std::io::stderr(),
        AnsiColor::Magenta.on_default(),
        "warning:",
    );
    eprint_line(&format!("{label} {message}"));
}

/// The bars and spinners being shown: drawn on stderr when it is a terminal, hidden otherwise.
fn bars() -> &'static MultiProgress {
    static BARS: OnceLock<MultiProgress> = OnceLock::new();
    BARS.get_or_init(|| {
        MultiProgress::with_draw_target(if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        })
    })
}

/// `line` and a newline on stderr, above any bar (a closed stderr is not worth failing for:
/// there is nowhere left to say it).
pub(crate) fn eprint_line(line: &str) {
    let _ = StderrAboveBars.write_all(format!("{line}\n").as_bytes());
}

/// stderr, written above the bars being shown ([`MultiProgress::suspend`]: they are cleared,
/// the bytes written, and they are drawn again below): the log output's writer, and every line
/// the CLI itself prints on stderr.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StderrAboveBars;

impl Write for StderrAboveBars {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        bars().suspend(|| std::io::stderr().write(bytes))
    }

    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        bars().suspend(|| std::io::stderr().write_all(bytes))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// A progress bar on stderr (hidden when stderr is not a terminal) of `len` steps
/// ([`set_length`]); [`finish`] ends it.
pub(crate) fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = bars().add(ProgressBar::new(len));
    style_for(&bar, len);
    bar.set_message(what.to_string());
    bar
}

/// Sets the number of steps of `bar` (once known): a bar of none is drawn as its count alone,
/// since indicatif draws 0 of 0 as a full bar, which reads as work done.
pub(crate) fn set_length(bar: &ProgressBar, len: u64) {
    if bar.length() != Some(len) {
        style_for(bar, len);
        bar.set_length(len);
    }
}

fn style_for(bar: &ProgressBar, len: u64) {
    let template = match len {
        0 => "{msg} {pos}/{len}",
        _ => "{msg} [{bar:30}] {pos}/{len}",
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
}

/// Clears `bar` from the terminal for good.
pub(crate) fn finish(bar: &ProgressBar) {
    if !bar.is_finished() {
        bar.finish_and_clear();
        bars().remove(bar);
    }
}

/// A spinner on stderr, ticking on its own (nothing when stderr is not a terminal);
/// [`Spinner::clear`] it before writing to the terminal. Dropped, it clears itself: a turn
/// interrupted by a signal leaves no spinner behind.
pub(crate) struct Spinner(ProgressBar);

impl Spinner {
    /// Starts a spinner saying `message`.
    pub(crate) fn start(message: &str) -> Spinner {
        if !std::io::stderr().is_terminal() {
            return Spinner(ProgressBar::hidden());
        }
        let bar = bars().add(ProgressBar::no_length());
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg}") {
            bar.set_style(style);
        }
        bar.set_message(message.to_string());
        // Drawn at once, not at the first tick: a quick turn still shows it was waited for.
        bar.tick();
        bar.enable_steady_tick(Duration::from_millis(100));
        Spinner(bar)
    }

    /// Clears the spinner from the terminal for good.
    pub(crate) fn clear(&self) {
        finish(&self.0);
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.clear();
    }
}

/// The rail of one CLI command: prints lifecycle notices and warnings on stderr the moment
/// they happen, and keeps the notices for a JSON report.
///
/// Notices print with `--json` too: a fallback's notice is said when the thread is given up,
/// before the commit on the new thread clears the store's pending notice, so a process killed
/// between that commit and its JSON report has still said it.
#[derive(Debug, Clone, Default)]
pub(crate) struct LiveRail {
    notices: Arc<Mutex<Vec<String>>>,
}

impl LiveRail {
    /// The lifecycle notices so far, in order.
    pub(crate) fn notices(&self) -> Vec<String> {
        self.notices.lock().unpoisoned().clone()
    }
}

impl StatusSink for LiveRail {
    fn emit(&self, event: StatusEvent) {
        match event.kind {
            StatusKind::Lifecycle => {
                let yellow = AnsiColor::Yellow.on_default();
                eprint_line(&paint(&std::io::stderr(), yellow, &event.message));
                let mut notices = self.notices.lock().unpoisoned();
                notices.push(event.message);
            }
            StatusKind::Warn => warning(&event.message),
            _ => {}
        }
    }
}

/// Runs `work` on a runtime from `builder`, then gives the background work up to `linger`
/// (the process's exit must not wait on a wedged store, nor on a blocked read of stdin). The
/// exit code is `work`'s, or its error's, printed as one line after `prefix`.
pub(crate) fn run_to_exit(
    mut builder: tokio::runtime::Builder,
    linger: Duration,
    prefix: &str,
    work: impl Future<Output = CliResult<u8>>,
) -> ExitCode {
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            let cause = format!("could not start the async runtime: {error}");
            return fail(&cause, EXIT_FAILED);
        }
    };
    let result = runtime.block_on(work);
    runtime.shutdown_timeout(linger);
    match result {
        Ok(code) => ExitCode::from(code),
        Err(error) => fail(&format!("{prefix}{error}"), exit_code(&*error)),
    }
}

/// `println!` for what the commands print on stdout. A reader that went away
/// (`rethread sessions list | head -1`) ends the process quietly with [`EXIT_OK`], as
/// `ls | head -1` ends, where `println!` would panic; any other write error (a full disk)
/// fails it with [`EXIT_FAILED`]. The process exits without running destructors, as a killed
/// one would: what is committed stays, an open store recovers.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}
pub(crate) use outln;

/// `print!` as [`outln!`] is `println!`.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!($($arg)*))
    };
}
pub(crate) use out;

/// What [`outln!`] writes through.
pub(crate) fn write_stdout(text: fmt::Arguments<'_>) {
    match std::io::stdout().lock().write_fmt(text) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => {
            std::process::exit(EXIT_OK.into())
        }
        Err(error) => {
            eprint_line(&format!("rethread: cannot write to stdout: {error}"));
            std::process::exit(EXIT_FAILED.into())
        }
    }
}
