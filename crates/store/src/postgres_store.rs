//! The PostgreSQL backend: tokio-postgres with a deadpool pool, for hosts on several machines.
//!
//! Every write is one transaction on a pooled connection that first takes a transaction-scoped
//! advisory lock on the session (`pg_advisory_xact_lock`), so that all writers of one session,
//! in any process on any machine, are serialised, also when the session does not exist yet;
//! writers of different sessions run in parallel. Under the lock it reads what the operation
//! needs (the session record; its rows for an import; its lease for a lease request) into a
//! buffered view, runs the shared rules of `logic.rs` on it, and writes back what they wrote.
//! The time of a write (`updated_at_ms`, lease expiry) is the database server's clock, read
//! under the lock, so leases are judged by one clock whichever host asks.
//!
//! Reads use single statements, and `export_session` a read-only `REPEATABLE READ`
//! transaction (one snapshot). Tables live in the URL's `schema` (query parameter, created if
//! missing) or the connection's search path; they are created or migrated on open.

use std::collections::HashMap;
use std::ops::Range;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use serde_json::{Map, Value};
use tokio_postgres::{IsolationLevel, NoTls, Row};

use crate::logic::{
    self, apply, apply_lease, check_record, expect_reply, lease_of, released_of, ttl_ms, LeaseOp,
    LeaseTxn, ReadTxn, Reply, WriteOp, WriteTxn,
};
use crate::{
    Binding, CommitOutcome, Durability, Fence, ImportOutcome, Lease, LeaseOwner, OpenOptions,
    ProcessIdentity, SessionExport, SessionPage, SessionRecord, StoreError, TranscriptRow,
    TurnCommit, SCHEMA_VERSION,
};

/// The advisory lock key that serialises schema creation and migration (`"rthd"`).
const MIGRATION_LOCK: i64 = 0x7274_6864;

/// A [`BindingStore`](crate::BindingStore) in a PostgreSQL database.
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    sql: Arc<Sql>,
    label: String,
    relaxed: bool,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", &self.label)
            .finish_non_exhaustive()
    }
}

/// The statements, qualified with the store's schema.
#[derive(Debug)]
struct Sql {
    schema: Option<String>,
    lock: String,
    load: String,
    list_all: String,
    list_after: String,
    rows: String,
    put: String,
    put_rows: String,
    remove_rows: String,
    remove: String,
    load_lease: String,
    put_lease: String,
}

const RECORD_COLUMNS: &str = "session_id, model_config, binding_thread_id, binding_codex_home, \
     bound_at_ms, row_count, retired_threads, created_at_ms, updated_at_ms";

impl Sql {
    fn new(schema: Option<String>) -> Sql {
        let p = match &schema {
            Some(s) => format!("{}.", quote_ident(s)),
            None => String::new(),
        };
        Sql {
            // One round trip: the session's lock, the server's clock, and this transaction's
            // `synchronous_commit` ($2: `on` for `Durable`, whatever the server's default,
            // `off` for `Relaxed`).
            lock: "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))::text IS NULL, \
                   (extract(epoch FROM clock_timestamp()) * 1000)::int8, \
                   set_config('synchronous_commit', $2, true)"
                .to_string(),
            load: format!("SELECT {RECORD_COLUMNS} FROM {p}sessions WHERE session_id = $1"),
            list_all: format!(
                "SELECT {RECORD_COLUMNS} FROM {p}sessions ORDER BY session_id COLLATE \"C\" LIMIT $1"
            ),
            list_after: format!(
                "SELECT {RECORD_COLUMNS} FROM {p}sessions WHERE session_id COLLATE \"C\" > $1 \
                 ORDER BY session_id COLLATE \"C\" LIMIT $2"
            ),
            rows: format!(
                "SELECT seq, body FROM {p}transcript_rows \
                 WHERE session_id = $1 AND seq >= $2 AND seq < $3 ORDER BY seq"
            ),
            put: format!(
                "INSERT INTO {p}sessions ({RECORD_COLUMNS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
                 ON CONFLICT (session_id) DO UPDATE SET model_config = excluded.model_config, \
                 binding_thread_id = excluded.binding_thread_id, \
                 binding_codex_home = excluded.binding_codex_home, \
                 bound_at_ms = excluded.bound_at_ms, row_count = excluded.row_count, \
                 retired_threads = excluded.retired_threads, \
                 created_at_ms = excluded.created_at_ms, updated_at_ms = excluded.updated_at_ms"
            ),
            // A plain INSERT: rows are append-only; a duplicate key fails loudly.
            put_rows: format!(
                "INSERT INTO {p}transcript_rows (session_id, seq, body) \
                 SELECT $1, s, b FROM unnest($2::int8[], $3::text[]) AS t(s, b)"
            ),
            remove_rows: format!("DELETE FROM {p}transcript_rows WHERE session_id = $1"),
            remove: format!("DELETE FROM {p}sessions WHERE session_id = $1"),
            load_lease: format!(
                "SELECT host, pid, started_at_ms, instance, acquired_at_ms, expires_at_ms, fence, \
                 process_space, process_start FROM {p}leases WHERE session_id = $1"
            ),
            put_lease: format!(
                "INSERT INTO {p}leases (session_id, host, pid, started_at_ms, instance, \
                 acquired_at_ms, expires_at_ms, fence, process_space, process_start) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
                 ON CONFLICT (session_id) DO UPDATE SET host = excluded.host, pid = excluded.pid, \
                 started_at_ms = excluded.started_at_ms, instance = excluded.instance, \
                 acquired_at_ms = excluded.acquired_at_ms, expires_at_ms = excluded.expires_at_ms, \
                 fence = excluded.fence, process_space = excluded.process_space, \
                 process_start = excluded.process_start"
            ),
            schema,
        }
    }

    fn prefix(&self) -> String {
        match &self.schema {
            Some(s) => format!("{}.", quote_ident(s)),
            None => String::new(),
        }
    }

    /// The advisory lock key of a session: distinct per schema, so stores in different
    /// schemas of one database do not wait for each other.
    fn lock_key(&self, session_id: &str) -> String {
        format!("{}/{session_id}", self.schema.as_deref().unwrap_or(""))
    }
}

fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// Schema 1 (the PostgreSQL backend starts with leases).
fn schema_v1(p: &str) -> String {
    format!(
        "CREATE TABLE {p}sessions (
            session_id TEXT PRIMARY KEY NOT NULL,
            model_config TEXT NOT NULL,
            binding_thread_id TEXT,
            binding_codex_home TEXT,
            bound_at_ms BIGINT,
            row_count BIGINT NOT NULL,
            retired_threads TEXT NOT NULL,
            created_at_ms BIGINT NOT NULL,
            updated_at_ms BIGINT NOT NULL
        );
        CREATE TABLE {p}transcript_rows (
            session_id TEXT NOT NULL,
            seq BIGINT NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (session_id, seq)
        );
        CREATE TABLE {p}leases (
            session_id TEXT PRIMARY KEY NOT NULL,
            host TEXT NOT NULL,
            pid BIGINT NOT NULL,
            started_at_ms BIGINT NOT NULL,
            instance BIGINT NOT NULL,
            acquired_at_ms BIGINT NOT NULL,
            expires_at_ms BIGINT NOT NULL,
            fence BIGINT NOT NULL
        );"
    )
}

/// Maps every tokio-postgres error to a [`StoreError`]. The one place its errors are
/// interpreted.
pub(crate) fn map_postgres_error(label: &str, error: tokio_postgres::Error) -> StoreError {
    use tokio_postgres::error::SqlState;
    if error.is_closed() {
        return StoreError::Closed;
    }
    if let Some(code) = error.code() {
        if *code == SqlState::LOCK_NOT_AVAILABLE
            || *code == SqlState::T_R_SERIALIZATION_FAILURE
            || *code == SqlState::T_R_DEADLOCK_DETECTED
        {
            return StoreError::Locked {
                path: label.to_string(),
            };
        }
    }
    StoreError::Backend {
        backend: "postgres",
        source: Box::new(error),
    }
}

fn map_pool_error(label: &str, error: deadpool_postgres::PoolError) -> StoreError {
    match error {
        deadpool_postgres::PoolError::Backend(e) => map_postgres_error(label, e),
        deadpool_postgres::PoolError::Closed => StoreError::Closed,
        other => StoreError::Backend {
            backend: "postgres",
            source: format!("connection pool ({label}): {other}").into(),
        },
    }
}

/// Splits `schema=NAME` off the URL's query string (it is ours, not libpq's).
fn split_schema(url: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), None);
    };
    let mut schema = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.strip_prefix("schema=") {
            Some(name) => {
                schema = Some(name.to_string());
                false
            }
            None => !pair.is_empty(),
        })
        .collect();
    let url = if rest.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    (url, schema)
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user@host:port/db`, libpq-style parameters; plus
    /// `schema=NAME` to keep the tables in that schema, created if missing), creating or
    /// migrating the tables.
    ///
    /// Errors: [`StoreError::NewerSchema`] for tables of a newer rethread,
    /// [`StoreError::Corrupt`] for a schema that holds foreign tables of the same names,
    /// [`StoreError::Backend`] when the server cannot be reached. No TLS: use it on loopback
    /// or a private network.
    pub async fn open(url: &str, options: OpenOptions) -> Result<Self, StoreError> {
        let label = crate::redact_url(url);
        let (pg_url, schema) = split_schema(url);
        let mut config =
            tokio_postgres::Config::from_str(&pg_url).map_err(|e| StoreError::UnsupportedUrl {
                url: label.clone(),
                reason: e.to_string(),
            })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.max_batch.clamp(1, 16))
            .build()
            .map_err(|e| StoreError::Backend {
                backend: "postgres",
                source: Box::new(e),
            })?;
        let store = PostgresStore {
            pool,
            sql: Arc::new(Sql::new(schema)),
            label,
            relaxed: options.durability == Durability::Relaxed,
        };
        store.migrate().await?;
        Ok(store)
    }

    /// The URL (without password) this store was opened with.
    pub fn url(&self) -> &str {
        &self.label
    }

    /// Closes the pool's connections.
    pub async fn close(self) {
        self.pool.close();
    }

    fn map(&self, e: tokio_postgres::Error) -> StoreError {
        map_postgres_error(&self.label, e)
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.pool
            .get()
            .await
            .map_err(|e| map_pool_error(&self.label, e))
    }

    /// Creates the tables of a new store, migrates an older one, refuses a newer or foreign
    /// one; serialised across processes by an advisory lock.
    async fn migrate(&self) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let txn = client.transaction().await.map_err(|e| self.map(e))?;
        txn.execute("SELECT pg_advisory_xact_lock($1)::text", &[&MIGRATION_LOCK])
            .await
            .map_err(|e| self.map(e))?;
        if let Some(schema) = &self.sql.schema {
            txn.batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS {}",
                quote_ident(schema)
            ))
            .await
            .map_err(|e| self.map(e))?;
        }
        let p = self.sql.prefix();
        let exists = |table: &str| format!("SELECT to_regclass('{p}{table}')::text");
        let meta: Option<String> = txn
            .query_one(&exists("rethread_meta"), &[])
            .await
            .map_err(|e| self.map(e))?
            .get(0);
        let version: i64 = match meta {
            None => {
                let sessions: Option<String> = txn
                    .query_one(&exists("sessions"), &[])
                    .await
                    .map_err(|e| self.map(e))?
                    .get(0);
                if sessions.is_some() {
                    return Err(StoreError::corrupt(
                        &self.label,
                        "a `sessions` table exists but no rethread_meta: not a rethread store",
                    ));
                }
                txn.batch_execute(&format!(
                    "CREATE TABLE {p}rethread_meta (key TEXT PRIMARY KEY NOT NULL, value BIGINT NOT NULL);
                     INSERT INTO {p}rethread_meta VALUES ('schema_version', 0);"
                ))
                .await
                .map_err(|e| self.map(e))?;
                0
            }
            Some(_) => txn
                .query_opt(
                    &format!("SELECT value FROM {p}rethread_meta WHERE key = 'schema_version'"),
                    &[],
                )
                .await
                .map_err(|e| self.map(e))?
                .map(|r| r.get(0))
                .ok_or_else(|| StoreError::corrupt(&self.label, "no schema_version"))?,
        };
        let version = u64::try_from(version)
            .map_err(|_| StoreError::corrupt(&self.label, "negative schema_version"))?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                path: self.label.clone(),
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        let mut at = version;
        while at < SCHEMA_VERSION {
            match at {
                0 => txn
                    .batch_execute(&schema_v1(&p))
                    .await
                    .map_err(|e| self.map(e))?,
                // Schema 2 changed only SQLite stores (record checksums).
                1 => {}
                // Schema 3: a lease names its holder's process identity (dead-holder takeover).
                2 => txn
                    .batch_execute(&format!(
                        "ALTER TABLE {p}leases ADD COLUMN process_space TEXT, \
                         ADD COLUMN process_start BIGINT"
                    ))
                    .await
                    .map_err(|e| self.map(e))?,
                other => {
                    return Err(StoreError::corrupt(
                        &self.label,
                        format!("unknown schema version {other}"),
                    ))
                }
            }
            at += 1;
        }
        if version < SCHEMA_VERSION {
            txn.execute(
                &format!("UPDATE {p}rethread_meta SET value = $1 WHERE key = 'schema_version'"),
                &[&(SCHEMA_VERSION as i64)],
            )
            .await
            .map_err(|e| self.map(e))?;
        }
        txn.commit().await.map_err(|e| self.map(e))
    }

    /// Runs one write in its own transaction under the session's advisory lock: loads what
    /// the rules need, applies them (`logic.rs`), writes back.
    async fn write(&self, op: WriteOp) -> Result<Reply, StoreError> {
        let session_id = match &op {
            WriteOp::Commit(c) => c.session_id.clone(),
            WriteOp::Patch { session_id, .. }
            | WriteOp::DropIf { session_id, .. }
            | WriteOp::Retire { session_id, .. }
            | WriteOp::Delete { session_id } => session_id.clone(),
            WriteOp::Import(export) => export.record.session_id.clone(),
            WriteOp::Lease(op) => op.session_id().to_string(),
        };
        let sql = &self.sql;
        let mut client = self.client().await?;
        let txn = client.transaction().await.map_err(|e| self.map(e))?;
        let lock = txn
            .prepare_cached(&sql.lock)
            .await
            .map_err(|e| self.map(e))?;
        let synchronous_commit = if self.relaxed { "off" } else { "on" };
        let now: i64 = txn
            .query_one(&lock, &[&sql.lock_key(&session_id), &synchronous_commit])
            .await
            .map_err(|e| self.map(e))?
            .get(1);
        let mut view = Buffered::default();
        // Lease requests and fenced writes read the session's lease under the same lock.
        if matches!(op, WriteOp::Lease(_)) || op.fence().is_some() {
            let stmt = txn
                .prepare_cached(&sql.load_lease)
                .await
                .map_err(|e| self.map(e))?;
            let lease = match txn
                .query_opt(&stmt, &[&session_id])
                .await
                .map_err(|e| self.map(e))?
            {
                Some(row) => Some(lease_from_row(&self.label, &session_id, &row)?),
                None => None,
            };
            view.leases.insert(session_id.clone(), lease);
        }
        match &op {
            WriteOp::Lease(_) => {}
            _ => {
                let stmt = txn
                    .prepare_cached(&sql.load)
                    .await
                    .map_err(|e| self.map(e))?;
                let record = match txn
                    .query_opt(&stmt, &[&session_id])
                    .await
                    .map_err(|e| self.map(e))?
                {
                    Some(row) => Some(decode_record(&self.label, &row)?),
                    None => None,
                };
                if let (WriteOp::Import(_), Some(existing)) = (&op, &record) {
                    let rows = self
                        .load_rows(&txn, &session_id, 0..existing.row_count)
                        .await?;
                    view.rows.insert(session_id.clone(), rows);
                }
                view.records.insert(session_id.clone(), record);
            }
        }
        let reply = match &op {
            WriteOp::Lease(lease_op) => Reply::Lease(apply_lease(&mut view, lease_op, now)?),
            other => apply(&mut view, other, now)?,
        };
        self.flush(&txn, view.writes).await?;
        txn.commit().await.map_err(|e| self.map(e))?;
        Ok(reply)
    }

    async fn flush(
        &self,
        txn: &deadpool_postgres::Transaction<'_>,
        writes: Vec<Write>,
    ) -> Result<(), StoreError> {
        let sql = &self.sql;
        let mut rows: Vec<(String, Vec<i64>, Vec<String>)> = Vec::new();
        let mut later = Vec::new();
        for write in writes {
            match write {
                Write::Row(session, seq, body) => match rows.last_mut() {
                    Some((s, seqs, bodies)) if *s == session => {
                        seqs.push(seq);
                        bodies.push(body);
                    }
                    _ => rows.push((session, vec![seq], vec![body])),
                },
                other => later.push(other),
            }
        }
        for (session, seqs, bodies) in rows {
            let stmt = txn
                .prepare_cached(&sql.put_rows)
                .await
                .map_err(|e| self.map(e))?;
            txn.execute(&stmt, &[&session, &seqs, &bodies])
                .await
                .map_err(|e| self.map(e))?;
        }
        for write in later {
            match write {
                Write::Row(..) => {}
                Write::Put(record) => {
                    let config = encode(&record.model_config)?;
                    let retired = encode(&record.retired_threads)?;
                    let binding = record.binding.as_ref();
                    let stmt = txn
                        .prepare_cached(&sql.put)
                        .await
                        .map_err(|e| self.map(e))?;
                    txn.execute(
                        &stmt,
                        &[
                            &record.session_id,
                            &config,
                            &binding.map(|b| b.thread_id.as_str()),
                            &binding.and_then(|b| b.codex_home.as_deref()),
                            &binding.map(|b| b.bound_at_ms),
                            &(record.row_count as i64),
                            &retired,
                            &record.created_at_ms,
                            &record.updated_at_ms,
                        ],
                    )
                    .await
                    .map_err(|e| self.map(e))?;
                }
                Write::Remove(session) => {
                    for text in [&sql.remove_rows, &sql.remove] {
                        let stmt = txn.prepare_cached(text).await.map_err(|e| self.map(e))?;
                        txn.execute(&stmt, &[&session])
                            .await
                            .map_err(|e| self.map(e))?;
                    }
                }
                Write::Lease(lease) => {
                    let stmt = txn
                        .prepare_cached(&sql.put_lease)
                        .await
                        .map_err(|e| self.map(e))?;
                    txn.execute(
                        &stmt,
                        &[
                            &lease.session_id,
                            &lease.owner.host,
                            &i64::from(lease.owner.pid),
                            &lease.owner.started_at_ms,
                            &(lease.owner.instance as i64),
                            &lease.acquired_at_ms,
                            &lease.expires_at_ms,
                            &(lease.fence as i64),
                            &lease.owner.process.as_ref().map(|p| p.space.as_str()),
                            &lease.owner.process.as_ref().map(|p| p.start_ticks as i64),
                        ],
                    )
                    .await
                    .map_err(|e| self.map(e))?;
                }
            }
        }
        Ok(())
    }

    async fn load_rows<C: deadpool_postgres::GenericClient>(
        &self,
        client: &C,
        session_id: &str,
        range: Range<u64>,
    ) -> Result<Vec<TranscriptRow>, StoreError> {
        let start = range.start.min(i64::MAX as u64) as i64;
        let end = range.end.min(i64::MAX as u64) as i64;
        let stmt = client
            .prepare_cached(&self.sql.rows)
            .await
            .map_err(|e| self.map(e))?;
        let rows = client
            .query(&stmt, &[&session_id, &start, &end])
            .await
            .map_err(|e| self.map(e))?;
        rows.iter()
            .map(|r| {
                let seq: i64 = r.get(0);
                let body: String = r.get(1);
                let body = serde_json::from_str(&body).map_err(|e| StoreError::Corrupt {
                    path: self.label.clone(),
                    detail: format!("row {seq} of {session_id} does not decode"),
                    source: Some(Box::new(e)),
                })?;
                Ok(TranscriptRow {
                    seq: seq as u64,
                    body,
                })
            })
            .collect()
    }
}

fn encode<T: serde::Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Backend {
        backend: "postgres",
        source: Box::new(e),
    })
}

fn lease_from_row(label: &str, session_id: &str, r: &Row) -> Result<Lease, StoreError> {
    let space: Option<String> = r.get(7);
    let start: Option<i64> = r.get(8);
    let process = match (space, start) {
        (Some(space), Some(start)) => Some(ProcessIdentity {
            space,
            start_ticks: start as u64,
        }),
        (None, None) => None,
        _ => {
            return Err(StoreError::corrupt(
                label,
                format!("lease of session {session_id}: half a process identity"),
            ))
        }
    };
    Ok(Lease {
        session_id: session_id.to_string(),
        owner: LeaseOwner {
            host: r.get(0),
            pid: r.get::<_, i64>(1) as u32,
            started_at_ms: r.get(2),
            instance: r.get::<_, i64>(3) as u64,
            process,
        },
        acquired_at_ms: r.get(4),
        expires_at_ms: r.get(5),
        fence: r.get::<_, i64>(6) as u64,
    })
}

fn decode_record(label: &str, row: &Row) -> Result<SessionRecord, StoreError> {
    let id: String = row.get(0);
    let corrupt = |what: &str, e: serde_json::Error| StoreError::Corrupt {
        path: label.to_string(),
        detail: format!("{what} of {id} does not decode"),
        source: Some(Box::new(e)),
    };
    let model_config: Map<String, Value> =
        serde_json::from_str(row.get(1)).map_err(|e| corrupt("model_config", e))?;
    let retired_threads: Vec<String> =
        serde_json::from_str(row.get(6)).map_err(|e| corrupt("retired_threads", e))?;
    let binding = row.get::<_, Option<String>>(2).map(|thread_id| Binding {
        thread_id,
        codex_home: row.get(3),
        bound_at_ms: row.get::<_, Option<i64>>(4).unwrap_or(0),
    });
    let record = SessionRecord {
        session_id: id.clone(),
        model_config,
        binding,
        row_count: row.get::<_, i64>(5) as u64,
        retired_threads,
        created_at_ms: row.get(7),
        updated_at_ms: row.get(8),
    };
    check_record(&record).map_err(|d| StoreError::corrupt(label, format!("session {id}: {d}")))?;
    Ok(record)
}

/// One buffered write of [`Buffered`].
#[derive(Debug)]
enum Write {
    Put(SessionRecord),
    Row(String, i64, String),
    Remove(String),
    Lease(Lease),
}

/// The key-value view `logic.rs` runs on: what was read under the lock, plus the writes the
/// rules made (applied to the view too, so a later read in the same operation sees them).
#[derive(Debug, Default)]
struct Buffered {
    records: HashMap<String, Option<SessionRecord>>,
    rows: HashMap<String, Vec<TranscriptRow>>,
    leases: HashMap<String, Option<Lease>>,
    writes: Vec<Write>,
}

fn not_loaded(what: &str, id: &str) -> StoreError {
    StoreError::InvalidInput(format!("internal error: {what} of {id} was not loaded"))
}

impl ReadTxn for Buffered {
    fn load(&mut self, session_id: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.records
            .get(session_id)
            .cloned()
            .ok_or_else(|| not_loaded("session", session_id))
    }

    fn load_rows(
        &mut self,
        session_id: &str,
        range: Range<u64>,
    ) -> Result<Vec<TranscriptRow>, StoreError> {
        let rows = self
            .rows
            .get(session_id)
            .ok_or_else(|| not_loaded("rows", session_id))?;
        Ok(rows
            .iter()
            .filter(|r| range.contains(&r.seq))
            .cloned()
            .collect())
    }

    fn list(
        &mut self,
        _after: Option<&str>,
        _limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        Err(not_loaded("list", "the store"))
    }
}

impl WriteTxn for Buffered {
    fn put(&mut self, record: &SessionRecord) -> Result<(), StoreError> {
        self.records
            .insert(record.session_id.clone(), Some(record.clone()));
        self.writes.push(Write::Put(record.clone()));
        Ok(())
    }

    fn put_row(&mut self, session_id: &str, seq: u64, body: &Value) -> Result<(), StoreError> {
        self.writes.push(Write::Row(
            session_id.to_string(),
            seq as i64,
            body.to_string(),
        ));
        Ok(())
    }

    fn remove(&mut self, session_id: &str) -> Result<bool, StoreError> {
        let existed = self.load(session_id)?.is_some();
        self.records.insert(session_id.to_string(), None);
        self.writes.push(Write::Remove(session_id.to_string()));
        Ok(existed)
    }

    fn leases(&mut self) -> Option<&mut dyn LeaseTxn> {
        Some(self)
    }
}

impl LeaseTxn for Buffered {
    fn load_lease(&mut self, session_id: &str) -> Result<Option<Lease>, StoreError> {
        self.leases
            .get(session_id)
            .cloned()
            .ok_or_else(|| not_loaded("lease", session_id))
    }

    fn put_lease(&mut self, lease: &Lease) -> Result<(), StoreError> {
        self.leases
            .insert(lease.session_id.clone(), Some(lease.clone()));
        self.writes.push(Write::Lease(lease.clone()));
        Ok(())
    }
}

#[async_trait::async_trait]
impl crate::BindingStore for PostgresStore {
    async fn session(&self, session_id: &str) -> Result<Option<SessionRecord>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&self.sql.load)
            .await
            .map_err(|e| self.map(e))?;
        match client
            .query_opt(&stmt, &[&session_id])
            .await
            .map_err(|e| self.map(e))?
        {
            Some(row) => decode_record(&self.label, &row).map(Some),
            None => Ok(None),
        }
    }

    async fn rows(
        &self,
        session_id: &str,
        range: Range<u64>,
    ) -> Result<Vec<TranscriptRow>, StoreError> {
        if range.start >= range.end {
            return Ok(Vec::new());
        }
        let client = self.client().await?;
        self.load_rows(&client, session_id, range).await
    }

    async fn commit_turn(&self, commit: TurnCommit) -> Result<CommitOutcome, StoreError> {
        expect_reply!(self.write(WriteOp::Commit(commit)).await?, Commit)
    }

    async fn patch_config(
        &self,
        session_id: &str,
        patch: Map<String, Value>,
        fence: Option<&Fence>,
    ) -> Result<Map<String, Value>, StoreError> {
        let op = WriteOp::Patch {
            session_id: session_id.to_string(),
            patch,
            fence: fence.cloned(),
        };
        expect_reply!(self.write(op).await?, Config)
    }

    async fn drop_binding_if(
        &self,
        session_id: &str,
        thread_id: &str,
        fence: Option<&Fence>,
    ) -> Result<bool, StoreError> {
        let op = WriteOp::DropIf {
            session_id: session_id.to_string(),
            thread_id: thread_id.to_string(),
            fence: fence.cloned(),
        };
        expect_reply!(self.write(op).await?, Bool)
    }

    async fn retire_thread(
        &self,
        session_id: &str,
        thread_id: &str,
        fence: Option<&Fence>,
    ) -> Result<(), StoreError> {
        let op = WriteOp::Retire {
            session_id: session_id.to_string(),
            thread_id: thread_id.to_string(),
            fence: fence.cloned(),
        };
        self.write(op).await.map(|_| ())
    }

    async fn list_sessions(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<SessionPage, StoreError> {
        if limit == 0 {
            return Err(StoreError::InvalidInput(
                "list limit must be at least 1".to_string(),
            ));
        }
        let client = self.client().await?;
        let fetch = limit.saturating_add(1).min(i64::MAX as usize) as i64;
        let rows = match after {
            Some(after) => {
                let stmt = client
                    .prepare_cached(&self.sql.list_after)
                    .await
                    .map_err(|e| self.map(e))?;
                client.query(&stmt, &[&after, &fetch]).await
            }
            None => {
                let stmt = client
                    .prepare_cached(&self.sql.list_all)
                    .await
                    .map_err(|e| self.map(e))?;
                client.query(&stmt, &[&fetch]).await
            }
        }
        .map_err(|e| self.map(e))?;
        let records = rows
            .iter()
            .map(|r| decode_record(&self.label, r))
            .collect::<Result<Vec<_>, _>>()?;
        // The paging rule itself is the shared one.
        logic::list(&mut Listed(records), None, limit)
    }

    async fn delete_session(&self, session_id: &str) -> Result<bool, StoreError> {
        let op = WriteOp::Delete {
            session_id: session_id.to_string(),
        };
        expect_reply!(self.write(op).await?, Bool)
    }

    async fn export_session(&self, session_id: &str) -> Result<Option<SessionExport>, StoreError> {
        let mut client = self.client().await?;
        let txn = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(|e| self.map(e))?;
        let Some(row) = txn
            .query_opt(&self.sql.load, &[&session_id])
            .await
            .map_err(|e| self.map(e))?
        else {
            return Ok(None);
        };
        let record = decode_record(&self.label, &row)?;
        let rows = self
            .load_rows(&txn, session_id, 0..record.row_count)
            .await?;
        txn.commit().await.map_err(|e| self.map(e))?;
        let mut view = Buffered::default();
        view.records.insert(session_id.to_string(), Some(record));
        view.rows.insert(session_id.to_string(), rows);
        logic::export(&mut view, session_id)
    }

    async fn import_session(&self, export: SessionExport) -> Result<ImportOutcome, StoreError> {
        expect_reply!(self.write(WriteOp::Import(export)).await?, Import)
    }

    async fn acquire_lease(
        &self,
        session_id: &str,
        owner: &LeaseOwner,
        ttl: Duration,
    ) -> Result<Lease, StoreError> {
        let op = LeaseOp::Acquire {
            session_id: session_id.to_string(),
            owner: owner.clone(),
            ttl_ms: ttl_ms(ttl),
        };
        lease_of(expect_reply!(self.write(WriteOp::Lease(op)).await?, Lease)?)
    }

    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease, StoreError> {
        let op = LeaseOp::Renew {
            lease: lease.clone(),
            ttl_ms: ttl_ms(ttl),
        };
        lease_of(expect_reply!(self.write(WriteOp::Lease(op)).await?, Lease)?)
    }

    async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError> {
        let op = LeaseOp::Release {
            lease: lease.clone(),
        };
        released_of(expect_reply!(self.write(WriteOp::Lease(op)).await?, Lease)?)
    }
}

/// A page as fetched, for the shared paging rule.
struct Listed(Vec<SessionRecord>);

impl ReadTxn for Listed {
    fn load(&mut self, session_id: &str) -> Result<Option<SessionRecord>, StoreError> {
        Err(not_loaded("session", session_id))
    }

    fn load_rows(
        &mut self,
        session_id: &str,
        _range: Range<u64>,
    ) -> Result<Vec<TranscriptRow>, StoreError> {
        Err(not_loaded("rows", session_id))
    }

    fn list(
        &mut self,
        _after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        Ok(std::mem::take(&mut self.0)
            .into_iter()
            .take(limit)
            .collect())
    }
}
