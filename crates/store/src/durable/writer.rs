//! The writer thread shared by the durable backends: one thread per store, fed by a channel of
//! commands with oneshot replies. This is also where group commit lives.
//!
//! Architecture invariant: no engine call runs on an async runtime thread. Writes run here;
//! reads run in `spawn_blocking`.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::logic::{now_ms, LeaseTxn, ReadTxn, WriteOp, WriteTxn};
use crate::{SessionRecord, StoreError, TranscriptRow};

/// A storage engine as seen by the writer thread.
pub(crate) trait Engine: Send + 'static {
    /// Runs `f` in one write transaction and commits it (durably, unless relaxed) if `f`
    /// returns `Ok`; rolls it back otherwise. `f`'s second argument tells whether anyone else
    /// (another process) may have written since this engine's previous transaction, in which
    /// case the writer forgets the session records it cached.
    fn write(
        &mut self,
        f: &mut dyn FnMut(&mut dyn WriteTxn, bool) -> Result<(), StoreError>,
    ) -> Result<(), StoreError>;

    /// When the engine wants [`Engine::flush`] called if no write comes first (a relaxed
    /// engine with commits not yet durable); `None`: never.
    fn flush_due(&self) -> Option<Instant> {
        None
    }

    /// Makes every commit so far durable. Called when [`Engine::flush_due`] has passed with
    /// no write in between.
    fn flush(&mut self) {}

    /// Called once when the writer stops, before the engine is dropped.
    fn shutdown(&mut self) {}
}

/// A queued write of any type: it runs its operation in a transaction (keeping the result)
/// and answers its caller once the transaction's fate is known.
trait Queued: Send + std::fmt::Debug {
    /// Runs the write in `txn`. A logical refusal is kept as the result and the transaction
    /// goes on (the refused write wrote nothing); any other error fails the transaction.
    fn apply(&mut self, txn: &mut dyn WriteTxn, now: i64) -> Result<(), StoreError>;
    /// Answers the caller with the kept result (the transaction committed).
    fn answer(self: Box<Self>);
    /// Answers the caller with `error` (the transaction failed).
    fn fail(self: Box<Self>, error: StoreError);
}

/// One write and the caller waiting for its typed result.
#[derive(Debug)]
struct Job<O: WriteOp> {
    op: O,
    result: Option<Result<O::Output, StoreError>>,
    reply: oneshot::Sender<Result<O::Output, StoreError>>,
}

impl<O: WriteOp> Queued for Job<O> {
    fn apply(&mut self, txn: &mut dyn WriteTxn, now: i64) -> Result<(), StoreError> {
        match self.op.apply(txn, now) {
            Ok(output) => self.result = Some(Ok(output)),
            // A logical refusal wrote nothing (see `logic`), so the others may commit.
            Err(e) if e.is_logical() => self.result = Some(Err(e)),
            Err(e) => return Err(e),
        }
        Ok(())
    }

    fn answer(self: Box<Self>) {
        let result = self.result.unwrap_or_else(|| {
            Err(StoreError::Internal(
                "a write was answered before it ran".to_string(),
            ))
        });
        let _ = self.reply.send(result);
    }

    fn fail(self: Box<Self>, error: StoreError) {
        let _ = self.reply.send(Err(error));
    }
}

enum Msg {
    Write(Box<dyn Queued>),
    Close(oneshot::Sender<()>),
}

/// The async side of a writer thread.
///
/// Dropping it closes the channel and waits for the thread to finish the queued writes and
/// close the engine (a relaxed engine makes its commits durable then), so a process that
/// drops its store and exits leaves a closed, complete file. `close` is the async way.
#[derive(Debug)]
pub(crate) struct Writer {
    tx: mpsc::Sender<Msg>,
    /// The writer thread, joined on drop.
    thread: Option<std::thread::JoinHandle<()>>,
    /// Writes sent and not yet answered (for the lone-write spin).
    in_flight: Arc<AtomicUsize>,
    /// How long a lone write polls for its reply before it parks (`OpenOptions::lone_write_spin`).
    lone_write_spin: Duration,
    /// When polling does not pay: see [`SpinBackoff`].
    backoff: SpinBackoff,
}

/// Turns the lone-write poll off while it does not pay. A poll that ends without its reply
/// (the commit took longer than the window: a slow disk, or CPUs so busy that the poll itself
/// keeps the writer thread waiting for a CPU) makes the next `penalty` lone writes park at
/// once, and doubles the penalty (up to 1024); a poll that gets its reply halves it. So on a
/// busy machine the poll costs about one window in a thousand writes instead of slowing each.
#[derive(Debug, Default)]
struct SpinBackoff {
    /// Lone writes still to park without polling.
    skip: AtomicUsize,
    /// The skip set after the next failed poll.
    penalty: AtomicUsize,
}

impl SpinBackoff {
    const MAX_PENALTY: usize = 1024;

    /// Whether this lone write may poll (and, if not, one fewer will be skipped).
    fn may_poll(&self) -> bool {
        self.skip
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_err()
    }

    fn record(&self, answered: bool) {
        if answered {
            // Halved, not cleared: on a machine where some polls pay and most do not, the
            // penalty still grows.
            let _ = self
                .penalty
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| Some(p / 2));
            return;
        }
        let penalty = self.penalty.load(Ordering::Acquire).max(1);
        self.skip.store(penalty, Ordering::Release);
        self.penalty
            .store((penalty * 2).min(Self::MAX_PENALTY), Ordering::Release);
    }
}

/// Counts a write as in flight until dropped (also when the caller's future is dropped).
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Msg::Write(job) => f.debug_tuple("Write").field(job).finish(),
            Msg::Close(_) => f.write_str("Close"),
        }
    }
}

impl Writer {
    /// Starts the writer thread, runs `open` on it (opening never blocks the runtime), and
    /// returns once the engine is open. `open` also returns what the readers need.
    pub(crate) async fn spawn<E, R, F>(
        name: &str,
        max_batch: usize,
        lone_write_spin: Duration,
        open: F,
    ) -> Result<(Writer, R), StoreError>
    where
        E: Engine,
        R: Send + 'static,
        F: FnOnce() -> Result<(E, R), StoreError> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel::<Msg>(4096);
        let (opened_tx, opened_rx) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("rethread-{name}-writer"))
            .spawn(move || match open() {
                Ok((engine, readers)) => {
                    if opened_tx.send(Ok(readers)).is_ok() {
                        run(engine, rx, max_batch);
                    }
                }
                Err(e) => {
                    let _ = opened_tx.send(Err(e));
                }
            })
            .map_err(|source| StoreError::Io {
                path: format!("{name} writer thread"),
                source,
            })?;
        let readers = opened_rx.await.map_err(|_| StoreError::Closed)??;
        let writer = Writer {
            tx,
            thread: Some(thread),
            in_flight: Arc::default(),
            lone_write_spin,
            backoff: SpinBackoff::default(),
        };
        Ok((writer, readers))
    }

    /// Queues one write and waits until it is committed (and durable) or refused.
    ///
    /// A write with no other write of this store in flight first polls for its reply, yielding
    /// to the runtime between polls, for up to `lone_write_spin`; then (and at once when other
    /// writes are in flight) it parks. Waking a parked runtime thread from the writer thread
    /// costs a cross-CPU interrupt, on a virtual machine tens of microseconds: a tenth of a
    /// commit. Polling keeps that off a lone writer's latency at the price of one runtime
    /// thread's time for the length of one commit; the runtime is never blocked (every poll
    /// yields), and concurrent writers, which group commit serves, never poll. Where polling
    /// does not pay (a slow disk, or busy CPUs: the poll would compete with the writer thread
    /// for a CPU), [`SpinBackoff`] turns it off.
    pub(crate) async fn write<O: WriteOp>(&self, op: O) -> Result<O::Output, StoreError> {
        let alone = self.in_flight.fetch_add(1, Ordering::AcqRel) == 0;
        let _in_flight = InFlight(&self.in_flight);
        let (reply, mut reply_rx) = oneshot::channel();
        let job = Job {
            op,
            result: None,
            reply,
        };
        self.tx
            .send(Msg::Write(Box::new(job)))
            .await
            .map_err(|_| StoreError::Closed)?;
        if alone && !self.lone_write_spin.is_zero() && self.backoff.may_poll() {
            let deadline = Instant::now() + self.lone_write_spin;
            loop {
                match reply_rx.try_recv() {
                    Ok(reply) => {
                        self.backoff.record(true);
                        return reply;
                    }
                    Err(oneshot::error::TryRecvError::Closed) => return Err(StoreError::Closed),
                    Err(oneshot::error::TryRecvError::Empty) => {}
                }
                if Instant::now() >= deadline {
                    self.backoff.record(false);
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        reply_rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Asks the writer to finish queued writes, close the engine and stop; waits for it.
    pub(crate) async fn close(&self) {
        let (done_tx, done_rx) = oneshot::channel();
        if self.tx.send(Msg::Close(done_tx)).await.is_ok() {
            let _ = done_rx.await;
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        // Closing the channel stops the thread once it has committed what is queued. The wait
        // is one commit and the engine's close (after `close`, nothing).
        let (tx, _) = mpsc::channel(1);
        drop(std::mem::replace(&mut self.tx, tx));
        if thread.thread().id() != std::thread::current().id() {
            let _ = thread.join();
        }
    }
}

fn run<E: Engine>(mut engine: E, mut rx: mpsc::Receiver<Msg>, max_batch: usize) {
    let mut cache = HashMap::new();
    let mut batch: Vec<Box<dyn Queued>> = Vec::new();
    loop {
        let first = match next_message(&mut rx, engine.flush_due()) {
            Next::Message(message) => message,
            Next::FlushDue => {
                engine.flush();
                continue;
            }
            Next::Closed => break,
        };
        let mut close = None;
        match first {
            Msg::Write(job) => batch.push(job),
            Msg::Close(done) => close = Some(done),
        }
        // Group commit: everything that queued up while the previous transaction was being
        // made durable goes into this one.
        while close.is_none() && batch.len() < max_batch {
            match rx.try_recv() {
                Ok(Msg::Write(job)) => batch.push(job),
                Ok(Msg::Close(done)) => close = Some(done),
                Err(_) => break,
            }
        }
        if !batch.is_empty() {
            commit_batch(&mut engine, &mut cache, std::mem::take(&mut batch));
        }
        if let Some(done) = close {
            engine.shutdown();
            drop(engine);
            let _ = done.send(());
            return;
        }
    }
    engine.shutdown();
}

/// How long the writer polls for the next write before it parks. A caller that commits turn
/// after turn sends its next write a few microseconds after its reply; catching it without a
/// park/unpark round trip keeps the one-session path close to the engine's raw speed. The
/// poll yields the CPU between tries, so an idle store costs nothing past this window.
const POLL_BEFORE_PARK: Duration = Duration::from_micros(50);

/// What the writer thread waits for next.
enum Next {
    Message(Msg),
    /// The engine's flush is due and nothing came.
    FlushDue,
    /// Every sender is gone.
    Closed,
}

fn next_message(rx: &mut mpsc::Receiver<Msg>, flush_due: Option<Instant>) -> Next {
    let start = Instant::now();
    loop {
        match rx.try_recv() {
            Ok(msg) => return Next::Message(msg),
            Err(mpsc::error::TryRecvError::Disconnected) => return Next::Closed,
            Err(mpsc::error::TryRecvError::Empty) => {}
        }
        if start.elapsed() >= POLL_BEFORE_PARK {
            return match flush_due {
                None => rx.blocking_recv().map_or(Next::Closed, Next::Message),
                Some(due) => recv_until(rx, due),
            };
        }
        std::thread::yield_now();
    }
}

/// Wakes the writer thread when its channel has a message.
struct ThreadWaker(std::thread::Thread);

impl std::task::Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Waits for a message until `deadline` (tokio's receiver has no blocking wait with a
/// timeout: poll it with a waker that unparks this thread, and park until the deadline).
fn recv_until(rx: &mut mpsc::Receiver<Msg>, deadline: Instant) -> Next {
    let waker = std::task::Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    loop {
        match rx.poll_recv(&mut cx) {
            std::task::Poll::Ready(Some(msg)) => return Next::Message(msg),
            std::task::Poll::Ready(None) => return Next::Closed,
            std::task::Poll::Pending => {}
        }
        let now = Instant::now();
        if now >= deadline {
            return Next::FlushDue;
        }
        std::thread::park_timeout(deadline - now);
    }
}

/// Commits `batch` in one transaction and answers each caller after the commit. If the
/// transaction fails as a whole, each write is retried alone so that one bad write cannot fail
/// its neighbours.
fn commit_batch<E: Engine>(engine: &mut E, cache: &mut Cache, mut batch: Vec<Box<dyn Queued>>) {
    let now = now_ms();
    let mut pending: Cache = HashMap::new();
    let outcome = engine.write(&mut |txn, others_wrote| {
        pending.clear();
        if others_wrote || cache.len() > CACHE_LIMIT {
            cache.clear();
        }
        let mut txn = Cached {
            inner: txn,
            cache,
            pending: &mut pending,
        };
        for job in batch.iter_mut() {
            job.apply(&mut txn, now)?;
        }
        Ok(())
    });
    if outcome.is_ok() {
        cache.extend(pending);
    } else {
        // The transaction's fate is what the engine said, but a failed commit may still have
        // reached the disk: trust nothing cached.
        cache.clear();
    }
    match outcome {
        Ok(()) => batch.into_iter().for_each(|job| job.answer()),
        Err(e) if batch.len() == 1 => {
            if let Some(job) = batch.pop() {
                job.fail(e);
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, size = batch.len(), "group commit failed; retrying each write alone");
            for job in batch {
                commit_batch(engine, cache, vec![job]);
            }
        }
    }
}

/// Session records as of this writer's last commit, keyed by session id (`None`: absent).
///
/// Every write loads the session it changes; on the one-session path that read (a lookup plus
/// a JSON decode) is a measurable share of a commit. Only this thread writes through this
/// engine, so what it committed last is what the file holds, unless another process wrote in
/// between, which the engine reports (SQLite `PRAGMA data_version`; redb files are exclusive).
type Cache = HashMap<String, Option<SessionRecord>>;

/// Past this many cached sessions the cache starts over (it is a latency aid, not a mirror).
const CACHE_LIMIT: usize = 4096;

/// A write transaction seen through the cache: loads hit the cache or record what they read;
/// writes go through and are remembered, to join the cache only if the commit succeeds.
struct Cached<'a> {
    inner: &'a mut dyn WriteTxn,
    cache: &'a Cache,
    pending: &'a mut Cache,
}

impl ReadTxn for Cached<'_> {
    fn label(&self) -> &str {
        self.inner.label()
    }

    fn load(&mut self, session_id: &str) -> Result<Option<SessionRecord>, StoreError> {
        if let Some(record) = self
            .pending
            .get(session_id)
            .or_else(|| self.cache.get(session_id))
        {
            return Ok(record.clone());
        }
        let record = self.inner.load(session_id)?;
        self.pending.insert(session_id.to_string(), record.clone());
        Ok(record)
    }

    fn load_rows(
        &mut self,
        session_id: &str,
        range: Range<u64>,
    ) -> Result<Vec<TranscriptRow>, StoreError> {
        self.inner.load_rows(session_id, range)
    }

    fn list(
        &mut self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        self.inner.list(after, limit)
    }

    fn has_rows(&mut self, session_id: &str) -> Result<bool, StoreError> {
        self.inner.has_rows(session_id)
    }

    fn row_ends(&mut self) -> Result<Vec<(String, bool)>, StoreError> {
        self.inner.row_ends()
    }
}

impl WriteTxn for Cached<'_> {
    fn put(&mut self, record: &SessionRecord) -> Result<(), StoreError> {
        self.inner.put(record)?;
        self.pending
            .insert(record.session_id.clone(), Some(record.clone()));
        Ok(())
    }

    fn put_row(&mut self, session_id: &str, seq: u64, body: &Value) -> Result<(), StoreError> {
        self.inner.put_row(session_id, seq, body)
    }

    fn remove(&mut self, session_id: &str) -> Result<bool, StoreError> {
        let existed = self.inner.remove(session_id)?;
        self.pending.insert(session_id.to_string(), None);
        Ok(existed)
    }

    fn leases(&mut self) -> Option<&mut dyn LeaseTxn> {
        self.inner.leases()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logic::Commit;
    use crate::memory::State;
    use crate::{CommitOutcome, TurnCommit};

    /// The in-memory state behind a writer thread, each transaction taking `delay`. A
    /// transaction runs on a copy that replaces the state only if it succeeds.
    struct SlowEngine {
        state: std::sync::Arc<std::sync::Mutex<State>>,
        delay: Duration,
    }

    impl Engine for SlowEngine {
        fn write(
            &mut self,
            f: &mut dyn FnMut(&mut dyn WriteTxn, bool) -> Result<(), StoreError>,
        ) -> Result<(), StoreError> {
            std::thread::sleep(self.delay);
            let mut state = self.state.lock().unwrap();
            let mut txn = state.clone();
            f(&mut txn, false)?;
            *state = txn;
            Ok(())
        }
    }

    async fn writer_with_state(
        delay: Duration,
        spin: Duration,
    ) -> (Writer, std::sync::Arc<std::sync::Mutex<State>>) {
        let state = std::sync::Arc::default();
        let engine_state = std::sync::Arc::clone(&state);
        let (writer, ()) = Writer::spawn("test", 16, spin, move || {
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
        (writer, state)
    }

    async fn writer(delay: Duration, spin: Duration) -> Writer {
        writer_with_state(delay, spin).await.0
    }

    /// A write that writes a row and then fails the way a bug of this crate does.
    #[derive(Debug)]
    struct Broken;

    impl WriteOp for Broken {
        type Output = ();
        fn session_id(&self) -> &str {
            "broken"
        }
        fn needs(&self) -> crate::logic::Needs<'_> {
            crate::logic::Needs::default()
        }
        fn apply(&self, txn: &mut dyn WriteTxn, _now: i64) -> Result<(), StoreError> {
            txn.put_row("broken", 0, &serde_json::json!("half-written"))?;
            Err(StoreError::Internal("a test bug".to_string()))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_internal_error_fails_its_group_commit_and_commits_nothing_of_its_own() {
        let (writer, state) = writer_with_state(Duration::from_millis(30), Duration::ZERO).await;
        let writer = std::sync::Arc::new(writer);
        // The first write keeps the engine busy so that the next three share one batch.
        let first = tokio::spawn({
            let writer = std::sync::Arc::clone(&writer);
            async move { writer.write(commit("first")).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let (a, broken, b) = tokio::join!(
            writer.write(commit("a")),
            writer.write(Broken),
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

    fn commit(session: &str) -> Commit {
        Commit(TurnCommit {
            session_id: session.to_string(),
            thread_id: "thr".to_string(),
            codex_home: None,
            rows: vec![serde_json::json!({"text": session})],
            fence: None,
        })
    }

    fn in_flight(writer: &Writer) -> usize {
        writer.in_flight.load(Ordering::Acquire)
    }

    #[tokio::test]
    async fn a_lone_write_slower_than_its_spin_parks_and_gets_its_reply() {
        let writer = writer(Duration::from_millis(30), Duration::from_millis(1)).await;
        let reply = writer.write(commit("a")).await.unwrap();
        assert!(
            matches!(reply, CommitOutcome::Published { first_seq: 0, .. }),
            "{reply:?}"
        );
        assert_eq!(in_flight(&writer), 0);
        writer.close().await;
    }

    #[tokio::test]
    async fn a_write_cancelled_while_it_polls_leaves_no_count_behind() {
        let writer = writer(Duration::from_millis(50), Duration::from_millis(20)).await;
        let cancelled = tokio::time::timeout(Duration::from_millis(5), writer.write(commit("a")));
        assert!(
            cancelled.await.is_err(),
            "the write should still be running"
        );
        assert_eq!(in_flight(&writer), 0);
        // The cancelled write still commits (it was queued); the next one is alone again.
        let reply = writer.write(commit("a")).await.unwrap();
        assert!(
            matches!(reply, CommitOutcome::Published { first_seq: 1, .. }),
            "{reply:?}"
        );
        writer.close().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writes_all_get_their_replies() {
        let writer =
            std::sync::Arc::new(writer(Duration::from_millis(5), Duration::from_millis(1)).await);
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let writer = std::sync::Arc::clone(&writer);
                tokio::spawn(async move { writer.write(commit(&format!("s{i}"))).await })
            })
            .collect();
        for task in tasks {
            let reply = task.await.unwrap().unwrap();
            assert!(
                matches!(reply, CommitOutcome::Published { first_seq: 0, .. }),
                "{reply:?}"
            );
        }
        assert_eq!(in_flight(&writer), 0);
    }

    #[test]
    fn the_poll_backs_off_while_it_does_not_pay() {
        let backoff = SpinBackoff::default();
        assert!(backoff.may_poll());
        // Each failed poll parks the next `penalty` lone writes, doubling the penalty.
        for penalty in [1, 2, 4, 8] {
            backoff.record(false);
            for _ in 0..penalty {
                assert!(!backoff.may_poll());
            }
            assert!(backoff.may_poll());
        }
        // Successes halve the penalty (16 -> 8 -> 4): the next failure parks 4 writes.
        backoff.record(true);
        backoff.record(true);
        backoff.record(false);
        assert_eq!((0..10).filter(|_| !backoff.may_poll()).count(), 4);
        // It never grows past the cap.
        for _ in 0..20 {
            backoff.record(false);
        }
        assert_eq!(
            backoff.skip.load(Ordering::Acquire),
            SpinBackoff::MAX_PENALTY
        );
    }

    #[tokio::test]
    async fn with_the_spin_disabled_a_write_parks_at_once_and_gets_its_reply() {
        let writer = writer(Duration::ZERO, Duration::ZERO).await;
        for seq in 0..3 {
            let reply = writer.write(commit("a")).await.unwrap();
            assert!(reply.first_seq() == seq, "{reply:?}");
        }
        writer.close().await;
    }
}
