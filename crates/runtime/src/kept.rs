//! Threads kept without a session (`docs/design.md`, "Threads kept without a session"): with
//! a store named and no session, each thread the client runs is kept by its own id, as a
//! session record keyed `thread:<canonical id>` ([`key`]): the binding and the rollout mirror,
//! no transcript rows. Everything the store and the CLI do per session (lease, commit,
//! restore, listings, `forget`, `doctor`, `verify`, `migrate`, `prune`) applies unchanged;
//! no user session can have such an id ([`check_session_id`]).
//!
//! [`Keeper`] keeps the threads of one `rethread app-server` connection; `rethread exec`
//! drives its one thread through the session machine under the thread's key.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rethread_protocol::ThreadId;
use rethread_store::{BindingStore, LocalOwner, StoreError, Unpoisoned};

use crate::binding::{client_thread, MachineAccess, StoreSide};
use crate::error::RuntimeError;
use crate::lease::SessionLease;
use crate::machine::{MachineOptions, Say, SessionMachine, Stored};
use crate::mirror::RolloutMirror;
use crate::options::BinderOptions;
use crate::sink::Transcript;

/// The key space of threads kept without a session.
pub const PREFIX: &str = "thread:";

/// The record key of `thread`, kept without a session: `thread:<canonical id>`.
pub fn key(thread: &str) -> String {
    format!("{PREFIX}{}", ThreadId::new(thread))
}

/// The record key a session id given by a person or a script names: a kept thread's
/// (`thread:` and an id) in its canonical spelling ([`key`]; `thread:0195EC6B-...` and
/// `thread:0195ec6b-...` are one thread, as codex reads them), any other id as it is. How
/// every command that takes a session id reads it.
pub fn record_key(session_id: &str) -> String {
    match thread_of(session_id) {
        Some(thread) => key(thread),
        None => session_id.to_string(),
    }
}

/// The thread a record key names, when it is a kept thread's.
pub fn thread_of(session_id: &str) -> Option<&str> {
    session_id.strip_prefix(PREFIX)
}

/// Refuses a session id in the kept threads' key space: a user session named `thread:...`
/// could take a kept thread's record.
///
/// # Errors
/// [`StoreError::InvalidInput`] naming the reserved prefix.
pub fn check_session_id(session_id: &str) -> Result<(), RuntimeError> {
    match thread_of(session_id) {
        Some(_) => Err(RuntimeError::Store(StoreError::InvalidInput(format!(
            "session id `{session_id}`: ids starting with `{PREFIX}` are reserved for threads \
             kept without a session"
        )))),
        None => Ok(()),
    }
}

/// `thread` in its canonical spelling, unless it is a session's: a client without a session
/// never uses one, through any request ([`client_thread`] under the thread's own key).
///
/// # Errors
/// [`RuntimeError::ThreadTaken`] naming the session; a store failure.
pub async fn check(store: &BindingStore, thread: &str) -> Result<ThreadId, RuntimeError> {
    client_thread(store, &key(thread), Some(thread), false).await
}

/// The threads one connection keeps without a session: one lease each (`thread:<id>`), held
/// from the thread's first use until [`release_all`](Keeper::release_all), and a session
/// machine each, which decides what each completed turn commits and what is said, as for a
/// session.
#[derive(Debug)]
pub struct Keeper {
    store: BindingStore,
    mirror: RolloutMirror,
    options: BinderOptions,
    owner: Arc<LocalOwner>,
    held: std::sync::Mutex<HashMap<String, Kept>>,
}

/// One kept thread's lease and machine.
#[derive(Debug)]
struct Kept {
    lease: Arc<SessionLease>,
    machine: SessionMachine,
}

/// A kept thread's machine, reached through the keeper's lock one short step at a time; a
/// thread let go meanwhile has a machine with nothing to do.
struct KeptMachine<'a> {
    keeper: &'a Keeper,
    key: &'a str,
}

impl MachineAccess for KeptMachine<'_> {
    fn with<R>(&mut self, f: impl FnOnce(&mut SessionMachine) -> R) -> R {
        let mut held = self.keeper.held.lock().unpoisoned();
        match held.get_mut(self.key) {
            Some(kept) => f(&mut kept.machine),
            None => f(&mut SessionMachine::new(
                self.key,
                MachineOptions::default(),
            )),
        }
    }
}

impl Keeper {
    /// The keeper of `store` under `options` (lease TTL and wait, `CODEX_HOME`, the mirror's
    /// cap); `None` without a mirror (`RETHREAD_MIRROR=off`, or no `CODEX_HOME`): a record
    /// without the rollout would keep nothing.
    pub fn new(store: BindingStore, options: BinderOptions) -> Option<Keeper> {
        Some(Keeper {
            mirror: options.rollout_mirror()?,
            store,
            options,
            owner: Arc::new(LocalOwner::new()),
            held: Default::default(),
        })
    }

    /// Takes `thread`'s lease unless held already (waiting up to the lease wait) and, with
    /// `restore` (a resume), restores its rollout ([`Keeper::restore`]). Returns whether the
    /// lease was taken now (not held already).
    ///
    /// # Errors
    /// [`RuntimeError::ThreadTaken`] for a thread of a session (one live holder per thread:
    /// that session's); [`RuntimeError::SessionBusy`] while another live process keeps the
    /// thread; a store failure.
    pub async fn take(&self, thread: &str, restore: bool) -> Result<bool, RuntimeError> {
        let key = key(thread);
        if self.lease(&key).is_some() {
            return Ok(false);
        }
        let thread = self.check(thread).await?;
        let ttl = self.options.lease_ttl.unwrap_or(Duration::from_secs(30));
        let (store, owner) = (self.store.clone(), self.owner.clone());
        let wait = self.options.lease_wait;
        let lease = Arc::new(SessionLease::acquire(store, &key, owner, ttl, wait).await?);
        let mut machine = SessionMachine::new(&key, self.options.machine_options());
        // The thread is the record's own (codex names it; nothing to read or seed).
        machine.handle_client_thread(thread.as_str(), false, Some(&Stored::Unbound));
        self.held
            .lock()
            .unpoisoned()
            .insert(key, Kept { lease, machine });
        if restore {
            self.restore(thread.as_str()).await;
        }
        Ok(true)
    }

    /// `thread` in its canonical spelling, unless it is a session's: a client without a
    /// session never uses one, through any request ([`client_thread`] under the thread's own
    /// key).
    ///
    /// # Errors
    /// [`RuntimeError::ThreadTaken`] naming the session; a store failure.
    pub async fn check(&self, thread: &str) -> Result<ThreadId, RuntimeError> {
        check(&self.store, thread).await
    }

    /// Restores `thread`'s rollout from its own record where this home lacks it or holds a
    /// strict prefix of it ([`StoreSide::restore_named`]: a failure is logged, codex answers):
    /// before a resume, and before a fork of it.
    pub async fn restore(&self, thread: &str) {
        let key = key(thread);
        let lease = self.lease(&key);
        let side = self.side(&key, lease.as_deref());
        side.restore_named(ThreadId::new(thread).as_str()).await;
    }

    /// Releases `thread`'s lease (codex refused the resume that took it: the thread is not in
    /// use here); a no-op when it is not held.
    ///
    /// # Errors
    /// A store failure: the lease expires on its own.
    pub async fn release(&self, thread: &str) -> Result<(), RuntimeError> {
        let held = self.held.lock().unpoisoned().remove(&key(thread));
        match held {
            Some(kept) => kept.lease.release().await.map(drop),
            None => Ok(()),
        }
    }

    /// Records a completed turn of `thread` as its machine decides
    /// ([`StoreSide::complete_turn`]: its rollout's growth and the binding, no rows, under
    /// its lease) and returns what the machine says of it (a failed commit, the mirror's cap,
    /// a lost lease); nothing when the thread is not kept.
    pub async fn complete_turn(&self, thread: &str) -> Vec<Say> {
        let key = key(thread);
        let Some(lease) = self.lease(&key) else {
            return Vec::new();
        };
        let mut machine = KeptMachine {
            keeper: self,
            key: &key,
        };
        let side = self.side(&key, Some(&lease));
        let thread = ThreadId::new(thread);
        let (_, said) = side
            .complete_turn(&mut machine, thread.as_str(), Vec::new())
            .await;
        if lease.is_lost() {
            // Taken over or forgotten: a later use takes the thread anew.
            self.held.lock().unpoisoned().remove(&key);
        }
        said
    }

    /// Releases every lease held (on the connection's end); the first failure is returned,
    /// the leases it leaves expire on their own.
    pub async fn release_all(&self) -> Result<(), RuntimeError> {
        let held: Vec<_> = self.held.lock().unpoisoned().drain().collect();
        let mut result = Ok(());
        for (_, kept) in held {
            if let Err(error) = kept.lease.release().await {
                result = result.and(Err(error));
            }
        }
        result
    }

    fn lease(&self, key: &str) -> Option<Arc<SessionLease>> {
        let held = self.held.lock().unpoisoned();
        held.get(key).map(|kept| Arc::clone(&kept.lease))
    }

    /// The store side of the thread kept under `key`.
    fn side<'a>(&'a self, key: &'a str, lease: Option<&'a SessionLease>) -> StoreSide<'a> {
        StoreSide {
            store: &self.store,
            session_id: key,
            lease,
            transcript: &Transcript::Store,
            mirror: Some(&self.mirror),
            codex_home: self.options.codex_home.as_deref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_thread_has_one_key_in_every_spelling_and_no_session_can_take_it() {
        let id = "0195ec6b-66c5-7e31-9f2f-3ad0a1f2b9c4";
        let upper = key(&id.to_uppercase());
        assert_eq!(upper, format!("thread:{id}"));
        assert_eq!(key(&format!("urn:uuid:{id}")), upper);
        assert_eq!(thread_of(&upper), Some(id));
        assert_eq!(thread_of("chat-42"), None);
        assert_eq!(record_key(&format!("thread:{}", id.to_uppercase())), upper);
        assert_eq!(record_key("Chat-42"), "Chat-42");
        assert!(check_session_id("chat-42").is_ok());
        let refused = check_session_id(&upper).unwrap_err();
        assert!(refused.to_string().contains("reserved"), "{refused}");
    }
}
