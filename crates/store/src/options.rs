//! Options for opening a store.

use std::time::Duration;

use crate::{Clock, StoreKey};

/// When a write is acknowledged.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// A write returns only after it is on stable storage: redb `Immediate` commits; SQLite
    /// `synchronous=FULL` with `fullfsync`; PostgreSQL `synchronous_commit = on`.
    #[default]
    Durable,
    /// Opt-in: writes are atomic and ordered, but the last acknowledged ones may be lost.
    /// SQLite (`synchronous=NORMAL`) and PostgreSQL (`synchronous_commit = off`): only on a
    /// power failure or OS crash. redb: commits are made durable at least every 100 ms while
    /// the store is written, and when it is closed or dropped; a process killed (or exiting
    /// with the store open), a power failure or an OS crash loses at most the last 100 ms.
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
    pub(crate) clock: Clock,
    pub(crate) key: Option<StoreKey>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            durability: Durability::Durable,
            create: true,
            create_dirs: true,
            wait: Duration::ZERO,
            check_redb_integrity: true,
            read_only: false,
            clock: Clock::system(),
            key: None,
        }
    }
}

impl OpenOptions {
    /// Durable writes; create the store (and its directory) if missing; no wait.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the durability of writes (default [`Durability::Durable`]).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Whether a missing store is created (default `true`); else it is
    /// [`StoreError::NoStore`](crate::StoreError::NoStore) and nothing is created.
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Whether the directory of a new store file is created too, with its missing parents,
    /// owner-only (default `true`; file backends; never when the store may not be created).
    /// `false` refuses a missing directory (a mistyped path is then an error).
    pub fn create_dirs(mut self, create_dirs: bool) -> Self {
        self.create_dirs = create_dirs;
        self
    }

    /// How long opening waits for another process that holds a redb store (default zero;
    /// then [`StoreError::Locked`](crate::StoreError::Locked) naming the holder). SQLite waits
    /// this long (at least 5 s) for another process's write lock, on open and every write.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Whether opening a redb store checks every page of the file first (default `true`).
    ///
    /// redb trusts a cleanly closed file. The store turns a panic of redb into
    /// [`StoreError::Corrupt`](crate::StoreError::Corrupt), but damage in redb's free-page
    /// bookkeeping can make a destructor panic again while the first unwinds, which aborts the
    /// process; the check makes such a file `Corrupt` at open. Its cost grows with the file
    /// (about 0.4 s for 30,000 sessions of 40 rows); `false` opens in constant time and accepts
    /// that risk.
    pub fn check_redb_integrity_on_open(mut self, check: bool) -> Self {
        self.check_redb_integrity = check;
        self
    }

    /// Whether the store is opened for reading only (default `false`). Nothing is created or
    /// changed, in the store or beside its file: a missing store is
    /// [`StoreError::NoStore`](crate::StoreError::NoStore) whatever [`OpenOptions::create`]
    /// says, and every write and lease request is
    /// [`StoreError::NotWritable`](crate::StoreError::NotWritable) (a `memory:` store ignores
    /// it). redb still runs its writable open (integrity check, crash recovery) with its
    /// writes kept in memory; readers share the file, and a writer is refused while one reads.
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

    /// The clock the store judges time by (default the system clock; see [`Clock`]):
    /// lease expiry, `updated_at_ms`, and idleness for
    /// [`BindingStore::prune_sessions`](crate::BindingStore::prune_sessions). Tests hand a
    /// [`Clock::manual`] and advance it instead of sleeping. PostgreSQL uses the server's
    /// clock unless a manual one is given here.
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The key that seals the store's transcript rows and mirror chunks (default none: an
    /// unsealed store); see docs/design.md, "Sealed stores". Read it from its file with
    /// [`StoreKey::read`].
    pub fn key(mut self, key: Option<StoreKey>) -> Self {
        self.key = key;
        self
    }

    /// The key given with [`OpenOptions::key`], for the codec that seals.
    #[cfg_attr(not(test), allow(dead_code, reason = "read by the sealing (issue 43)"))]
    pub(crate) fn store_key(&self) -> Option<&StoreKey> {
        self.key.as_ref()
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
