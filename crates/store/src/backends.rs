//! The built-in backends, each opened as the one [`BindingStore`] over its engine.

#[cfg(any(feature = "redb", feature = "sqlite"))]
use std::path::Path;

use crate::{BindingStore, Clock, MemoryEngine};
#[cfg(any(feature = "redb", feature = "sqlite", feature = "postgres"))]
use crate::{OpenOptions, Result};

impl BindingStore {
    /// An empty store in this process's memory, on the system clock.
    pub fn memory() -> Self {
        BindingStore::new(MemoryEngine::default())
    }

    /// An empty store in memory that judges time by `clock` (tests: [`Clock::manual`]).
    pub fn memory_with_clock(clock: Clock) -> Self {
        BindingStore::new(MemoryEngine::new(clock))
    }

    /// Opens (or creates, owner-only) the store in the redb file at `path`, on the store's
    /// writer thread.
    ///
    /// Errors: [`StoreError::NotAFile`](crate::StoreError::NotAFile), [`StoreError::NoStore`](crate::StoreError::NoStore) (without `create`) and
    /// [`StoreError::NotWritable`](crate::StoreError::NotWritable) before anything opens the file; [`StoreError::Locked`](crate::StoreError::Locked) if
    /// another process has it open past [`OpenOptions::wait`](crate::OpenOptions::wait); [`StoreError::Corrupt`](crate::StoreError::Corrupt) for a
    /// damaged or foreign file, [`StoreError::NewerSchema`](crate::StoreError::NewerSchema) for a file from a newer rethread.
    #[cfg(feature = "redb")]
    pub async fn redb(path: impl AsRef<Path>, options: OpenOptions) -> Result<Self> {
        let (key, read_only) = (options.store_key().cloned(), options.read_only);
        let store = BindingStore::new(crate::redb::open(path.as_ref(), options).await?);
        opened(store, key, read_only).await
    }

    /// Opens (or creates, owner-only) the store in the SQLite file at `path` (WAL mode), on
    /// the store's writer thread.
    ///
    /// Errors: [`StoreError::NotAFile`](crate::StoreError::NotAFile), [`StoreError::NoStore`](crate::StoreError::NoStore) (without `create`) and
    /// [`StoreError::NotWritable`](crate::StoreError::NotWritable) before anything opens the file; [`StoreError::Corrupt`](crate::StoreError::Corrupt) for
    /// a damaged or foreign file, [`StoreError::NewerSchema`](crate::StoreError::NewerSchema) for a file from a newer rethread,
    /// [`StoreError::Locked`](crate::StoreError::Locked) if another process holds the write lock past the wait.
    #[cfg(feature = "sqlite")]
    pub async fn sqlite(path: impl AsRef<Path>, options: OpenOptions) -> Result<Self> {
        let (key, read_only) = (options.store_key().cloned(), options.read_only);
        let store = BindingStore::new(crate::sqlite::open(path.as_ref(), options).await?);
        opened(store, key, read_only).await
    }

    /// Connects to the PostgreSQL database `url` (`postgres://user@host:port/db`, libpq-style
    /// parameters; plus `schema=NAME` to keep the tables in that schema, created if missing),
    /// creating the tables of a new store (unless [`OpenOptions::create`](crate::OpenOptions::create) is `false`: then
    /// [`StoreError::NoStore`](crate::StoreError::NoStore)). At most 16 connections are open at once.
    ///
    /// Errors: [`StoreError::UnsupportedUrl`](crate::StoreError::UnsupportedUrl) for a URL that does not parse,
    /// [`StoreError::NewerSchema`](crate::StoreError::NewerSchema) for tables of a newer rethread, [`StoreError::Corrupt`](crate::StoreError::Corrupt)
    /// for a schema that holds foreign tables of the same names, [`StoreError::Backend`](crate::StoreError::Backend) when
    /// the server cannot be reached. No TLS: use it on loopback or a private network.
    #[cfg(feature = "postgres")]
    pub async fn postgres(url: &str, options: OpenOptions) -> Result<Self> {
        let (key, read_only) = (options.store_key().cloned(), options.read_only);
        let store = BindingStore::new(crate::postgres::open(url, options).await?);
        opened(store, key, read_only).await
    }
}

/// `store` as its key allows ([`BindingStore::with_key`]); closed again when it is refused, so
/// that a refusal holds no file lock and no connection.
#[cfg(any(feature = "redb", feature = "sqlite", feature = "postgres"))]
async fn opened(
    store: BindingStore,
    key: Option<crate::StoreKey>,
    read_only: bool,
) -> Result<BindingStore> {
    match store.clone().with_key(key.as_ref(), read_only).await {
        Ok(store) => Ok(store),
        Err(error) => {
            store.close().await;
            Err(error)
        }
    }
}
