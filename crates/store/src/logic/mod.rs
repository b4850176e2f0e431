//! The semantics of every read, write and lease request, written once as functions over a
//! small key-value view of one live transaction ([`ReadTxn`], [`WriteTxn`], [`LeaseTxn`]) that
//! every backend's [`Engine`](crate::engine::Engine) provides; `store.rs` runs them as the
//! [`BindingStore`](crate::BindingStore) methods.
//!
//! Every logical refusal (`InvalidInput`, `Conflict`, `RetiredThread`, `LeaseLost`, `Busy`,
//! `ThreadTaken`, `MirrorMismatch`) is decided **before** an operation's first write, so a
//! refused operation leaves the transaction untouched and the other operations of the same
//! group commit can still commit.

pub(crate) mod codec;
mod leases;
pub(crate) mod mirror;
pub(crate) mod prune;
mod reads;
mod writes;

use std::ops::Range;

use serde_json::{Map, Value};

use crate::Result;
use crate::{BindingState, SessionRecord, StoreError, TranscriptRow, CODEX_THREAD_ID_KEY};

#[cfg_attr(not(feature = "redb"), allow(unused_imports))]
pub(crate) use leases::{acquire, release, renew, stale_grants, LocalLeases};
pub use leases::{Grant, GrantState, LeaseTxn};
#[cfg(any(feature = "redb", feature = "sqlite"))]
pub(crate) use reads::session_threads;
pub(crate) use reads::{export, list_page, rows, write_mirror_file};
pub(crate) use writes::{commit, delete, import, mark_delivered, patch, retire};

/// Which mirrored file a chunk belongs to: the session, its thread, and the file's path
/// relative to `CODEX_HOME`.
#[derive(Debug, Clone, Copy)]
pub struct FileKey<'a> {
    /// The session.
    pub session_id: &'a str,
    /// The thread whose rollout the file is.
    pub thread_id: &'a str,
    /// The file's path relative to `CODEX_HOME`.
    pub path: &'a str,
}

impl std::fmt::Display for FileKey<'_> {
    /// How errors name the file: `PATH (session S)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (session {})", self.path, self.session_id)
    }
}

impl<'a> FileKey<'a> {
    pub(crate) fn new(session_id: &'a str, thread_id: &'a str, path: &'a str) -> Self {
        Self {
            session_id,
            thread_id,
            path,
        }
    }
}

/// A read view of one transaction (or snapshot), as an engine hands it to an operation.
pub trait ReadTxn {
    /// The store as errors name it: its path, or its URL with the password redacted.
    fn label(&self) -> &str;
    /// The session's record, if stored.
    fn load(&mut self, session_id: &str) -> Result<Option<SessionRecord>>;
    /// The session's rows whose `seq` is in `range`, in order.
    fn load_rows(&mut self, session_id: &str, range: Range<u64>) -> Result<Vec<TranscriptRow>>;
    /// Up to `limit` records with a session id greater than `after`, in order.
    fn list(&mut self, after: Option<&str>, limit: usize) -> Result<Vec<SessionRecord>>;
    /// Whether any row of the session is stored.
    fn has_rows(&mut self, session_id: &str) -> Result<bool>;
    /// The bytes of the session's stored rows (their JSON text); 0 for none.
    fn row_bytes(&mut self, session_id: &str) -> Result<u64>;
    /// The session `thread_id` belongs to, if any.
    fn thread_owner(&mut self, thread_id: &str) -> Result<Option<String>>;
    /// The threads that belong to `session_id`, in any order.
    fn session_threads(&mut self, session_id: &str) -> Result<Vec<String>>;
    /// The sessions of the first and of the last stored row (by key), each with whether its
    /// record exists; empty when there are no rows.
    fn row_ends(&mut self) -> Result<Vec<(String, bool)>>;
    /// Up to `limit` sessions after `after` (`""`: from the start), in order, that have a lease
    /// record and no session record, the record last live (held until it expired, or
    /// released or forgotten) before `cutoff`.
    fn stale_leases(&mut self, after: &str, cutoff: i64, limit: usize) -> Result<Vec<String>>;
    /// The key check of a sealed store (`docs/design.md`, "Sealed stores"); `None` for a
    /// store that was never sealed.
    fn seal_check(&mut self) -> Result<Option<u64>>;
    /// Hands `each` the stored chunks of a mirrored file whose `seq` is in `range`, in order,
    /// borrowed from the engine (checksums verified first): a restore allocates no chunk.
    fn load_chunks(&mut self, file: FileKey<'_>, range: Range<u64>, each: ChunkSink) -> Result<()>;
}

/// What [`ReadTxn::load_chunks`] hands each `(seq, bytes)` to.
pub type ChunkSink<'a> = &'a mut dyn FnMut(u64, &[u8]) -> Result<()>;

/// A write view of one write transaction: every write of an operation commits together.
pub trait WriteTxn: ReadTxn {
    /// Inserts or replaces the session record.
    fn put(&mut self, record: &SessionRecord) -> Result<()>;
    /// Writes rows `first_seq..` of the session (never over an existing row).
    fn put_rows(&mut self, session_id: &str, first_seq: u64, bodies: &[Value]) -> Result<()>;
    /// Records that `thread_id` belongs to `session_id`. PostgreSQL, whose writers of different
    /// sessions run at once, refuses a thread another session claimed since the caller looked
    /// ([`StoreError::ThreadTaken`], the whole write rolled back).
    fn put_thread_owner(&mut self, thread_id: &str, session_id: &str) -> Result<()>;
    /// Writes chunk `seq` of a mirrored file (never over an existing chunk).
    fn put_chunk(&mut self, file: FileKey<'_>, seq: u64, bytes: &[u8]) -> Result<()>;
    /// Removes the chunks of a mirrored file from `from` on (0: every chunk).
    fn remove_chunks(&mut self, file: FileKey<'_>, from: u64) -> Result<()>;
    /// Removes the session record, its rows and mirror chunks, and its threads' ownership;
    /// `true` if the record existed. What it removed may stay in the files until a reclaim
    /// ([`WriteTxn::reclaim`]) or the backend's own upkeep.
    fn remove(&mut self, session_id: &str) -> Result<bool>;
    /// Asks that what was removed so far (by this transaction or before) be scrubbed from
    /// the files and its space given back once this transaction commits: redb compacts its
    /// file whole; SQLite takes one bounded step of its upkeep (as after every removal);
    /// PostgreSQL and memory have nothing to do. Returns how much space is still to give
    /// back before this commit's step (SQLite's free pages; 0: nothing left, or nothing a
    /// further step would give back): a caller that wants it all asks again while it falls.
    fn reclaim(&mut self) -> Result<u64> {
        Ok(0)
    }
    /// Records that the store is sealed with the key whose check is `check`.
    fn put_seal_check(&mut self, check: u64) -> Result<()>;
    /// The leases as this transaction sees them: a table of the store, or the process's own.
    fn leases(&mut self) -> &mut dyn LeaseTxn;
}

/// A lease request: runs on the leases at store time `now`.
pub(crate) trait LeaseOp<T>:
    FnMut(&mut dyn LeaseTxn, i64) -> Result<T> + Send + 'static
{
}
impl<T, F: FnMut(&mut dyn LeaseTxn, i64) -> Result<T> + Send + 'static> LeaseOp<T> for F {}

/// A TTL in whole milliseconds (at least 1).
pub(crate) fn ttl_ms(ttl: std::time::Duration) -> i64 {
    (ttl.as_millis().min(i64::MAX as u128) as i64).max(1)
}

pub(crate) fn check_id(what: &str, id: &str) -> Result<()> {
    if id.is_empty() {
        return Err(StoreError::InvalidInput(format!(
            "{what} must not be empty"
        )));
    }
    Ok(())
}

/// RFC 7396 merge-patch.
pub(crate) fn merge_patch(target: &mut Map<String, Value>, patch: &Map<String, Value>) {
    for (key, value) in patch {
        match value {
            Value::Null => {
                target.remove(key);
            }
            Value::Object(inner) => {
                let slot = target.entry(key.clone()).or_insert(Value::Null);
                if !slot.is_object() {
                    *slot = Value::Object(Map::new());
                }
                if let Value::Object(slot) = slot {
                    merge_patch(slot, inner);
                }
            }
            other => {
                target.insert(key.clone(), other.clone());
            }
        }
    }
}

/// Checks that a record is internally consistent: `model_config[CODEX_THREAD_ID_KEY]` is the
/// bound thread (and absent unless bound), a bound thread is not retired, a given-up one is.
/// Used on import and by backends that decode records.
pub(crate) fn check_record(record: &SessionRecord) -> Result<(), String> {
    let view = record.model_config.get(CODEX_THREAD_ID_KEY);
    match (&record.state, view) {
        (BindingState::Bound(b), Some(Value::String(t)))
            if *t == b.thread_id && record.is_retired(t) =>
        {
            return Err(format!("bound thread {t} is retired"))
        }
        (BindingState::Bound(b), Some(Value::String(t))) if *t == b.thread_id => {}
        (BindingState::Bound(_), _) | (_, Some(_)) => {
            return Err(format!(
                "state {:?} disagrees with model_config.{CODEX_THREAD_ID_KEY} = {view:?}",
                record.state
            ))
        }
        (BindingState::GivenUp(g), None) if !record.is_retired(&g.thread_id) => {
            return Err(format!("given-up thread {} is not retired", g.thread_id))
        }
        _ => {}
    }
    Ok(())
}

/// Rows read from `start` on must be numbered `start, start + 1, ...`, `want` of them: rows
/// are append-only and never deleted one by one, so a gap, a repeated `seq` or a short read
/// can only be damage.
pub(crate) fn check_rows(
    label: &str,
    session_id: &str,
    start: u64,
    want: u64,
    rows: &[TranscriptRow],
) -> Result<()> {
    for (i, row) in rows.iter().enumerate() {
        let expected = start.saturating_add(i as u64);
        if row.seq != expected {
            let detail = format!(
                "row {expected} of session {session_id} reads as seq {}",
                row.seq
            );
            return Err(StoreError::corrupt(label, detail));
        }
    }
    if rows.len() as u64 != want {
        return Err(StoreError::corrupt(
            label,
            format!(
                "session {session_id}: rows {start}..{} expected, {} found (row {} is missing)",
                start.saturating_add(want),
                rows.len(),
                start.saturating_add(rows.len() as u64)
            ),
        ));
    }
    Ok(())
}

/// Loads a session record. One absent while rows of its session exist was lost or had its
/// key changed (rows are only written and deleted with their record): `Corrupt`, never "no
/// session".
pub(crate) fn load_session(
    txn: &mut dyn ReadTxn,
    session_id: &str,
) -> Result<Option<SessionRecord>> {
    match txn.load(session_id)? {
        Some(record) => Ok(Some(record)),
        None if txn.has_rows(session_id)? => Err(StoreError::corrupt(
            txn.label(),
            format!(
                "session {session_id} has transcript rows but no session record \
                 (the record was lost or its key changed)"
            ),
        )),
        None => Ok(None),
    }
}

/// Refuses a store whose first or last stored row belongs to no session: checked when a
/// listing starts, so that a store whose session records were lost is never listed as empty,
/// without a scan of the store.
pub(crate) fn check_row_ends(txn: &mut dyn ReadTxn) -> Result<()> {
    for (session_id, has_record) in txn.row_ends()? {
        if !has_record {
            return Err(StoreError::corrupt(
                txn.label(),
                format!(
                    "rows of session {session_id} are stored but its session record is not \
                     (session records were lost or a key changed)"
                ),
            ));
        }
    }
    Ok(())
}
