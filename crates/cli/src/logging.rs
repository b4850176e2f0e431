//! Log output: a `tracing-subscriber` on stderr (stdout carries the reply and the `--json`
//! objects), above any progress bar ([`crate::output::StderrAboveBars`]), in colour only when
//! stderr takes it. Warnings by default, `-v` info (each runtime span as it closes, with its
//! session and thread ids and outcome), `-vv` debug, `-vvv` trace; a non-empty `RUST_LOG`
//! replaces that level (one that does not parse is said once, and `-v`'s level used). Store
//! URLs are logged redacted only.

use clap::{ArgAction, Args, ValueEnum};
use tracing_subscriber::filter::{EnvFilter, LevelFilter};
use tracing_subscriber::fmt::format::FmtSpan;

/// The logging flags, accepted before or after the command.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct LogArgs {
    /// More log output on stderr: -v info (spans with session and thread ids), -vv debug,
    /// -vvv trace. RUST_LOG, when set, decides instead.
    #[arg(short = 'v', long = "verbose", action = ArgAction::Count, global = true)]
    verbose: u8,
    /// The format of the log output on stderr.
    #[arg(
        long = "log-format",
        value_enum,
        default_value_t = LogFormat::Text,
        global = true,
        value_name = "FORMAT"
    )]
    log_format: LogFormat,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The level `-v` asks for.
fn level(verbose: u8) -> LevelFilter {
    match verbose {
        0 => LevelFilter::WARN,
        1 => LevelFilter::INFO,
        2 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

/// The filter: `RUST_LOG` when set and valid, else the level of `-v`; and what to say about a
/// `RUST_LOG` that did not parse.
fn filter(verbose: u8, rust_log: Option<&str>) -> (EnvFilter, Option<String>) {
    let by_flag = || EnvFilter::default().add_directive(level(verbose).into());
    let Some(directives) = rust_log.map(str::trim).filter(|d| !d.is_empty()) else {
        return (by_flag(), None);
    };
    match EnvFilter::builder().parse(directives) {
        Ok(filter) => (filter, None),
        Err(error) => {
            let level = level(verbose);
            let complaint = format!(
                "RUST_LOG `{directives}` is not a valid filter ({error}); using level {level}"
            );
            (by_flag(), Some(complaint))
        }
    }
}

/// Installs the subscriber for the whole process. Call once, before anything logs.
pub(crate) fn init(args: &LogArgs) {
    let rust_log = std::env::var("RUST_LOG").ok();
    let (filter, complaint) = filter(args.verbose, rust_log.as_deref());
    let ansi = crate::output::colour(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| crate::output::StderrAboveBars)
        // A span is shown once, when it closes: by then its outcome is recorded.
        .with_span_events(FmtSpan::CLOSE);
    let installed = match args.log_format {
        LogFormat::Text => builder.with_ansi(ansi).try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
    if let Err(error) = installed {
        crate::output::warning(&format!("logging is off: {error}"));
    }
    if let Some(complaint) = complaint {
        crate::output::warning(&complaint);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosity_goes_from_warnings_to_trace() {
        assert_eq!(level(0), LevelFilter::WARN);
        assert_eq!(level(1), LevelFilter::INFO);
        assert_eq!(level(2), LevelFilter::DEBUG);
        assert_eq!(level(9), LevelFilter::TRACE);
    }

    #[test]
    fn rust_log_replaces_the_flag_and_a_bad_one_falls_back_with_a_complaint() {
        let (by_flag, none) = filter(1, None);
        assert_eq!(by_flag.max_level_hint(), Some(LevelFilter::INFO));
        assert!(none.is_none());
        let (empty, none) = filter(0, Some("  "));
        assert_eq!(empty.max_level_hint(), Some(LevelFilter::WARN));
        assert!(none.is_none());
        let (env, none) = filter(0, Some("rethread_runtime=debug"));
        assert_eq!(env.max_level_hint(), Some(LevelFilter::DEBUG));
        assert!(none.is_none());
        let (fallback, complaint) = filter(2, Some("=garbage=["));
        assert_eq!(fallback.max_level_hint(), Some(LevelFilter::DEBUG));
        assert!(complaint.unwrap().contains("not a valid filter"));
    }
}
