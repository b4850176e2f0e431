//! The session lease as the runtime holds it: acquired before a thread is resumed or started,
//! renewed in the background while held, checked before every turn commit, released when the
//! last codex session of the agent goes away.
//!
//! Architecture invariant: a commit starts only while the lease is known to hold for at least
//! half its TTL more (the last renewal was sent less than `ttl / 2` ago, else it is renewed
//! first), so a commit shorter than `ttl / 2` can never overlap another holder's turn.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rethread_store::{BindingStore, Lease, LeaseOwner, StoreError};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::agent::RuntimeError;

/// A lease release started in the background by a dropped guard.
struct PendingRelease {
    /// The store it goes to (the address of the `Arc`'s value) and the session.
    store: usize,
    session_id: String,
    /// Turns `true` when the release is done; closed if its task ended without finishing
    /// (its runtime shut down).
    done: watch::Receiver<bool>,
}

impl PendingRelease {
    fn finished(&self) -> bool {
        *self.done.borrow() || self.done.has_changed().is_err()
    }
}

/// Releases started by dropped guards, so that a host (or the next `Agent::open` of the same
/// session on the same store) can wait for them instead of finding its own stale lease. Waiting
/// never takes an entry away from another waiter (several runtimes may share the process).
static PENDING_RELEASES: Mutex<Vec<PendingRelease>> = Mutex::new(Vec::new());

fn pending() -> MutexGuard<'static, Vec<PendingRelease>> {
    PENDING_RELEASES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn store_key(store: &Arc<dyn BindingStore>) -> usize {
    Arc::as_ptr(store) as *const () as usize
}

/// Waits (at most 5 s) for the background releases `which` selects.
async fn wait_for_releases(which: impl Fn(&PendingRelease) -> bool) {
    let waits: Vec<watch::Receiver<bool>> = {
        let mut pending = pending();
        pending.retain(|p| !p.finished());
        pending
            .iter()
            .filter(|p| which(p))
            .map(|p| p.done.clone())
            .collect()
    };
    if waits.is_empty() {
        return;
    }
    let all = futures::future::join_all(waits.into_iter().map(|mut done| async move {
        // An error means the release task is gone: nothing more to wait for.
        let _ = done.wait_for(|finished| *finished).await;
    }));
    let _ = tokio::time::timeout(Duration::from_secs(5), all).await;
}

/// Waits (at most 5 s) for the lease releases that dropped sessions started in the background.
///
/// A host calls this before it exits, so that the next process does not find the session busy
/// until the lease expires. [`Agent::open`](crate::Agent::open) waits for the releases of its
/// own session before it acquires.
pub async fn flush_lease_releases() {
    wait_for_releases(|_| true).await;
}

#[derive(Debug)]
struct State {
    lease: Lease,
    /// When the last successful renewal (or the grant) was *sent*: the lease holds at least
    /// until this instant plus the TTL.
    fresh_since: Instant,
    /// Set when a renewal found the lease gone.
    lost: bool,
}

/// A held session lease: renewed in the background every `ttl / 3`, released by
/// [`LeaseGuard::release`] or, in the background, on drop.
#[derive(Debug)]
pub(crate) struct LeaseGuard {
    store: Arc<dyn BindingStore>,
    ttl: Duration,
    state: Arc<Mutex<State>>,
    renewer: JoinHandle<()>,
    released: bool,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl LeaseGuard {
    /// Takes the session's lease for `owner`, or [`RuntimeError::SessionBusy`] naming the holder.
    pub(crate) async fn acquire(
        store: Arc<dyn BindingStore>,
        session_id: &str,
        owner: &LeaseOwner,
        ttl: Duration,
    ) -> Result<Self, RuntimeError> {
        let key = store_key(&store);
        wait_for_releases(|p| p.store == key && p.session_id == session_id).await;
        let sent = Instant::now();
        let lease = match store.acquire_lease(session_id, owner, ttl).await {
            Ok(lease) => lease,
            Err(StoreError::Busy {
                session_id,
                holder,
                acquired_at_ms,
                expires_at_ms,
            }) => {
                return Err(RuntimeError::SessionBusy {
                    session_id,
                    holder,
                    acquired_at_ms,
                    expires_at_ms,
                })
            }
            Err(other) => return Err(other.into()),
        };
        let state = Arc::new(Mutex::new(State {
            lease,
            fresh_since: sent,
            lost: false,
        }));
        let renewer = tokio::spawn(renew_loop(store.clone(), Arc::clone(&state), ttl));
        Ok(LeaseGuard {
            store,
            ttl,
            state,
            renewer,
            released: false,
        })
    }

    /// The lease as last granted or renewed.
    pub(crate) fn lease(&self) -> Lease {
        lock(&self.state).lease.clone()
    }

    /// Whether a renewal found the lease gone.
    pub(crate) fn is_lost(&self) -> bool {
        lock(&self.state).lost
    }

    /// Makes sure the lease holds for at least `ttl / 2` more before a commit: renews it now
    /// unless the last renewal is recent. A lost lease is [`RuntimeError::LeaseLost`].
    pub(crate) async fn ensure_fresh(&self) -> Result<(), RuntimeError> {
        let (lease, stale) = {
            let state = lock(&self.state);
            if state.lost {
                return Err(RuntimeError::LeaseLost {
                    session_id: state.lease.session_id.clone(),
                });
            }
            (
                state.lease.clone(),
                state.fresh_since.elapsed() >= self.ttl / 2,
            )
        };
        if !stale {
            return Ok(());
        }
        let sent = Instant::now();
        match self.store.renew_lease(&lease, self.ttl).await {
            Ok(renewed) => {
                let mut state = lock(&self.state);
                state.lease = renewed;
                state.fresh_since = sent;
                Ok(())
            }
            Err(StoreError::LeaseLost { session_id }) => {
                lock(&self.state).lost = true;
                Err(RuntimeError::LeaseLost { session_id })
            }
            Err(other) => Err(other.into()),
        }
    }

    /// Stops renewing and frees the lease now.
    pub(crate) async fn release(mut self) -> Result<(), RuntimeError> {
        self.released = true;
        self.renewer.abort();
        let lease = self.lease();
        self.store.release_lease(&lease).await?;
        Ok(())
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.renewer.abort();
        if self.released {
            return;
        }
        // Without a runtime the lease simply expires after its TTL.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let store = self.store.clone();
            let lease = self.lease();
            let (done_tx, done) = watch::channel(false);
            let entry = PendingRelease {
                store: store_key(&store),
                session_id: lease.session_id.clone(),
                done,
            };
            // Detached: the entry's channel reports when it is done.
            drop(handle.spawn(async move {
                if let Err(error) = store.release_lease(&lease).await {
                    tracing::warn!(%error, session_id = %lease.session_id, "could not release the session lease; it expires on its own");
                }
                let _ = done_tx.send(true);
            }));
            let mut pending = pending();
            pending.retain(|p| !p.finished());
            pending.push(entry);
        }
    }
}

async fn renew_loop(store: Arc<dyn BindingStore>, state: Arc<Mutex<State>>, ttl: Duration) {
    let period = (ttl / 3).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(period).await;
        let lease = lock(&state).lease.clone();
        let sent = Instant::now();
        match store.renew_lease(&lease, ttl).await {
            Ok(renewed) => {
                let mut state = lock(&state);
                state.lease = renewed;
                state.fresh_since = sent;
            }
            Err(StoreError::LeaseLost { .. }) => {
                lock(&state).lost = true;
                return;
            }
            // A transient store failure: try again next period; the commit path checks
            // freshness itself.
            Err(error) => {
                tracing::warn!(%error, session_id = %lease.session_id, "renewing the session lease failed; retrying");
            }
        }
    }
}
