//! The unmodified TypeScript SDK (`@openai/codex-sdk` from npm, driven by node) through
//! `rethread exec`: [`typescript_tests`] (a stage of `cargo xtask ci`, and `cargo xtask node`
//! alone) installs the SDK by README.md's own `npm install` line (`--omit=optional`: without
//! the codex binaries it would bundle; rethread is its codex), into the folder that line names
//! under the README's `HOME` ([`readme::home`]), and runs `crates/cli/tests/node/sdk.test.mjs`
//! with node's test runner against the current codex.

use std::path::{Path, PathBuf};

use crate::{readme, util};

/// The TypeScript example, whose header gives the README's install line too.
pub(crate) const EXAMPLE: &str = "examples/typescript/keep_a_session.mjs";

/// Installs the SDK as a user does: README.md's `npm install` lines run as they stand, from
/// the clone's root; returns the folder they install into (their `--prefix ~/DIR`).
pub(crate) fn sdk_dir() -> Result<PathBuf, String> {
    let install = readme::install_lines("npm install", EXAMPLE)?;
    let dir = install
        .iter()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|word| *word == "--prefix")?;
            let dir = words.next()?.strip_prefix("~/")?;
            Some(readme::home().join(dir))
        })
        .ok_or("README.md's `npm install` line names no folder under ~ (`--prefix ~/DIR`)")?;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut command = readme::script(&install, &path)?;
    let status = command
        .env("npm_config_audit", "false")
        .env("npm_config_fund", "false")
        .status()
        .map_err(|e| format!("could not start sh: {e}"))?;
    if !status.success() {
        return Err(format!("README.md's `npm install` failed with {status}"));
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
