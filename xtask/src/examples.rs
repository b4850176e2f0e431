//! `cargo xtask examples`: the offline example of each language (README, "Use it from any
//! language"), run as a user who installed only `rethread` and `fake-codex` would: those two
//! on `PATH`, no codex, no network beyond the SDK's registry install. Each is a stage of
//! `cargo xtask ci` of its own, so that its time shows.
//!
//! - Rust: `crates/rethread/examples/long_running_server.rs` (`RETHREAD_CODEX_BIN` names the
//!   fake);
//! - Python: `examples/python/keep_a_session.py` and `examples/python/keep_thread_ids.py` (a
//!   host that keeps thread ids itself, no session) with the `openai-codex` SDK;
//! - TypeScript: `examples/typescript/keep_a_session.mjs` with `@openai/codex-sdk`.
//!
//! - The library quickstart ([`quickstart`]): the README's dependency lines and code, built
//!   as a project of the user's own.
//!
//! The Python and the TypeScript ones are the README's blocks run whole, as a user pastes
//! each into a shell at the clone's root ([`readme::script`]): the venv, the SDK's folder and
//! the run, with `HOME` under `target/` (the blocks install under `~`, outside the clone).

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

/// The README's Python block, whole: the venv, the SDK, both examples (each of which gives
/// the block's install lines in its header too).
pub(crate) fn python() -> Result<(), String> {
    let (_, path) = binaries_on_path()?;
    for example in ["keep_a_session.py", "keep_thread_ids.py"] {
        let example = format!("examples/python/{example}");
        for first in ["python3 -m venv", "pip install"] {
            readme::install_lines(first, &example)?;
        }
        readme::command(&format!("python3 {example}"))?;
    }
    let block = readme::commands("pip install")?;
    let mut command = readme::script(&block, &path)?;
    command
        .env("PIP_QUIET", "1")
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1");
    run_example(command, &path, "Python")
}

/// The README's TypeScript block, whole: the SDK into its folder, the example copied there
/// and run.
pub(crate) fn typescript() -> Result<(), String> {
    let (_, path) = binaries_on_path()?;
    let block = readme::commands("npm install")?;
    let mut command = readme::script(&block, &path)?;
    command
        .env("npm_config_audit", "false")
        .env("npm_config_fund", "false");
    run_example(command, &path, "TypeScript")
}

/// The README's library quickstart, built as a user's own project builds it: a new crate next
/// to the clone (a link to it, `<target>/quickstart/rethread`, where the README's path
/// dependency looks), whose manifest ends with the README's `toml` block as it stands and
/// whose `main.rs` is the README's Rust block; the clone's `Cargo.lock`, so nothing is
/// downloaded.
pub(crate) fn quickstart() -> Result<(), String> {
    let root = util::project_root();
    let readme = root.join("README.md");
    let text =
        std::fs::read_to_string(&readme).map_err(|e| format!("read {}: {e}", readme.display()))?;
    let block = |fence: &str| {
        let start = text
            .find(fence)
            .ok_or_else(|| format!("README.md has no {fence} block"))?;
        let rest = &text[start + fence.len()..];
        Ok::<_, String>(rest[..rest.find("```").unwrap_or(rest.len())].to_string())
    };
    let (dependencies, main) = (block("```toml\n")?, block("```rust,no_run\n")?);
    let target = util::target_dir(&root);
    let dir = target.join("quickstart");
    let project = dir.join("my-host");
    let src = project.join("src");
    std::fs::create_dir_all(&src).map_err(|e| format!("create {}: {e}", src.display()))?;
    let clone = dir.join("rethread");
    if std::fs::symlink_metadata(&clone).is_err() {
        std::os::unix::fs::symlink(&root, &clone)
            .map_err(|e| format!("link {} to the clone: {e}", clone.display()))?;
    }
    // `[workspace]`: the project is a workspace of its own, not a stray member of the clone's.
    let manifest = format!(
        "[package]\nname = \"my-host\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
         [workspace]\n\n{dependencies}"
    );
    for (path, text) in [
        (project.join("Cargo.toml"), manifest.as_str()),
        (src.join("main.rs"), main.as_str()),
    ] {
        std::fs::write(&path, text).map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    let lock = project.join("Cargo.lock");
    std::fs::copy(root.join("Cargo.lock"), &lock)
        .map_err(|e| format!("copy Cargo.lock to {}: {e}", lock.display()))?;
    eprintln!(
        "$ cargo check    (README.md's quickstart, in {})",
        project.display()
    );
    let status = Command::new("cargo")
        .args(["check", "--offline"])
        .current_dir(&project)
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .map_err(|e| format!("could not start cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "README.md's quickstart does not build as it says: {status}"
        ))
    }
}

/// `cargo xtask examples`: all three, and the quickstart.
pub(crate) fn command() -> Result<(), String> {
    quickstart()?;
    rust()?;
    python()?;
    typescript()
}
