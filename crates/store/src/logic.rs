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
    Binding, CommitOutcome, Fence, ImportOutcome, Lease, LeaseOwner, SessionExport, SessionRecord,
    StoreError, TranscriptRow, TurnCommit, CODEX_THREAD_ID_KEY,
};

/// One write request, as queued for the writer.
#[derive(Debug)]
pub(crate) enum WriteOp {
    Commit(TurnCommit),
    Patch {
        session_id: String,
        patch: Map<String, Value>,
        fence: Option<Fence>,
    },
    DropIf {
        session_id: String,
        thread_id: String,
        fence: Option<Fence>,
    },
    Retire {
        session_id: String,
        thread_id: String,
        fence: Option<Fence>,
    },
    Delete {
        session_id: String,
    },
    Import(SessionExport),
    Lease(LeaseOp),
}

impl WriteOp {
    /// The lease grant the write must still hold, if it is fenced.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn fence(&self) -> Option<&Fence> {
        match self {
            WriteOp::Commit(commit) => commit.fence.as_ref(),
            WriteOp::Patch { fence, .. }
            | WriteOp::DropIf { fence, .. }
            | WriteOp::Retire { fence, .. } => fence.as_ref(),
            WriteOp::Delete { .. } | WriteOp::Import(_) | WriteOp::Lease(_) => None,
        }
    }
}

/// The answer to a [`WriteOp`].
#[derive(Debug)]
pub(crate) enum Reply {
    Commit(CommitOutcome),
    Config(Map<String, Value>),
    Bool(bool),
    Unit,
    Import(ImportOutcome),
    Lease(LeaseReply),
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
    /// The leases in this transaction, for backends that keep them in the store (several
    /// processes); `None` for those that keep them in the process.
    fn leases(&mut self) -> Option<&mut dyn LeaseTxn> {
        None
    }
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

/// Refuses a fenced write unless its grant is still the session's live lease. Called before
/// the operation's first write, inside the same transaction, so a refused write writes
/// nothing. An unfenced write (`None`) is not checked.
fn check_fence(
    txn: &mut dyn WriteTxn,
    session_id: &str,
    fence: Option<&Fence>,
    now: i64,
) -> Result<(), StoreError> {
    let Some(fence) = fence else {
        return Ok(());
    };
    let leases = txn.leases().ok_or_else(|| {
        StoreError::InvalidInput(
            "internal error: this backend gives writes no view of its leases".to_string(),
        )
    })?;
    match leases.load_lease(session_id)? {
        Some(held)
            if held.owner == fence.owner
                && held.fence == fence.token
                && held.expires_at_ms > now =>
        {
            Ok(())
        }
        _ => Err(StoreError::LeaseLost {
            session_id: session_id.to_string(),
        }),
    }
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
            check_fence(txn, &commit.session_id, commit.fence.as_ref(), now)?;
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
        WriteOp::Patch {
            session_id,
            patch,
            fence,
        } => {
            check_id("session id", session_id)?;
            check_fence(txn, session_id, fence.as_ref(), now)?;
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
            fence,
        } => {
            check_fence(txn, session_id, fence.as_ref(), now)?;
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
            fence,
        } => {
            check_id("session id", session_id)?;
            check_id("thread id", thread_id)?;
            check_fence(txn, session_id, fence.as_ref(), now)?;
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
        WriteOp::Lease(op) => {
            let leases = txn.leases().ok_or_else(|| {
                StoreError::InvalidInput(
                    "internal error: this backend keeps leases in the process".to_string(),
                )
            })?;
            Ok(Reply::Lease(apply_lease(leases, op, now)?))
        }
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

/// Rows read from `start` on must be numbered `start, start + 1, ...`: rows are append-only
/// and never deleted one by one, so a gap or a repeated `seq` can only be damage (a flipped
/// byte in an SQLite key made two rows 0; found by the `store_files` fuzz target).
pub(crate) fn check_row_seqs(
    session_id: &str,
    start: u64,
    rows: &[TranscriptRow],
) -> Result<(), StoreError> {
    for (i, row) in rows.iter().enumerate() {
        let want = start.saturating_add(i as u64);
        if row.seq != want {
            return Err(StoreError::corrupt(
                session_id,
                format!(
                    "row {want} of session {session_id} reads as seq {}",
                    row.seq
                ),
            ));
        }
    }
    Ok(())
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
    check_row_seqs(session_id, 0, &rows)?;
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

/// A lease request. Decided by [`apply_lease`], the one place lease rules live.
#[derive(Debug, Clone)]
pub(crate) enum LeaseOp {
    Acquire {
        session_id: String,
        owner: LeaseOwner,
        ttl_ms: i64,
    },
    Renew {
        lease: Lease,
        ttl_ms: i64,
    },
    Release {
        lease: Lease,
    },
}

impl LeaseOp {
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn session_id(&self) -> &str {
        match self {
            LeaseOp::Acquire { session_id, .. } => session_id,
            LeaseOp::Renew { lease, .. } | LeaseOp::Release { lease } => &lease.session_id,
        }
    }
}

/// The leases of one transaction (a table in SQLite and PostgreSQL, a map in memory and redb).
///
/// A released or expired lease stays stored (free) so that its `fence` keeps growing.
pub(crate) trait LeaseTxn {
    /// The session's lease row, free or held.
    fn load_lease(&mut self, session_id: &str) -> Result<Option<Lease>, StoreError>;
    /// Inserts or replaces the session's lease row.
    fn put_lease(&mut self, lease: &Lease) -> Result<(), StoreError>;
}

/// Converts a TTL to whole milliseconds (at least 1).
pub(crate) fn ttl_ms(ttl: std::time::Duration) -> i64 {
    (ttl.as_millis().min(i64::MAX as u128) as i64).max(1)
}

/// Applies one lease request at store time `now`.
///
/// - Acquire: granted when the session has no lease, its lease expired or was released, the
///   same owner holds it, or its holder is provably gone ([`LeaseOwner::is_known_gone`]);
///   otherwise [`StoreError::Busy`] naming the holder. Every grant increments `fence`.
/// - Renew: only the owner of a live lease with the same `fence` extends it to `now + ttl`;
///   anything else is [`StoreError::LeaseLost`] (an expired lease is lost even if nobody took
///   it: the holder failed to renew in time and must not assume exclusivity).
/// - Release: frees a live lease of the same owner and `fence` (`true`); otherwise nothing
///   happens (`false`): another owner's lease is never freed.
pub(crate) fn apply_lease(
    txn: &mut dyn LeaseTxn,
    op: &LeaseOp,
    now: i64,
) -> Result<LeaseReply, StoreError> {
    match op {
        LeaseOp::Acquire {
            session_id,
            owner,
            ttl_ms,
        } => {
            check_id("session id", session_id)?;
            let existing = txn.load_lease(session_id)?;
            if let Some(held) = &existing {
                // A live lease of another holder refuses, unless the OS proves that holder
                // gone (same machine and pid namespace, its process exited): a crashed host
                // restarted at once must not wait out the TTL.
                if held.expires_at_ms > now && held.owner != *owner && !held.owner.is_known_gone() {
                    return Err(StoreError::Busy {
                        session_id: session_id.clone(),
                        holder: held.owner.clone(),
                        acquired_at_ms: held.acquired_at_ms,
                        expires_at_ms: held.expires_at_ms,
                    });
                }
            }
            // Every grant gets a new fence, a re-acquire by the same owner included: a late
            // renewal or release of an earlier grant then never touches this one.
            let lease = Lease {
                session_id: session_id.clone(),
                owner: owner.clone(),
                acquired_at_ms: now,
                expires_at_ms: now.saturating_add(*ttl_ms),
                fence: existing.map_or(0, |l| l.fence) + 1,
            };
            txn.put_lease(&lease)?;
            Ok(LeaseReply::Lease(lease))
        }
        LeaseOp::Renew { lease, ttl_ms } => match txn.load_lease(&lease.session_id)? {
            Some(held) if is_same_grant(&held, lease) && held.expires_at_ms > now => {
                let renewed = Lease {
                    expires_at_ms: now.saturating_add(*ttl_ms),
                    ..held
                };
                txn.put_lease(&renewed)?;
                Ok(LeaseReply::Lease(renewed))
            }
            _ => Err(StoreError::LeaseLost {
                session_id: lease.session_id.clone(),
            }),
        },
        LeaseOp::Release { lease } => match txn.load_lease(&lease.session_id)? {
            Some(held) if is_same_grant(&held, lease) && held.expires_at_ms > now => {
                txn.put_lease(&Lease {
                    expires_at_ms: now,
                    ..held
                })?;
                Ok(LeaseReply::Released(true))
            }
            _ => Ok(LeaseReply::Released(false)),
        },
    }
}

fn is_same_grant(held: &Lease, lease: &Lease) -> bool {
    held.owner == lease.owner && held.fence == lease.fence
}

/// The answer to a [`LeaseOp`].
#[derive(Debug)]
pub(crate) enum LeaseReply {
    Lease(Lease),
    Released(bool),
}

/// Leases kept in this process only: for the single-process backends (memory, redb).
#[derive(Debug, Default)]
pub(crate) struct LocalLeases {
    leases: std::sync::Mutex<std::collections::HashMap<String, Lease>>,
}

impl LocalLeases {
    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Lease>> {
        self.leases.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn apply(&self, op: &LeaseOp) -> Result<LeaseReply, StoreError> {
        apply_lease(&mut *self.map(), op, now_ms())
    }
}

/// The view a write transaction of a single-process durable backend (redb) has of the
/// process's leases, for fence checks: each call locks the map for that call only. A check
/// and the write it guards are still one step, because every write of the store goes through
/// its one writer thread, in order.
impl LeaseTxn for std::sync::Arc<LocalLeases> {
    fn load_lease(&mut self, session_id: &str) -> Result<Option<Lease>, StoreError> {
        Ok(self.map().get(session_id).cloned())
    }
    fn put_lease(&mut self, lease: &Lease) -> Result<(), StoreError> {
        self.map().insert(lease.session_id.clone(), lease.clone());
        Ok(())
    }
}

impl LeaseTxn for std::collections::HashMap<String, Lease> {
    fn load_lease(&mut self, session_id: &str) -> Result<Option<Lease>, StoreError> {
        Ok(self.get(session_id).cloned())
    }
    fn put_lease(&mut self, lease: &Lease) -> Result<(), StoreError> {
        self.insert(lease.session_id.clone(), lease.clone());
        Ok(())
    }
}

/// Unwraps a lease reply into a granted lease.
pub(crate) fn lease_of(reply: LeaseReply) -> Result<Lease, StoreError> {
    match reply {
        LeaseReply::Lease(lease) => Ok(lease),
        other => Err(StoreError::InvalidInput(format!(
            "internal error: unexpected lease reply {other:?}"
        ))),
    }
}

/// Unwraps a lease reply into a release verdict.
pub(crate) fn released_of(reply: LeaseReply) -> Result<bool, StoreError> {
    match reply {
        LeaseReply::Released(done) => Ok(done),
        other => Err(StoreError::InvalidInput(format!(
            "internal error: unexpected lease reply {other:?}"
        ))),
    }
}
