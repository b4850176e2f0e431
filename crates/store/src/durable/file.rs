//! Store files: what a path may be, created owner-only (in a directory created on request),
//! and the check that the file at the path is still the one open.

use std::fs::Metadata;
use std::io::ErrorKind;
use std::path::Path;

use crate::Result;
use crate::{OpenOptions, StoreError};

/// Checks the store's path before anything opens it, and creates the file when it is absent
/// and `options` allow (owner-only, 0600; its directory too with `create_dirs`, 0700).
/// Returns whether the file was created.
///
/// Refused, without opening it: a path that is not a regular file ([`StoreError::NotAFile`]:
/// opening a FIFO blocks, and SQLite would create `/dev/null-journal`), a missing file when
/// creating is off ([`StoreError::NoStore`]), a file or directory this process cannot write
/// ([`StoreError::NotWritable`]).
pub(crate) fn prepare_file(path: &Path, options: &OpenOptions) -> Result<bool> {
    let label = path.display().to_string();
    let io = |source| StoreError::Io {
        path: label.clone(),
        source,
    };
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => Err(StoreError::NotAFile {
            path: label.clone(),
            found: kind(&meta),
        }),
        // An empty file is a store not made yet (a creation interrupted before the engine
        // wrote its header): only a command that may create one makes it.
        Ok(meta) if meta.len() == 0 && !options.may_create() => Err(StoreError::NoStore {
            path: label.clone(),
        }),
        Ok(_) => match std::fs::OpenOptions::new()
            .read(true)
            .write(!options.read_only)
            .open(path)
        {
            Ok(_) => Ok(false),
            Err(e) => Err(not_writable(&label, e).unwrap_or_else(io)),
        },
        Err(e) if e.kind() == ErrorKind::NotFound => {
            if !options.may_create() {
                return Err(StoreError::NoStore { path: label });
            }
            if options.create_dirs {
                create_parent(path)?;
            }
            create_owner_only(path, &label)
        }
        Err(e) => Err(io(e)),
    }
}

/// `NotWritable` for a permission error (a read-only file, directory or file system).
pub(crate) fn not_writable(
    label: &str,
    error: std::io::Error,
) -> Result<StoreError, std::io::Error> {
    let read_only = matches!(
        error.kind(),
        ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem
    );
    if read_only {
        Ok(StoreError::NotWritable {
            path: label.to_string(),
            source: Some(Box::new(error)),
        })
    } else {
        Err(error)
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
    let label = parent.display().to_string();
    builder.create(parent).map_err(|source| {
        not_writable(&label, source).unwrap_or_else(|source| StoreError::Io {
            path: label.clone(),
            source,
        })
    })
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
        Err(e) => Err(
            not_writable(label, e).unwrap_or_else(|source| StoreError::Io {
                path: label.to_string(),
                source,
            }),
        ),
    }
}

/// Which file a path named when the store opened it (device and inode), to tell that the
/// file at the path is still the one open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileId(Option<(u64, u64)>);

impl FileId {
    /// The file `path` names now.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn of_path(path: &Path) -> Result<FileId> {
        let meta = std::fs::metadata(path).map_err(|source| StoreError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Ok(FileId::of(&meta))
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

    /// [`StoreError::Gone`] unless `path` still names this file: a store file deleted or
    /// replaced under a live host would take commits the next process never finds. One
    /// `stat` per group commit.
    pub(crate) fn check(&self, path: &Path, label: &str) -> Result<()> {
        let Some(open) = self.0 else {
            return Ok(());
        };
        let gone = || StoreError::Gone {
            path: label.to_string(),
        };
        match std::fs::metadata(path) {
            Ok(meta) if FileId::of(&meta).0 == Some(open) => Ok(()),
            Ok(_) => Err(gone()),
            Err(e) if e.kind() == ErrorKind::NotFound => Err(gone()),
            Err(source) => Err(StoreError::Io {
                path: label.to_string(),
                source,
            }),
        }
    }
}
