//! The clock a store judges time by: lease expiry, `updated_at_ms`, and which sessions are
//! idle ([`BindingStore::prune_sessions`](crate::BindingStore::prune_sessions)).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where a store reads "now" (ms since the Unix epoch): the system clock (the default), or a
/// manual clock that only moves when told, so that tests of lease TTLs and of idleness
/// advance time instead of sleeping. Clones of a manual clock share its time.
///
/// Set with [`OpenOptions::clock`](crate::OpenOptions::clock) (or
/// [`BindingStore::memory_with_clock`](crate::BindingStore::memory_with_clock)). PostgreSQL
/// judges time by the server's clock, so that every host agrees; a manual clock given to a
/// PostgreSQL store replaces the server's for that store's writes (tests only: hosts with
/// different clocks would judge leases differently).
///
/// ```
/// use std::time::Duration;
/// use rethread_store::Clock;
/// let clock = Clock::manual();
/// let before = clock.now_ms();
/// clock.advance(Duration::from_secs(90));
/// assert_eq!(clock.now_ms(), before + 90_000);
/// ```
#[derive(Clone, Debug, Default)]
pub struct Clock {
    manual: Option<Arc<AtomicI64>>,
}

impl Clock {
    /// The system clock.
    pub fn system() -> Self {
        Self::default()
    }

    /// A manual clock, starting at the system clock's now.
    pub fn manual() -> Self {
        Clock {
            manual: Some(Arc::new(AtomicI64::new(system_now_ms()))),
        }
    }

    /// Now, in ms since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        match &self.manual {
            Some(now) => now.load(Ordering::SeqCst),
            None => system_now_ms(),
        }
    }

    /// Moves a manual clock forward by `by`; the system clock ignores it.
    pub fn advance(&self, by: Duration) {
        if let Some(now) = &self.manual {
            let by = by.as_millis().min(i64::MAX as u128) as i64;
            now.fetch_add(by, Ordering::SeqCst);
        }
    }

    /// Whether this is a manual clock.
    pub fn is_manual(&self) -> bool {
        self.manual.is_some()
    }
}

fn system_now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
