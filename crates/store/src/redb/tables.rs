//! The redb layout (schema 1: its tables, their creation, the refusal of foreign and newer
//! files), the transaction view of the tables (what `logic` reads and writes) and the record
//! codec.
//!
//! A value is the record's JSON followed by a CRC-32 (little endian) of the table, the key and
//! the JSON (`checksum.rs`): redb checks page checksums only when it repairs or verifies a
//! file, not when it reads a record. A session record must also name its own key.

use std::ops::{Bound, Range};
use std::sync::Arc;

use ::redb::{Database, ReadableTable, TableDefinition, TableHandle};
use serde_json::Value;

use super::RedbResult;
use crate::checksum::{thread_checksum, verify, Checksum};
use crate::logic::{check_record, ChunkSink, FileKey, LeaseTxn, LocalLeases, ReadTxn, WriteTxn};
use crate::Result;
use crate::{SessionRecord, StoreError, TranscriptRow, SCHEMA_VERSION};

/// `session id -> JSON SessionRecord + checksum`.
pub(super) const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("sessions");
/// `(session id, seq) -> JSON body + checksum`.
pub(super) const ROWS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("rows");
/// `thread id -> session id + checksum`: which session a thread belongs to.
pub(super) const THREADS: TableDefinition<&str, &[u8]> = TableDefinition::new("threads");
/// `(session id, thread id) -> checksum`: the same, by session, so a delete frees its threads
/// without a scan.
pub(super) const SESSION_THREADS: TableDefinition<(&str, &str), &[u8]> =
    TableDefinition::new("session_threads");
/// `(session id, thread id, path, seq) -> bytes + checksum`: the mirrored rollout files.
pub(super) const MIRROR_CHUNKS: TableDefinition<(&str, &str, &str, u64), &[u8]> =
    TableDefinition::new("mirror_chunks");
/// `"schema_version" -> u64`, and `"seal_check" -> u64` in a sealed store.
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("rethread_meta");
const SCHEMA_KEY: &str = "schema_version";
const SEAL_KEY: &str = "seal_check";

/// Checks the schema version, initialising a new file when `create` allows.
pub(super) fn ensure_schema(db: &Database, label: &str, create: bool) -> Result<()> {
    let txn = db.begin_write().redb(label)?;
    let tables: Vec<String> = txn
        .list_tables()
        .redb(label)?
        .map(|t| t.name().to_string())
        .collect();
    let mut found = None;
    if tables.iter().any(|t| t == META.name()) {
        let meta = txn.open_table(META).redb(label)?;
        found = meta.get(SCHEMA_KEY).redb(label)?.map(|v| v.value());
    }
    match found {
        None if tables.is_empty() && !create => Err(StoreError::no_store(label)),
        None if tables.is_empty() => {
            txn.open_table(SESSIONS).redb(label)?;
            txn.open_table(ROWS).redb(label)?;
            txn.open_table(THREADS).redb(label)?;
            txn.open_table(SESSION_THREADS).redb(label)?;
            txn.open_table(MIRROR_CHUNKS).redb(label)?;
            let mut meta = txn.open_table(META).redb(label)?;
            meta.insert(SCHEMA_KEY, SCHEMA_VERSION).redb(label)?;
            drop(meta); // before the commit, which needs the table closed
            txn.commit().redb(label)
        }
        None => Err(StoreError::corrupt(
            label,
            format!("not a rethread store (tables {tables:?}, no schema version)"),
        )),
        Some(version) => {
            StoreError::check_schema_version(label, version)?;
            let needed = [
                SESSIONS.name(),
                ROWS.name(),
                THREADS.name(),
                SESSION_THREADS.name(),
                MIRROR_CHUNKS.name(),
            ];
            if let Some(missing) = needed.iter().find(|n| !tables.iter().any(|t| t == *n)) {
                let detail = format!("table {missing} is missing");
                return Err(StoreError::corrupt(label, detail));
            }
            txn.abort().redb(label)
        }
    }
}

/// The checksum of a `session_threads` value (empty).
fn session_thread_checksum(session_id: &str, thread_id: &str) -> i64 {
    Checksum::of("session_threads")
        .text(session_id)
        .text(thread_id)
        .finish()
}

pub(super) fn session_sum(key: &str, json: &[u8]) -> i64 {
    Checksum::of("sessions").text(key).bytes(json).finish()
}

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
        let detail = format!("{}: the value is too short to hold its checksum", what());
        return Err(StoreError::corrupt(label, detail));
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
    let record: SessionRecord =
        serde_json::from_slice(json).map_err(|e| StoreError::corrupt_json(label, what(), e))?;
    if record.session_id != key {
        let detail = format!(
            "the record under key {key} is session {}",
            record.session_id
        );
        return Err(StoreError::corrupt(label, detail));
    }
    check_record(&record).map_err(|d| StoreError::corrupt(label, format!("session {key}: {d}")))?;
    Ok(record)
}

/// Verifies and decodes a `rows` value stored under `(session_id, seq)`.
pub(super) fn decode_body(label: &str, session_id: &str, seq: u64, value: &[u8]) -> Result<Value> {
    let what = || format!("row {seq} of session {session_id}");
    let json = unseal(label, &what, value, |json| row_sum(session_id, seq, json))?;
    serde_json::from_slice(json).map_err(|e| StoreError::corrupt_json(label, what(), e))
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>> {
    Ok(crate::error::to_json(value)?.into_bytes())
}

/// The key of a `mirror_chunks` value.
type ChunkKey = (&'static str, &'static str, &'static str, u64);

/// The tables of one transaction, read-only or write.
pub(super) struct Tables<S, R, T, ST, C, M> {
    pub(super) label: String,
    pub(super) sessions: S,
    pub(super) rows: R,
    pub(super) threads: T,
    pub(super) session_threads: ST,
    pub(super) chunks: C,
    pub(super) meta: M,
    /// The process's leases (for fence checks; read transactions never use them).
    pub(super) leases: Arc<LocalLeases>,
    /// Whether the file is compacted after this transaction commits ([`WriteTxn::reclaim`]).
    pub(super) reclaim: bool,
}

impl<S, R, T, ST, C, M> ReadTxn for Tables<S, R, T, ST, C, M>
where
    S: ReadableTable<&'static str, &'static [u8]>,
    R: ReadableTable<(&'static str, u64), &'static [u8]>,
    T: ReadableTable<&'static str, &'static [u8]>,
    ST: ReadableTable<(&'static str, &'static str), &'static [u8]>,
    C: ReadableTable<ChunkKey, &'static [u8]>,
    M: ReadableTable<&'static str, u64>,
{
    fn label(&self) -> &str {
        &self.label
    }

    fn seal_check(&mut self) -> Result<Option<u64>> {
        let check = self.meta.get(SEAL_KEY).redb(&self.label)?;
        Ok(check.map(|v| v.value()))
    }

    fn load(&mut self, session_id: &str) -> Result<Option<SessionRecord>> {
        let label = &self.label;
        let value = self.sessions.get(session_id).redb(label)?;
        value
            .map(|v| decode_record(label, session_id, v.value()))
            .transpose()
    }

    fn load_rows(&mut self, session_id: &str, range: Range<u64>) -> Result<Vec<TranscriptRow>> {
        let label = &self.label;
        if range.start >= range.end {
            return Ok(Vec::new());
        }
        let keys = (session_id, range.start)..(session_id, range.end);
        let mut out = Vec::new();
        for item in self.rows.range(keys).redb(label)? {
            let (key, value) = item.redb(label)?;
            let (key_session, seq) = key.value();
            if key_session != session_id {
                let detail =
                    format!("a range of session {session_id} yields a row of {key_session}");
                return Err(StoreError::corrupt(label, detail));
            }
            let body = decode_body(label, session_id, seq, value.value())?;
            out.push(TranscriptRow { seq, body });
        }
        Ok(out)
    }

    fn list(&mut self, after: Option<&str>, limit: usize) -> Result<Vec<SessionRecord>> {
        let label = &self.label;
        let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
        let iter = self.sessions.range::<&str>((lower, Bound::Unbounded));
        let mut out = Vec::new();
        for item in iter.redb(label)?.take(limit) {
            let (key, value) = item.redb(label)?;
            out.push(decode_record(label, key.value(), value.value())?);
        }
        Ok(out)
    }

    fn has_rows(&mut self, session_id: &str) -> Result<bool> {
        let label = &self.label;
        let mut iter = self
            .rows
            .range((session_id, 0)..=(session_id, u64::MAX))
            .redb(label)?;
        Ok(iter.next().transpose().redb(label)?.is_some())
    }

    fn stale_leases(&mut self, after: &str, cutoff: i64, limit: usize) -> Result<Vec<String>> {
        let (label, sessions) = (&self.label, &self.sessions);
        let has_record = |id: &str| Ok(sessions.get(id).redb(label)?.is_some());
        self.leases.stale(after, cutoff, limit, has_record)
    }

    fn row_bytes(&mut self, session_id: &str) -> Result<u64> {
        let label = &self.label;
        let mut bytes = 0;
        let rows = (session_id, 0)..=(session_id, u64::MAX);
        for item in self.rows.range(rows).redb(label)? {
            bytes += item.redb(label)?.1.value().len() as u64;
        }
        Ok(bytes)
    }

    fn thread_owner(&mut self, thread_id: &str) -> Result<Option<String>> {
        let label = &self.label;
        let Some(value) = self.threads.get(thread_id).redb(label)? else {
            return Ok(None);
        };
        let what = || format!("owner of thread {thread_id}");
        let session = unseal(label, &what, value.value(), |s| {
            thread_checksum(thread_id, s)
        })?;
        String::from_utf8(session.to_vec())
            .map(Some)
            .map_err(|_| StoreError::corrupt(label, format!("{}: not UTF-8", what())))
    }

    fn session_threads(&mut self, session_id: &str) -> Result<Vec<String>> {
        let label = &self.label;
        let mut threads = Vec::new();
        for item in self.session_threads.range((session_id, "")..).redb(label)? {
            let (key, value) = item.redb(label)?;
            let (owner, thread) = key.value();
            if owner != session_id {
                break;
            }
            let what = || format!("thread {thread} of session {session_id}");
            unseal(label, &what, value.value(), |_| {
                session_thread_checksum(session_id, thread)
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
        let FileKey {
            session_id,
            thread_id,
            path,
        } = file;
        let keys =
            (session_id, thread_id, path, range.start)..(session_id, thread_id, path, range.end);
        for item in self.chunks.range(keys).redb(label)? {
            let (key, value) = item.redb(label)?;
            let (s, t, p, seq) = key.value();
            if (s, t, p) != (session_id, thread_id, path) {
                let detail = format!("a range of the mirror of {file} yields a chunk of {p}");
                return Err(StoreError::corrupt(label, detail));
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
        let label = &self.label;
        let (first, last) = (
            self.rows.first().redb(label)?,
            self.rows.last().redb(label)?,
        );
        let mut ends: Vec<String> = [first, last]
            .into_iter()
            .flatten()
            .map(|(key, _)| key.value().0.to_string())
            .collect();
        ends.dedup();
        ends.into_iter()
            .map(|id| {
                let has_record = self.sessions.get(id.as_str()).redb(label)?.is_some();
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
        ::redb::Table<'_, &'static str, u64>,
    >
{
    fn put_seal_check(&mut self, check: u64) -> Result<()> {
        self.meta.insert(SEAL_KEY, check).redb(&self.label)?;
        Ok(())
    }

    fn put(&mut self, record: &SessionRecord) -> Result<()> {
        let (key, json) = (record.session_id.as_str(), encode(record)?);
        let sum = session_sum(key, &json);
        self.sessions
            .insert(key, seal(json, sum).as_slice())
            .redb(&self.label)?;
        Ok(())
    }

    /// A key found taken means the record's count is wrong: rows and chunks are append-only.
    fn put_rows(&mut self, session_id: &str, first_seq: u64, bodies: &[Value]) -> Result<()> {
        for (seq, body) in (first_seq..).zip(bodies) {
            let json = encode(body)?;
            let sum = row_sum(session_id, seq, &json);
            let previous = self
                .rows
                .insert((session_id, seq), seal(json, sum).as_slice());
            if previous.redb(&self.label)?.is_some() {
                let detail = format!("row {seq} of session {session_id} already exists");
                return Err(StoreError::corrupt(&self.label, detail));
            }
        }
        Ok(())
    }

    fn put_thread_owner(&mut self, thread_id: &str, session_id: &str) -> Result<()> {
        let label = &self.label;
        let owner = seal(
            session_id.into(),
            thread_checksum(thread_id, session_id.as_bytes()),
        );
        self.threads
            .insert(thread_id, owner.as_slice())
            .redb(label)?;
        let empty = seal(Vec::new(), session_thread_checksum(session_id, thread_id));
        let key = (session_id, thread_id);
        self.session_threads
            .insert(key, empty.as_slice())
            .redb(label)?;
        Ok(())
    }

    fn put_chunk(&mut self, file: FileKey<'_>, seq: u64, bytes: &[u8]) -> Result<()> {
        let value = seal(bytes.to_vec(), file.chunk_checksum(seq as i64, bytes));
        let key = (file.session_id, file.thread_id, file.path, seq);
        if self
            .chunks
            .insert(key, value.as_slice())
            .redb(&self.label)?
            .is_some()
        {
            let detail = format!("chunk {seq} of the mirror of {file} already exists");
            return Err(StoreError::corrupt(&self.label, detail));
        }
        Ok(())
    }

    fn remove_chunks(&mut self, file: FileKey<'_>, from: u64) -> Result<()> {
        let FileKey {
            session_id,
            thread_id,
            path,
        } = file;
        let keys = (session_id, thread_id, path, from)..=(session_id, thread_id, path, u64::MAX);
        self.chunks.retain_in(keys, |_, _| false).redb(&self.label)
    }

    /// The compaction gives everything back at once: nothing is left for another step.
    fn reclaim(&mut self) -> Result<u64> {
        self.reclaim = true;
        Ok(0)
    }

    fn remove(&mut self, session_id: &str) -> Result<bool> {
        let label = self.label.clone();
        let existed = self.sessions.remove(session_id).redb(&label)?.is_some();
        let rows = (session_id, 0)..=(session_id, u64::MAX);
        self.rows.retain_in(rows, |_, _| false).redb(&label)?;
        let mut files: Vec<(String, String)> = Vec::new();
        for item in self.chunks.range((session_id, "", "", 0)..).redb(&label)? {
            let (key, _) = item.redb(&label)?;
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
            .redb(&label)?
        {
            let (key, _) = item.redb(&label)?;
            let (owner, thread) = key.value();
            if owner != session_id {
                break;
            }
            threads.push(thread.to_string());
        }
        for thread in &threads {
            self.threads.remove(thread.as_str()).redb(&label)?;
            let key = (session_id, thread.as_str());
            self.session_threads.remove(key).redb(&label)?;
        }
        Ok(existed)
    }

    fn leases(&mut self) -> &mut dyn LeaseTxn {
        &mut self.leases
    }
}
