//! The SQL of the PostgreSQL backend, qualified with the store's schema: the statements each
//! connection prepares once, and the tables' creation (schema 1, `schema_postgres.sql`),
//! serialised across processes, refusing foreign and newer ones.

use postgres::{Client, Statement, Transaction};

use super::error::PgResult;
use super::Conn;
use crate::sql::{render, render_one, POSTGRES};
use crate::Result;
use crate::{StoreError, SCHEMA_VERSION};

/// Where the store's tables live (the URL's `schema`, or the connection's search path), and
/// the SQL layer's statements for them.
#[derive(Debug)]
pub(super) struct Sql {
    pub(super) schema: Option<String>,
    statements: Vec<String>,
}

impl Sql {
    pub(super) fn new(schema: Option<String>) -> Self {
        let statements = render(&POSTGRES, &prefix(schema.as_deref()));
        Sql { schema, statements }
    }

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

/// The statements of one connection, prepared when it connects: the SQL layer's, in
/// [`Stmt`](crate::sql::Stmt)'s order, and the write lock.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) lock: Statement,
    pub(super) all: Vec<Statement>,
}

impl Statements {
    pub(super) fn prepare(client: &mut Client, sql: &Sql) -> Result<Self, postgres::Error> {
        // One round trip: the session's lock, the server's clock, and this transaction's
        // `synchronous_commit` ($2: `on` for `Durable`, whatever the server's default, `off`
        // for `Relaxed`) and `idle_in_transaction_session_timeout` ($3: a stalled holder's
        // connection is ended, its lock released). Both are transaction-local, so a
        // connection pooler in front of the server sees nothing of them.
        let lock = client.prepare(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))::text IS NULL, \
             (extract(epoch FROM clock_timestamp()) * 1000)::int8, \
             set_config('synchronous_commit', $2, true), \
             set_config('idle_in_transaction_session_timeout', $3, true)",
        )?;
        let all = sql.statements.iter().map(|text| client.prepare(text));
        Ok(Statements {
            lock,
            all: all.collect::<Result<_, _>>()?,
        })
    }
}

fn prefix(schema: Option<&str>) -> String {
    match schema {
        Some(s) => format!("{}.", quote_ident(s)),
        None => String::new(),
    }
}

pub(super) fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// The tables of a new store, after `{p}`.
const SCHEMA: &str = include_str!("../sql/schema_postgres.sql");

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
            let schema = render_one(SCHEMA, &POSTGRES, &p);
            let schema = schema.replace("{version}", &SCHEMA_VERSION.to_string());
            txn.batch_execute(&schema).pg(&label)?;
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
