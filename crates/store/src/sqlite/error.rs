//! SQLite errors, interpreted in one place.

use crate::StoreError;

/// Maps every rusqlite error to a [`StoreError`]. The one place SQLite errors are interpreted.
pub(crate) fn map_sqlite_error(path: &str, error: rusqlite::Error) -> StoreError {
    use rusqlite::ffi::ErrorCode;
    if let rusqlite::Error::SqliteFailure(failure, _) = &error {
        match failure.code {
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => {
                return StoreError::Locked {
                    path: path.to_string(),
                    holder: None,
                }
            }
            // A read-only file, directory (no room for the WAL) or file system.
            ErrorCode::ReadOnly => {
                return StoreError::NotWritable {
                    path: path.to_string(),
                    source: Some(Box::new(error)),
                }
            }
            ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt => {
                return StoreError::Corrupt {
                    path: path.to_string(),
                    detail: "SQLite reports the file is damaged or not a database".to_string(),
                    source: Some(Box::new(error)),
                }
            }
            _ => {}
        }
    }
    if matches!(
        error,
        rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
            | rusqlite::Error::Utf8Error(..)
    ) {
        // Our own columns hold what we wrote: a value of another type is damage.
        return StoreError::Corrupt {
            path: path.to_string(),
            detail: "a column holds a value of the wrong type".to_string(),
            source: Some(Box::new(error)),
        };
    }
    StoreError::Backend {
        backend: "sqlite",
        source: Box::new(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_only_database_is_not_writable() {
        let error = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_READONLY),
            Some("attempt to write a readonly database".to_string()),
        );
        let mapped = map_sqlite_error("/ro/s.db", error);
        assert!(
            matches!(&mapped, StoreError::NotWritable { path, .. } if path == "/ro/s.db"),
            "{mapped:?}"
        );
        assert_eq!(mapped.to_string(), "store /ro/s.db is not writable");
    }
}
