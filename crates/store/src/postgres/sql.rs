//! The SQL of the PostgreSQL backend, qualified with the store's schema: the statements each
//! connection prepares once, and the tables' creation (schema 1), serialised across processes,
//! refusing foreign and newer ones.

use postgres::{Client, Statement, Transaction};

use super::error::PgResult;
use super::Conn;
use crate::sql_columns::{lease_columns, record_columns};
use crate::Result;
use crate::{StoreError, SCHEMA_VERSION};

/// The `sessions` and `leases` columns, in `RecordColumns`' and `LeaseColumns`' order.
const RECORD_COLUMNS: &str = record_columns!();
const LEASE_COLUMNS: &str = lease_columns!();

/// Where the store's tables live: the URL's `schema`, or the connection's search path.
#[derive(Debug)]
pub(super) struct Sql {
    pub(super) schema: Option<String>,
}

impl Sql {
    /// The prefix of a table name: the quoted schema and a dot, or nothing.
    pub(super) fn prefix(&self) -> String {
        prefix(self.schema.as_deref())
    }

    /// The advisory lock key of a session: distinct per schema, so stores in different
    /// schemas of one database do not wait for each other.
    pub(super) fn lock_key(&self, session_id: &str) -> String {
        format!("{}/{session_id}", self.schema.as_deref().unwrap_or(""))
    }
}

/// The statements of one connection, prepared when it connects, their texts qualified with
/// the schema prefix `$p`.
macro_rules! statements {
    ($p:ident; $($name:ident: $text:expr,)*) => {
        #[derive(Debug)]
        pub(super) struct Statements { $(pub(super) $name: Statement),* }

        impl Statements {
            pub(super) fn prepare(client: &mut Client, sql: &Sql) -> Result<Self, postgres::Error> {
                let $p = sql.prefix();
                Ok(Statements { $($name: client.prepare(&$text)?),* })
            }
        }
    };
}

statements!(p;
    // One round trip: the session's lock, the server's clock, and this transaction's
    // `synchronous_commit` ($2: `on` for `Durable`, whatever the server's default,
    // `off` for `Relaxed`) and `idle_in_transaction_session_timeout` ($3: a stalled
    // holder's connection is ended, its lock released). Both are transaction-local,
    // so a connection pooler in front of the server sees nothing of them.
    lock: "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))::text IS NULL, \
           (extract(epoch FROM clock_timestamp()) * 1000)::int8, \
           set_config('synchronous_commit', $2, true), \
           set_config('idle_in_transaction_session_timeout', $3, true)",
    load: format!("SELECT {RECORD_COLUMNS} FROM {p}sessions WHERE session_id = $1"),
    stale_leases: format!(
        "SELECT session_id FROM {p}leases l WHERE session_id > $1 AND expires_at_ms < $2 \
         AND NOT EXISTS (SELECT 1 FROM {p}sessions s WHERE s.session_id = l.session_id) \
         ORDER BY session_id LIMIT $3"
    ),
    row_bytes: format!(
        "SELECT coalesce(sum(octet_length(body)), 0)::int8 FROM {p}transcript_rows \
         WHERE session_id = $1"
    ),
    has_rows: format!("SELECT EXISTS (SELECT 1 FROM {p}transcript_rows WHERE session_id = $1)"),
    // The sessions of the first and last row, each with whether its record exists.
    row_ends: format!(
        "SELECT e.session_id, EXISTS (SELECT 1 FROM {p}sessions s \
         WHERE s.session_id = e.session_id) FROM \
         ((SELECT session_id FROM {p}transcript_rows ORDER BY session_id LIMIT 1) \
         UNION ALL \
         (SELECT session_id FROM {p}transcript_rows ORDER BY session_id DESC LIMIT 1)) e"
    ),
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
    thread_owner: format!("SELECT session_id FROM {p}threads WHERE thread_id = $1"),
    session_threads: format!("SELECT thread_id FROM {p}threads WHERE session_id = $1"),
    put: format!(
        "INSERT INTO {p}sessions ({RECORD_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (session_id) DO UPDATE SET model_config = excluded.model_config, \
         state = excluded.state, row_count = excluded.row_count, \
         retired_threads = excluded.retired_threads, \
         created_at_ms = excluded.created_at_ms, updated_at_ms = excluded.updated_at_ms, \
         mirror = excluded.mirror"
    ),
    // A plain INSERT: rows are append-only; a duplicate key fails loudly.
    put_rows: format!(
        "INSERT INTO {p}transcript_rows (session_id, seq, body) \
         SELECT $1, s, b FROM unnest($2::int8[], $3::text[]) AS t(s, b)"
    ),
    // Never takes a thread over: writers of different sessions run at once, so another
    // session may have claimed it since this transaction looked. The conflicting insert
    // waits for that claim's commit and returns the owner it leaves (the caller refuses
    // another session's).
    put_thread: format!(
        "INSERT INTO {p}threads AS t (thread_id, session_id) VALUES ($1, $2) \
         ON CONFLICT (thread_id) DO UPDATE SET session_id = t.session_id \
         RETURNING session_id"
    ),
    remove_rows: format!("DELETE FROM {p}transcript_rows WHERE session_id = $1"),
    remove_threads: format!("DELETE FROM {p}threads WHERE session_id = $1"),
    remove: format!("DELETE FROM {p}sessions WHERE session_id = $1"),
    chunks: format!(
        "SELECT seq, bytes FROM {p}mirror_chunks WHERE session_id = $1 AND thread_id = $2 \
         AND path = $3 AND seq >= $4 AND seq < $5 ORDER BY seq"
    ),
    // A plain INSERT: chunks are append-only; a duplicate key fails loudly.
    put_chunk: format!(
        "INSERT INTO {p}mirror_chunks (session_id, thread_id, path, seq, bytes) \
         VALUES ($1, $2, $3, $4, $5)"
    ),
    remove_chunks: format!(
        "DELETE FROM {p}mirror_chunks WHERE session_id = $1 AND thread_id = $2 AND path = $3 \
         AND seq >= $4"
    ),
    remove_session_chunks: format!("DELETE FROM {p}mirror_chunks WHERE session_id = $1"),
    remove_lease: format!("DELETE FROM {p}leases WHERE session_id = $1"),
    load_lease: format!("SELECT {LEASE_COLUMNS} FROM {p}leases WHERE session_id = $1"),
    put_lease: format!(
        "INSERT INTO {p}leases ({LEASE_COLUMNS}) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
         ON CONFLICT (session_id) DO UPDATE SET host = excluded.host, pid = excluded.pid, \
         started_at_ms = excluded.started_at_ms, instance = excluded.instance, \
         acquired_at_ms = excluded.acquired_at_ms, expires_at_ms = excluded.expires_at_ms, \
         fence = excluded.fence, process_space = excluded.process_space, \
         process_start = excluded.process_start, state = excluded.state"
    ),
);

fn prefix(schema: Option<&str>) -> String {
    match schema {
        Some(s) => format!("{}.", quote_ident(s)),
        None => String::new(),
    }
}

pub(super) fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// Schema 1: the tables of a new store.
pub(super) fn schema(p: &str) -> String {
    format!(
        "CREATE TABLE {p}sessions (
            session_id TEXT PRIMARY KEY NOT NULL,
            model_config TEXT NOT NULL,
            state TEXT NOT NULL,
            row_count BIGINT NOT NULL,
            retired_threads TEXT NOT NULL,
            created_at_ms BIGINT NOT NULL,
            updated_at_ms BIGINT NOT NULL,
            mirror TEXT NOT NULL
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
            fence BIGINT NOT NULL,
            process_space TEXT,
            process_start BIGINT,
            state BIGINT NOT NULL
        );
        CREATE TABLE {p}threads (
            thread_id TEXT PRIMARY KEY NOT NULL,
            session_id TEXT NOT NULL
        );
        CREATE INDEX ON {p}threads (session_id);
        CREATE TABLE {p}mirror_chunks (
            session_id TEXT NOT NULL,
            thread_id TEXT NOT NULL,
            path TEXT NOT NULL,
            seq BIGINT NOT NULL,
            bytes BYTEA NOT NULL,
            PRIMARY KEY (session_id, thread_id, path, seq)
        );
        -- Out of line, uncompressed: pglz would spend a commit's budget on every chunk and a
        -- restore's on reading it back (`cargo xtask bench mirror`).
        ALTER TABLE {p}mirror_chunks ALTER COLUMN bytes SET STORAGE EXTERNAL;"
    )
}

/// The advisory lock key that serialises schema creation (`"rthd"`).
const SCHEMA_LOCK: i64 = 0x7274_6864;

impl Conn {
    /// Creates the tables of a new store (if `create`), refuses a newer or foreign one;
    /// serialised across processes by an advisory lock.
    pub(super) fn ensure_schema(&mut self, create: bool) -> Result<()> {
        let label = self.label.clone();
        let sql = std::sync::Arc::clone(&self.sql);
        let p = sql.prefix();
        // Without the tables, the connection's statements cannot be prepared yet.
        let mut client = self.config.connect(postgres::NoTls).pg(&label)?;
        let mut txn = client.transaction().pg(&label)?;
        txn.execute("SELECT pg_advisory_xact_lock($1)::text", &[&SCHEMA_LOCK])
            .pg(&label)?;
        let exists = |txn: &mut Transaction<'_>, table: &str| -> Result<bool> {
            let found: Option<String> = txn
                .query_one(&format!("SELECT to_regclass('{p}{table}')::text"), &[])
                .pg(&label)?
                .get(0);
            Ok(found.is_some())
        };
        if sql.schema.is_some() && !exists(&mut txn, "rethread_meta")? && !create {
            return Err(StoreError::no_store(label));
        }
        if let Some(schema) = &sql.schema {
            txn.batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS {}",
                quote_ident(schema)
            ))
            .pg(&label)?;
        }
        if !exists(&mut txn, "rethread_meta")? {
            if exists(&mut txn, "sessions")? {
                return Err(StoreError::corrupt(
                    &label,
                    "a `sessions` table exists but no rethread_meta: not a rethread store",
                ));
            }
            if !create {
                return Err(StoreError::no_store(label));
            }
            txn.batch_execute(&format!(
                "CREATE TABLE {p}rethread_meta (key TEXT PRIMARY KEY NOT NULL, value BIGINT NOT NULL);
                 INSERT INTO {p}rethread_meta VALUES ('schema_version', {SCHEMA_VERSION});
                 {}",
                schema(&p)
            )).pg(&label)?;
            return txn.commit().pg(&label);
        }
        let version: i64 = txn
            .query_opt(
                &format!("SELECT value FROM {p}rethread_meta WHERE key = 'schema_version'"),
                &[],
            )
            .pg(&label)?
            .map(|r| r.get(0))
            .ok_or_else(|| StoreError::corrupt(&label, "no schema_version"))?;
        let version = u64::try_from(version)
            .map_err(|_| StoreError::corrupt(&label, "negative schema_version"))?;
        StoreError::check_schema_version(&label, version)?;
        txn.commit().pg(&label)
    }
}
