//! Options for opening a store.

use std::time::Duration;

/// When a write is acknowledged.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// A write returns only after it is on stable storage. The default: redb `Immediate`
    /// commits; SQLite `synchronous=FULL` with `fullfsync` (where the platform has it);
    /// PostgreSQL `synchronous_commit = on` in each write's transaction.
    #[default]
    Durable,
    /// An explicit opt-in: writes are atomic and ordered, but the last acknowledged ones may
    /// be lost. SQLite (`synchronous=NORMAL` in WAL mode) and PostgreSQL
    /// (`synchronous_commit = off`): only on a power failure or OS crash; the process may exit,
    /// crash or be killed. redb: commits are made durable at least every 100 ms while the
    /// store is written, and when it is closed or dropped; a process that ends without either
    /// (killed, or `exit` with the store still open) loses at most its last 100 ms of writes,
    /// and a power failure or OS crash the same. Never the default.
    Relaxed,
}

/// How to open a store.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub(crate) durability: Durability,
    pub(crate) create: bool,
    pub(crate) create_dirs: bool,
    pub(crate) wait: Duration,
    pub(crate) check_redb_integrity: bool,
    pub(crate) read_only: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            durability: Durability::Durable,
            create: true,
            create_dirs: false,
            wait: Duration::ZERO,
            check_redb_integrity: true,
            read_only: false,
        }
    }
}

impl OpenOptions {
    /// Durable writes; create the store (not its directory) if missing; do not wait for another
    /// process that holds the store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the durability of writes (default [`Durability::Durable`]).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Whether a missing store is created (default `true`). With `false` a missing store is
    /// [`StoreError::NoStore`](crate::StoreError::NoStore) and nothing is created (no file, no
    /// directory, no tables): what commands that only read use.
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Whether the directory of a store file that is created is created too (default
    /// `false`), with its missing parents, owner-only (0700). For the file backends (`redb:`,
    /// `sqlite:`); a tool that names a store by URL sets it instead of parsing the URL itself.
    pub fn create_dirs(mut self, create_dirs: bool) -> Self {
        self.create_dirs = create_dirs;
        self
    }

    /// How long opening waits for another process that holds the store (default zero): redb
    /// admits one process per file, and an open that gives up is
    /// [`StoreError::Locked`](crate::StoreError::Locked) naming the holder. SQLite waits this
    /// long (at least 5 s) for another process's write lock, on open and on every write.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Whether opening a redb store checks every page of the file first (default `true`).
    ///
    /// redb trusts a cleanly closed file. A file damaged since (by another program, a disk)
    /// can make redb panic; the store contains a panic on its own threads as
    /// [`StoreError::Corrupt`](crate::StoreError::Corrupt), but damage in redb's free-page
    /// bookkeeping can make a destructor panic again while the first panic unwinds, and Rust
    /// aborts the process then (found by the `store_files` fuzz target). The check makes such
    /// a file a typed `Corrupt` at open. Its cost grows with the file (about 0.4 s for 30,000
    /// sessions of 40 rows); `false` opens in constant time and accepts that risk. SQLite
    /// stores always open in constant time (their damage is caught on touch).
    pub fn check_redb_integrity_on_open(mut self, check: bool) -> Self {
        self.check_redb_integrity = check;
        self
    }

    /// Whether the store is opened for reading only (default `false`): what commands that
    /// only read use. Nothing is created or changed, in the store or beside its file (redb's
    /// holder record, SQLite's journal): a missing store is
    /// [`StoreError::NoStore`](crate::StoreError::NoStore) whatever [`OpenOptions::create`]
    /// says, and every write and lease request is
    /// [`StoreError::NotWritable`](crate::StoreError::NotWritable), with nothing written
    /// (redb, SQLite, PostgreSQL; a `memory:` store, which no other process sees, ignores it).
    ///
    /// redb still runs its writable open, with its integrity check and the recovery of a file
    /// whose process crashed, on storage that keeps redb's own writes in memory: the file is
    /// never written. Readers share the file; a process that writes it is refused while one
    /// reads (and the other way round), as two writers are.
    ///
    /// ```
    /// # async fn example() -> rethread_store::Result<()> {
    /// use rethread_store::{open_url, OpenOptions};
    /// let store = open_url("sqlite:/var/lib/app/rethread.sqlite", OpenOptions::new().read_only(true)).await?;
    /// let page = store.list_sessions(None, 50).await?;
    /// # Ok(()) }
    /// ```
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Whether a missing store may be created: asked for, and not read-only.
    #[cfg_attr(
        not(any(feature = "redb", feature = "sqlite", feature = "postgres")),
        allow(dead_code)
    )]
    pub(crate) fn may_create(&self) -> bool {
        self.create && !self.read_only
    }

    /// SQLite's lock wait: [`OpenOptions::wait`], at least 5 s.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn busy_timeout(&self) -> Duration {
        self.wait.max(Duration::from_secs(5))
    }
}
