//! The writer thread of a file store: a plain group-commit loop. Writes come over a channel
//! with oneshot replies; whatever queued up while the previous transaction was being made
//! durable is applied in one transaction, and every caller is answered after the commit. No
//! engine write runs on an async runtime thread.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Mutex;
use std::time::Instant;

use tokio::sync::oneshot;

use crate::logic::WriteTxn;
use crate::{Clock, Result, StoreError, Unpoisoned};

const MAX_BATCH: usize = 256;

/// A write: runs in one write transaction at store time `now` (again, alone, when the group
/// commit it was part of failed).
pub(crate) trait WriteOp<T>:
    FnMut(&mut dyn WriteTxn, i64) -> Result<T> + Send + 'static
{
}
impl<T, F: FnMut(&mut dyn WriteTxn, i64) -> Result<T> + Send + 'static> WriteOp<T> for F {}

pub(crate) trait FileEngine: Send + 'static {
    /// Runs `f` in one write transaction and commits it (durably, unless relaxed) if `f`
    /// returns `Ok`; rolls it back otherwise.
    fn write(&mut self, f: &mut dyn FnMut(&mut dyn WriteTxn) -> Result<()>) -> Result<()>;

    /// When the engine wants [`FileEngine::flush`] called if no write comes first (a relaxed
    /// engine with commits not yet durable); `None`: never.
    fn flush_due(&self) -> Option<Instant> {
        None
    }

    /// Makes every commit so far durable. Called when [`FileEngine::flush_due`] has passed with
    /// no write in between, and when the writer stops.
    fn flush(&mut self) {}
}

/// A queued write of any output type, and its caller.
trait Queued: Send {
    /// Runs the write in `txn`. A logical refusal is kept as the result and the transaction
    /// goes on (the refused write wrote nothing); any other error fails the transaction.
    fn apply(&mut self, txn: &mut dyn WriteTxn, now: i64) -> Result<()>;
    /// Answers the caller: the kept result if the transaction committed, else its `error`.
    fn answer(self: Box<Self>, error: Option<StoreError>);
}

struct Job<T, O> {
    op: O,
    result: Option<Result<T>>,
    reply: oneshot::Sender<Result<T>>,
}

impl<T: Send, O: WriteOp<T>> Queued for Job<T, O> {
    fn apply(&mut self, txn: &mut dyn WriteTxn, now: i64) -> Result<()> {
        match (self.op)(txn, now) {
            Err(e) if !e.is_logical() => return Err(e),
            result => self.result = Some(result),
        }
        Ok(())
    }

    fn answer(self: Box<Self>, error: Option<StoreError>) {
        let result = match (error, self.result) {
            (Some(error), _) => Err(error),
            (None, Some(result)) => result,
            (None, None) => Err(StoreError::Internal(
                "a write was answered before it ran".to_string(),
            )),
        };
        let _ = self.reply.send(result);
    }
}

/// The async side of a writer thread.
///
/// Dropping it closes the channel and waits for the thread to finish the queued writes and
/// close the engine (a relaxed engine makes its commits durable then), so a process that
/// drops its store and exits leaves a closed, complete file. `close` is the async way.
#[derive(Debug)]
pub(crate) struct Writer {
    tx: Mutex<Option<mpsc::Sender<Box<dyn Queued>>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Writer {
    /// Starts the writer thread, runs `open` on it (opening never blocks the runtime), and
    /// returns once the engine is open. `open` also returns what the readers need.
    pub(crate) async fn spawn<E, R, F>(name: &str, clock: Clock, open: F) -> Result<(Writer, R)>
    where
        E: FileEngine,
        R: Send + 'static,
        F: FnOnce() -> Result<(E, R)> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel();
        let (opened_tx, opened_rx) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("rethread-{name}-writer"))
            .spawn(move || match open() {
                Ok((engine, readers)) => {
                    if opened_tx.send(Ok(readers)).is_ok() {
                        run(engine, rx, &clock);
                    }
                }
                Err(e) => {
                    let _ = opened_tx.send(Err(e));
                }
            })
            .map_err(|source| StoreError::io(format!("{name} writer thread"), source))?;
        let readers = opened_rx.await.map_err(|_| StoreError::Closed)??;
        let writer = Writer {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        };
        Ok((writer, readers))
    }

    pub(crate) async fn write<T: Send + 'static>(&self, op: impl WriteOp<T>) -> Result<T> {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Job {
            op,
            result: None,
            reply,
        });
        {
            let tx = self.tx.lock().unpoisoned();
            let tx = tx.as_ref().ok_or(StoreError::Closed)?;
            tx.send(job).map_err(|_| StoreError::Closed)?;
        }
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Closes the channel and waits (off the runtime) for the thread to finish; later writes
    /// are [`StoreError::Closed`].
    pub(crate) async fn close(&self) {
        drop(self.tx.lock().unpoisoned().take());
        let thread = self.thread.lock().unpoisoned().take();
        if let Some(thread) = thread {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Closing the channel stops the thread once it has committed what is queued. The wait
        // is one commit and the engine's close.
        drop(self.tx.lock().unpoisoned().take());
        if let Some(thread) = self.thread.lock().unpoisoned().take() {
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

fn run<E: FileEngine>(mut engine: E, rx: mpsc::Receiver<Box<dyn Queued>>, clock: &Clock) {
    loop {
        let first = match engine.flush_due() {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(due) => rx.recv_timeout(due.saturating_duration_since(Instant::now())),
        };
        let first = match first {
            Ok(job) => job,
            Err(RecvTimeoutError::Timeout) => {
                engine.flush();
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        // Group commit: everything that queued up while the previous transaction was being
        // made durable goes into this one.
        let mut batch = vec![first];
        batch.extend(rx.try_iter().take(MAX_BATCH - 1));
        commit_batch(&mut engine, batch, clock.now_ms());
    }
    engine.flush();
}

/// Commits `batch` in one transaction and answers each caller after the commit. If the
/// transaction fails as a whole, each write is retried alone so that one bad write cannot fail
/// its neighbours; but a store locked by another process is no write's fault, and the whole
/// batch gets that (retryable) error at once instead of each write waiting out the lock again.
fn commit_batch<E: FileEngine>(engine: &mut E, mut batch: Vec<Box<dyn Queued>>, now: i64) {
    let outcome = engine.write(&mut |txn| {
        for job in batch.iter_mut() {
            job.apply(txn, now)?;
        }
        Ok(())
    });
    match outcome {
        Ok(()) => batch.into_iter().for_each(|job| job.answer(None)),
        Err(e) if batch.len() == 1 => batch.remove(0).answer(Some(e)),
        Err(StoreError::Locked { path, holder }) => {
            for job in batch {
                let (path, holder) = (path.clone(), holder.clone());
                job.answer(Some(StoreError::Locked { path, holder }));
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, size = batch.len(), "group commit failed; retrying each write alone");
            for job in batch {
                commit_batch(engine, vec![job], now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::logic::ReadTxn;
    use crate::memory::State;
    use crate::TurnCommit;

    /// The in-memory state behind a writer thread, each transaction taking `delay`. A
    /// transaction runs on a copy that replaces the state only if it succeeds.
    struct SlowEngine {
        state: std::sync::Arc<std::sync::Mutex<State>>,
        delay: Duration,
    }

    impl FileEngine for SlowEngine {
        fn write(&mut self, f: &mut dyn FnMut(&mut dyn WriteTxn) -> Result<()>) -> Result<()> {
            std::thread::sleep(self.delay);
            let mut state = self.state.lock().unwrap();
            let mut txn = state.clone();
            f(&mut txn)?;
            *state = txn;
            Ok(())
        }
    }

    /// A write that writes a row and then fails the way a bug of this crate does.
    fn broken(txn: &mut dyn WriteTxn, _now: i64) -> Result<()> {
        txn.put_rows("broken", 0, &[serde_json::json!("half-written")])?;
        Err(StoreError::Internal("a test bug".to_string()))
    }

    /// A first write that keeps the engine busy, so that the writes sent next share one batch.
    async fn keep_busy(
        writer: &std::sync::Arc<Writer>,
    ) -> tokio::task::JoinHandle<Result<crate::CommitOutcome>> {
        let first = tokio::spawn({
            let writer = std::sync::Arc::clone(writer);
            async move { writer.write(commit("first")).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        first
    }

    fn commit(session: &str) -> impl WriteOp<crate::CommitOutcome> {
        let commit = TurnCommit {
            session_id: session.to_string(),
            thread_id: format!("thr-{session}"),
            codex_home: None,
            rows: vec![serde_json::json!({"text": session})],
            fence: None,
            mirror: None,
        };
        move |txn: &mut dyn WriteTxn, now| crate::logic::commit(txn, now, &commit)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_internal_error_fails_its_group_commit_and_commits_nothing_of_its_own() {
        let state = std::sync::Arc::<std::sync::Mutex<State>>::default();
        let engine_state = std::sync::Arc::clone(&state);
        let (writer, ()) = Writer::spawn("test", Clock::system(), move || {
            let delay = Duration::from_millis(30);
            Ok((
                SlowEngine {
                    state: engine_state,
                    delay,
                },
                (),
            ))
        })
        .await
        .unwrap();
        let writer = std::sync::Arc::new(writer);
        let first = keep_busy(&writer).await;
        let (a, broken, b) = tokio::join!(
            writer.write(commit("a")),
            writer.write(broken),
            writer.write(commit("b")),
        );
        first.await.unwrap().unwrap();
        assert!(a.unwrap().is_published());
        assert!(b.unwrap().is_published());
        assert!(matches!(broken, Err(StoreError::Internal(_))), "{broken:?}");
        let mut state = state.lock().unwrap().clone();
        assert!(
            state.load_rows("broken", 0..1).unwrap().is_empty(),
            "the failed write's row was rolled back"
        );
        assert_eq!(state.load("a").unwrap().unwrap().row_count, 1);
    }

    /// An engine whose every write after the first waits, then finds the store locked by
    /// another process (SQLite's busy timeout).
    struct LockedEngine {
        calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl FileEngine for LockedEngine {
        fn write(&mut self, f: &mut dyn FnMut(&mut dyn WriteTxn) -> Result<()>) -> Result<()> {
            let call = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(30));
            if call == 0 {
                return f(&mut State::default());
            }
            Err(StoreError::Locked {
                path: "test".to_string(),
                holder: None,
            })
        }
    }

    /// A lock another process holds is no write's fault: the batch fails with it once, instead
    /// of each of its writes waiting out the lock again alone (a batch of k writes stalled
    /// k + 1 busy timeouts, 5 s each on SQLite, and a lease renewal behind them its TTL).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_locked_store_fails_a_group_commit_once_not_once_per_write() {
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let engine_calls = std::sync::Arc::clone(&calls);
        let (writer, ()) = Writer::spawn("test", Clock::system(), move || {
            Ok((
                LockedEngine {
                    calls: engine_calls,
                },
                (),
            ))
        })
        .await
        .unwrap();
        let writer = std::sync::Arc::new(writer);
        let first = keep_busy(&writer).await;
        let (a, b, c) = tokio::join!(
            writer.write(commit("a")),
            writer.write(commit("b")),
            writer.write(commit("c")),
        );
        first.await.unwrap().unwrap();
        for result in [a, b, c] {
            assert!(
                matches!(result, Err(StoreError::Locked { .. })),
                "{result:?}"
            );
        }
        assert_eq!(
            calls.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "the first write, then the batch once"
        );
    }
}
