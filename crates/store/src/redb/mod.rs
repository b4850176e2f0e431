//! The redb backend: the embedded default.
//!
//! Layout (`schema.rs`): table `sessions` (`session id -> JSON SessionRecord`), table `rows`
//! (`(session id, seq) -> JSON body`), table `rethread_meta` (`"schema_version" -> u64`).
//! redb holds an exclusive lock on the file: a second process opening it gets
//! [`StoreError::Locked`]. Leases live in this process (`LocalLeases`); the writer thread
//! checks fenced writes against them.

mod schema;
mod tables;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::redb::{Database, ReadableDatabase};

use self::schema::{ensure_schema, ROWS, SESSIONS};
use self::tables::Tables;
use crate::adapter::Adapter;
use crate::durable::{create_owner_only, prepare_path, Durable, Engine, Readers, Writer};
use crate::logic::{LocalLeases, ReadTxn, WriteTxn};
use crate::store::forward_binding_store;
use crate::{Durability, OpenOptions, StoreError};

/// A [`BindingStore`](crate::BindingStore) in one redb file.
#[derive(Debug)]
pub struct RedbStore {
    store: Adapter<Durable>,
    path: PathBuf,
}

forward_binding_store!([] RedbStore, |this| this.store);

impl RedbStore {
    /// Opens (or creates, owner-only) the store at `path`, migrating an older schema.
    ///
    /// Errors: [`StoreError::Locked`] if another process has it open,
    /// [`StoreError::Corrupt`] for a damaged or foreign file, [`StoreError::NewerSchema`] for a
    /// file from a newer rethread. The file is opened on the store's writer thread.
    pub async fn open(path: impl AsRef<Path>, options: OpenOptions) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let open_path = path.clone();
        let (max_batch, spin) = (options.max_batch, options.lone_write_spin);
        // redb files are exclusive to one process: leases live in this process, shared by the
        // lease calls and the writer thread (which checks the fences of writes against them).
        let leases = Arc::new(LocalLeases::default());
        let engine_leases = Arc::clone(&leases);
        let (writer, readers) = Writer::spawn("redb", max_batch, spin, move || {
            let label = open_path.display().to_string();
            let db = Arc::new(open_database(&open_path, &options)?);
            let engine = RedbEngine {
                db: Arc::clone(&db),
                label: label.clone(),
                durability: options.durability,
                leases: engine_leases,
                not_durable_since: None,
            };
            Ok((engine, RedbReaders { db, label }))
        })
        .await?;
        Ok(RedbStore {
            store: Adapter(Durable {
                writer,
                readers: Arc::new(readers),
                local_leases: Some(leases),
            }),
            path,
        })
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Finishes queued writes and closes the file, so that it can be opened again (by this
    /// or another process) as soon as this returns.
    pub async fn close(self) {
        self.store.0.close().await;
    }
}

/// Maps every redb error to a [`StoreError`]. The one place redb errors are interpreted.
pub(crate) fn map_redb_error(path: &str, error: impl Into<::redb::Error>) -> StoreError {
    let error: ::redb::Error = error.into();
    match error {
        ::redb::Error::DatabaseAlreadyOpen | ::redb::Error::LockProtocolMismatch => {
            StoreError::Locked {
                path: path.to_string(),
            }
        }
        ::redb::Error::Corrupted(detail) => StoreError::corrupt(path, detail),
        ::redb::Error::TableTypeMismatch { .. }
        | ::redb::Error::TableIsMultimap(_)
        | ::redb::Error::TableIsNotMultimap(_)
        | ::redb::Error::TypeDefinitionChanged { .. } => StoreError::Corrupt {
            path: path.to_string(),
            detail: "tables do not have rethread's layout".to_string(),
            source: Some(Box::new(error)),
        },
        ::redb::Error::Io(source) if source.kind() == std::io::ErrorKind::InvalidData => {
            StoreError::Corrupt {
                path: path.to_string(),
                detail: "not a redb file".to_string(),
                source: Some(Box::new(source)),
            }
        }
        ::redb::Error::Io(source) => StoreError::Io {
            path: path.to_string(),
            source,
        },
        other => StoreError::Backend {
            backend: "redb",
            source: Box::new(other),
        },
    }
}

fn open_database(path: &Path, options: &OpenOptions) -> Result<Database, StoreError> {
    let label = path.display().to_string();
    prepare_path(path, options)?;
    create_owner_only(path, options.create)?;
    let len = std::fs::metadata(path)
        .map_err(|source| StoreError::Io {
            path: label.clone(),
            source,
        })?
        .len();
    let mut builder = Database::builder();
    builder.set_cache_size(64 * 1024 * 1024);
    // Verify every page's checksum on open: a plain open trusts a cleanly closed file and may
    // panic on one damaged since (found by the `store_files` fuzz target); this turns any
    // damage into `Corrupted`, at the cost of reading the file once per open.
    builder.set_check_integrity_on_open(true);
    // Only a zero-length file (one we just created, or a creation interrupted before redb
    // wrote its header) is initialised; anything else must already be a redb file.
    let db = if len == 0 {
        builder.create(path)
    } else {
        builder.open(path)
    }
    .map_err(|e| map_redb_error(&label, e))?;
    ensure_schema(&db, &label)?;
    Ok(db)
}

/// How long a relaxed commit may stay not durable: at least this often while a relaxed
/// store is written, its commits are made durable (the next commit is durable, or the writer
/// thread flushes when no write comes).
const RELAXED_FLUSH_INTERVAL: Duration = Duration::from_millis(100);

struct RedbEngine {
    db: Arc<Database>,
    label: String,
    durability: Durability,
    leases: Arc<LocalLeases>,
    /// When the oldest commit that is not durable yet was made (relaxed stores). redb's
    /// `Durability::None` commits reach the file only with a later durable commit: until then
    /// a process exit loses them.
    not_durable_since: Option<Instant>,
}

impl RedbEngine {
    /// Commits an empty durable transaction: every earlier commit becomes durable with it.
    fn make_durable(&mut self) -> Result<(), StoreError> {
        let label = self.label.as_str();
        let txn = self
            .db
            .begin_write()
            .map_err(|e| map_redb_error(label, e))?;
        txn.commit().map_err(|e| map_redb_error(label, e))?;
        self.not_durable_since = None;
        Ok(())
    }
}

impl Engine for RedbEngine {
    fn write(
        &mut self,
        f: &mut dyn FnMut(&mut dyn WriteTxn, bool) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let label = self.label.as_str();
        let mut txn = self
            .db
            .begin_write()
            .map_err(|e| map_redb_error(label, e))?;
        // A relaxed commit is not durable, unless the oldest one that is not has waited its
        // interval: then this one is, and takes the others with it.
        let relaxed = self.durability == Durability::Relaxed
            && self
                .not_durable_since
                .is_none_or(|since| since.elapsed() < RELAXED_FLUSH_INTERVAL);
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
                leases: Some(Arc::clone(&self.leases)),
            };
            // The file is locked to this process and every write goes through this thread:
            // nobody else can have written since the previous transaction.
            f(&mut tables, false)?;
        }
        txn.commit().map_err(|e| map_redb_error(label, e))?;
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
            // The next write or the close tries again.
            tracing::warn!(%error, "could not make relaxed redb commits durable");
        }
    }

    fn shutdown(&mut self) {
        // In relaxed mode, make everything acknowledged so far durable before closing.
        if self.not_durable_since.is_some() {
            self.flush();
        }
    }
}

#[derive(Debug)]
struct RedbReaders {
    db: Arc<Database>,
    label: String,
}

impl Readers for RedbReaders {
    fn read(
        &self,
        f: &mut dyn FnMut(&mut dyn ReadTxn) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let label = self.label.as_str();
        let txn = self.db.begin_read().map_err(|e| map_redb_error(label, e))?;
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
    }
}
