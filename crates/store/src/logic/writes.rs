//! The writes, each with its typed output. A write runs inside one write transaction and
//! decides every refusal before its first write.

use serde_json::{Map, Value};

use super::{
    check_id, check_record, load_session, merge_patch, not_loaded, LeaseOp, Needs, WriteTxn,
};
use crate::{
    Binding, CommitOutcome, Fence, ImportOutcome, PendingNotice, SessionExport, SessionRecord,
    StoreError, TurnCommit, CODEX_THREAD_ID_KEY, PENDING_NOTICE_KEY,
};

/// One write: the session it locks, what it reads, and its rules.
pub(crate) trait WriteOp: Send + std::fmt::Debug + 'static {
    /// What the write returns.
    type Output: Send + std::fmt::Debug + 'static;
    /// The session it writes (PostgreSQL serialises writers per session).
    fn session_id(&self) -> &str;
    /// What it reads (for backends that fetch before running the rules).
    fn needs(&self) -> Needs<'_>;
    /// Runs the write in `txn` at store time `now`.
    fn apply(&self, txn: &mut dyn WriteTxn, now: i64) -> Result<Self::Output, StoreError>;
}

/// The record of the session, and its lease when the write is fenced.
fn session_needs<'a>(session_id: &'a str, fence: Option<&Fence>) -> Needs<'a> {
    Needs {
        session: Some(session_id),
        lease: fence.is_some(),
        ..Needs::default()
    }
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
    let leases = txn
        .leases()
        .ok_or_else(|| not_loaded("the session's lease"))?;
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
    // A published binding is the new thread the fallback notice announced.
    record.model_config.remove(PENDING_NOTICE_KEY);
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

/// [`BindingStore::commit_turn`](crate::BindingStore::commit_turn).
#[derive(Debug)]
pub(crate) struct Commit(pub(crate) TurnCommit);

impl WriteOp for Commit {
    type Output = CommitOutcome;

    fn session_id(&self) -> &str {
        &self.0.session_id
    }

    fn needs(&self) -> Needs<'_> {
        session_needs(&self.0.session_id, self.0.fence.as_ref())
    }

    fn apply(&self, txn: &mut dyn WriteTxn, now: i64) -> Result<CommitOutcome, StoreError> {
        let commit = &self.0;
        check_id("session id", &commit.session_id)?;
        check_id("thread id", &commit.thread_id)?;
        check_fence(txn, &commit.session_id, commit.fence.as_ref(), now)?;
        let mut record = load_session(txn, &commit.session_id)?
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
        Ok(outcome)
    }
}

/// [`BindingStore::patch_config`](crate::BindingStore::patch_config).
#[derive(Debug)]
pub(crate) struct Patch {
    pub(crate) session_id: String,
    pub(crate) patch: Map<String, Value>,
    pub(crate) fence: Option<Fence>,
}

impl WriteOp for Patch {
    type Output = Map<String, Value>;

    fn session_id(&self) -> &str {
        &self.session_id
    }

    fn needs(&self) -> Needs<'_> {
        session_needs(&self.session_id, self.fence.as_ref())
    }

    fn apply(&self, txn: &mut dyn WriteTxn, now: i64) -> Result<Self::Output, StoreError> {
        let session_id = &self.session_id;
        check_id("session id", session_id)?;
        check_fence(txn, session_id, self.fence.as_ref(), now)?;
        let mut record =
            load_session(txn, session_id)?.unwrap_or_else(|| SessionRecord::new(session_id, now));
        if self.patch.contains_key(PENDING_NOTICE_KEY) {
            return Err(StoreError::InvalidInput(format!(
                "{PENDING_NOTICE_KEY} is reserved: the store sets it on retire_thread and \
                 clears it on the next published commit"
            )));
        }
        let mut config = record.model_config.clone();
        merge_patch(&mut config, &self.patch);
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
        Ok(record.model_config)
    }
}

/// [`BindingStore::drop_binding_if`](crate::BindingStore::drop_binding_if).
#[derive(Debug)]
pub(crate) struct DropIf {
    pub(crate) session_id: String,
    pub(crate) thread_id: String,
    pub(crate) fence: Option<Fence>,
}

impl WriteOp for DropIf {
    type Output = bool;

    fn session_id(&self) -> &str {
        &self.session_id
    }

    fn needs(&self) -> Needs<'_> {
        session_needs(&self.session_id, self.fence.as_ref())
    }

    fn apply(&self, txn: &mut dyn WriteTxn, now: i64) -> Result<bool, StoreError> {
        check_fence(txn, &self.session_id, self.fence.as_ref(), now)?;
        let Some(mut record) = load_session(txn, &self.session_id)? else {
            return Ok(false);
        };
        if record.thread_id() != Some(self.thread_id.as_str()) {
            return Ok(false);
        }
        unbind(&mut record);
        record.updated_at_ms = now;
        txn.put(&record)?;
        Ok(true)
    }
}

/// [`BindingStore::retire_thread`](crate::BindingStore::retire_thread).
#[derive(Debug)]
pub(crate) struct Retire {
    pub(crate) session_id: String,
    pub(crate) thread_id: String,
    pub(crate) fence: Option<Fence>,
    /// A give-up (`retire_thread`) leaves a fallback notice pending; a host's own decision to
    /// end the thread (`end_thread`) does not.
    pub(crate) notify: bool,
}

impl Retire {
    /// The retire of `thread_id` for `session_id`; `notify` as [`Retire::notify`].
    pub(crate) fn new(
        session_id: &str,
        thread_id: &str,
        fence: Option<&Fence>,
        notify: bool,
    ) -> Self {
        Retire {
            session_id: session_id.to_string(),
            thread_id: thread_id.to_string(),
            fence: fence.cloned(),
            notify,
        }
    }
}

impl WriteOp for Retire {
    type Output = ();

    fn session_id(&self) -> &str {
        &self.session_id
    }

    fn needs(&self) -> Needs<'_> {
        session_needs(&self.session_id, self.fence.as_ref())
    }

    fn apply(&self, txn: &mut dyn WriteTxn, now: i64) -> Result<(), StoreError> {
        let (session_id, thread_id) = (&self.session_id, &self.thread_id);
        check_id("session id", session_id)?;
        check_id("thread id", thread_id)?;
        check_fence(txn, session_id, self.fence.as_ref(), now)?;
        let existing = load_session(txn, session_id)?;
        let mut record = existing
            .clone()
            .unwrap_or_else(|| SessionRecord::new(session_id, now));
        if !record.is_retired(thread_id) {
            record.retired_threads.push(thread_id.clone());
        }
        if record.thread_id() == Some(thread_id.as_str()) {
            unbind(&mut record);
        }
        // The give-up: a fallback notice is pending until a new binding is published, unless
        // the session is already bound to another thread (it moved on meanwhile).
        if self.notify && record.binding.is_none() {
            let notice = PendingNotice {
                thread_id: thread_id.clone(),
            };
            record
                .model_config
                .insert(PENDING_NOTICE_KEY.to_string(), notice.to_value());
        }
        if existing.as_ref() != Some(&record) {
            record.updated_at_ms = now;
            txn.put(&record)?;
        }
        Ok(())
    }
}

/// [`BindingStore::delete_session`](crate::BindingStore::delete_session).
#[derive(Debug)]
pub(crate) struct Delete(pub(crate) String);

impl WriteOp for Delete {
    type Output = bool;

    fn session_id(&self) -> &str {
        &self.0
    }

    fn needs(&self) -> Needs<'_> {
        session_needs(&self.0, None)
    }

    fn apply(&self, txn: &mut dyn WriteTxn, _now: i64) -> Result<bool, StoreError> {
        txn.remove(&self.0)
    }
}

/// [`BindingStore::import_session`](crate::BindingStore::import_session).
#[derive(Debug)]
pub(crate) struct Import(pub(crate) SessionExport);

impl WriteOp for Import {
    type Output = ImportOutcome;

    fn session_id(&self) -> &str {
        &self.0.record.session_id
    }

    fn needs(&self) -> Needs<'_> {
        Needs {
            session: Some(&self.0.record.session_id),
            // An existing session is compared whole.
            rows: Some(0..u64::MAX),
            ..Needs::default()
        }
    }

    fn apply(&self, txn: &mut dyn WriteTxn, _now: i64) -> Result<ImportOutcome, StoreError> {
        let export = &self.0;
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
        if let Some(existing) = load_session(txn, &record.session_id)? {
            let same = existing == *record
                && txn.load_rows(&record.session_id, 0..existing.row_count)? == export.rows;
            return if same {
                Ok(ImportOutcome::AlreadyPresent)
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
        Ok(ImportOutcome::Imported)
    }
}

/// A lease request run as a write of a backend that keeps its leases in the store.
#[derive(Debug)]
pub(crate) struct InStore<L>(pub(crate) L);

impl<L: LeaseOp> WriteOp for InStore<L> {
    type Output = L::Output;

    fn session_id(&self) -> &str {
        self.0.session_id()
    }

    fn needs(&self) -> Needs<'_> {
        Needs {
            lease: true,
            ..Needs::default()
        }
    }

    fn apply(&self, txn: &mut dyn WriteTxn, now: i64) -> Result<L::Output, StoreError> {
        let leases = txn
            .leases()
            .ok_or_else(|| not_loaded("the leases of a store that keeps them in the process"))?;
        self.0.apply(leases, now)
    }
}
