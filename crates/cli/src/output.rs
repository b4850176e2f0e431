//! Terminal-aware output, and the exit codes.
//!
//! Colour is decided by the stream written, each for itself ([`Stream::colour`]): `doctor >
//! report.txt` on a terminal writes no escape codes into the file, while its warnings on the
//! terminal keep theirs. `NO_COLOR` turns colour off, `CLICOLOR_FORCE` on, `CLICOLOR=0` off
//! (anstream's rules, the ones clap's own help follows). Progress bars and spinners are drawn
//! on stderr, only when it is a terminal, all through one [`MultiProgress`]; everything else
//! written to stderr while one is shown (log lines, notices, warnings) goes through
//! [`StderrAboveBars`], which writes it above the bar instead of over it.
//!
//! Exit codes: [`EXIT_OK`] 0, [`EXIT_FAILED`] 1, 2 for usage errors (clap's own), [`EXIT_TEMPORARY`]
//! 75 (busy or temporary: retry later), [`EXIT_SIGINT`] 130 and [`EXIT_SIGTERM`] 143
//! (interrupted). `doctor` exits [`EXIT_FAILED`] when any binding is not live: its error,
//! of no kind this module knows, takes the default.

use std::error::Error;
use std::fmt;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, OnceLock};

use anstyle::AnsiColor;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use rethread_runtime::{RuntimeError, StatusEvent, StatusKind, StatusSink};
use rethread_store::StoreError;

/// Success.
pub(crate) const EXIT_OK: u8 = 0;
/// A failure (the one-line cause says which); for `verify`, damage found.
pub(crate) const EXIT_FAILED: u8 = 1;
/// A usage error: flags that do not go together (clap exits 2 on its own errors).
pub(crate) const EXIT_USAGE: u8 = 2;
/// Busy or temporary (`EX_TEMPFAIL`): nothing was written; the same command may succeed later.
pub(crate) const EXIT_TEMPORARY: u8 = 75;
/// Interrupted by SIGINT (128 + 2).
pub(crate) const EXIT_SIGINT: u8 = 130;
/// Interrupted by SIGTERM (128 + 15).
pub(crate) const EXIT_SIGTERM: u8 = 143;

/// A command stopped by a signal; its exit code is 128 + the signal number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Interrupted {
    /// `SIGINT` or `SIGTERM`.
    pub(crate) signal: &'static str,
    /// The exit code.
    pub(crate) code: u8,
}

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "interrupted by {}; the turn was not committed and the session's lease was released",
            self.signal
        )
    }
}

impl Error for Interrupted {}

/// Input the command cannot use (like clap's usage errors, exit [`EXIT_USAGE`]): an empty
/// message on stdin, say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UsageError(pub(crate) String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for UsageError {}

/// The exit code of a command that failed with `error` (or with an error it wraps).
pub(crate) fn exit_code(error: &(dyn Error + 'static)) -> u8 {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(code) = own_exit_code(error) {
            return code;
        }
        next = error.source();
    }
    EXIT_FAILED
}

/// The exit code `error` itself decides, if it is one of ours.
fn own_exit_code(error: &(dyn Error + 'static)) -> Option<u8> {
    if let Some(interrupted) = error.downcast_ref::<Interrupted>() {
        return Some(interrupted.code);
    }
    if error.is::<UsageError>() {
        return Some(EXIT_USAGE);
    }
    if let Some(error) = error.downcast_ref::<RuntimeError>() {
        return Some(if error.is_retryable() {
            EXIT_TEMPORARY
        } else {
            EXIT_FAILED
        });
    }
    if let Some(error) = error.downcast_ref::<StoreError>() {
        // What the runtime's mapping makes retryable: a held or lost lease, a locked store.
        return Some(match error {
            StoreError::Busy { .. } | StoreError::LeaseLost { .. } | StoreError::Locked { .. } => {
                EXIT_TEMPORARY
            }
            _ => EXIT_FAILED,
        });
    }
    None
}

/// Prints `rethread: <cause>` on one line to stderr and returns the exit code `code`.
pub(crate) fn fail(cause: &str, code: u8) -> ExitCode {
    let one_line = cause.split_whitespace().collect::<Vec<_>>().join(" ");
    eprint_line(&format!("rethread: {}", for_people(&one_line)));
    ExitCode::from(code)
}

/// `text` safe to print for a person: every character a terminal would act on or hide
/// (control characters such as ESC or a newline, bidirectional overrides, zero-width and other
/// invisible format characters) written as its Rust escape (`\u{1b}`, `\n`), the rest as it
/// is. Ids come from hosts and may hold anything; JSON output is escaped by JSON instead.
pub(crate) fn for_people(text: &str) -> std::borrow::Cow<'_, str> {
    // `escape_debug` leaves printable characters alone, but also escapes quotes and
    // backslashes, which a terminal shows faithfully.
    let shown_as_is = |c: char| matches!(c, '"' | '\'' | '\\') || c.escape_debug().len() == 1;
    if text.chars().all(shown_as_is) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut safe = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if shown_as_is(c) {
            safe.push(c);
        } else {
            safe.extend(c.escape_debug());
        }
    }
    std::borrow::Cow::Owned(safe)
}

/// Where a piece of output goes; each stream decides its own colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    /// The reply, reports and tables.
    Stdout,
    /// Notices, warnings, logs, progress.
    Stderr,
}

impl Stream {
    /// Whether text written to this stream may carry colour: a terminal whose `TERM` has
    /// colours, unless `NO_COLOR` is set (non-empty) or `CLICOLOR=0`; `CLICOLOR_FORCE` forces
    /// it on a file or pipe too.
    pub(crate) fn colour(self) -> bool {
        let choice = match self {
            Stream::Stdout => anstream::AutoStream::choice(&std::io::stdout()),
            Stream::Stderr => anstream::AutoStream::choice(&std::io::stderr()),
        };
        choice != anstream::ColorChoice::Never
    }
}

/// `text` in `colour` when `stream` takes colour, else as it is.
pub(crate) fn paint(stream: Stream, colour: AnsiColor, text: &str) -> String {
    if stream.colour() {
        let style = colour.on_default();
        format!("{style}{text}{style:#}")
    } else {
        text.to_string()
    }
}

/// `text` in bold when `stream` takes colour.
pub(crate) fn bold(stream: Stream, text: &str) -> String {
    if stream.colour() {
        let style = anstyle::Style::new().bold();
        format!("{style}{text}{style:#}")
    } else {
        text.to_string()
    }
}

/// A table for people, printed on stdout with [`print_table`]: no borders, each column as
/// wide as its widest cell (ids of any length keep the columns straight), cell colours only
/// when stdout takes colour.
pub(crate) fn table() -> comfy_table::Table {
    let mut table = comfy_table::Table::new();
    table.load_style(comfy_table::presets::NOTHING);
    // comfy-table would ask whether stdout is a terminal itself; Stream::colour decides.
    table.force_no_tty();
    if Stream::Stdout.colour() {
        table.enforce_styling();
    }
    table
}

/// The spaces between two columns of a [`table`] (a column's width includes them).
pub(crate) const COLUMN_GAP: u16 = 2;

/// Prints `table` on stdout: [`COLUMN_GAP`] spaces between columns, none before the first or
/// after the last.
pub(crate) fn print_table(table: &mut comfy_table::Table) {
    for column in table.column_iter_mut() {
        column.set_padding((0, COLUMN_GAP));
    }
    for line in table.lines() {
        outln!("{}", line.trim_end());
    }
}

/// A lifecycle notice on stderr.
pub(crate) fn notice(message: &str) {
    eprint_line(&paint(Stream::Stderr, AnsiColor::Yellow, message));
}

/// A line on stderr, as it is.
pub(crate) fn notice_plain(line: &str) {
    eprint_line(line);
}

/// A warning on stderr.
pub(crate) fn warning(message: &str) {
    let label = paint(Stream::Stderr, AnsiColor::Magenta, "warning:");
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

/// `line` and a newline on stderr, above any bar being shown (a closed stderr is not an error
/// worth failing for: there is nowhere left to say it).
fn eprint_line(line: &str) {
    let _ = StderrAboveBars.write_all(format!("{line}\n").as_bytes());
}

/// stderr, written above the progress bars and spinners being shown ([`MultiProgress::suspend`]:
/// they are cleared, the bytes written, and they are drawn again below). The log output's
/// writer, and every line the CLI itself prints on stderr.
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

/// A progress bar on stderr, hidden when stderr is not a terminal.
pub(crate) fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = bars().add(ProgressBar::new(len));
    if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// Clears `bar` from the terminal for good.
pub(crate) fn finish(bar: &ProgressBar) {
    bar.finish_and_clear();
    bars().remove(bar);
}

/// What [`spinner`] says while it turns.
pub(crate) const SPINNER_MESSAGE: &str = "waiting for codex";

/// A spinner on stderr while something runs, ticking on its own; nothing when stderr is not
/// a terminal. [`Spinner::clear`] it before writing to the terminal; dropping it clears it too
/// (a turn interrupted by a signal leaves no spinner behind).
pub(crate) struct Spinner(ProgressBar);

impl Spinner {
    /// Clears the spinner from the terminal for good.
    pub(crate) fn clear(&self) {
        if !self.0.is_finished() {
            self.0.finish_and_clear();
            bars().remove(&self.0);
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Starts a [`Spinner`] saying `message`.
pub(crate) fn spinner(message: &str) -> Spinner {
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
    bar.enable_steady_tick(std::time::Duration::from_millis(100));
    Spinner(bar)
}

/// The rail of one CLI command: prints lifecycle notices and warnings on stderr the moment
/// they happen, and keeps the lifecycle notices for a JSON report.
///
/// Notices print with `--json` too: a fallback's notice is said when the thread is given up,
/// before the turn on the new thread commits (and that commit is what clears the store's
/// pending notice), so a process killed after the commit and before its JSON report has
/// still said it.
#[derive(Debug, Clone, Default)]
pub(crate) struct LiveRail {
    notices: Arc<Mutex<Vec<String>>>,
}

impl LiveRail {
    /// The lifecycle notices so far, in order.
    pub(crate) fn notices(&self) -> Vec<String> {
        self.notices
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

impl StatusSink for LiveRail {
    fn emit(&self, event: StatusEvent) {
        match event.kind {
            StatusKind::Lifecycle => {
                notice(&event.message);
                self.notices
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .push(event.message);
            }
            StatusKind::Warn => warning(&event.message),
            _ => {}
        }
    }
}

/// Builds the process's async runtime (every driver enables I/O and time); one that cannot be
/// started is reported, and its exit code returned.
pub(crate) fn runtime(
    mut builder: tokio::runtime::Builder,
) -> Result<tokio::runtime::Runtime, ExitCode> {
    builder.enable_all().build().map_err(|error| {
        fail(
            &format!("could not start the async runtime: {error}"),
            EXIT_FAILED,
        )
    })
}

/// `println!` for what the commands print on stdout. A reader that went away
/// (`rethread sessions list | head -1`) ends the process quietly with [`EXIT_OK`], as
/// `ls | head -1` ends; `println!` would panic. Any other write error (a full disk behind
/// `> report.txt`) fails the command with [`EXIT_FAILED`]. The process exits without running
/// destructors, as a killed one would: what is committed stays, an open store recovers.
macro_rules! outln {
    () => {
        $crate::output::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}
pub(crate) use outln;

/// `print!` through [`write_stdout`], as [`outln!`] is `println!`.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!($($arg)*))
    };
}
pub(crate) use out;

/// What [`outln!`] writes through.
pub(crate) fn write_stdout(text: fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    match out.write_fmt(text) {
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
