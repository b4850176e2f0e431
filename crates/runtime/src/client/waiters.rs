//! [`Waiters`]: requests waiting for their answers, matched by id. The runtime's client and
//! the proxy's own requests to codex match answers through it.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

use rethread_store::Unpoisoned;
use tokio::sync::oneshot;

/// The requests waiting for an answer, by id, at most a bound of them; closed once the peer's
/// output ends (every waiter then fails, and so does every later one).
#[derive(Debug)]
pub struct Waiters<K, V> {
    /// `None` once closed: no answer will come.
    waiting: Mutex<Option<HashMap<K, oneshot::Sender<V>>>>,
    limit: usize,
}

/// Why [`Waiters::wait`] took no waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitRefused {
    /// Closed: no answer will come.
    Closed,
    /// As many requests as the bound are waiting already.
    Full {
        /// The bound.
        limit: usize,
    },
}

impl<K: Hash + Eq + Clone, V> Waiters<K, V> {
    /// No waiter yet; at most `limit` at once.
    pub fn new(limit: usize) -> Self {
        Waiters {
            waiting: Mutex::new(Some(HashMap::new())),
            limit,
        }
    }

    /// Registers a request with this `id` (new: ids are the caller's to keep unique). The
    /// waiter resolves with its answer, and removes itself when dropped unanswered (a timeout,
    /// a cancelled caller): a late answer then finds nobody.
    ///
    /// # Errors
    /// [`WaitRefused`], and nothing is registered.
    pub fn wait(&self, id: K) -> Result<Waiter<'_, K, V>, WaitRefused> {
        let mut waiting = self.waiting.lock().unpoisoned();
        let waiting = waiting.as_mut().ok_or(WaitRefused::Closed)?;
        if waiting.len() >= self.limit {
            let limit = self.limit;
            return Err(WaitRefused::Full { limit });
        }
        let (tx, answer) = oneshot::channel();
        waiting.insert(id.clone(), tx);
        Ok(Waiter {
            waiters: self,
            id,
            answer,
        })
    }

    /// Hands `answer` to the request `id`; `false` when none waits for it (answered after its
    /// timeout, or never asked).
    pub fn deliver(&self, id: &K, answer: V) -> bool {
        let waiter = self
            .waiting
            .lock()
            .unpoisoned()
            .as_mut()
            .and_then(|w| w.remove(id));
        waiter.is_some_and(|waiter| waiter.send(answer).is_ok())
    }

    /// No answer will come: every waiter fails, and so does every later one.
    pub fn close(&self) {
        // Dropping the senders wakes every waiter.
        *self.waiting.lock().unpoisoned() = None;
    }
}

/// One request waiting for its answer ([`Waiters::wait`]).
#[derive(Debug)]
pub struct Waiter<'a, K: Hash + Eq, V> {
    waiters: &'a Waiters<K, V>,
    id: K,
    answer: oneshot::Receiver<V>,
}

impl<K: Hash + Eq, V> Waiter<'_, K, V> {
    /// The answer; `None` once the waiters are closed.
    pub async fn answer(&mut self) -> Option<V> {
        (&mut self.answer).await.ok()
    }
}

impl<K: Hash + Eq, V> Drop for Waiter<'_, K, V> {
    fn drop(&mut self) {
        if let Some(waiting) = self.waiters.waiting.lock().unpoisoned().as_mut() {
            waiting.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_answer_reaches_its_waiter_once_and_an_abandoned_one_finds_nobody() {
        let waiters = Waiters::new(2);
        let mut first = waiters.wait(1).unwrap();
        let second = waiters.wait(2).unwrap();
        assert_eq!(waiters.wait(3).unwrap_err(), WaitRefused::Full { limit: 2 });
        assert!(waiters.deliver(&1, "a"));
        assert!(!waiters.deliver(&1, "again"));
        assert_eq!(first.answer().await, Some("a"));
        drop(second);
        assert!(!waiters.deliver(&2, "late"));
        drop(first);
        let mut third = waiters.wait(3).unwrap();
        waiters.close();
        assert_eq!(third.answer().await, None);
        assert_eq!(waiters.wait(4).unwrap_err(), WaitRefused::Closed);
    }
}
