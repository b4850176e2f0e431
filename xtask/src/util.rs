//! Small helpers shared by the xtask commands.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root, derived from this crate's manifest directory.
pub(crate) fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// Runs a command in `dir`, inheriting stdio, and fails with a one-line cause if it fails.
pub(crate) fn run(dir: &Path, program: &str, args: &[&str]) -> Result<(), String> {
    run_with_env(dir, program, args, &[], &[])
}

/// Builds the `rethread` binary (debug, `--locked`) together with the `extra` targets
/// (`-p PACKAGE --bin|--example NAME`).
pub(crate) fn build_rethread_and(extra: &[&str]) -> Result<(), String> {
    let mut args = vec![
        "build",
        "--locked",
        "-p",
        "rethread-cli",
        "--bin",
        "rethread",
    ];
    args.extend_from_slice(extra);
    run(&project_root(), "cargo", &args)
}

/// `path` (a `PATH` value) with `dir` first.
pub(crate) fn prepend_path(dir: &Path, path: &OsStr) -> Result<OsString, String> {
    std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(path)))
        .map_err(|e| format!("cannot put {} on PATH: {e}", dir.display()))
}

/// The environment's `PATH` with `dir` first.
pub(crate) fn path_with(dir: &Path) -> Result<OsString, String> {
    prepend_path(dir, &std::env::var_os("PATH").unwrap_or_default())
}

/// The target directory: `CARGO_TARGET_DIR`, else `<root>/target`.
pub(crate) fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

/// Runs `example` of `package` in release mode, with `features` on, passing it `extra`.
pub(crate) fn run_example(
    package: &str,
    features: &[&str],
    example: &str,
    extra: &[String],
) -> Result<(), String> {
    let features = features.join(",");
    let mut args = vec!["run", "--release", "-p", package];
    if !features.is_empty() {
        args.extend(["--features", features.as_str()]);
    }
    args.extend(["--example", example, "--"]);
    args.extend(extra.iter().map(String::as_str));
    run(&project_root(), "cargo", &args)
}

/// [`run`] with environment changes: `set` variables are set, `remove` ones unset for the child.
pub(crate) fn run_with_env(
    dir: &Path,
    program: &str,
    args: &[&str],
    set: &[(&str, &str)],
    remove: &[&str],
) -> Result<(), String> {
    let assignments: String = set.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    eprintln!("$ {assignments}{program} {}", args.join(" "));
    let mut command = Command::new(program);
    command.args(args).current_dir(dir);
    for (key, value) in set {
        command.env(key, value);
    }
    for key in remove {
        command.env_remove(key);
    }
    let status = command
        .status()
        .map_err(|e| format!("could not start `{program}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{program} {}` failed with {status}",
            args.join(" ")
        ))
    }
}

/// Appends the `.rs` files under `dir` (recursively) to `out`.
pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("list {}: {e}", dir.display()))?;
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}
