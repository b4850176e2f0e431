//! rethread installed as `codex`: run under that name (a link on `PATH` ahead of the real
//! codex, argv[0]'s file name `codex`), rethread is a transparent stand-in, so a host that
//! only ever runs `codex` from `PATH` needs nothing beyond naming the session:
//!
//! - `codex [OPTS] app-server [ARGS...]` is `rethread app-server` (codex's `-c`, `--enable`,
//!   `--disable` before it passed on in the same place);
//! - `codex [OPTS] exec [ARGS...]` (or `e`) is `rethread exec`;
//! - every other command (`--version`, `login`, `app-server generate-json-schema`, the TUI,
//!   ...) is the real codex's, in this process's place: same streams, same exit code.
//!
//! The real codex is `RETHREAD_CODEX_BIN`, else the next `codex` on `PATH` that is not
//! rethread itself; the store is `RETHREAD_STORE` (the default otherwise), sealed with the key
//! in `RETHREAD_STORE_KEY_FILE` if set. rethread's own flags are not read here: every argument
//! is codex's.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, FromArgMatches};

use crate::app_server::AppServerGlobals;
use crate::{codex_bin, exec, logging, output};

/// The name under which rethread stands in for codex.
const CODEX: &str = "codex";

/// Runs as codex when this process was started under that name; `None` otherwise.
pub(crate) fn main_if_named_codex() -> Option<ExitCode> {
    let argv0 = std::env::args_os().next()?;
    let name = Path::new(&argv0).file_stem()?;
    (name == OsStr::new(CODEX)).then(|| run(std::env::args_os().skip(1).collect()))
}

fn run(args: Vec<OsString>) -> ExitCode {
    logging::init(&logging::LogArgs::default());
    let given = std::env::var_os("RETHREAD_CODEX_BIN")
        .filter(|value| !value.is_empty())
        .map(PathBuf::from);
    let codex = match codex_bin::resolve(given.as_deref(), codex_bin::Pick::NotSelf) {
        Ok(codex) => codex,
        Err(usage) => return output::fail(&usage.0, output::EXIT_USAGE),
    };
    let store = std::env::var("RETHREAD_STORE")
        .ok()
        .filter(|s| !s.is_empty());
    let (globals, rest) = split_globals(&args);
    let Some((command, rest)) = rest.split_first() else {
        return crate::hand_over(&codex, &args);
    };
    // Read only for the commands that open the store, before anything else happens.
    let load_key = || {
        let key_file = std::env::var_os(crate::STORE_KEY_FILE_ENV).filter(|v| !v.is_empty());
        crate::load_store_key(key_file.as_deref().map(Path::new))
            .map_err(|error| output::fail(&error.to_string(), output::EXIT_USAGE))
    };
    match command.to_str() {
        Some("exec" | "e") => match load_key() {
            Ok(()) => exec::main(&codex, store.as_deref(), globals, rest.to_vec()),
            Err(code) => code,
        },
        // `app-server` itself, not one of its tools (`generate-json-schema`, ...).
        Some("app-server")
            if rest
                .first()
                .is_none_or(|a| a.to_string_lossy().starts_with('-')) =>
        {
            if let Err(code) = load_key() {
                return code;
            }
            let parsed =
                AppServerGlobals::augment_args(clap::Command::new(CODEX).no_binary_name(true))
                    .try_get_matches_from(&globals)
                    .and_then(|matches| AppServerGlobals::from_arg_matches(&matches));
            match parsed {
                Ok(parsed) => crate::app_server::main(
                    &codex,
                    &parsed,
                    crate::app_server::AppServerArgs::verbatim(store, rest.to_vec()),
                ),
                Err(_) => crate::hand_over(&codex, &args),
            }
        }
        _ => crate::hand_over(&codex, &args),
    }
}

/// codex's options before the command that rethread passes on in place (`-c k=v`,
/// `--config k=v`, `--enable F`, `--disable F`, and their `=` forms), and what follows them.
/// Any other option before the command leaves everything to the real codex.
fn split_globals(args: &[OsString]) -> (Vec<OsString>, &[OsString]) {
    let mut at = 0;
    while let Some(arg) = args.get(at).and_then(|a| a.to_str()) {
        let valued = ["-c", "--config", "--enable", "--disable"].contains(&arg);
        let inline = ["--config=", "--enable=", "--disable="]
            .iter()
            .any(|flag| arg.starts_with(flag))
            || (arg.starts_with("-c") && arg.len() > 2);
        if valued && at + 1 < args.len() {
            at += 2;
        } else if inline {
            at += 1;
        } else {
            break;
        }
    }
    (args[..at].to_vec(), &args[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(args: &[&str]) -> (Vec<String>, Vec<String>) {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let (globals, rest) = split_globals(&args);
        let text = |a: &[OsString]| a.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        (text(&globals), text(rest))
    }

    #[test]
    fn codexs_config_options_before_the_command_are_kept_in_place() {
        assert_eq!(
            split(&[
                "-c",
                "a=1",
                "--enable=x",
                "--disable",
                "y",
                "app-server",
                "--listen",
                "stdio://"
            ]),
            (
                vec![
                    "-c".into(),
                    "a=1".into(),
                    "--enable=x".into(),
                    "--disable".into(),
                    "y".into()
                ],
                vec!["app-server".into(), "--listen".into(), "stdio://".into()]
            )
        );
        assert_eq!(split(&["-cx=1", "exec"]).0, ["-cx=1"]);
        // Another option first: the command line is left to codex as it is.
        assert_eq!(split(&["--model", "m", "exec"]).0, Vec::<String>::new());
        assert_eq!(split(&["--version"]).1, ["--version"]);
    }
}
