//! What the file backends (redb, SQLite) share: writes go to the store's writer thread
//! (`writer.rs`, group commit), reads run in `spawn_blocking` on a snapshot, store files are
//! checked and created owner-only (`file.rs`), and the whole-store scan (`scan.rs`).

mod file;
mod scan;
mod writer;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::engine::{
    blocking, join_error, Answer, Engine, LeaseFn, Progress, ReadFn, Request, WriteFn,
};
use crate::logic::{LocalLeases, ReadTxn, WriteTxn};
use crate::verify::{Checker, ProblemKind};
use crate::{Clock, Result, StoreError, Unpoisoned, VerifyProgress, VerifyReport};

#[cfg(feature = "redb")]
pub(crate) use file::{open_error, owner_only};
pub(crate) use file::{prepare_file, FileId};
pub(crate) use scan::{check_mirrors, merge_scan, ScannedRow, ScannedSession};
pub(crate) use writer::{FileEngine, Writer};

/// How a backend runs one read snapshot, on a blocking thread.
pub(crate) trait Readers: Send + Sync + std::fmt::Debug + 'static {
    fn read(&self, f: &mut dyn FnMut(&mut dyn ReadTxn) -> Result<()>) -> Result<()>;

    /// Checks the whole store on one snapshot into `checker`; whether it reached the end.
    fn verify(&self, checker: &mut Checker<'_>) -> Result<bool>;
}

/// A writer thread plus readers: a file backend's [`Engine`].
#[derive(Debug)]
pub(crate) struct Durable {
    /// Taken (dropped) first on close, so that the file engine (dropped by the writer thread,
    /// which the writer's close waits for) holds the last reference to the file and closes it
    /// on that thread.
    pub(crate) readers: Mutex<Option<Arc<dyn Readers>>>,
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
    pub(crate) fn new(
        writer: Writer,
        readers: Arc<dyn Readers>,
        local_leases: Option<Arc<LocalLeases>>,
        read_only: Option<String>,
        clock: Clock,
    ) -> Self {
        Durable {
            readers: Mutex::new(Some(readers)),
            local_leases,
            writer,
            read_only,
            clock,
        }
    }

    fn check_writable(&self) -> Result<()> {
        match &self.read_only {
            Some(label) => Err(StoreError::opened_read_only(label)),
            None => Ok(()),
        }
    }

    fn readers(&self) -> Result<Arc<dyn Readers>> {
        self.readers
            .lock()
            .unpoisoned()
            .clone()
            .ok_or(StoreError::Closed)
    }
}

#[async_trait]
impl Engine for Durable {
    async fn read(&self, _: Request<'_>, mut op: ReadFn) -> Result<Answer> {
        let readers = self.readers()?;
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

    async fn write(&self, _: Request<'_>, op: WriteFn) -> Result<Answer> {
        self.check_writable()?;
        self.writer.write(op).await
    }

    fn clock(&self) -> Clock {
        self.clock.clone()
    }

    async fn reclaim(&self) -> Result<u64> {
        let op = |txn: &mut dyn WriteTxn, _| txn.reclaim();
        self.check_writable()?;
        self.writer.write(op).await
    }

    /// A single-process backend's lease request runs on a blocking thread: it waits for the
    /// write transaction under way ([`LocalLeases::apply`]).
    async fn lease(&self, request: Request<'_>, op: LeaseFn) -> Result<Answer> {
        self.check_writable()?;
        match &self.local_leases {
            Some(local) => {
                let local = Arc::clone(local);
                blocking(move || local.apply(op)).await
            }
            None => {
                let mut op = op;
                let write: WriteFn = Box::new(move |txn, now| op(txn.leases(), now));
                self.write(request, write).await
            }
        }
    }

    /// Runs the backend's scan on a blocking thread; progress crosses back over a channel.
    async fn verify(&self, progress: Progress<'_>) -> Option<Result<VerifyReport>> {
        Some(self.scan(progress).await)
    }

    async fn close(&self) {
        drop(self.readers.lock().unpoisoned().take());
        self.writer.close().await;
    }
}

impl Durable {
    async fn scan(&self, progress: Progress<'_>) -> Result<VerifyReport> {
        let readers = self.readers()?;
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
