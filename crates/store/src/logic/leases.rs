//! The lease rules: acquire, renew, release. The one place they live.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{check_id, now_ms};
use crate::{Lease, LeaseOwner, StoreError};

/// The leases of one transaction (a table in SQLite and PostgreSQL, a map in memory and redb).
///
/// A released or expired lease stays stored (free) so that its `fence` keeps growing.
pub(crate) trait LeaseTxn {
    /// The session's lease row, free or held.
    fn load_lease(&mut self, session_id: &str) -> Result<Option<Lease>, StoreError>;
    /// Inserts or replaces the session's lease row.
    fn put_lease(&mut self, lease: &Lease) -> Result<(), StoreError>;
}

/// One lease request, with its typed output.
pub(crate) trait LeaseOp: Send + std::fmt::Debug + 'static {
    /// What the request returns.
    type Output: Send + std::fmt::Debug + 'static;
    /// The session whose lease it concerns.
    fn session_id(&self) -> &str;
    /// Runs the request on `leases` at store time `now`.
    fn apply(&self, leases: &mut dyn LeaseTxn, now: i64) -> Result<Self::Output, StoreError>;
}

/// [`BindingStore::acquire_lease`](crate::BindingStore::acquire_lease): granted when the
/// session has no lease, its lease expired or was released, the same owner holds it, or its
/// holder is provably gone ([`LeaseOwner::is_known_gone`]); otherwise [`StoreError::Busy`]
/// naming the holder. Every grant increments `fence`.
#[derive(Debug)]
pub(crate) struct Acquire {
    pub(crate) session_id: String,
    pub(crate) owner: LeaseOwner,
    pub(crate) ttl_ms: i64,
}

impl LeaseOp for Acquire {
    type Output = Lease;

    fn session_id(&self) -> &str {
        &self.session_id
    }

    fn apply(&self, leases: &mut dyn LeaseTxn, now: i64) -> Result<Lease, StoreError> {
        check_id("session id", &self.session_id)?;
        let existing = leases.load_lease(&self.session_id)?;
        if let Some(held) = &existing {
            // A live lease of another holder refuses, unless the OS proves that holder gone
            // (same machine and pid namespace, its process exited): a crashed host restarted
            // at once must not wait out the TTL.
            if held.expires_at_ms > now && held.owner != self.owner && !held.owner.is_known_gone() {
                return Err(StoreError::Busy {
                    session_id: self.session_id.clone(),
                    holder: held.owner.clone(),
                    acquired_at_ms: held.acquired_at_ms,
                    expires_at_ms: held.expires_at_ms,
                });
            }
        }
        // Every grant gets a new fence, a re-acquire by the same owner included: a late
        // renewal or release of an earlier grant then never touches this one.
        let lease = Lease {
            session_id: self.session_id.clone(),
            owner: self.owner.clone(),
            acquired_at_ms: now,
            expires_at_ms: now.saturating_add(self.ttl_ms),
            fence: existing.map_or(0, |l| l.fence) + 1,
        };
        leases.put_lease(&lease)?;
        Ok(lease)
    }
}

/// [`BindingStore::renew_lease`](crate::BindingStore::renew_lease): only the owner of a live
/// lease with the same `fence` extends it to `now + ttl`; anything else is
/// [`StoreError::LeaseLost`] (an expired lease is lost even if nobody took it: the holder
/// failed to renew in time and must not assume exclusivity).
#[derive(Debug)]
pub(crate) struct Renew {
    pub(crate) lease: Lease,
    pub(crate) ttl_ms: i64,
}

impl LeaseOp for Renew {
    type Output = Lease;

    fn session_id(&self) -> &str {
        &self.lease.session_id
    }

    fn apply(&self, leases: &mut dyn LeaseTxn, now: i64) -> Result<Lease, StoreError> {
        match leases.load_lease(&self.lease.session_id)? {
            Some(held) if is_same_grant(&held, &self.lease) && held.expires_at_ms > now => {
                let renewed = Lease {
                    expires_at_ms: now.saturating_add(self.ttl_ms),
                    ..held
                };
                leases.put_lease(&renewed)?;
                Ok(renewed)
            }
            _ => Err(StoreError::LeaseLost {
                session_id: self.lease.session_id.clone(),
            }),
        }
    }
}

/// [`BindingStore::release_lease`](crate::BindingStore::release_lease): frees a live lease of
/// the same owner and `fence` (`true`); otherwise nothing happens (`false`): another owner's
/// lease is never freed.
#[derive(Debug)]
pub(crate) struct Release(pub(crate) Lease);

impl LeaseOp for Release {
    type Output = bool;

    fn session_id(&self) -> &str {
        &self.0.session_id
    }

    fn apply(&self, leases: &mut dyn LeaseTxn, now: i64) -> Result<bool, StoreError> {
        match leases.load_lease(&self.0.session_id)? {
            Some(held) if is_same_grant(&held, &self.0) && held.expires_at_ms > now => {
                leases.put_lease(&Lease {
                    expires_at_ms: now,
                    ..held
                })?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

fn is_same_grant(held: &Lease, lease: &Lease) -> bool {
    held.owner == lease.owner && held.fence == lease.fence
}

/// Leases kept in this process only: for the single-process redb backend (its file is locked
/// to one process).
#[derive(Debug, Default)]
pub(crate) struct LocalLeases {
    leases: Mutex<HashMap<String, Lease>>,
}

impl LocalLeases {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Lease>> {
        self.leases.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs a lease request at the machine's time.
    pub(crate) fn apply<L: LeaseOp>(&self, op: &L) -> Result<L::Output, StoreError> {
        op.apply(&mut *self.map(), now_ms())
    }
}

/// The view a write transaction of a single-process durable backend (redb) has of the
/// process's leases, for fence checks: each call locks the map for that call only. A check
/// and the write it guards are still one step, because every write of the store goes through
/// its one writer thread, in order.
impl LeaseTxn for Arc<LocalLeases> {
    fn load_lease(&mut self, session_id: &str) -> Result<Option<Lease>, StoreError> {
        Ok(self.map().get(session_id).cloned())
    }
    fn put_lease(&mut self, lease: &Lease) -> Result<(), StoreError> {
        self.map().insert(lease.session_id.clone(), lease.clone());
        Ok(())
    }
}

impl LeaseTxn for HashMap<String, Lease> {
    fn load_lease(&mut self, session_id: &str) -> Result<Option<Lease>, StoreError> {
        Ok(self.get(session_id).cloned())
    }
    fn put_lease(&mut self, lease: &Lease) -> Result<(), StoreError> {
        self.insert(lease.session_id.clone(), lease.clone());
        Ok(())
    }
}
