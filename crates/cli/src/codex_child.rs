//! codex dies with the rethread process that started it, however that process dies (SIGKILL
//! to its pid alone, as a supervisor or the OOM killer sends it, included).
//!
//! On Linux rethread starts codex through itself: `/proc/self/exe __codex-child PID PROGRAM
//! ARGS...`. That process asks the kernel for SIGKILL when its parent dies
//! (`PR_SET_PDEATHSIG`, which an exec keeps), checks its parent is still `PID` (the one that
//! started it, else it exits: the parent died before the request), and execs `PROGRAM` in
//! its own place: codex is still rethread's child, in its process group, with its pid, stdio,
//! signals and exit status, and is killed with rethread. The signal is sent when the
//! *thread* that spawned it ends: rethread spawns codex from its main thread (every command
//! runs its work in `block_on` there) or a runtime worker, which live as long as the process.
//!
//! The npm package's launcher (`@openai/codex/bin/codex.js`) runs the native binary as its
//! child on a Node without `process.execve` (before 22.15): killed with rethread, it would
//! leave that child running. So the native binary is run in its place, found where the
//! launcher finds it and with the variables it sets. codex's own commands are its business:
//! a sandboxed command that codex itself started is not rethread's child.
//!
//! A program that is not an executable file is started directly (the spawn fails with the
//! system's error, as before); elsewhere than Linux, codex is started directly.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The first argument that makes this binary the shim.
const SHIM: &str = "__codex-child";

/// `program` as rethread starts it: through the shim where it can (see above).
pub(crate) fn codex_command(program: &Path) -> rethread_runtime::CodexCommand {
    if cfg!(target_os = "linux") && crate::codex_bin::is_executable_file(program) {
        let pid = std::process::id().to_string();
        let prefix: [OsString; 3] = [SHIM.into(), pid.into(), program.into()];
        return rethread_runtime::CodexCommand::new("/proc/self/exe").global_args(prefix);
    }
    rethread_runtime::CodexCommand::new(program)
}

/// When this process is the shim: runs codex in its place and returns only if that failed.
pub(crate) fn main_if_shim() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(OsStr::new(SHIM)) {
        return None;
    }
    let parent = args
        .next()
        .and_then(|pid| pid.to_str()?.parse::<u32>().ok());
    let program = PathBuf::from(args.next().unwrap_or_default());
    Some(run(parent, &program, args))
}

#[cfg(target_os = "linux")]
fn run(parent: Option<u32>, program: &Path, args: impl Iterator<Item = OsString>) -> ExitCode {
    use std::os::unix::process::CommandExt;
    let died =
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    if let Err(error) = died {
        return fail(program, &error.into());
    }
    if parent != Some(std::os::unix::process::parent_id()) {
        // Started by a process that is gone already: nobody is left to run codex for.
        return ExitCode::from(crate::output::EXIT_FAILED);
    }
    let mut command = match npm_native(program) {
        Some((native, root)) => {
            let mut command = std::process::Command::new(native);
            command.env("CODEX_MANAGED_PACKAGE_ROOT", root);
            const MANAGERS: [&str; 4] = ["NPM", "BUN", "PNPM", "VITE_PLUS"];
            if MANAGERS
                .iter()
                .all(|m| std::env::var_os(format!("CODEX_MANAGED_BY_{m}")).is_none())
            {
                command.env("CODEX_MANAGED_BY_NPM", "1");
            }
            command
        }
        None => std::process::Command::new(program),
    };
    fail(program, &command.args(args).exec())
}

#[cfg(not(target_os = "linux"))]
fn run(_parent: Option<u32>, program: &Path, _args: impl Iterator<Item = OsString>) -> ExitCode {
    fail(program, &std::io::ErrorKind::Unsupported.into())
}

fn fail(program: &Path, error: &std::io::Error) -> ExitCode {
    let cause = format!("could not start `{}`: {error}", program.display());
    crate::output::fail(&cause, crate::output::EXIT_FAILED)
}

/// When `program` is the npm package's launcher: the native binary it would run and the
/// package's directory. Looked up as the launcher's `require.resolve` looks (the platform
/// package in `node_modules` of the package's directory and of each one above it), then in
/// the package's own `vendor`.
#[cfg(target_os = "linux")]
fn npm_native(program: &Path) -> Option<(PathBuf, PathBuf)> {
    let script = std::fs::canonicalize(program).ok()?;
    let root = script.parent()?.parent()?;
    let manifest = std::fs::read(root.join("package.json")).ok()?;
    let manifest: serde_json::Value = serde_json::from_slice(&manifest).ok()?;
    if script.file_name()? != "codex.js" || manifest["name"] != "@openai/codex" {
        return None;
    }
    let (package, triple) = match std::env::consts::ARCH {
        "x86_64" => ("codex-linux-x64", "x86_64-unknown-linux-musl"),
        "aarch64" => ("codex-linux-arm64", "aarch64-unknown-linux-musl"),
        _ => return None,
    };
    let platform = Path::new("node_modules/@openai").join(package);
    let native = root
        .ancestors()
        .map(|dir| dir.join(&platform))
        .chain([root.to_path_buf()])
        .map(|dir| dir.join("vendor").join(triple).join("bin/codex"))
        .find(|native| native.is_file())?;
    Some((native, root.to_path_buf()))
}
