//! The SQLite layout (schema 1): creation, and the refusal of foreign and newer files.

use rusqlite::{Connection, TransactionBehavior};

use super::SqliteResult;
use crate::Result;
use crate::{StoreError, SCHEMA_VERSION};

/// `PRAGMA application_id` of a rethread store ("rthd"): tells our files from other SQLite files.
const APPLICATION_ID: i64 = 0x7274_6864;

/// The tables of a new store.
const SCHEMA: &str = include_str!("../sql/schema_sqlite.sql");

const TABLES: [&str; 5] = [
    "sessions",
    "transcript_rows",
    "leases",
    "threads",
    "mirror_chunks",
];

/// Checks the schema version, initialising a new file when `create` allows, all in one
/// immediate transaction (two processes opening a new file at once are serialised); without
/// `create`, in a deferred one, which takes no write lock.
pub(super) fn ensure_schema(conn: &mut Connection, label: &str, create: bool) -> Result<()> {
    let behavior = match create {
        true => TransactionBehavior::Immediate,
        false => TransactionBehavior::Deferred,
    };
    let txn = conn.transaction_with_behavior(behavior).sqlite(label)?;
    let int = |sql: &str| txn.query_row(sql, [], |r| r.get::<_, i64>(0)).sqlite(label);
    let app_id = int("PRAGMA application_id")?;
    let version = int("PRAGMA user_version")?;
    let tables = int("SELECT count(*) FROM sqlite_master WHERE type = 'table'")?;
    if app_id == 0 && version == 0 && tables == 0 {
        if !create {
            return Err(StoreError::no_store(label));
        }
        txn.execute_batch(SCHEMA).sqlite(label)?;
        txn.execute_batch(&format!(
            "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {SCHEMA_VERSION};"
        ))
        .sqlite(label)?;
        return txn.commit().sqlite(label);
    }
    if app_id != APPLICATION_ID {
        let detail = "not a rethread store (foreign SQLite file)";
        return Err(StoreError::corrupt(label, detail));
    }
    StoreError::check_schema_version(label, version as u64)?;
    for table in TABLES {
        let sql = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1";
        let n: i64 = txn.query_row(sql, [table], |r| r.get(0)).sqlite(label)?;
        if n != 1 {
            return Err(StoreError::corrupt(
                label,
                format!("table {table} is missing"),
            ));
        }
    }
    txn.commit().sqlite(label)
}
