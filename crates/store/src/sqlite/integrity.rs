//! Whole-store checks of a SQLite store: page structure (`PRAGMA quick_check`) and a scan of
//! every record. A checksum alone cannot see a row whose *key* changed (a point lookup then
//! misses it), so the scan also checks that each session has exactly the rows
//! `0..row_count` and that no other rows exist.

use rusqlite::{Connection, Row};

use super::codec::{decode_record, raw_record, RawLease, RawRow, LEASE_COLUMNS, RECORD_COLUMNS};
use super::error::map_sqlite_error;
use crate::StoreError;

/// `PRAGMA quick_check`: a damaged page structure (a B-tree that would read as empty or short)
/// is caught here and refused as `Corrupt` instead of being served. It reads the whole file,
/// once per open; damage inside a record is left to the record checksums (`verify_records`).
pub(super) fn verify_structure(conn: &Connection, label: &str) -> Result<(), StoreError> {
    let map = |e| map_sqlite_error(label, e);
    let mut statement = conn.prepare("PRAGMA quick_check").map_err(map)?;
    let problems: Vec<String> = statement
        .query_map([], |row| row.get::<_, String>(0))
        .map_err(map)?
        .collect::<Result<_, _>>()
        .map_err(map)?;
    if problems.len() == 1 && problems[0] == "ok" {
        return Ok(());
    }
    Err(StoreError::corrupt(
        label,
        format!("SQLite structure check failed: {}", problems.join("; ")),
    ))
}

/// Reads every record once and verifies it (`verify_all`).
pub(super) fn verify_records(conn: &mut Connection, label: &str) -> Result<(), StoreError> {
    let map = |e| map_sqlite_error(label, e);
    verify_all(
        conn,
        label,
        &format!("SELECT {RECORD_COLUMNS}, checksum FROM sessions ORDER BY session_id"),
        &|row| {
            let record = decode_record(label, raw_record(row).map_err(map)?)?;
            Ok(ScannedSession {
                session_id: record.session_id,
                row_count: record.row_count,
            })
        },
        &format!("SELECT {LEASE_COLUMNS}, checksum FROM leases"),
        &|row| {
            RawLease::from_row(row)
                .map_err(map)?
                .into_lease(label)
                .map(drop)
        },
    )
}

/// What a full scan needs to know about one session row.
struct ScannedSession {
    session_id: String,
    row_count: u64,
}

/// Reads every record of the store in one snapshot and checks it: every session decodes and
/// verifies (`session` does that and says how many rows it claims), every row verifies, each
/// session has exactly the rows `0..row_count`, and no row belongs to no session. Every lease
/// verifies (`lease` checks one). Runs on open, after `PRAGMA quick_check`.
fn verify_all(
    conn: &mut Connection,
    label: &str,
    sessions_query: &str,
    session: &dyn Fn(&Row<'_>) -> Result<ScannedSession, StoreError>,
    leases_query: &str,
    lease: &dyn Fn(&Row<'_>) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let map = |e| map_sqlite_error(label, e);
    // One deferred transaction: the two scans see the same committed state even while another
    // process writes.
    let txn = conn.transaction().map_err(map)?;
    {
        let mut sessions_stmt = txn.prepare(sessions_query).map_err(map)?;
        let mut rows_stmt = txn
            .prepare(&format!(
                "SELECT {} FROM transcript_rows ORDER BY session_id, seq",
                RawRow::COLUMNS
            ))
            .map_err(map)?;
        let mut sessions = sessions_stmt.query([]).map_err(map)?;
        let mut rows = rows_stmt.query([]).map_err(map)?;
        let mut next_row = || -> Result<Option<RawRow>, StoreError> {
            match rows.next().map_err(map)? {
                Some(row) => {
                    let raw = RawRow::from_row(row).map_err(map)?;
                    raw.verify(label)?;
                    Ok(Some(raw))
                }
                None => Ok(None),
            }
        };
        // Both scans are in key order, so they are merged: the rows of each session must
        // follow one another with seq 0, 1, ... row_count - 1.
        let mut pending = next_row()?;
        while let Some(row) = sessions.next().map_err(map)? {
            let scanned = session(row)?;
            for expected in 0..scanned.row_count {
                match pending.take() {
                    Some(r) if r.session_id == scanned.session_id && r.seq as u64 == expected => {}
                    found => {
                        return Err(StoreError::corrupt(
                            label,
                            format!(
                                "session {} claims {} rows but row {expected} is missing \
                                 (next row found: {})",
                                scanned.session_id,
                                scanned.row_count,
                                describe(found.as_ref())
                            ),
                        ))
                    }
                }
                pending = next_row()?;
            }
            if let Some(r) = &pending {
                if r.session_id <= scanned.session_id {
                    return Err(stray(label, r));
                }
            }
        }
        if let Some(r) = &pending {
            return Err(stray(label, r));
        }
        let mut leases_stmt = txn.prepare(leases_query).map_err(map)?;
        let mut leases = leases_stmt.query([]).map_err(map)?;
        while let Some(row) = leases.next().map_err(map)? {
            lease(row)?;
        }
    }
    txn.commit().map_err(map)
}

fn describe(row: Option<&RawRow>) -> String {
    match row {
        Some(r) => format!("row {} of session {}", r.seq, r.session_id),
        None => "none".to_string(),
    }
}

fn stray(label: &str, row: &RawRow) -> StoreError {
    StoreError::corrupt(
        label,
        format!(
            "{} belongs to no session or lies past its session's row count",
            describe(Some(row))
        ),
    )
}
