//! Creating the PostgreSQL tables (schema 1), serialised across processes, and refusing
//! foreign and newer ones.

use postgres::Transaction;

use super::error::PgResult;
use super::sql::{quote_ident, schema};
use super::Conn;
use crate::Result;
use crate::{StoreError, SCHEMA_VERSION};

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
