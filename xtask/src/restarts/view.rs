//! The harness's read access to a backend's store, between host processes.
//!
//! redb admits one process at a time, so its file is opened for each read and closed before
//! the next host starts; SQLite and PostgreSQL stay open for the whole run.

use std::path::PathBuf;
use std::sync::Arc;

use rethread_store::{
    open_url, BindingStore, BindingStoreExt, OpenOptions, RedbStore, SessionRecord, TranscriptRow,
};

/// A store the harness reads.
pub(crate) struct StoreView {
    runtime: tokio::runtime::Runtime,
    url: String,
    kind: Kind,
}

enum Kind {
    Redb(PathBuf),
    Open(Arc<dyn BindingStore>),
}

/// Where a read went wrong: the store could not be opened, or the read failed.
enum ReadError {
    Open(String),
    Read(String),
}

impl StoreView {
    /// Opens a view of the store at `url` (`redb:PATH`, `sqlite:PATH` or `postgres://...`).
    pub(crate) fn open(url: &str) -> Result<Self, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime: {e}"))?;
        let kind = match url.strip_prefix("redb:") {
            Some(path) => Kind::Redb(PathBuf::from(path)),
            None => Kind::Open(
                runtime
                    .block_on(open_url(url, OpenOptions::default()))
                    .map_err(|e| format!("cannot open the store: {e}"))?,
            ),
        };
        Ok(StoreView {
            runtime,
            url: url.to_string(),
            kind,
        })
    }

    /// The session's record, if it exists.
    pub(crate) fn session(&mut self, id: &str) -> Result<Option<SessionRecord>, String> {
        self.read(|store| async move { store.session(id).await })
    }

    /// All of the session's transcript rows.
    pub(crate) fn rows(&mut self, id: &str) -> Result<Vec<TranscriptRow>, String> {
        self.read(|store| async move { store.all_rows(id).await })
    }

    /// Deletes the session (a PostgreSQL database outlives the run).
    pub(crate) fn delete(&mut self, id: &str) -> Result<(), String> {
        self.read(|store| async move { store.delete_session(id).await.map(|_| ()) })
    }

    /// Runs `op` on the store. A PostgreSQL connection that went away (a server restarted by
    /// another run sharing it) is opened again, once.
    fn read<T, F, Fut>(&mut self, op: F) -> Result<T, String>
    where
        F: Fn(Arc<dyn BindingStore>) -> Fut,
        Fut: std::future::Future<Output = Result<T, rethread_store::StoreError>>,
    {
        match self.try_read(&op) {
            Ok(value) => Ok(value),
            Err(ReadError::Open(error)) => Err(error),
            Err(ReadError::Read(error)) => {
                let Kind::Open(_) = self.kind else {
                    return Err(error);
                };
                let reopened = self
                    .runtime
                    .block_on(open_url(&self.url, OpenOptions::default()))
                    .map_err(|e| format!("{error}; reopening the store failed: {e}"))?;
                self.kind = Kind::Open(reopened);
                self.try_read(&op).map_err(|e| match e {
                    ReadError::Open(e) | ReadError::Read(e) => e,
                })
            }
        }
    }

    fn try_read<T, F, Fut>(&self, op: &F) -> Result<T, ReadError>
    where
        F: Fn(Arc<dyn BindingStore>) -> Fut,
        Fut: std::future::Future<Output = Result<T, rethread_store::StoreError>>,
    {
        self.runtime.block_on(async {
            let read = match &self.kind {
                Kind::Open(store) => op(Arc::clone(store)).await,
                Kind::Redb(path) => {
                    let store = match RedbStore::open(path, OpenOptions::default()).await {
                        Ok(store) => Arc::new(store),
                        Err(e) => {
                            return Err(ReadError::Open(format!("cannot open the store: {e}")))
                        }
                    };
                    let result = op(Arc::clone(&store) as Arc<dyn BindingStore>).await;
                    // Closed before the next host starts: redb admits one process at a time.
                    if let Ok(store) = Arc::try_unwrap(store) {
                        store.close().await;
                    }
                    result
                }
            };
            read.map_err(|e| ReadError::Read(format!("store read failed: {e}")))
        })
    }
}
