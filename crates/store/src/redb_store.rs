//! The redb backend: the embedded default.
//!
//! Layout: table `sessions` (`session id -> JSON SessionRecord`), table `rows`
//! (`(session id, seq) -> JSON body`), table `rethread_meta` (`"schema_version" -> u64`).
//! redb holds an exclusive lock on the file: a second process opening it gets
//! [`StoreError::Locked`].

use std::ops::{Bound, Range};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde_json::Value;

use crate::durable::{create_owner_only, impl_durable_store, Durable, Readers};
use crate::logic::{check_record, LeaseTxn, LocalLeases, ReadTxn, WriteTxn};
use crate::writer::{Engine, Writer};
use crate::{Durability, OpenOptions, SessionRecord, StoreError, TranscriptRow, SCHEMA_VERSION};

const SESSIONS_NAME: &str = "sessions";
const ROWS_NAME: &str = "rows";
const META_NAME: &str = "rethread_meta";
const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new(SESSIONS_NAME);
const ROWS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new(ROWS_NAME);
const META: TableDefinition<&str, u64> = TableDefinition::new(META_NAME);
const SCHEMA_KEY: &str = "schema_version";

/// A [`BindingStore`](crate::BindingStore) in one redb file.
#[derive(Debug)]
pub struct RedbStore {
    inner: Durable,
    path: PathBuf,
}

impl_durable_store!(RedbStore);

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
            };
            Ok((engine, RedbReaders { db, label }))
        })
        .await?;
        Ok(RedbStore {
            inner: Durable {
                writer,
                readers: Arc::new(readers),
                local_leases: Some(leases),
            },
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
        let RedbStore { inner, .. } = self;
        let Durable {
            writer, readers, ..
        } = inner;
        drop(readers);
        writer.close().await;
    }
}

/// Maps every redb error to a [`StoreError`]. The one place redb errors are interpreted.
pub(crate) fn map_redb_error(path: &str, error: impl Into<redb::Error>) -> StoreError {
    let error: redb::Error = error.into();
    match error {
        redb::Error::DatabaseAlreadyOpen | redb::Error::LockProtocolMismatch => {
            StoreError::Locked {
                path: path.to_string(),
            }
        }
        redb::Error::Corrupted(detail) => StoreError::corrupt(path, detail),
        redb::Error::TableTypeMismatch { .. }
        | redb::Error::TableIsMultimap(_)
        | redb::Error::TableIsNotMultimap(_)
        | redb::Error::TypeDefinitionChanged { .. } => StoreError::Corrupt {
            path: path.to_string(),
            detail: "tables do not have rethread's layout".to_string(),
            source: Some(Box::new(error)),
        },
        redb::Error::Io(source) if source.kind() == std::io::ErrorKind::InvalidData => {
            StoreError::Corrupt {
                path: path.to_string(),
                detail: "not a redb file".to_string(),
                source: Some(Box::new(source)),
            }
        }
        redb::Error::Io(source) => StoreError::Io {
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

/// Checks the schema version, initialising a new file and migrating an older one.
fn ensure_schema(db: &Database, label: &str) -> Result<(), StoreError> {
    let map = |e: redb::Error| map_redb_error(label, e);
    let txn = db.begin_write().map_err(|e| map(e.into()))?;
    let tables: Vec<String> = txn
        .list_tables()
        .map_err(|e| map(e.into()))?
        .map(|t| redb::TableHandle::name(&t).to_string())
        .collect();
    let found = if tables.iter().any(|t| t == META_NAME) {
        let meta = txn.open_table(META).map_err(|e| map(e.into()))?;
        let version = meta
            .get(SCHEMA_KEY)
            .map_err(|e| map(e.into()))?
            .map(|v| v.value());
        version
    } else {
        None
    };
    match found {
        None if tables.is_empty() => {
            migrate(&txn, 0, label)?;
            txn.commit().map_err(|e| map(e.into()))?;
        }
        None => {
            return Err(StoreError::corrupt(
                label,
                format!("not a rethread store (tables {tables:?}, no schema version)"),
            ))
        }
        Some(v) if v > SCHEMA_VERSION => {
            return Err(StoreError::NewerSchema {
                path: label.to_string(),
                found: v,
                supported: SCHEMA_VERSION,
            })
        }
        Some(v) if v < SCHEMA_VERSION => {
            migrate(&txn, v, label)?;
            txn.commit().map_err(|e| map(e.into()))?;
        }
        Some(_) => {
            for needed in [SESSIONS_NAME, ROWS_NAME] {
                if !tables.iter().any(|t| t == needed) {
                    return Err(StoreError::corrupt(
                        label,
                        format!("table {needed} is missing"),
                    ));
                }
            }
            txn.abort().map_err(|e| map(e.into()))?;
        }
    }
    Ok(())
}

/// Brings a store from schema `from` to [`SCHEMA_VERSION`] inside `txn`. Each step is one arm;
/// version 0 is a new, empty file.
fn migrate(txn: &redb::WriteTransaction, from: u64, label: &str) -> Result<(), StoreError> {
    let map = |e: redb::Error| map_redb_error(label, e);
    let mut version = from;
    while version < SCHEMA_VERSION {
        match version {
            0 => {
                txn.open_table(SESSIONS).map_err(|e| map(e.into()))?;
                txn.open_table(ROWS).map_err(|e| map(e.into()))?;
            }
            // Schema 2 changed only SQLite stores (record checksums); redb checksums its pages.
            // Schema 3 changed only the stored leases, which redb keeps in the process.
            1 | 2 => {}
            other => {
                return Err(StoreError::corrupt(
                    label,
                    format!("unknown schema version {other}"),
                ))
            }
        }
        version += 1;
    }
    let mut meta = txn.open_table(META).map_err(|e| map(e.into()))?;
    meta.insert(SCHEMA_KEY, SCHEMA_VERSION)
        .map_err(|e| map(e.into()))?;
    Ok(())
}

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
struct Tables<S, R> {
    label: String,
    sessions: S,
    rows: R,
    /// The process's leases, in write transactions (for fence checks).
    leases: Option<Arc<LocalLeases>>,
}

impl<S, R> ReadTxn for Tables<S, R>
where
    S: ReadableTable<&'static str, &'static [u8]>,
    R: ReadableTable<(&'static str, u64), &'static [u8]>,
{
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
        redb::Table<'_, &'static str, &'static [u8]>,
        redb::Table<'_, (&'static str, u64), &'static [u8]>,
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

struct RedbEngine {
    db: Arc<Database>,
    label: String,
    durability: Durability,
    leases: Arc<LocalLeases>,
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
        if self.durability == Durability::Relaxed {
            txn.set_durability(redb::Durability::None)
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
        txn.commit().map_err(|e| map_redb_error(label, e))
    }

    fn shutdown(&mut self) {
        // In relaxed mode, make everything acknowledged so far durable before closing.
        if self.durability == Durability::Relaxed {
            if let Ok(txn) = self.db.begin_write() {
                let _ = txn.commit();
            }
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
