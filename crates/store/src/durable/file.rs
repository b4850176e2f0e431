//! Store files: what a path may be, created owner-only (in a directory created on request),
//! and the check that the file at the path is still the one open.

use std::fs::Metadata;
use std::io::ErrorKind;
use std::path::Path;

use crate::Result;
use crate::{OpenOptions, StoreError};

/// Checks the store's path before anything opens it, and creates the file when it is absent
/// and `options` allow (owner-only; its directory too with `create_dirs`). Returns whether the
/// file was created. A path that is not a regular file is refused unopened (opening a FIFO
/// blocks, and SQLite would create `/dev/null-journal`).
pub(crate) fn prepare_file(path: &Path, options: &OpenOptions) -> Result<bool> {
    let label = crate::redact::path_label(path);
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => Err(StoreError::NotAFile {
            path: label.clone(),
            found: kind(&meta),
        }),
        // An empty file is a store not made yet (a creation interrupted before the engine
        // wrote its header): only a command that may create one makes it.
        Ok(meta) if meta.len() == 0 && !options.may_create() => {
            Err(StoreError::no_store(label.clone()))
        }
        Ok(_) => match std::fs::OpenOptions::new()
            .read(true)
            .write(!options.read_only)
            .open(path)
        {
            Ok(_) => Ok(false),
            Err(e) => Err(open_error(&label, e)),
        },
        Err(e) if e.kind() == ErrorKind::NotFound => {
            if !options.may_create() {
                return Err(StoreError::no_store(label));
            }
            if options.create_dirs {
                create_parent(path)?;
            }
            create_owner_only(path, &label)
        }
        Err(source) => Err(StoreError::io(label, source)),
    }
}

/// An error opening or creating the store's file: `NotWritable` for a permission error (a
/// read-only file, directory or file system), else `Io`.
pub(crate) fn open_error(label: &str, error: std::io::Error) -> StoreError {
    let path = label.to_string();
    match error.kind() {
        ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem => StoreError::NotWritable {
            path,
            source: Some(Box::new(error)),
        },
        _ => StoreError::Io {
            path,
            source: error,
        },
    }
}

fn kind(meta: &Metadata) -> &'static str {
    let file_type = meta.file_type();
    if file_type.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "a FIFO";
        }
        if file_type.is_char_device() || file_type.is_block_device() {
            return "a device";
        }
        if file_type.is_socket() {
            return "a socket";
        }
    }
    "not a file"
}

fn create_parent(path: &Path) -> Result<()> {
    let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(());
    };
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    let label = crate::redact::path_label(parent);
    builder.create(parent).map_err(|e| open_error(&label, e))
}

/// Options that create a file owner-only (0600).
pub(crate) fn owner_only() -> std::fs::OpenOptions {
    let mut options = std::fs::OpenOptions::new();
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
}

fn create_owner_only(path: &Path, label: &str) -> Result<bool> {
    match owner_only().write(true).create_new(true).open(path) {
        Ok(_) => Ok(true),
        // Another process created it first: open it as an existing store.
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(open_error(label, e)),
    }
}

/// Which file (device and inode) a path named when the store opened it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileId(Option<(u64, u64)>);

impl FileId {
    /// The file `path` names now.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn of_path(path: &Path) -> Result<FileId> {
        identity(path).map_err(|source| StoreError::io(crate::redact::path_label(path), source))
    }

    /// The file `meta` describes.
    pub(crate) fn of(meta: &Metadata) -> FileId {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            FileId(Some((meta.dev(), meta.ino())))
        }
        #[cfg(not(unix))]
        {
            let _ = meta;
            FileId(None)
        }
    }

    /// [`StoreError::Gone`] unless `path` still names this file (one `stat` per group commit).
    pub(crate) fn check(&self, path: &Path, label: &str) -> Result<()> {
        if self.0.is_none() {
            return Ok(());
        }
        let gone = || StoreError::Gone {
            path: label.to_string(),
        };
        match identity(path) {
            Ok(now) if now == *self => Ok(()),
            Ok(_) => Err(gone()),
            Err(e) if e.kind() == ErrorKind::NotFound => Err(gone()),
            Err(source) => Err(StoreError::io(label, source)),
        }
    }
}

/// The device and inode `path` names, by a `statx` that asks for nothing else. A stat that
/// reads the file's times makes Linux (multigrain timestamps, 6.13 and later) give the file's
/// next write a fine-grained mtime, which ext4 then journals on each write of the next commit:
/// `std::fs::metadata` here made a durable redb commit about 50 µs slower (p50 0.18 -> 0.23 ms).
#[cfg(target_os = "linux")]
fn identity(path: &Path) -> std::io::Result<FileId> {
    use rustix::fs::{makedev, statx, AtFlags, StatxFlags, CWD};
    match statx(CWD, path, AtFlags::empty(), StatxFlags::INO) {
        Ok(found) => Ok(FileId(Some((
            makedev(found.stx_dev_major, found.stx_dev_minor),
            found.stx_ino,
        )))),
        // A kernel before 4.11, or a sandbox that filters `statx`.
        Err(rustix::io::Errno::NOSYS) => metadata_identity(path),
        Err(errno) => Err(errno.into()),
    }
}

#[cfg(not(target_os = "linux"))]
fn identity(path: &Path) -> std::io::Result<FileId> {
    metadata_identity(path)
}

fn metadata_identity(path: &Path) -> std::io::Result<FileId> {
    Ok(FileId::of(&std::fs::metadata(path)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_files_identity_is_the_device_and_inode_a_full_stat_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        std::fs::write(&path, b"x").unwrap();
        let full = FileId::of(&std::fs::metadata(&path).unwrap());
        assert_eq!(identity(&path).unwrap(), full);
        assert!(full.check(&path, "store").is_ok());

        // No file at the path, then another one (the first is kept, so that its inode
        // number is not reused).
        std::fs::rename(&path, dir.path().join("moved")).unwrap();
        let missing = identity(&path).unwrap_err();
        assert_eq!(missing.kind(), ErrorKind::NotFound);
        assert!(matches!(
            full.check(&path, "store"),
            Err(StoreError::Gone { .. })
        ));
        std::fs::write(dir.path().join("other"), b"y").unwrap();
        std::fs::rename(dir.path().join("other"), &path).unwrap();
        assert_ne!(identity(&path).unwrap(), full);
        assert!(matches!(
            full.check(&path, "store"),
            Err(StoreError::Gone { .. })
        ));
    }
}
