//! The transaction view of the redb tables (what `logic` reads and writes) and the record
//! codec.
//!
//! A value is the record's JSON followed by a CRC-32 (little endian) of the table, the key and
//! the JSON (`checksum.rs`): redb checks page checksums only when it repairs or
//! verifies a file, not when it reads a record, so damage to a value or a key must be found
//! here. A session record must also name its own key.

use std::ops::{Bound, Range};
use std::sync::Arc;

use ::redb::ReadableTable;
use serde_json::Value;

use super::map_redb_error;
use crate::checksum::{verify, Checksum};
use crate::logic::{check_record, ChunkSink, FileKey, LeaseTxn, LocalLeases, ReadTxn, WriteTxn};
use crate::Result;
use crate::{SessionRecord, StoreError, TranscriptRow};

/// The checksum of a `threads` value (the owning session's id).
fn thread_sum(thread_id: &str, session: &[u8]) -> i64 {
    Checksum::of("threads")
        .text(thread_id)
        .bytes(session)
        .finish()
}

/// The checksum of a `session_threads` value (empty).
fn session_thread_sum(session_id: &str, thread_id: &str) -> i64 {
    Checksum::of("session_threads")
        .text(session_id)
        .text(thread_id)
        .finish()
}

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
) -> Result<&'v [u8]> {
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
pub(super) fn decode_record(label: &str, key: &str, value: &[u8]) -> Result<SessionRecord> {
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
pub(super) fn decode_body(label: &str, session_id: &str, seq: u64, value: &[u8]) -> Result<Value> {
    let what = || format!("row {seq} of session {session_id}");
    let json = unseal(label, &what, value, |json| row_sum(session_id, seq, json))?;
    serde_json::from_slice(json).map_err(|e| StoreError::Corrupt {
        path: label.to_string(),
        detail: format!("row {seq} of session {session_id} does not decode"),
        source: Some(Box::new(e)),
    })
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| StoreError::Internal(format!("encoding JSON: {e}")))
}

/// The key of a `mirror_chunks` value.
type ChunkKey = (&'static str, &'static str, &'static str, u64);

/// The tables of one transaction, read-only or write.
pub(super) struct Tables<S, R, T, ST, C> {
    pub(super) label: String,
    pub(super) sessions: S,
    pub(super) rows: R,
    pub(super) threads: T,
    pub(super) session_threads: ST,
    pub(super) chunks: C,
    /// The process's leases (for fence checks; read transactions never use them).
    pub(super) leases: Arc<LocalLeases>,
}

impl<S, R, T, ST, C> ReadTxn for Tables<S, R, T, ST, C>
where
    S: ReadableTable<&'static str, &'static [u8]>,
    R: ReadableTable<(&'static str, u64), &'static [u8]>,
    T: ReadableTable<&'static str, &'static [u8]>,
    ST: ReadableTable<(&'static str, &'static str), &'static [u8]>,
    C: ReadableTable<ChunkKey, &'static [u8]>,
{
    fn label(&self) -> &str {
        &self.label
    }

    fn load(&mut self, session_id: &str) -> Result<Option<SessionRecord>> {
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

    fn load_rows(&mut self, session_id: &str, range: Range<u64>) -> Result<Vec<TranscriptRow>> {
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

    fn list(&mut self, after: Option<&str>, limit: usize) -> Result<Vec<SessionRecord>> {
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

    fn has_rows(&mut self, session_id: &str) -> Result<bool> {
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

    fn thread_owner(&mut self, thread_id: &str) -> Result<Option<String>> {
        let label = &self.label;
        let Some(value) = self
            .threads
            .get(thread_id)
            .map_err(|e| map_redb_error(label, e))?
        else {
            return Ok(None);
        };
        let what = || format!("owner of thread {thread_id}");
        let session = unseal(label, &what, value.value(), |s| thread_sum(thread_id, s))?;
        String::from_utf8(session.to_vec())
            .map(Some)
            .map_err(|_| StoreError::corrupt(label, format!("{}: not UTF-8", what())))
    }

    fn session_threads(&mut self, session_id: &str) -> Result<Vec<String>> {
        let label = &self.label;
        let map = |e| map_redb_error(label, e);
        let mut threads = Vec::new();
        for item in self
            .session_threads
            .range((session_id, "")..)
            .map_err(map)?
        {
            let (key, value) = item.map_err(map)?;
            let (owner, thread) = key.value();
            if owner != session_id {
                break;
            }
            let what = || format!("thread {thread} of session {session_id}");
            unseal(label, &what, value.value(), |_| {
                session_thread_sum(session_id, thread)
            })?;
            threads.push(thread.to_string());
        }
        Ok(threads)
    }

    fn load_chunks(&mut self, file: FileKey<'_>, range: Range<u64>, each: ChunkSink) -> Result<()> {
        let label = &self.label;
        if range.start >= range.end {
            return Ok(());
        }
        let iter = self
            .chunks
            .range(
                (file.session_id, file.thread_id, file.path, range.start)
                    ..(file.session_id, file.thread_id, file.path, range.end),
            )
            .map_err(|e| map_redb_error(label, e))?;
        for item in iter {
            let (key, value) = item.map_err(|e| map_redb_error(label, e))?;
            let (s, t, p, seq) = key.value();
            if (s, t, p) != (file.session_id, file.thread_id, file.path) {
                return Err(StoreError::corrupt(
                    label,
                    format!("a range of the mirror of {file} yields a chunk of {p}"),
                ));
            }
            let what = || format!("chunk {seq} of the mirror of {file}");
            let bytes = unseal(label, &what, value.value(), |b| {
                file.chunk_checksum(seq as i64, b)
            })?;
            each(seq, bytes)?;
        }
        Ok(())
    }

    fn row_ends(&mut self) -> Result<Vec<(String, bool)>> {
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
        ::redb::Table<'_, &'static str, &'static [u8]>,
        ::redb::Table<'_, (&'static str, &'static str), &'static [u8]>,
        ::redb::Table<'_, ChunkKey, &'static [u8]>,
    >
{
    fn put(&mut self, record: &SessionRecord) -> Result<()> {
        let json = encode(record)?;
        let sum = session_sum(&record.session_id, &json);
        self.sessions
            .insert(record.session_id.as_str(), seal(json, sum).as_slice())
            .map_err(|e| map_redb_error(&self.label, e))?;
        Ok(())
    }

    fn put_rows(&mut self, session_id: &str, first_seq: u64, bodies: &[Value]) -> Result<()> {
        for (i, body) in bodies.iter().enumerate() {
            let seq = first_seq + i as u64;
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
        }
        Ok(())
    }

    fn put_thread_owner(&mut self, thread_id: &str, session_id: &str) -> Result<()> {
        let label = &self.label;
        let owner = session_id.as_bytes().to_vec();
        let sum = thread_sum(thread_id, &owner);
        self.threads
            .insert(thread_id, seal(owner, sum).as_slice())
            .map_err(|e| map_redb_error(label, e))?;
        let sum = session_thread_sum(session_id, thread_id);
        self.session_threads
            .insert((session_id, thread_id), seal(Vec::new(), sum).as_slice())
            .map_err(|e| map_redb_error(label, e))?;
        Ok(())
    }

    fn put_chunk(&mut self, file: FileKey<'_>, seq: u64, bytes: &[u8]) -> Result<()> {
        let sum = file.chunk_checksum(seq as i64, bytes);
        let previous = self
            .chunks
            .insert(
                (file.session_id, file.thread_id, file.path, seq),
                seal(bytes.to_vec(), sum).as_slice(),
            )
            .map_err(|e| map_redb_error(&self.label, e))?;
        if previous.is_some() {
            // Chunks are append-only; finding one here means the record's count is wrong.
            return Err(StoreError::corrupt(
                &self.label,
                format!("chunk {seq} of the mirror of {file} already exists"),
            ));
        }
        Ok(())
    }

    fn remove_chunks(&mut self, file: FileKey<'_>, from: u64) -> Result<()> {
        self.chunks
            .retain_in(
                (file.session_id, file.thread_id, file.path, from)
                    ..=(file.session_id, file.thread_id, file.path, u64::MAX),
                |_, _| false,
            )
            .map_err(|e| map_redb_error(&self.label, e))
    }

    fn remove(&mut self, session_id: &str) -> Result<bool> {
        let label = self.label.clone();
        let map = |e| map_redb_error(&label, e);
        let existed = self.sessions.remove(session_id).map_err(map)?.is_some();
        self.rows
            .retain_in((session_id, 0)..=(session_id, u64::MAX), |_, _| false)
            .map_err(map)?;
        let mut files: Vec<(String, String)> = Vec::new();
        for item in self.chunks.range((session_id, "", "", 0)..).map_err(map)? {
            let (key, _) = item.map_err(map)?;
            let (owner, thread, path, _) = key.value();
            if owner != session_id {
                break;
            }
            if files
                .last()
                .is_none_or(|(t, p)| (t.as_str(), p.as_str()) != (thread, path))
            {
                files.push((thread.to_string(), path.to_string()));
            }
        }
        for (thread, path) in &files {
            self.remove_chunks(FileKey::new(session_id, thread, path), 0)?;
        }
        let mut threads = Vec::new();
        for item in self
            .session_threads
            .range((session_id, "")..)
            .map_err(map)?
        {
            let (key, _) = item.map_err(map)?;
            let (owner, thread) = key.value();
            if owner != session_id {
                break;
            }
            threads.push(thread.to_string());
        }
        for thread in &threads {
            self.threads.remove(thread.as_str()).map_err(map)?;
            self.session_threads
                .remove((session_id, thread.as_str()))
                .map_err(map)?;
        }
        Ok(existed)
    }

    fn leases(&mut self) -> &mut dyn LeaseTxn {
        &mut self.leases
    }
}
