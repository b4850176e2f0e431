//! Installs pinned `@openai/codex` releases from the npm registry into `target/codex/<version>`.

use std::path::PathBuf;
use std::process::Command;

use crate::util::project_root;

/// The current release the project is proven against.
pub(crate) const DEFAULT_VERSION: &str = "0.169.0";
/// Every release the test suite runs against: current, and the compatibility floor.
pub(crate) const PINNED_VERSIONS: [&str; 2] = ["0.169.0", "0.144.6"];

/// `cargo xtask codex [--version V]`.
pub(crate) fn command(args: &[String]) -> Result<(), String> {
    let version = match args {
        [] => DEFAULT_VERSION.to_string(),
        [flag, v] if flag == "--version" => v.clone(),
        _ => return Err("usage: cargo xtask codex [--version V]".to_string()),
    };
    let path = install(&version)?;
    println!("{}", path.display());
    Ok(())
}

/// The environment variable through which tests find the binary of `version`,
/// e.g. `RETHREAD_CODEX_0_169_0`.
pub(crate) fn env_var_for(version: &str) -> String {
    format!("RETHREAD_CODEX_{}", version.replace('.', "_"))
}

/// Installs `@openai/codex@version` unless the cached binary already reports that version.
pub(crate) fn install(version: &str) -> Result<PathBuf, String> {
    let prefix = project_root().join("target").join("codex").join(version);
    let binary = prefix
        .join("node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex");
    if reports_version(&binary, version) {
        return Ok(binary);
    }
    std::fs::create_dir_all(&prefix).map_err(|e| format!("create {}: {e}", prefix.display()))?;
    eprintln!(
        "installing @openai/codex@{version} into {}",
        prefix.display()
    );
    let prefix_arg = prefix.to_string_lossy().into_owned();
    let package = format!("@openai/codex@{version}");
    crate::util::run(
        &prefix,
        "npm",
        &[
            "install",
            "--no-audit",
            "--no-fund",
            "--prefix",
            &prefix_arg,
            &package,
        ],
    )?;
    if reports_version(&binary, version) {
        Ok(binary)
    } else {
        Err(format!(
            "npm installed {package} but {} does not report codex-cli {version}",
            binary.display()
        ))
    }
}

fn reports_version(binary: &PathBuf, version: &str) -> bool {
    Command::new(binary)
        .arg("--version")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == format!("codex-cli {version}"))
        .unwrap_or(false)
}
