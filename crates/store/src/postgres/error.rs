//! tokio-postgres and pool errors, interpreted in one place.

use crate::StoreError;

/// Maps every tokio-postgres error to a [`StoreError`]. The one place its errors are
/// interpreted.
pub(super) fn map_postgres_error(label: &str, error: tokio_postgres::Error) -> StoreError {
    use tokio_postgres::error::SqlState;
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
            };
        }
    }
    StoreError::Backend {
        backend: "postgres",
        source: Box::new(error),
    }
}

pub(super) fn map_pool_error(label: &str, error: deadpool_postgres::PoolError) -> StoreError {
    match error {
        deadpool_postgres::PoolError::Backend(e) => map_postgres_error(label, e),
        deadpool_postgres::PoolError::Closed => StoreError::Closed,
        other => StoreError::Backend {
            backend: "postgres",
            source: format!("connection pool ({label}): {other}").into(),
        },
    }
}
