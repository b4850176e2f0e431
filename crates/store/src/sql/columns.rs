//! A session record and a lease grant as the SQL backends (SQLite, PostgreSQL) keep them: one
//! column per field, JSON as text, integers as SQL has them. Both backends read and write
//! through [`RecordColumns`] and [`LeaseColumns`], so what a row must hold to be a record or a
//! grant (and the lease state codes) is decided once; so are the checksums of the codec.

use serde::de::DeserializeOwned;

use super::Param::{Int, OptInt, OptText, Text};
use super::{Param, SqlRow};
use crate::checksum::Checksum;
use crate::error::to_json;
use crate::logic::{check_record, Grant, GrantState};
use crate::{Lease, LeaseOwner, ProcessIdentity, Result, SessionRecord, StoreError};

/// One `sessions` row.
pub(crate) struct RecordColumns {
    pub(crate) session_id: String,
    pub(crate) model_config: String,
    pub(crate) state: String,
    pub(crate) row_count: i64,
    pub(crate) retired_threads: String,
    pub(crate) created_at_ms: i64,
    pub(crate) updated_at_ms: i64,
    pub(crate) mirror: String,
}

impl RecordColumns {
    /// The `sessions` columns, in this order (the checksum codec's after them).
    pub(crate) const ALL: &str = "session_id, model_config, state, row_count, retired_threads, \
        created_at_ms, updated_at_ms, mirror";

    /// The row of `record`.
    pub(crate) fn of(record: &SessionRecord) -> Result<RecordColumns> {
        Ok(RecordColumns {
            session_id: record.session_id.clone(),
            model_config: to_json(&record.model_config)?,
            state: to_json(&record.state)?,
            row_count: record.row_count.min(i64::MAX as u64) as i64,
            retired_threads: to_json(&record.retired_threads)?,
            created_at_ms: record.created_at_ms,
            updated_at_ms: record.updated_at_ms,
            mirror: to_json(&record.mirror)?,
        })
    }

    /// The row's values, in [`RecordColumns::ALL`]'s order.
    pub(crate) fn params(&self) -> Vec<Param<'_>> {
        let c = self;
        vec![
            Text(&c.session_id),
            Text(&c.model_config),
            Text(&c.state),
            Int(c.row_count),
            Text(&c.retired_threads),
            Int(c.created_at_ms),
            Int(c.updated_at_ms),
            Text(&c.mirror),
        ]
    }

    /// The columns of `row`, from its first.
    pub(crate) fn read(row: &dyn SqlRow) -> Result<RecordColumns> {
        Ok(RecordColumns {
            session_id: row.str(0)?.to_owned(),
            model_config: row.str(1)?.to_owned(),
            state: row.str(2)?.to_owned(),
            row_count: row.int(3)?,
            retired_threads: row.str(4)?.to_owned(),
            created_at_ms: row.int(5)?,
            updated_at_ms: row.int(6)?,
            mirror: row.str(7)?.to_owned(),
        })
    }

    /// The checksum of the row (the codec's column).
    pub(crate) fn checksum(&self) -> i64 {
        Checksum::of("sessions")
            .text(&self.session_id)
            .text(&self.model_config)
            .text(&self.state)
            .int(self.row_count)
            .text(&self.retired_threads)
            .int(self.created_at_ms)
            .int(self.updated_at_ms)
            .text(&self.mirror)
            .finish()
    }

    /// The record the row holds; a row no record writes (JSON that does not decode, a
    /// negative row count, a record that breaks its own rules) is damage of the store `label`.
    pub(crate) fn into_record(self, label: &str) -> Result<SessionRecord> {
        fn decode<T: DeserializeOwned>(
            label: &str,
            id: &str,
            field: &str,
            json: &str,
        ) -> Result<T> {
            serde_json::from_str(json)
                .map_err(|e| StoreError::corrupt_json(label, format!("{field} of {id}"), e))
        }
        let id = self.session_id;
        let record = SessionRecord {
            model_config: decode(label, &id, "model_config", &self.model_config)?,
            state: decode(label, &id, "state", &self.state)?,
            retired_threads: decode(label, &id, "retired_threads", &self.retired_threads)?,
            row_count: u64::try_from(self.row_count).map_err(|_| {
                StoreError::corrupt(label, format!("session {id}: negative row count"))
            })?,
            mirror: decode(label, &id, "mirror", &self.mirror)?,
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.updated_at_ms,
            session_id: id,
        };
        check_record(&record).map_err(|d| {
            StoreError::corrupt(label, format!("session {}: {d}", record.session_id))
        })?;
        Ok(record)
    }
}

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
    /// The `leases` columns, in this order (the checksum codec's after them).
    pub(crate) const ALL: &str = "session_id, host, pid, started_at_ms, instance, \
        acquired_at_ms, expires_at_ms, fence, process_space, process_start, state";

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

    /// The row's values, in [`LeaseColumns::ALL`]'s order.
    pub(crate) fn params(&self) -> Vec<Param<'_>> {
        let c = self;
        vec![
            Text(&c.session_id),
            Text(&c.host),
            Int(c.pid),
            Int(c.started_at_ms),
            Int(c.instance),
            Int(c.acquired_at_ms),
            Int(c.expires_at_ms),
            Int(c.fence),
            OptText(c.process_space.as_deref()),
            OptInt(c.process_start),
            Int(c.state),
        ]
    }

    /// The columns of `row`, from its first.
    pub(crate) fn read(row: &dyn SqlRow) -> Result<LeaseColumns> {
        Ok(LeaseColumns {
            session_id: row.str(0)?.to_owned(),
            host: row.str(1)?.to_owned(),
            pid: row.int(2)?,
            started_at_ms: row.int(3)?,
            instance: row.int(4)?,
            acquired_at_ms: row.int(5)?,
            expires_at_ms: row.int(6)?,
            fence: row.int(7)?,
            process_space: row.opt_str(8)?.map(str::to_owned),
            process_start: row.opt_int(9)?,
            state: row.int(10)?,
        })
    }

    /// The checksum of the row (the codec's column).
    pub(crate) fn checksum(&self) -> i64 {
        Checksum::of("leases")
            .text(&self.session_id)
            .text(&self.host)
            .int(self.pid)
            .int(self.started_at_ms)
            .int(self.instance)
            .int(self.acquired_at_ms)
            .int(self.expires_at_ms)
            .int(self.fence)
            .opt_text(self.process_space.as_deref())
            .opt_int(self.process_start)
            .int(self.state)
            .finish()
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

/// The checksum of a `transcript_rows` row (the codec's column).
pub(crate) fn row_checksum(session_id: &str, seq: i64, body: &str) -> i64 {
    Checksum::of("transcript_rows")
        .text(session_id)
        .int(seq)
        .text(body)
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_single_byte_flip_changes_a_row_checksum() {
        let body = r#"{"role":"user","text":"hello"}"#;
        let sum = row_checksum("chat-1", 3, body);
        for at in 0..body.len() {
            for mask in [1u8, 0x20, 0x80, 0xff] {
                let mut bytes = body.as_bytes().to_vec();
                bytes[at] ^= mask;
                let changed = String::from_utf8_lossy(&bytes);
                assert_ne!(
                    row_checksum("chat-1", 3, &changed),
                    sum,
                    "at {at} ^ {mask:#x}"
                );
            }
        }
        assert_ne!(row_checksum("chat-2", 3, body), sum);
        assert_ne!(row_checksum("chat-1", 4, body), sum);
    }
}
