//! [`SessionLease`]: a session's lease as a host holds it (`docs/design.md`, "Leases").

use rethread_store::Unpoisoned;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rethread_store::{BindingStore, Fence, Lease, LocalOwner, StoreError};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::error::RuntimeError;
use crate::machine::LeaseLostTo;
use crate::telemetry;

/// The shortest and longest pause between two attempts to take a busy lease.
const WAIT_STEP_MIN: Duration = Duration::from_millis(20);
const WAIT_STEP_MAX: Duration = Duration::from_millis(500);

#[derive(Debug)]
struct State {
    lease: Lease,
    /// When the last successful renewal (or the grant) was *sent*: the lease holds at least
    /// until this instant plus the TTL, unless the process stalled meanwhile (the store's fence
    /// check covers that).
    fresh_since: Instant,
    /// Set when a renewal or a fenced write found the lease gone.
    lost: bool,
    lost_to: Option<LeaseLostTo>,
    released: bool,
}

impl State {
    /// [`RuntimeError::LeaseLost`] when the lease is known lost or released.
    fn gone(&self) -> Option<RuntimeError> {
        (self.lost || self.released).then(|| RuntimeError::LeaseLost {
            session_id: self.lease.session_id.clone(),
            to: self.lost_to.clone().unwrap_or(LeaseLostTo::Unknown),
        })
    }

    /// Takes the answer to a renewal sent at `sent`: the renewed lease, or its loss.
    fn renewed(
        &mut self,
        renewed: Result<Lease, StoreError>,
        sent: Instant,
    ) -> Result<Fence, RuntimeError> {
        match renewed.map_err(RuntimeError::from) {
            Ok(lease) => {
                self.fresh_since = sent;
                self.lease = lease;
                Ok(self.lease.fence())
            }
            Err(error) => {
                if let RuntimeError::LeaseLost { to, .. } = &error {
                    self.lost = true;
                    self.lost_to = Some(to.clone());
                }
                Err(error)
            }
        }
    }
}

/// A held session lease: taken before a thread is resumed or started, renewed every `ttl / 3`
/// in the background, its fence (after [`ensure_fresh`](SessionLease::ensure_fresh)) carried
/// by every write that publishes or removes a binding, released by
/// [`release`](SessionLease::release) or, in the background, when dropped.
///
/// ```no_run
/// # async fn demo(store: rethread_store::BindingStore) -> Result<(), rethread_runtime::RuntimeError> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use rethread_runtime::SessionLease;
/// use rethread_store::LocalOwner;
///
/// let owner = Arc::new(LocalOwner::new());
/// // Waits up to 5 s for another holder to finish, else `RuntimeError::SessionBusy`.
/// let lease = SessionLease::acquire(store.clone(), "chat-42", owner, Duration::from_secs(30), Duration::from_secs(5)).await?;
/// let _fence = lease.ensure_fresh().await?; // carry it with every binding write
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SessionLease {
    store: BindingStore,
    /// Kept alive with the lease: while it lives no other holder on this machine takes the
    /// lease over before it expires.
    owner: Arc<LocalOwner>,
    ttl: Duration,
    state: Arc<Mutex<State>>,
    renewer: JoinHandle<()>,
}

impl SessionLease {
    /// Takes `session_id`'s lease for `owner` for `ttl`.
    ///
    /// # Contract
    /// - Granted at once when the session is free, when `owner` already holds it (a new grant
    ///   with a new fence), or when its holder is provably gone (same machine, process
    ///   exited; or a dropped [`LocalOwner`] of this process).
    /// - Otherwise retried, with pauses growing from 20 ms to 500 ms, until `wait` has passed;
    ///   then [`RuntimeError::SessionBusy`] naming the holder. `wait` zero tries once.
    /// - Any other store failure is returned at once.
    pub async fn acquire(
        store: BindingStore,
        session_id: &str,
        owner: Arc<LocalOwner>,
        ttl: Duration,
        wait: Duration,
    ) -> Result<SessionLease, RuntimeError> {
        let span = tracing::info_span!(
            telemetry::SPAN_LEASE,
            session_id = %session_id,
            outcome = tracing::field::Empty
        );
        let started_at = Instant::now();
        let deadline = crate::deadline(started_at, wait);
        // The grant, and when it was asked for (its freshness counts from then).
        let granted = async {
            let mut step = WAIT_STEP_MIN;
            loop {
                let sent = Instant::now();
                match store.acquire_lease(session_id, owner.owner(), ttl).await {
                    Ok(lease) => return Ok((lease, sent)),
                    Err(StoreError::Busy { .. }) if Instant::now() < deadline => {
                        let pause = step.min(deadline.saturating_duration_since(Instant::now()));
                        tokio::time::sleep(pause).await;
                        step = (step * 2).min(WAIT_STEP_MAX);
                    }
                    Err(error) => return Err(RuntimeError::from(error)),
                }
            }
        }
        .instrument(span.clone())
        .await;
        let outcome = match &granted {
            Ok(_) => "acquired",
            Err(RuntimeError::SessionBusy { .. }) => "busy",
            Err(_) => "error",
        };
        span.record("outcome", outcome);
        metrics::histogram!(telemetry::LEASE_WAIT_SECONDS, "outcome" => outcome)
            .record(started_at.elapsed().as_secs_f64());
        let (lease, sent) = granted?;
        let state = Arc::new(Mutex::new(State {
            lease,
            fresh_since: sent,
            lost: false,
            lost_to: None,
            released: false,
        }));
        let renewer = tokio::spawn(renew_loop(store.clone(), Arc::clone(&state), ttl));
        Ok(SessionLease {
            store,
            owner,
            ttl,
            state,
            renewer,
        })
    }

    /// The lease as last granted or renewed.
    pub fn lease(&self) -> Lease {
        self.state.lock().unpoisoned().lease.clone()
    }

    /// The proof of this grant that fenced writes carry. Prefer
    /// [`ensure_fresh`](SessionLease::ensure_fresh), which also renews a stale lease.
    pub fn fence(&self) -> Fence {
        self.state.lock().unpoisoned().lease.fence()
    }

    /// The holder this lease names.
    pub fn owner(&self) -> &LocalOwner {
        &self.owner
    }

    /// Whether the lease is known to be gone: a renewal found it taken over or expired, or it
    /// was released. A gone lease is never renewed again; take a new one.
    pub fn is_lost(&self) -> bool {
        self.lost().is_some()
    }

    /// [`RuntimeError::LeaseLost`] when the lease is known lost or released; no store call.
    pub(crate) fn lost(&self) -> Option<RuntimeError> {
        self.state.lock().unpoisoned().gone()
    }

    /// Makes sure the lease holds for at least `ttl / 2` more, renewing it now unless the last
    /// renewal is recent, and returns the fence to carry with the write that follows.
    ///
    /// # Contract
    /// A lease known to be gone, or a renewal the store refuses, is
    /// [`RuntimeError::LeaseLost`]; nothing is written. The fence is still checked by the
    /// store inside the write's transaction (a process paused after this call writes
    /// nothing either).
    pub async fn ensure_fresh(&self) -> Result<Fence, RuntimeError> {
        let lease = {
            let state = self.state.lock().unpoisoned();
            if let Some(gone) = state.gone() {
                return Err(gone);
            }
            if state.fresh_since.elapsed() < self.ttl / 2 {
                return Ok(state.lease.fence());
            }
            state.lease.clone()
        };
        let sent = Instant::now();
        let renewed = self.store.renew_lease(&lease, self.ttl).await;
        self.state.lock().unpoisoned().renewed(renewed, sent)
    }

    /// Stops renewing and frees the lease now. Returns whether it was still held (a lease
    /// taken over meanwhile is left to its new holder). Releasing twice is a no-op.
    ///
    /// # Contract
    /// After this call (whatever it returns) the lease is never renewed again, and every later
    /// [`ensure_fresh`](SessionLease::ensure_fresh) is [`RuntimeError::LeaseLost`]. A store
    /// failure is returned: the lease then expires on its own after its TTL (or is taken over
    /// at once by the next holder on this machine once this process exits).
    pub async fn release(&self) -> Result<bool, RuntimeError> {
        let Some(lease) = self.stop(false) else {
            return Ok(false);
        };
        Ok(self.store.release_lease(&lease).await?)
    }

    /// Stops renewing and marks the lease released: the lease to free, unless it was released
    /// already (or, with `unless_lost`, is lost).
    fn stop(&self, unless_lost: bool) -> Option<Lease> {
        self.renewer.abort();
        let mut state = self.state.lock().unpoisoned();
        if state.released || (unless_lost && state.lost) {
            return None;
        }
        state.released = true;
        Some(state.lease.clone())
    }
}

impl Drop for SessionLease {
    fn drop(&mut self) {
        let Some(lease) = self.stop(true) else {
            return;
        };
        // Without a runtime the lease expires (or is taken over once this process is gone).
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            // The owner is not kept for the release: once it is dropped too, another holder of
            // this process takes the lease over at once, and this late release of an older grant
            // (an older fence) then frees nothing.
            let store = self.store.clone();
            drop(handle.spawn(async move {
                if let Err(error) = store.release_lease(&lease).await {
                    tracing::warn!(%error, session_id = %lease.session_id, "could not release the session lease; it expires on its own");
                }
            }));
        }
    }
}

async fn renew_loop(store: BindingStore, state: Arc<Mutex<State>>, ttl: Duration) {
    let period = (ttl / 3).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(period).await;
        let lease = state.lock().unpoisoned().lease.clone();
        let sent = Instant::now();
        let renewed = store.renew_lease(&lease, ttl).await;
        match state.lock().unpoisoned().renewed(renewed, sent) {
            Ok(_) => {}
            Err(RuntimeError::LeaseLost { .. }) => return,
            // A transient store failure: try again next period; fenced writes check
            // freshness themselves.
            Err(error) => {
                tracing::warn!(%error, session_id = %lease.session_id, "renewing the session lease failed; retrying");
            }
        }
    }
}

/// Marks `lease` lost when `result` is the store's refusal of a write under its fence: the
/// renewal may not have noticed the takeover yet (it runs every third of the TTL), and the
/// binder's next open must take the lease again, not open the thread with this one.
pub(crate) fn note_refusal<T>(lease: Option<&SessionLease>, result: &Result<T, RuntimeError>) {
    if let (Some(lease), Err(RuntimeError::LeaseLost { to, .. })) = (lease, result) {
        let mut state = lease.state.lock().unpoisoned();
        state.lost = true;
        state.lost_to.get_or_insert_with(|| to.clone());
    }
}

/// The fence for a write, after making sure the lease is fresh (`None` without a lease).
pub(crate) async fn fresh_fence(
    lease: Option<&SessionLease>,
) -> Result<Option<rethread_store::Fence>, RuntimeError> {
    match lease {
        Some(lease) => lease.ensure_fresh().await.map(Some),
        None => Ok(None),
    }
}
