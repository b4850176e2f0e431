//! The whole-store check of a SQLite store ([`BindingStore::verify`](crate::BindingStore)):
//! page structure (`PRAGMA quick_check`), then every record, on one snapshot. A checksum alone
//! cannot see a row whose *key* changed, so the scan also checks that each session has exactly
//! the rows `0..row_count` and that no other rows exist.

use rusqlite::{Connection, Statement};

use super::txn::{view, SqliteRow};
use super::{map_sqlite_error, SqliteResult};
use crate::checksum::{thread_checksum, verify as verify_sum};
use crate::durable::{check_mirrors, merge_scan, ScannedRow, ScannedSession};
use crate::sql::{row_checksum, LeaseColumns, RecordColumns, SqlRow};
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
    let sessions_sql = format!(
        "SELECT {}, checksum FROM sessions ORDER BY session_id",
        RecordColumns::ALL
    );
    let rows_sql = "SELECT session_id, seq, body, checksum FROM transcript_rows \
                    ORDER BY session_id, seq";
    let mut sessions_stmt = txn.prepare(&sessions_sql).sqlite(label)?;
    let mut rows_stmt = txn.prepare(rows_sql).sqlite(label)?;
    let mut sessions = scan(&mut sessions_stmt, label, |row| {
        let columns = RecordColumns::read(row)?;
        let (id, sum) = (columns.session_id.clone(), row.int(8)?);
        let what = || format!("session {id}");
        let record = verify_sum(label, what, sum, columns.checksum())
            .and_then(|()| columns.into_record(label));
        Ok(ScannedSession::of(&id, record))
    })?;
    let mut rows = scan(&mut rows_stmt, label, |row| {
        let (session_id, seq, body) = (row.str(0)?, row.int(1)?, row.str(2)?);
        let what = || format!("row {seq} of session {session_id}");
        let sum = row_checksum(session_id, seq, body);
        Ok(ScannedRow {
            body: verify_sum(label, what, row.int(3)?, sum),
            session_id: session_id.to_owned(),
            seq: u64::try_from(seq).unwrap_or(u64::MAX),
        })
    })?;
    let scanned = merge_scan(checker, &mut sessions, &mut rows)?;
    drop((sessions, rows));
    drop((sessions_stmt, rows_stmt));
    check_mirrors(&mut view(&txn, label), checker, scanned.mirrors)?;
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
    let sql = format!("SELECT {}, checksum FROM leases", LeaseColumns::ALL);
    verify_records(conn, label, checker, &sql, ProblemKind::Lease, |row| {
        let columns = LeaseColumns::read(row)?;
        let (id, sum) = (columns.session_id.clone(), row.int(11)?);
        let what = || format!("lease of session {id}");
        let grant = verify_sum(label, what, sum, columns.checksum())
            .and_then(|()| columns.into_grant(label).map(drop));
        Ok((id, grant))
    })
}

/// Checks every thread-ownership record. Returns whether the check reached the end.
fn verify_threads(conn: &Connection, label: &str, checker: &mut Checker<'_>) -> Result<bool> {
    let sql = "SELECT thread_id, session_id, checksum FROM threads";
    verify_records(conn, label, checker, sql, ProblemKind::Thread, |row| {
        let (thread, session, sum) = (row.str(0)?, row.str(1)?, row.int(2)?);
        let what = || format!("owner of thread {thread}");
        let checked = verify_sum(
            label,
            what,
            sum,
            thread_checksum(thread, session.as_bytes()),
        );
        Ok((session.to_owned(), checked))
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
    read: impl Fn(&SqliteRow<'_, '_>) -> Result<(String, Result<()>)>,
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
    read: impl Fn(&SqliteRow<'_, '_>) -> Result<T> + 's,
) -> Result<impl Iterator<Item = Result<T>> + 's> {
    let rows = statement
        .query_map([], move |row| Ok(read(&SqliteRow { row, label })))
        .sqlite(label)?;
    Ok(rows.map(move |item| item.sqlite(label)?))
}
