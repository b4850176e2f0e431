//! One live PostgreSQL transaction as `logic` sees it, and the rows of its tables to and from
//! the crate's types.

use std::ops::Range;

use postgres::fallible_iterator::FallibleIterator;
use postgres::types::ToSql;
use postgres::{Row, Statement, Transaction};
use serde_json::Value;

use super::error::PgResult;
use super::sql::Statements;
use crate::logic::{ChunkSink, FileKey, Grant, LeaseTxn, ReadTxn, WriteTxn};
use crate::sql_columns::{LeaseColumns, RecordColumns};
use crate::Result;
use crate::{SessionRecord, StoreError, TranscriptRow};

/// A transaction on a connection and that connection's statements.
pub(super) struct Txn<'a, 't> {
    pub(super) txn: &'a mut Transaction<'t>,
    pub(super) sql: &'a Statements,
    pub(super) label: &'a str,
}

type Params<'p> = &'p [&'p (dyn ToSql + Sync)];

impl Txn<'_, '_> {
    fn query(&mut self, statement: &Statement, params: Params<'_>) -> Result<Vec<Row>> {
        self.txn.query(statement, params).pg(self.label)
    }

    fn query_opt(&mut self, statement: &Statement, params: Params<'_>) -> Result<Option<Row>> {
        self.txn.query_opt(statement, params).pg(self.label)
    }

    fn execute(&mut self, statement: &Statement, params: Params<'_>) -> Result<u64> {
        self.txn.execute(statement, params).pg(self.label)
    }

    fn decode_record(&self, row: &Row) -> Result<SessionRecord> {
        let columns = RecordColumns {
            session_id: row.get(0),
            model_config: row.get(1),
            state: row.get(2),
            row_count: row.get(3),
            retired_threads: row.get(4),
            created_at_ms: row.get(5),
            updated_at_ms: row.get(6),
            mirror: row.get(7),
        };
        columns.into_record(self.label)
    }
}

fn clamp(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}

impl ReadTxn for Txn<'_, '_> {
    fn label(&self) -> &str {
        self.label
    }

    fn load(&mut self, session_id: &str) -> Result<Option<SessionRecord>> {
        let row = self.query_opt(&self.sql.load, &[&session_id])?;
        row.map(|row| self.decode_record(&row)).transpose()
    }

    fn load_rows(&mut self, session_id: &str, range: Range<u64>) -> Result<Vec<TranscriptRow>> {
        let (start, end) = (clamp(range.start), clamp(range.end));
        let rows = self.query(&self.sql.rows, &[&session_id, &start, &end])?;
        rows.iter()
            .map(|r| {
                let seq: i64 = r.get(0);
                let what = || format!("row {seq} of {session_id}");
                let body = serde_json::from_str(r.get(1))
                    .map_err(|e| StoreError::corrupt_json(self.label, what(), e))?;
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
            Some(after) => self.query(&self.sql.list_after, &[&after, &limit])?,
            None => self.query(&self.sql.list_all, &[&limit])?,
        };
        rows.iter().map(|r| self.decode_record(r)).collect()
    }

    fn has_rows(&mut self, session_id: &str) -> Result<bool> {
        let row = self.txn.query_one(&self.sql.has_rows, &[&session_id]);
        Ok(row.pg(self.label)?.get(0))
    }

    fn stale_leases(&mut self, after: &str, cutoff: i64, limit: usize) -> Result<Vec<String>> {
        let limit = limit.min(i64::MAX as usize) as i64;
        let rows = self.query(&self.sql.stale_leases, &[&after, &cutoff, &limit])?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    fn row_bytes(&mut self, session_id: &str) -> Result<u64> {
        let row = self.txn.query_one(&self.sql.row_bytes, &[&session_id]);
        Ok(row.pg(self.label)?.get::<_, i64>(0).max(0) as u64)
    }

    fn thread_owner(&mut self, thread_id: &str) -> Result<Option<String>> {
        let row = self.query_opt(&self.sql.thread_owner, &[&thread_id])?;
        Ok(row.map(|r| r.get(0)))
    }

    fn session_threads(&mut self, session_id: &str) -> Result<Vec<String>> {
        let rows = self.query(&self.sql.session_threads, &[&session_id])?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    fn load_chunks(&mut self, file: FileKey<'_>, range: Range<u64>, each: ChunkSink) -> Result<()> {
        let (start, end) = (clamp(range.start), clamp(range.end));
        let params: [&(dyn ToSql + Sync); 5] =
            [&file.session_id, &file.thread_id, &file.path, &start, &end];
        // Row by row as the server sends them: a long mirror is never all in memory.
        let rows = self.txn.query_raw(&self.sql.chunks, params);
        let mut rows = rows.pg(self.label)?;
        while let Some(r) = rows.next().pg(self.label)? {
            each(r.get::<_, i64>(0) as u64, r.get::<_, &[u8]>(1))?;
        }
        Ok(())
    }

    fn row_ends(&mut self) -> Result<Vec<(String, bool)>> {
        let rows = self.query(&self.sql.row_ends, &[])?;
        let mut ends: Vec<(String, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        ends.dedup();
        Ok(ends)
    }
}

impl WriteTxn for Txn<'_, '_> {
    fn put(&mut self, record: &SessionRecord) -> Result<()> {
        let c = RecordColumns::of(record)?;
        let params: Params<'_> = &[
            &c.session_id,
            &c.model_config,
            &c.state,
            &c.row_count,
            &c.retired_threads,
            &c.created_at_ms,
            &c.updated_at_ms,
            &c.mirror,
        ];
        self.execute(&self.sql.put, params)?;
        Ok(())
    }

    fn put_rows(&mut self, session_id: &str, first_seq: u64, bodies: &[Value]) -> Result<()> {
        if bodies.is_empty() {
            return Ok(());
        }
        let seqs: Vec<i64> = (first_seq..).take(bodies.len()).map(clamp).collect();
        let bodies: Vec<String> = bodies.iter().map(Value::to_string).collect();
        self.execute(&self.sql.put_rows, &[&session_id, &seqs, &bodies])?;
        Ok(())
    }

    /// A thread another session claimed after `claim_thread` looked (its advisory lock is
    /// per session) is [`StoreError::ThreadTaken`]. That refusal comes after this write's first
    /// writes, which is safe here only: a PostgreSQL write is one transaction of its own, and
    /// the error rolls all of it back.
    fn put_thread_owner(&mut self, thread_id: &str, session_id: &str) -> Result<()> {
        let owner = self
            .txn
            .query_one(&self.sql.put_thread, &[&thread_id, &session_id]);
        let owner: String = owner.pg(self.label)?.get(0);
        if owner != session_id {
            return Err(StoreError::ThreadTaken {
                thread_id: thread_id.to_string(),
                session_id: owner,
            });
        }
        Ok(())
    }

    fn put_chunk(&mut self, file: FileKey<'_>, seq: u64, bytes: &[u8]) -> Result<()> {
        let FileKey {
            session_id,
            thread_id,
            path,
        } = file;
        let params: Params<'_> = &[&session_id, &thread_id, &path, &clamp(seq), &bytes];
        self.execute(&self.sql.put_chunk, params)?;
        Ok(())
    }

    fn remove_chunks(&mut self, file: FileKey<'_>, from: u64) -> Result<()> {
        let FileKey {
            session_id,
            thread_id,
            path,
        } = file;
        let params: Params<'_> = &[&session_id, &thread_id, &path, &clamp(from)];
        self.execute(&self.sql.remove_chunks, params)?;
        Ok(())
    }

    fn remove(&mut self, session_id: &str) -> Result<bool> {
        let sql = self.sql;
        for statement in [
            &sql.remove_rows,
            &sql.remove_threads,
            &sql.remove_session_chunks,
        ] {
            self.execute(statement, &[&session_id])?;
        }
        Ok(self.execute(&sql.remove, &[&session_id])? > 0)
    }

    fn leases(&mut self) -> &mut dyn LeaseTxn {
        self
    }
}

impl LeaseTxn for Txn<'_, '_> {
    fn load_lease(&mut self, session_id: &str) -> Result<Option<Grant>> {
        let Some(r) = self.query_opt(&self.sql.load_lease, &[&session_id])? else {
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
        let params: Params<'_> = &[
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
        ];
        self.execute(&self.sql.put_lease, params)?;
        Ok(())
    }

    fn remove_lease(&mut self, session_id: &str) -> Result<()> {
        self.execute(&self.sql.remove_lease, &[&session_id])?;
        Ok(())
    }
}
