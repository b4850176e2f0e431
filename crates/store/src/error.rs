//! The one error type of this crate.

use std::error::Error as StdError;

/// A boxed error from a storage engine, kept as the `source` of a [`StoreError`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// The result of a store operation: [`StoreError`] unless another error is named.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Everything that can go wrong in a [`BindingStore`](crate::BindingStore), by meaning: each
/// backend maps its driver's errors into these in one function (`map_redb_error`, ...).
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The thing asked for does not exist (a session).
    #[error("not found: {what}")]
    NotFound {
        /// What was looked for.
        what: String,
    },
    /// The request contradicts what is stored (an import over a different session).
    #[error("conflict on session {session_id}: {detail}")]
    Conflict {
        /// The session concerned.
        session_id: String,
        /// Why the request conflicts.
        detail: String,
    },
    /// A request would publish a thread id that was retired for this session.
    #[error("thread {thread_id} is retired for session {session_id} and cannot be bound")]
    RetiredThread {
        /// The session concerned.
        session_id: String,
        /// The retired thread id.
        thread_id: String,
    },
    /// The store is damaged, truncated, or not a rethread store; never read as empty.
    #[error("store {path} is corrupt or not a rethread store: {detail}")]
    Corrupt {
        /// The store's path (or its URL, password redacted); `detail` says where in it.
        path: String,
        /// What was found wrong.
        detail: String,
        /// The engine's error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// The store is held by another process past [`OpenOptions::wait`](crate::OpenOptions::wait)
    /// (redb's file lock, SQLite's write lock).
    #[error("store {path} is in use by another process{}", holder.as_ref().map(|h| format!(" ({h})")).unwrap_or_default())]
    Locked {
        /// The store's path.
        path: String,
        /// Who holds it, for people, when the store knows (redb's holder record).
        holder: Option<String>,
    },
    /// No store at the path, and the store was opened without
    /// [`create`](crate::OpenOptions::create).
    #[error("no store at {path}")]
    NoStore {
        /// The store's path (or URL, password redacted).
        path: String,
    },
    /// The store's path is not a regular file: refused before anything opens it.
    #[error("store path {path} is not a regular file ({found})")]
    NotAFile {
        /// The path.
        path: String,
        /// What is there.
        found: &'static str,
    },
    /// The store (its file or its directory) cannot be written by this process.
    #[error("store {path} is not writable")]
    NotWritable {
        /// The store's path.
        path: String,
        /// The operating system's or engine's error.
        #[source]
        source: Option<BoxError>,
    },
    /// The store's file was deleted or replaced while open: a commit into it would not be
    /// found by the next process, so none is acknowledged.
    #[error("store file {path} was deleted or replaced while open; reopen the store")]
    Gone {
        /// The store's path.
        path: String,
    },
    /// The store was written by a newer rethread whose schema this build does not know.
    #[error("store {path} has schema version {found}; this build supports up to {supported}")]
    NewerSchema {
        /// The store's path.
        path: String,
        /// The schema version found in the file.
        found: u64,
        /// The newest schema version this build can read.
        supported: u64,
    },
    /// An I/O error outside the engine (creating, opening or inspecting the file).
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The path concerned.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Any other engine error.
    #[error("{backend} backend error: {source}")]
    Backend {
        /// Which backend (`redb`, `sqlite`, ...).
        backend: &'static str,
        /// The engine's error.
        #[source]
        source: BoxError,
    },
    /// The caller passed something the store refuses (an empty id, an inconsistent export, ...).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A bug in this crate: one of its own invariants did not hold. Unlike the logical
    /// refusals it fails the whole group commit it was part of (each write is retried alone).
    #[error("internal error in rethread-store: {0}")]
    Internal(String),
    /// The store was closed, or its writer thread is gone.
    #[error("the store is closed")]
    Closed,
    /// The session's lease is held by another owner: another host is driving this session's
    /// codex thread. Retry later or show who holds it.
    #[error("session {session_id} is busy: held by {holder} since {}, until {} unless renewed",
        time_for_people(*acquired_at_ms), time_for_people(*expires_at_ms))]
    Busy {
        /// The session concerned.
        session_id: String,
        /// Who holds the lease.
        holder: crate::LeaseOwner,
        /// Since when (ms since the Unix epoch, store clock).
        acquired_at_ms: i64,
        /// Until when, unless renewed (ms since the Unix epoch, store clock).
        expires_at_ms: i64,
    },
    /// A renewal or a fenced write of a grant that is no longer the session's newest, or was
    /// released; nothing was written.
    #[error("the lease on session {session_id} is no longer held by this owner: {cause}")]
    LeaseLost {
        /// The session concerned.
        session_id: String,
        /// Why the grant is lost.
        cause: LeaseLoss,
    },
    /// The thread belongs to another session; nothing was written.
    #[error("thread {thread_id} belongs to session {session_id}")]
    ThreadTaken {
        /// The thread.
        thread_id: String,
        /// The session it belongs to.
        session_id: String,
    },
    /// A mirror append does not extend the stored file (its base length or CRC-32 is not the
    /// stored file's); nothing was written. A writer sends the whole file instead.
    #[error(
        "the mirror of {path} (thread {thread_id}, session {session_id}) does not extend: {detail}"
    )]
    MirrorMismatch {
        /// The session.
        session_id: String,
        /// The thread.
        thread_id: String,
        /// The file, relative to `CODEX_HOME`.
        path: String,
        /// What the append named and what is stored.
        detail: String,
    },
    /// The store is sealed and no key was given (`--store-key-file`,
    /// `RETHREAD_STORE_KEY_FILE`, [`OpenOptions::key`](crate::OpenOptions::key)); nothing was
    /// read or changed.
    #[error("store {store} is sealed: give its key (--store-key-file or RETHREAD_STORE_KEY_FILE)")]
    KeyRequired {
        /// The store, as errors name it.
        store: String,
    },
    /// The store is sealed with another key; nothing was read or changed.
    #[error("store {store} is sealed with another key than the one given")]
    WrongKey {
        /// The store, as errors name it.
        store: String,
    },
    /// A key was given for a store that holds sessions written without one; nothing was
    /// changed. A copy seals it (`rethread migrate --to-key-file`).
    #[error("store {store} is not sealed and holds sessions: seal a copy of it with `rethread migrate --to-key-file`, or open it without a key")]
    NotSealed {
        /// The store, as errors name it.
        store: String,
    },
    /// The store URL names a scheme this build does not support.
    #[error("unsupported store URL `{url}`: {reason}")]
    UnsupportedUrl {
        /// The URL as given, password redacted ([`redact_url`](crate::redact_url)).
        url: String,
        /// Why it is not supported.
        reason: String,
    },
}

impl StoreError {
    /// Whether this error is a verdict about the request (the store is fine and untouched)
    /// rather than a failure of the store: the other writes of its group commit still commit.
    pub fn is_logical(&self) -> bool {
        matches!(
            self,
            StoreError::NotFound { .. }
                | StoreError::Conflict { .. }
                | StoreError::RetiredThread { .. }
                | StoreError::InvalidInput(_)
                | StoreError::Busy { .. }
                | StoreError::LeaseLost { .. }
                | StoreError::ThreadTaken { .. }
                | StoreError::MirrorMismatch { .. }
        )
    }

    pub(crate) fn io(path: impl Into<String>, source: std::io::Error) -> Self {
        let path = path.into();
        StoreError::Io { path, source }
    }

    pub(crate) fn lease_lost(session_id: &str, cause: LeaseLoss) -> Self {
        let session_id = session_id.to_string();
        StoreError::LeaseLost { session_id, cause }
    }

    pub(crate) fn corrupt(path: &str, detail: impl Into<String>) -> Self {
        let (path, detail) = (path.to_string(), detail.into());
        StoreError::Corrupt {
            path,
            detail,
            source: None,
        }
    }
}

/// The constructors only the backends use.
#[cfg_attr(
    not(any(feature = "redb", feature = "sqlite", feature = "postgres")),
    allow(dead_code)
)]
impl StoreError {
    /// Refuses a store whose schema version is `found`, unless it is this build's.
    pub(crate) fn check_schema_version(path: &str, found: u64) -> Result<()> {
        let supported = crate::SCHEMA_VERSION;
        if found > supported {
            let path = path.to_string();
            return Err(StoreError::NewerSchema {
                path,
                found,
                supported,
            });
        }
        if found < supported {
            let detail = format!("unknown schema version {found}");
            return Err(StoreError::corrupt(path, detail));
        }
        Ok(())
    }

    pub(crate) fn no_store(path: impl Into<String>) -> Self {
        let path = path.into();
        StoreError::NoStore { path }
    }

    pub(crate) fn locked(path: impl Into<String>) -> Self {
        let (path, holder) = (path.into(), None);
        StoreError::Locked { path, holder }
    }

    /// `Corrupt`: the stored JSON `what` does not decode.
    pub(crate) fn corrupt_json(path: &str, what: String, error: serde_json::Error) -> Self {
        StoreError::Corrupt {
            path: path.to_string(),
            detail: format!("{what} does not decode"),
            source: Some(Box::new(error)),
        }
    }

    /// A write (or lease request) of a store opened
    /// [`read_only`](crate::OpenOptions::read_only), refused before it reaches the engine.
    pub(crate) fn opened_read_only(path: &str) -> Self {
        let source = Some("the store was opened read-only".into());
        let path = path.to_string();
        StoreError::NotWritable { path, source }
    }
}

/// `value` as JSON (a failure is a bug: the crate's types always serialise).
#[cfg_attr(
    not(any(feature = "redb", feature = "sqlite", feature = "postgres")),
    allow(dead_code)
)]
pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| StoreError::Internal(format!("encoding JSON: {e}")))
}

/// Why a lease grant is lost ([`StoreError::LeaseLost`]).
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseLoss {
    /// Another owner acquired the session's lease since this grant.
    TakenOver {
        /// The owner of the newer grant (holding it or not).
        holder: crate::LeaseOwner,
    },
    /// The session was deleted since: its lease was granted to nobody.
    Forgotten,
    /// This grant was released.
    Released,
}

impl std::fmt::Display for LeaseLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseLoss::TakenOver { holder } => write!(f, "taken over by {holder}"),
            LeaseLoss::Forgotten => f.write_str("the session was forgotten"),
            LeaseLoss::Released => f.write_str("it was released"),
        }
    }
}

/// `ms` (milliseconds since the Unix epoch) as a person reads it in a message: the UTC time
/// to the second, and how long ago or from now by this machine's clock.
///
/// ```
/// let said = rethread_store::time_for_people(951_782_400_000);
/// assert!(said.starts_with("2000-02-29 00:00:00 UTC ("), "{said}");
/// assert!(said.ends_with(" ago)"), "{said}");
/// ```
pub fn time_for_people(ms: i64) -> String {
    time_from(ms, jiff::Timestamp::now().as_millisecond())
}

/// [`time_for_people`] with `now_ms` for now.
fn time_from(ms: i64, now_ms: i64) -> String {
    let Ok(at) = jiff::Timestamp::from_millisecond(ms) else {
        return format!("{ms} ms since the epoch");
    };
    let secs = ms.saturating_sub(now_ms) / 1000;
    let away = jiff::SignedDuration::from_secs(secs);
    let when = match secs {
        0 => "now".to_string(),
        ..0 => format!("{away:#}"),
        _ => format!("in {away:#}"),
    };
    format!("{} ({when})", at.strftime("%Y-%m-%d %H:%M:%S UTC"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_said_in_utc_and_from_now() {
        let now = 1_796_425_465_380; // 2026-12-04 23:04:25.380 UTC
        assert_eq!(time_from(now, now), "2026-12-04 23:04:25 UTC (now)");
        assert_eq!(
            time_from(now - 12_000, now),
            "2026-12-04 23:04:13 UTC (12s ago)"
        );
        assert_eq!(
            time_from(now + 3_723_000, now),
            "2026-12-05 00:06:28 UTC (in 1h 2m 3s)"
        );
        assert!(time_from(i64::MAX, now).contains("ms since the epoch"));
        let busy = StoreError::Busy {
            session_id: "s".into(),
            holder: crate::LocalOwner::new().owner().clone(),
            acquired_at_ms: now,
            expires_at_ms: now + 30_000,
        };
        let said = busy.to_string();
        assert!(said.contains(" UTC ("), "{said}");
        assert!(!said.contains(&now.to_string()), "{said}");
    }
}
