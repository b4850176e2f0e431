//! Which program rethread starts as codex: `--codex-bin` / `RETHREAD_CODEX_BIN` (default
//! `codex`), a path or a name looked up on `PATH` as a shell does. A program that is this very
//! binary (the same file through any link: by device and inode, or canonical path where those
//! are missing) would start itself without end; it is refused before anything starts.
//! rethread installed as `codex` finds the real one with [`Pick::NotSelf`].

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::output::UsageError;

/// Which match on `PATH` to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pick {
    /// The first, as a shell would run it; refused if it is rethread itself.
    First,
    /// The first that is not rethread itself (rethread standing in for `codex`).
    NotSelf,
}

/// The program to start as codex: `given` or `codex`, resolved on this process's `PATH` when
/// it is a bare name. A name found nowhere is returned as it is (starting it then fails with
/// the system's "not found").
pub(crate) fn resolve(given: Option<&Path>, pick: Pick) -> Result<PathBuf, UsageError> {
    let program = given.unwrap_or(Path::new("codex"));
    // `/proc/self/exe` is the running file even if it was moved or its link replaced.
    let exe = Path::new("/proc/self/exe");
    let exe = match exe.exists() {
        true => exe.to_path_buf(),
        false => std::env::current_exe().unwrap_or_default(),
    };
    let path_var = std::env::var_os("PATH");
    resolve_in(program, path_var.as_deref(), &Identity::of(&exe), pick)
}

/// What makes a file this binary: its device and inode where the platform has them, and its
/// canonical path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    file_id: Option<(u64, u64)>,
    canonical: Option<PathBuf>,
}

impl Identity {
    pub(crate) fn of(file: &Path) -> Identity {
        Identity {
            file_id: file_id(file),
            canonical: std::fs::canonicalize(file).ok(),
        }
    }

    fn is(&self, file: &Path) -> bool {
        match (&self.file_id, file_id(file)) {
            (Some(me), Some(it)) => *me == it,
            _ => self.canonical.is_some() && std::fs::canonicalize(file).ok() == self.canonical,
        }
    }
}

#[cfg(unix)]
fn file_id(file: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(file).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn file_id(_file: &Path) -> Option<(u64, u64)> {
    None
}

pub(crate) fn is_executable_file(path: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    #[cfg(unix)]
    let executable = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0;
    #[cfg(not(unix))]
    let executable = true;
    meta.is_file() && executable
}

/// [`resolve`] against an explicit `PATH` value and identity of "this binary".
pub(crate) fn resolve_in(
    program: &Path,
    path_var: Option<&OsStr>,
    me: &Identity,
    pick: Pick,
) -> Result<PathBuf, UsageError> {
    let refusal = |program: &Path| {
        UsageError(format!(
            "`{}` is rethread itself, not codex: it would start itself without end; name the \
             real codex with --codex-bin PATH or RETHREAD_CODEX_BIN",
            program.display()
        ))
    };
    if program.components().count() > 1 || program.is_absolute() {
        return match me.is(program) {
            true => Err(refusal(program)),
            false => Ok(program.to_path_buf()),
        };
    }
    let mut candidates = path_var
        .into_iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .filter(|path| is_executable_file(path));
    match pick {
        Pick::First => match candidates.next() {
            Some(found) if me.is(&found) => Err(refusal(&found)),
            Some(found) => Ok(found),
            None => Ok(program.to_path_buf()),
        },
        Pick::NotSelf => candidates.find(|path| !me.is(path)).ok_or_else(|| {
            UsageError(format!(
                "no `{}` on PATH other than rethread itself; name the real codex with \
                 --codex-bin PATH or RETHREAD_CODEX_BIN",
                program.display()
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn executable(path: &Path) {
        std::fs::write(path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// Two directories on PATH: `first/codex` links to "this binary", `second/codex` is
    /// another program; a third, `plain`, holds a `codex` that is not executable.
    fn layout() -> (tempfile::TempDir, Identity, std::ffi::OsString) {
        let dir = tempfile::tempdir().unwrap();
        let me = dir.path().join("rethread");
        executable(&me);
        for sub in ["first", "second", "plain"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        symlink(&me, dir.path().join("first/codex")).unwrap();
        executable(&dir.path().join("second/codex"));
        std::fs::write(dir.path().join("plain/codex"), "").unwrap();
        let path =
            std::env::join_paths(["plain", "first", "second"].map(|d| dir.path().join(d))).unwrap();
        (dir, Identity::of(&me), path)
    }

    #[test]
    fn the_first_codex_on_path_is_refused_when_it_is_rethread_itself() {
        let (dir, me, path) = layout();
        let err = resolve_in(Path::new("codex"), Some(&path), &me, Pick::First).unwrap_err();
        assert!(
            err.0.contains("first/codex` is rethread itself"),
            "{}",
            err.0
        );
        // Named by path, through a symlink or as itself.
        for named in [dir.path().join("first/codex"), dir.path().join("rethread")] {
            assert!(resolve_in(&named, Some(&path), &me, Pick::First).is_err());
        }
        let other = dir.path().join("second/codex");
        assert_eq!(
            resolve_in(&other, Some(&path), &me, Pick::First).unwrap(),
            other
        );
    }

    #[test]
    fn the_next_codex_that_is_not_rethread_is_found() {
        let (dir, me, path) = layout();
        assert_eq!(
            resolve_in(Path::new("codex"), Some(&path), &me, Pick::NotSelf).unwrap(),
            dir.path().join("second/codex")
        );
        let only_me = dir.path().join("first");
        assert!(resolve_in(
            Path::new("codex"),
            Some(only_me.as_os_str()),
            &me,
            Pick::NotSelf
        )
        .is_err());
    }

    #[test]
    fn a_name_found_nowhere_is_left_to_the_system() {
        let (_dir, me, path) = layout();
        assert_eq!(
            resolve_in(Path::new("no-such"), Some(&path), &me, Pick::First).unwrap(),
            Path::new("no-such")
        );
        assert_eq!(
            resolve_in(Path::new("codex"), None, &me, Pick::First).unwrap(),
            Path::new("codex")
        );
    }
}
