//! The redb layout: tables, schema version, creation and migration.

use ::redb::{Database, ReadableTable, TableDefinition};

use super::map_redb_error;
use crate::{StoreError, SCHEMA_VERSION};

pub(super) const SESSIONS_NAME: &str = "sessions";
pub(super) const ROWS_NAME: &str = "rows";
pub(super) const META_NAME: &str = "rethread_meta";
pub(super) const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new(SESSIONS_NAME);
pub(super) const ROWS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new(ROWS_NAME);
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new(META_NAME);
pub(super) const SCHEMA_KEY: &str = "schema_version";

/// Checks the schema version, initialising a new file and migrating an older one.
pub(super) fn ensure_schema(db: &Database, label: &str) -> Result<(), StoreError> {
    let map = |e: ::redb::Error| map_redb_error(label, e);
    let txn = db.begin_write().map_err(|e| map(e.into()))?;
    let tables: Vec<String> = txn
        .list_tables()
        .map_err(|e| map(e.into()))?
        .map(|t| ::redb::TableHandle::name(&t).to_string())
        .collect();
    let found = if tables.iter().any(|t| t == META_NAME) {
        let meta = txn.open_table(META).map_err(|e| map(e.into()))?;
        let version = meta
            .get(SCHEMA_KEY)
            .map_err(|e| map(e.into()))?
            .map(|v| v.value());
        version
    } else {
        None
    };
    match found {
        None if tables.is_empty() => {
            migrate(&txn, 0, label)?;
            txn.commit().map_err(|e| map(e.into()))?;
        }
        None => {
            return Err(StoreError::corrupt(
                label,
                format!("not a rethread store (tables {tables:?}, no schema version)"),
            ))
        }
        Some(v) if v > SCHEMA_VERSION => {
            return Err(StoreError::NewerSchema {
                path: label.to_string(),
                found: v,
                supported: SCHEMA_VERSION,
            })
        }
        Some(v) if v < SCHEMA_VERSION => {
            migrate(&txn, v, label)?;
            txn.commit().map_err(|e| map(e.into()))?;
        }
        Some(_) => {
            for needed in [SESSIONS_NAME, ROWS_NAME] {
                if !tables.iter().any(|t| t == needed) {
                    return Err(StoreError::corrupt(
                        label,
                        format!("table {needed} is missing"),
                    ));
                }
            }
            txn.abort().map_err(|e| map(e.into()))?;
        }
    }
    Ok(())
}

/// Brings a store from schema `from` to [`SCHEMA_VERSION`] inside `txn`. Each step is one arm;
/// version 0 is a new, empty file.
fn migrate(txn: &::redb::WriteTransaction, from: u64, label: &str) -> Result<(), StoreError> {
    let map = |e: ::redb::Error| map_redb_error(label, e);
    let mut version = from;
    while version < SCHEMA_VERSION {
        match version {
            0 => {
                txn.open_table(SESSIONS).map_err(|e| map(e.into()))?;
                txn.open_table(ROWS).map_err(|e| map(e.into()))?;
            }
            // Schema 2 changed only SQLite stores (record checksums); redb checksums its pages.
            // Schema 3 changed only the stored leases, which redb keeps in the process.
            1 | 2 => {}
            other => {
                return Err(StoreError::corrupt(
                    label,
                    format!("unknown schema version {other}"),
                ))
            }
        }
        version += 1;
    }
    let mut meta = txn.open_table(META).map_err(|e| map(e.into()))?;
    meta.insert(SCHEMA_KEY, SCHEMA_VERSION)
        .map_err(|e| map(e.into()))?;
    Ok(())
}
