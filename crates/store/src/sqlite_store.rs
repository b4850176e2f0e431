//! The SQLite backend: rusqlite with bundled SQLite, WAL, safe for several processes on one file.
//!
//! Each write transaction is `BEGIN IMMEDIATE` (the write lock is taken before the session is
//! read), so a read-modify-write can never interleave with another process's; a writer waits up
//! to the busy timeout for another process's lock. Reads run in deferred transactions on pooled
//! connections, which WAL lets proceed beside the writer.
//!
//! Every row carries a checksum, verified on every read, and opening a store checks the page
//! structure and every record (`sqlite_integrity`): damage is `Corrupt`, never a changed or
//! missing record.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use serde_json::{Map, Value};

use crate::durable::{create_owner_only, impl_durable_store, Durable, Readers};
use crate::logic::{check_record, LeaseTxn, ReadTxn, WriteTxn};
use crate::sqlite_integrity::{self, row_checksum, Checksum, RawRow, ScannedSession};
use crate::writer::{Engine, Writer};
use crate::{
    Binding, Durability, Lease, LeaseOwner, OpenOptions, ProcessIdentity, SessionRecord,
    StoreError, TranscriptRow, SCHEMA_VERSION,
};

/// `PRAGMA application_id` of a rethread store ("rthd"): tells our files from other SQLite files.
const APPLICATION_ID: i64 = 0x7274_6864;

/// Schema 1 as it was first released. Migrations start from it, so it never changes.
const SCHEMA_V1: &str = "
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY NOT NULL,
    model_config TEXT NOT NULL,
    binding_thread_id TEXT,
    binding_codex_home TEXT,
    bound_at_ms INTEGER,
    row_count INTEGER NOT NULL,
    retired_threads TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE transcript_rows (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
";

/// Session leases, added to schema 1 without a version bump (a schema-1 file may lack the
/// table, so the step to schema 2 creates it if missing). A free lease keeps its row so
/// `fence` keeps growing. Expiry is judged by the clock of the machine the processes share.
const LEASES_V1: &str = "
CREATE TABLE IF NOT EXISTS leases (
    session_id TEXT PRIMARY KEY NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started_at_ms INTEGER NOT NULL,
    instance INTEGER NOT NULL,
    acquired_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    fence INTEGER NOT NULL
) WITHOUT ROWID;
";

/// Schema 2: every row carries a CRC-32 of its fields (see `sqlite_integrity`). The existing
/// rows get theirs in the same migration transaction.
const SCHEMA_V2_COLUMNS: &str = "
ALTER TABLE sessions ADD COLUMN checksum INTEGER NOT NULL DEFAULT 0;
ALTER TABLE transcript_rows ADD COLUMN checksum INTEGER NOT NULL DEFAULT 0;
ALTER TABLE leases ADD COLUMN checksum INTEGER NOT NULL DEFAULT 0;
";

/// Schema 3: a lease names its holder's process identity (`ProcessIdentity`), so a dead
/// holder on the same machine can be told from a live one. A lease without one sums as in
/// schema 2, so existing rows keep their checksums.
const SCHEMA_V3_COLUMNS: &str = "
ALTER TABLE leases ADD COLUMN process_space TEXT;
ALTER TABLE leases ADD COLUMN process_start INTEGER;
";

/// The tables a current store has.
const TABLES: [&str; 3] = ["sessions", "transcript_rows", "leases"];

/// A [`BindingStore`](crate::BindingStore) in one SQLite file (WAL mode).
#[derive(Debug)]
pub struct SqliteStore {
    inner: Durable,
    path: PathBuf,
}

impl_durable_store!(SqliteStore);

impl SqliteStore {
    /// Opens (or creates, owner-only) the store at `path`, migrating an older schema.
    ///
    /// Errors: [`StoreError::Corrupt`] for a damaged or foreign file,
    /// [`StoreError::NewerSchema`] for a file from a newer rethread, [`StoreError::Locked`] if
    /// another process holds the write lock past the busy timeout. The file is opened on the
    /// store's writer thread.
    pub async fn open(path: impl AsRef<Path>, options: OpenOptions) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let open_path = path.clone();
        let (max_batch, spin) = (options.max_batch, options.lone_write_spin);
        let (writer, readers) = Writer::spawn("sqlite", max_batch, spin, move || {
            let label = open_path.display().to_string();
            let conn = open_writer(&open_path, &options, &label)?;
            let readers = SqliteReaders {
                path: open_path,
                label: label.clone(),
                busy_timeout: options.busy_timeout,
                pool: Mutex::new(Vec::new()),
            };
            Ok((
                SqliteEngine {
                    conn,
                    label,
                    data_version: None,
                },
                readers,
            ))
        })
        .await?;
        Ok(SqliteStore {
            inner: Durable {
                writer,
                readers: Arc::new(readers),
                local_leases: None,
            },
            path,
        })
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Finishes queued writes and closes the connections.
    pub async fn close(self) {
        let SqliteStore { inner, .. } = self;
        let Durable {
            writer, readers, ..
        } = inner;
        drop(readers);
        writer.close().await;
    }
}

/// Maps every rusqlite error to a [`StoreError`]. The one place SQLite errors are interpreted.
pub(crate) fn map_sqlite_error(path: &str, error: rusqlite::Error) -> StoreError {
    use rusqlite::ffi::ErrorCode;
    if let rusqlite::Error::SqliteFailure(failure, _) = &error {
        match failure.code {
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => {
                return StoreError::Locked {
                    path: path.to_string(),
                }
            }
            ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt => {
                return StoreError::Corrupt {
                    path: path.to_string(),
                    detail: "SQLite reports the file is damaged or not a database".to_string(),
                    source: Some(Box::new(error)),
                }
            }
            _ => {}
        }
    }
    if matches!(
        error,
        rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
            | rusqlite::Error::Utf8Error(..)
    ) {
        // Our own columns hold what we wrote: a value of another type is damage.
        return StoreError::Corrupt {
            path: path.to_string(),
            detail: "a column holds a value of the wrong type".to_string(),
            source: Some(Box::new(error)),
        };
    }
    StoreError::Backend {
        backend: "sqlite",
        source: Box::new(error),
    }
}

fn connect(path: &Path, label: &str, busy: std::time::Duration) -> Result<Connection, StoreError> {
    // The file exists already (created owner-only by `create_owner_only`); never let SQLite
    // create it with default permissions.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| map_sqlite_error(label, e))?;
    conn.busy_timeout(busy)
        .map_err(|e| map_sqlite_error(label, e))?;
    Ok(conn)
}

/// A non-empty file must start with SQLite's magic. SQLite reads a file shorter than its
/// header as a new, empty database, so a truncated store would open empty and be initialised
/// over (found by the `store_files` fuzz target). An empty file is a new store.
fn check_header(path: &Path, label: &str) -> Result<(), StoreError> {
    use std::io::Read;
    let io = |source| StoreError::Io {
        path: label.to_string(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut magic = Vec::with_capacity(16);
    file.take(16).read_to_end(&mut magic).map_err(io)?;
    if !magic.is_empty() && magic != b"SQLite format 3\0" {
        return Err(StoreError::corrupt(
            label,
            "not an SQLite file (truncated or damaged header)",
        ));
    }
    Ok(())
}

fn open_writer(path: &Path, options: &OpenOptions, label: &str) -> Result<Connection, StoreError> {
    create_owner_only(path, options.create)?;
    check_header(path, label)?;
    let mut conn = connect(path, label, options.busy_timeout)?;
    let map = |e| map_sqlite_error(label, e);
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .map_err(map)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Backend {
            backend: "sqlite",
            source: format!("could not enable WAL (journal_mode is {mode})").into(),
        });
    }
    let sync = match options.durability {
        Durability::Relaxed => "NORMAL",
        _ => "FULL",
    };
    conn.execute_batch(&format!("PRAGMA synchronous={sync};"))
        .map_err(map)?;
    ensure_schema(&mut conn, label)?;
    verify_structure(&conn, label)?;
    verify_records(&mut conn, label)?;
    Ok(conn)
}

/// `PRAGMA quick_check`: a damaged page structure (a B-tree that would read as empty or short)
/// is caught here and refused as `Corrupt` instead of being served. It reads the whole file,
/// once per open; damage inside a record is left to the record checksums (`verify_records`).
fn verify_structure(conn: &Connection, label: &str) -> Result<(), StoreError> {
    let map = |e| map_sqlite_error(label, e);
    let mut statement = conn.prepare("PRAGMA quick_check").map_err(map)?;
    let problems: Vec<String> = statement
        .query_map([], |row| row.get::<_, String>(0))
        .map_err(map)?
        .collect::<Result<_, _>>()
        .map_err(map)?;
    if problems.len() == 1 && problems[0] == "ok" {
        return Ok(());
    }
    Err(StoreError::corrupt(
        label,
        format!("SQLite structure check failed: {}", problems.join("; ")),
    ))
}

/// Checks the schema version, initialising a new file and migrating an older one, all in one
/// immediate transaction (two processes opening a new file at once are serialised).
fn ensure_schema(conn: &mut Connection, label: &str) -> Result<(), StoreError> {
    let map = |e| map_sqlite_error(label, e);
    let txn = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(map)?;
    let app_id: i64 = txn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(map)?;
    let version: i64 = txn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(map)?;
    let tables: i64 = txn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
            [],
            |r| r.get(0),
        )
        .map_err(map)?;
    if app_id == 0 && version == 0 && tables == 0 {
        migrate(&txn, 0, label)?;
        return txn.commit().map_err(map);
    }
    if app_id != APPLICATION_ID {
        return Err(StoreError::corrupt(
            label,
            "not a rethread store (foreign SQLite file)",
        ));
    }
    let version = version as u64;
    if version > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: label.to_string(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    if version < SCHEMA_VERSION {
        migrate(&txn, version, label)?;
        return txn.commit().map_err(map);
    }
    for table in TABLES {
        let n: i64 = txn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
                [table],
                |r| r.get(0),
            )
            .map_err(map)?;
        if n != 1 {
            return Err(StoreError::corrupt(
                label,
                format!("table {table} is missing"),
            ));
        }
    }
    txn.commit().map_err(map)
}

/// Brings a store from schema `from` to [`SCHEMA_VERSION`] inside `txn`. Each step is one arm;
/// version 0 is a new, empty file.
fn migrate(txn: &rusqlite::Transaction<'_>, from: u64, label: &str) -> Result<(), StoreError> {
    let map = |e| map_sqlite_error(label, e);
    let mut version = from;
    while version < SCHEMA_VERSION {
        match version {
            0 => {
                txn.execute_batch(SCHEMA_V1).map_err(map)?;
                txn.execute_batch(LEASES_V1).map_err(map)?;
            }
            1 => {
                txn.execute_batch(LEASES_V1).map_err(map)?;
                txn.execute_batch(SCHEMA_V2_COLUMNS).map_err(map)?;
            }
            2 => txn.execute_batch(SCHEMA_V3_COLUMNS).map_err(map)?,
            other => {
                return Err(StoreError::corrupt(
                    label,
                    format!("unknown schema version {other}"),
                ))
            }
        }
        version += 1;
    }
    // Rows of schema 1 get their checksums once every column of the current schema exists.
    if from == 1 {
        backfill_checksums(txn, label)?;
    }
    txn.execute_batch(&format!(
        "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {SCHEMA_VERSION};"
    ))
    .map_err(map)
}

/// Gives every row of a store migrated from schema 1 its checksum (inside the migration's
/// transaction). Keys and sums are collected first: SQLite does not define what a scan sees of
/// rows updated while it runs.
fn backfill_checksums(txn: &rusqlite::Transaction<'_>, label: &str) -> Result<(), StoreError> {
    let map = |e| map_sqlite_error(label, e);
    let sessions: Vec<(String, i64)> = txn
        .prepare(&format!("SELECT {RECORD_COLUMNS}, checksum FROM sessions"))
        .and_then(|mut s| {
            s.query_map([], |row| {
                let raw = raw_record(row)?;
                Ok((raw.session_id.clone(), raw.fields_checksum()))
            })?
            .collect()
        })
        .map_err(map)?;
    let mut update = txn
        .prepare("UPDATE sessions SET checksum = ?2 WHERE session_id = ?1")
        .map_err(map)?;
    for (id, sum) in sessions {
        update.execute(params![id, sum]).map_err(map)?;
    }
    let rows: Vec<(String, i64, i64)> = txn
        .prepare("SELECT session_id, seq, body FROM transcript_rows")
        .and_then(|mut s| {
            s.query_map([], |row| {
                let (id, seq, body): (String, i64, String) =
                    (row.get(0)?, row.get(1)?, row.get(2)?);
                let sum = row_checksum(&id, seq, &body);
                Ok((id, seq, sum))
            })?
            .collect()
        })
        .map_err(map)?;
    let mut update = txn
        .prepare("UPDATE transcript_rows SET checksum = ?3 WHERE session_id = ?1 AND seq = ?2")
        .map_err(map)?;
    for (id, seq, sum) in rows {
        update.execute(params![id, seq, sum]).map_err(map)?;
    }
    let leases: Vec<(String, i64)> = txn
        .prepare(&format!("SELECT {LEASE_COLUMNS}, checksum FROM leases"))
        .and_then(|mut s| {
            s.query_map([], |row| {
                let raw = RawLease::from_row(row)?;
                Ok((raw.session_id.clone(), raw.fields_checksum()))
            })?
            .collect()
        })
        .map_err(map)?;
    let mut update = txn
        .prepare("UPDATE leases SET checksum = ?2 WHERE session_id = ?1")
        .map_err(map)?;
    for (id, sum) in leases {
        update.execute(params![id, sum]).map_err(map)?;
    }
    Ok(())
}

/// Reads every record once and verifies it (`sqlite_integrity::verify_all`).
fn verify_records(conn: &mut Connection, label: &str) -> Result<(), StoreError> {
    let map = |e| map_sqlite_error(label, e);
    sqlite_integrity::verify_all(
        conn,
        label,
        &format!("SELECT {RECORD_COLUMNS}, checksum FROM sessions ORDER BY session_id"),
        &|row| {
            let record = decode_record(label, raw_record(row).map_err(map)?)?;
            Ok(ScannedSession {
                session_id: record.session_id,
                row_count: record.row_count,
            })
        },
        &format!("SELECT {LEASE_COLUMNS}, checksum FROM leases"),
        &|row| {
            RawLease::from_row(row)
                .map_err(map)?
                .into_lease(label)
                .map(drop)
        },
    )
}

/// One transaction's view of a connection (the caller began and will end the transaction).
struct Txn<'c> {
    conn: &'c Connection,
    label: &'c str,
}

impl Txn<'_> {
    fn map(&self, e: rusqlite::Error) -> StoreError {
        map_sqlite_error(self.label, e)
    }
}

fn corrupt_json(label: &str, what: String, e: serde_json::Error) -> StoreError {
    StoreError::Corrupt {
        path: label.to_string(),
        detail: format!("{what} does not decode"),
        source: Some(Box::new(e)),
    }
}

/// Verifies a stored session row and decodes it.
fn decode_record(label: &str, raw: RawRecord) -> Result<SessionRecord, StoreError> {
    sqlite_integrity::verify(
        label,
        || format!("session {}", raw.session_id),
        raw.checksum,
        raw.fields_checksum(),
    )?;
    let id = raw.session_id;
    let model_config: Map<String, Value> = serde_json::from_str(&raw.model_config)
        .map_err(|e| corrupt_json(label, format!("model_config of {id}"), e))?;
    let retired_threads: Vec<String> = serde_json::from_str(&raw.retired_threads)
        .map_err(|e| corrupt_json(label, format!("retired_threads of {id}"), e))?;
    let row_count = u64::try_from(raw.row_count)
        .map_err(|_| StoreError::corrupt(label, format!("session {id}: negative row count")))?;
    let binding = raw.binding_thread_id.map(|thread_id| Binding {
        thread_id,
        codex_home: raw.binding_codex_home,
        bound_at_ms: raw.bound_at_ms.unwrap_or(0),
    });
    let record = SessionRecord {
        session_id: id,
        model_config,
        binding,
        row_count,
        retired_threads,
        created_at_ms: raw.created_at_ms,
        updated_at_ms: raw.updated_at_ms,
    };
    check_record(&record)
        .map_err(|d| StoreError::corrupt(label, format!("session {}: {d}", record.session_id)))?;
    Ok(record)
}

/// A `sessions` row as stored: JSON columns as text, integers as SQLite has them.
struct RawRecord {
    session_id: String,
    model_config: String,
    binding_thread_id: Option<String>,
    binding_codex_home: Option<String>,
    bound_at_ms: Option<i64>,
    row_count: i64,
    retired_threads: String,
    created_at_ms: i64,
    updated_at_ms: i64,
    /// The stored checksum (0 in a row being migrated from schema 1).
    checksum: i64,
}

impl RawRecord {
    fn encode(record: &SessionRecord) -> Result<RawRecord, StoreError> {
        let json = |e| StoreError::Backend {
            backend: "sqlite",
            source: Box::new(e),
        };
        let binding = record.binding.as_ref();
        let mut raw = RawRecord {
            session_id: record.session_id.clone(),
            model_config: serde_json::to_string(&record.model_config).map_err(json)?,
            binding_thread_id: binding.map(|b| b.thread_id.clone()),
            binding_codex_home: binding.and_then(|b| b.codex_home.clone()),
            bound_at_ms: binding.map(|b| b.bound_at_ms),
            row_count: record.row_count.min(i64::MAX as u64) as i64,
            retired_threads: serde_json::to_string(&record.retired_threads).map_err(json)?,
            created_at_ms: record.created_at_ms,
            updated_at_ms: record.updated_at_ms,
            checksum: 0,
        };
        raw.checksum = raw.fields_checksum();
        Ok(raw)
    }

    /// The checksum of the fields as stored.
    fn fields_checksum(&self) -> i64 {
        Checksum::of("sessions")
            .text(&self.session_id)
            .text(&self.model_config)
            .opt_text(self.binding_thread_id.as_deref())
            .opt_text(self.binding_codex_home.as_deref())
            .opt_int(self.bound_at_ms)
            .int(self.row_count)
            .text(&self.retired_threads)
            .int(self.created_at_ms)
            .int(self.updated_at_ms)
            .finish()
    }
}

/// The `sessions` columns, in the order `raw_record` expects them; every query selects
/// `checksum` after them.
const RECORD_COLUMNS: &str = "session_id, model_config, binding_thread_id, binding_codex_home, \
     bound_at_ms, row_count, retired_threads, created_at_ms, updated_at_ms";

fn raw_record(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawRecord> {
    Ok(RawRecord {
        session_id: row.get(0)?,
        model_config: row.get(1)?,
        binding_thread_id: row.get(2)?,
        binding_codex_home: row.get(3)?,
        bound_at_ms: row.get(4)?,
        row_count: row.get(5)?,
        retired_threads: row.get(6)?,
        created_at_ms: row.get(7)?,
        updated_at_ms: row.get(8)?,
        checksum: row.get(9)?,
    })
}

/// The `leases` columns, in the order [`RawLease::from_row`] expects them (then `checksum`).
const LEASE_COLUMNS: &str = "session_id, host, pid, started_at_ms, instance, acquired_at_ms, \
     expires_at_ms, fence, process_space, process_start";

/// A `leases` row as stored.
struct RawLease {
    session_id: String,
    host: String,
    pid: i64,
    started_at_ms: i64,
    instance: i64,
    acquired_at_ms: i64,
    expires_at_ms: i64,
    fence: i64,
    process_space: Option<String>,
    process_start: Option<i64>,
    checksum: i64,
}

impl RawLease {
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawLease> {
        Ok(RawLease {
            session_id: row.get(0)?,
            host: row.get(1)?,
            pid: row.get(2)?,
            started_at_ms: row.get(3)?,
            instance: row.get(4)?,
            acquired_at_ms: row.get(5)?,
            expires_at_ms: row.get(6)?,
            fence: row.get(7)?,
            process_space: row.get(8)?,
            process_start: row.get(9)?,
            checksum: row.get(10)?,
        })
    }

    fn encode(lease: &Lease) -> RawLease {
        let mut raw = RawLease {
            session_id: lease.session_id.clone(),
            host: lease.owner.host.clone(),
            pid: i64::from(lease.owner.pid),
            started_at_ms: lease.owner.started_at_ms,
            instance: lease.owner.instance as i64,
            acquired_at_ms: lease.acquired_at_ms,
            expires_at_ms: lease.expires_at_ms,
            fence: lease.fence as i64,
            process_space: lease.owner.process.as_ref().map(|p| p.space.clone()),
            process_start: lease.owner.process.as_ref().map(|p| p.start_ticks as i64),
            checksum: 0,
        };
        raw.checksum = raw.fields_checksum();
        raw
    }

    fn fields_checksum(&self) -> i64 {
        let sum = Checksum::of("leases")
            .text(&self.session_id)
            .text(&self.host)
            .int(self.pid)
            .int(self.started_at_ms)
            .int(self.instance)
            .int(self.acquired_at_ms)
            .int(self.expires_at_ms)
            .int(self.fence);
        // Schema 3's columns join the sum only when set: a lease without a process identity
        // sums as in schema 2. One set and not the other does not match any written sum.
        let sum = match &self.process_space {
            Some(space) => sum.text(space),
            None => sum,
        };
        match self.process_start {
            Some(start) => sum.int(start),
            None => sum,
        }
        .finish()
    }

    /// Verifies the row and decodes it.
    fn into_lease(self, label: &str) -> Result<Lease, StoreError> {
        sqlite_integrity::verify(
            label,
            || format!("lease of session {}", self.session_id),
            self.checksum,
            self.fields_checksum(),
        )?;
        let pid = u32::try_from(self.pid).map_err(|_| {
            StoreError::corrupt(label, format!("lease of {}: bad pid", self.session_id))
        })?;
        let process = match (self.process_space, self.process_start) {
            (Some(space), Some(start)) => Some(ProcessIdentity {
                space,
                start_ticks: start as u64,
            }),
            (None, None) => None,
            _ => {
                return Err(StoreError::corrupt(
                    label,
                    format!("lease of {}: half a process identity", self.session_id),
                ))
            }
        };
        Ok(Lease {
            session_id: self.session_id,
            owner: LeaseOwner {
                host: self.host,
                pid,
                started_at_ms: self.started_at_ms,
                instance: self.instance as u64,
                process,
            },
            acquired_at_ms: self.acquired_at_ms,
            expires_at_ms: self.expires_at_ms,
            fence: self.fence as u64,
        })
    }
}

impl ReadTxn for Txn<'_> {
    fn load(&mut self, session_id: &str) -> Result<Option<SessionRecord>, StoreError> {
        let raw = self
            .conn
            .prepare_cached(&format!(
                "SELECT {RECORD_COLUMNS}, checksum FROM sessions WHERE session_id = ?1"
            ))
            .and_then(|mut s| s.query_row([session_id], raw_record).optional())
            .map_err(|e| self.map(e))?;
        raw.map(|raw| decode_record(self.label, raw)).transpose()
    }

    fn load_rows(
        &mut self,
        session_id: &str,
        range: Range<u64>,
    ) -> Result<Vec<TranscriptRow>, StoreError> {
        let start = range.start.min(i64::MAX as u64) as i64;
        let end = range.end.min(i64::MAX as u64) as i64;
        let raw: Vec<RawRow> = self
            .conn
            .prepare_cached(&format!(
                "SELECT {} FROM transcript_rows \
                 WHERE session_id = ?1 AND seq >= ?2 AND seq < ?3 ORDER BY seq",
                RawRow::COLUMNS
            ))
            .and_then(|mut s| {
                s.query_map(params![session_id, start, end], RawRow::from_row)?
                    .collect()
            })
            .map_err(|e| self.map(e))?;
        raw.into_iter()
            .map(|raw| {
                raw.verify(self.label)?;
                let body = serde_json::from_str(&raw.body).map_err(|e| {
                    corrupt_json(self.label, format!("row {} of {session_id}", raw.seq), e)
                })?;
                Ok(TranscriptRow {
                    seq: raw.seq as u64,
                    body,
                })
            })
            .collect()
    }

    fn list(
        &mut self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let limit = limit.min(i64::MAX as usize) as i64;
        let raw: Vec<RawRecord> = match after {
            Some(after) => self
                .conn
                .prepare_cached(&format!(
                    "SELECT {RECORD_COLUMNS}, checksum FROM sessions WHERE session_id > ?1 \
                     ORDER BY session_id LIMIT ?2"
                ))
                .and_then(|mut s| s.query_map(params![after, limit], raw_record)?.collect()),
            None => self
                .conn
                .prepare_cached(&format!(
                    "SELECT {RECORD_COLUMNS}, checksum FROM sessions ORDER BY session_id LIMIT ?1"
                ))
                .and_then(|mut s| s.query_map(params![limit], raw_record)?.collect()),
        }
        .map_err(|e| self.map(e))?;
        raw.into_iter()
            .map(|r| decode_record(self.label, r))
            .collect()
    }
}

impl WriteTxn for Txn<'_> {
    fn put(&mut self, record: &SessionRecord) -> Result<(), StoreError> {
        let raw = RawRecord::encode(record)?;
        self.conn
            .prepare_cached(&format!(
                "INSERT INTO sessions ({RECORD_COLUMNS}, checksum) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
                 ON CONFLICT (session_id) DO UPDATE SET model_config = excluded.model_config, \
                 binding_thread_id = excluded.binding_thread_id, \
                 binding_codex_home = excluded.binding_codex_home, \
                 bound_at_ms = excluded.bound_at_ms, row_count = excluded.row_count, \
                 retired_threads = excluded.retired_threads, \
                 created_at_ms = excluded.created_at_ms, updated_at_ms = excluded.updated_at_ms, \
                 checksum = excluded.checksum"
            ))
            .and_then(|mut s| {
                s.execute(params![
                    raw.session_id,
                    raw.model_config,
                    raw.binding_thread_id,
                    raw.binding_codex_home,
                    raw.bound_at_ms,
                    raw.row_count,
                    raw.retired_threads,
                    raw.created_at_ms,
                    raw.updated_at_ms,
                    raw.checksum,
                ])
            })
            .map_err(|e| self.map(e))?;
        Ok(())
    }

    fn put_row(&mut self, session_id: &str, seq: u64, body: &Value) -> Result<(), StoreError> {
        // A plain INSERT: rows are append-only, and a duplicate key means the record's row
        // count is wrong, which must fail loudly rather than overwrite.
        let seq = seq.min(i64::MAX as u64) as i64;
        let body = body.to_string();
        let checksum = row_checksum(session_id, seq, &body);
        self.conn
            .prepare_cached(
                "INSERT INTO transcript_rows (session_id, seq, body, checksum) \
                 VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut s| s.execute(params![session_id, seq, body, checksum]))
            .map_err(|e| self.map(e))?;
        Ok(())
    }

    fn remove(&mut self, session_id: &str) -> Result<bool, StoreError> {
        self.conn
            .prepare_cached("DELETE FROM transcript_rows WHERE session_id = ?1")
            .and_then(|mut s| s.execute([session_id]))
            .map_err(|e| self.map(e))?;
        let n = self
            .conn
            .prepare_cached("DELETE FROM sessions WHERE session_id = ?1")
            .and_then(|mut s| s.execute([session_id]))
            .map_err(|e| self.map(e))?;
        Ok(n > 0)
    }

    fn leases(&mut self) -> Option<&mut dyn LeaseTxn> {
        Some(self)
    }
}

impl LeaseTxn for Txn<'_> {
    fn load_lease(&mut self, session_id: &str) -> Result<Option<Lease>, StoreError> {
        let raw = self
            .conn
            .prepare_cached(&format!(
                "SELECT {LEASE_COLUMNS}, checksum FROM leases WHERE session_id = ?1"
            ))
            .and_then(|mut s| s.query_row([session_id], RawLease::from_row).optional())
            .map_err(|e| self.map(e))?;
        raw.map(|raw| raw.into_lease(self.label)).transpose()
    }

    fn put_lease(&mut self, lease: &Lease) -> Result<(), StoreError> {
        let raw = RawLease::encode(lease);
        self.conn
            .prepare_cached(&format!(
                "INSERT OR REPLACE INTO leases ({LEASE_COLUMNS}, checksum) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
            ))
            .and_then(|mut s| {
                s.execute(params![
                    raw.session_id,
                    raw.host,
                    raw.pid,
                    raw.started_at_ms,
                    raw.instance,
                    raw.acquired_at_ms,
                    raw.expires_at_ms,
                    raw.fence,
                    raw.process_space,
                    raw.process_start,
                    raw.checksum,
                ])
            })
            .map_err(|e| self.map(e))?;
        Ok(())
    }
}

struct SqliteEngine {
    conn: Connection,
    label: String,
    /// `PRAGMA data_version` seen in the previous write transaction.
    data_version: Option<i64>,
}

impl Engine for SqliteEngine {
    fn write(
        &mut self,
        f: &mut dyn FnMut(&mut dyn WriteTxn, bool) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let label = self.label.as_str();
        // IMMEDIATE: take the write lock before reading, so another process's write cannot
        // slip between our read of a session and our write of it.
        let txn = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| map_sqlite_error(label, e))?;
        // Under the write lock: has any other connection (process) committed since our last
        // transaction? `data_version` changes only for other connections' commits.
        let version: i64 = txn
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut s| s.query_row([], |r| r.get(0)))
            .map_err(|e| map_sqlite_error(label, e))?;
        let others_wrote = self.data_version != Some(version);
        self.data_version = Some(version);
        f(&mut Txn { conn: &txn, label }, others_wrote)?;
        txn.commit().map_err(|e| map_sqlite_error(label, e))
    }
}

#[derive(Debug)]
struct SqliteReaders {
    path: PathBuf,
    label: String,
    busy_timeout: std::time::Duration,
    pool: Mutex<Vec<Connection>>,
}

impl Readers for SqliteReaders {
    fn read(
        &self,
        f: &mut dyn FnMut(&mut dyn ReadTxn) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let label = self.label.as_str();
        let pooled = self.pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut conn = match pooled {
            Some(conn) => conn,
            None => {
                let conn = connect(&self.path, label, self.busy_timeout)?;
                conn.execute_batch("PRAGMA query_only = ON;")
                    .map_err(|e| map_sqlite_error(label, e))?;
                conn
            }
        };
        let result = (|| {
            // One deferred transaction: every statement of this read sees the same snapshot.
            let txn = conn.transaction().map_err(|e| map_sqlite_error(label, e))?;
            f(&mut Txn { conn: &txn, label })?;
            txn.commit().map_err(|e| map_sqlite_error(label, e))
        })();
        if result.is_ok() {
            self.pool
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(conn);
        }
        result
    }
}
