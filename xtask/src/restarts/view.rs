//! The harness's read access to a backend's store, between host processes.
//!
//! redb admits one process at a time, so its file is opened for each read and closed before
//! the next host starts; SQLite and PostgreSQL stay open for the whole run.
//!
//! On PostgreSQL a killed host can still change the store after it is dead: a `COMMIT` it had
//! sent is applied by its server backend, which may be slow to run on a loaded machine. Hosts
//! connect under [`host_application_name`], and [`StoreView::wait_for_hosts_gone`] waits until
//! none of their connections is left before the harness reads what a host did.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rethread_store::{open_url, BindingStore, OpenOptions, SessionRecord, TranscriptRow};

/// How long a killed host's PostgreSQL connections may take to go away: far more than a
/// server backend needs to finish a `COMMIT` and notice the closed socket.
const HOSTS_GONE_TIMEOUT: Duration = Duration::from_secs(20);

/// The PostgreSQL `application_name` of the host processes of one run (`tag`: its kind of
/// host): unique to the harness process and the run, so that runs sharing a server (the
/// `chat` and `app-server` runs of one harness included) do not wait for each other.
pub(crate) fn host_application_name(tag: &str) -> String {
    format!("rethread-restarts-{}-{tag}", std::process::id())
}

/// `url` with the hosts' `application_name` added, for a PostgreSQL URL; other URLs unchanged.
pub(crate) fn host_store_url(url: &str, tag: &str) -> String {
    if !url.starts_with("postgres") {
        return url.to_string();
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    format!(
        "{url}{separator}application_name={}",
        host_application_name(tag)
    )
}

/// A store the harness reads.
pub(crate) struct StoreView {
    runtime: tokio::runtime::Runtime,
    url: String,
    /// The `application_name` of the hosts whose connections [`Self::wait_for_hosts_gone`]
    /// waits for.
    hosts: String,
    kind: Kind,
    /// A plain PostgreSQL session for `pg_stat_activity` (PostgreSQL stores only).
    activity: Option<tokio_postgres::Client>,
}

enum Kind {
    Redb(PathBuf),
    Open(BindingStore),
}

/// Where a read went wrong: the store could not be opened, or the read failed.
enum ReadError {
    Open(String),
    Read(String),
}

impl StoreView {
    /// Opens a view of the store at `url` (`redb:PATH`, `sqlite:PATH` or `postgres://...`)
    /// for the hosts of the run tagged `tag` ([`host_store_url`]).
    pub(crate) fn open(url: &str, tag: &str) -> Result<Self, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime: {e}"))?;
        let kind = match url.strip_prefix("redb:") {
            Some(path) => Kind::Redb(PathBuf::from(path)),
            None => Kind::Open(
                runtime
                    .block_on(open_url(url, OpenOptions::default()))
                    .map_err(|e| format!("cannot open the store: {e}"))?,
            ),
        };
        Ok(StoreView {
            runtime,
            url: url.to_string(),
            hosts: host_application_name(tag),
            kind,
            activity: None,
        })
    }

    /// Waits until no host connection is left in the PostgreSQL server, so that a `COMMIT` a
    /// killed host had sent is applied or rolled back before its effects are read. Embedded
    /// stores return at once: a dead process writes nothing more.
    pub(crate) fn wait_for_hosts_gone(&mut self) -> Result<(), String> {
        if !self.url.starts_with("postgres") {
            return Ok(());
        }
        let name = self.hosts.clone();
        let started = Instant::now();
        loop {
            let left = match self.count_host_connections(&name) {
                Ok(left) => left,
                // The session went away (a server restarted by another run): once more, anew.
                Err(_) => {
                    self.activity = None;
                    self.count_host_connections(&name)?
                }
            };
            if left == 0 {
                return Ok(());
            }
            if started.elapsed() > HOSTS_GONE_TIMEOUT {
                return Err(format!(
                    "{left} connection(s) of a dead host still open in PostgreSQL after \
                     {HOSTS_GONE_TIMEOUT:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn count_host_connections(&mut self, name: &str) -> Result<i64, String> {
        if self.activity.is_none() {
            // The store's own query parameters (`schema`) mean nothing to a plain session.
            let base = self.url.split('?').next().unwrap_or(&self.url).to_string();
            let (client, connection) = self
                .runtime
                .block_on(tokio_postgres::connect(&base, tokio_postgres::NoTls))
                .map_err(|e| format!("cannot connect to PostgreSQL for pg_stat_activity: {e}"))?;
            self.runtime.spawn(connection);
            self.activity = Some(client);
        }
        let client = self.activity.as_ref().expect("connected above");
        let row = self
            .runtime
            .block_on(client.query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[&name],
            ))
            .map_err(|e| format!("cannot read pg_stat_activity: {e}"))?;
        Ok(row.get(0))
    }

    /// Whether the store can be read while a host has it open (redb admits one process).
    pub(crate) fn reads_beside_a_host(&self) -> bool {
        !matches!(self.kind, Kind::Redb(_))
    }

    /// The session's record, if it exists.
    pub(crate) fn session(&mut self, id: &str) -> Result<Option<SessionRecord>, String> {
        self.read(|store| async move { store.session(id).await })
    }

    /// All of the session's transcript rows.
    pub(crate) fn rows(&mut self, id: &str) -> Result<Vec<TranscriptRow>, String> {
        self.read(|store| async move { store.all_rows(id).await })
    }

    /// Deletes the session (a PostgreSQL database outlives the run).
    pub(crate) fn delete(&mut self, id: &str) -> Result<(), String> {
        self.read(|store| async move { store.delete_session(id).await.map(|_| ()) })
    }

    /// Runs `op` on the store. A PostgreSQL connection that went away (a server restarted by
    /// another run sharing it) is opened again, once.
    fn read<T, F, Fut>(&mut self, op: F) -> Result<T, String>
    where
        F: Fn(BindingStore) -> Fut,
        Fut: std::future::Future<Output = Result<T, rethread_store::StoreError>>,
    {
        match self.try_read(&op) {
            Ok(value) => Ok(value),
            Err(ReadError::Open(error)) => Err(error),
            Err(ReadError::Read(error)) => {
                let Kind::Open(_) = self.kind else {
                    return Err(error);
                };
                let reopened = self
                    .runtime
                    .block_on(open_url(&self.url, OpenOptions::default()))
                    .map_err(|e| format!("{error}; reopening the store failed: {e}"))?;
                self.kind = Kind::Open(reopened);
                self.try_read(&op).map_err(|e| match e {
                    ReadError::Open(e) | ReadError::Read(e) => e,
                })
            }
        }
    }

    fn try_read<T, F, Fut>(&self, op: &F) -> Result<T, ReadError>
    where
        F: Fn(BindingStore) -> Fut,
        Fut: std::future::Future<Output = Result<T, rethread_store::StoreError>>,
    {
        self.runtime.block_on(async {
            let read = match &self.kind {
                Kind::Open(store) => op(store.clone()).await,
                Kind::Redb(path) => {
                    let store = match open_redb(path).await {
                        Ok(store) => store,
                        Err(e) => {
                            return Err(ReadError::Open(format!("cannot open the store: {e}")))
                        }
                    };
                    let result = op(store.clone()).await;
                    // Closed before the next host starts: redb admits one process at a time.
                    store.close().await;
                    result
                }
            };
            read.map_err(|e| ReadError::Read(format!("store read failed: {e}")))
        })
    }
}

/// How long the view waits for redb's lock on the file after a host exited.
const REDB_LOCK_WAIT: Duration = Duration::from_secs(2);

/// Opens the redb file between two hosts. Rarely (seen about once in a few thousand stops by
/// SIGINT or SIGTERM, never by SIGKILL) the file is still locked for a few milliseconds after
/// the stopped host was reaped; no holder was found in `/proc` by then. The view waits for
/// the lock and says so; a host that found the file locked would exit 75 and fail the run.
async fn open_redb(path: &std::path::Path) -> Result<BindingStore, rethread_store::StoreError> {
    let started = Instant::now();
    let mut waited = false;
    loop {
        match BindingStore::redb(path, OpenOptions::default()).await {
            Err(rethread_store::StoreError::Locked { .. })
                if started.elapsed() < REDB_LOCK_WAIT =>
            {
                waited = true;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Ok(store) if waited => {
                eprintln!(
                    "restarts redb: the store was still locked after the host exited; \
                     opened after {:?}",
                    started.elapsed()
                );
                return Ok(store);
            }
            result => return result,
        }
    }
}
