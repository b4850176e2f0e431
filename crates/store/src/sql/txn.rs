//! One transaction's view of a SQL connection (what `logic` reads and writes), for both
//! dialects, and the checksum codec: with it, each row's last column is verified on every read
//! and written with every write.

use std::ops::Range;

use serde_json::Value;

use super::columns::row_checksum;
use super::{LeaseColumns, Param, RecordColumns, SqlConn, SqlRow, Stmt};
use crate::checksum::{thread_checksum, verify};
use crate::logic::{ChunkSink, FileKey, Grant, LeaseTxn, ReadTxn, WriteTxn};
use crate::{Result, SessionRecord, StoreError, TranscriptRow};
use Param::{Int, Text};

/// One transaction's view of a connection (the caller began and will end the transaction).
pub(crate) struct SqlTxn<'l, C> {
    conn: C,
    /// The store as errors name it.
    label: &'l str,
    /// Whether this transaction removed a session or asked for a reclaim (SQLite then scrubs
    /// its pages and checkpoints the WAL after the commit).
    pub(crate) removed: bool,
}

/// A key or count as SQL stores it (`i64`).
fn int(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}

/// The key columns of a mirrored file's chunks, the first placeholders of its statements.
fn keyed(file: FileKey<'_>) -> Vec<Param<'_>> {
    vec![Text(file.session_id), Text(file.thread_id), Text(file.path)]
}

impl<'l, C: SqlConn> SqlTxn<'l, C> {
    pub(crate) fn new(conn: C, label: &'l str) -> Self {
        SqlTxn {
            conn,
            label,
            removed: false,
        }
    }

    /// The first row `statement` selects, read by `read`.
    fn one<T>(
        &mut self,
        statement: Stmt,
        params: &[Param<'_>],
        read: impl FnMut(&dyn SqlRow) -> Result<T>,
    ) -> Result<Option<T>> {
        Ok(self.all(statement, params, read)?.into_iter().next())
    }

    /// Every row `statement` selects, read by `read`.
    fn all<T>(
        &mut self,
        statement: Stmt,
        params: &[Param<'_>],
        mut read: impl FnMut(&dyn SqlRow) -> Result<T>,
    ) -> Result<Vec<T>> {
        let mut found = Vec::new();
        self.conn.query(statement, params, &mut |row| {
            found.push(read(row)?);
            Ok(())
        })?;
        Ok(found)
    }

    /// The checksum codec's part of a row written: `sum()` after the row's `params`.
    fn seal(params: &mut Vec<Param<'_>>, sum: impl FnOnce() -> i64) {
        if C::DIALECT.checksums {
            params.push(Int(sum()));
        }
    }

    /// Runs `statement` on `params`, sealed with `sum()`.
    fn write(
        &mut self,
        statement: Stmt,
        mut params: Vec<Param<'_>>,
        sum: impl FnOnce() -> i64,
    ) -> Result<()> {
        Self::seal(&mut params, sum);
        self.conn.execute(statement, &params).map(drop)
    }

    /// The checksum codec's check of a row read: its column `at` must be `sum()`.
    fn check(
        label: &str,
        row: &dyn SqlRow,
        at: usize,
        what: impl FnOnce() -> String,
        sum: impl FnOnce() -> i64,
    ) -> Result<()> {
        match C::DIALECT.checksums {
            true => verify(label, what, row.int(at)?, sum()),
            false => Ok(()),
        }
    }

    /// The record of a `sessions` row, checked.
    fn record(label: &str, row: &dyn SqlRow) -> Result<SessionRecord> {
        let columns = RecordColumns::read(row)?;
        let what = || format!("session {}", columns.session_id);
        Self::check(label, row, 8, what, || columns.checksum())?;
        columns.into_record(label)
    }

    /// The `threads` row of `thread_id` and `session_id`, checked.
    fn owner(label: &str, row: &dyn SqlRow, thread_id: &str, session_id: &str) -> Result<()> {
        let what = || format!("owner of thread {thread_id}");
        Self::check(label, row, 1, what, || {
            thread_checksum(thread_id, session_id.as_bytes())
        })
    }
}

impl<C: SqlConn> ReadTxn for SqlTxn<'_, C> {
    fn label(&self) -> &str {
        self.label
    }

    fn load(&mut self, session_id: &str) -> Result<Option<SessionRecord>> {
        let label = self.label;
        self.one(Stmt::Load, &[Text(session_id)], |r| Self::record(label, r))
    }

    fn load_rows(&mut self, session_id: &str, range: Range<u64>) -> Result<Vec<TranscriptRow>> {
        let label = self.label;
        let params = [Text(session_id), Int(int(range.start)), Int(int(range.end))];
        self.all(Stmt::Rows, &params, |r| {
            let (seq, body) = (r.int(0)?, r.str(1)?);
            let what = || format!("row {seq} of session {session_id}");
            Self::check(label, r, 2, what, || row_checksum(session_id, seq, body))?;
            let what = || format!("row {seq} of {session_id}");
            let body = serde_json::from_str(body)
                .map_err(|e| StoreError::corrupt_json(label, what(), e))?;
            Ok(TranscriptRow {
                seq: seq as u64,
                body,
            })
        })
    }

    fn list(&mut self, after: Option<&str>, limit: usize) -> Result<Vec<SessionRecord>> {
        let label = self.label;
        let limit = Int(limit.min(i64::MAX as usize) as i64);
        let (statement, params) = match after {
            Some(after) => (Stmt::ListAfter, vec![Text(after), limit]),
            None => (Stmt::ListAll, vec![limit]),
        };
        self.all(statement, &params, |r| Self::record(label, r))
    }

    fn seal_check(&mut self) -> Result<Option<u64>> {
        match self.one(Stmt::SealCheck, &[], |r| r.int(0)) {
            Ok(check) => Ok(check.map(|c| c.max(0) as u64)),
            // An SQLite store opened read-only that no rethread with sealed stores opened
            // for writing yet has no `rethread_meta` table (`sqlite::open` adds it): never
            // sealed.
            Err(error) if error.to_string().contains("no such table") => Ok(None),
            Err(error) => Err(error),
        }
    }

    fn has_rows(&mut self, session_id: &str) -> Result<bool> {
        let found = self.one(Stmt::HasRows, &[Text(session_id)], |_| Ok(()))?;
        Ok(found.is_some())
    }

    fn stale_leases(&mut self, after: &str, cutoff: i64, limit: usize) -> Result<Vec<String>> {
        let limit = limit.min(i64::MAX as usize) as i64;
        let params = [Text(after), Int(cutoff), Int(limit)];
        self.all(Stmt::StaleLeases, &params, |r| Ok(r.str(0)?.to_owned()))
    }

    fn row_bytes(&mut self, session_id: &str) -> Result<u64> {
        let bytes = self.one(Stmt::RowBytes, &[Text(session_id)], |r| r.int(0))?;
        Ok(bytes.unwrap_or(0).max(0) as u64)
    }

    fn thread_owner(&mut self, thread_id: &str) -> Result<Option<String>> {
        let label = self.label;
        self.one(Stmt::ThreadOwner, &[Text(thread_id)], |r| {
            let session_id = r.str(0)?;
            Self::owner(label, r, thread_id, session_id)?;
            Ok(session_id.to_owned())
        })
    }

    fn session_threads(&mut self, session_id: &str) -> Result<Vec<String>> {
        let label = self.label;
        self.all(Stmt::SessionThreads, &[Text(session_id)], |r| {
            let thread_id = r.str(0)?;
            Self::owner(label, r, thread_id, session_id)?;
            Ok(thread_id.to_owned())
        })
    }

    fn load_chunks(&mut self, file: FileKey<'_>, range: Range<u64>, each: ChunkSink) -> Result<()> {
        let label = self.label;
        let mut params = keyed(file);
        params.extend([Int(int(range.start)), Int(int(range.end))]);
        self.conn.query(Stmt::Chunks, &params, &mut |r| {
            // Borrowed from the driver's buffer, valid until the next row.
            let (seq, bytes) = (r.int(0)?, r.bytes(1)?);
            let what = || format!("chunk {seq} of the mirror of {file}");
            Self::check(label, r, 2, what, || file.chunk_checksum(seq, bytes))?;
            each(seq as u64, bytes)
        })
    }

    fn row_ends(&mut self) -> Result<Vec<(String, bool)>> {
        let mut ends = self.all(Stmt::RowEnds, &[], |r| {
            Ok((r.str(0)?.to_owned(), r.flag(1)?))
        })?;
        ends.dedup();
        Ok(ends)
    }
}

impl<C: SqlConn> WriteTxn for SqlTxn<'_, C> {
    fn put(&mut self, record: &SessionRecord) -> Result<()> {
        let c = &RecordColumns::of(record)?;
        self.write(Stmt::Put, c.params(), || c.checksum())
    }

    fn put_rows(&mut self, session_id: &str, first_seq: u64, bodies: &[Value]) -> Result<()> {
        if bodies.is_empty() {
            return Ok(());
        }
        let seqs: Vec<i64> = (first_seq..).take(bodies.len()).map(int).collect();
        let bodies: Vec<String> = bodies.iter().map(Value::to_string).collect();
        if C::DIALECT.row_arrays {
            let params = [Text(session_id), Param::Ints(&seqs), Param::Texts(&bodies)];
            return self.conn.execute(Stmt::PutRowArrays, &params).map(drop);
        }
        for (&seq, body) in seqs.iter().zip(&bodies) {
            let params = vec![Text(session_id), Int(seq), Text(body)];
            self.write(Stmt::PutRow, params, || row_checksum(session_id, seq, body))?;
        }
        Ok(())
    }

    /// A thread another session claimed after `claim_thread` looked (PostgreSQL's advisory
    /// lock is per session) is [`StoreError::ThreadTaken`]. That refusal comes after this
    /// write's first writes, which is safe there only: a PostgreSQL write is one transaction of
    /// its own, and the error rolls all of it back. SQLite's one writer never gets there.
    fn put_thread_owner(&mut self, thread_id: &str, session_id: &str) -> Result<()> {
        let mut params = vec![Text(thread_id), Text(session_id)];
        Self::seal(&mut params, || {
            thread_checksum(thread_id, session_id.as_bytes())
        });
        let owner = self.one(Stmt::PutThread, &params, |r| Ok(r.str(0)?.to_owned()))?;
        match owner {
            Some(owner) if owner != session_id => Err(StoreError::ThreadTaken {
                thread_id: thread_id.to_string(),
                session_id: owner,
            }),
            _ => Ok(()),
        }
    }

    fn put_chunk(&mut self, file: FileKey<'_>, seq: u64, bytes: &[u8]) -> Result<()> {
        let (seq, mut params) = (int(seq), keyed(file));
        params.extend([Int(seq), Param::Bytes(bytes)]);
        self.write(Stmt::PutChunk, params, || file.chunk_checksum(seq, bytes))
    }

    fn remove_chunks(&mut self, file: FileKey<'_>, from: u64) -> Result<()> {
        let mut params = keyed(file);
        params.push(Int(int(from)));
        self.conn.execute(Stmt::RemoveChunks, &params).map(drop)
    }

    fn remove(&mut self, session_id: &str) -> Result<bool> {
        let params = [Text(session_id)];
        for statement in [
            Stmt::RemoveRows,
            Stmt::RemoveThreads,
            Stmt::RemoveSessionChunks,
        ] {
            self.conn.execute(statement, &params)?;
        }
        let removed = self.conn.execute(Stmt::Remove, &params)?;
        self.removed = true;
        Ok(removed > 0)
    }

    fn reclaim(&mut self) -> Result<u64> {
        self.removed = true;
        self.conn.free_pages()
    }

    fn put_seal_check(&mut self, check: u64) -> Result<()> {
        self.conn.execute(Stmt::PutSealCheck, &[Int(int(check))])?;
        Ok(())
    }

    fn leases(&mut self) -> &mut dyn LeaseTxn {
        self
    }
}

impl<C: SqlConn> LeaseTxn for SqlTxn<'_, C> {
    fn load_lease(&mut self, session_id: &str) -> Result<Option<Grant>> {
        let label = self.label;
        self.one(Stmt::LoadLease, &[Text(session_id)], |r| {
            let columns = LeaseColumns::read(r)?;
            let what = || format!("lease of session {}", columns.session_id);
            Self::check(label, r, 11, what, || columns.checksum())?;
            columns.into_grant(label)
        })
    }

    fn put_lease(&mut self, grant: &Grant) -> Result<()> {
        let c = &LeaseColumns::of(grant);
        self.write(Stmt::PutLease, c.params(), || c.checksum())
    }

    fn remove_lease(&mut self, session_id: &str) -> Result<()> {
        self.conn
            .execute(Stmt::RemoveLease, &[Text(session_id)])
            .map(drop)
    }
}
