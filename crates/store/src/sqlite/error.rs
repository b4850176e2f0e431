//! SQLite errors, interpreted in one place.

use crate::{BoxError, StoreError};

/// Maps every rusqlite error to a [`StoreError`]. The one place SQLite errors are interpreted.
pub(crate) fn map_sqlite_error(path: &str, error: rusqlite::Error) -> StoreError {
    use rusqlite::ffi::ErrorCode;
    use rusqlite::Error::*;
    let path = path.to_string();
    let code = match &error {
        SqliteFailure(failure, _) => Some(failure.code),
        _ => None,
    };
    let detail = match code {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            return StoreError::locked(path)
        }
        // A read-only file, directory (no room for the WAL) or file system.
        Some(ErrorCode::ReadOnly) => {
            let source = Some(Box::new(error) as BoxError);
            return StoreError::NotWritable { path, source };
        }
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
            "SQLite reports the file is damaged or not a database"
        }
        // Our own columns hold what we wrote: a value of another type is damage.
        _ if matches!(
            error,
            InvalidColumnType(..)
                | FromSqlConversionFailure(..)
                | IntegralValueOutOfRange(..)
                | Utf8Error(..)
        ) =>
        {
            "a column holds a value of the wrong type"
        }
        _ => {
            let source = Box::new(error);
            return StoreError::Backend {
                backend: "sqlite",
                source,
            };
        }
    };
    let source = Some(Box::new(error) as BoxError);
    StoreError::Corrupt {
        path,
        detail: detail.to_string(),
        source,
    }
}

/// [`map_sqlite_error`] as a method of rusqlite's results.
pub(super) trait SqliteResult<T> {
    fn sqlite(self, label: &str) -> Result<T, StoreError>;
}

impl<T> SqliteResult<T> for rusqlite::Result<T> {
    fn sqlite(self, label: &str) -> Result<T, StoreError> {
        self.map_err(|e| map_sqlite_error(label, e))
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
