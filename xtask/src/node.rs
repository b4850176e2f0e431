//! The unmodified TypeScript SDK (`@openai/codex-sdk` from npm, driven by node) through
//! `rethread exec`: [`typescript_tests`] (a stage of `cargo xtask ci`, and `cargo xtask node`
//! alone) installs the pinned SDK under `target/node-sdk` (`--omit=optional`: without the
//! codex binaries it would bundle; rethread is its codex) and runs
//! `crates/cli/tests/node/sdk.test.mjs` with node's test runner against the current codex.

use std::path::{Path, PathBuf};

use crate::util;

/// The TypeScript SDK release the tests drive.
pub(crate) const SDK: &str = "@openai/codex-sdk@0.163.0";

/// Installs (once) the pinned SDK under `<target>/node-sdk`; returns that directory.
pub(crate) fn sdk_dir() -> Result<PathBuf, String> {
    let root = util::project_root();
    let dir = util::target_dir(&root).join("node-sdk");
    let stamp = dir.join("rethread-installed");
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(SDK) {
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let prefix = dir.to_string_lossy().into_owned();
        util::run(
            &dir,
            "npm",
            &[
                "install",
                "--no-audit",
                "--no-fund",
                "--omit=optional",
                "--prefix",
                &prefix,
                SDK,
            ],
        )?;
        std::fs::write(&stamp, SDK).map_err(|e| format!("write {}: {e}", stamp.display()))?;
    }
    Ok(dir)
}

/// The SDK's entry point in `dir`.
pub(crate) fn sdk_entry(dir: &Path) -> PathBuf {
    dir.join("node_modules/@openai/codex-sdk/dist/index.js")
}

/// `cargo xtask node`: the SDK tests against the current codex.
pub(crate) fn typescript_tests() -> Result<(), String> {
    let root = util::project_root();
    let sdk = sdk_entry(&sdk_dir()?);
    util::build_rethread_and(&["-p", "rethread-proxy", "--example", "responses_stand_in"])?;
    let codex = crate::codex::install(crate::codex::current())?;
    let debug = util::target_dir(&root).join("debug");
    let status = std::process::Command::new("node")
        .arg("--test")
        .arg(root.join("crates/cli/tests/node/sdk.test.mjs"))
        .current_dir(&root)
        .env("RETHREAD_BIN", debug.join("rethread"))
        .env(
            "RETHREAD_STAND_IN_BIN",
            debug.join("examples").join("responses_stand_in"),
        )
        .env("RETHREAD_TEST_CODEX", &codex)
        .env("RETHREAD_CODEX_SDK", &sdk)
        .env("RETHREAD_REQUIRE_REAL_CODEX", "1")
        .status()
        .map_err(|e| format!("could not start node: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("node --test failed with {status}"))
    }
}
