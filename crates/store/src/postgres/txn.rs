//! One live PostgreSQL transaction as `logic` sees it, and the rows of its tables to and from
//! the crate's types.

use std::ops::Range;

use postgres::fallible_iterator::FallibleIterator;
use postgres::types::ToSql;
use postgres::{Row, Transaction};
use serde_json::{Map, Value};

use super::error::map_postgres_error;
use super::sql::Statements;
use crate::lease_columns::LeaseColumns;
use crate::logic::{check_record, ChunkSink, FileKey, Grant, LeaseTxn, ReadTxn, WriteTxn};
use crate::Result;
use crate::{BindingState, MirrorState, SessionRecord, StoreError, TranscriptRow};

/// A transaction on a connection and that connection's statements.
pub(super) struct Txn<'a, 't> {
    pub(super) txn: &'a mut Transaction<'t>,
    pub(super) sql: &'a Statements,
    pub(super) label: &'a str,
}

impl Txn<'_, '_> {
    fn map(&self, e: postgres::Error) -> StoreError {
        map_postgres_error(self.label, e)
    }

    fn corrupt_json(&self, what: String, e: serde_json::Error) -> StoreError {
        StoreError::Corrupt {
            path: self.label.to_string(),
            detail: format!("{what} does not decode"),
            source: Some(Box::new(e)),
        }
    }

    fn decode_record(&self, row: &Row) -> Result<SessionRecord> {
        let id: String = row.get(0);
        let model_config: Map<String, Value> = serde_json::from_str(row.get(1))
            .map_err(|e| self.corrupt_json(format!("model_config of {id}"), e))?;
        let state: BindingState = serde_json::from_str(row.get(2))
            .map_err(|e| self.corrupt_json(format!("state of {id}"), e))?;
        let retired_threads: Vec<String> = serde_json::from_str(row.get(4))
            .map_err(|e| self.corrupt_json(format!("retired_threads of {id}"), e))?;
        let mirror: MirrorState = serde_json::from_str(row.get(7))
            .map_err(|e| self.corrupt_json(format!("mirror of {id}"), e))?;
        let record = SessionRecord {
            session_id: id.clone(),
            model_config,
            state,
            row_count: row.get::<_, i64>(3) as u64,
            retired_threads,
            created_at_ms: row.get(5),
            updated_at_ms: row.get(6),
            mirror,
        };
        check_record(&record)
            .map_err(|d| StoreError::corrupt(self.label, format!("session {id}: {d}")))?;
        Ok(record)
    }
}

fn encode<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| StoreError::Internal(format!("encoding JSON: {e}")))
}

fn clamp(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}

impl ReadTxn for Txn<'_, '_> {
    fn label(&self) -> &str {
        self.label
    }

    fn load(&mut self, session_id: &str) -> Result<Option<SessionRecord>> {
        let row = self
            .txn
            .query_opt(&self.sql.load, &[&session_id])
            .map_err(|e| self.map(e))?;
        row.map(|row| self.decode_record(&row)).transpose()
    }

    fn load_rows(&mut self, session_id: &str, range: Range<u64>) -> Result<Vec<TranscriptRow>> {
        let (start, end) = (clamp(range.start), clamp(range.end));
        let rows = self
            .txn
            .query(&self.sql.rows, &[&session_id, &start, &end])
            .map_err(|e| self.map(e))?;
        rows.iter()
            .map(|r| {
                let seq: i64 = r.get(0);
                let body = serde_json::from_str(r.get(1))
                    .map_err(|e| self.corrupt_json(format!("row {seq} of {session_id}"), e))?;
                Ok(TranscriptRow {
                    seq: seq as u64,
                    body,
                })
            })
            .collect()
    }

    fn list(&mut self, after: Option<&str>, limit: usize) -> Result<Vec<SessionRecord>> {
        let limit = limit.min(i64::MAX as usize) as i64;
        let rows = match after {
            Some(after) => self.txn.query(&self.sql.list_after, &[&after, &limit]),
            None => self.txn.query(&self.sql.list_all, &[&limit]),
        }
        .map_err(|e| self.map(e))?;
        rows.iter().map(|r| self.decode_record(r)).collect()
    }

    fn has_rows(&mut self, session_id: &str) -> Result<bool> {
        let row = self
            .txn
            .query_one(&self.sql.has_rows, &[&session_id])
            .map_err(|e| self.map(e))?;
        Ok(row.get(0))
    }

    fn thread_owner(&mut self, thread_id: &str) -> Result<Option<String>> {
        let row = self
            .txn
            .query_opt(&self.sql.thread_owner, &[&thread_id])
            .map_err(|e| self.map(e))?;
        Ok(row.map(|r| r.get(0)))
    }

    fn load_chunks(&mut self, file: FileKey<'_>, range: Range<u64>, each: ChunkSink) -> Result<()> {
        let (start, end) = (clamp(range.start), clamp(range.end));
        let params: [&(dyn ToSql + Sync); 5] =
            [&file.session_id, &file.thread_id, &file.path, &start, &end];
        // Row by row as the server sends them: a long mirror is never all in memory.
        let label = self.label;
        let mut rows = self
            .txn
            .query_raw(&self.sql.chunks, params)
            .map_err(|e| map_postgres_error(label, e))?;
        while let Some(r) = rows.next().map_err(|e| map_postgres_error(label, e))? {
            each(r.get::<_, i64>(0) as u64, r.get::<_, &[u8]>(1))?;
        }
        Ok(())
    }

    fn row_ends(&mut self) -> Result<Vec<(String, bool)>> {
        let rows = self
            .txn
            .query(&self.sql.row_ends, &[])
            .map_err(|e| self.map(e))?;
        let mut ends: Vec<(String, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        ends.dedup();
        Ok(ends)
    }
}

impl WriteTxn for Txn<'_, '_> {
    fn put(&mut self, record: &SessionRecord) -> Result<()> {
        let config = encode(&record.model_config)?;
        let state = encode(&record.state)?;
        let retired = encode(&record.retired_threads)?;
        let mirror = encode(&record.mirror)?;
        self.txn
            .execute(
                &self.sql.put,
                &[
                    &record.session_id,
                    &config,
                    &state,
                    &clamp(record.row_count),
                    &retired,
                    &record.created_at_ms,
                    &record.updated_at_ms,
                    &mirror,
                ],
            )
            .map_err(|e| self.map(e))?;
        Ok(())
    }

    fn put_rows(&mut self, session_id: &str, first_seq: u64, bodies: &[Value]) -> Result<()> {
        if bodies.is_empty() {
            return Ok(());
        }
        let seqs: Vec<i64> = (0..bodies.len() as u64)
            .map(|i| clamp(first_seq + i))
            .collect();
        let bodies: Vec<String> = bodies.iter().map(Value::to_string).collect();
        self.txn
            .execute(&self.sql.put_rows, &[&session_id, &seqs, &bodies])
            .map_err(|e| self.map(e))?;
        Ok(())
    }

    fn put_thread_owner(&mut self, thread_id: &str, session_id: &str) -> Result<()> {
        self.txn
            .execute(&self.sql.put_thread, &[&thread_id, &session_id])
            .map_err(|e| self.map(e))?;
        Ok(())
    }

    fn put_chunk(&mut self, file: FileKey<'_>, seq: u64, bytes: &[u8]) -> Result<()> {
        self.txn
            .execute(
                &self.sql.put_chunk,
                &[
                    &file.session_id,
                    &file.thread_id,
                    &file.path,
                    &clamp(seq),
                    &bytes,
                ],
            )
            .map_err(|e| self.map(e))?;
        Ok(())
    }

    fn remove_chunks(&mut self, file: FileKey<'_>, from: u64) -> Result<()> {
        self.txn
            .execute(
                &self.sql.remove_chunks,
                &[&file.session_id, &file.thread_id, &file.path, &clamp(from)],
            )
            .map_err(|e| self.map(e))?;
        Ok(())
    }

    fn remove(&mut self, session_id: &str) -> Result<bool> {
        for statement in [
            &self.sql.remove_rows,
            &self.sql.remove_threads,
            &self.sql.remove_session_chunks,
        ] {
            self.txn
                .execute(statement, &[&session_id])
                .map_err(|e| map_postgres_error(self.label, e))?;
        }
        let removed = self
            .txn
            .execute(&self.sql.remove, &[&session_id])
            .map_err(|e| self.map(e))?;
        Ok(removed > 0)
    }

    fn leases(&mut self) -> &mut dyn LeaseTxn {
        self
    }
}

impl LeaseTxn for Txn<'_, '_> {
    fn load_lease(&mut self, session_id: &str) -> Result<Option<Grant>> {
        let row = self
            .txn
            .query_opt(&self.sql.load_lease, &[&session_id])
            .map_err(|e| self.map(e))?;
        let Some(r) = row else {
            return Ok(None);
        };
        let columns = LeaseColumns {
            session_id: r.get(0),
            host: r.get(1),
            pid: r.get(2),
            started_at_ms: r.get(3),
            instance: r.get(4),
            acquired_at_ms: r.get(5),
            expires_at_ms: r.get(6),
            fence: r.get(7),
            process_space: r.get(8),
            process_start: r.get(9),
            state: r.get(10),
        };
        columns.into_grant(self.label).map(Some)
    }

    fn put_lease(&mut self, grant: &Grant) -> Result<()> {
        let c = LeaseColumns::of(grant);
        self.txn
            .execute(
                &self.sql.put_lease,
                &[
                    &c.session_id,
                    &c.host,
                    &c.pid,
                    &c.started_at_ms,
                    &c.instance,
                    &c.acquired_at_ms,
                    &c.expires_at_ms,
                    &c.fence,
                    &c.process_space,
                    &c.process_start,
                    &c.state,
                ],
            )
            .map_err(|e| self.map(e))?;
        Ok(())
    }
}
