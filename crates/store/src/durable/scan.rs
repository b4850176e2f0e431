//! The whole-store scan of the file backends: the merge of their session and row tables,
//! both read in key order.

use crate::logic::{mirror, ReadTxn};
use crate::verify::{Checker, ProblemKind};
use crate::Result;
use crate::{MirroredFile, SessionRecord, StoreError};

/// A session record as a scan reads it, in key order: its key, and its row count and mirrored
/// files or the damage that makes it unreadable.
pub(crate) struct ScannedSession {
    pub(crate) id: String,
    pub(crate) record: Result<(u64, Vec<MirroredFile>)>,
}

impl ScannedSession {
    pub(crate) fn of(id: &str, record: Result<SessionRecord>) -> Self {
        ScannedSession {
            id: id.to_string(),
            record: record.map(|r| (r.row_count, r.mirror.files)),
        }
    }
}

/// What the merge found besides problems: whether it reached the end, and the mirrored files
/// of each readable session, to check next on the same snapshot ([`check_mirrors`]).
pub(crate) struct Scanned {
    pub(crate) complete: bool,
    pub(crate) mirrors: Vec<(String, Vec<MirroredFile>)>,
}

/// Checks each readable session's threads, and every mirrored file the scan found (its
/// chunks, length and CRC-32); damage is a `Session` or `Mirror` problem.
pub(crate) fn check_mirrors(
    txn: &mut dyn ReadTxn,
    checker: &mut Checker<'_>,
    mirrors: Vec<(String, Vec<MirroredFile>)>,
) -> Result<()> {
    for (session_id, files) in mirrors {
        if let Some(record) = crate::logic::load_session(txn, &session_id).ok().flatten() {
            if let Err(error) = crate::logic::session_threads(txn, &record) {
                checker.damage(ProblemKind::Session, Some(&session_id), error)?;
            }
        }
        for file in files {
            if !checker.mirror_path_ok(&session_id, &file) {
                continue;
            }
            match mirror::stream_file(txn, &session_id, &file, &mut |_| Ok(())) {
                Ok(_) => checker.mirror_checked(file.len),
                Err(error) => checker.damage(ProblemKind::Mirror, Some(&session_id), error)?,
            }
        }
    }
    Ok(())
}

/// A row as a scan reads it, in key order; `body` is the row's damage, if any.
pub(crate) struct ScannedRow {
    pub(crate) session_id: String,
    pub(crate) seq: u64,
    pub(crate) body: Result<()>,
}

const NO_RECORD: &str = "belong to no session record";

/// That the rows `first..end` are missing, as a person counts them: `row 1`, `rows 1 to 3`.
fn missing(first: u64, end: u64) -> String {
    match end - first {
        1 => format!("row {first} is missing"),
        _ => format!("rows {first} to {} are missing", end - 1),
    }
}

/// A run of consecutive stray rows of one session, reported as one problem.
struct StrayRun {
    session_id: String,
    first: u64,
    last: u64,
    count: u64,
    why: &'static str,
}

/// The merge of the two key-ordered scans: each session has exactly the rows
/// `0..row_count`, no row belongs to no session, keys come in order. An `Err` item stops the
/// scan (recorded as a `Structure` problem when it is damage).
pub(crate) fn merge_scan(
    checker: &mut Checker<'_>,
    sessions: &mut dyn Iterator<Item = Result<ScannedSession>>,
    rows: &mut dyn Iterator<Item = Result<ScannedRow>>,
) -> Result<Scanned> {
    let mut scan = Merge {
        checker,
        rows,
        pending: None,
        last_row: None,
        stray: None,
        stopped: false,
        mirrors: Vec::new(),
    };
    scan.advance()?;
    let mut previous: Option<String> = None;
    for session in sessions {
        let session = match session {
            Ok(session) => session,
            Err(error) => {
                scan.stop(error)?;
                break;
            }
        };
        if previous.as_ref().is_some_and(|p| *p >= session.id) {
            scan.checker.problem(
                ProblemKind::Structure,
                Some(&session.id),
                format!(
                    "session keys out of order: {} after {previous:?}",
                    session.id
                ),
            );
        }
        let id = session.id.clone();
        scan.session(session)?;
        if scan.stopped {
            break;
        }
        previous = Some(id);
    }
    // Rows past the last session belong to none (none is pending once the scan stopped).
    while let Some(row) = scan.pending.take() {
        scan.stray_row(row, NO_RECORD);
        scan.advance()?;
    }
    scan.flush_stray();
    Ok(Scanned {
        complete: !scan.stopped,
        mirrors: scan.mirrors,
    })
}

struct Merge<'c, 'p, 'r> {
    checker: &'c mut Checker<'p>,
    rows: &'r mut dyn Iterator<Item = Result<ScannedRow>>,
    pending: Option<ScannedRow>,
    last_row: Option<(String, u64)>,
    stray: Option<StrayRun>,
    stopped: bool,
    mirrors: Vec<(String, Vec<MirroredFile>)>,
}

impl Merge<'_, '_, '_> {
    fn stop(&mut self, error: StoreError) -> Result<()> {
        self.stopped = true;
        self.pending = None;
        self.checker.damage(ProblemKind::Structure, None, error)
    }

    /// Reads the next row into `pending`, checking its order and its own damage.
    fn advance(&mut self) -> Result<()> {
        self.pending = None;
        let Some(next) = self.rows.next() else {
            return Ok(());
        };
        let mut row = match next {
            Ok(row) => row,
            Err(error) => return self.stop(error),
        };
        self.checker.report.rows += 1;
        let key = (row.session_id.clone(), row.seq);
        if self.last_row.as_ref().is_some_and(|last| *last >= key) {
            self.checker.problem(
                ProblemKind::Structure,
                Some(&row.session_id),
                format!(
                    "row keys out of order: row {} of session {} after {:?}",
                    row.seq, row.session_id, self.last_row
                ),
            );
        }
        self.last_row = Some(key);
        if let Err(error) = std::mem::replace(&mut row.body, Ok(())) {
            self.checker
                .damage(ProblemKind::Row, Some(&row.session_id), error)?;
        }
        self.pending = Some(row);
        Ok(())
    }

    fn session(&mut self, session: ScannedSession) -> Result<()> {
        // Rows before this session's belong to no session.
        while let Some(row) = self.pending.take_if(|row| row.session_id < session.id) {
            self.stray_row(row, NO_RECORD);
            self.advance()?;
        }
        let row_count = match session.record {
            Ok((count, files)) => {
                // Every readable session: its threads are checked with its mirror.
                self.mirrors.push((session.id.clone(), files));
                Some(count)
            }
            Err(error) => {
                self.checker
                    .damage(ProblemKind::Session, Some(&session.id), error)?;
                None
            }
        };
        let mut expected = 0u64;
        while let Some(row) = self.pending.take_if(|row| row.session_id == session.id) {
            match row_count {
                Some(count) if row.seq >= count => {
                    self.stray_row(row, "lie past their session's row count");
                }
                Some(_) if row.seq > expected => {
                    self.flush_stray();
                    self.checker.problem(
                        ProblemKind::MissingRows,
                        Some(&session.id),
                        format!("session {}: {}", session.id, missing(expected, row.seq)),
                    );
                    expected = row.seq + 1;
                }
                Some(_) if row.seq < expected => {}
                Some(_) => expected += 1,
                // The record is unreadable: its rows cannot be judged.
                None => {}
            }
            self.advance()?;
            if self.stopped {
                return Ok(());
            }
        }
        self.flush_stray();
        if let Some(count) = row_count.filter(|&count| expected < count) {
            self.checker.problem(
                ProblemKind::MissingRows,
                Some(&session.id),
                format!(
                    "session {} counts {count} rows; {}",
                    session.id,
                    missing(expected, count)
                ),
            );
        }
        self.checker.session_checked();
        Ok(())
    }

    fn stray_row(&mut self, row: ScannedRow, why: &'static str) {
        match &mut self.stray {
            Some(run) if run.session_id == row.session_id && run.why == why => {
                run.last = row.seq;
                run.count += 1;
            }
            _ => {
                self.flush_stray();
                self.stray = Some(StrayRun {
                    session_id: row.session_id,
                    first: row.seq,
                    last: row.seq,
                    count: 1,
                    why,
                });
            }
        }
    }

    fn flush_stray(&mut self) {
        if let Some(run) = self.stray.take() {
            self.checker.problem(
                ProblemKind::StrayRows,
                Some(&run.session_id),
                format!(
                    "{} row(s) of session {} (seq {}..={}) {}",
                    run.count, run.session_id, run.first, run.last, run.why
                ),
            );
        }
    }
}
