//! One transaction's view of a SQLite connection: what `logic` reads and writes.

use std::ops::Range;

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;

use super::codec::{
    corrupt_json, decode_record, raw_record, row_checksum, thread_checksum, RawLease, RawRecord,
    RawRow, LEASE_COLUMNS, RECORD_COLUMNS,
};
use super::error::map_sqlite_error;
use crate::checksum::verify;
use crate::logic::{ChunkSink, FileKey, Grant, LeaseTxn, ReadTxn, WriteTxn};
use crate::Result;
use crate::{SessionRecord, StoreError, TranscriptRow};

/// One transaction's view of a connection (the caller began and will end the transaction).
pub(super) struct Txn<'c> {
    pub(super) conn: &'c Connection,
    pub(super) label: &'c str,
}

impl Txn<'_> {
    fn map(&self, e: rusqlite::Error) -> StoreError {
        map_sqlite_error(self.label, e)
    }
}

impl ReadTxn for Txn<'_> {
    fn label(&self) -> &str {
        self.label
    }

    fn load(&mut self, session_id: &str) -> Result<Option<SessionRecord>> {
        let raw = self
            .conn
            .prepare_cached(&format!(
                "SELECT {RECORD_COLUMNS} FROM sessions WHERE session_id = ?1"
            ))
            .and_then(|mut s| s.query_row([session_id], raw_record).optional())
            .map_err(|e| self.map(e))?;
        raw.map(|raw| decode_record(self.label, raw)).transpose()
    }

    fn load_rows(&mut self, session_id: &str, range: Range<u64>) -> Result<Vec<TranscriptRow>> {
        let start = range.start.min(i64::MAX as u64) as i64;
        let end = range.end.min(i64::MAX as u64) as i64;
        let raw: Vec<RawRow> = self
            .conn
            .prepare_cached(&format!(
                "SELECT {} FROM transcript_rows \
                 WHERE session_id = ?1 AND seq >= ?2 AND seq < ?3 ORDER BY seq",
                RawRow::COLUMNS
            ))
            .and_then(|mut s| {
                s.query_map(params![session_id, start, end], RawRow::from_row)?
                    .collect()
            })
            .map_err(|e| self.map(e))?;
        raw.into_iter()
            .map(|raw| {
                raw.verify(self.label)?;
                let body = serde_json::from_str(&raw.body).map_err(|e| {
                    corrupt_json(self.label, format!("row {} of {session_id}", raw.seq), e)
                })?;
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
            Some(after) => self
                .conn
                .prepare_cached(&format!(
                    "SELECT {RECORD_COLUMNS} FROM sessions WHERE session_id > ?1 \
                     ORDER BY session_id LIMIT ?2"
                ))
                .and_then(|mut s| s.query_map(params![after, limit], raw_record)?.collect()),
            None => self
                .conn
                .prepare_cached(&format!(
                    "SELECT {RECORD_COLUMNS} FROM sessions ORDER BY session_id LIMIT ?1"
                ))
                .and_then(|mut s| s.query_map(params![limit], raw_record)?.collect()),
        }
        .map_err(|e| self.map(e))?;
        raw.into_iter()
            .map(|r| decode_record(self.label, r))
            .collect()
    }

    fn has_rows(&mut self, session_id: &str) -> Result<bool> {
        self.conn
            .prepare_cached("SELECT 1 FROM transcript_rows WHERE session_id = ?1 LIMIT 1")
            .and_then(|mut s| s.exists([session_id]))
            .map_err(|e| self.map(e))
    }

    fn thread_owner(&mut self, thread_id: &str) -> Result<Option<String>> {
        let row: Option<(String, i64)> = self
            .conn
            .prepare_cached("SELECT session_id, checksum FROM threads WHERE thread_id = ?1")
            .and_then(|mut s| {
                s.query_row([thread_id], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            })
            .map_err(|e| self.map(e))?;
        let Some((session_id, checksum)) = row else {
            return Ok(None);
        };
        verify(
            self.label,
            || format!("owner of thread {thread_id}"),
            checksum,
            thread_checksum(thread_id, &session_id),
        )?;
        Ok(Some(session_id))
    }

    fn session_threads(&mut self, session_id: &str) -> Result<Vec<String>> {
        let rows: Vec<(String, i64)> = self
            .conn
            .prepare_cached("SELECT thread_id, checksum FROM threads WHERE session_id = ?1")
            .and_then(|mut s| {
                s.query_map([session_id], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect()
            })
            .map_err(|e| self.map(e))?;
        for (thread_id, checksum) in &rows {
            verify(
                self.label,
                || format!("owner of thread {thread_id}"),
                *checksum,
                thread_checksum(thread_id, session_id),
            )?;
        }
        Ok(rows.into_iter().map(|(thread_id, _)| thread_id).collect())
    }

    fn load_chunks(&mut self, file: FileKey<'_>, range: Range<u64>, each: ChunkSink) -> Result<()> {
        let start = range.start.min(i64::MAX as u64) as i64;
        let end = range.end.min(i64::MAX as u64) as i64;
        let map = |e| map_sqlite_error(self.label, e);
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT seq, bytes, checksum FROM mirror_chunks WHERE session_id = ?1 \
                 AND thread_id = ?2 AND path = ?3 AND seq >= ?4 AND seq < ?5 ORDER BY seq",
            )
            .map_err(map)?;
        let mut rows = statement
            .query(params![
                file.session_id,
                file.thread_id,
                file.path,
                start,
                end
            ])
            .map_err(map)?;
        while let Some(row) = rows.next().map_err(map)? {
            let seq: i64 = row.get(0).map_err(map)?;
            let checksum: i64 = row.get(2).map_err(map)?;
            // Borrowed from SQLite's own buffer, valid until the next row.
            let bytes = row.get_ref(1).and_then(|v| Ok(v.as_blob()?)).map_err(map)?;
            verify(
                self.label,
                || format!("chunk {seq} of the mirror of {file}"),
                checksum,
                file.chunk_checksum(seq, bytes),
            )?;
            each(seq as u64, bytes)?;
        }
        Ok(())
    }

    fn row_ends(&mut self) -> Result<Vec<(String, bool)>> {
        let mut ends: Vec<String> = Vec::new();
        for order in ["ASC", "DESC"] {
            let end: Option<String> = self
                .conn
                .prepare_cached(&format!(
                    "SELECT session_id FROM transcript_rows ORDER BY session_id {order} LIMIT 1"
                ))
                .and_then(|mut s| s.query_row([], |r| r.get(0)).optional())
                .map_err(|e| self.map(e))?;
            ends.extend(end);
        }
        ends.dedup();
        ends.into_iter()
            .map(|id| {
                let has_record = self
                    .conn
                    .prepare_cached("SELECT 1 FROM sessions WHERE session_id = ?1")
                    .and_then(|mut s| s.exists([&id]))
                    .map_err(|e| self.map(e))?;
                Ok((id, has_record))
            })
            .collect()
    }
}

impl WriteTxn for Txn<'_> {
    fn put(&mut self, record: &SessionRecord) -> Result<()> {
        let raw = RawRecord::encode(record)?;
        self.conn
            .prepare_cached(&format!(
                "INSERT INTO sessions ({RECORD_COLUMNS}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
                 ON CONFLICT (session_id) DO UPDATE SET model_config = excluded.model_config, \
                 state = excluded.state, row_count = excluded.row_count, \
                 retired_threads = excluded.retired_threads, \
                 created_at_ms = excluded.created_at_ms, updated_at_ms = excluded.updated_at_ms, \
                 mirror = excluded.mirror, checksum = excluded.checksum"
            ))
            .and_then(|mut s| {
                let c = &raw.columns;
                s.execute(params![
                    c.session_id,
                    c.model_config,
                    c.state,
                    c.row_count,
                    c.retired_threads,
                    c.created_at_ms,
                    c.updated_at_ms,
                    c.mirror,
                    raw.checksum,
                ])
            })
            .map_err(|e| self.map(e))?;
        Ok(())
    }

    fn put_rows(&mut self, session_id: &str, first_seq: u64, bodies: &[Value]) -> Result<()> {
        // A plain INSERT: rows are append-only, and a duplicate key means the record's row
        // count is wrong, which must fail loudly rather than overwrite.
        let mut insert = self
            .conn
            .prepare_cached(
                "INSERT INTO transcript_rows (session_id, seq, body, checksum) \
                 VALUES (?1, ?2, ?3, ?4)",
            )
            .map_err(|e| map_sqlite_error(self.label, e))?;
        for (i, body) in bodies.iter().enumerate() {
            let seq = first_seq.saturating_add(i as u64).min(i64::MAX as u64) as i64;
            let body = body.to_string();
            let checksum = row_checksum(session_id, seq, &body);
            insert
                .execute(params![session_id, seq, body, checksum])
                .map_err(|e| map_sqlite_error(self.label, e))?;
        }
        Ok(())
    }

    fn put_thread_owner(&mut self, thread_id: &str, session_id: &str) -> Result<()> {
        let checksum = thread_checksum(thread_id, session_id);
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO threads (thread_id, session_id, checksum) \
                 VALUES (?1, ?2, ?3)",
            )
            .and_then(|mut s| s.execute(params![thread_id, session_id, checksum]))
            .map_err(|e| self.map(e))?;
        Ok(())
    }

    fn put_chunk(&mut self, file: FileKey<'_>, seq: u64, bytes: &[u8]) -> Result<()> {
        let seq = seq.min(i64::MAX as u64) as i64;
        let checksum = file.chunk_checksum(seq, bytes);
        // A plain INSERT: chunks are append-only; a duplicate key fails loudly.
        self.conn
            .prepare_cached(
                "INSERT INTO mirror_chunks (session_id, thread_id, path, seq, bytes, checksum) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    file.session_id,
                    file.thread_id,
                    file.path,
                    seq,
                    bytes,
                    checksum
                ])
            })
            .map_err(|e| self.map(e))?;
        Ok(())
    }

    fn remove_chunks(&mut self, file: FileKey<'_>, from: u64) -> Result<()> {
        let from = from.min(i64::MAX as u64) as i64;
        self.conn
            .prepare_cached(
                "DELETE FROM mirror_chunks WHERE session_id = ?1 AND thread_id = ?2 AND path = ?3 \
                 AND seq >= ?4",
            )
            .and_then(|mut s| s.execute(params![file.session_id, file.thread_id, file.path, from]))
            .map_err(|e| self.map(e))?;
        Ok(())
    }

    fn remove(&mut self, session_id: &str) -> Result<bool> {
        for table in ["transcript_rows", "threads", "mirror_chunks"] {
            self.conn
                .prepare_cached(&format!("DELETE FROM {table} WHERE session_id = ?1"))
                .and_then(|mut s| s.execute([session_id]))
                .map_err(|e| self.map(e))?;
        }
        let n = self
            .conn
            .prepare_cached("DELETE FROM sessions WHERE session_id = ?1")
            .and_then(|mut s| s.execute([session_id]))
            .map_err(|e| self.map(e))?;
        Ok(n > 0)
    }

    fn leases(&mut self) -> &mut dyn LeaseTxn {
        self
    }
}

impl LeaseTxn for Txn<'_> {
    fn load_lease(&mut self, session_id: &str) -> Result<Option<Grant>> {
        let raw = self
            .conn
            .prepare_cached(&format!(
                "SELECT {LEASE_COLUMNS} FROM leases WHERE session_id = ?1"
            ))
            .and_then(|mut s| s.query_row([session_id], RawLease::from_row).optional())
            .map_err(|e| self.map(e))?;
        raw.map(|raw| raw.into_grant(self.label)).transpose()
    }

    fn put_lease(&mut self, grant: &Grant) -> Result<()> {
        let raw = RawLease::encode(grant);
        self.conn
            .prepare_cached(&format!(
                "INSERT OR REPLACE INTO leases ({LEASE_COLUMNS}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
            ))
            .and_then(|mut s| {
                let c = &raw.columns;
                s.execute(params![
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
                    raw.checksum,
                ])
            })
            .map_err(|e| self.map(e))?;
        Ok(())
    }
}
