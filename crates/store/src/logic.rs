//! The semantics of every write, written once and run by every backend inside its own
//! transaction.
//!
//! Backends only provide a small key-value view ([`ReadTxn`], [`WriteTxn`]) of one transaction;
//! [`apply`] decides what to write. Every logical refusal (`InvalidInput`, `Conflict`,
//! `RetiredThread`) is decided **before** the first write of an operation, so a refused
//! operation leaves the transaction untouched and the other operations of the same group
//! commit can still commit.

use std::ops::Range;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

use crate::{
    Binding, CommitOutcome, ImportOutcome, SessionExport, SessionRecord, StoreError, TranscriptRow,
    TurnCommit, CODEX_THREAD_ID_KEY,
};

/// One write request, as queued for the writer.
#[derive(Debug)]
pub(crate) enum WriteOp {
    Commit(TurnCommit),
    Patch {
        session_id: String,
        patch: Map<String, Value>,
    },
    DropIf {
        session_id: String,
        thread_id: String,
    },
    Retire {
        session_id: String,
        thread_id: String,
    },
    Delete {
        session_id: String,
    },
    Import(SessionExport),
}

/// The answer to a [`WriteOp`].
#[derive(Debug)]
pub(crate) enum Reply {
    Commit(CommitOutcome),
    Config(Map<String, Value>),
    Bool(bool),
    Unit,
    Import(ImportOutcome),
}

/// A read view of one transaction (or snapshot).
pub(crate) trait ReadTxn {
    /// The session record, if present.
    fn load(&mut self, session_id: &str) -> Result<Option<SessionRecord>, StoreError>;
    /// Rows with `seq` in `range`, in order.
    fn load_rows(
        &mut self,
        session_id: &str,
        range: Range<u64>,
    ) -> Result<Vec<TranscriptRow>, StoreError>;
    /// Up to `limit` records with a session id greater than `after`, in order.
    fn list(&mut self, after: Option<&str>, limit: usize)
        -> Result<Vec<SessionRecord>, StoreError>;
}

/// A write transaction.
pub(crate) trait WriteTxn: ReadTxn {
    /// Inserts or replaces the session record.
    fn put(&mut self, record: &SessionRecord) -> Result<(), StoreError>;
    /// Writes row `seq` of the session.
    fn put_row(&mut self, session_id: &str, seq: u64, body: &Value) -> Result<(), StoreError>;
    /// Removes the session record and all its rows; `true` if the record existed.
    fn remove(&mut self, session_id: &str) -> Result<bool, StoreError>;
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub(crate) fn check_id(what: &str, id: &str) -> Result<(), StoreError> {
    if id.is_empty() {
        return Err(StoreError::InvalidInput(format!(
            "{what} must not be empty"
        )));
    }
    Ok(())
}

/// RFC 7396 merge-patch of `patch` into `target`.
pub(crate) fn merge_patch(target: &mut Map<String, Value>, patch: &Map<String, Value>) {
    for (key, value) in patch {
        match value {
            Value::Null => {
                target.remove(key);
            }
            Value::Object(inner) => {
                let slot = target
                    .entry(key.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
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

/// Checks that a record is internally consistent: the binding agrees with `model_config`, and
/// a bound thread is not retired. Used on import and by backends that decode records.
pub(crate) fn check_record(record: &SessionRecord) -> Result<(), String> {
    let in_config = record.model_config.get(CODEX_THREAD_ID_KEY);
    match (&record.binding, in_config) {
        (None, None) => {}
        (Some(b), Some(Value::String(t))) if *t == b.thread_id => {
            if record.is_retired(t) {
                return Err(format!("bound thread {t} is retired"));
            }
        }
        (b, c) => {
            return Err(format!(
                "binding {:?} disagrees with model_config.{CODEX_THREAD_ID_KEY} = {:?}",
                b.as_ref().map(|b| &b.thread_id),
                c
            ))
        }
    }
    Ok(())
}

fn publish(record: &mut SessionRecord, thread_id: &str, codex_home: Option<String>, now: i64) {
    let bound_at_ms = match &record.binding {
        Some(b) if b.thread_id == thread_id => b.bound_at_ms,
        _ => now,
    };
    record.model_config.insert(
        CODEX_THREAD_ID_KEY.to_string(),
        Value::String(thread_id.to_string()),
    );
    record.binding = Some(Binding {
        thread_id: thread_id.to_string(),
        codex_home,
        bound_at_ms,
    });
}

fn unbind(record: &mut SessionRecord) {
    record.model_config.remove(CODEX_THREAD_ID_KEY);
    record.binding = None;
}

/// Applies one write inside `txn`. Logical refusals happen before any write.
pub(crate) fn apply(txn: &mut dyn WriteTxn, op: &WriteOp, now: i64) -> Result<Reply, StoreError> {
    match op {
        WriteOp::Commit(commit) => {
            check_id("session id", &commit.session_id)?;
            check_id("thread id", &commit.thread_id)?;
            let mut record = txn
                .load(&commit.session_id)?
                .unwrap_or_else(|| SessionRecord::new(&commit.session_id, now));
            let first_seq = record.row_count;
            for (i, body) in commit.rows.iter().enumerate() {
                txn.put_row(&commit.session_id, first_seq + i as u64, body)?;
            }
            record.row_count = first_seq + commit.rows.len() as u64;
            record.updated_at_ms = now;
            let row_count = record.row_count;
            let outcome = if record.is_retired(&commit.thread_id) {
                CommitOutcome::RetiredNotPublished {
                    first_seq,
                    row_count,
                }
            } else {
                publish(
                    &mut record,
                    &commit.thread_id,
                    commit.codex_home.clone(),
                    now,
                );
                CommitOutcome::Published {
                    first_seq,
                    row_count,
                }
            };
            txn.put(&record)?;
            Ok(Reply::Commit(outcome))
        }
        WriteOp::Patch { session_id, patch } => {
            check_id("session id", session_id)?;
            let mut record = txn
                .load(session_id)?
                .unwrap_or_else(|| SessionRecord::new(session_id, now));
            let mut config = record.model_config.clone();
            merge_patch(&mut config, patch);
            match config.get(CODEX_THREAD_ID_KEY) {
                None => record.binding = None,
                Some(Value::String(thread_id)) => {
                    if thread_id.is_empty() {
                        return Err(StoreError::InvalidInput(format!(
                            "{CODEX_THREAD_ID_KEY} must not be empty"
                        )));
                    }
                    if record.is_retired(thread_id) {
                        return Err(StoreError::RetiredThread {
                            session_id: session_id.clone(),
                            thread_id: thread_id.clone(),
                        });
                    }
                    if record.thread_id() != Some(thread_id.as_str()) {
                        record.binding = Some(Binding {
                            thread_id: thread_id.clone(),
                            codex_home: None,
                            bound_at_ms: now,
                        });
                    }
                }
                Some(other) => {
                    return Err(StoreError::InvalidInput(format!(
                        "{CODEX_THREAD_ID_KEY} must be a string, got {other}"
                    )))
                }
            }
            record.model_config = config;
            record.updated_at_ms = now;
            txn.put(&record)?;
            Ok(Reply::Config(record.model_config))
        }
        WriteOp::DropIf {
            session_id,
            thread_id,
        } => {
            let Some(mut record) = txn.load(session_id)? else {
                return Ok(Reply::Bool(false));
            };
            if record.thread_id() != Some(thread_id.as_str()) {
                return Ok(Reply::Bool(false));
            }
            unbind(&mut record);
            record.updated_at_ms = now;
            txn.put(&record)?;
            Ok(Reply::Bool(true))
        }
        WriteOp::Retire {
            session_id,
            thread_id,
        } => {
            check_id("session id", session_id)?;
            check_id("thread id", thread_id)?;
            let existing = txn.load(session_id)?;
            let mut record = existing
                .clone()
                .unwrap_or_else(|| SessionRecord::new(session_id, now));
            if !record.is_retired(thread_id) {
                record.retired_threads.push(thread_id.clone());
            }
            if record.thread_id() == Some(thread_id.as_str()) {
                unbind(&mut record);
            }
            if existing.as_ref() != Some(&record) {
                record.updated_at_ms = now;
                txn.put(&record)?;
            }
            Ok(Reply::Unit)
        }
        WriteOp::Delete { session_id } => Ok(Reply::Bool(txn.remove(session_id)?)),
        WriteOp::Import(export) => {
            let record = &export.record;
            check_id("session id", &record.session_id)?;
            check_record(record).map_err(StoreError::InvalidInput)?;
            if export.rows.len() as u64 != record.row_count
                || export
                    .rows
                    .iter()
                    .enumerate()
                    .any(|(i, r)| r.seq != i as u64)
            {
                return Err(StoreError::InvalidInput(format!(
                    "export of {} must carry rows 0..{} in order",
                    record.session_id, record.row_count
                )));
            }
            if let Some(existing) = txn.load(&record.session_id)? {
                let same = existing == *record
                    && txn.load_rows(&record.session_id, 0..existing.row_count)? == export.rows;
                return if same {
                    Ok(Reply::Import(ImportOutcome::AlreadyPresent))
                } else {
                    Err(StoreError::Conflict {
                        session_id: record.session_id.clone(),
                        detail: "a different session with this id already exists".to_string(),
                    })
                };
            }
            for row in &export.rows {
                txn.put_row(&record.session_id, row.seq, &row.body)?;
            }
            txn.put(record)?;
            Ok(Reply::Import(ImportOutcome::Imported))
        }
    }
}

/// Reads one whole session from a consistent snapshot.
pub(crate) fn export(
    txn: &mut dyn ReadTxn,
    session_id: &str,
) -> Result<Option<SessionExport>, StoreError> {
    let Some(record) = txn.load(session_id)? else {
        return Ok(None);
    };
    let rows = txn.load_rows(session_id, 0..record.row_count)?;
    if rows.len() as u64 != record.row_count {
        return Err(StoreError::corrupt(
            session_id,
            format!(
                "session has {} rows, its record says {}",
                rows.len(),
                record.row_count
            ),
        ));
    }
    Ok(Some(SessionExport { record, rows }))
}

/// Lists one page.
pub(crate) fn list(
    txn: &mut dyn ReadTxn,
    after: Option<&str>,
    limit: usize,
) -> Result<crate::SessionPage, StoreError> {
    if limit == 0 {
        return Err(StoreError::InvalidInput(
            "list limit must be at least 1".to_string(),
        ));
    }
    let mut sessions = txn.list(after, limit.saturating_add(1))?;
    let next_after = if sessions.len() > limit {
        sessions.truncate(limit);
        sessions.last().map(|s| s.session_id.clone())
    } else {
        None
    };
    Ok(crate::SessionPage {
        sessions,
        next_after,
    })
}

/// Unwraps a reply of the expected kind. A mismatch is a bug in this crate.
macro_rules! expect_reply {
    ($reply:expr, $variant:ident) => {
        match $reply {
            $crate::logic::Reply::$variant(v) => Ok(v),
            other => Err($crate::StoreError::InvalidInput(format!(
                "internal error: unexpected reply {other:?}"
            ))),
        }
    };
}
pub(crate) use expect_reply;
