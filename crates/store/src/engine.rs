//! The small engine under the one [`BindingStore`](crate::BindingStore): how a backend runs a
//! read, a write and a lease request. What each store method means is decided once, by the
//! store's rules over the engine's transaction views ([`ReadTxn`], [`WriteTxn`], [`LeaseTxn`]),
//! so backends cannot drift apart; a new backend implements [`Engine`] and those views and gets
//! every rule (and the conformance suite) for free.
//!
//! An operation is a boxed closure that the engine runs on one snapshot or in one write
//! transaction, and hands back the boxed [`Answer`] it returned. A write runs again, alone, when
//! the group commit it was part of failed, so it decides before it writes.

use std::any::Any;

use async_trait::async_trait;

pub use crate::logic::{ChunkSink, FileKey, Grant, GrantState, LeaseTxn, ReadTxn, WriteTxn};
use crate::{Clock, Fence, Result, StoreError, VerifyProgress, VerifyReport};

/// What an operation returns, boxed so that one engine serves every store method.
pub type Answer = Box<dyn Any + Send>;
/// A read: runs on one consistent snapshot.
pub type ReadFn = Box<dyn FnMut(&mut dyn ReadTxn) -> Result<Answer> + Send>;
/// A write: runs in one write transaction at store time `now` (milliseconds).
pub type WriteFn = Box<dyn FnMut(&mut dyn WriteTxn, i64) -> Result<Answer> + Send>;
/// A lease request: runs on the leases at store time `now`.
pub type LeaseFn = Box<dyn FnMut(&mut dyn LeaseTxn, i64) -> Result<Answer> + Send>;
/// What [`Engine::verify`] reports progress to.
pub type Progress<'a> = &'a mut (dyn for<'p> FnMut(&'p VerifyProgress) + Send);

/// Which store call an operation serves: for engines that lock per session, trace, or (in
/// tests) inject faults.
#[non_exhaustive]
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The [`BindingStore`](crate::BindingStore) method, by name (`"commit_turn"`).
    pub method: &'static str,
    /// The sessions a write changes (several for a prune batch, in no order); empty for a
    /// read and for the store-wide reclaim.
    pub sessions: &'a [String],
    /// The fence a fenced write carries.
    pub fence: Option<&'a Fence>,
}

impl<'a> Request<'a> {
    pub(crate) fn new(method: &'static str) -> Self {
        Request {
            method,
            sessions: &[],
            fence: None,
        }
    }

    pub(crate) fn of(method: &'static str, sessions: &'a [String]) -> Self {
        Request {
            sessions,
            ..Request::new(method)
        }
    }

    pub(crate) fn fenced(self, fence: Option<&'a Fence>) -> Self {
        Request { fence, ..self }
    }
}

/// How a backend runs operations. Every method must leave the async runtime's threads free:
/// a blocking engine runs its work on its own threads ([`blocking`] helps).
#[async_trait]
pub trait Engine: Send + Sync + std::fmt::Debug + 'static {
    /// The clock this store judges time by on this host.
    fn clock(&self) -> Clock;

    /// Runs `op` on one consistent snapshot.
    async fn read(&self, request: Request<'_>, op: ReadFn) -> Result<Answer>;

    /// Runs `op` in one write transaction and returns once that is committed (durably, unless
    /// the store is relaxed) or refused. An engine whose writers of different sessions run at
    /// once takes each session's lock of [`Request::sessions`], in order.
    async fn write(&self, request: Request<'_>, op: WriteFn) -> Result<Answer>;

    /// Runs a lease request; by default as a write, on [`WriteTxn::leases`].
    async fn lease(&self, request: Request<'_>, mut op: LeaseFn) -> Result<Answer> {
        let op: WriteFn = Box::new(move |txn, now| op(txn.leases(), now));
        self.write(request, op).await
    }

    /// Scrubs what earlier writes removed from the files and gives the space back
    /// ([`WriteTxn::reclaim`], in a write of its own, one bounded step); returns how much was
    /// still to give back before the step (0: nothing). By default nothing to reclaim.
    async fn reclaim(&self) -> Result<u64> {
        Ok(0)
    }

    /// Checks the whole store with the engine's own scan, if it has one; `None`: the store
    /// checks every session through an export.
    async fn verify(&self, _progress: Progress<'_>) -> Option<Result<VerifyReport>> {
        None
    }

    /// Finishes queued writes and closes the engine's files and connections; later calls are
    /// [`StoreError::Closed`].
    async fn close(&self) {}
}

/// Runs `f` on a blocking thread (a read of a file store, or one that writes into a file); a
/// panic there is [`StoreError::Internal`].
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let joined = tokio::task::spawn_blocking(f).await;
    joined.map_err(|e| join_error("a read", e))?
}

/// The error of a blocking task that did not finish: `Internal` for a panic, else the
/// runtime is shutting down (`Closed`).
pub(crate) fn join_error(what: &str, error: tokio::task::JoinError) -> StoreError {
    match error.is_panic() {
        true => StoreError::Internal(format!("{what} panicked: {error}")),
        false => StoreError::Closed,
    }
}
