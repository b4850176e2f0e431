//! `rethread app-server` driven by a real, unmodified client, and its benchmark.
//!
//! - [`python_tests`] (run by `cargo xtask ci` after the Rust tests, and alone as
//!   `cargo xtask python`): the venv README.md's own Python lines make and install the
//!   `openai-codex` SDK from PyPI into (without its bundled codex; under the README's `HOME`,
//!   [`readme::home`]), plus pytest, then pytest on `crates/proxy/tests/python` with the
//!   binaries it needs named in its environment.
//! - [`hermes_tests`] (run by `cargo xtask ci` after the Python SDK, and alone as
//!   `cargo xtask hermes`): the venv README.md's own Hermes lines make and install
//!   `hermes-agent` from PyPI into, plus pytest, then pytest on
//!   `crates/proxy/tests/python/test_hermes.py` (Hermes' own `AIAgent` through a `codex` link to
//!   rethread), with the same binaries.
//! - [`bench()`] (`cargo xtask bench proxy`): the `bench_proxy` example of `rethread-proxy` in
//!   release mode, with release builds of `rethread` and `fake-codex`.

use std::path::PathBuf;

use crate::{readme, util};

/// The Python example, whose header gives the README's install lines too.
pub(crate) const EXAMPLE: &str = "examples/python/keep_a_session.py";

/// The Hermes test, which the SDK's venv cannot run (and the SDK stage leaves out).
const HERMES_TEST: &str = "crates/proxy/tests/python/test_hermes.py";

/// Makes the venv and installs the SDK as README.md's Python lines say (those before the
/// examples run, as one script from the clone's root), and pytest; returns the venv's `bin`
/// directory.
pub(crate) fn python_venv() -> Result<PathBuf, String> {
    readme::install_lines("pip install", EXAMPLE)?;
    readme_venv("pip install", |line| line.starts_with("python3 examples/"))
}

/// The venv README.md's Hermes lines make (those before the `codex` link), and pytest;
/// returns its `bin` directory.
fn hermes_venv() -> Result<PathBuf, String> {
    readme_venv("pip install hermes-agent", |line| line.starts_with("ln -s"))
}

/// Runs the README's ```sh block holding a `first` line, up to the first line `stop` picks,
/// as one script from the clone's root (`readme::script`), then installs pytest in the venv
/// those lines activated; returns that venv's `bin` directory, asked of the shell.
fn readme_venv(first: &str, stop: fn(&str) -> bool) -> Result<PathBuf, String> {
    let block = readme::commands(first)?;
    let mut lines = vec!["{".to_string()];
    lines.extend(block.into_iter().take_while(|line| !stop(line)));
    // The tests' own runner, which the README's user does not need.
    lines.push("python3 -m pip install 'pytest>=8'".to_string());
    lines.push("} >&2".to_string());
    lines.push("command -v python3".to_string());
    let path = std::env::var_os("PATH").unwrap_or_default();
    let out = readme::script(&lines, &path)?
        .env("PIP_QUIET", "1")
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("could not start sh: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "README.md's `{first}` lines failed with {}",
            out.status
        ));
    }
    let python = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    match python.parent() {
        Some(bin) if python.is_absolute() => Ok(bin.to_path_buf()),
        _ => Err(format!(
            "no venv's python3 after README.md's `{first}` lines: {python:?}"
        )),
    }
}

/// Makes the venv with the SDK, builds the binaries and runs pytest (all but the Hermes
/// test).
pub(crate) fn python_tests() -> Result<(), String> {
    let root = util::project_root();
    let ignore = format!("--ignore={}", root.join(HERMES_TEST).display());
    let tests = root.join("crates/proxy/tests/python");
    pytest(
        &python_venv()?,
        &[ignore.as_str(), &tests.to_string_lossy()],
    )
}

/// Makes the venv with Hermes, builds the binaries and runs the Hermes test.
pub(crate) fn hermes_tests() -> Result<(), String> {
    let root = util::project_root();
    pytest(
        &hermes_venv()?,
        &[&root.join(HERMES_TEST).to_string_lossy()],
    )
}

/// Builds rethread and the Responses stand-in, installs the current codex, and runs the venv
/// `bin`'s pytest on `args` with the binaries named in its environment.
fn pytest(bin: &std::path::Path, args: &[&str]) -> Result<(), String> {
    let root = util::project_root();
    let target = util::target_dir(&root);
    let python = bin.join("python");
    util::build_rethread_and(&["-p", "rethread-proxy", "--example", "responses_stand_in"])?;
    let codex = crate::codex::install(crate::codex::current())?;
    let debug = target.join("debug");
    let status = std::process::Command::new(&python)
        .args(["-m", "pytest", "-v", "-p", "no:cacheprovider"])
        .args(args)
        .current_dir(&root)
        .env("RETHREAD_BIN", debug.join("rethread"))
        .env(
            "RETHREAD_STAND_IN_BIN",
            debug.join("examples").join("responses_stand_in"),
        )
        // The current release, as `codex-releases.txt` names it; the tests read its version
        // from here rather than naming one.
        .env("RETHREAD_TEST_CODEX", &codex)
        .env("RETHREAD_TEST_CODEX_VERSION", crate::codex::current())
        .status()
        .map_err(|e| format!("could not start pytest: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("pytest failed with {status}"))
    }
}

/// `cargo xtask bench proxy [ARGS...]`.
pub(crate) fn bench(extra: &[String]) -> Result<(), String> {
    let root = util::project_root();
    util::run(
        &root,
        "cargo",
        &[
            "build",
            "--release",
            "-p",
            "rethread-cli",
            "--bin",
            "rethread",
            "-p",
            "rethread-fake-appserver",
            "--bin",
            "fake-codex",
        ],
    )?;
    let release = util::target_dir(&root).join("release");
    let rethread = release.join("rethread").to_string_lossy().into_owned();
    let fake = release.join("fake-codex").to_string_lossy().into_owned();
    let mut args = vec![
        "run",
        "--release",
        "-p",
        "rethread-proxy",
        "--example",
        "bench_proxy",
        "--",
        "--rethread",
        &rethread,
        "--fake",
        &fake,
    ];
    args.extend(extra.iter().map(String::as_str));
    util::run(&root, "cargo", &args)
}
