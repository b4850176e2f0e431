//! [`BindingStore`] implemented once, for every backend, on the functions of `logic`. A
//! backend only says how it runs a read and a write ([`Backend`]); what each method means is
//! decided in `logic`, so backends cannot drift apart.

use std::future::Future;

use crate::logic::{self, LeaseOp, ReadOp, ReadTxn, WriteOp, WriteTxn};
use crate::Result;
use crate::{BindingStore, Clock, Prune, PruneReport, StoreError, VerifyProgress, VerifyReport};

/// How a backend runs operations.
pub(crate) trait Backend: Send + Sync + 'static {
    /// Runs `op` on one consistent snapshot, off the async runtime's threads if it blocks.
    fn read<T: Send + 'static>(&self, op: impl ReadOp<T>)
        -> impl Future<Output = Result<T>> + Send;

    /// Runs `op`, a write of `session_id`, in one write transaction and returns once it is
    /// committed (durably, unless the store is relaxed) or refused.
    fn write<T: Send + 'static>(
        &self,
        session_id: &str,
        op: impl WriteOp<T>,
    ) -> impl Future<Output = Result<T>> + Send;

    /// Runs `op`, a write of every session of `session_ids`, in one write transaction;
    /// PostgreSQL takes each session's lock, in order.
    fn write_sessions<T: Send + 'static>(
        &self,
        session_ids: Vec<String>,
        op: impl WriteOp<T>,
    ) -> impl Future<Output = Result<T>> + Send {
        async move {
            let first = session_ids.first().map_or("", String::as_str);
            self.write(first, op).await
        }
    }

    /// The clock this store judges time by on this host (PostgreSQL's writes read the
    /// server's unless a manual clock was given).
    fn clock(&self) -> Clock;

    /// Runs a lease request of `session_id`; by default as a write, in the store.
    fn lease<T: Send + 'static>(
        &self,
        session_id: &str,
        mut op: impl LeaseOp<T>,
    ) -> impl Future<Output = Result<T>> + Send {
        self.write(session_id, move |txn, now| op(txn.leases(), now))
    }

    /// Scrubs what earlier writes removed from the files and gives the space back
    /// ([`WriteTxn::reclaim`], in a write of its own, one bounded step); returns how much was
    /// still to give back before the step (0: nothing). Called at the end of a prune, again
    /// while that falls. By default nothing (a backend with nothing to reclaim).
    fn reclaim(&self) -> impl Future<Output = Result<u64>> + Send {
        async { Ok(0) }
    }

    /// [`BindingStore::verify`]; by default through `store`'s public methods.
    fn verify<'a>(
        &'a self,
        store: &'a (dyn BindingStore + 'a),
        progress: &'a mut (dyn for<'p> FnMut(&'p VerifyProgress) + Send),
    ) -> impl Future<Output = Result<VerifyReport>> + Send + 'a {
        crate::verify::by_export(store, progress)
    }
}

/// Runs `f` on a blocking thread (a read of a file store, or one that writes into a file); a
/// panic there is `Internal`.
pub(crate) async fn blocking<T: Send + 'static>(
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

/// [`BindingStore::prune_sessions`] on `backend`: a read lists a page of candidates, a write
/// per batch removes those still idle (`logic::prune`); then the backend reclaims what the
/// batches removed ([`Backend::reclaim`]), also after a batch failed.
pub(crate) async fn prune<B: Backend>(backend: &B, prune: &Prune) -> Result<PruneReport> {
    let mut report = PruneReport::default();
    let pruned = prune_batches(backend, prune, &mut report).await;
    let reclaimed = match report.sessions.is_empty() || prune.dry_run {
        true => Ok(()),
        false => reclaim_all(backend).await,
    };
    pruned.and(reclaimed).map(|()| report)
}

/// Reclaims step by step until nothing is left to give back, or a step gave nothing back
/// (readers holding the checkpoint, a failed step: the backend's own upkeep goes on later).
/// Each step is a write of its own, bounded ([`Backend::reclaim`]): other writers wait for
/// one step at most, never for the whole.
async fn reclaim_all<B: Backend>(backend: &B) -> Result<()> {
    let mut before = u64::MAX;
    loop {
        let left = backend.reclaim().await?;
        if left == 0 || left >= before {
            return Ok(());
        }
        before = left;
    }
}

async fn prune_batches<B: Backend>(
    backend: &B,
    prune: &Prune,
    report: &mut PruneReport,
) -> Result<()> {
    type Page = fn(&mut dyn ReadTxn, Option<&str>, i64, usize) -> PageResult;
    type PageResult = Result<(Vec<String>, Option<String>)>;
    type Apply = fn(&mut dyn WriteTxn, i64, &[String], i64, bool) -> Result<logic::prune::Batch>;
    let idle_ms = prune.idle.as_millis().min(i64::MAX as u128) as i64;
    let (batch, dry_run) = (prune.batch.max(1), prune.dry_run);
    // Sessions first; then the lease records left without a session (a pruned session's
    // went with it).
    let kinds: [(Page, Apply); 2] = [
        (logic::prune::idle_page, logic::prune::prune_batch),
        (logic::prune::stale_lease_page, logic::prune::prune_leases),
    ];
    for (page, apply) in kinds {
        let mut after: Option<String> = None;
        loop {
            // Candidates by this host's clock; each write checks again by the store's.
            let cutoff = backend.clock().now_ms().saturating_sub(idle_ms);
            let from = after.take();
            let read = move |txn: &mut dyn ReadTxn| page(txn, from.as_deref(), cutoff, batch);
            let (ids, next) = backend.read(read).await?;
            if !ids.is_empty() {
                let locked = ids.clone();
                let write =
                    move |txn: &mut dyn WriteTxn, now| apply(txn, now, &ids, idle_ms, dry_run);
                let done = backend.write_sessions(locked, write).await?;
                report.sessions.extend(done.removed);
                report.kept_leased.extend(done.leased);
                report.leases.extend(done.leases);
            }
            match next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
    }
    Ok(())
}

/// Implements [`BindingStore`] for `$store` on its [`Backend`] `self.$backend`.
macro_rules! backend_store {
    ($store:ty, $backend:ident) => {
        const _: () = {
            use std::ops::Range;
            use std::time::Duration;

            use serde_json::{Map, Value};

            use $crate::adapter::Backend;
            use $crate::logic::{self, LeaseTxn, ReadTxn, WriteTxn};
            use $crate::{
                BindingStore, CommitOutcome, Fence, ImportOutcome, Lease, LeaseOwner, MirroredFile,
                Prune, PruneReport, Result, Retirement, SessionExport, SessionPage, SessionRecord,
                StoredBytes, TranscriptRow, TurnCommit, VerifyProgress, VerifyReport,
            };

            #[async_trait::async_trait]
            impl BindingStore for $store {
                async fn session(&self, session_id: &str) -> Result<Option<SessionRecord>> {
                    let id = session_id.to_string();
                    self.$backend
                        .read(move |txn| logic::load_session(txn, &id))
                        .await
                }

                async fn rows(
                    &self,
                    session_id: &str,
                    range: Range<u64>,
                ) -> Result<Vec<TranscriptRow>> {
                    if range.start >= range.end {
                        return Ok(Vec::new());
                    }
                    let id = session_id.to_string();
                    let op = move |txn: &mut dyn ReadTxn| logic::rows(txn, &id, range.clone());
                    self.$backend.read(op).await
                }

                async fn commit_turn(&self, commit: TurnCommit) -> Result<CommitOutcome> {
                    let id = commit.session_id.clone();
                    let op = move |txn: &mut dyn WriteTxn, now| logic::commit(txn, now, &commit);
                    self.$backend.write(&id, op).await
                }

                async fn patch_config(
                    &self,
                    session_id: &str,
                    patch: Map<String, Value>,
                    fence: Option<&Fence>,
                ) -> Result<Map<String, Value>> {
                    let (id, fence) = (session_id.to_string(), fence.cloned());
                    let op = move |txn: &mut dyn WriteTxn, now| {
                        logic::patch(txn, now, &id, &patch, fence.as_ref())
                    };
                    self.$backend.write(session_id, op).await
                }

                async fn retire_thread(
                    &self,
                    session_id: &str,
                    thread_id: &str,
                    retirement: Retirement,
                    fence: Option<&Fence>,
                ) -> Result<()> {
                    let (id, thread) = (session_id.to_string(), thread_id.to_string());
                    let fence = fence.cloned();
                    let op = move |txn: &mut dyn WriteTxn, now| {
                        logic::retire(txn, now, &id, &thread, &retirement, fence.as_ref())
                    };
                    self.$backend.write(session_id, op).await
                }

                async fn mark_notice_delivered(
                    &self,
                    session_id: &str,
                    thread_id: &str,
                    fence: Option<&Fence>,
                ) -> Result<bool> {
                    let (id, thread) = (session_id.to_string(), thread_id.to_string());
                    let fence = fence.cloned();
                    let op = move |txn: &mut dyn WriteTxn, now| {
                        logic::mark_delivered(txn, now, &id, &thread, fence.as_ref())
                    };
                    self.$backend.write(session_id, op).await
                }

                async fn thread_session(&self, thread_id: &str) -> Result<Option<String>> {
                    let thread = thread_id.to_string();
                    self.$backend
                        .read(move |txn| txn.thread_owner(&thread))
                        .await
                }

                async fn write_mirror_file(
                    &self,
                    session_id: &str,
                    thread_id: &str,
                    path: &str,
                    mut out: Box<dyn std::io::Write + Send>,
                ) -> Result<Option<MirroredFile>> {
                    let (id, thread, path) = (
                        session_id.to_string(),
                        thread_id.to_string(),
                        path.to_string(),
                    );
                    let op = move |txn: &mut dyn ReadTxn| {
                        let file = logic::FileKey::new(&id, &thread, &path);
                        logic::write_mirror_file(txn, file, &mut out)
                    };
                    self.$backend.read(op).await
                }

                async fn list_sessions(
                    &self,
                    after: Option<&str>,
                    limit: usize,
                ) -> Result<SessionPage> {
                    let after = after.map(str::to_string);
                    let op =
                        move |txn: &mut dyn ReadTxn| logic::list_page(txn, after.as_deref(), limit);
                    self.$backend.read(op).await
                }

                async fn delete_session(&self, session_id: &str) -> Result<bool> {
                    let id = session_id.to_string();
                    let op = move |txn: &mut dyn WriteTxn, now| logic::delete(txn, now, &id);
                    self.$backend.write(session_id, op).await
                }

                async fn prune_sessions(&self, prune: Prune) -> Result<PruneReport> {
                    crate::adapter::prune(&self.$backend, &prune).await
                }

                async fn session_bytes(&self, session_ids: &[String]) -> Result<Vec<StoredBytes>> {
                    let ids = session_ids.to_vec();
                    let op = move |txn: &mut dyn ReadTxn| logic::prune::session_bytes(txn, &ids);
                    self.$backend.read(op).await
                }

                async fn export_session(&self, session_id: &str) -> Result<Option<SessionExport>> {
                    let id = session_id.to_string();
                    self.$backend.read(move |txn| logic::export(txn, &id)).await
                }

                async fn import_session(&self, export: SessionExport) -> Result<ImportOutcome> {
                    let id = export.record.session_id.clone();
                    let op = move |txn: &mut dyn WriteTxn, now| logic::import(txn, now, &export);
                    self.$backend.write(&id, op).await
                }

                async fn acquire_lease(
                    &self,
                    session_id: &str,
                    owner: &LeaseOwner,
                    ttl: Duration,
                ) -> Result<Lease> {
                    let (id, owner, ttl) =
                        (session_id.to_string(), owner.clone(), logic::ttl_ms(ttl));
                    let op = move |leases: &mut dyn LeaseTxn, now| {
                        logic::acquire(leases, now, &id, &owner, ttl)
                    };
                    self.$backend.lease(session_id, op).await
                }

                async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
                    let (held, ttl) = (lease.clone(), logic::ttl_ms(ttl));
                    let op =
                        move |leases: &mut dyn LeaseTxn, now| logic::renew(leases, now, &held, ttl);
                    self.$backend.lease(&lease.session_id, op).await
                }

                async fn release_lease(&self, lease: &Lease) -> Result<bool> {
                    let held = lease.clone();
                    let op =
                        move |leases: &mut dyn LeaseTxn, now| logic::release(leases, now, &held);
                    self.$backend.lease(&lease.session_id, op).await
                }

                async fn verify(
                    &self,
                    progress: &mut (dyn for<'p> FnMut(&'p VerifyProgress) + Send),
                ) -> Result<VerifyReport> {
                    self.$backend.verify(self, progress).await
                }
            }
        };
    };
}
pub(crate) use backend_store;
