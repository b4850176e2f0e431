//! Record checksums for the SQLite backend (schema 2).
//!
//! SQLite checks its page structure (`PRAGMA quick_check`) but keeps no checksum of what a
//! page holds: a flipped byte inside a key or a value reads back as another key or value (found
//! by the `store_files` fuzz target). So every row of every table carries a CRC-32 of its
//! fields, written with the row and verified whenever the row is read. A checksum alone cannot
//! see a row whose *key* changed (a point lookup then misses it), so opening a store also scans
//! every record once: each checksum holds, and each session has exactly the rows
//! `0..row_count` and no other rows exist. Damage therefore opens as [`StoreError::Corrupt`],
//! never as a store that silently lacks or changes a record.

use rusqlite::{Connection, Row};

use crate::StoreError;

/// A CRC-32 over a record's fields, each written with a type tag and (for text) its length, so
/// that moving bytes from one field to the next changes the sum. The first field is the table,
/// so a row moved to another table does not verify either.
pub(crate) struct Checksum(crc32fast::Hasher);

impl Checksum {
    /// Starts the checksum of a row of `table`.
    pub(crate) fn of(table: &str) -> Self {
        Checksum(crc32fast::Hasher::new()).text(table)
    }

    /// Adds a text field.
    pub(crate) fn text(mut self, value: &str) -> Self {
        self.0.update(&[1]);
        self.0.update(&(value.len() as u64).to_le_bytes());
        self.0.update(value.as_bytes());
        self
    }

    /// Adds a text field that may be NULL.
    pub(crate) fn opt_text(mut self, value: Option<&str>) -> Self {
        match value {
            Some(v) => self.text(v),
            None => {
                self.0.update(&[0]);
                self
            }
        }
    }

    /// Adds an integer field.
    pub(crate) fn int(mut self, value: i64) -> Self {
        self.0.update(&[2]);
        self.0.update(&value.to_le_bytes());
        self
    }

    /// Adds an integer field that may be NULL.
    pub(crate) fn opt_int(mut self, value: Option<i64>) -> Self {
        match value {
            Some(v) => self.int(v),
            None => {
                self.0.update(&[0]);
                self
            }
        }
    }

    /// The sum, as stored in the row's `checksum` column.
    pub(crate) fn finish(self) -> i64 {
        i64::from(self.0.finalize())
    }
}

/// The checksum of a `transcript_rows` row.
pub(crate) fn row_checksum(session_id: &str, seq: i64, body: &str) -> i64 {
    Checksum::of("transcript_rows")
        .text(session_id)
        .int(seq)
        .text(body)
        .finish()
}

/// Fails with `Corrupt` unless `stored` is `computed`.
pub(crate) fn verify(
    label: &str,
    what: impl FnOnce() -> String,
    stored: i64,
    computed: i64,
) -> Result<(), StoreError> {
    if stored == computed {
        return Ok(());
    }
    Err(StoreError::corrupt(
        label,
        format!(
            "{}: checksum mismatch (stored {stored:#x}, contents give {computed:#x}): \
             the record was changed outside rethread",
            what()
        ),
    ))
}

/// One `transcript_rows` row as stored.
pub(crate) struct RawRow {
    pub(crate) session_id: String,
    pub(crate) seq: i64,
    pub(crate) body: String,
    pub(crate) checksum: i64,
}

impl RawRow {
    /// The columns [`RawRow::from_row`] reads, in order.
    pub(crate) const COLUMNS: &'static str = "session_id, seq, body, checksum";

    pub(crate) fn from_row(row: &Row<'_>) -> rusqlite::Result<RawRow> {
        Ok(RawRow {
            session_id: row.get(0)?,
            seq: row.get(1)?,
            body: row.get(2)?,
            checksum: row.get(3)?,
        })
    }

    /// Checks the row's checksum.
    pub(crate) fn verify(&self, label: &str) -> Result<(), StoreError> {
        verify(
            label,
            || format!("row {} of session {}", self.seq, self.session_id),
            self.checksum,
            row_checksum(&self.session_id, self.seq, &self.body),
        )
    }
}

/// What a full scan needs to know about one session row.
pub(crate) struct ScannedSession {
    pub(crate) session_id: String,
    pub(crate) row_count: u64,
}

/// Reads every record of the store in one snapshot and checks it: every session decodes and
/// verifies (`session` does that and says how many rows it claims), every row verifies, each
/// session has exactly the rows `0..row_count`, and no row belongs to no session. Every lease
/// verifies (`lease` checks one). Runs on open, after `PRAGMA quick_check`.
pub(crate) fn verify_all(
    conn: &mut Connection,
    label: &str,
    sessions_query: &str,
    session: &dyn Fn(&Row<'_>) -> Result<ScannedSession, StoreError>,
    leases_query: &str,
    lease: &dyn Fn(&Row<'_>) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let map = |e| crate::sqlite_store::map_sqlite_error(label, e);
    // One deferred transaction: the two scans see the same committed state even while another
    // process writes.
    let txn = conn.transaction().map_err(map)?;
    {
        let mut sessions_stmt = txn.prepare(sessions_query).map_err(map)?;
        let mut rows_stmt = txn
            .prepare(&format!(
                "SELECT {} FROM transcript_rows ORDER BY session_id, seq",
                RawRow::COLUMNS
            ))
            .map_err(map)?;
        let mut sessions = sessions_stmt.query([]).map_err(map)?;
        let mut rows = rows_stmt.query([]).map_err(map)?;
        let mut next_row = || -> Result<Option<RawRow>, StoreError> {
            match rows.next().map_err(map)? {
                Some(row) => {
                    let raw = RawRow::from_row(row).map_err(map)?;
                    raw.verify(label)?;
                    Ok(Some(raw))
                }
                None => Ok(None),
            }
        };
        // Both scans are in key order, so they are merged: the rows of each session must
        // follow one another with seq 0, 1, ... row_count - 1.
        let mut pending = next_row()?;
        while let Some(row) = sessions.next().map_err(map)? {
            let scanned = session(row)?;
            for expected in 0..scanned.row_count {
                match pending.take() {
                    Some(r) if r.session_id == scanned.session_id && r.seq as u64 == expected => {}
                    found => {
                        return Err(StoreError::corrupt(
                            label,
                            format!(
                                "session {} claims {} rows but row {expected} is missing \
                                 (next row found: {})",
                                scanned.session_id,
                                scanned.row_count,
                                describe(found.as_ref())
                            ),
                        ))
                    }
                }
                pending = next_row()?;
            }
            if let Some(r) = &pending {
                if r.session_id <= scanned.session_id {
                    return Err(stray(label, r));
                }
            }
        }
        if let Some(r) = &pending {
            return Err(stray(label, r));
        }
        let mut leases_stmt = txn.prepare(leases_query).map_err(map)?;
        let mut leases = leases_stmt.query([]).map_err(map)?;
        while let Some(row) = leases.next().map_err(map)? {
            lease(row)?;
        }
    }
    txn.commit().map_err(map)
}

fn describe(row: Option<&RawRow>) -> String {
    match row {
        Some(r) => format!("row {} of session {}", r.seq, r.session_id),
        None => "none".to_string(),
    }
}

fn stray(label: &str, row: &RawRow) -> StoreError {
    StoreError::corrupt(
        label,
        format!(
            "{} belongs to no session or lies past its session's row count",
            describe(Some(row))
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_delimited() {
        // Bytes moved between adjacent fields must change the sum.
        let a = Checksum::of("t").text("ab").text("c").finish();
        let b = Checksum::of("t").text("a").text("bc").finish();
        assert_ne!(a, b);
        let none = Checksum::of("t").opt_text(None).finish();
        let empty = Checksum::of("t").opt_text(Some("")).finish();
        assert_ne!(none, empty);
        assert_ne!(
            Checksum::of("t").opt_int(None).finish(),
            Checksum::of("t").opt_int(Some(0)).finish()
        );
    }

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
