//! Creating and migrating the PostgreSQL tables, serialised across processes.

use super::sql::{quote_ident, schema_v1};
use super::Pg;
use crate::{StoreError, SCHEMA_VERSION};

/// The advisory lock key that serialises schema creation and migration (`"rthd"`).
const MIGRATION_LOCK: i64 = 0x7274_6864;

impl Pg {
    /// Creates the tables of a new store, migrates an older one, refuses a newer or foreign
    /// one; serialised across processes by an advisory lock.
    pub(super) async fn migrate(&self) -> Result<(), StoreError> {
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
                // Schema 4 changed only redb stores (value checksums).
                3 => {}
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
}
