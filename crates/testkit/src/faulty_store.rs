//! A store that fails at a chosen call: an [`Engine`] over another store's engine that runs
//! every request unless [`Faults`] says that call (by the store method it serves) fails; it then
//! writes nothing. It also records the fence every fenceable write carried, and can have
//! another host take the lease over right before a chosen call.
//!
//! Hand-written rather than a mockall mock: the faults are in the engine, under the store's
//! own rules, so a failure is seen exactly as a backend's would be.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use rethread_store::engine::{Answer, Engine, LeaseFn, ReadFn, Request, WriteFn};
use rethread_store::{BindingStore, Clock, Fence, Lease, LeaseOwner, StoreError, Unpoisoned};

/// The store methods whose writes carry a fence.
const FENCEABLE: [&str; 4] = [
    "commit_turn",
    "patch_config",
    "retire_thread",
    "mark_notice_delivered",
];

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

    fn record_lease(&self, lease: Option<&Lease>) {
        if let Some(lease) = lease {
            self.plan().last_lease = Some(lease.clone());
        }
    }
}

/// The engine of a store that fails where its [`Faults`] say, over another store's engine.
#[derive(Debug)]
struct FaultyEngine {
    inner: BindingStore,
    faults: Faults,
}

/// A store over `inner`'s engine (shared: `inner` sees every write), failing where `faults`
/// says.
pub fn over(inner: BindingStore, faults: Faults) -> BindingStore {
    BindingStore::new(FaultyEngine { inner, faults })
}

impl FaultyEngine {
    /// Counts the call (after a due takeover); `Err` when it is one that fails.
    async fn enter(&self, request: Request<'_>) -> Result<(), StoreError> {
        let method = request.method;
        self.take_over(method).await;
        let mut plan = self.faults.plan();
        let n = {
            let count = plan.calls.entry(method).or_default();
            *count += 1;
            *count
        };
        if FENCEABLE.contains(&method) {
            plan.fences.push((method, request.fence.cloned()));
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
impl Engine for FaultyEngine {
    fn clock(&self) -> Clock {
        self.inner.engine().clock()
    }

    async fn read(&self, request: Request<'_>, op: ReadFn) -> Result<Answer, StoreError> {
        self.enter(request).await?;
        self.inner.engine().read(request, op).await
    }

    async fn write(&self, request: Request<'_>, op: WriteFn) -> Result<Answer, StoreError> {
        self.enter(request).await?;
        self.inner.engine().write(request, op).await
    }

    async fn lease(&self, request: Request<'_>, op: LeaseFn) -> Result<Answer, StoreError> {
        self.enter(request).await?;
        let answer = self.inner.engine().lease(request, op).await;
        // The grant a renewal or an acquire answered: the lease a takeover takes.
        if let Ok(lease) = answer.as_ref().map(|a| a.downcast_ref::<Lease>()) {
            self.faults.record_lease(lease);
        }
        answer
    }
}
