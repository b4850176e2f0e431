//! The SQLite backend: rusqlite with bundled SQLite, WAL, safe for several processes on one file.
//!
//! Each write transaction is `BEGIN IMMEDIATE` (the write lock is taken before the session is
//! read), so a read-modify-write never interleaves with another process's; a writer waits up
//! to the busy timeout for another process's lock. Reads run in deferred transactions on
//! pooled connections, which WAL lets proceed beside the writer.

mod integrity;
mod schema;
mod txn;

use crate::Unpoisoned;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use crate::durable::{prepare_file, Durable, FileEngine, FileId, Readers, Writer};
use crate::logic::{ReadTxn, WriteTxn};
use crate::verify::Checker;
use crate::Result;
use crate::{BoxError, Durability, OpenOptions, StoreError};

/// Opens the SQLite engine of [`BindingStore::sqlite`](crate::BindingStore::sqlite).
pub(crate) async fn open(path: &Path, options: OpenOptions) -> Result<Durable> {
    let read_only = options.read_only.then(|| crate::redact::path_label(path));
    let open_path = path.to_path_buf();
    let clock = options.clock.clone();
    let (writer, readers) = Writer::spawn("sqlite", clock.clone(), move || {
        let label = crate::redact::path_label(&open_path);
        let (conn, file_id) = open_writer(&open_path, &options, &label)?;
        let readers = SqliteReaders {
            path: open_path.clone(),
            label: label.clone(),
            busy_timeout: options.busy_timeout(),
            immutable: read_immutable(&open_path, &options),
            pool: Mutex::new(Vec::new()),
        };
        let incremental_vacuum = conn
            .query_row("PRAGMA auto_vacuum", [], |r| r.get::<_, i64>(0))
            .sqlite(&label)?
            == 2;
        let engine = SqliteEngine {
            conn,
            label,
            path: open_path,
            file_id,
            busy_timeout: options.busy_timeout(),
            incremental_vacuum,
            upkeep_due: None,
        };
        Ok((engine, readers))
    })
    .await?;
    Ok(Durable::new(
        writer,
        Arc::new(readers),
        None,
        read_only,
        clock,
    ))
}

fn connect(path: &Path, label: &str, busy: Duration, immutable: bool) -> Result<Connection> {
    // The file exists already (created owner-only); never let SQLite create it. Read-write
    // even for a store opened read-only: its writes are refused before they reach SQLite,
    // which then removes the `-wal` and `-shm` files it makes when the last connection closes
    // (a read-only connection leaves them). A file this process cannot write is read
    // `immutable` ([`read_immutable`]).
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = match immutable {
        false => Connection::open_with_flags(path, flags),
        true => {
            use percent_encoding::{utf8_percent_encode, CONTROLS};
            const IN_URI: &percent_encoding::AsciiSet = &CONTROLS.add(b'%').add(b'?').add(b'#');
            let path = std::path::absolute(path).map_err(|e| StoreError::io(label, e))?;
            let path = utf8_percent_encode(&path.to_string_lossy(), IN_URI).to_string();
            let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_URI
                | OpenFlags::SQLITE_OPEN_NO_MUTEX;
            Connection::open_with_flags(format!("file://{path}?immutable=1"), flags)
        }
    };
    let conn = conn.sqlite(label)?;
    conn.busy_timeout(busy).sqlite(label)?;
    Ok(conn)
}

/// A non-empty file must start with SQLite's magic: SQLite reads a file shorter than its
/// header as a new, empty database, and a truncated store would be initialised over.
fn check_header(path: &Path, label: &str) -> Result<()> {
    use std::io::Read;
    let io = |source| StoreError::io(label, source);
    let file = std::fs::File::open(path).map_err(io)?;
    let mut magic = Vec::with_capacity(16);
    file.take(16).read_to_end(&mut magic).map_err(io)?;
    if !magic.is_empty() && magic != b"SQLite format 3\0" {
        let detail = "not an SQLite file (truncated or damaged header)";
        return Err(StoreError::corrupt(label, detail));
    }
    Ok(())
}

/// Whether a store opened read-only is read `immutable`: SQLite then takes no lock and makes no
/// `-shm` or `-wal` file beside it. So it is when this process cannot write the file and no
/// writer has it open (no `-wal` and `-shm` to read through): the files SQLite would make
/// there would stay, owned by this user, and the owner could no longer write its store. (A
/// writer that starts meanwhile writes into its `-wal`; only its checkpoint, rare during one
/// command, changes the file under the read.)
fn read_immutable(path: &Path, options: &OpenOptions) -> bool {
    let beside = |suffix: &str| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        Path::new(&name).exists()
    };
    options.read_only
        && std::fs::OpenOptions::new().write(true).open(path).is_err()
        && !(beside("-wal") && beside("-shm"))
}

fn open_writer(path: &Path, options: &OpenOptions, label: &str) -> Result<(Connection, FileId)> {
    prepare_file(path, options)?;
    check_header(path, label)?;
    let immutable = read_immutable(path, options);
    let mut conn = connect(path, label, options.busy_timeout(), immutable)?;
    let file_id = FileId::of_path(path)?;
    // Durable: every commit synced, with `F_FULLFSYNC` where the platform has it (on macOS a
    // plain fsync leaves the data in the drive's cache). Relaxed: WAL commits are synced at
    // checkpoints, so only a power failure or OS crash can lose the last ones.
    let pragmas = match options.durability {
        Durability::Relaxed => "PRAGMA synchronous=NORMAL;",
        _ => "PRAGMA synchronous=FULL; PRAGMA fullfsync=ON; PRAGMA checkpoint_fullfsync=ON;",
    };
    conn.execute_batch(pragmas).sqlite(label)?;
    // What a removal deletes is overwritten with zeros, not left in free pages; a new store
    // gives free pages back to the file system (`maintain`). Neither writes the file here:
    // `auto_vacuum` only takes effect when the schema is first created.
    if !options.read_only {
        let forget = "PRAGMA secure_delete=ON; PRAGMA auto_vacuum=INCREMENTAL;";
        conn.execute_batch(forget).sqlite(label)?;
    }
    // Nothing here reads the store's records. The schema is checked before WAL is switched
    // on: the switch is written into the file's header, and a foreign file is refused
    // unchanged. A store opened read-only keeps the journal mode it has.
    schema::ensure_schema(&mut conn, label, options.may_create())?;
    if !options.read_only {
        // Where a sealed store keeps its key check (`seal.rs`); stores made before sealed
        // stores lack it, and a read-only open reads its absence as never sealed.
        let meta = "CREATE TABLE IF NOT EXISTS rethread_meta \
                    (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) WITHOUT ROWID;";
        conn.execute_batch(meta).sqlite(label)?;
        enable_wal(&conn, label, options.busy_timeout())?;
    }
    Ok((conn, file_id))
}

/// Puts the file in WAL mode (kept in the file). Switching takes an exclusive lock, which
/// SQLite refuses at once (`database is locked`, no busy wait) to processes that create a
/// store together: retried until the busy timeout.
fn enable_wal(conn: &Connection, label: &str, busy: Duration) -> Result<()> {
    let deadline = Instant::now() + busy;
    loop {
        let mode = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get::<_, String>(0));
        match mode.sqlite(label) {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => return Ok(()),
            Ok(mode) => {
                return Err(StoreError::Backend {
                    backend: "sqlite",
                    source: format!("could not enable WAL (journal_mode is {mode})").into(),
                })
            }
            Err(StoreError::Locked { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(error) => return Err(error),
        }
    }
}

struct SqliteEngine {
    conn: Connection,
    label: String,
    path: PathBuf,
    /// The file the path named at open: a commit into one deleted or replaced since is refused.
    file_id: FileId,
    busy_timeout: Duration,
    /// The file gives free pages back (`auto_vacuum = INCREMENTAL`: stores created since).
    incremental_vacuum: bool,
    /// When the next step of the upkeep after a removal is due (`maintain`); `None`: none owed.
    upkeep_due: Option<Instant>,
}

impl FileEngine for SqliteEngine {
    fn write(&mut self, f: &mut dyn FnMut(&mut dyn WriteTxn) -> Result<()>) -> Result<()> {
        let label = self.label.as_str();
        let txn = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate);
        let txn = txn.sqlite(label)?;
        let mut view = txn::view(&txn, label);
        f(&mut view)?;
        let removed = view.removed;
        self.file_id.check(&self.path, label)?;
        txn.commit().sqlite(label)?;
        if removed {
            self.maintain();
        }
        Ok(())
    }

    fn flush_due(&self) -> Option<Instant> {
        self.upkeep_due
    }

    /// Another step of the upkeep a removal left, once no write is waiting.
    fn flush(&mut self) {
        if self.upkeep_due.is_some() {
            self.maintain();
        }
    }
}

/// Pages one step of the incremental vacuum frees at most (4 MiB of 4 KiB pages): a writer
/// waits for one step at most.
const VACUUM_STEP_PAGES: u32 = 1024;

/// How long a checkpoint waits for readers of older snapshots before it is left for the next
/// step.
const CHECKPOINT_WAIT: Duration = Duration::from_millis(200);

/// How long after a step that could not finish (readers kept the checkpoint waiting, or it
/// failed) the next one is tried.
const UPKEEP_RETRY: Duration = Duration::from_secs(1);

impl SqliteEngine {
    /// The upkeep after a removal, one bounded step at a time. The removed rows' pages were
    /// zeroed as it committed (`secure_delete`), but the WAL still holds their earlier
    /// versions: a `TRUNCATE` checkpoint (waiting at most [`CHECKPOINT_WAIT`] for readers)
    /// writes the zeroed pages into the file and empties the WAL. A store created with
    /// `auto_vacuum = INCREMENTAL` also gives at most [`VACUUM_STEP_PAGES`] free pages back to
    /// the file system per step. Steps go on after the next commits and while the writer is
    /// idle until no free page is left and a checkpoint went through; a prune asks for them
    /// one write at a time until then (`WriteTxn::reclaim`), so that a process that exits
    /// after it leaves no free pages behind.
    fn maintain(&mut self) {
        let label = self.label.as_str();
        let step = || -> Result<bool> {
            let conn = &self.conn;
            let int = |sql: &str| {
                conn.query_row(sql, [], |r| r.get::<_, i64>(0))
                    .sqlite(label)
            };
            let mut free = 0;
            if self.incremental_vacuum {
                // Stepped to its end: each step of the statement frees one page.
                let sql = format!("PRAGMA incremental_vacuum({VACUUM_STEP_PAGES})");
                let mut vacuum = conn.prepare(&sql).sqlite(label)?;
                let mut pages = vacuum.query([]).sqlite(label)?;
                while pages.next().sqlite(label)?.is_some() {}
                free = int("PRAGMA freelist_count")?;
            }
            conn.busy_timeout(CHECKPOINT_WAIT).sqlite(label)?;
            let checkpoint = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                r.get::<_, i64>(0)
            });
            conn.busy_timeout(self.busy_timeout).sqlite(label)?;
            let busy = checkpoint.sqlite(label)? != 0;
            Ok(free == 0 && !busy)
        };
        self.upkeep_due = match step() {
            Ok(true) => None,
            Ok(false) if self.incremental_vacuum => Some(Instant::now()),
            Ok(false) => Some(Instant::now() + UPKEEP_RETRY),
            Err(error) => {
                tracing::warn!(%error, store = %self.label, "could not checkpoint or vacuum after a removal");
                Some(Instant::now() + UPKEEP_RETRY)
            }
        };
    }
}

#[derive(Debug)]
struct SqliteReaders {
    path: PathBuf,
    label: String,
    busy_timeout: Duration,
    /// Read `immutable` ([`read_immutable`]).
    immutable: bool,
    pool: Mutex<Vec<Connection>>,
}

impl Readers for SqliteReaders {
    fn read(&self, f: &mut dyn FnMut(&mut dyn ReadTxn) -> Result<()>) -> Result<()> {
        let label = self.label.as_str();
        self.with_connection(|conn| {
            // One deferred transaction: every statement of this read sees the same snapshot.
            let txn = conn.transaction().sqlite(label)?;
            f(&mut txn::view(&txn, label))?;
            txn.commit().sqlite(label)
        })
    }

    fn verify(&self, checker: &mut Checker<'_>) -> Result<bool> {
        self.with_connection(|conn| integrity::verify(conn, &self.label, checker))
    }
}

impl SqliteReaders {
    /// Runs `f` on a pooled read-only connection (a new one if none is free); the connection
    /// goes back to the pool unless `f` failed.
    fn with_connection<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T>) -> Result<T> {
        let pool = || self.pool.lock().unpoisoned();
        let pooled = pool().pop();
        let mut conn = match pooled {
            Some(conn) => conn,
            None => {
                let conn = connect(&self.path, &self.label, self.busy_timeout, self.immutable)?;
                conn.execute_batch("PRAGMA query_only = ON;")
                    .sqlite(&self.label)?;
                conn
            }
        };
        let result = f(&mut conn);
        if result.is_ok() {
            pool().push(conn);
        }
        result
    }
}

/// Maps every rusqlite error to a [`StoreError`]. The one place SQLite errors are interpreted.
fn map_sqlite_error(path: &str, error: rusqlite::Error) -> StoreError {
    use rusqlite::ffi::ErrorCode;
    use rusqlite::Error::*;
    let path = path.to_string();
    let code = match &error {
        SqliteFailure(failure, _) => Some(failure.code),
        _ => None,
    };
    let detail = match code {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            return StoreError::locked(path)
        }
        // A read-only file, directory (no room for the WAL) or file system.
        Some(ErrorCode::ReadOnly) => {
            let source = Some(Box::new(error) as BoxError);
            return StoreError::NotWritable { path, source };
        }
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
            "SQLite reports the file is damaged or not a database"
        }
        // Our own columns hold what we wrote: a value of another type is damage.
        _ if matches!(
            error,
            InvalidColumnType(..)
                | FromSqlConversionFailure(..)
                | IntegralValueOutOfRange(..)
                | Utf8Error(..)
        ) =>
        {
            "a column holds a value of the wrong type"
        }
        _ => {
            let source = Box::new(error);
            return StoreError::Backend {
                backend: "sqlite",
                source,
            };
        }
    };
    let source = Some(Box::new(error) as BoxError);
    StoreError::Corrupt {
        path,
        detail: detail.to_string(),
        source,
    }
}

/// [`map_sqlite_error`] as a method of rusqlite's results.
trait SqliteResult<T> {
    fn sqlite(self, label: &str) -> Result<T, StoreError>;
}

impl<T> SqliteResult<T> for rusqlite::Result<T> {
    fn sqlite(self, label: &str) -> Result<T, StoreError> {
        self.map_err(|e| map_sqlite_error(label, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pragma(conn: &Connection, name: &str) -> i64 {
        conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
            .unwrap()
    }

    /// A durable store syncs with `F_FULLFSYNC` where the platform has it (macOS: a plain
    /// `fsync` there does not reach stable storage); SQLite ignores the setting elsewhere.
    #[test]
    fn durable_stores_ask_for_full_fsync() {
        let dir = tempfile::tempdir().unwrap();
        let (durable, _) = open_writer(&dir.path().join("d.db"), &OpenOptions::new(), "d").unwrap();
        assert_eq!(pragma(&durable, "synchronous"), 2, "FULL");
        assert_eq!(pragma(&durable, "fullfsync"), 1);
        assert_eq!(pragma(&durable, "checkpoint_fullfsync"), 1);
        let relaxed = OpenOptions::new().durability(Durability::Relaxed);
        let (relaxed, _) = open_writer(&dir.path().join("r.db"), &relaxed, "r").unwrap();
        assert_eq!(pragma(&relaxed, "synchronous"), 1, "NORMAL");
    }

    /// A store read `immutable` is found at its path whatever characters the path holds (a
    /// URI's `%`, `?` and `#` among them), and nothing is made beside it.
    #[test]
    fn an_immutable_read_finds_the_file_at_any_path() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().join("a %41?b#c");
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("s.db");
        drop(open_writer(&path, &OpenOptions::new(), "s").unwrap());
        let before = std::fs::read_dir(&dir).unwrap().count();
        let conn = connect(&path, "s", Duration::from_secs(1), true).unwrap();
        assert!(pragma(&conn, "schema_version") > 0);
        drop(conn);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), before);
    }

    #[test]
    fn a_read_only_database_is_not_writable() {
        let error = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_READONLY),
            Some("attempt to write a readonly database".to_string()),
        );
        let mapped = map_sqlite_error("/ro/s.db", error);
        assert!(
            matches!(&mapped, StoreError::NotWritable { path, .. } if path == "/ro/s.db"),
            "{mapped:?}"
        );
        assert_eq!(mapped.to_string(), "store /ro/s.db is not writable");
    }
}
