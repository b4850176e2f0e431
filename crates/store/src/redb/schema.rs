//! The redb layout (schema 1): tables, creation, and the refusal of foreign and newer files.

use ::redb::{Database, ReadableTable, TableDefinition};

use super::map_redb_error;
use crate::Result;
use crate::{StoreError, SCHEMA_VERSION};

pub(super) const SESSIONS_NAME: &str = "sessions";
pub(super) const ROWS_NAME: &str = "rows";
pub(super) const THREADS_NAME: &str = "threads";
pub(super) const SESSION_THREADS_NAME: &str = "session_threads";
pub(super) const MIRROR_CHUNKS_NAME: &str = "mirror_chunks";
pub(super) const META_NAME: &str = "rethread_meta";
/// `session id -> JSON SessionRecord + checksum`.
pub(super) const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new(SESSIONS_NAME);
/// `(session id, seq) -> JSON body + checksum`.
pub(super) const ROWS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new(ROWS_NAME);
/// `thread id -> session id + checksum`: which session a thread belongs to.
pub(super) const THREADS: TableDefinition<&str, &[u8]> = TableDefinition::new(THREADS_NAME);
/// `(session id, thread id) -> checksum`: the same, by session, so a delete frees its threads
/// without a scan.
pub(super) const SESSION_THREADS: TableDefinition<(&str, &str), &[u8]> =
    TableDefinition::new(SESSION_THREADS_NAME);
/// `(session id, thread id, path, seq) -> bytes + checksum`: the mirrored rollout files.
pub(super) const MIRROR_CHUNKS: TableDefinition<(&str, &str, &str, u64), &[u8]> =
    TableDefinition::new(MIRROR_CHUNKS_NAME);
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new(META_NAME);
pub(super) const SCHEMA_KEY: &str = "schema_version";

/// Checks the schema version, initialising a new file when `create` allows.
pub(super) fn ensure_schema(db: &Database, label: &str, create: bool) -> Result<()> {
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
        None if tables.is_empty() && !create => Err(StoreError::NoStore {
            path: label.to_string(),
        }),
        None if tables.is_empty() => {
            txn.open_table(SESSIONS).map_err(|e| map(e.into()))?;
            txn.open_table(ROWS).map_err(|e| map(e.into()))?;
            txn.open_table(THREADS).map_err(|e| map(e.into()))?;
            txn.open_table(SESSION_THREADS).map_err(|e| map(e.into()))?;
            txn.open_table(MIRROR_CHUNKS).map_err(|e| map(e.into()))?;
            txn.open_table(META)
                .map_err(|e| map(e.into()))?
                .insert(SCHEMA_KEY, SCHEMA_VERSION)
                .map_err(|e| map(e.into()))?;
            txn.commit().map_err(|e| map(e.into()))
        }
        None => Err(StoreError::corrupt(
            label,
            format!("not a rethread store (tables {tables:?}, no schema version)"),
        )),
        Some(v) if v > SCHEMA_VERSION => Err(StoreError::NewerSchema {
            path: label.to_string(),
            found: v,
            supported: SCHEMA_VERSION,
        }),
        Some(v) if v < SCHEMA_VERSION => Err(StoreError::corrupt(
            label,
            format!("unknown schema version {v}"),
        )),
        Some(_) => {
            for needed in [
                SESSIONS_NAME,
                ROWS_NAME,
                THREADS_NAME,
                SESSION_THREADS_NAME,
                MIRROR_CHUNKS_NAME,
            ] {
                if !tables.iter().any(|t| t == needed) {
                    return Err(StoreError::corrupt(
                        label,
                        format!("table {needed} is missing"),
                    ));
                }
            }
            txn.abort().map_err(|e| map(e.into()))
        }
    }
}
