//! The redb database as the store's threads use it: opened (waiting for another process's
//! lock up to `OpenOptions::wait`), every call under `catch_unwind`, the writer thread's
//! engine and the readers (snapshots, and the whole-store scan).

use crate::Unpoisoned;
use std::fs::File;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use ::redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};

use super::overlay::Overlay;
use super::tables::{
    decode_body, decode_record, ensure_schema, Tables, META, MIRROR_CHUNKS, ROWS, SESSIONS,
    SESSION_THREADS, THREADS,
};
use super::RedbResult;
use crate::durable::{
    check_mirrors, merge_scan, open_error, owner_only, prepare_file, FileEngine, FileId, Readers,
    ScannedRow, ScannedSession,
};
use crate::logic::{LocalLeases, ReadTxn, WriteTxn};
use crate::verify::{Checker, ProblemKind};
use crate::Result;
use crate::{Durability, LeaseOwner, LocalOwner, OpenOptions, StoreError};

/// Every table of `txn`, a read or a write transaction (their `open_table`s differ only in
/// the types they give), or the `?` of the first that fails.
macro_rules! open_tables {
    ($txn:expr, $label:expr, $leases:expr) => {
        Tables {
            label: $label.to_string(),
            sessions: $txn.open_table(SESSIONS).redb($label)?,
            rows: $txn.open_table(ROWS).redb($label)?,
            threads: $txn.open_table(THREADS).redb($label)?,
            session_threads: $txn.open_table(SESSION_THREADS).redb($label)?,
            chunks: $txn.open_table(MIRROR_CHUNKS).redb($label)?,
            meta: $txn.open_table(META).redb($label)?,
            leases: Arc::clone($leases),
            reclaim: false,
        }
    };
}

/// How a store file becomes a database: on the file itself, or on a wrapper in the tests
/// that inject faults.
pub(super) type MakeBackend =
    Arc<dyn Fn(&::redb::Builder, File) -> Result<Database, ::redb::DatabaseError> + Send + Sync>;

/// The open database, shared by the writer thread and the readers.
pub(super) struct Shared {
    /// `None` while the writer reopens it (after an I/O error) and once it is dropped.
    db: RwLock<Option<Database>>,
    label: String,
    /// Why the store refuses every call: redb panicked on this file, so it is damaged in a
    /// way redb did not expect and its in-memory state cannot be trusted any more.
    poisoned: OnceLock<String>,
    /// The holder record beside the file, removed on close; none when opened read-only.
    holder: Option<HolderRecord>,
}

/// How many compactions ran on each file, by its label (for the tests, kept out of the
/// shipped structs).
#[cfg(test)]
pub(super) static COMPACTIONS: std::sync::Mutex<std::collections::BTreeMap<String, usize>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("label", &self.label)
            .field("poisoned", &self.poisoned.get())
            .finish_non_exhaustive()
    }
}

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
    pub(super) fn guard<T>(&self, f: impl FnOnce(&Database) -> Result<T>) -> Result<T> {
        if let Some(why) = self.poisoned.get() {
            return Err(StoreError::corrupt(&self.label, why.clone()));
        }
        let db = self.db.read().unpoisoned();
        let db = db.as_ref().ok_or_else(|| {
            StoreError::io(
                self.label.clone(),
                std::io::Error::other("the store is being reopened after an I/O error"),
            )
        })?;
        catch_unwind(AssertUnwindSafe(|| f(db))).unwrap_or_else(|payload| {
            let why = format!(
                "redb failed on the file ({}): it is damaged; run verify",
                panic_message(payload.as_ref())
            );
            let why = self.poisoned.get_or_init(|| why).clone();
            Err(StoreError::corrupt(&self.label, why))
        })
    }

    /// Compacts the file after a forget, or once after a prune's last batch
    /// ([`WriteTxn::reclaim`]): the pages the removals freed are written over by the pages
    /// moved into them or cut off the end of the file, so the removed text does not stay in
    /// free pages, and the file shrinks. Readers and writers wait meanwhile: redb has no
    /// incremental form, and its cost grows with the live data moved (figures in
    /// `docs/benchmarks.md`). A failure is logged: the data stays whole, only the space and
    /// the overwrite are not done until the next reclaim.
    fn compact(&self) {
        if self.poisoned.get().is_some() {
            return;
        }
        let mut db = self.db.write().unpoisoned();
        let Some(db) = db.as_mut() else {
            return;
        };
        #[cfg(test)]
        {
            let mut counts = COMPACTIONS.lock().unwrap();
            *counts.entry(self.label.clone()).or_default() += 1;
        }
        match catch_unwind(AssertUnwindSafe(|| db.compact())) {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, store = %self.label, "could not compact the redb store after a removal");
            }
            Err(payload) => {
                let why = format!(
                    "redb failed compacting the file ({}): it is damaged; run verify",
                    panic_message(payload.as_ref())
                );
                self.poisoned.get_or_init(|| why);
            }
        }
    }

    /// Closes the database (writing its header: on a file that made redb panic, or after an
    /// I/O error, that may fail or panic again, which is contained).
    fn close(&self) {
        let db = self.db.write().unpoisoned().take();
        if let Some(db) = db {
            let _ = catch_unwind(AssertUnwindSafe(move || drop(db)));
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.close();
        if let Some(holder) = &self.holder {
            holder.remove();
        }
    }
}

/// This process's holder record of one open store: `<path>.holder`, who holds the file (its
/// lock names no holder), so that a process refused the file can name the holder.
struct HolderRecord {
    path: PathBuf,
    /// Keeps this holder alive (a dropped one is known gone to this process).
    owner: LocalOwner,
}

impl HolderRecord {
    fn path(store: &Path) -> PathBuf {
        let mut name = store.as_os_str().to_owned();
        name.push(".holder");
        PathBuf::from(name)
    }

    /// Best effort: the record only serves messages.
    fn write(store: &Path) -> HolderRecord {
        let record = HolderRecord {
            path: Self::path(store),
            owner: LocalOwner::new(),
        };
        if let Ok(json) = serde_json::to_vec(record.owner.owner()) {
            let mut options = owner_only();
            options.write(true).create(true).truncate(true);
            if let Ok(mut file) = options.open(&record.path) {
                let _ = std::io::Write::write_all(&mut file, &json);
            }
        }
        record
    }

    /// The holder of `store`, unless its record was left by a holder now gone.
    fn read(store: &Path) -> Option<String> {
        let json = std::fs::read(Self::path(store)).ok()?;
        let owner: LeaseOwner = serde_json::from_slice(&json).ok()?;
        let since = crate::time_for_people(owner.started_at_ms);
        (!owner.is_known_gone()).then(|| format!("held by {owner} since {since}"))
    }

    /// Removes the record if it is still this holder's.
    fn remove(&self) {
        let ours = std::fs::read(&self.path)
            .ok()
            .and_then(|json| serde_json::from_slice::<LeaseOwner>(&json).ok())
            .is_some_and(|owner| owner == *self.owner.owner());
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What opening the file needs, kept by the writer to reopen it.
pub(super) struct Opener {
    pub(super) path: PathBuf,
    pub(super) label: String,
    pub(super) options: OpenOptions,
    pub(super) make_backend: MakeBackend,
}

impl Opener {
    /// Opens the database (initialised if `create` and the file is empty), waiting up to
    /// `OpenOptions::wait` for another process's lock, with the identity of the file opened.
    fn open_db(&self, create: bool) -> Result<(Database, FileId)> {
        let deadline = Instant::now() + self.options.wait;
        loop {
            match self.try_open(create) {
                Err(StoreError::Locked { .. }) if Instant::now() < deadline => {
                    let retry = Duration::from_millis(50);
                    std::thread::sleep(retry.min(deadline - Instant::now()));
                }
                Err(StoreError::Locked { path, .. }) => {
                    let holder = HolderRecord::read(&self.path);
                    return Err(StoreError::Locked { path, holder });
                }
                other => return other,
            }
        }
    }

    fn try_open(&self, create: bool) -> Result<(Database, FileId)> {
        let label = self.label.as_str();
        let io = |e| open_error(label, e);
        let read_only = self.options.read_only;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(&self.path)
            .map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        // Only a zero-length file (one just created, or a creation interrupted before redb
        // wrote its header) is initialised; anything else must already be a redb file.
        if meta.len() == 0 && !create {
            return Err(StoreError::no_store(label));
        }
        let open = || {
            let mut builder = Database::builder();
            builder.set_cache_size(64 * 1024 * 1024);
            builder.set_check_integrity_on_open(self.options.check_redb_integrity);
            let db = if read_only {
                // redb's writable open, checks included, on storage that never writes the file.
                ::redb::backends::FileBackend::new(file).and_then(|file| {
                    let overlay = Overlay::new(file).map_err(::redb::StorageError::from)?;
                    builder.create_with_backend(overlay)
                })
            } else {
                (self.make_backend)(&builder, file)
            };
            db.redb(label)
        };
        match catch_unwind(AssertUnwindSafe(open)) {
            Ok(db) => Ok((db?, FileId::of(&meta))),
            Err(payload) => {
                let why = panic_message(payload.as_ref());
                let detail = format!("redb failed opening the file ({why}): it is damaged");
                Err(StoreError::corrupt(label, detail))
            }
        }
    }
}

pub(super) fn open_shared(opener: &Opener) -> Result<(Shared, FileId)> {
    let created = prepare_file(&opener.path, &opener.options)?;
    let (db, file_id) = opener.open_db(opener.options.may_create() || created)?;
    let shared = Shared {
        db: RwLock::new(Some(db)),
        label: opener.label.clone(),
        poisoned: OnceLock::new(),
        holder: (!opener.options.read_only).then(|| HolderRecord::write(&opener.path)),
    };
    shared.guard(|db| ensure_schema(db, &shared.label, opener.options.may_create()))?;
    Ok((shared, file_id))
}

/// How long a relaxed commit may stay not durable (the next commit is durable, or the writer
/// thread flushes when no write comes).
const RELAXED_FLUSH_INTERVAL: Duration = Duration::from_millis(100);

pub(super) struct RedbEngine {
    pub(super) shared: Arc<Shared>,
    pub(super) opener: Opener,
    pub(super) leases: Arc<LocalLeases>,
    /// The file the path named at open (see `FileId::check`).
    pub(super) file_id: FileId,
    /// An I/O error failed a commit: redb then fails every later call ("Previous I/O error
    /// occurred"), so the database is reopened before the next write.
    pub(super) reopen: bool,
    /// When the oldest commit not durable yet was made (relaxed stores: redb's
    /// `Durability::None` commits reach the file only with a later durable commit).
    pub(super) not_durable_since: Option<Instant>,
}

impl RedbEngine {
    /// Closes the database and opens the file again; what it holds is its last commit.
    fn reopen(&mut self) -> Result<()> {
        self.shared.close();
        let (db, file_id) = self.opener.open_db(false)?;
        *self.shared.db.write().unpoisoned() = Some(db);
        self.file_id = file_id;
        self.reopen = false;
        tracing::info!(store = %self.shared.label, "reopened the redb store after an I/O error");
        Ok(())
    }
}

impl FileEngine for RedbEngine {
    fn write(&mut self, f: &mut dyn FnMut(&mut dyn WriteTxn) -> Result<()>) -> Result<()> {
        if self.reopen {
            self.reopen()?;
        }
        // A relaxed commit is not durable, unless the oldest one that is not has waited its
        // interval: then this one is, and takes the others with it.
        let relaxed = self.opener.options.durability == Durability::Relaxed
            && self
                .not_durable_since
                .is_none_or(|since| since.elapsed() < RELAXED_FLUSH_INTERVAL);
        let label = self.shared.label.as_str();
        let (leases, file_id, path) = (&self.leases, self.file_id, &self.opener.path);
        let lease_write = leases.begin_write();
        let written = self.shared.guard(|db| {
            let mut txn = db.begin_write().redb(label)?;
            if relaxed {
                txn.set_durability(::redb::Durability::None).redb(label)?;
            }
            let mut tables = open_tables!(txn, label, leases);
            f(&mut tables)?;
            let reclaim = tables.reclaim;
            drop(tables);
            file_id.check(path, label)?;
            txn.commit().redb(label)?;
            Ok(reclaim)
        });
        if written.is_ok() {
            lease_write.committed();
        } else {
            drop(lease_write);
        }
        if let Err(StoreError::Io { .. }) = &written {
            self.reopen = true;
            if let Err(error) = self.reopen() {
                tracing::warn!(%error, "could not reopen the redb store; trying again on the next write");
            }
        }
        if written? {
            self.shared.compact();
        }
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

    /// Commits an empty durable transaction: every earlier commit becomes durable with it.
    fn flush(&mut self) {
        if self.not_durable_since.is_none() {
            return;
        }
        let label = self.shared.label.as_str();
        let durable = self
            .shared
            .guard(|db| db.begin_write().redb(label)?.commit().redb(label));
        match durable {
            Ok(()) => self.not_durable_since = None,
            Err(error) => {
                // The next write or the close tries again; a poisoned store stops asking.
                tracing::warn!(%error, "could not make relaxed redb commits durable");
                if self.shared.poisoned.get().is_some() {
                    self.not_durable_since = None;
                }
            }
        }
    }
}

#[derive(Debug)]
pub(super) struct RedbReaders {
    pub(super) shared: Arc<Shared>,
    pub(super) leases: Arc<LocalLeases>,
}

impl Readers for RedbReaders {
    fn read(&self, f: &mut dyn FnMut(&mut dyn ReadTxn) -> Result<()>) -> Result<()> {
        let label = self.shared.label.as_str();
        self.shared.guard(|db| {
            let txn = db.begin_read().redb(label)?;
            f(&mut open_tables!(txn, label, &self.leases))
        })
    }

    /// Reads both tables in key order on one snapshot (`merge_scan`), then the mirrors. A
    /// panic of redb on the way ends the scan as a `Structure` problem.
    fn verify(&self, checker: &mut Checker<'_>) -> Result<bool> {
        let label = self.shared.label.as_str();
        let scanned = self.shared.guard(|db| {
            let txn = db.begin_read().redb(label)?;
            let mut tables = open_tables!(txn, label, &self.leases);
            checker.expect_sessions(tables.sessions.len().redb(label)?);
            let mut sessions = tables.sessions.iter().redb(label)?.map(|item| {
                let (key, value) = item.redb(label)?;
                let id = key.value();
                Ok(ScannedSession::of(
                    id,
                    decode_record(label, id, value.value()),
                ))
            });
            let mut rows = tables.rows.iter().redb(label)?.map(|item| {
                let (key, value) = item.redb(label)?;
                let (session_id, seq) = key.value();
                Ok(ScannedRow {
                    body: decode_body(label, session_id, seq, value.value()).map(drop),
                    session_id: session_id.to_string(),
                    seq,
                })
            });
            let scanned = merge_scan(checker, &mut sessions, &mut rows)?;
            drop((sessions, rows));
            check_mirrors(&mut tables, checker, scanned.mirrors)?;
            Ok(scanned.complete)
        });
        scanned.or_else(|error| {
            checker.damage(ProblemKind::Structure, None, error)?;
            Ok(false)
        })
    }
}
