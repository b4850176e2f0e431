//! Store files: created owner-only, in a directory created on request.

use std::path::Path;

use crate::{OpenOptions, StoreError};

/// Creates the store file's directory when `options` ask for it
/// ([`OpenOptions::create_dirs`]), owner-only (0700) where the platform has modes.
pub(crate) fn prepare_path(path: &Path, options: &OpenOptions) -> Result<(), StoreError> {
    if !options.create_dirs {
        return Ok(());
    }
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
    builder.create(parent).map_err(|source| StoreError::Io {
        path: parent.display().to_string(),
        source,
    })
}

/// Creates `path` owner-only (0600) if it does not exist. Returns whether it was created.
pub(crate) fn create_owner_only(path: &Path, create: bool) -> Result<bool, StoreError> {
    let label = path.display().to_string();
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => {
            return Err(StoreError::InvalidInput(format!(
                "store path {label} is a directory"
            )))
        }
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(StoreError::Io {
                path: label,
                source,
            })
        }
    }
    if !create {
        return Err(StoreError::NotFound {
            what: format!("store file {label}"),
        });
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    match options.open(path) {
        Ok(_) => Ok(true),
        // Another process created it first: open it as an existing store.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(source) => Err(StoreError::Io {
            path: label,
            source,
        }),
    }
}
