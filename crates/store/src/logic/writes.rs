//! The writes, each with its typed output. A write runs inside one write transaction and
//! decides every refusal before its first write.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::leases::{check_grant, Grant};
use super::{
    check_id, check_record, load_session, merge_patch, mirror, FileKey, LeaseOp, WriteTxn,
};
use crate::Result;
use crate::{
    Binding, BindingState, CommitOutcome, Fallback, Fence, GivenUp, ImportOutcome, Retirement,
    SessionExport, SessionRecord, StoreError, TurnCommit, CODEX_THREAD_ID_KEY,
};

/// One write: the session it concerns, and its rules.
pub(crate) trait WriteOp: Send + std::fmt::Debug + 'static {
    /// What the write returns.
    type Output: Send + std::fmt::Debug + 'static;
    /// The session it writes (PostgreSQL serialises writers per session).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn session_id(&self) -> &str;
    /// Runs the write in `txn` at store time `now`.
    fn apply(&self, txn: &mut dyn WriteTxn, now: i64) -> Result<Self::Output>;
}

/// Refuses a fenced write unless its grant is still the session's newest (see [`Fence`]).
/// Called before the operation's first write, inside the same transaction, so a refused write
/// writes nothing. An unfenced write (`None`) is not checked.
fn check_fence(txn: &mut dyn WriteTxn, session_id: &str, fence: Option<&Fence>) -> Result<()> {
    let Some(fence) = fence else {
        return Ok(());
    };
    let grant = txn.leases().load_lease(session_id)?;
    check_grant(session_id, grant.as_ref(), &fence.owner, fence.token)
}

/// Whether `thread_id` must be recorded as the session's: refuses a thread of another session
/// ([`StoreError::ThreadTaken`]). A thread the record names is the session's already, which
/// keeps the one-session commit path free of the lookup.
fn claim_thread(txn: &mut dyn WriteTxn, record: &SessionRecord, thread_id: &str) -> Result<bool> {
    if record.named_threads().any(|t| t == thread_id) {
        return Ok(false);
    }
    match txn.thread_owner(thread_id)? {
        None => Ok(true),
        Some(owner) if owner == record.session_id => Ok(false),
        Some(owner) => Err(StoreError::ThreadTaken {
            thread_id: thread_id.to_string(),
            session_id: owner,
        }),
    }
}

/// [`BindingStore::commit_turn`](crate::BindingStore::commit_turn).
#[derive(Debug)]
pub(crate) struct Commit(pub(crate) TurnCommit);

impl WriteOp for Commit {
    type Output = CommitOutcome;

    fn session_id(&self) -> &str {
        &self.0.session_id
    }

    fn apply(&self, txn: &mut dyn WriteTxn, now: i64) -> Result<CommitOutcome> {
        let commit = &self.0;
        let (session_id, thread_id) = (&commit.session_id, &commit.thread_id);
        check_id("session id", session_id)?;
        check_id("thread id", thread_id)?;
        check_fence(txn, session_id, commit.fence.as_ref())?;
        let mut record =
            load_session(txn, session_id)?.unwrap_or_else(|| SessionRecord::new(session_id, now));
        let claim = claim_thread(txn, &record, thread_id)?;
        let retired = record.is_retired(thread_id);
        let plan = mirror::plan(&record, thread_id, commit.mirror.as_ref(), retired)?;
        let first_seq = record.row_count;
        txn.put_rows(session_id, first_seq, &commit.rows)?;
        record.row_count = first_seq + commit.rows.len() as u64;
        record.updated_at_ms = now;
        let row_count = record.row_count;
        let mirror = mirror::write(txn, &mut record, thread_id, plan)?;
        let outcome = if retired {
            CommitOutcome::RetiredNotPublished {
                first_seq,
                row_count,
                mirror,
            }
        } else {
            // The same thread keeps when it was bound and the fallback it replaced; a new one
            // remembers the give-up it replaces.
            let (bound_at_ms, fell_back_from) = match &record.state {
                BindingState::Bound(b) if b.thread_id == *thread_id => {
                    (b.bound_at_ms, b.fell_back_from.clone())
                }
                BindingState::GivenUp(given_up) => (
                    now,
                    Some(Fallback {
                        thread_id: given_up.thread_id.clone(),
                        reason: given_up.reason.clone(),
                        at_ms: given_up.at_ms,
                    }),
                ),
                _ => (now, None),
            };
            let mut binding =
                Binding::new(thread_id.clone(), commit.codex_home.clone(), bound_at_ms);
            binding.fell_back_from = fell_back_from;
            record.set_state(BindingState::Bound(binding));
            CommitOutcome::Published {
                first_seq,
                row_count,
                mirror,
            }
        };
        if claim {
            txn.put_thread_owner(thread_id, session_id)?;
        }
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

    fn apply(&self, txn: &mut dyn WriteTxn, now: i64) -> Result<Self::Output> {
        let session_id = &self.session_id;
        check_id("session id", session_id)?;
        if self.patch.contains_key(CODEX_THREAD_ID_KEY) {
            return Err(StoreError::InvalidInput(format!(
                "{CODEX_THREAD_ID_KEY} is the store's view of the binding: commit a turn or \
                 retire the thread instead"
            )));
        }
        check_fence(txn, session_id, self.fence.as_ref())?;
        let mut record =
            load_session(txn, session_id)?.unwrap_or_else(|| SessionRecord::new(session_id, now));
        merge_patch(&mut record.model_config, &self.patch);
        record.updated_at_ms = now;
        txn.put(&record)?;
        Ok(record.model_config)
    }
}

/// [`BindingStore::retire_thread`](crate::BindingStore::retire_thread): the give-up
/// ([`Retirement::Lost`]) and the host's own end of a thread ([`Retirement::Ended`]).
#[derive(Debug)]
pub(crate) struct Retire {
    pub(crate) session_id: String,
    pub(crate) thread_id: String,
    pub(crate) retirement: Retirement,
    pub(crate) fence: Option<Fence>,
}

impl WriteOp for Retire {
    type Output = ();

    fn session_id(&self) -> &str {
        &self.session_id
    }

    fn apply(&self, txn: &mut dyn WriteTxn, now: i64) -> Result<()> {
        let (session_id, thread_id) = (&self.session_id, &self.thread_id);
        check_id("session id", session_id)?;
        check_id("thread id", thread_id)?;
        check_fence(txn, session_id, self.fence.as_ref())?;
        let existing = load_session(txn, session_id)?;
        let mut record = existing
            .clone()
            .unwrap_or_else(|| SessionRecord::new(session_id, now));
        let claim = claim_thread(txn, &record, thread_id)?;
        if !record.is_retired(thread_id) {
            record.retired_threads.push(thread_id.clone());
        }
        // A retired thread is never resumed again: its mirror has no use.
        mirror::drop_thread(txn, &mut record, thread_id)?;
        // Compare-and-set: only a binding to this very thread changes.
        if record.thread_id() == Some(thread_id.as_str()) {
            record.set_state(match &self.retirement {
                Retirement::Lost { reason, message } => BindingState::GivenUp(GivenUp {
                    thread_id: thread_id.clone(),
                    reason: reason.clone(),
                    message: message.clone(),
                    at_ms: now,
                    notice_delivered: false,
                }),
                Retirement::Ended => BindingState::Unbound,
            });
        }
        if claim {
            txn.put_thread_owner(thread_id, session_id)?;
        }
        if existing.as_ref() != Some(&record) {
            record.updated_at_ms = now;
            txn.put(&record)?;
        }
        Ok(())
    }
}

/// [`BindingStore::mark_notice_delivered`](crate::BindingStore::mark_notice_delivered).
#[derive(Debug)]
pub(crate) struct MarkDelivered {
    pub(crate) session_id: String,
    pub(crate) thread_id: String,
    pub(crate) fence: Option<Fence>,
}

impl WriteOp for MarkDelivered {
    type Output = bool;

    fn session_id(&self) -> &str {
        &self.session_id
    }

    fn apply(&self, txn: &mut dyn WriteTxn, now: i64) -> Result<bool> {
        check_fence(txn, &self.session_id, self.fence.as_ref())?;
        let Some(mut record) = load_session(txn, &self.session_id)? else {
            return Ok(false);
        };
        let BindingState::GivenUp(given_up) = &mut record.state else {
            return Ok(false);
        };
        if given_up.thread_id != self.thread_id {
            return Ok(false);
        }
        if !given_up.notice_delivered {
            given_up.notice_delivered = true;
            record.updated_at_ms = now;
            txn.put(&record)?;
        }
        Ok(true)
    }
}

/// [`BindingStore::delete_session`](crate::BindingStore::delete_session): refused while the
/// session's lease is live; its grant then goes to nobody.
#[derive(Debug)]
pub(crate) struct Delete(pub(crate) String);

impl WriteOp for Delete {
    type Output = bool;

    fn session_id(&self) -> &str {
        &self.0
    }

    fn apply(&self, txn: &mut dyn WriteTxn, now: i64) -> Result<bool> {
        let grant = txn.leases().load_lease(&self.0)?;
        Grant::refuse_if_busy(grant.as_ref(), None, now)?;
        // A plain remove: deleting a session whose record was lost clears its rows (a repair).
        let existed = txn.remove(&self.0)?;
        if let Some(grant) = grant {
            txn.leases().put_lease(&Grant::forgotten(&grant, now))?;
        }
        Ok(existed)
    }
}

/// [`BindingStore::import_session`](crate::BindingStore::import_session): a new session is
/// refused while its lease is live; its grant then goes to nobody.
#[derive(Debug)]
pub(crate) struct Import(pub(crate) SessionExport);

impl WriteOp for Import {
    type Output = ImportOutcome;

    fn session_id(&self) -> &str {
        &self.0.record.session_id
    }

    fn apply(&self, txn: &mut dyn WriteTxn, now: i64) -> Result<ImportOutcome> {
        let export = &self.0;
        let record = &export.record;
        let session_id = &record.session_id;
        check_id("session id", session_id)?;
        check_record(record).map_err(StoreError::InvalidInput)?;
        if export.rows.len() as u64 != record.row_count
            || export
                .rows
                .iter()
                .enumerate()
                .any(|(i, r)| r.seq != i as u64)
        {
            return Err(StoreError::InvalidInput(format!(
                "export of {session_id} must carry rows 0..{} in order",
                record.row_count
            )));
        }
        mirror::check_export(record, &export.mirror).map_err(|detail| {
            StoreError::InvalidInput(format!("export of {session_id}: {detail}"))
        })?;
        for thread in &export.threads {
            check_id("thread id", thread)?;
        }
        let existing = load_session(txn, session_id)?;
        if let Some(existing) = &existing {
            let same = *existing == *record
                && txn.load_rows(session_id, 0..existing.row_count)? == export.rows
                && mirror::export(txn, existing)? == export.mirror;
            if !same {
                return Err(StoreError::Conflict {
                    session_id: session_id.clone(),
                    detail: "a different session with this id already exists".to_string(),
                });
            }
        }
        // As for a delete: a live holder's next fenced commit would append to a history it
        // never read, so a new session is refused while the lease is live, and once it is
        // not, its grant goes to nobody (a stalled holder's fence would still be accepted).
        let stale_grant = match existing {
            Some(_) => None,
            None => {
                let grant = txn.leases().load_lease(session_id)?;
                Grant::refuse_if_busy(grant.as_ref(), None, now)?;
                grant
            }
        };
        // The threads the session used before its record's too: the source refuses them to
        // other sessions, so must the target.
        let mut seen = BTreeSet::new();
        let mut claims = Vec::new();
        for thread in record
            .named_threads()
            .chain(export.threads.iter().map(String::as_str))
        {
            if !seen.insert(thread) {
                continue;
            }
            match txn.thread_owner(thread)? {
                None => claims.push(thread),
                Some(owner) if owner == *session_id => {}
                Some(owner) => {
                    return Err(StoreError::ThreadTaken {
                        thread_id: thread.to_string(),
                        session_id: owner,
                    })
                }
            }
        }
        if existing.is_some() {
            // Present already, imported by an older rethread that claimed only the threads
            // its record names.
            for thread in claims {
                txn.put_thread_owner(thread, session_id)?;
            }
            return Ok(ImportOutcome::AlreadyPresent);
        }
        let bodies: Vec<Value> = export.rows.iter().map(|r| r.body.clone()).collect();
        txn.put_rows(session_id, 0, &bodies)?;
        for chunk in &export.mirror {
            let file = FileKey::new(session_id, &chunk.thread_id, &chunk.path);
            txn.put_chunk(file, chunk.seq, &chunk.bytes)?;
        }
        for thread in claims {
            txn.put_thread_owner(thread, session_id)?;
        }
        txn.put(record)?;
        if let Some(grant) = stale_grant {
            txn.leases().put_lease(&Grant::forgotten(&grant, now))?;
        }
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

    fn apply(&self, txn: &mut dyn WriteTxn, now: i64) -> Result<L::Output> {
        self.0.apply(txn.leases(), now)
    }
}
