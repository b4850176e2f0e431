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

/// How to open a store file.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub(crate) durability: Durability,
    pub(crate) create: bool,
    pub(crate) create_dirs: bool,
    pub(crate) max_batch: usize,
    pub(crate) pool_size: usize,
    pub(crate) busy_timeout: Duration,
    pub(crate) lone_write_spin: Duration,
    pub(crate) check_redb_integrity: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            durability: Durability::Durable,
            create: true,
            create_dirs: false,
            max_batch: 256,
            pool_size: 16,
            busy_timeout: Duration::from_secs(5),
            lone_write_spin: Duration::from_millis(1),
            check_redb_integrity: true,
        }
    }
}

impl OpenOptions {
    /// Durable writes, create the file (not its directory) if missing, group commits of up to
    /// 256 writes, up to 16 PostgreSQL connections.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the durability of writes (default [`Durability::Durable`]).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Whether a missing store file is created (default `true`); when `false` a missing file
    /// is [`StoreError::NotFound`](crate::StoreError::NotFound).
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Whether the directory of a missing store file is created too (default `false`), with
    /// its missing parents, owner-only (0700). For the file backends (`redb:`, `sqlite:`); a
    /// tool that names a store by URL sets it instead of parsing the URL itself.
    pub fn create_dirs(mut self, create_dirs: bool) -> Self {
        self.create_dirs = create_dirs;
        self
    }

    /// The most writes of a file backend coalesced into one transaction (default 256; 1
    /// disables group commit).
    pub fn max_batch(mut self, max_batch: usize) -> Self {
        self.max_batch = max_batch.max(1);
        self
    }

    /// The most connections a PostgreSQL store opens at once (default 16, at least 1): how
    /// many of its writes (each on its own connection) and reads run in parallel.
    pub fn pool_size(mut self, pool_size: usize) -> Self {
        self.pool_size = pool_size.max(1);
        self
    }

    /// How long a SQLite writer waits for another process's lock (default 5 s).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// How long a write that is alone (no other write of this store in flight) polls for its
    /// reply, yielding to the runtime between polls, before it parks (default 1 ms; zero
    /// disables). Waking a parked runtime thread from the store's writer thread costs a
    /// cross-CPU interrupt, tens of microseconds on a virtual machine; the poll spends one
    /// runtime thread's time for the length of a commit to save it. Where that does not pay (a
    /// poll that ends without its reply: a slow disk, or CPUs so busy that the poll keeps the
    /// writer thread from one), the store backs off and parks at once for up to the next 1024
    /// lone writes. Concurrent writes never poll (group commit serves them). Used by the redb
    /// and SQLite backends.
    pub fn lone_write_spin(mut self, spin: Duration) -> Self {
        self.lone_write_spin = spin;
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

    /// The configured durability.
    pub fn get_durability(&self) -> Durability {
        self.durability
    }
}
