//! `cargo xtask examples`: the offline example of each language (README, "Use it from any
//! language"), run as a user who installed only `rethread` and `fake-codex` would: those two
//! on `PATH`, no codex, no network beyond the SDK's registry install. Each is a stage of
//! `cargo xtask ci` of its own, so that its time shows.
//!
//! - Rust: `crates/rethread/examples/long_running_server.rs` (`RETHREAD_CODEX_BIN` names the
//!   fake);
//! - Python: `examples/python/keep_a_session.py` and `examples/python/keep_thread_ids.py` (a
//!   host that keeps thread ids itself, no session) with the `openai-codex` SDK (the venv of
//!   the Python SDK tests, which also run the second against the real codex on two homes);
//! - TypeScript: `examples/typescript/keep_a_session.mjs` with `@openai/codex-sdk`, run from
//!   the directory the SDK is installed in (`target/node-sdk`), as a user's project would.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

use crate::{readme, util};

/// Builds `rethread` and `fake-codex`; returns `PATH` with their directory first.
fn binaries_on_path() -> Result<(PathBuf, OsString), String> {
    util::build_rethread_and(&["-p", "rethread-fake-appserver", "--bin", "fake-codex"])?;
    let debug = util::target_dir(&util::project_root()).join("debug");
    Ok((debug.clone(), util::path_with(&debug)?))
}

/// Runs `command` with the example's environment: rethread's own variables unset (the
/// example sets what it needs), `PATH` as given.
fn run_example(mut command: Command, path: &OsString, what: &str) -> Result<(), String> {
    for var in [
        "RETHREAD_SESSION",
        "RETHREAD_STORE",
        "RETHREAD_CODEX_BIN",
        "CODEX_HOME",
    ] {
        command.env_remove(var);
    }
    let status = command
        .env("PATH", path)
        .status()
        .map_err(|e| format!("could not start the {what} example: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("the {what} example failed with {status}"))
    }
}

/// The Rust example on the fake.
pub(crate) fn rust() -> Result<(), String> {
    let (debug, path) = binaries_on_path()?;
    let mut command = Command::new("cargo");
    command
        .args([
            "run",
            "--locked",
            "-p",
            "rethread",
            "--example",
            "long_running_server",
        ])
        .current_dir(util::project_root());
    for var in ["RETHREAD_STORE", "CODEX_HOME"] {
        command.env_remove(var);
    }
    let status = command
        .env("PATH", &path)
        .env("RETHREAD_CODEX_BIN", debug.join("fake-codex"))
        .status()
        .map_err(|e| format!("could not start the Rust example: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("the Rust example failed with {status}"))
    }
}

/// The Python example, with the SDK installed as the README says, run by the README's line
/// (the venv's `python3` first on `PATH`, as in an activated venv).
pub(crate) fn python() -> Result<(), String> {
    let (_, path) = binaries_on_path()?;
    let venv = crate::proxy::python_venv()?;
    let path = util::prepend_path(&venv, &path)?;
    for example in ["keep_a_session.py", "keep_thread_ids.py"] {
        // Its header gives the README's install lines too.
        readme::install_lines("pip install", &format!("examples/python/{example}"))?;
        let line = readme::command(&format!("python3 examples/python/{example}"))?;
        run_example(readme::shell(&util::project_root(), &line), &path, "Python")?;
    }
    Ok(())
}

/// The TypeScript example, by the README's line, from the directory holding the SDK (as a
/// user's project would).
pub(crate) fn typescript() -> Result<(), String> {
    let (_, path) = binaries_on_path()?;
    let dir = crate::node::sdk_dir()?;
    let example = dir.join("keep_a_session.mjs");
    let source = util::project_root().join(crate::node::EXAMPLE);
    std::fs::copy(&source, &example)
        .map_err(|e| format!("copy {} to {}: {e}", source.display(), example.display()))?;
    let line = readme::command("node keep_a_session.mjs")?;
    run_example(readme::shell(&dir, &line), &path, "TypeScript")
}

/// `cargo xtask examples`: all three.
pub(crate) fn command() -> Result<(), String> {
    rust()?;
    python()?;
    typescript()
}
