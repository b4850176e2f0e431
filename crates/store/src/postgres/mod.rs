//! The PostgreSQL backend, for hosts on several machines.
//!
//! The store runs `logic` on live transactions, like the file backends: a pool of the store's
//! own threads, each with a blocking connection (the `postgres` crate), opened on first use
//! and again after it broke. Every write is one transaction that first takes a
//! transaction-scoped advisory lock on the session (`pg_advisory_xact_lock`), so that all
//! writers of one session, in any process on any machine, are serialised, also when the
//! session does not exist yet; writers of different sessions run in parallel. A write runs in
//! `READ COMMITTED`, whatever the server's default, so that it reads what was committed before
//! it got the lock, and its time (`updated_at_ms`, lease expiry) is the server's clock, read
//! under the lock: leases are judged by one clock whichever host asks. A read runs in a
//! read-only `REPEATABLE READ` transaction (one snapshot).
//!
//! Tables live in the URL's `schema` (query parameter, created if missing) or the connection's
//! search path; they are created on open (`schema.rs`).

mod error;
mod sql;
mod txn;

use crate::Unpoisoned;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::str::FromStr;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use postgres::{Client, IsolationLevel, NoTls};
use tokio::sync::oneshot;

use self::error::PgResult;
use self::sql::{Sql, Statements};
use async_trait::async_trait;

use crate::engine::{Answer, Engine, ReadFn, Request, WriteFn};
use crate::{Clock, Durability, OpenOptions, Result, StoreError};

/// How many connections (and threads) a store uses at most.
const POOL_SIZE: usize = 16;

/// How long a write's transaction may sit idle on the server, its session's advisory lock held
/// (`idle_in_transaction_session_timeout`), before the server ends its connection and so
/// releases the lock. Only a host stopped (or cut off) between its lock and its commit gets
/// there; the other hosts' writes of that session wait this long at most, not forever. As long
/// as the default lease TTL: by the time another host may take the session over, the lock is
/// free.
const STALLED_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// The engine of a store in a PostgreSQL database: its pool.
struct Pg {
    pool: Pool,
    /// Opened read-only: every write and lease request is refused before it is sent.
    read_only: bool,
    clock: Clock,
}

impl std::fmt::Debug for Pg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pg")
            .field("url", &self.pool.label)
            .finish_non_exhaustive()
    }
}

/// A job for a pool thread: runs on its connection.
type Job = Box<dyn FnOnce(&mut Conn) + Send>;

/// The store's threads and the channel that feeds them.
struct Pool {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// The URL, password redacted: how errors name this store.
    label: String,
}

/// One pool thread's connection, opened on first use and again after it broke.
struct Conn {
    config: Arc<postgres::Config>,
    sql: Arc<Sql>,
    label: String,
    relaxed: bool,
    /// [`STALLED_WRITE_TIMEOUT`] as the server reads it (`30000ms`).
    stalled_write_timeout: String,
    /// A manual clock given at open, read instead of the server's clock (tests).
    manual_clock: Option<Clock>,
    client: Option<(Client, Statements)>,
}

impl Conn {
    fn client(&mut self) -> Result<(&mut Client, &Statements)> {
        if self.client.as_ref().is_some_and(|(c, _)| c.is_closed()) {
            self.client = None;
        }
        let (client, statements) = match &mut self.client {
            Some(open) => open,
            empty => {
                let mut client = self.config.connect(NoTls).pg(&self.label)?;
                let statements = Statements::prepare(&mut client, &self.sql).pg(&self.label)?;
                empty.insert((client, statements))
            }
        };
        Ok((client, statements))
    }

    /// Runs `op` in one write transaction under the advisory locks of `session_ids`, taken
    /// in order (every writer of several sessions takes them sorted: no deadlock).
    fn write(&mut self, session_ids: &[String], op: &mut WriteFn) -> Result<Answer> {
        let label = self.label.clone();
        let keys: Vec<String> = session_ids.iter().map(|id| self.sql.lock_key(id)).collect();
        let synchronous_commit = if self.relaxed { "off" } else { "on" };
        let stalled_write_timeout = self.stalled_write_timeout.clone();
        let manual_clock = self.manual_clock.clone();
        let (client, sql) = self.client()?;
        // READ COMMITTED whatever the server's or role's default: each statement after the
        // lock then sees what the session's previous writer committed. A snapshot taken at the
        // lock statement's start (repeatable read, serializable) predates the wait, so a fence
        // check would pass on a grant taken over meanwhile.
        let txn = client
            .build_transaction()
            .isolation_level(IsolationLevel::ReadCommitted)
            .start();
        let mut txn = txn.pg(&label)?;
        let mut now = 0;
        for key in &keys {
            let params: [&(dyn postgres::types::ToSql + Sync); 3] =
                [key, &synchronous_commit, &stalled_write_timeout];
            now = txn
                .query_one(&sql.lock, &params)
                .pg(&label)?
                .try_get(1)
                .pg(&label)?;
        }
        let now = manual_clock.map_or(now, |clock| clock.now_ms());
        // An error drops `txn` uncommitted: rolled back, nothing of `op` is written.
        let output = op(&mut txn::view(&mut txn, sql, &label), now)?;
        txn.commit().pg(&label)?;
        Ok(output)
    }

    /// Runs `op` on one read-only snapshot.
    fn read(&mut self, op: &mut ReadFn) -> Result<Answer> {
        let label = self.label.clone();
        let (client, sql) = self.client()?;
        let txn = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start();
        let mut txn = txn.pg(&label)?;
        let output = op(&mut txn::view(&mut txn, sql, &label))?;
        txn.commit().pg(&label)?;
        Ok(output)
    }
}

/// Opens the PostgreSQL engine of [`BindingStore::postgres`](crate::BindingStore::postgres).
pub(crate) async fn open(url: &str, options: OpenOptions) -> Result<impl Engine> {
    Pg::open(url, options, STALLED_WRITE_TIMEOUT).await
}

impl Pg {
    /// Opens the engine of [`BindingStore::postgres`], its stalled writes ended after
    /// `stalled_write` ([`STALLED_WRITE_TIMEOUT`]; shorter in tests).
    async fn open(url: &str, options: OpenOptions, stalled_write: Duration) -> Result<Self> {
        let label = crate::redact_url(url);
        let (pg_url, schema) = crate::open::postgres_parts(url)?;
        let mut config =
            postgres::Config::from_str(&pg_url).map_err(|e| StoreError::UnsupportedUrl {
                url: label.clone(),
                reason: e.to_string(),
            })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        let (config, sql) = (Arc::new(config), Arc::new(Sql::new(schema)));
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::new();
        for i in 0..POOL_SIZE {
            let mut conn = Conn {
                config: Arc::clone(&config),
                sql: Arc::clone(&sql),
                label: label.clone(),
                relaxed: options.durability == Durability::Relaxed,
                stalled_write_timeout: format!("{}ms", stalled_write.as_millis().max(1)),
                manual_clock: options.clock.is_manual().then(|| options.clock.clone()),
                client: None,
            };
            let rx = Arc::clone(&rx);
            let thread = std::thread::Builder::new()
                .name(format!("rethread-postgres-{i}"))
                .spawn(move || loop {
                    let job = rx.lock().unpoisoned().recv();
                    match job {
                        Ok(job) => job(&mut conn),
                        Err(_) => return,
                    }
                })
                .map_err(|source| StoreError::io("postgres pool thread", source))?;
            threads.push(thread);
        }
        let pool = Pool {
            jobs: Mutex::new(Some(tx)),
            threads: Mutex::new(threads),
            label,
        };
        let pg = Pg {
            pool,
            read_only: options.read_only,
            clock: options.clock.clone(),
        };
        let create = options.may_create();
        pg.run(move |conn| conn.ensure_schema(create)).await?;
        Ok(pg)
    }

    /// Finishes the calls under way and closes the connections.
    async fn shut(&self) {
        let pool = &self.pool;
        pool.jobs.lock().unpoisoned().take();
        let threads = std::mem::take(&mut *pool.threads.lock().unpoisoned());
        let _ = tokio::task::spawn_blocking(move || {
            threads.into_iter().for_each(|t| drop(t.join()));
        })
        .await;
    }

    /// Runs `f` on a pool thread's connection and waits for it without blocking the runtime.
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Conn) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let result = catch_unwind(AssertUnwindSafe(|| f(conn))).unwrap_or_else(|_| {
                Err(StoreError::Internal(
                    "a PostgreSQL call panicked".to_string(),
                ))
            });
            let _ = tx.send(result);
        });
        {
            let jobs = self.pool.jobs.lock().unpoisoned();
            let sender = jobs.as_ref().ok_or(StoreError::Closed)?;
            sender.send(job).map_err(|_| StoreError::Closed)?;
        }
        rx.await.map_err(|_| StoreError::Closed)?
    }
}

#[async_trait]
impl Engine for Pg {
    async fn read(&self, _: Request<'_>, mut op: ReadFn) -> Result<Answer> {
        self.run(move |conn| conn.read(&mut op)).await
    }

    async fn write(&self, request: Request<'_>, mut op: WriteFn) -> Result<Answer> {
        if self.read_only {
            return Err(StoreError::opened_read_only(&self.pool.label));
        }
        let mut session_ids = request.sessions.to_vec();
        session_ids.sort_unstable();
        session_ids.dedup();
        self.run(move |conn| conn.write(&session_ids, &mut op))
            .await
    }

    fn clock(&self) -> Clock {
        self.clock.clone()
    }

    async fn close(&self) {
        self.shut().await;
    }
}

#[cfg(test)]
mod tests {
    // The PostgreSQL backend's guards that need a write stopped inside its transaction, against
    // the test server (skipped without one, as `tests/postgres.rs` is).

    use std::sync::mpsc;
    use std::time::Duration;

    use serde_json::json;

    use super::Pg;
    use crate::engine::{Answer, Engine, Request, WriteFn};
    use crate::logic::WriteTxn;
    use crate::{BindingStore, OpenOptions, SessionRecord, TurnCommit};

    /// A write stalled under its session's lock loses its transaction once it sat idle past the
    /// timeout, and the lock with it: another host's write of the session goes through instead of
    /// waiting for ever. The stalled write then fails, writes nothing, and its store goes on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_stalled_under_its_lock_frees_the_lock_after_the_timeout() {
        let Some(url) = rethread_testkit::postgres::fresh_url("stalled_write") else {
            return;
        };
        let stalled = Pg::open(&url, OpenOptions::new(), Duration::from_millis(300));
        let stalled = std::sync::Arc::new(stalled.await.unwrap());
        let other = BindingStore::postgres(&url, OpenOptions::new())
            .await
            .unwrap();
        let (locked, is_locked) = mpsc::channel();
        let (go_on, gone_on) = mpsc::channel();
        let write = {
            let pg = std::sync::Arc::clone(&stalled);
            // Holding its session's lock, it stops until told to go on: a host stopped (or cut
            // off) between its lock and its commit.
            let op: WriteFn = Box::new(move |txn: &mut dyn WriteTxn, now| {
                let _ = locked.send(());
                let _ = gone_on.recv();
                txn.put(&SessionRecord::new("s", now))?;
                Ok(Box::new(()) as Answer)
            });
            let sessions = ["s".to_string()];
            tokio::spawn(async move { pg.write(Request::of("commit_turn", &sessions), op).await })
        };
        tokio::task::spawn_blocking(move || is_locked.recv())
            .await
            .unwrap()
            .unwrap();
        let commit = TurnCommit::new("s", "t", vec![json!(1)]);
        let waited = tokio::time::timeout(Duration::from_secs(20), other.commit_turn(commit)).await;
        go_on.send(()).unwrap();
        let committed = waited.expect("the other host's write still waits for the stalled lock");
        assert_eq!(committed.unwrap().row_count(), 1);
        let stalled_write = write.await.unwrap();
        assert!(stalled_write.is_err(), "{stalled_write:?}");
        assert_eq!(other.require_session("s").await.unwrap().row_count, 1);
        let stalled = BindingStore::shared(stalled);
        let again = stalled.commit_turn(TurnCommit::new("s", "t", vec![json!(2)]));
        assert_eq!(again.await.unwrap().row_count(), 2);
    }
}
