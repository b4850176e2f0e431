//! `rethread app-server` driven by a real, unmodified client, and its benchmark.
//!
//! - [`python_tests`] (run by `cargo xtask ci` after the Rust tests, and alone as
//!   `cargo xtask python`): a venv under `target/python-sdk` with the `openai-codex` SDK from
//!   PyPI installed by README.md's own `pip install` lines (without its bundled codex), and
//!   pytest, then pytest on `crates/proxy/tests/python` with the binaries it needs named in its
//!   environment.
//! - [`hermes_tests`] (run by `cargo xtask ci` after the Python SDK, and alone as
//!   `cargo xtask hermes`): a venv under `target/hermes` with `hermes-agent` from PyPI installed
//!   by README.md's own `pip install hermes-agent` line, and pytest, then pytest on
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

/// Creates (once) the venv under `<target>/python-sdk` with the SDK installed as README.md's
/// `pip install` lines say (run as they stand, the venv's `bin` first on `PATH`), and pytest;
/// returns the venv's `bin` directory.
pub(crate) fn python_venv() -> Result<PathBuf, String> {
    venv("python-sdk", readme::install_lines("pip install", EXAMPLE)?)
}

/// The venv under `<target>/hermes` with README.md's `pip install hermes-agent` line run as it
/// stands, and pytest; returns its `bin` directory.
fn hermes_venv() -> Result<PathBuf, String> {
    let first = "pip install hermes-agent";
    let lines = readme::commands(first)?;
    venv(
        "hermes",
        lines
            .into_iter()
            .filter(|line| line.starts_with(first))
            .collect(),
    )
}

/// Creates (once per set of `install` lines) the venv `<target>/<name>`, runs `install` in it
/// and adds pytest; returns its `bin` directory.
fn venv(name: &str, install: Vec<String>) -> Result<PathBuf, String> {
    let root = util::project_root();
    let venv = util::target_dir(&root).join(name);
    let bin = venv.join("bin");
    let stamp = venv.join("rethread-installed");
    let wanted = install.join("\n");
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(wanted.as_str()) {
        let venv_arg = venv.to_string_lossy().into_owned();
        util::run(&root, "python3", &["-m", "venv", "--clear", &venv_arg])?;
        let path = util::path_with(&bin)?;
        let quiet = [("PIP_QUIET", "1"), ("PIP_DISABLE_PIP_VERSION_CHECK", "1")];
        for line in &install {
            readme::run(&root, line, &path, &quiet)?;
        }
        // The tests' own runner, which the README's user does not need.
        let python = bin.join("python").to_string_lossy().into_owned();
        util::run(
            &root,
            &python,
            &["-m", "pip", "install", "--quiet", "pytest>=8"],
        )?;
        std::fs::write(&stamp, &wanted).map_err(|e| format!("write {}: {e}", stamp.display()))?;
    }
    Ok(bin)
}

/// Creates (once) the venv with the SDK, builds the binaries and runs pytest (all but the
/// Hermes test).
pub(crate) fn python_tests() -> Result<(), String> {
    let root = util::project_root();
    let ignore = format!("--ignore={}", root.join(HERMES_TEST).display());
    let tests = root.join("crates/proxy/tests/python");
    pytest(
        &python_venv()?,
        &[ignore.as_str(), &tests.to_string_lossy()],
    )
}

/// Creates (once) the venv with Hermes, builds the binaries and runs the Hermes test.
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
