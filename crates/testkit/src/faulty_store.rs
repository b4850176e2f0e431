//! A `BindingStore` that fails at a chosen call: every method delegates to a `MemoryStore`
//! unless [`Faults`] says that call fails (it then writes nothing). It also records the fence
//! every write carried, and can have another host take the lease over right before a chosen
//! call.
//!
//! Hand-written rather than a mockall mock: mockall cannot mock `BindingStore` (methods that
//! take `Option<&Fence>` under `async_trait`; mockall issue 571).

use rethread_store::Unpoisoned;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use rethread_store::{
    BindingStore, CommitOutcome, Fence, ImportOutcome, Lease, LeaseOwner, MemoryStore,
    MirroredFile, Prune, PruneReport, Retirement, SessionExport, SessionPage, SessionRecord,
    StoreError, StoredBytes, TranscriptRow, TurnCommit,
};
use serde_json::{Map, Value};

#[derive(Debug, Default)]
struct Plan {
    /// Method -> the 1-based calls that fail.
    failing: HashMap<&'static str, Vec<usize>>,
    calls: HashMap<&'static str, usize>,
    /// The fence argument of every write that can carry one, in call order.
    fences: Vec<(&'static str, Option<Fence>)>,
    /// The last lease granted or renewed through the store.
    last_lease: Option<Lease>,
    /// Methods before whose next call another host takes the session's lease over.
    takeovers: Vec<&'static str>,
}

/// Which calls fail, and what was called.
#[derive(Debug, Clone, Default)]
pub struct Faults(Arc<Mutex<Plan>>);

impl Faults {
    /// Call number `nth` (1-based) of `method` fails with a backend error and does nothing.
    pub fn fail(&self, method: &'static str, nth: usize) {
        self.plan().failing.entry(method).or_default().push(nth);
    }

    /// Before the next call of `method`, another host takes the lease over (the last one
    /// granted through this store is released and granted to a remote owner), as if this
    /// holder had stalled past its TTL without noticing.
    pub fn take_over_before(&self, method: &'static str) {
        self.plan().takeovers.push(method);
    }

    /// How many times `method` was called.
    pub fn calls(&self, method: &str) -> usize {
        self.plan().calls.get(method).copied().unwrap_or(0)
    }

    /// `(method, fence)` of every fenceable write so far.
    pub fn fences(&self) -> Vec<(&'static str, Option<Fence>)> {
        self.plan().fences.clone()
    }

    fn plan(&self) -> MutexGuard<'_, Plan> {
        self.0.lock().unpoisoned()
    }

    fn record_lease(&self, lease: &Result<Lease, StoreError>) {
        if let Ok(lease) = lease {
            self.plan().last_lease = Some(lease.clone());
        }
    }
}

/// A store over a `MemoryStore` that fails where its [`Faults`] say.
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<MemoryStore>,
    faults: Faults,
}

/// A store over `inner`, failing where `faults` says.
pub fn over(inner: Arc<MemoryStore>, faults: Faults) -> FaultyStore {
    FaultyStore { inner, faults }
}

impl FaultyStore {
    /// Counts the call (after a due takeover); `Err` when it is one that fails.
    async fn enter(
        &self,
        method: &'static str,
        fence: Option<Option<&Fence>>,
    ) -> Result<(), StoreError> {
        self.take_over(method).await;
        let mut plan = self.faults.plan();
        let n = {
            let count = plan.calls.entry(method).or_default();
            *count += 1;
            *count
        };
        if let Some(fence) = fence {
            plan.fences.push((method, fence.cloned()));
        }
        if plan
            .failing
            .get(method)
            .is_some_and(|calls| calls.contains(&n))
        {
            return Err(StoreError::Backend {
                backend: "faulty",
                source: format!("injected failure of {method} call {n}").into(),
            });
        }
        Ok(())
    }

    async fn take_over(&self, method: &'static str) {
        let lease = {
            let mut plan = self.faults.plan();
            let Some(at) = plan.takeovers.iter().position(|m| *m == method) else {
                return;
            };
            plan.takeovers.remove(at);
            plan.last_lease.clone().expect("a lease to take over")
        };
        let thief = LeaseOwner {
            host: "thief".into(),
            pid: 4242,
            started_at_ms: 1_700_000_000_000,
            instance: 1,
            process: None,
        };
        assert!(self.inner.release_lease(&lease).await.unwrap());
        self.inner
            .acquire_lease(&lease.session_id, &thief, Duration::from_secs(30))
            .await
            .unwrap();
    }
}

#[async_trait]
impl BindingStore for FaultyStore {
    async fn session(&self, session_id: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.enter("session", None).await?;
        self.inner.session(session_id).await
    }

    async fn rows(
        &self,
        session_id: &str,
        range: Range<u64>,
    ) -> Result<Vec<TranscriptRow>, StoreError> {
        self.enter("rows", None).await?;
        self.inner.rows(session_id, range).await
    }

    async fn commit_turn(&self, commit: TurnCommit) -> Result<CommitOutcome, StoreError> {
        self.enter("commit_turn", Some(commit.fence.as_ref()))
            .await?;
        self.inner.commit_turn(commit).await
    }

    async fn patch_config(
        &self,
        session_id: &str,
        patch: Map<String, Value>,
        fence: Option<&Fence>,
    ) -> Result<Map<String, Value>, StoreError> {
        self.enter("patch_config", Some(fence)).await?;
        self.inner.patch_config(session_id, patch, fence).await
    }

    async fn retire_thread(
        &self,
        session_id: &str,
        thread_id: &str,
        retirement: Retirement,
        fence: Option<&Fence>,
    ) -> Result<(), StoreError> {
        self.enter("retire_thread", Some(fence)).await?;
        self.inner
            .retire_thread(session_id, thread_id, retirement, fence)
            .await
    }

    async fn mark_notice_delivered(
        &self,
        session_id: &str,
        thread_id: &str,
        fence: Option<&Fence>,
    ) -> Result<bool, StoreError> {
        self.enter("mark_notice_delivered", Some(fence)).await?;
        self.inner
            .mark_notice_delivered(session_id, thread_id, fence)
            .await
    }

    async fn thread_session(&self, thread_id: &str) -> Result<Option<String>, StoreError> {
        self.enter("thread_session", None).await?;
        self.inner.thread_session(thread_id).await
    }

    async fn write_mirror_file(
        &self,
        session_id: &str,
        thread_id: &str,
        path: &str,
        out: Box<dyn std::io::Write + Send>,
    ) -> Result<Option<MirroredFile>, StoreError> {
        self.enter("write_mirror_file", None).await?;
        self.inner
            .write_mirror_file(session_id, thread_id, path, out)
            .await
    }

    async fn list_sessions(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<SessionPage, StoreError> {
        self.enter("list_sessions", None).await?;
        self.inner.list_sessions(after, limit).await
    }

    async fn delete_session(&self, session_id: &str) -> Result<bool, StoreError> {
        self.enter("delete_session", None).await?;
        self.inner.delete_session(session_id).await
    }

    async fn prune_sessions(&self, prune: Prune) -> Result<PruneReport, StoreError> {
        self.enter("prune_sessions", None).await?;
        self.inner.prune_sessions(prune).await
    }

    async fn session_bytes(&self, session_ids: &[String]) -> Result<Vec<StoredBytes>, StoreError> {
        self.enter("session_bytes", None).await?;
        self.inner.session_bytes(session_ids).await
    }

    async fn export_session(&self, session_id: &str) -> Result<Option<SessionExport>, StoreError> {
        self.enter("export_session", None).await?;
        self.inner.export_session(session_id).await
    }

    async fn import_session(&self, export: SessionExport) -> Result<ImportOutcome, StoreError> {
        self.enter("import_session", None).await?;
        self.inner.import_session(export).await
    }

    async fn acquire_lease(
        &self,
        session_id: &str,
        owner: &LeaseOwner,
        ttl: Duration,
    ) -> Result<Lease, StoreError> {
        self.enter("acquire_lease", None).await?;
        let granted = self.inner.acquire_lease(session_id, owner, ttl).await;
        self.faults.record_lease(&granted);
        granted
    }

    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease, StoreError> {
        self.enter("renew_lease", None).await?;
        let renewed = self.inner.renew_lease(lease, ttl).await;
        self.faults.record_lease(&renewed);
        renewed
    }

    async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError> {
        self.enter("release_lease", None).await?;
        self.inner.release_lease(lease).await
    }
}
