//! The SQLite layout: schema versions, creation and migration.

use rusqlite::{params, Connection, TransactionBehavior};

use super::codec::{raw_record, row_checksum, RawLease, LEASE_COLUMNS, RECORD_COLUMNS};
use super::error::map_sqlite_error;
use crate::{StoreError, SCHEMA_VERSION};

/// `PRAGMA application_id` of a rethread store ("rthd"): tells our files from other SQLite files.
const APPLICATION_ID: i64 = 0x7274_6864;

/// Schema 1 as it was first released. Migrations start from it, so it never changes.
const SCHEMA_V1: &str = "
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY NOT NULL,
    model_config TEXT NOT NULL,
    binding_thread_id TEXT,
    binding_codex_home TEXT,
    bound_at_ms INTEGER,
    row_count INTEGER NOT NULL,
    retired_threads TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE transcript_rows (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
";

/// Session leases, added to schema 1 without a version bump (a schema-1 file may lack the
/// table, so the step to schema 2 creates it if missing). A free lease keeps its row so
/// `fence` keeps growing. Expiry is judged by the clock of the machine the processes share.
const LEASES_V1: &str = "
CREATE TABLE IF NOT EXISTS leases (
    session_id TEXT PRIMARY KEY NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started_at_ms INTEGER NOT NULL,
    instance INTEGER NOT NULL,
    acquired_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    fence INTEGER NOT NULL
) WITHOUT ROWID;
";

/// Schema 2: every row carries a CRC-32 of its fields (see `codec`). The existing
/// rows get theirs in the same migration transaction.
const SCHEMA_V2_COLUMNS: &str = "
ALTER TABLE sessions ADD COLUMN checksum INTEGER NOT NULL DEFAULT 0;
ALTER TABLE transcript_rows ADD COLUMN checksum INTEGER NOT NULL DEFAULT 0;
ALTER TABLE leases ADD COLUMN checksum INTEGER NOT NULL DEFAULT 0;
";

/// Schema 3: a lease names its holder's process identity (`ProcessIdentity`), so a dead
/// holder on the same machine can be told from a live one. A lease without one sums as in
/// schema 2, so existing rows keep their checksums.
const SCHEMA_V3_COLUMNS: &str = "
ALTER TABLE leases ADD COLUMN process_space TEXT;
ALTER TABLE leases ADD COLUMN process_start INTEGER;
";

/// The tables a current store has.
const TABLES: [&str; 3] = ["sessions", "transcript_rows", "leases"];

/// Checks the schema version, initialising a new file and migrating an older one, all in one
/// immediate transaction (two processes opening a new file at once are serialised).
pub(super) fn ensure_schema(conn: &mut Connection, label: &str) -> Result<(), StoreError> {
    let map = |e| map_sqlite_error(label, e);
    let txn = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(map)?;
    let app_id: i64 = txn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(map)?;
    let version: i64 = txn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(map)?;
    let tables: i64 = txn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
            [],
            |r| r.get(0),
        )
        .map_err(map)?;
    if app_id == 0 && version == 0 && tables == 0 {
        migrate(&txn, 0, label)?;
        return txn.commit().map_err(map);
    }
    if app_id != APPLICATION_ID {
        return Err(StoreError::corrupt(
            label,
            "not a rethread store (foreign SQLite file)",
        ));
    }
    let version = version as u64;
    if version > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: label.to_string(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    if version < SCHEMA_VERSION {
        migrate(&txn, version, label)?;
        return txn.commit().map_err(map);
    }
    for table in TABLES {
        let n: i64 = txn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
                [table],
                |r| r.get(0),
            )
            .map_err(map)?;
        if n != 1 {
            return Err(StoreError::corrupt(
                label,
                format!("table {table} is missing"),
            ));
        }
    }
    txn.commit().map_err(map)
}

/// Brings a store from schema `from` to [`SCHEMA_VERSION`] inside `txn`. Each step is one arm;
/// version 0 is a new, empty file.
fn migrate(txn: &rusqlite::Transaction<'_>, from: u64, label: &str) -> Result<(), StoreError> {
    let map = |e| map_sqlite_error(label, e);
    let mut version = from;
    while version < SCHEMA_VERSION {
        match version {
            0 => {
                txn.execute_batch(SCHEMA_V1).map_err(map)?;
                txn.execute_batch(LEASES_V1).map_err(map)?;
            }
            1 => {
                txn.execute_batch(LEASES_V1).map_err(map)?;
                txn.execute_batch(SCHEMA_V2_COLUMNS).map_err(map)?;
            }
            2 => txn.execute_batch(SCHEMA_V3_COLUMNS).map_err(map)?,
            // Schema 4 changed only redb stores (value checksums).
            3 => {}
            other => {
                return Err(StoreError::corrupt(
                    label,
                    format!("unknown schema version {other}"),
                ))
            }
        }
        version += 1;
    }
    // Rows of schema 1 get their checksums once every column of the current schema exists.
    if from == 1 {
        backfill_checksums(txn, label)?;
    }
    txn.execute_batch(&format!(
        "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {SCHEMA_VERSION};"
    ))
    .map_err(map)
}

/// Gives every row of a store migrated from schema 1 its checksum (inside the migration's
/// transaction). Keys and sums are collected first: SQLite does not define what a scan sees of
/// rows updated while it runs.
fn backfill_checksums(txn: &rusqlite::Transaction<'_>, label: &str) -> Result<(), StoreError> {
    let map = |e| map_sqlite_error(label, e);
    let sessions: Vec<(String, i64)> = txn
        .prepare(&format!("SELECT {RECORD_COLUMNS}, checksum FROM sessions"))
        .and_then(|mut s| {
            s.query_map([], |row| {
                let raw = raw_record(row)?;
                Ok((raw.session_id.clone(), raw.fields_checksum()))
            })?
            .collect()
        })
        .map_err(map)?;
    let mut update = txn
        .prepare("UPDATE sessions SET checksum = ?2 WHERE session_id = ?1")
        .map_err(map)?;
    for (id, sum) in sessions {
        update.execute(params![id, sum]).map_err(map)?;
    }
    let rows: Vec<(String, i64, i64)> = txn
        .prepare("SELECT session_id, seq, body FROM transcript_rows")
        .and_then(|mut s| {
            s.query_map([], |row| {
                let (id, seq, body): (String, i64, String) =
                    (row.get(0)?, row.get(1)?, row.get(2)?);
                let sum = row_checksum(&id, seq, &body);
                Ok((id, seq, sum))
            })?
            .collect()
        })
        .map_err(map)?;
    let mut update = txn
        .prepare("UPDATE transcript_rows SET checksum = ?3 WHERE session_id = ?1 AND seq = ?2")
        .map_err(map)?;
    for (id, seq, sum) in rows {
        update.execute(params![id, seq, sum]).map_err(map)?;
    }
    let leases: Vec<(String, i64)> = txn
        .prepare(&format!("SELECT {LEASE_COLUMNS}, checksum FROM leases"))
        .and_then(|mut s| {
            s.query_map([], |row| {
                let raw = RawLease::from_row(row)?;
                Ok((raw.session_id.clone(), raw.fields_checksum()))
            })?
            .collect()
        })
        .map_err(map)?;
    let mut update = txn
        .prepare("UPDATE leases SET checksum = ?2 WHERE session_id = ?1")
        .map_err(map)?;
    for (id, sum) in leases {
        update.execute(params![id, sum]).map_err(map)?;
    }
    Ok(())
}
