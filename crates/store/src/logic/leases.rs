//! The lease rules: acquire, renew, release, and the fence check of a write.

use crate::Unpoisoned;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{check_id, LeaseOp};
use crate::Result;
use crate::{Clock, Lease, LeaseLoss, LeaseOwner, StoreError};

/// The leases of one transaction: the newest grant of each session that ever had one (a
/// released, expired or forgotten grant stays stored, so that `fence` keeps growing).
pub trait LeaseTxn {
    /// The session's newest grant, if it ever had one.
    fn load_lease(&mut self, session_id: &str) -> Result<Option<Grant>>;
    /// Inserts or replaces the session's grant.
    fn put_lease(&mut self, grant: &Grant) -> Result<()>;
    /// Removes the session's grant record (a pruned session: a later grant starts a new
    /// fence count, and a stale one finds no grant, `Forgotten`).
    fn remove_lease(&mut self, session_id: &str) -> Result<()>;
}

/// What became of a grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrantState {
    /// Its owner holds it (live until it expires, and renewable after as long as it is the
    /// newest grant).
    Held,
    /// Its owner released it.
    Released,
    /// Its session was deleted: a grant to nobody.
    Forgotten,
}

/// A session's newest lease grant and its state: the row a store keeps per session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The lease granted.
    pub lease: Lease,
    /// What became of it.
    pub state: GrantState,
}

impl Grant {
    /// Whether another owner must wait for it: held and not expired.
    fn is_live(&self, now: i64) -> bool {
        self.state == GrantState::Held && self.lease.expires_at_ms > now
    }

    /// The grant to nobody a delete leaves: the next fence, so no earlier grant can renew or
    /// write again.
    pub(crate) fn forgotten(previous: &Grant, now: i64) -> Grant {
        Grant {
            lease: Lease {
                acquired_at_ms: now,
                expires_at_ms: now,
                fence: previous.lease.fence + 1,
                ..previous.lease.clone()
            },
            state: GrantState::Forgotten,
        }
    }

    /// Refuses a live lease of another owner than `asker`, unless the OS proves that holder
    /// gone: a crashed host restarted at once must not wait out the TTL.
    pub(crate) fn refuse_if_busy(
        grant: Option<&Grant>,
        asker: Option<&LeaseOwner>,
        now: i64,
    ) -> Result<()> {
        match grant {
            Some(held)
                if held.is_live(now)
                    && Some(&held.lease.owner) != asker
                    && !held.lease.owner.is_known_gone() =>
            {
                Err(StoreError::Busy {
                    session_id: held.lease.session_id.clone(),
                    holder: held.lease.owner.clone(),
                    acquired_at_ms: held.lease.acquired_at_ms,
                    expires_at_ms: held.lease.expires_at_ms,
                })
            }
            _ => Ok(()),
        }
    }
}

/// Accepts `owner`'s grant `token` iff it is still the session's newest grant and held (see
/// [`Fence`](crate::Fence)); else [`StoreError::LeaseLost`] saying why.
pub(crate) fn check_grant(
    session_id: &str,
    grant: Option<&Grant>,
    owner: &LeaseOwner,
    token: u64,
) -> Result<()> {
    let cause = match grant {
        Some(g) if g.lease.fence == token && g.lease.owner == *owner => match g.state {
            GrantState::Held => return Ok(()),
            GrantState::Released => LeaseLoss::Released,
            GrantState::Forgotten => LeaseLoss::Forgotten,
        },
        Some(g) if g.state != GrantState::Forgotten => LeaseLoss::TakenOver {
            holder: g.lease.owner.clone(),
        },
        _ => LeaseLoss::Forgotten,
    };
    Err(StoreError::lease_lost(session_id, cause))
}

/// [`BindingStore::acquire_lease`](crate::BindingStore::acquire_lease).
pub(crate) fn acquire(
    leases: &mut dyn LeaseTxn,
    now: i64,
    session_id: &str,
    owner: &LeaseOwner,
    ttl_ms: i64,
) -> Result<Lease> {
    check_id("session id", session_id)?;
    let existing = leases.load_lease(session_id)?;
    Grant::refuse_if_busy(existing.as_ref(), Some(owner), now)?;
    // Every grant gets a new fence, a re-acquire by the same owner included: a late renewal
    // or release of an earlier grant then never touches this one.
    let lease = Lease {
        session_id: session_id.to_string(),
        owner: owner.clone(),
        acquired_at_ms: now,
        expires_at_ms: now.saturating_add(ttl_ms),
        fence: existing.map_or(0, |g| g.lease.fence) + 1,
    };
    leases.put_lease(&Grant {
        lease: lease.clone(),
        state: GrantState::Held,
    })?;
    Ok(lease)
}

/// [`BindingStore::renew_lease`](crate::BindingStore::renew_lease).
pub(crate) fn renew(
    leases: &mut dyn LeaseTxn,
    now: i64,
    lease: &Lease,
    ttl_ms: i64,
) -> Result<Lease> {
    let session_id = &lease.session_id;
    let grant = leases.load_lease(session_id)?;
    check_grant(session_id, grant.as_ref(), &lease.owner, lease.fence)?;
    let Some(grant) = grant else {
        return Err(StoreError::lease_lost(session_id, LeaseLoss::Forgotten));
    };
    let renewed = Grant {
        lease: Lease {
            expires_at_ms: now.saturating_add(ttl_ms),
            ..grant.lease
        },
        state: GrantState::Held,
    };
    leases.put_lease(&renewed)?;
    Ok(renewed.lease)
}

/// [`BindingStore::release_lease`](crate::BindingStore::release_lease).
pub(crate) fn release(leases: &mut dyn LeaseTxn, now: i64, lease: &Lease) -> Result<bool> {
    let session_id = &lease.session_id;
    let Some(grant) = leases.load_lease(session_id)? else {
        return Ok(false);
    };
    if check_grant(session_id, Some(&grant), &lease.owner, lease.fence).is_err() {
        return Ok(false);
    }
    leases.put_lease(&Grant {
        lease: Lease {
            expires_at_ms: now.min(grant.lease.expires_at_ms),
            ..grant.lease
        },
        state: GrantState::Released,
    })?;
    Ok(true)
}

/// Leases kept in this process only, for the single-process redb backend.
///
/// A lease request and a write transaction never overlap (the writer thread holds
/// [`LocalLeases::begin_write`]'s gate from a write's fence checks to its commit): else a new
/// holder could read the session without a write that passed its fence check and lands after
/// (a fork). What a write changes of the leases is staged, and kept only if it commits.
#[cfg_attr(not(feature = "redb"), allow(dead_code))]
#[derive(Debug, Default)]
pub(crate) struct LocalLeases {
    leases: Mutex<HashMap<String, Grant>>,
    writing: Mutex<()>,
    /// A write's changes: `None` removes the grant.
    staged: Mutex<HashMap<String, Option<Grant>>>,
    clock: Clock,
}

#[cfg_attr(not(feature = "redb"), allow(dead_code))]
impl LocalLeases {
    /// No leases; time read from `clock`.
    pub(crate) fn new(clock: Clock) -> Self {
        LocalLeases {
            clock,
            ..Self::default()
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<String, Grant>> {
        self.leases.lock().unpoisoned()
    }

    fn staged(&self) -> MutexGuard<'_, HashMap<String, Option<Grant>>> {
        self.staged.lock().unpoisoned()
    }

    /// Runs a lease request once no write is under way (at most one commit: never call it on
    /// an async runtime thread).
    pub(crate) fn apply<T>(&self, mut op: impl LeaseOp<T>) -> Result<T> {
        let _writing = self.writing.lock().unpoisoned();
        op(&mut *self.map(), self.clock.now_ms())
    }

    /// Opens the gate of one write transaction: lease requests wait until it is dropped.
    pub(crate) fn begin_write(&self) -> LeaseWrite<'_> {
        let gate = self.writing.lock().unpoisoned();
        self.staged().clear();
        LeaseWrite {
            leases: self,
            _gate: gate,
        }
    }
}

/// One write transaction's hold on [`LocalLeases`]; what it staged is discarded unless
/// [`LeaseWrite::committed`].
#[cfg_attr(not(feature = "redb"), allow(dead_code))]
pub(crate) struct LeaseWrite<'a> {
    leases: &'a LocalLeases,
    _gate: MutexGuard<'a, ()>,
}

#[cfg_attr(not(feature = "redb"), allow(dead_code))]
impl LeaseWrite<'_> {
    /// The write committed: what it staged becomes the leases.
    pub(crate) fn committed(self) {
        let staged = std::mem::take(&mut *self.leases.staged());
        let mut map = self.leases.map();
        for (session_id, grant) in staged {
            match grant {
                Some(grant) => map.insert(session_id, grant),
                None => map.remove(&session_id),
            };
        }
    }
}

impl Drop for LeaseWrite<'_> {
    fn drop(&mut self) {
        self.leases.staged().clear();
    }
}

/// [`ReadTxn::stale_leases`](super::ReadTxn::stale_leases) over leases kept in a map:
/// `has_record` says whether a session has a record.
pub(crate) fn stale_grants(
    leases: &HashMap<String, Grant>,
    after: &str,
    cutoff: i64,
    limit: usize,
    mut has_record: impl FnMut(&str) -> Result<bool>,
) -> Result<Vec<String>> {
    let mut ids: Vec<&String> = leases
        .iter()
        .filter(|(id, g)| id.as_str() > after && g.lease.expires_at_ms < cutoff)
        .map(|(id, _)| id)
        .collect();
    ids.sort();
    let mut stale = Vec::new();
    for id in ids {
        if stale.len() == limit {
            break;
        }
        if !has_record(id)? {
            stale.push(id.clone());
        }
    }
    Ok(stale)
}

#[cfg_attr(not(feature = "redb"), allow(dead_code))]
impl LocalLeases {
    /// [`stale_grants`] of these leases.
    pub(crate) fn stale(
        &self,
        after: &str,
        cutoff: i64,
        limit: usize,
        has_record: impl FnMut(&str) -> Result<bool>,
    ) -> Result<Vec<String>> {
        stale_grants(&self.map(), after, cutoff, limit, has_record)
    }
}

/// A redb write transaction's view of the leases, under `LocalLeases::begin_write`: what
/// it staged, else the leases.
impl LeaseTxn for Arc<LocalLeases> {
    fn load_lease(&mut self, session_id: &str) -> Result<Option<Grant>> {
        if let Some(grant) = self.staged().get(session_id) {
            return Ok(grant.clone());
        }
        Ok(self.map().get(session_id).cloned())
    }
    fn put_lease(&mut self, grant: &Grant) -> Result<()> {
        self.staged()
            .insert(grant.lease.session_id.clone(), Some(grant.clone()));
        Ok(())
    }
    fn remove_lease(&mut self, session_id: &str) -> Result<()> {
        self.staged().insert(session_id.to_string(), None);
        Ok(())
    }
}

impl LeaseTxn for HashMap<String, Grant> {
    fn load_lease(&mut self, session_id: &str) -> Result<Option<Grant>> {
        Ok(self.get(session_id).cloned())
    }
    fn put_lease(&mut self, grant: &Grant) -> Result<()> {
        self.insert(grant.lease.session_id.clone(), grant.clone());
        Ok(())
    }
    fn remove_lease(&mut self, session_id: &str) -> Result<()> {
        self.remove(session_id);
        Ok(())
    }
}
