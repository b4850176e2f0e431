//! One transaction's view of a SQLite connection (what `logic` reads and writes), and the rows
//! as stored. SQLite keeps no checksum of what a page holds, so every row of every table
//! carries a CRC-32 of its fields (`checksum.rs`), verified whenever the row is read.

use std::ops::Range;

use rusqlite::{params, Connection, OptionalExtension, Params, Row};
use serde_json::Value;

use super::SqliteResult;
use crate::checksum::{thread_checksum, verify, Checksum};
use crate::logic::{ChunkSink, FileKey, Grant, LeaseTxn, ReadTxn, WriteTxn};
use crate::sql_columns::{lease_columns, record_columns, LeaseColumns, RecordColumns};
use crate::Result;
use crate::{SessionRecord, StoreError, TranscriptRow};

/// One transaction's view of a connection (the caller began and will end the transaction).
pub(super) struct Txn<'c> {
    pub(super) conn: &'c Connection,
    pub(super) label: &'c str,
    /// Whether this transaction removed a session (its pages are then scrubbed and the WAL
    /// checkpointed after the commit).
    pub(super) removed: bool,
}

impl<'c> Txn<'c> {
    pub(super) fn new(conn: &'c Connection, label: &'c str) -> Self {
        Txn {
            conn,
            label,
            removed: false,
        }
    }
}

/// A key or count as SQLite stores it (`i64`).
fn int(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}

impl Txn<'_> {
    /// Runs `sql` (a cached statement); how many rows it changed.
    fn exec(&self, sql: &str, params: impl Params) -> Result<usize> {
        let mut statement = self.conn.prepare_cached(sql).sqlite(self.label)?;
        statement.execute(params).sqlite(self.label)
    }

    /// The first row `sql` selects, read by `f`.
    fn one<T>(
        &self,
        sql: &str,
        params: impl Params,
        f: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Option<T>> {
        let mut statement = self.conn.prepare_cached(sql).sqlite(self.label)?;
        statement.query_row(params, f).optional().sqlite(self.label)
    }

    /// Every row `sql` selects, read by `f`.
    fn all<T>(
        &self,
        sql: &str,
        params: impl Params,
        f: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>> {
        let mut statement = self.conn.prepare_cached(sql).sqlite(self.label)?;
        let rows = statement.query_map(params, f).sqlite(self.label)?;
        rows.collect::<rusqlite::Result<_>>().sqlite(self.label)
    }

    /// Verifies the checksum of the `threads` row saying `session_id` owns `thread_id`.
    fn verify_owner(&self, thread_id: &str, session_id: &str, checksum: i64) -> Result<()> {
        let what = || format!("owner of thread {thread_id}");
        verify(
            self.label,
            what,
            checksum,
            thread_checksum(thread_id, session_id.as_bytes()),
        )
    }
}

impl ReadTxn for Txn<'_> {
    fn label(&self) -> &str {
        self.label
    }

    fn load(&mut self, session_id: &str) -> Result<Option<SessionRecord>> {
        let sql = format!("SELECT {RECORD_COLUMNS} FROM sessions WHERE session_id = ?1");
        let raw = self.one(&sql, [session_id], raw_record)?;
        raw.map(|raw| decode_record(self.label, raw)).transpose()
    }

    fn load_rows(&mut self, session_id: &str, range: Range<u64>) -> Result<Vec<TranscriptRow>> {
        let sql = format!(
            "SELECT {} FROM transcript_rows \
             WHERE session_id = ?1 AND seq >= ?2 AND seq < ?3 ORDER BY seq",
            RawRow::COLUMNS
        );
        let params = params![session_id, int(range.start), int(range.end)];
        let raw = self.all(&sql, params, RawRow::from_row)?;
        raw.into_iter()
            .map(|raw| {
                raw.verify(self.label)?;
                let what = || format!("row {} of {session_id}", raw.seq);
                let body = serde_json::from_str(&raw.body)
                    .map_err(|e| StoreError::corrupt_json(self.label, what(), e))?;
                Ok(TranscriptRow {
                    seq: raw.seq as u64,
                    body,
                })
            })
            .collect()
    }

    fn list(&mut self, after: Option<&str>, limit: usize) -> Result<Vec<SessionRecord>> {
        let limit = limit.min(i64::MAX as usize) as i64;
        let raw: Vec<RawRecord> = match after {
            Some(after) => {
                let sql = format!(
                    "SELECT {RECORD_COLUMNS} FROM sessions WHERE session_id > ?1 \
                     ORDER BY session_id LIMIT ?2"
                );
                self.all(&sql, params![after, limit], raw_record)?
            }
            None => {
                let sql =
                    format!("SELECT {RECORD_COLUMNS} FROM sessions ORDER BY session_id LIMIT ?1");
                self.all(&sql, [limit], raw_record)?
            }
        };
        raw.into_iter()
            .map(|r| decode_record(self.label, r))
            .collect()
    }

    fn has_rows(&mut self, session_id: &str) -> Result<bool> {
        let sql = "SELECT 1 FROM transcript_rows WHERE session_id = ?1 LIMIT 1";
        Ok(self.one(sql, [session_id], |_| Ok(()))?.is_some())
    }

    fn stale_leases(&mut self, after: &str, cutoff: i64, limit: usize) -> Result<Vec<String>> {
        let sql = "SELECT session_id FROM leases l WHERE session_id > ?1 AND expires_at_ms < ?2 \
                   AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.session_id = l.session_id) \
                   ORDER BY session_id LIMIT ?3";
        let limit = limit.min(i64::MAX as usize) as i64;
        self.all(sql, params![after, cutoff, limit], |r| r.get(0))
    }

    fn row_bytes(&mut self, session_id: &str) -> Result<u64> {
        let sql = "SELECT coalesce(sum(length(CAST(body AS BLOB))), 0) FROM transcript_rows \
                   WHERE session_id = ?1";
        let bytes: Option<i64> = self.one(sql, [session_id], |r| r.get(0))?;
        Ok(bytes.unwrap_or(0).max(0) as u64)
    }

    fn thread_owner(&mut self, thread_id: &str) -> Result<Option<String>> {
        let sql = "SELECT session_id, checksum FROM threads WHERE thread_id = ?1";
        let row: Option<(String, i64)> =
            self.one(sql, [thread_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        let Some((session_id, checksum)) = row else {
            return Ok(None);
        };
        self.verify_owner(thread_id, &session_id, checksum)?;
        Ok(Some(session_id))
    }

    fn session_threads(&mut self, session_id: &str) -> Result<Vec<String>> {
        let sql = "SELECT thread_id, checksum FROM threads WHERE session_id = ?1";
        let rows: Vec<(String, i64)> =
            self.all(sql, [session_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        for (thread_id, checksum) in &rows {
            self.verify_owner(thread_id, session_id, *checksum)?;
        }
        Ok(rows.into_iter().map(|(thread_id, _)| thread_id).collect())
    }

    fn load_chunks(&mut self, file: FileKey<'_>, range: Range<u64>, each: ChunkSink) -> Result<()> {
        let label = self.label;
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT seq, bytes, checksum FROM mirror_chunks WHERE session_id = ?1 \
                 AND thread_id = ?2 AND path = ?3 AND seq >= ?4 AND seq < ?5 ORDER BY seq",
            )
            .sqlite(label)?;
        let FileKey {
            session_id,
            thread_id,
            path,
        } = file;
        let params = params![
            session_id,
            thread_id,
            path,
            int(range.start),
            int(range.end)
        ];
        let mut rows = statement.query(params).sqlite(label)?;
        while let Some(row) = rows.next().sqlite(label)? {
            let seq: i64 = row.get(0).sqlite(label)?;
            let checksum: i64 = row.get(2).sqlite(label)?;
            // Borrowed from SQLite's own buffer, valid until the next row.
            let bytes = row
                .get_ref(1)
                .and_then(|v| Ok(v.as_blob()?))
                .sqlite(label)?;
            let what = || format!("chunk {seq} of the mirror of {file}");
            verify(label, what, checksum, file.chunk_checksum(seq, bytes))?;
            each(seq as u64, bytes)?;
        }
        Ok(())
    }

    fn row_ends(&mut self) -> Result<Vec<(String, bool)>> {
        let mut ends: Vec<String> = Vec::new();
        for order in ["ASC", "DESC"] {
            let sql = format!(
                "SELECT session_id FROM transcript_rows ORDER BY session_id {order} LIMIT 1"
            );
            ends.extend(self.one(&sql, [], |r| r.get(0))?);
        }
        ends.dedup();
        ends.into_iter()
            .map(|id| {
                let sql = "SELECT 1 FROM sessions WHERE session_id = ?1";
                let has_record = self.one(sql, [&id], |_| Ok(()))?.is_some();
                Ok((id, has_record))
            })
            .collect()
    }
}

impl WriteTxn for Txn<'_> {
    fn put(&mut self, record: &SessionRecord) -> Result<()> {
        let c = &RecordColumns::of(record)?;
        let sql = format!(
            "INSERT INTO sessions ({RECORD_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
             ON CONFLICT (session_id) DO UPDATE SET model_config = excluded.model_config, \
             state = excluded.state, row_count = excluded.row_count, \
             retired_threads = excluded.retired_threads, \
             created_at_ms = excluded.created_at_ms, updated_at_ms = excluded.updated_at_ms, \
             mirror = excluded.mirror, checksum = excluded.checksum"
        );
        let params = params![
            c.session_id,
            c.model_config,
            c.state,
            c.row_count,
            c.retired_threads,
            c.created_at_ms,
            c.updated_at_ms,
            c.mirror,
            record_checksum(c),
        ];
        self.exec(&sql, params)?;
        Ok(())
    }

    /// A plain INSERT, for rows and chunks: they are append-only, and a duplicate key means
    /// the record's count is wrong, which must fail loudly rather than overwrite.
    fn put_rows(&mut self, session_id: &str, first_seq: u64, bodies: &[Value]) -> Result<()> {
        let mut insert = self
            .conn
            .prepare_cached(
                "INSERT INTO transcript_rows (session_id, seq, body, checksum) \
                 VALUES (?1, ?2, ?3, ?4)",
            )
            .sqlite(self.label)?;
        for (i, body) in bodies.iter().enumerate() {
            let seq = int(first_seq.saturating_add(i as u64));
            let body = body.to_string();
            let checksum = row_checksum(session_id, seq, &body);
            let params = params![session_id, seq, body, checksum];
            insert.execute(params).sqlite(self.label)?;
        }
        Ok(())
    }

    fn put_thread_owner(&mut self, thread_id: &str, session_id: &str) -> Result<()> {
        let checksum = thread_checksum(thread_id, session_id.as_bytes());
        let sql = "INSERT OR REPLACE INTO threads (thread_id, session_id, checksum) \
                   VALUES (?1, ?2, ?3)";
        self.exec(sql, params![thread_id, session_id, checksum])?;
        Ok(())
    }

    fn put_chunk(&mut self, file: FileKey<'_>, seq: u64, bytes: &[u8]) -> Result<()> {
        let seq = int(seq);
        let checksum = file.chunk_checksum(seq, bytes);
        let sql = "INSERT INTO mirror_chunks (session_id, thread_id, path, seq, bytes, checksum) \
                   VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
        let FileKey {
            session_id,
            thread_id,
            path,
        } = file;
        self.exec(
            sql,
            params![session_id, thread_id, path, seq, bytes, checksum],
        )?;
        Ok(())
    }

    fn remove_chunks(&mut self, file: FileKey<'_>, from: u64) -> Result<()> {
        let sql = "DELETE FROM mirror_chunks WHERE session_id = ?1 AND thread_id = ?2 \
                   AND path = ?3 AND seq >= ?4";
        let params = params![file.session_id, file.thread_id, file.path, int(from)];
        self.exec(sql, params)?;
        Ok(())
    }

    fn remove(&mut self, session_id: &str) -> Result<bool> {
        for table in ["transcript_rows", "threads", "mirror_chunks"] {
            self.exec(
                &format!("DELETE FROM {table} WHERE session_id = ?1"),
                [session_id],
            )?;
        }
        let removed = self.exec("DELETE FROM sessions WHERE session_id = ?1", [session_id])?;
        self.removed = true;
        Ok(removed > 0)
    }

    /// One step of the upkeep after this commit (as after a removal: the engine's `maintain`,
    /// which gives back at most [`super::VACUUM_STEP_PAGES`] pages); returns the free pages
    /// before it. A store without `auto_vacuum = INCREMENTAL` gives none back: 0.
    fn reclaim(&mut self) -> Result<u64> {
        self.removed = true;
        let pragma = |name: &str| {
            let sql = format!("PRAGMA {name}");
            self.conn
                .query_row(&sql, [], |r| r.get::<_, i64>(0))
                .sqlite(self.label)
        };
        if pragma("auto_vacuum")? != 2 {
            return Ok(0);
        }
        Ok(u64::try_from(pragma("freelist_count")?).unwrap_or(0))
    }

    fn leases(&mut self) -> &mut dyn LeaseTxn {
        self
    }
}

impl LeaseTxn for Txn<'_> {
    fn load_lease(&mut self, session_id: &str) -> Result<Option<Grant>> {
        let sql = format!("SELECT {LEASE_COLUMNS} FROM leases WHERE session_id = ?1");
        let raw = self.one(&sql, [session_id], raw_lease)?;
        raw.map(|raw| decode_lease(self.label, raw)).transpose()
    }

    fn put_lease(&mut self, grant: &Grant) -> Result<()> {
        let c = &LeaseColumns::of(grant);
        let sql = format!(
            "INSERT OR REPLACE INTO leases ({LEASE_COLUMNS}) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
        );
        let params = params![
            c.session_id,
            c.host,
            c.pid,
            c.started_at_ms,
            c.instance,
            c.acquired_at_ms,
            c.expires_at_ms,
            c.fence,
            c.process_space,
            c.process_start,
            c.state,
            lease_checksum(c),
        ];
        self.exec(&sql, params)?;
        Ok(())
    }

    fn remove_lease(&mut self, session_id: &str) -> Result<()> {
        self.exec("DELETE FROM leases WHERE session_id = ?1", [session_id])?;
        Ok(())
    }
}

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
pub(super) type RawRecord = (RecordColumns, i64);

/// Verifies a stored session row and decodes it.
pub(super) fn decode_record(label: &str, (columns, checksum): RawRecord) -> Result<SessionRecord> {
    let what = || format!("session {}", columns.session_id);
    verify(label, what, checksum, record_checksum(&columns))?;
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
    Ok((columns, row.get(8)?))
}

/// The `leases` columns, in the order `raw_lease` reads them, `checksum` last.
pub(super) const LEASE_COLUMNS: &str = concat!(lease_columns!(), ", checksum");

/// A `leases` row as stored: the columns both SQL backends keep, and their checksum.
pub(super) fn raw_lease(row: &Row<'_>) -> rusqlite::Result<(LeaseColumns, i64)> {
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
    Ok((columns, row.get(11)?))
}

/// Verifies a stored lease row and decodes it.
pub(super) fn decode_lease(label: &str, (columns, checksum): (LeaseColumns, i64)) -> Result<Grant> {
    let what = || format!("lease of session {}", columns.session_id);
    verify(label, what, checksum, lease_checksum(&columns))?;
    columns.into_grant(label)
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
