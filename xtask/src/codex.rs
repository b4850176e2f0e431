//! Installs `@openai/codex` releases from the npm registry into `target/codex/<version>`.
//!
//! The supported releases are defined once, in `codex-releases.txt` at the workspace root
//! (`rethread-testkit` reads the same file).

use std::path::PathBuf;
use std::process::Command;

use crate::util::project_root;

/// The text of `codex-releases.txt`: `<role> <version>` lines, `#` comments.
const RELEASES_FILE: &str = include_str!("../../codex-releases.txt");

/// The supported releases (current, previous, floor), in the file's order.
pub(crate) fn supported() -> Vec<(&'static str, &'static str)> {
    RELEASES_FILE
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| line.split_once(' '))
        .map(|(role, version)| (role, version.trim()))
        .collect()
}

/// The current release (the `current` line of `codex-releases.txt`).
pub(crate) fn current() -> &'static str {
    supported()
        .into_iter()
        .find(|(role, _)| *role == "current")
        .map(|(_, version)| version)
        .expect("codex-releases.txt names the current release")
}

/// `cargo xtask codex [--version V]`.
pub(crate) fn command(args: &[String]) -> Result<(), String> {
    let version = match args {
        [] => current().to_string(),
        [flag, v] if flag == "--version" => v.clone(),
        _ => return Err("usage: cargo xtask codex [--version V]".to_string()),
    };
    let path = install(&version)?;
    println!("{}", path.display());
    Ok(())
}

/// The environment variable through which tests find the binary of `version`,
/// e.g. `RETHREAD_CODEX_0_171_0`.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_releases_file_names_current_previous_and_floor() {
        let roles: Vec<&str> = supported().iter().map(|(role, _)| *role).collect();
        assert_eq!(roles, ["current", "previous", "floor"]);
        assert!(supported().iter().all(|(_, v)| v.split('.').count() == 3));
    }
}
