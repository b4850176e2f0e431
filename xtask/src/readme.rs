//! The install and run lines README.md gives a user, run as they stand: `cargo xtask ci` reads
//! them from the README's shell blocks, so that what CI runs and what a newcomer pastes cannot
//! drift apart, and fails when an example's own header gives other install lines.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use crate::util;

/// A README or header line as a command: a leading `//` and a trailing ` # comment` dropped.
fn command_of(line: &str) -> &str {
    let line = line.trim().trim_start_matches("//").trim();
    line.split_once(" #")
        .map_or(line, |(command, _)| command)
        .trim_end()
}

/// The commands of the README's first ```sh block holding a command that starts with `first`,
/// in order.
pub(crate) fn commands(first: &str) -> Result<Vec<String>, String> {
    let path = util::project_root().join("README.md");
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let mut blocks = text.split("```sh\n").skip(1);
    blocks
        .find_map(|block| {
            let block = block.split("```").next().unwrap_or_default();
            let commands: Vec<String> = block
                .lines()
                .map(command_of)
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect();
            commands
                .iter()
                .any(|c| c.starts_with(first))
                .then_some(commands)
        })
        .ok_or_else(|| format!("README.md has no ```sh block with a `{first}` line"))
}

/// The README's commands starting with `first` (see [`commands`]), checked to be given as they
/// are by `example`'s header too.
pub(crate) fn install_lines(first: &str, example: &str) -> Result<Vec<String>, String> {
    let lines: Vec<String> = commands(first)?
        .into_iter()
        .filter(|c| c.starts_with(first))
        .collect();
    let path = util::project_root().join(example);
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let header: Vec<&str> = text.lines().map(command_of).collect();
    match lines.iter().find(|line| !header.contains(&line.as_str())) {
        Some(line) => Err(format!(
            "{example} does not give README.md's install line `{line}`: make them the same"
        )),
        None => Ok(lines),
    }
}

/// The README command starting with `first` (its whole line, as a user pastes it).
pub(crate) fn command(first: &str) -> Result<String, String> {
    commands(first)?
        .into_iter()
        .find(|c| c.starts_with(first))
        .ok_or_else(|| format!("README.md has no `{first}` line"))
}

/// `sh -c line` in `dir` (said on stderr).
pub(crate) fn shell(dir: &Path, line: &str) -> Command {
    eprintln!("$ {line}    (README.md, in {})", dir.display());
    let mut command = Command::new("sh");
    command.args(["-c", line]).current_dir(dir);
    command
}

/// Runs `line` with `sh -c` in `dir`, `PATH` set to `path` and `env` set.
pub(crate) fn run(
    dir: &Path,
    line: &str,
    path: &OsStr,
    env: &[(&str, &str)],
) -> Result<(), String> {
    let mut command = shell(dir, line);
    command.env("PATH", path);
    for (key, value) in env {
        command.env(key, value);
    }
    let status = command
        .status()
        .map_err(|e| format!("could not start `{line}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("README.md's `{line}` failed with {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_example_gives_the_readme_install_lines() {
        for (first, example) in [
            ("pip install", crate::proxy::EXAMPLE),
            ("npm install", crate::node::EXAMPLE),
        ] {
            let lines = install_lines(first, example).unwrap();
            assert!(!lines.is_empty(), "{first}");
        }
        assert!(command("python3 examples/python/keep_a_session.py").is_ok());
        assert!(command("node keep_a_session.mjs").is_ok());
    }

    #[test]
    fn a_line_is_read_as_the_command_a_user_pastes() {
        assert_eq!(
            command_of("pip install 'a>=1'   # why"),
            "pip install 'a>=1'"
        );
        assert_eq!(command_of("//     npm install b"), "npm install b");
        assert_eq!(command_of("    pip install c"), "pip install c");
    }
}
