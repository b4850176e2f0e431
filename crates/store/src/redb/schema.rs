//! The redb layout: tables, schema version, creation and migration.

use std::ops::Bound;

use ::redb::{Database, ReadableTable, TableDefinition};

use super::map_redb_error;
use super::tables::{row_sum, seal, session_sum};
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
            // Schema 2 changed only SQLite stores (record checksums). Schema 3 changed only the
            // stored leases, which redb keeps in the process.
            1 | 2 => {}
            // Schema 4: every value carries a checksum of its table, key and JSON.
            3 => seal_all(txn, label)?,
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

/// How many values the schema-4 migration rewrites per step (it reads a batch, then writes it:
/// a redb table cannot be written while it is iterated).
const SEAL_BATCH: usize = 1024;

/// Appends its checksum to every value of a schema-3 store, in the migration's transaction.
fn seal_all(txn: &::redb::WriteTransaction, label: &str) -> Result<(), StoreError> {
    let map = |e: ::redb::Error| map_redb_error(label, e);
    let mut sessions = txn.open_table(SESSIONS).map_err(|e| map(e.into()))?;
    let mut after: Option<String> = None;
    loop {
        let lower = match &after {
            Some(key) => Bound::Excluded(key.as_str()),
            None => Bound::Unbounded,
        };
        let batch = sessions
            .range::<&str>((lower, Bound::Unbounded))
            .map_err(|e| map(e.into()))?
            .take(SEAL_BATCH)
            .map(|item| {
                let (key, value) = item.map_err(|e| map(e.into()))?;
                Ok((key.value().to_string(), value.value().to_vec()))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let Some((last, _)) = batch.last() else {
            break;
        };
        after = Some(last.clone());
        for (key, json) in batch {
            let sum = session_sum(&key, &json);
            sessions
                .insert(key.as_str(), seal(json, sum).as_slice())
                .map_err(|e| map(e.into()))?;
        }
    }
    let mut rows = txn.open_table(ROWS).map_err(|e| map(e.into()))?;
    let mut after: Option<(String, u64)> = None;
    loop {
        let batch = match &after {
            Some((session, seq)) => rows.range::<(&str, u64)>((
                Bound::Excluded((session.as_str(), *seq)),
                Bound::Unbounded,
            )),
            None => rows.range::<(&str, u64)>(..),
        }
        .map_err(|e| map(e.into()))?
        .take(SEAL_BATCH)
        .map(|item| {
            let (key, value) = item.map_err(|e| map(e.into()))?;
            let (session, seq) = key.value();
            Ok((session.to_string(), seq, value.value().to_vec()))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
        let Some((session, seq, _)) = batch.last() else {
            break;
        };
        after = Some((session.clone(), *seq));
        for (session, seq, json) in batch {
            let sum = row_sum(&session, seq, &json);
            rows.insert((session.as_str(), seq), seal(json, sum).as_slice())
                .map_err(|e| map(e.into()))?;
        }
    }
    Ok(())
}
