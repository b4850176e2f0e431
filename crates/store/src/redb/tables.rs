//! The transaction view of the redb tables: what `logic` reads and writes, and the record
//! codec.

use std::ops::{Bound, Range};
use std::sync::Arc;

use ::redb::ReadableTable;
use serde_json::Value;

use super::map_redb_error;
use crate::logic::{check_record, LeaseTxn, LocalLeases, ReadTxn, WriteTxn};
use crate::{SessionRecord, StoreError, TranscriptRow};

fn decode_record(label: &str, id: &str, bytes: &[u8]) -> Result<SessionRecord, StoreError> {
    let record: SessionRecord = serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        path: label.to_string(),
        detail: format!("session {id} does not decode"),
        source: Some(Box::new(e)),
    })?;
    check_record(&record).map_err(|d| StoreError::corrupt(label, format!("session {id}: {d}")))?;
    Ok(record)
}

fn decode_body(label: &str, id: &str, seq: u64, bytes: &[u8]) -> Result<Value, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        path: label.to_string(),
        detail: format!("row {seq} of session {id} does not decode"),
        source: Some(Box::new(e)),
    })
}

/// Reads shared by read-only and write transactions.
pub(super) struct Tables<S, R> {
    pub(super) label: String,
    pub(super) sessions: S,
    pub(super) rows: R,
    /// The process's leases, in write transactions (for fence checks).
    pub(super) leases: Option<Arc<LocalLeases>>,
}

impl<S, R> ReadTxn for Tables<S, R>
where
    S: ReadableTable<&'static str, &'static [u8]>,
    R: ReadableTable<(&'static str, u64), &'static [u8]>,
{
    fn label(&self) -> &str {
        &self.label
    }

    fn load(&mut self, session_id: &str) -> Result<Option<SessionRecord>, StoreError> {
        let label = &self.label;
        match self
            .sessions
            .get(session_id)
            .map_err(|e| map_redb_error(label, e))?
        {
            Some(bytes) => decode_record(label, session_id, bytes.value()).map(Some),
            None => Ok(None),
        }
    }

    fn load_rows(
        &mut self,
        session_id: &str,
        range: Range<u64>,
    ) -> Result<Vec<TranscriptRow>, StoreError> {
        let label = &self.label;
        let mut out = Vec::new();
        if range.start >= range.end {
            return Ok(out);
        }
        let iter = self
            .rows
            .range((session_id, range.start)..(session_id, range.end))
            .map_err(|e| map_redb_error(label, e))?;
        for item in iter {
            let (key, value) = item.map_err(|e| map_redb_error(label, e))?;
            let seq = key.value().1;
            out.push(TranscriptRow {
                seq,
                body: decode_body(label, session_id, seq, value.value())?,
            });
        }
        Ok(out)
    }

    fn list(
        &mut self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let label = &self.label;
        let lower = match after {
            Some(a) => Bound::Excluded(a),
            None => Bound::Unbounded,
        };
        let iter = self
            .sessions
            .range::<&str>((lower, Bound::Unbounded))
            .map_err(|e| map_redb_error(label, e))?;
        let mut out = Vec::new();
        for item in iter.take(limit) {
            let (key, value) = item.map_err(|e| map_redb_error(label, e))?;
            out.push(decode_record(label, key.value(), value.value())?);
        }
        Ok(out)
    }
}

impl WriteTxn
    for Tables<
        ::redb::Table<'_, &'static str, &'static [u8]>,
        ::redb::Table<'_, (&'static str, u64), &'static [u8]>,
    >
{
    fn put(&mut self, record: &SessionRecord) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(record).map_err(|e| StoreError::Backend {
            backend: "redb",
            source: Box::new(e),
        })?;
        self.sessions
            .insert(record.session_id.as_str(), bytes.as_slice())
            .map_err(|e| map_redb_error(&self.label, e))?;
        Ok(())
    }

    fn put_row(&mut self, session_id: &str, seq: u64, body: &Value) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(body).map_err(|e| StoreError::Backend {
            backend: "redb",
            source: Box::new(e),
        })?;
        let previous = self
            .rows
            .insert((session_id, seq), bytes.as_slice())
            .map_err(|e| map_redb_error(&self.label, e))?;
        if previous.is_some() {
            // Rows are append-only; finding one here means the record's row count is wrong.
            return Err(StoreError::corrupt(
                &self.label,
                format!("row {seq} of session {session_id} already exists"),
            ));
        }
        Ok(())
    }

    fn remove(&mut self, session_id: &str) -> Result<bool, StoreError> {
        let label = self.label.clone();
        let existed = self
            .sessions
            .remove(session_id)
            .map_err(|e| map_redb_error(&label, e))?
            .is_some();
        self.rows
            .retain_in((session_id, 0)..=(session_id, u64::MAX), |_, _| false)
            .map_err(|e| map_redb_error(&label, e))?;
        Ok(existed)
    }

    fn leases(&mut self) -> Option<&mut dyn LeaseTxn> {
        self.leases
            .as_mut()
            .map(|leases| leases as &mut dyn LeaseTxn)
    }
}
