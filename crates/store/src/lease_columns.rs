//! A lease grant as the SQL backends (SQLite, PostgreSQL) keep it: one column per field,
//! integers as SQL has them. Both backends read and write it through [`LeaseColumns`], so the
//! state codes and what a row must hold to be a lease are decided once.

use crate::logic::{Grant, GrantState};
use crate::{Lease, LeaseOwner, ProcessIdentity, Result, StoreError};

/// The `leases` columns, in [`LeaseColumns`]' order (SQLite adds `checksum` after them).
macro_rules! lease_columns {
    () => {
        "session_id, host, pid, started_at_ms, instance, acquired_at_ms, expires_at_ms, fence, \
         process_space, process_start, state"
    };
}
pub(crate) use lease_columns;

/// One `leases` row.
pub(crate) struct LeaseColumns {
    pub(crate) session_id: String,
    pub(crate) host: String,
    pub(crate) pid: i64,
    pub(crate) started_at_ms: i64,
    pub(crate) instance: i64,
    pub(crate) acquired_at_ms: i64,
    pub(crate) expires_at_ms: i64,
    pub(crate) fence: i64,
    pub(crate) process_space: Option<String>,
    pub(crate) process_start: Option<i64>,
    /// 0 held, 1 released, 2 forgotten.
    pub(crate) state: i64,
}

impl LeaseColumns {
    /// The row of `grant`.
    pub(crate) fn of(grant: &Grant) -> LeaseColumns {
        let lease = &grant.lease;
        LeaseColumns {
            session_id: lease.session_id.clone(),
            host: lease.owner.host.clone(),
            pid: i64::from(lease.owner.pid),
            started_at_ms: lease.owner.started_at_ms,
            instance: lease.owner.instance as i64,
            acquired_at_ms: lease.acquired_at_ms,
            expires_at_ms: lease.expires_at_ms,
            fence: lease.fence as i64,
            process_space: lease.owner.process.as_ref().map(|p| p.space.clone()),
            process_start: lease.owner.process.as_ref().map(|p| p.start_ticks as i64),
            state: match grant.state {
                GrantState::Held => 0,
                GrantState::Released => 1,
                GrantState::Forgotten => 2,
            },
        }
    }

    /// The grant the row holds; a row no grant writes (a pid out of range, half a process
    /// identity, an unknown state) is damage of the store `label`.
    pub(crate) fn into_grant(self, label: &str) -> Result<Grant> {
        let session_id = self.session_id;
        let damaged = |what: &str| {
            StoreError::corrupt(label, format!("lease of session {session_id}: {what}"))
        };
        let pid = u32::try_from(self.pid).map_err(|_| damaged("bad pid"))?;
        let process = ProcessIdentity::from_columns(self.process_space, self.process_start)
            .map_err(damaged)?;
        let state = match self.state {
            0 => GrantState::Held,
            1 => GrantState::Released,
            2 => GrantState::Forgotten,
            _ => return Err(damaged("unknown state")),
        };
        let lease = Lease {
            session_id,
            owner: LeaseOwner {
                host: self.host,
                pid,
                started_at_ms: self.started_at_ms,
                instance: self.instance as u64,
                process,
            },
            acquired_at_ms: self.acquired_at_ms,
            expires_at_ms: self.expires_at_ms,
            fence: self.fence as u64,
        };
        Ok(Grant { lease, state })
    }
}
