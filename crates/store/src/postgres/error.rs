//! PostgreSQL driver errors, interpreted in one place.

use crate::StoreError;

/// Maps every `postgres` error to a [`StoreError`]. The one place its errors are interpreted.
pub(super) fn map_postgres_error(label: &str, error: postgres::Error) -> StoreError {
    use postgres::error::SqlState;
    if error.is_closed() {
        return StoreError::Closed;
    }
    if let Some(code) = error.code() {
        if *code == SqlState::LOCK_NOT_AVAILABLE
            || *code == SqlState::T_R_SERIALIZATION_FAILURE
            || *code == SqlState::T_R_DEADLOCK_DETECTED
        {
            return StoreError::Locked {
                path: label.to_string(),
                holder: None,
            };
        }
    }
    StoreError::Backend {
        backend: "postgres",
        source: Box::new(error),
    }
}
