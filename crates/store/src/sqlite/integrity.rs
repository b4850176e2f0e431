//! The whole-store check of a SQLite store ([`BindingStore::verify`](crate::BindingStore)):
//! page structure (`PRAGMA quick_check`), then every record, on one snapshot. A checksum alone
//! cannot see a row whose *key* changed, so the scan also checks that each session has exactly
//! the rows `0..row_count` and that no other rows exist.

use rusqlite::{Connection, Statement};

use super::txn::Txn;
use super::txn::{
    decode_lease, decode_record, raw_lease, raw_record, RawRow, LEASE_COLUMNS, RECORD_COLUMNS,
};
use super::{map_sqlite_error, SqliteResult};
use crate::checksum::{thread_checksum, verify as verify_sum};
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
    // One deferred transaction: the structure check and the scans see one committed state
    // while other processes write.
    let txn = conn.transaction().sqlite(label)?;
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
            checker.damage(ProblemKind::Structure, None, map_sqlite_error(label, error))?;
            return Ok(false);
        }
    }
    let sessions_sql = format!("SELECT {RECORD_COLUMNS} FROM sessions ORDER BY session_id");
    let rows_sql = format!(
        "SELECT {} FROM transcript_rows ORDER BY session_id, seq",
        RawRow::COLUMNS
    );
    let mut sessions_stmt = txn.prepare(&sessions_sql).sqlite(label)?;
    let mut rows_stmt = txn.prepare(&rows_sql).sqlite(label)?;
    let mut sessions = scan(&mut sessions_stmt, label, |row| {
        let raw = raw_record(row).sqlite(label)?;
        let id = raw.0.session_id.clone();
        Ok(ScannedSession::of(&id, decode_record(label, raw)))
    })?;
    let mut rows = scan(&mut rows_stmt, label, |row| {
        let raw = RawRow::from_row(row).sqlite(label)?;
        Ok(ScannedRow {
            body: raw.verify(label),
            session_id: raw.session_id,
            seq: u64::try_from(raw.seq).unwrap_or(u64::MAX),
        })
    })?;
    let scanned = merge_scan(checker, &mut sessions, &mut rows)?;
    drop((sessions, rows));
    drop((sessions_stmt, rows_stmt));
    check_mirrors(&mut Txn::new(&txn, label), checker, scanned.mirrors)?;
    if !scanned.complete
        || !verify_leases(&txn, label, checker)?
        || !verify_threads(&txn, label, checker)?
    {
        return Ok(false);
    }
    txn.commit().sqlite(label)?;
    Ok(true)
}

/// Checks every lease record. Returns whether the check reached the end.
fn verify_leases(conn: &Connection, label: &str, checker: &mut Checker<'_>) -> Result<bool> {
    let sql = format!("SELECT {LEASE_COLUMNS} FROM leases");
    verify_records(conn, label, checker, &sql, ProblemKind::Lease, |row| {
        let raw = raw_lease(row).sqlite(label)?;
        let session_id = raw.0.session_id.clone();
        Ok((session_id, decode_lease(label, raw).map(drop)))
    })
}

/// Checks every thread-ownership record. Returns whether the check reached the end.
fn verify_threads(conn: &Connection, label: &str, checker: &mut Checker<'_>) -> Result<bool> {
    let sql = "SELECT thread_id, session_id, checksum FROM threads";
    verify_records(conn, label, checker, sql, ProblemKind::Thread, |row| {
        let (thread, session, sum): (String, String, i64) = <_>::try_from(row).sqlite(label)?;
        let what = || format!("owner of thread {thread}");
        let checked = verify_sum(
            label,
            what,
            sum,
            thread_checksum(&thread, session.as_bytes()),
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
    let mut statement = conn.prepare(sql).sqlite(label)?;
    for record in scan(&mut statement, label, read)? {
        match record {
            Ok((session_id, checked)) => {
                if kind == ProblemKind::Lease {
                    checker.report.leases += 1;
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
    let mut statement = conn.prepare("PRAGMA quick_check").sqlite(label)?;
    let lines = statement.query_map([], |row| row.get::<_, String>(0));
    let lines: Vec<String> = lines
        .sqlite(label)?
        .collect::<Result<_, _>>()
        .sqlite(label)?;
    if lines.len() == 1 && lines[0] == "ok" {
        return Ok(Vec::new());
    }
    Ok(lines
        .into_iter()
        .map(|line| format!("SQLite structure check: {line}"))
        .collect())
}

/// The rows of `statement` as an iterator of `read(row)` (its consumers stop at an error).
fn scan<'s, T: 's>(
    statement: &'s mut Statement<'_>,
    label: &'s str,
    read: impl Fn(&rusqlite::Row<'_>) -> Result<T> + 's,
) -> Result<impl Iterator<Item = Result<T>> + 's> {
    let rows = statement
        .query_map([], move |row| Ok(read(row)))
        .sqlite(label)?;
    Ok(rows.map(move |item| item.sqlite(label)?))
}
