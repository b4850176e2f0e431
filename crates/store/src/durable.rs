//! The async face shared by the durable backends: writes go to the writer thread, reads run in
//! `spawn_blocking` against a read snapshot.

use std::ops::Range;
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::logic::{
    self, check_row_seqs, expect_reply, lease_of, released_of, ttl_ms, LeaseOp, LocalLeases,
    ReadTxn, WriteOp,
};
use crate::writer::Writer;
use crate::{
    CommitOutcome, Fence, ImportOutcome, Lease, LeaseOwner, SessionExport, SessionPage,
    SessionRecord, StoreError, TranscriptRow, TurnCommit,
};

/// How a backend runs one read snapshot (a redb read transaction, a SQLite deferred
/// transaction on a pooled connection). Called on a blocking thread.
pub(crate) trait Readers: Send + Sync + std::fmt::Debug + 'static {
    fn read(
        &self,
        f: &mut dyn FnMut(&mut dyn ReadTxn) -> Result<(), StoreError>,
    ) -> Result<(), StoreError>;
}

/// A writer thread plus readers: everything a durable backend needs to be a `BindingStore`.
#[derive(Debug)]
pub(crate) struct Durable {
    pub(crate) writer: Writer,
    pub(crate) readers: Arc<dyn Readers>,
    /// `Some` for a single-process backend (redb): leases live in this process. `None`: they
    /// live in the store and go through the writer like every other write (SQLite).
    pub(crate) local_leases: Option<Arc<LocalLeases>>,
}

impl Durable {
    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut dyn ReadTxn) -> Result<T, StoreError> + Send + 'static,
    {
        let readers = Arc::clone(&self.readers);
        tokio::task::spawn_blocking(move || {
            let mut f = Some(f);
            let mut out = None;
            readers.read(&mut |txn| {
                if let Some(f) = f.take() {
                    out = Some(f(txn)?);
                }
                Ok(())
            })?;
            out.ok_or(StoreError::Closed)
        })
        .await
        .map_err(|_| StoreError::Closed)?
    }

    pub(crate) async fn session(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        let id = id.to_string();
        self.read(move |txn| txn.load(&id)).await
    }

    pub(crate) async fn rows(
        &self,
        id: &str,
        range: Range<u64>,
    ) -> Result<Vec<TranscriptRow>, StoreError> {
        if range.start >= range.end {
            return Ok(Vec::new());
        }
        let id = id.to_string();
        self.read(move |txn| {
            let start = range.start;
            let rows = txn.load_rows(&id, range)?;
            check_row_seqs(&id, start, &rows)?;
            Ok(rows)
        })
        .await
    }

    pub(crate) async fn commit_turn(
        &self,
        commit: TurnCommit,
    ) -> Result<CommitOutcome, StoreError> {
        expect_reply!(self.writer.write(WriteOp::Commit(commit)).await?, Commit)
    }

    pub(crate) async fn patch_config(
        &self,
        id: &str,
        patch: Map<String, Value>,
        fence: Option<&Fence>,
    ) -> Result<Map<String, Value>, StoreError> {
        let op = WriteOp::Patch {
            session_id: id.to_string(),
            patch,
            fence: fence.cloned(),
        };
        expect_reply!(self.writer.write(op).await?, Config)
    }

    pub(crate) async fn drop_binding_if(
        &self,
        id: &str,
        thread: &str,
        fence: Option<&Fence>,
    ) -> Result<bool, StoreError> {
        let op = WriteOp::DropIf {
            session_id: id.to_string(),
            thread_id: thread.to_string(),
            fence: fence.cloned(),
        };
        expect_reply!(self.writer.write(op).await?, Bool)
    }

    pub(crate) async fn retire_thread(
        &self,
        id: &str,
        thread: &str,
        fence: Option<&Fence>,
    ) -> Result<(), StoreError> {
        let op = WriteOp::Retire {
            session_id: id.to_string(),
            thread_id: thread.to_string(),
            fence: fence.cloned(),
        };
        self.writer.write(op).await.map(|_| ())
    }

    pub(crate) async fn list_sessions(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<SessionPage, StoreError> {
        let after = after.map(str::to_string);
        self.read(move |txn| logic::list(txn, after.as_deref(), limit))
            .await
    }

    pub(crate) async fn delete_session(&self, id: &str) -> Result<bool, StoreError> {
        expect_reply!(
            self.writer
                .write(WriteOp::Delete {
                    session_id: id.to_string()
                })
                .await?,
            Bool
        )
    }

    pub(crate) async fn export_session(
        &self,
        id: &str,
    ) -> Result<Option<SessionExport>, StoreError> {
        let id = id.to_string();
        self.read(move |txn| logic::export(txn, &id)).await
    }

    pub(crate) async fn import_session(
        &self,
        export: SessionExport,
    ) -> Result<ImportOutcome, StoreError> {
        expect_reply!(self.writer.write(WriteOp::Import(export)).await?, Import)
    }

    async fn lease(&self, op: LeaseOp) -> Result<logic::LeaseReply, StoreError> {
        match &self.local_leases {
            Some(local) => local.apply(&op),
            None => expect_reply!(self.writer.write(WriteOp::Lease(op)).await?, Lease),
        }
    }

    pub(crate) async fn acquire_lease(
        &self,
        id: &str,
        owner: &LeaseOwner,
        ttl: std::time::Duration,
    ) -> Result<Lease, StoreError> {
        lease_of(
            self.lease(LeaseOp::Acquire {
                session_id: id.to_string(),
                owner: owner.clone(),
                ttl_ms: ttl_ms(ttl),
            })
            .await?,
        )
    }

    pub(crate) async fn renew_lease(
        &self,
        lease: &Lease,
        ttl: std::time::Duration,
    ) -> Result<Lease, StoreError> {
        lease_of(
            self.lease(LeaseOp::Renew {
                lease: lease.clone(),
                ttl_ms: ttl_ms(ttl),
            })
            .await?,
        )
    }

    pub(crate) async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError> {
        released_of(
            self.lease(LeaseOp::Release {
                lease: lease.clone(),
            })
            .await?,
        )
    }
}

/// Implements `BindingStore` for a newtype whose field `inner` is a [`Durable`].
macro_rules! impl_durable_store {
    ($ty:ty) => {
        #[async_trait::async_trait]
        impl $crate::BindingStore for $ty {
            async fn session(
                &self,
                session_id: &str,
            ) -> Result<Option<$crate::SessionRecord>, $crate::StoreError> {
                self.inner.session(session_id).await
            }
            async fn rows(
                &self,
                session_id: &str,
                range: std::ops::Range<u64>,
            ) -> Result<Vec<$crate::TranscriptRow>, $crate::StoreError> {
                self.inner.rows(session_id, range).await
            }
            async fn commit_turn(
                &self,
                commit: $crate::TurnCommit,
            ) -> Result<$crate::CommitOutcome, $crate::StoreError> {
                self.inner.commit_turn(commit).await
            }
            async fn patch_config(
                &self,
                session_id: &str,
                patch: serde_json::Map<String, serde_json::Value>,
                fence: Option<&$crate::Fence>,
            ) -> Result<serde_json::Map<String, serde_json::Value>, $crate::StoreError> {
                self.inner.patch_config(session_id, patch, fence).await
            }
            async fn drop_binding_if(
                &self,
                session_id: &str,
                thread_id: &str,
                fence: Option<&$crate::Fence>,
            ) -> Result<bool, $crate::StoreError> {
                self.inner
                    .drop_binding_if(session_id, thread_id, fence)
                    .await
            }
            async fn retire_thread(
                &self,
                session_id: &str,
                thread_id: &str,
                fence: Option<&$crate::Fence>,
            ) -> Result<(), $crate::StoreError> {
                self.inner.retire_thread(session_id, thread_id, fence).await
            }
            async fn list_sessions(
                &self,
                after: Option<&str>,
                limit: usize,
            ) -> Result<$crate::SessionPage, $crate::StoreError> {
                self.inner.list_sessions(after, limit).await
            }
            async fn delete_session(&self, session_id: &str) -> Result<bool, $crate::StoreError> {
                self.inner.delete_session(session_id).await
            }
            async fn export_session(
                &self,
                session_id: &str,
            ) -> Result<Option<$crate::SessionExport>, $crate::StoreError> {
                self.inner.export_session(session_id).await
            }
            async fn import_session(
                &self,
                export: $crate::SessionExport,
            ) -> Result<$crate::ImportOutcome, $crate::StoreError> {
                self.inner.import_session(export).await
            }
            async fn acquire_lease(
                &self,
                session_id: &str,
                owner: &$crate::LeaseOwner,
                ttl: std::time::Duration,
            ) -> Result<$crate::Lease, $crate::StoreError> {
                self.inner.acquire_lease(session_id, owner, ttl).await
            }
            async fn renew_lease(
                &self,
                lease: &$crate::Lease,
                ttl: std::time::Duration,
            ) -> Result<$crate::Lease, $crate::StoreError> {
                self.inner.renew_lease(lease, ttl).await
            }
            async fn release_lease(
                &self,
                lease: &$crate::Lease,
            ) -> Result<bool, $crate::StoreError> {
                self.inner.release_lease(lease).await
            }
        }
    };
}
pub(crate) use impl_durable_store;

/// Creates `path` owner-only (0600) if it does not exist. Returns whether it was created.
pub(crate) fn create_owner_only(path: &std::path::Path, create: bool) -> Result<bool, StoreError> {
    let label = path.display().to_string();
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => {
            return Err(StoreError::InvalidInput(format!(
                "store path {label} is a directory"
            )))
        }
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(StoreError::Io {
                path: label,
                source,
            })
        }
    }
    if !create {
        return Err(StoreError::NotFound {
            what: format!("store file {label}"),
        });
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    match options.open(path) {
        Ok(_) => Ok(true),
        // Another process created it first: open it as an existing store.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(source) => Err(StoreError::Io {
            path: label,
            source,
        }),
    }
}
