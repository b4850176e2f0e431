//! Terminal-aware output: colours and progress bars only on a terminal.

use std::io::IsTerminal;
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Prints `rethread: <cause>` on one line to stderr and returns exit code 1.
pub(crate) fn fail(cause: &str) -> ExitCode {
    let one_line = cause.split_whitespace().collect::<Vec<_>>().join(" ");
    eprintln!("rethread: {one_line}");
    ExitCode::FAILURE
}

fn stderr_is_terminal() -> bool {
    std::io::stderr().is_terminal()
}

/// Paints `text` with an ANSI colour code when stderr is a terminal (and `NO_COLOR` unset).
pub(crate) fn paint(code: &str, text: &str) -> String {
    if stderr_is_terminal() && std::env::var_os("NO_COLOR").is_none() {
        format!("\x1b[{code}m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}

/// A lifecycle notice on stderr.
pub(crate) fn notice(message: &str) {
    eprintln!("{}", paint("33", message));
}

/// A warning on stderr.
pub(crate) fn warning(message: &str) {
    eprintln!("{} {message}", paint("35", "warning:"));
}

/// A progress bar on stderr, hidden when stderr is not a terminal.
pub(crate) fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(
        Some(len),
        if stderr_is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}
