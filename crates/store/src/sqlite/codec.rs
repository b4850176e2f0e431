//! The SQLite row codec: rows as stored and their checksums. SQLite keeps no checksum of what
//! a page holds, so every row of every table carries a CRC-32 of its fields (`checksum.rs`),
//! verified whenever the row is read.

use rusqlite::Row;

use crate::checksum::{verify, Checksum};
use crate::logic::Grant;
use crate::sql_columns::{lease_columns, record_columns, LeaseColumns, RecordColumns};
use crate::Result;
use crate::SessionRecord;

pub(super) fn row_checksum(session_id: &str, seq: i64, body: &str) -> i64 {
    Checksum::of("transcript_rows")
        .text(session_id)
        .int(seq)
        .text(body)
        .finish()
}

/// One `transcript_rows` row as stored.
pub(super) struct RawRow {
    pub(super) session_id: String,
    pub(super) seq: i64,
    pub(super) body: String,
    pub(super) checksum: i64,
}

impl RawRow {
    /// The columns [`RawRow::from_row`] reads, in order.
    pub(super) const COLUMNS: &'static str = "session_id, seq, body, checksum";

    pub(super) fn from_row(row: &Row<'_>) -> rusqlite::Result<RawRow> {
        Ok(RawRow {
            session_id: row.get(0)?,
            seq: row.get(1)?,
            body: row.get(2)?,
            checksum: row.get(3)?,
        })
    }

    pub(super) fn verify(&self, label: &str) -> Result<()> {
        verify(
            label,
            || format!("row {} of session {}", self.seq, self.session_id),
            self.checksum,
            row_checksum(&self.session_id, self.seq, &self.body),
        )
    }
}

/// A `sessions` row as stored: the columns both SQL backends keep, and their checksum.
pub(super) struct RawRecord {
    pub(super) columns: RecordColumns,
    pub(super) checksum: i64,
}

impl RawRecord {
    pub(super) fn encode(record: &SessionRecord) -> Result<RawRecord> {
        let columns = RecordColumns::of(record)?;
        let checksum = record_checksum(&columns);
        Ok(RawRecord { columns, checksum })
    }
}

/// Verifies a stored session row and decodes it.
pub(super) fn decode_record(label: &str, raw: RawRecord) -> Result<SessionRecord> {
    let columns = raw.columns;
    let what = || format!("session {}", columns.session_id);
    verify(label, what, raw.checksum, record_checksum(&columns))?;
    columns.into_record(label)
}

fn record_checksum(c: &RecordColumns) -> i64 {
    Checksum::of("sessions")
        .text(&c.session_id)
        .text(&c.model_config)
        .text(&c.state)
        .int(c.row_count)
        .text(&c.retired_threads)
        .int(c.created_at_ms)
        .int(c.updated_at_ms)
        .text(&c.mirror)
        .finish()
}

/// The `sessions` columns, in the order `raw_record` reads them, `checksum` last.
pub(super) const RECORD_COLUMNS: &str = concat!(record_columns!(), ", checksum");

pub(super) fn raw_record(row: &Row<'_>) -> rusqlite::Result<RawRecord> {
    let columns = RecordColumns {
        session_id: row.get(0)?,
        model_config: row.get(1)?,
        state: row.get(2)?,
        row_count: row.get(3)?,
        retired_threads: row.get(4)?,
        created_at_ms: row.get(5)?,
        updated_at_ms: row.get(6)?,
        mirror: row.get(7)?,
    };
    let checksum = row.get(8)?;
    Ok(RawRecord { columns, checksum })
}

/// The `leases` columns, in the order [`RawLease::from_row`] reads them, `checksum` last.
pub(super) const LEASE_COLUMNS: &str = concat!(lease_columns!(), ", checksum");

/// A `leases` row as stored: the columns both SQL backends keep, and their checksum.
pub(super) struct RawLease {
    pub(super) columns: LeaseColumns,
    pub(super) checksum: i64,
}

impl RawLease {
    pub(super) fn from_row(row: &Row<'_>) -> rusqlite::Result<RawLease> {
        let columns = LeaseColumns {
            session_id: row.get(0)?,
            host: row.get(1)?,
            pid: row.get(2)?,
            started_at_ms: row.get(3)?,
            instance: row.get(4)?,
            acquired_at_ms: row.get(5)?,
            expires_at_ms: row.get(6)?,
            fence: row.get(7)?,
            process_space: row.get(8)?,
            process_start: row.get(9)?,
            state: row.get(10)?,
        };
        let checksum = row.get(11)?;
        Ok(RawLease { columns, checksum })
    }

    pub(super) fn encode(grant: &Grant) -> RawLease {
        let columns = LeaseColumns::of(grant);
        let checksum = lease_checksum(&columns);
        RawLease { columns, checksum }
    }

    /// Verifies the row and decodes it.
    pub(super) fn into_grant(self, label: &str) -> Result<Grant> {
        let columns = self.columns;
        let what = || format!("lease of session {}", columns.session_id);
        verify(label, what, self.checksum, lease_checksum(&columns))?;
        columns.into_grant(label)
    }
}

fn lease_checksum(c: &LeaseColumns) -> i64 {
    Checksum::of("leases")
        .text(&c.session_id)
        .text(&c.host)
        .int(c.pid)
        .int(c.started_at_ms)
        .int(c.instance)
        .int(c.acquired_at_ms)
        .int(c.expires_at_ms)
        .int(c.fence)
        .opt_text(c.process_space.as_deref())
        .opt_int(c.process_start)
        .int(c.state)
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
