//! The whole-store check of a SQLite store ([`BindingStore::verify`](crate::BindingStore)):
//! page structure (`PRAGMA quick_check`), then every record, on one snapshot. A checksum alone
//! cannot see a row whose *key* changed (a point lookup then misses it), so the scan also
//! checks that each session has exactly the rows `0..row_count` and that no other rows exist.
//! Opening a store runs none of this (it would read the whole file on every open).

use rusqlite::{Connection, Statement};

use super::codec::{
    decode_record, raw_record, thread_checksum, RawLease, RawRow, LEASE_COLUMNS, RECORD_COLUMNS,
};
use super::error::map_sqlite_error;
use super::txn::Txn;
use crate::checksum::verify as verify_sum;
use crate::durable::{check_mirrors, merge_scan, ScannedRow, ScannedSession};
use crate::verify::{Checker, ProblemKind};
use crate::Result;

/// Checks the whole store through `conn` (see the module docs). Returns whether the check
/// reached the end.
pub(super) fn verify(
    conn: &mut Connection,
    label: &str,
    checker: &mut Checker<'_>,
) -> Result<bool> {
    let map = |e| map_sqlite_error(label, e);
    // One deferred transaction: the structure check and the scans see one committed state
    // while other processes write.
    let txn = conn.transaction().map_err(map)?;
    match quick_check(&txn, label) {
        Ok(problems) => {
            for problem in problems {
                checker.problem(ProblemKind::Structure, None, problem);
            }
        }
        Err(error) => {
            checker.damage(ProblemKind::Structure, None, error)?;
            return Ok(false);
        }
    }
    match txn.query_row("SELECT count(*) FROM sessions", [], |r| r.get::<_, i64>(0)) {
        Ok(total) => checker.expect_sessions(total.max(0) as u64),
        Err(error) => {
            checker.damage(ProblemKind::Structure, None, map(error))?;
            return Ok(false);
        }
    }
    let scanned = {
        let mut sessions_stmt = txn
            .prepare(&format!(
                "SELECT {RECORD_COLUMNS} FROM sessions ORDER BY session_id"
            ))
            .map_err(map)?;
        let mut rows_stmt = txn
            .prepare(&format!(
                "SELECT {} FROM transcript_rows ORDER BY session_id, seq",
                RawRow::COLUMNS
            ))
            .map_err(map)?;
        let mut sessions = scan(&mut sessions_stmt, label, |row| {
            let raw = raw_record(row).map_err(map)?;
            let id = raw.columns.session_id.clone();
            Ok(ScannedSession::of(&id, decode_record(label, raw)))
        })?;
        let mut rows = scan(&mut rows_stmt, label, |row| {
            let raw = RawRow::from_row(row).map_err(map)?;
            Ok(ScannedRow {
                body: raw.verify(label),
                session_id: raw.session_id,
                seq: u64::try_from(raw.seq).unwrap_or(u64::MAX),
            })
        })?;
        merge_scan(checker, &mut sessions, &mut rows)?
    };
    check_mirrors(&mut Txn { conn: &txn, label }, checker, scanned.mirrors)?;
    if !scanned.complete
        || !verify_leases(&txn, label, checker)?
        || !verify_threads(&txn, label, checker)?
    {
        return Ok(false);
    }
    txn.commit().map_err(map)?;
    Ok(true)
}

/// Checks every lease record. Returns whether the check reached the end.
fn verify_leases(conn: &Connection, label: &str, checker: &mut Checker<'_>) -> Result<bool> {
    let sql = format!("SELECT {LEASE_COLUMNS} FROM leases");
    verify_records(conn, label, checker, &sql, ProblemKind::Lease, |row| {
        let raw = RawLease::from_row(row).map_err(|e| map_sqlite_error(label, e))?;
        let session_id = raw.columns.session_id.clone();
        Ok((session_id, raw.into_grant(label).map(drop)))
    })
}

/// Checks every thread-ownership record. Returns whether the check reached the end.
fn verify_threads(conn: &Connection, label: &str, checker: &mut Checker<'_>) -> Result<bool> {
    let sql = "SELECT thread_id, session_id, checksum FROM threads";
    verify_records(conn, label, checker, sql, ProblemKind::Thread, |row| {
        let map = |e| map_sqlite_error(label, e);
        let (thread, session, sum): (String, String, i64) = (
            row.get(0).map_err(map)?,
            row.get(1).map_err(map)?,
            row.get(2).map_err(map)?,
        );
        let checked = verify_sum(
            label,
            || format!("owner of thread {thread}"),
            sum,
            thread_checksum(&thread, &session),
        );
        Ok((session, checked))
    })
}

/// Checks every record `sql` selects: `read` gives each one's session and whether it
/// verifies (damage of `kind`). A record that cannot be read at all ends the check (damage of
/// the structure). Returns whether the check reached the end.
fn verify_records(
    conn: &Connection,
    label: &str,
    checker: &mut Checker<'_>,
    sql: &str,
    kind: ProblemKind,
    read: impl Fn(&rusqlite::Row<'_>) -> Result<(String, Result<()>)>,
) -> Result<bool> {
    let mut statement = conn.prepare(sql).map_err(|e| map_sqlite_error(label, e))?;
    for record in scan(&mut statement, label, read)? {
        match record {
            Ok((session_id, checked)) => {
                if kind == ProblemKind::Lease {
                    checker.lease_checked();
                }
                if let Err(error) = checked {
                    checker.damage(kind, Some(&session_id), error)?;
                }
            }
            Err(error) => {
                checker.damage(ProblemKind::Structure, None, error)?;
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// `PRAGMA quick_check`: the problems it reports (none when it says `ok`).
fn quick_check(conn: &Connection, label: &str) -> Result<Vec<String>> {
    let map = |e| map_sqlite_error(label, e);
    let mut statement = conn.prepare("PRAGMA quick_check").map_err(map)?;
    let lines: Vec<String> = statement
        .query_map([], |row| row.get::<_, String>(0))
        .map_err(map)?
        .collect::<Result<_, _>>()
        .map_err(map)?;
    if lines.len() == 1 && lines[0] == "ok" {
        return Ok(Vec::new());
    }
    Ok(lines
        .into_iter()
        .map(|line| format!("SQLite structure check: {line}"))
        .collect())
}

/// The rows of `statement` as an iterator of `read(row)`; an error ends it.
fn scan<'s, T: 's>(
    statement: &'s mut Statement<'_>,
    label: &'s str,
    read: impl Fn(&rusqlite::Row<'_>) -> Result<T> + 's,
) -> Result<impl Iterator<Item = Result<T>> + 's> {
    let mut rows = statement
        .query([])
        .map_err(|e| map_sqlite_error(label, e))?;
    let mut failed = false;
    Ok(std::iter::from_fn(move || {
        if failed {
            return None;
        }
        match rows.next() {
            Ok(Some(row)) => {
                let item = read(row);
                failed = item.is_err();
                Some(item)
            }
            Ok(None) => None,
            Err(error) => {
                failed = true;
                Some(Err(map_sqlite_error(label, error)))
            }
        }
    }))
}
