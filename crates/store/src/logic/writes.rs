//! The writes. A write runs inside one write transaction at store time `now` and decides
//! every refusal before its first write.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::leases::{check_grant, Grant};
use super::{check_id, check_record, load_session, merge_patch, mirror, WriteTxn};
use crate::Result;
use crate::{
    Binding, BindingState, CommitOutcome, Fallback, Fence, GivenUp, ImportOutcome, Retirement,
    SessionExport, SessionRecord, StoreError, TurnCommit, CODEX_THREAD_ID_KEY,
};

/// Refuses a fenced write unless its grant is still the session's newest (see [`Fence`]).
/// Called before the operation's first write, inside the same transaction.
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
pub(crate) fn commit(
    txn: &mut dyn WriteTxn,
    now: i64,
    commit: &TurnCommit,
) -> Result<CommitOutcome> {
    let (session_id, thread_id) = (&commit.session_id, &commit.thread_id);
    check_id("session id", session_id)?;
    check_id("thread id", thread_id)?;
    check_fence(txn, session_id, commit.fence.as_ref())?;
    let mut record =
        load_session(txn, session_id)?.unwrap_or_else(|| SessionRecord::new(session_id, now));
    let claim = claim_thread(txn, &record, thread_id)?;
    let retired = record.is_retired(thread_id);
    if !retired && record.thread_id() != Some(thread_id.as_str()) {
        // A new thread replaces the bound one: the cap stopped mirroring for that one only.
        record.mirror.stopped = false;
    }
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
        let mut binding = Binding::new(thread_id.clone(), commit.codex_home.clone(), bound_at_ms);
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

/// [`BindingStore::patch_config`](crate::BindingStore::patch_config).
pub(crate) fn patch(
    txn: &mut dyn WriteTxn,
    now: i64,
    session_id: &str,
    patch: &Map<String, Value>,
    fence: Option<&Fence>,
) -> Result<Map<String, Value>> {
    check_id("session id", session_id)?;
    if patch.contains_key(CODEX_THREAD_ID_KEY) {
        return Err(StoreError::InvalidInput(format!(
            "{CODEX_THREAD_ID_KEY} is the store's view of the binding: commit a turn or \
             retire the thread instead"
        )));
    }
    check_fence(txn, session_id, fence)?;
    let mut record =
        load_session(txn, session_id)?.unwrap_or_else(|| SessionRecord::new(session_id, now));
    merge_patch(&mut record.model_config, patch);
    record.updated_at_ms = now;
    txn.put(&record)?;
    Ok(record.model_config)
}

/// [`BindingStore::retire_thread`](crate::BindingStore::retire_thread).
pub(crate) fn retire(
    txn: &mut dyn WriteTxn,
    now: i64,
    session_id: &str,
    thread_id: &str,
    retirement: &Retirement,
    fence: Option<&Fence>,
) -> Result<()> {
    check_id("session id", session_id)?;
    check_id("thread id", thread_id)?;
    check_fence(txn, session_id, fence)?;
    let existing = load_session(txn, session_id)?;
    let mut record = existing
        .clone()
        .unwrap_or_else(|| SessionRecord::new(session_id, now));
    let claim = claim_thread(txn, &record, thread_id)?;
    if !record.is_retired(thread_id) {
        record.retired_threads.push(thread_id.to_string());
    }
    // A retired thread is never resumed again: its mirror has no use.
    mirror::drop_thread(txn, &mut record, thread_id)?;
    // Compare-and-set: only a binding to this very thread changes. Its replacement will be
    // mirrored again, whatever the cap did to it.
    if record.thread_id() == Some(thread_id) {
        record.mirror.stopped = false;
        record.set_state(match retirement {
            Retirement::Lost { reason, message } => BindingState::GivenUp(GivenUp {
                thread_id: thread_id.to_string(),
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

/// [`BindingStore::mark_notice_delivered`](crate::BindingStore::mark_notice_delivered).
pub(crate) fn mark_delivered(
    txn: &mut dyn WriteTxn,
    now: i64,
    session_id: &str,
    thread_id: &str,
    fence: Option<&Fence>,
) -> Result<bool> {
    check_fence(txn, session_id, fence)?;
    let Some(mut record) = load_session(txn, session_id)? else {
        return Ok(false);
    };
    let BindingState::GivenUp(given_up) = &mut record.state else {
        return Ok(false);
    };
    if given_up.thread_id != thread_id {
        return Ok(false);
    }
    if !given_up.notice_delivered {
        given_up.notice_delivered = true;
        record.updated_at_ms = now;
        txn.put(&record)?;
    }
    Ok(true)
}

/// [`BindingStore::delete_session`](crate::BindingStore::delete_session).
pub(crate) fn delete(txn: &mut dyn WriteTxn, now: i64, session_id: &str) -> Result<bool> {
    let grant = txn.leases().load_lease(session_id)?;
    Grant::refuse_if_busy(grant.as_ref(), None, now)?;
    // A plain remove: deleting a session whose record was lost clears its rows (a repair).
    let existed = txn.remove(session_id)?;
    txn.reclaim()?;
    if let Some(grant) = grant {
        txn.leases().put_lease(&Grant::forgotten(&grant, now))?;
    }
    Ok(existed)
}

/// [`BindingStore::import_session`](crate::BindingStore::import_session).
pub(crate) fn import(
    txn: &mut dyn WriteTxn,
    now: i64,
    export: &SessionExport,
) -> Result<ImportOutcome> {
    let record = &export.record;
    let session_id = &record.session_id;
    check_id("session id", session_id)?;
    check_record(record).map_err(StoreError::InvalidInput)?;
    let in_order = export
        .rows
        .iter()
        .enumerate()
        .all(|(i, r)| r.seq == i as u64);
    if export.rows.len() as u64 != record.row_count || !in_order {
        return Err(StoreError::InvalidInput(format!(
            "export of {session_id} must carry rows 0..{} in order",
            record.row_count
        )));
    }
    mirror::check_export(record, &export.mirror)
        .map_err(|detail| StoreError::InvalidInput(format!("export of {session_id}: {detail}")))?;
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
    // As for a delete: a live holder's next fenced commit would append to a history it never
    // read, so a new session is refused while the lease is live, and its grant then goes to
    // nobody (a stalled holder's fence would still be accepted).
    let stale_grant = match existing {
        Some(_) => None,
        None => {
            let grant = txn.leases().load_lease(session_id)?;
            Grant::refuse_if_busy(grant.as_ref(), None, now)?;
            grant
        }
    };
    // The threads the session used before its record's too: the source refuses them to other
    // sessions, so must the target.
    let mut seen = BTreeSet::new();
    let mut claims = Vec::new();
    let threads = export.threads.iter().map(String::as_str);
    for thread in record.named_threads().chain(threads) {
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
    if existing.is_none() {
        let bodies: Vec<Value> = export.rows.iter().map(|r| r.body.clone()).collect();
        txn.put_rows(session_id, 0, &bodies)?;
        mirror::import(txn, record, &export.mirror)?;
    }
    // Present already: an older rethread imported it, claiming only the threads its record
    // names.
    for thread in claims {
        txn.put_thread_owner(thread, session_id)?;
    }
    if existing.is_some() {
        return Ok(ImportOutcome::AlreadyPresent);
    }
    txn.put(record)?;
    if let Some(grant) = stale_grant {
        txn.leases().put_lease(&Grant::forgotten(&grant, now))?;
    }
    Ok(ImportOutcome::Imported)
}
