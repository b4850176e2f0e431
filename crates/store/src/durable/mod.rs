//! What the file backends (redb, SQLite) share: writes go to the store's writer thread
//! (`writer.rs`, group commit), reads run in `spawn_blocking` on a snapshot, store files are
//! checked and created owner-only (`file.rs`), and the whole-store scan (`scan.rs`).

mod file;
mod scan;
mod writer;

use std::sync::Arc;

use crate::adapter::{blocking, join_error, Backend};
use crate::logic::{LeaseOp, LocalLeases, ReadOp, ReadTxn, WriteOp, WriteTxn};
use crate::verify::{Checker, ProblemKind};
use crate::Result;
use crate::{BindingStore, Clock, StoreError, VerifyProgress, VerifyReport};

#[cfg(feature = "redb")]
pub(crate) use file::{open_error, owner_only};
pub(crate) use file::{prepare_file, FileId};
pub(crate) use scan::{check_mirrors, merge_scan, ScannedRow, ScannedSession};
pub(crate) use writer::{Engine, Writer};

/// How a backend runs one read snapshot, on a blocking thread.
pub(crate) trait Readers: Send + Sync + std::fmt::Debug + 'static {
    fn read(&self, f: &mut dyn FnMut(&mut dyn ReadTxn) -> Result<()>) -> Result<()>;

    /// Checks the whole store on one snapshot into `checker`; whether it reached the end.
    fn verify(&self, checker: &mut Checker<'_>) -> Result<bool>;
}

/// A writer thread plus readers: a file backend.
#[derive(Debug)]
pub(crate) struct Durable {
    // Dropped first, so that the engine (dropped by the writer thread, which the writer's drop
    // waits for) holds the last reference to the file and closes it on that thread.
    pub(crate) readers: Arc<dyn Readers>,
    /// `Some` for a single-process backend (redb): leases live in this process. `None`: in
    /// the store, written through the writer (SQLite).
    pub(crate) local_leases: Option<Arc<LocalLeases>>,
    pub(crate) writer: Writer,
    /// `Some(label)` for a store opened read-only: every write and lease request is refused
    /// here, before the writer thread.
    pub(crate) read_only: Option<String>,
    /// The store's clock (the writer thread has a clone).
    pub(crate) clock: Clock,
}

impl Durable {
    fn check_writable(&self) -> Result<()> {
        match &self.read_only {
            Some(label) => Err(StoreError::opened_read_only(label)),
            None => Ok(()),
        }
    }

    pub(crate) async fn close(self) {
        let Durable {
            writer, readers, ..
        } = self;
        drop(readers);
        writer.close().await;
    }
}

impl Backend for Durable {
    async fn read<T: Send + 'static>(&self, mut op: impl ReadOp<T>) -> Result<T> {
        let readers = Arc::clone(&self.readers);
        blocking(move || {
            let mut out = None;
            readers.read(&mut |txn| {
                out = Some(op(txn)?);
                Ok(())
            })?;
            out.ok_or_else(|| StoreError::Internal("a read snapshot never ran".to_string()))
        })
        .await
    }

    async fn write<T: Send + 'static>(&self, _: &str, op: impl WriteOp<T>) -> Result<T> {
        self.check_writable()?;
        self.writer.write(op).await
    }

    fn clock(&self) -> Clock {
        self.clock.clone()
    }

    async fn reclaim(&self) -> Result<u64> {
        self.write("", |txn: &mut dyn WriteTxn, _| txn.reclaim())
            .await
    }

    /// A single-process backend's lease request runs on a blocking thread: it waits for the
    /// write transaction under way ([`LocalLeases::apply`]).
    async fn lease<T: Send + 'static>(&self, _: &str, mut op: impl LeaseOp<T>) -> Result<T> {
        self.check_writable()?;
        match &self.local_leases {
            Some(local) => {
                let local = Arc::clone(local);
                blocking(move || local.apply(op)).await
            }
            None => {
                let op = move |txn: &mut dyn WriteTxn, now| op(txn.leases(), now);
                self.writer.write(op).await
            }
        }
    }

    /// Runs the backend's scan on a blocking thread; progress crosses back over a channel.
    async fn verify(
        &self,
        _store: &(dyn BindingStore + '_),
        progress: &mut (dyn for<'p> FnMut(&'p VerifyProgress) + Send),
    ) -> Result<VerifyReport> {
        let readers = Arc::clone(&self.readers);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let scan = tokio::task::spawn_blocking(move || {
            let mut send = |p: &VerifyProgress| {
                let _ = tx.send(*p);
            };
            let mut checker = Checker::new(&mut send);
            // Damage that ends the scan anywhere (a statement SQLite finds malformed, say) is a
            // problem of the report, never an error instead of one.
            let complete = match readers.verify(&mut checker) {
                Ok(complete) => complete,
                Err(error) => {
                    checker.damage(ProblemKind::Structure, None, error)?;
                    false
                }
            };
            Ok(checker.finish(complete))
        });
        while let Some(update) = rx.recv().await {
            progress(&update);
        }
        scan.await.map_err(|e| join_error("the check", e))?
    }
}
