//! PostgreSQL driver errors, interpreted in one place.

use std::error::Error;
use std::fmt;
use std::io;

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
            return StoreError::locked(label);
        }
    }
    StoreError::Backend {
        backend: "postgres",
        source: Box::new(Described(error)),
    }
}

/// [`map_postgres_error`] as a method of the driver's results.
pub(super) trait PgResult<T> {
    fn pg(self, label: &str) -> Result<T, StoreError>;
}

impl<T> PgResult<T> for Result<T, postgres::Error> {
    fn pg(self, label: &str) -> Result<T, StoreError> {
        self.map_err(|e| map_postgres_error(label, e))
    }
}

/// A driver error that says why: `postgres::Error`'s own `Display` is only "error connecting to
/// server" or "db error", its cause kept in `source()`. Nothing it shows carries a password (the
/// server's messages name the user at most; the URL is never part of a driver error).
#[derive(Debug)]
struct Described(postgres::Error);

impl fmt::Display for Described {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use postgres::error::SqlState;
        if let Some(db) = self.0.as_db_error() {
            let code = db.code();
            if *code == SqlState::INVALID_PASSWORD
                || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
            {
                f.write_str("authentication failed: ")?;
            }
            return write!(f, "{} (SQLSTATE {})", db.message(), code.code());
        }
        write!(f, "{}", self.0)?;
        match self.0.source() {
            Some(cause) => write!(f, ": {}", why(cause)),
            None => Ok(()),
        }
    }
}

impl Error for Described {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.0)
    }
}

/// The cause of a failed connection in words a person acts on, the operating system's own text
/// kept: refused, an unknown host, a timeout; any other cause as it is.
fn why(cause: &(dyn Error + 'static)) -> String {
    let Some(io) = cause.downcast_ref::<io::Error>() else {
        return cause.to_string();
    };
    let text = io.to_string();
    match io.kind() {
        io::ErrorKind::ConnectionRefused => {
            format!("connection refused: no server listens at that host and port ({text})")
        }
        io::ErrorKind::TimedOut => format!("timed out ({text})"),
        // `getaddrinfo` failing: tokio's `lookup_host` has no kind of its own for it.
        _ if text.contains("failed to lookup address") => format!("unknown host ({text})"),
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of tokio-postgres's connect errors: its own words, the `io::Error` as source.
    #[derive(Debug)]
    struct Connect(io::Error);

    impl fmt::Display for Connect {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("error connecting to server")
        }
    }

    impl Error for Connect {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn connect_causes_are_said_in_words() {
        let cases = [
            (
                io::Error::other("failed to lookup address information: Name or service not known"),
                "unknown host (failed to lookup address information",
            ),
            (
                io::Error::new(io::ErrorKind::TimedOut, "connection timed out"),
                "timed out (connection timed out)",
            ),
            (
                io::Error::from(io::ErrorKind::ConnectionRefused),
                "connection refused: no server listens",
            ),
            (
                io::Error::from(io::ErrorKind::PermissionDenied),
                "permission denied",
            ),
        ];
        for (cause, says) in cases {
            let error = Connect(cause);
            let shown = why(error.source().unwrap());
            assert!(shown.contains(says), "{shown}");
        }
    }
}
