//! The redb layout (schema 1): tables, creation, and the refusal of foreign and newer files.

use ::redb::{Database, ReadableTable, TableDefinition, TableHandle};

use super::RedbResult;
use crate::Result;
use crate::{StoreError, SCHEMA_VERSION};

/// `session id -> JSON SessionRecord + checksum`.
pub(super) const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("sessions");
/// `(session id, seq) -> JSON body + checksum`.
pub(super) const ROWS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("rows");
/// `thread id -> session id + checksum`: which session a thread belongs to.
pub(super) const THREADS: TableDefinition<&str, &[u8]> = TableDefinition::new("threads");
/// `(session id, thread id) -> checksum`: the same, by session, so a delete frees its threads
/// without a scan.
pub(super) const SESSION_THREADS: TableDefinition<(&str, &str), &[u8]> =
    TableDefinition::new("session_threads");
/// `(session id, thread id, path, seq) -> bytes + checksum`: the mirrored rollout files.
pub(super) const MIRROR_CHUNKS: TableDefinition<(&str, &str, &str, u64), &[u8]> =
    TableDefinition::new("mirror_chunks");
/// `"schema_version" -> u64`.
const META: TableDefinition<&str, u64> = TableDefinition::new("rethread_meta");
const SCHEMA_KEY: &str = "schema_version";

/// Checks the schema version, initialising a new file when `create` allows.
pub(super) fn ensure_schema(db: &Database, label: &str, create: bool) -> Result<()> {
    let txn = db.begin_write().redb(label)?;
    let tables: Vec<String> = txn
        .list_tables()
        .redb(label)?
        .map(|t| t.name().to_string())
        .collect();
    let mut found = None;
    if tables.iter().any(|t| t == META.name()) {
        let meta = txn.open_table(META).redb(label)?;
        found = meta.get(SCHEMA_KEY).redb(label)?.map(|v| v.value());
    }
    match found {
        None if tables.is_empty() && !create => Err(StoreError::no_store(label)),
        None if tables.is_empty() => {
            txn.open_table(SESSIONS).redb(label)?;
            txn.open_table(ROWS).redb(label)?;
            txn.open_table(THREADS).redb(label)?;
            txn.open_table(SESSION_THREADS).redb(label)?;
            txn.open_table(MIRROR_CHUNKS).redb(label)?;
            let mut meta = txn.open_table(META).redb(label)?;
            meta.insert(SCHEMA_KEY, SCHEMA_VERSION).redb(label)?;
            drop(meta); // before the commit, which needs the table closed
            txn.commit().redb(label)
        }
        None => Err(StoreError::corrupt(
            label,
            format!("not a rethread store (tables {tables:?}, no schema version)"),
        )),
        Some(version) => {
            StoreError::check_schema_version(label, version)?;
            let needed = [
                SESSIONS.name(),
                ROWS.name(),
                THREADS.name(),
                SESSION_THREADS.name(),
                MIRROR_CHUNKS.name(),
            ];
            if let Some(missing) = needed.iter().find(|n| !tables.iter().any(|t| t == *n)) {
                let detail = format!("table {missing} is missing");
                return Err(StoreError::corrupt(label, detail));
            }
            txn.abort().redb(label)
        }
    }
}
