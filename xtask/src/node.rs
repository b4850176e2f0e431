//! The unmodified TypeScript SDK (`@openai/codex-sdk` from npm, driven by node) through
//! `rethread exec`: [`typescript_tests`] (a stage of `cargo xtask ci`, and `cargo xtask node`
//! alone) installs the SDK under `target/node-sdk` by README.md's own `npm install` line
//! (`--omit=optional`: without the codex binaries it would bundle; rethread is its codex) and
//! runs `crates/cli/tests/node/sdk.test.mjs` with node's test runner against the current codex.

use std::path::{Path, PathBuf};

use crate::{readme, util};

/// The TypeScript example, whose header gives the README's install line too.
pub(crate) const EXAMPLE: &str = "examples/typescript/keep_a_session.mjs";

/// Installs (once) the SDK under `<target>/node-sdk` as a user's project would: a
/// `package.json`, then README.md's `npm install` lines run there as they stand; returns that
/// directory.
pub(crate) fn sdk_dir() -> Result<PathBuf, String> {
    let root = util::project_root();
    let dir = util::target_dir(&root).join("node-sdk");
    let stamp = dir.join("rethread-installed");
    let install = readme::install_lines("npm install", EXAMPLE)?;
    let wanted = install.join("\n");
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(wanted.as_str()) {
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let manifest = dir.join("package.json");
        if !manifest.exists() {
            std::fs::write(&manifest, "{\"private\": true}\n")
                .map_err(|e| format!("write {}: {e}", manifest.display()))?;
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        let quiet = [("npm_config_audit", "false"), ("npm_config_fund", "false")];
        for line in &install {
            readme::run(&dir, line, &path, &quiet)?;
        }
        std::fs::write(&stamp, &wanted).map_err(|e| format!("write {}: {e}", stamp.display()))?;
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
