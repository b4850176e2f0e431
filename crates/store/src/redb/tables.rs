//! The transaction view of the redb tables (what `logic` reads and writes) and the record
//! codec.
//!
//! A value is the record's JSON followed by a CRC-32 (little endian) of the table, the key and
//! the JSON (schema 4, `checksum.rs`): redb checks page checksums only when it repairs or
//! verifies a file, not when it reads a record, so damage to a value or a key must be found
//! here. A session record must also name its own key.

use std::ops::{Bound, Range};
use std::sync::Arc;

use ::redb::ReadableTable;
use serde_json::Value;

use super::map_redb_error;
use crate::checksum::{verify, Checksum};
use crate::logic::{check_record, LeaseTxn, LocalLeases, ReadTxn, WriteTxn};
use crate::{SessionRecord, StoreError, TranscriptRow};

/// The checksum of a `sessions` value.
pub(super) fn session_sum(key: &str, json: &[u8]) -> i64 {
    Checksum::of("sessions").text(key).bytes(json).finish()
}

/// The checksum of a `rows` value.
pub(super) fn row_sum(session_id: &str, seq: u64, json: &[u8]) -> i64 {
    Checksum::of("rows")
        .text(session_id)
        .int(seq as i64)
        .bytes(json)
        .finish()
}

/// `json` followed by its checksum, as stored.
pub(super) fn seal(mut json: Vec<u8>, sum: i64) -> Vec<u8> {
    json.extend_from_slice(&(sum as u32).to_le_bytes());
    json
}

/// The JSON of a stored value, once its checksum holds.
fn unseal<'v>(
    label: &str,
    what: &dyn Fn() -> String,
    value: &'v [u8],
    sum: impl FnOnce(&[u8]) -> i64,
) -> Result<&'v [u8], StoreError> {
    let Some(split) = value.len().checked_sub(4) else {
        return Err(StoreError::corrupt(
            label,
            format!("{}: the value is too short to hold its checksum", what()),
        ));
    };
    let (json, stored) = value.split_at(split);
    let stored = u32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]]);
    verify(label, what, i64::from(stored), sum(json))?;
    Ok(json)
}

/// Verifies and decodes a `sessions` value stored under `key`.
pub(super) fn decode_record(
    label: &str,
    key: &str,
    value: &[u8],
) -> Result<SessionRecord, StoreError> {
    let what = || format!("session {key}");
    let json = unseal(label, &what, value, |json| session_sum(key, json))?;
    let record: SessionRecord = serde_json::from_slice(json).map_err(|e| StoreError::Corrupt {
        path: label.to_string(),
        detail: format!("session {key} does not decode"),
        source: Some(Box::new(e)),
    })?;
    if record.session_id != key {
        return Err(StoreError::corrupt(
            label,
            format!(
                "the record under key {key} is session {}",
                record.session_id
            ),
        ));
    }
    check_record(&record).map_err(|d| StoreError::corrupt(label, format!("session {key}: {d}")))?;
    Ok(record)
}

/// Verifies and decodes a `rows` value stored under `(session_id, seq)`.
pub(super) fn decode_body(
    label: &str,
    session_id: &str,
    seq: u64,
    value: &[u8],
) -> Result<Value, StoreError> {
    let what = || format!("row {seq} of session {session_id}");
    let json = unseal(label, &what, value, |json| row_sum(session_id, seq, json))?;
    serde_json::from_slice(json).map_err(|e| StoreError::Corrupt {
        path: label.to_string(),
        detail: format!("row {seq} of session {session_id} does not decode"),
        source: Some(Box::new(e)),
    })
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|e| StoreError::Internal(format!("encoding JSON: {e}")))
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
            let (key_session, seq) = key.value();
            if key_session != session_id {
                return Err(StoreError::corrupt(
                    label,
                    format!("a range of session {session_id} yields a row of {key_session}"),
                ));
            }
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

    fn has_rows(&mut self, session_id: &str) -> Result<bool, StoreError> {
        let label = &self.label;
        let mut iter = self
            .rows
            .range((session_id, 0)..=(session_id, u64::MAX))
            .map_err(|e| map_redb_error(label, e))?;
        Ok(iter
            .next()
            .transpose()
            .map_err(|e| map_redb_error(label, e))?
            .is_some())
    }

    fn row_ends(&mut self) -> Result<Vec<(String, bool)>, StoreError> {
        let label = self.label.clone();
        let map = |e| map_redb_error(&label, e);
        let first = self.rows.first().map_err(map)?;
        let last = self.rows.last().map_err(map)?;
        let mut ends: Vec<String> = [first, last]
            .into_iter()
            .flatten()
            .map(|(key, _)| key.value().0.to_string())
            .collect();
        ends.dedup();
        ends.into_iter()
            .map(|id| {
                let has_record = self.sessions.get(id.as_str()).map_err(map)?.is_some();
                Ok((id, has_record))
            })
            .collect()
    }
}

impl WriteTxn
    for Tables<
        ::redb::Table<'_, &'static str, &'static [u8]>,
        ::redb::Table<'_, (&'static str, u64), &'static [u8]>,
    >
{
    fn put(&mut self, record: &SessionRecord) -> Result<(), StoreError> {
        let json = encode(record)?;
        let sum = session_sum(&record.session_id, &json);
        self.sessions
            .insert(record.session_id.as_str(), seal(json, sum).as_slice())
            .map_err(|e| map_redb_error(&self.label, e))?;
        Ok(())
    }

    fn put_row(&mut self, session_id: &str, seq: u64, body: &Value) -> Result<(), StoreError> {
        let json = encode(body)?;
        let sum = row_sum(session_id, seq, &json);
        let previous = self
            .rows
            .insert((session_id, seq), seal(json, sum).as_slice())
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
