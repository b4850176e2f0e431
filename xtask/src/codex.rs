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

/// Fails at once, with a clear message, when `@openai/codex@version` is not a release on the
/// npm registry (asked with `npm view`, which downloads nothing): `codex-check` would
/// otherwise install every supported release before npm's own error about V.
pub(crate) fn check_release(npm: &str, version: &str) -> Result<(), String> {
    let package = format!("@openai/codex@{version}");
    let out = Command::new(npm)
        .args(["view", &package, "version"])
        .output()
        .map_err(|e| format!("could not start `{npm} view {package} version`: {e}"))?;
    let found = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && found.trim() == version {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr);
    // npm answers a version it does not know with E404 (or, for a range, nothing at all).
    if said.contains("E404") || (out.status.success() && found.trim().is_empty()) {
        return Err(format!(
            "codex {version} is not a release of @openai/codex on npm \
             (`npm view @openai/codex versions` lists them); nothing was installed"
        ));
    }
    if out.status.success() {
        return Err(format!(
            "`{version}` names several releases of @openai/codex ({}): give one exact version",
            found.split_whitespace().collect::<Vec<_>>().join(" ")
        ));
    }
    let last = said
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    Err(format!(
        "could not ask npm whether codex {version} exists ({}): {last}",
        out.status
    ))
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

    /// Issue 41, item 11: `codex-check --version 0.172.0`, a release that does not exist,
    /// installed every supported release (1.16 GB) before npm failed with a raw error. The
    /// version is now asked for first (`npm view`, an npm stand-in here: tests stay offline).
    #[test]
    fn a_release_npm_does_not_know_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let npm = dir.path().join("npm");
        let log = dir.path().join("calls");
        std::fs::write(
            &npm,
            format!(
                "#!/bin/sh\necho \"$*\" >> '{}'\n\
                 case \"$2\" in\n\
                 @openai/codex@0.171.0) echo 0.171.0 ;;\n\
                 @openai/codex@0.17) printf '0.170.0\\n0.171.0\\n' ;;\n\
                 *) echo \"npm error code E404\" >&2; exit 1 ;;\n\
                 esac\n",
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&npm, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let npm = npm.to_str().unwrap();
        let refused = check_release(npm, "0.172.0").unwrap_err();
        assert!(refused.contains("not a release"), "{refused}");
        assert!(check_release(npm, "0.17").unwrap_err().contains("several"));
        check_release(npm, "0.171.0").unwrap();
        let calls = std::fs::read_to_string(&log).unwrap();
        assert!(calls.lines().all(|c| c.starts_with("view ")), "{calls}");
    }

    #[test]
    fn the_releases_file_names_current_previous_and_floor() {
        let roles: Vec<&str> = supported().iter().map(|(role, _)| *role).collect();
        assert_eq!(roles, ["current", "previous", "floor"]);
        assert!(supported().iter().all(|(_, v)| v.split('.').count() == 3));
    }
}
