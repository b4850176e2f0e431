//! The in-memory backend, for tests and as the reference for the others.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use async_trait::async_trait;

use crate::engine::{blocking, Answer, Engine, ReadFn, Request, WriteFn};
use crate::logic::{ChunkSink, FileKey, Grant, LeaseTxn, ReadTxn, WriteTxn};
use crate::{Clock, SessionRecord, StoreError, TranscriptRow};
use crate::{Result, Unpoisoned};

#[derive(Debug, Default, Clone)]
pub(crate) struct State {
    records: BTreeMap<String, SessionRecord>,
    rows: HashMap<String, Vec<Value>>,
    /// Which session each thread belongs to.
    threads: HashMap<String, String>,
    /// Mirrored files' chunks by (session, thread, path), in order.
    chunks: BTreeMap<(String, String, String), Vec<Vec<u8>>>,
    /// Under the same lock as the records, so a fenced write checks its lease and writes in
    /// one step.
    leases: HashMap<String, Grant>,
    /// The key check of a sealed store.
    seal_check: Option<u64>,
}

/// The engine that keeps everything in memory, leases with the records; nothing survives the
/// process ([`BindingStore::memory`](crate::BindingStore::memory)). Operations run under one mutex, held only for the
/// in-memory step (never across an `.await`); reads on a blocking thread, as the file backends
/// run them (a restore's read writes into a file).
#[derive(Debug, Default)]
pub struct MemoryEngine {
    state: Arc<Mutex<State>>,
    clock: Clock,
}

impl MemoryEngine {
    /// An empty engine that judges time by `clock` (tests: [`Clock::manual`]).
    pub fn new(clock: Clock) -> Self {
        MemoryEngine {
            clock,
            ..MemoryEngine::default()
        }
    }
}

// A panic while holding the lock cannot leave a half-applied write: every operation decides
// before it writes, and in-memory writes cannot fail ([`Unpoisoned`]).
#[async_trait]
impl Engine for MemoryEngine {
    async fn read(&self, _: Request<'_>, mut op: ReadFn) -> Result<Answer> {
        let state = Arc::clone(&self.state);
        blocking(move || op(&mut *state.lock().unpoisoned())).await
    }

    async fn write(&self, _: Request<'_>, mut op: WriteFn) -> Result<Answer> {
        op(&mut *self.state.lock().unpoisoned(), self.clock.now_ms())
    }

    fn clock(&self) -> Clock {
        self.clock.clone()
    }
}

impl ReadTxn for State {
    fn label(&self) -> &str {
        "memory:"
    }

    fn load(&mut self, session_id: &str) -> Result<Option<SessionRecord>> {
        Ok(self.records.get(session_id).cloned())
    }

    fn seal_check(&mut self) -> Result<Option<u64>> {
        Ok(self.seal_check)
    }

    fn stale_leases(&mut self, after: &str, cutoff: i64, limit: usize) -> Result<Vec<String>> {
        let has_record = |id: &str| Ok(self.records.contains_key(id));
        crate::logic::stale_grants(&self.leases, after, cutoff, limit, has_record)
    }

    fn load_rows(&mut self, session_id: &str, range: Range<u64>) -> Result<Vec<TranscriptRow>> {
        let Some(rows) = self.rows.get(session_id) else {
            return Ok(Vec::new());
        };
        let end = range.end.min(rows.len() as u64);
        let row = |seq| TranscriptRow {
            seq,
            body: rows[seq as usize].clone(),
        };
        Ok((range.start..end).map(row).collect())
    }

    fn list(&mut self, after: Option<&str>, limit: usize) -> Result<Vec<SessionRecord>> {
        use std::ops::Bound;
        let lower = after.map_or(Bound::Unbounded, |a| Bound::Excluded(a.to_string()));
        let records = self.records.range::<String, _>((lower, Bound::Unbounded));
        Ok(records.take(limit).map(|(_, r)| r.clone()).collect())
    }

    fn has_rows(&mut self, session_id: &str) -> Result<bool> {
        Ok(self
            .rows
            .get(session_id)
            .is_some_and(|rows| !rows.is_empty()))
    }

    fn row_bytes(&mut self, session_id: &str) -> Result<u64> {
        let rows = self.rows.get(session_id).into_iter().flatten();
        Ok(rows.map(|body| body.to_string().len() as u64).sum())
    }

    fn thread_owner(&mut self, thread_id: &str) -> Result<Option<String>> {
        Ok(self.threads.get(thread_id).cloned())
    }

    fn session_threads(&mut self, session_id: &str) -> Result<Vec<String>> {
        let threads = self
            .threads
            .iter()
            .filter(|(_, owner)| *owner == session_id);
        Ok(threads.map(|(thread, _)| thread.clone()).collect())
    }

    fn load_chunks(&mut self, file: FileKey<'_>, range: Range<u64>, each: ChunkSink) -> Result<()> {
        let key = chunk_key(file);
        let Some(chunks) = self.chunks.get(&key) else {
            return Ok(());
        };
        let end = range.end.min(chunks.len() as u64);
        (range.start..end).try_for_each(|seq| each(seq, &chunks[seq as usize]))
    }

    fn row_ends(&mut self) -> Result<Vec<(String, bool)>> {
        let with_rows = self.rows.iter().filter(|(_, rows)| !rows.is_empty());
        let ids = with_rows.map(|(id, _)| id);
        let mut ends: Vec<&String> = [ids.clone().min(), ids.max()]
            .into_iter()
            .flatten()
            .collect();
        ends.dedup();
        Ok(ends
            .into_iter()
            .map(|id| (id.clone(), self.records.contains_key(id)))
            .collect())
    }
}

/// The key of a mirrored file's chunks.
fn chunk_key(file: FileKey<'_>) -> (String, String, String) {
    let FileKey {
        session_id,
        thread_id,
        path,
    } = file;
    (session_id.into(), thread_id.into(), path.into())
}

impl WriteTxn for State {
    fn put(&mut self, record: &SessionRecord) -> Result<()> {
        self.records
            .insert(record.session_id.clone(), record.clone());
        Ok(())
    }

    fn put_rows(&mut self, session_id: &str, first_seq: u64, bodies: &[Value]) -> Result<()> {
        let rows = self.rows.entry(session_id.to_string()).or_default();
        if rows.len() as u64 != first_seq {
            return Err(StoreError::Internal(format!(
                "rows of {session_id} appended at {first_seq}, {} stored",
                rows.len()
            )));
        }
        rows.extend_from_slice(bodies);
        Ok(())
    }

    fn put_thread_owner(&mut self, thread_id: &str, session_id: &str) -> Result<()> {
        self.threads
            .insert(thread_id.to_string(), session_id.to_string());
        Ok(())
    }

    fn put_chunk(&mut self, file: FileKey<'_>, seq: u64, bytes: &[u8]) -> Result<()> {
        let key = chunk_key(file);
        let chunks = self.chunks.entry(key).or_default();
        if chunks.len() as u64 != seq {
            return Err(StoreError::Internal(format!(
                "chunk {seq} of {file} written, {} stored",
                chunks.len()
            )));
        }
        chunks.push(bytes.to_vec());
        Ok(())
    }

    fn remove_chunks(&mut self, file: FileKey<'_>, from: u64) -> Result<()> {
        let key = chunk_key(file);
        if let Some(chunks) = self.chunks.get_mut(&key) {
            chunks.truncate(from.min(chunks.len() as u64) as usize);
            if chunks.is_empty() {
                self.chunks.remove(&key);
            }
        }
        Ok(())
    }

    fn remove(&mut self, session_id: &str) -> Result<bool> {
        self.rows.remove(session_id);
        self.chunks
            .retain(|(session, _, _), _| session != session_id);
        self.threads.retain(|_, owner| owner != session_id);
        Ok(self.records.remove(session_id).is_some())
    }

    fn put_seal_check(&mut self, check: u64) -> Result<()> {
        self.seal_check = Some(check);
        Ok(())
    }

    fn leases(&mut self) -> &mut dyn LeaseTxn {
        &mut self.leases
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    use std::thread::ThreadId;

    use crate::{BindingStore, MirrorAppend, MirrorUpdate, TurnCommit};

    /// Notes the thread each write runs on.
    struct Threads(Arc<Mutex<Vec<ThreadId>>>);

    impl Write for Threads {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().push(std::thread::current().id());
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The restore's writer is a file: it runs on a blocking thread, as the file backends run
    /// it, never on the async runtime's (here the test's own: a current-thread runtime).
    #[tokio::test]
    async fn a_mirrored_file_is_written_out_off_the_async_runtimes_thread() {
        let store = BindingStore::memory();
        let path = "sessions/rollout-2026-12-01T10-00-00-t.jsonl";
        let update = MirrorUpdate::new(vec![MirrorAppend::whole(path, b"{}\n".to_vec())]);
        let turn = TurnCommit::new("s", "t", vec![serde_json::json!(1)]).mirror(Some(update));
        store.commit_turn(turn).await.unwrap();
        let threads = Arc::new(Mutex::new(Vec::new()));
        let out = Box::new(Threads(threads.clone()));
        let file = store.write_mirror_file("s", "t", path, out).await.unwrap();
        assert!(file.is_some());
        let threads = threads.lock().unwrap();
        assert!(!threads.is_empty());
        let runtime = std::thread::current().id();
        assert!(
            threads.iter().all(|t| *t != runtime),
            "{threads:?} on {runtime:?}"
        );
    }
}
