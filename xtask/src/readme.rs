//! The install and run lines README.md gives a user, run as they stand: `cargo xtask ci` reads
//! them from the README's shell blocks, so that what CI runs and what a newcomer pastes cannot
//! drift apart, and fails when an example's own header gives other install lines.

use std::ffi::OsStr;
use std::path::PathBuf;
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

/// The `HOME` under which CI runs the README's lines: `<target>/readme-home`, so that what
/// they make under `~` (the SDKs' venv and folder, the completions directory) lands there,
/// never in the home of whoever runs CI.
pub(crate) fn home() -> PathBuf {
    util::target_dir(&util::project_root()).join("readme-home")
}

/// `lines` as one `sh -e` script run from the clone's root, as a user pastes them into a
/// shell there: what a line sets (`. ~/venv/bin/activate`) holds for the lines after it, and
/// the first that fails stops the rest. `HOME` is [`home`] and `PATH` `path`.
pub(crate) fn script(lines: &[String], path: &OsStr) -> Result<Command, String> {
    let (root, home) = (util::project_root(), home());
    std::fs::create_dir_all(&home).map_err(|e| format!("create {}: {e}", home.display()))?;
    for line in lines {
        eprintln!(
            "$ {line}    (README.md, in {}, HOME={})",
            root.display(),
            home.display()
        );
    }
    let mut command = Command::new("sh");
    command
        .arg("-ec")
        .arg(lines.join("\n"))
        .current_dir(&root)
        .env("HOME", &home)
        .env("PATH", path);
    Ok(command)
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
    }

    /// Issue 41, item 9: from a fresh clone's root, `node keep_a_session.mjs` found no such
    /// file (CI copied it first), and `npm install` and `pip install` put their files into the
    /// clone (or the user's own Python). The SDK lines now install into a folder and a venv
    /// under `~`, and every file they run is one the clone has, or one a line before copied
    /// there. (`cargo xtask examples` runs the blocks themselves, as one script each.)
    #[test]
    fn the_sdk_lines_run_from_the_clones_root_and_install_outside_it() {
        let root = util::project_root();
        let typescript = commands("npm install").unwrap();
        let python = commands("pip install").unwrap();
        for line in typescript.iter().filter(|l| l.starts_with("npm install")) {
            assert!(line.contains(" --prefix ~/"), "into the clone: `{line}`");
        }
        let venv = python
            .iter()
            .position(|l| l.starts_with("python3 -m venv ~/") && l.contains("bin/activate"));
        let pip = python.iter().position(|l| l.starts_with("pip install"));
        assert!(
            venv.is_some() && venv < pip,
            "pip installs into no venv of its own: {python:?}"
        );
        for block in [&typescript, &python] {
            let mut copied = Vec::new();
            for command in block.iter().flat_map(|l| l.split("&&")).map(str::trim) {
                let words: Vec<&str> = command.split_whitespace().collect();
                match words.as_slice() {
                    ["cp", from, to] => {
                        assert!(root.join(from).is_file(), "`{command}`: no {from}");
                        let name = std::path::Path::new(from)
                            .file_name()
                            .unwrap()
                            .to_str()
                            .unwrap();
                        copied.push(format!(
                            "{}{name}",
                            to.trim_end_matches('/').to_owned() + "/"
                        ));
                    }
                    ["node" | "python3", file, ..]
                        if file.ends_with("js") || file.ends_with(".py") =>
                    {
                        assert!(
                            root.join(file).is_file() || copied.iter().any(|c| c == file),
                            "`{command}` runs a file the clone's root does not have"
                        );
                    }
                    _ => {}
                }
            }
        }
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
