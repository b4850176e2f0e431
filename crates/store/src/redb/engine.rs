//! The redb database as the store's threads use it: opened without a whole-file check, every
//! call under `catch_unwind` (a panic inside redb on a damaged file becomes `Corrupt` and
//! poisons the store), the writer thread's engine (relaxed commits made durable within
//! 100 ms) and the readers (snapshots, and the whole-store scan).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ::redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};

use super::map_redb_error;
use super::schema::{ensure_schema, ROWS, SESSIONS};
use super::tables::{decode_body, decode_record, Tables};
use crate::durable::{
    create_owner_only, merge_scan, prepare_path, Engine, Readers, ScannedRow, ScannedSession,
};
use crate::logic::{LocalLeases, ReadTxn, WriteTxn};
use crate::verify::{Checker, ProblemKind};
use crate::{Durability, OpenOptions, StoreError};

/// The open database, shared by the writer thread and the readers.
pub(super) struct Shared {
    /// `None` only while it is dropped.
    db: Option<Database>,
    label: String,
    /// Why the store refuses every call: redb panicked on this file, so it is damaged in a
    /// way redb did not expect and its in-memory state cannot be trusted any more.
    poisoned: OnceLock<String>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("label", &self.label)
            .field("poisoned", &self.poisoned.get())
            .finish_non_exhaustive()
    }
}

/// The text of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string())
}

impl Shared {
    /// Runs `f` on the database. A panic inside it (redb meeting damage it does not check
    /// for) is `Corrupt`, and from then on every call is refused as `Corrupt`.
    pub(super) fn guard<T>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if let Some(why) = self.poisoned.get() {
            return Err(StoreError::corrupt(&self.label, why.clone()));
        }
        let db = self.db.as_ref().ok_or(StoreError::Closed)?;
        match catch_unwind(AssertUnwindSafe(|| f(db))) {
            Ok(result) => result,
            Err(payload) => {
                let why = format!(
                    "redb failed on the file ({}): it is damaged; run verify",
                    panic_message(payload.as_ref())
                );
                let why = self.poisoned.get_or_init(|| why).clone();
                Err(StoreError::corrupt(&self.label, why))
            }
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Closing writes the file's header: on a file that made redb panic it may panic again.
        if let Some(db) = self.db.take() {
            let _ = catch_unwind(AssertUnwindSafe(move || drop(db)));
        }
    }
}

/// Opens (creating if asked) the database at `path` and checks its schema, on the calling
/// (writer) thread. Unless `OpenOptions::check_redb_integrity_on_open` is `false`, redb
/// checks every page first; otherwise the file's contents are not read beyond the header and
/// the schema version, and this takes the same time whatever the store holds.
pub(super) fn open_shared(path: &Path, options: &OpenOptions) -> Result<Shared, StoreError> {
    let label = path.display().to_string();
    prepare_path(path, options)?;
    create_owner_only(path, options.create)?;
    let len = std::fs::metadata(path)
        .map_err(|source| StoreError::Io {
            path: label.clone(),
            source,
        })?
        .len();
    let open = || {
        let mut builder = Database::builder();
        builder.set_cache_size(64 * 1024 * 1024);
        // See `OpenOptions::check_redb_integrity_on_open`: a damaged file must be a typed
        // error before a write can make redb abort the process.
        builder.set_check_integrity_on_open(options.check_redb_integrity);
        // Only a zero-length file (one we just created, or a creation interrupted before redb
        // wrote its header) is initialised; anything else must already be a redb file.
        if len == 0 {
            builder.create(path)
        } else {
            builder.open(path)
        }
        .map_err(|e| map_redb_error(&label, e))
    };
    let db = match catch_unwind(AssertUnwindSafe(open)) {
        Ok(db) => db?,
        Err(payload) => {
            return Err(StoreError::corrupt(
                &label,
                format!(
                    "redb failed opening the file ({}): it is damaged",
                    panic_message(payload.as_ref())
                ),
            ))
        }
    };
    let shared = Shared {
        db: Some(db),
        label,
        poisoned: OnceLock::new(),
    };
    shared.guard(|db| ensure_schema(db, &shared.label))?;
    Ok(shared)
}

/// How long a relaxed commit may stay not durable: at least this often while a relaxed
/// store is written, its commits are made durable (the next commit is durable, or the writer
/// thread flushes when no write comes).
const RELAXED_FLUSH_INTERVAL: Duration = Duration::from_millis(100);

/// The writer thread's side of the database.
pub(super) struct RedbEngine {
    shared: Arc<Shared>,
    durability: Durability,
    leases: Arc<LocalLeases>,
    /// When the oldest commit that is not durable yet was made (relaxed stores). redb's
    /// `Durability::None` commits reach the file only with a later durable commit: until then
    /// a process exit loses them.
    not_durable_since: Option<Instant>,
}

impl RedbEngine {
    pub(super) fn new(
        shared: Arc<Shared>,
        durability: Durability,
        leases: Arc<LocalLeases>,
    ) -> Self {
        RedbEngine {
            shared,
            durability,
            leases,
            not_durable_since: None,
        }
    }

    /// Commits an empty durable transaction: every earlier commit becomes durable with it.
    fn make_durable(&mut self) -> Result<(), StoreError> {
        let label = self.shared.label.as_str();
        self.shared.guard(|db| {
            let txn = db.begin_write().map_err(|e| map_redb_error(label, e))?;
            txn.commit().map_err(|e| map_redb_error(label, e))
        })?;
        self.not_durable_since = None;
        Ok(())
    }
}

impl Engine for RedbEngine {
    fn write(
        &mut self,
        f: &mut dyn FnMut(&mut dyn WriteTxn, bool) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        // A relaxed commit is not durable, unless the oldest one that is not has waited its
        // interval: then this one is, and takes the others with it.
        let relaxed = self.durability == Durability::Relaxed
            && self
                .not_durable_since
                .is_none_or(|since| since.elapsed() < RELAXED_FLUSH_INTERVAL);
        let label = self.shared.label.as_str();
        let leases = &self.leases;
        self.shared.guard(|db| {
            let mut txn = db.begin_write().map_err(|e| map_redb_error(label, e))?;
            if relaxed {
                txn.set_durability(::redb::Durability::None)
                    .map_err(|e| map_redb_error(label, e))?;
            }
            {
                let sessions = txn
                    .open_table(SESSIONS)
                    .map_err(|e| map_redb_error(label, e))?;
                let rows = txn.open_table(ROWS).map_err(|e| map_redb_error(label, e))?;
                let mut tables = Tables {
                    label: label.to_string(),
                    sessions,
                    rows,
                    leases: Some(Arc::clone(leases)),
                };
                // The file is locked to this process and every write goes through this
                // thread: nobody else can have written since the previous transaction.
                f(&mut tables, false)?;
            }
            txn.commit().map_err(|e| map_redb_error(label, e))
        })?;
        if relaxed {
            self.not_durable_since.get_or_insert_with(Instant::now);
        } else {
            self.not_durable_since = None;
        }
        Ok(())
    }

    fn flush_due(&self) -> Option<Instant> {
        self.not_durable_since
            .map(|since| since + RELAXED_FLUSH_INTERVAL)
    }

    fn flush(&mut self) {
        if let Err(error) = self.make_durable() {
            // The next write or the close tries again; a poisoned store stops asking.
            tracing::warn!(%error, "could not make relaxed redb commits durable");
            if self.shared.poisoned.get().is_some() {
                self.not_durable_since = None;
            }
        }
    }

    fn shutdown(&mut self) {
        // In relaxed mode, make everything acknowledged so far durable before closing.
        if self.not_durable_since.is_some() {
            self.flush();
        }
    }
}

/// The readers' side of the database: snapshots on blocking threads.
#[derive(Debug)]
pub(super) struct RedbReaders {
    shared: Arc<Shared>,
}

impl RedbReaders {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        RedbReaders { shared }
    }
}

impl Readers for RedbReaders {
    fn read(
        &self,
        f: &mut dyn FnMut(&mut dyn ReadTxn) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let label = self.shared.label.as_str();
        self.shared.guard(|db| {
            let txn = db.begin_read().map_err(|e| map_redb_error(label, e))?;
            let sessions = txn
                .open_table(SESSIONS)
                .map_err(|e| map_redb_error(label, e))?;
            let rows = txn.open_table(ROWS).map_err(|e| map_redb_error(label, e))?;
            f(&mut Tables {
                label: label.to_string(),
                sessions,
                rows,
                leases: None,
            })
        })
    }

    /// Reads both tables in key order on one snapshot: every value's checksum and decoding,
    /// and the merge (`merge_scan`). A panic of redb on the way ends the scan as a
    /// `Structure` problem.
    fn verify(&self, checker: &mut Checker<'_>) -> Result<bool, StoreError> {
        let label = self.shared.label.as_str();
        let map = |e: ::redb::StorageError| map_redb_error(label, e);
        let scanned = self.shared.guard(|db| {
            let txn = db.begin_read().map_err(|e| map_redb_error(label, e))?;
            let sessions = txn
                .open_table(SESSIONS)
                .map_err(|e| map_redb_error(label, e))?;
            let rows = txn.open_table(ROWS).map_err(|e| map_redb_error(label, e))?;
            checker.expect_sessions(sessions.len().map_err(map)?);
            let mut sessions = sessions.iter().map_err(map)?.map(|item| {
                let (key, value) = item.map_err(map)?;
                let id = key.value();
                Ok(ScannedSession {
                    id: id.to_string(),
                    row_count: decode_record(label, id, value.value()).map(|r| r.row_count),
                })
            });
            let mut rows = rows.iter().map_err(map)?.map(|item| {
                let (key, value) = item.map_err(map)?;
                let (session_id, seq) = key.value();
                Ok(ScannedRow {
                    body: decode_body(label, session_id, seq, value.value()).map(drop),
                    session_id: session_id.to_string(),
                    seq,
                })
            });
            merge_scan(checker, &mut sessions, &mut rows)
        });
        match scanned {
            Ok(complete) => Ok(complete),
            Err(error) => {
                checker.damage(ProblemKind::Structure, None, error)?;
                Ok(false)
            }
        }
    }
}
