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
