//! The in-memory backend, for tests and as the reference for the others.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use serde_json::{Map, Value};

use crate::logic::{
    self, apply, apply_lease, expect_reply, lease_of, now_ms, released_of, ttl_ms, LeaseOp,
    LeaseReply, LeaseTxn, ReadTxn, Reply, WriteOp, WriteTxn,
};
use crate::{
    BindingStore, CommitOutcome, Fence, ImportOutcome, Lease, LeaseOwner, SessionExport,
    SessionPage, SessionRecord, StoreError, TranscriptRow, TurnCommit,
};

#[derive(Debug, Default)]
pub(crate) struct State {
    records: BTreeMap<String, SessionRecord>,
    rows: HashMap<String, Vec<Value>>,
    /// Under the same lock as the records, so a fenced write checks its lease and writes in
    /// one step.
    leases: HashMap<String, Lease>,
}

/// A [`BindingStore`] that keeps everything in memory. Nothing survives the process.
///
/// Writes run the same logic as the durable backends, under one mutex held only for the
/// duration of the in-memory update (never across an `.await`).
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied write: every operation
        // decides before it writes, and in-memory writes cannot fail.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self, op: WriteOp) -> Result<Reply, StoreError> {
        let mut state = self.lock();
        apply(&mut *state, &op, now_ms())
    }

    fn lease(&self, op: LeaseOp) -> Result<LeaseReply, StoreError> {
        apply_lease(&mut self.lock().leases, &op, now_ms())
    }
}

impl ReadTxn for State {
    fn load(&mut self, session_id: &str) -> Result<Option<SessionRecord>, StoreError> {
        Ok(self.records.get(session_id).cloned())
    }

    fn load_rows(
        &mut self,
        session_id: &str,
        range: Range<u64>,
    ) -> Result<Vec<TranscriptRow>, StoreError> {
        let Some(rows) = self.rows.get(session_id) else {
            return Ok(Vec::new());
        };
        let end = range.end.min(rows.len() as u64);
        Ok((range.start..end)
            .map(|seq| TranscriptRow {
                seq,
                body: rows[seq as usize].clone(),
            })
            .collect())
    }

    fn list(
        &mut self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        use std::ops::Bound;
        let lower = match after {
            Some(a) => Bound::Excluded(a.to_string()),
            None => Bound::Unbounded,
        };
        Ok(self
            .records
            .range::<String, _>((lower, Bound::Unbounded))
            .take(limit)
            .map(|(_, r)| r.clone())
            .collect())
    }
}

impl WriteTxn for State {
    fn put(&mut self, record: &SessionRecord) -> Result<(), StoreError> {
        self.records
            .insert(record.session_id.clone(), record.clone());
        Ok(())
    }

    fn put_row(&mut self, session_id: &str, seq: u64, body: &Value) -> Result<(), StoreError> {
        let rows = self.rows.entry(session_id.to_string()).or_default();
        let seq = seq as usize;
        if rows.len() <= seq {
            rows.resize(seq + 1, Value::Null);
        }
        rows[seq] = body.clone();
        Ok(())
    }

    fn remove(&mut self, session_id: &str) -> Result<bool, StoreError> {
        self.rows.remove(session_id);
        Ok(self.records.remove(session_id).is_some())
    }

    fn leases(&mut self) -> Option<&mut dyn LeaseTxn> {
        Some(&mut self.leases)
    }
}

#[async_trait]
impl BindingStore for MemoryStore {
    async fn session(&self, session_id: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.lock().load(session_id)
    }

    async fn rows(
        &self,
        session_id: &str,
        range: Range<u64>,
    ) -> Result<Vec<TranscriptRow>, StoreError> {
        self.lock().load_rows(session_id, range)
    }

    async fn commit_turn(&self, commit: TurnCommit) -> Result<CommitOutcome, StoreError> {
        expect_reply!(self.write(WriteOp::Commit(commit))?, Commit)
    }

    async fn patch_config(
        &self,
        session_id: &str,
        patch: Map<String, Value>,
        fence: Option<&Fence>,
    ) -> Result<Map<String, Value>, StoreError> {
        let op = WriteOp::Patch {
            session_id: session_id.to_string(),
            patch,
            fence: fence.cloned(),
        };
        expect_reply!(self.write(op)?, Config)
    }

    async fn drop_binding_if(
        &self,
        session_id: &str,
        thread_id: &str,
        fence: Option<&Fence>,
    ) -> Result<bool, StoreError> {
        let op = WriteOp::DropIf {
            session_id: session_id.to_string(),
            thread_id: thread_id.to_string(),
            fence: fence.cloned(),
        };
        expect_reply!(self.write(op)?, Bool)
    }

    async fn retire_thread(
        &self,
        session_id: &str,
        thread_id: &str,
        fence: Option<&Fence>,
    ) -> Result<(), StoreError> {
        let op = WriteOp::Retire {
            session_id: session_id.to_string(),
            thread_id: thread_id.to_string(),
            fence: fence.cloned(),
        };
        self.write(op).map(|_| ())
    }

    async fn list_sessions(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<SessionPage, StoreError> {
        logic::list(&mut *self.lock(), after, limit)
    }

    async fn delete_session(&self, session_id: &str) -> Result<bool, StoreError> {
        expect_reply!(
            self.write(WriteOp::Delete {
                session_id: session_id.to_string()
            })?,
            Bool
        )
    }

    async fn export_session(&self, session_id: &str) -> Result<Option<SessionExport>, StoreError> {
        logic::export(&mut *self.lock(), session_id)
    }

    async fn import_session(&self, export: SessionExport) -> Result<ImportOutcome, StoreError> {
        expect_reply!(self.write(WriteOp::Import(export))?, Import)
    }

    async fn acquire_lease(
        &self,
        session_id: &str,
        owner: &LeaseOwner,
        ttl: std::time::Duration,
    ) -> Result<Lease, StoreError> {
        lease_of(self.lease(LeaseOp::Acquire {
            session_id: session_id.to_string(),
            owner: owner.clone(),
            ttl_ms: ttl_ms(ttl),
        })?)
    }

    async fn renew_lease(
        &self,
        lease: &Lease,
        ttl: std::time::Duration,
    ) -> Result<Lease, StoreError> {
        lease_of(self.lease(LeaseOp::Renew {
            lease: lease.clone(),
            ttl_ms: ttl_ms(ttl),
        })?)
    }

    async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError> {
        released_of(self.lease(LeaseOp::Release {
            lease: lease.clone(),
        })?)
    }
}
