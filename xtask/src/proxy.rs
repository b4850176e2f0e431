//! `rethread app-server` driven by a real, unmodified client, and its benchmark.
//!
//! - [`python_tests`] (run by `cargo xtask ci` after the Rust tests, and alone as
//!   `cargo xtask python`): a venv under `target/python-sdk` with the `openai-codex` SDK from
//!   PyPI installed without its bundled codex (`pip install --no-deps openai-codex==0.163.0`
//!   plus its few dependencies and pytest), then pytest on `crates/proxy/tests/python` with
//!   the binaries it needs named in its environment.
//! - [`bench()`] (`cargo xtask bench proxy`): the `bench_proxy` example of `rethread-proxy` in
//!   release mode, with release builds of `rethread` and `fake-codex`.

use std::path::PathBuf;

use crate::util;

/// The Python SDK release the tests drive.
const SDK: &str = "openai-codex==0.163.0";
/// Its dependencies (installed by hand: `--no-deps` keeps its bundled codex out) and pytest.
const SDK_DEPENDENCIES: [&str; 3] = ["pydantic>=2.12", "packaging>=26.2", "pytest>=8"];
/// Creates (once) the venv with the SDK under `<target>/python-sdk`; returns its python.
pub(crate) fn python_venv() -> Result<PathBuf, String> {
    let root = util::project_root();
    let venv = util::target_dir(&root).join("python-sdk");
    let python = venv.join("bin").join("python");
    let stamp = venv.join("rethread-installed");
    let wanted = format!("{SDK} {}", SDK_DEPENDENCIES.join(" "));
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(wanted.as_str()) {
        let venv_arg = venv.to_string_lossy().into_owned();
        util::run(&root, "python3", &["-m", "venv", "--clear", &venv_arg])?;
        let python_arg = python.to_string_lossy().into_owned();
        let pip = |packages: &[&str]| {
            let mut args = vec![
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ];
            args.extend_from_slice(packages);
            util::run(&root, &python_arg, &args)
        };
        pip(&["--no-deps", SDK])?;
        pip(&SDK_DEPENDENCIES)?;
        std::fs::write(&stamp, &wanted).map_err(|e| format!("write {}: {e}", stamp.display()))?;
    }
    Ok(python)
}

/// Creates (once) the venv with the SDK, builds the binaries and runs pytest.
pub(crate) fn python_tests() -> Result<(), String> {
    let root = util::project_root();
    let target = util::target_dir(&root);
    let python = python_venv()?;
    util::build_rethread_and(&["-p", "rethread-proxy", "--example", "responses_stand_in"])?;
    let codex = crate::codex::install(crate::codex::current())?;
    let debug = target.join("debug");
    let status = std::process::Command::new(&python)
        .args(["-m", "pytest", "-v", "-p", "no:cacheprovider"])
        .arg(root.join("crates/proxy/tests/python"))
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
