//! Checking a whole store ([`BindingStore::verify`]): the report, the checker that builds it,
//! and the check any store can run through its public methods (the file backends' scan is in
//! `durable/scan.rs`).

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::Result;
use crate::{check_mirror_path, BindingStore, MirroredFile, StoreError};

/// At most this many problems are listed in a report; the rest are counted.
pub const MAX_LISTED_PROBLEMS: usize = 1000;

/// What [`BindingStore::verify`] found.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// Session records read.
    pub sessions: u64,
    /// Transcript rows read.
    pub rows: u64,
    /// Lease records read (stores that keep leases in the store).
    pub leases: u64,
    /// Mirrored rollout files read, each checked against its length and CRC-32.
    pub mirror_files: u64,
    /// Their bytes.
    pub mirror_bytes: u64,
    /// Each problem found, in the order found (at most [`MAX_LISTED_PROBLEMS`]).
    pub problems: Vec<Problem>,
    /// Problems found past the listed ones.
    pub unlisted_problems: u64,
    /// Whether the check reached the end of the store (else damage stopped it: the last
    /// problem says where).
    pub complete: bool,
}

impl VerifyReport {
    /// Whether the whole store was checked and nothing was found.
    pub fn is_ok(&self) -> bool {
        self.complete && self.problems.is_empty() && self.unlisted_problems == 0
    }

    /// How many problems were found, listed or not.
    pub fn problem_count(&self) -> u64 {
        self.problems.len() as u64 + self.unlisted_problems
    }
}

/// One problem [`BindingStore::verify`] found.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// What kind of damage.
    pub kind: ProblemKind,
    /// The session concerned, when the damage is in one session's records.
    pub session_id: Option<String>,
    /// What was found, for people.
    pub detail: String,
}

/// The kinds of [`Problem`].
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// The engine's own structure is damaged (pages, B-trees, keys out of order); the check
    /// may have stopped here.
    Structure,
    /// A session record is damaged: its checksum fails, it does not decode, or it
    /// contradicts itself.
    Session,
    /// A transcript row is damaged: its checksum fails or it does not decode.
    Row,
    /// Rows a session's record counts are missing.
    MissingRows,
    /// Rows that belong to no session record, or lie past their session's row count.
    StrayRows,
    /// A lease record is damaged.
    Lease,
    /// A record of which session a thread belongs to is damaged.
    Thread,
    /// A mirrored rollout file is damaged: a chunk's checksum fails, chunks are missing, or
    /// its bytes do not give its recorded length and CRC-32.
    Mirror,
}

/// Where [`BindingStore::verify`] is, passed to its progress callback now and then.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerifyProgress {
    /// Session records checked so far.
    pub sessions: u64,
    /// Rows checked so far.
    pub rows: u64,
    /// How many session records the store holds, when known up front.
    pub total_sessions: Option<u64>,
}

/// How often the checker reports progress at most.
const PROGRESS_EVERY: Duration = Duration::from_millis(50);

/// Collects a report while a scan runs: counts, problems (listed up to the cap), progress.
pub(crate) struct Checker<'a> {
    /// Its counts (`sessions` through [`Checker::session_checked`], which reports progress).
    pub(crate) report: VerifyReport,
    total_sessions: Option<u64>,
    progress: &'a mut (dyn FnMut(&VerifyProgress) + Send),
    last_progress: Option<Instant>,
}

impl<'a> Checker<'a> {
    pub(crate) fn new(progress: &'a mut (dyn FnMut(&VerifyProgress) + Send)) -> Self {
        Checker {
            report: VerifyReport::default(),
            total_sessions: None,
            progress,
            last_progress: None,
        }
    }

    /// Says how many session records the scan will see.
    #[cfg_attr(not(any(feature = "redb", feature = "sqlite")), allow(dead_code))]
    pub(crate) fn expect_sessions(&mut self, total: u64) {
        self.total_sessions = Some(total);
        self.tick(true);
    }

    pub(crate) fn problem(&mut self, kind: ProblemKind, session_id: Option<&str>, detail: String) {
        if self.report.problems.len() < MAX_LISTED_PROBLEMS {
            self.report.problems.push(Problem {
                kind,
                session_id: session_id.map(str::to_string),
                detail,
            });
        } else {
            self.report.unlisted_problems += 1;
        }
    }

    /// Records damage (`Corrupt`) as a problem of `kind`; any other error is returned (the
    /// store could not be read).
    pub(crate) fn damage(
        &mut self,
        kind: ProblemKind,
        session_id: Option<&str>,
        error: StoreError,
    ) -> Result<()> {
        match error {
            StoreError::Corrupt { detail, .. } => {
                self.problem(kind, session_id, detail);
                Ok(())
            }
            other => Err(other),
        }
    }

    pub(crate) fn session_checked(&mut self) {
        self.report.sessions += 1;
        self.tick(false);
    }

    pub(crate) fn mirror_checked(&mut self, bytes: u64) {
        self.report.mirror_files += 1;
        self.report.mirror_bytes += bytes;
    }

    /// Whether a mirrored file's path is one a restore may write ([`check_mirror_path`]); if
    /// not, a [`ProblemKind::Mirror`].
    pub(crate) fn mirror_path_ok(&mut self, session_id: &str, file: &MirroredFile) -> bool {
        match check_mirror_path(&file.path) {
            Ok(()) => true,
            Err(why) => {
                let detail = format!("thread {}: {why}", file.thread_id);
                self.problem(ProblemKind::Mirror, Some(session_id), detail);
                false
            }
        }
    }

    fn tick(&mut self, force: bool) {
        let now = Instant::now();
        let recent = self.last_progress.is_some_and(|t| now - t < PROGRESS_EVERY);
        if recent && !force {
            return;
        }
        self.last_progress = Some(now);
        (self.progress)(&VerifyProgress {
            sessions: self.report.sessions,
            rows: self.report.rows,
            total_sessions: self.total_sessions,
        });
    }

    pub(crate) fn finish(mut self, complete: bool) -> VerifyReport {
        self.report.complete = complete;
        self.tick(true);
        self.report
    }
}

/// The check any store can run through its public methods: every session listed and
/// exported (an export checks the record, its rows and its mirrored files). It cannot see rows
/// that belong to no session.
pub(crate) async fn by_export(
    store: &BindingStore,
    progress: &mut (dyn FnMut(&VerifyProgress) + Send),
) -> Result<VerifyReport> {
    let mut checker = Checker::new(progress);
    let mut after: Option<String> = None;
    loop {
        let page = match store.list_sessions(after.as_deref(), 64).await {
            Ok(page) => page,
            Err(error) => {
                checker.damage(ProblemKind::Structure, None, error)?;
                return Ok(checker.finish(false));
            }
        };
        for listed in &page.sessions {
            let id = listed.session_id.as_str();
            match store.export_session(id).await {
                Ok(Some(export)) => {
                    checker.report.rows += export.rows.len() as u64;
                    for file in &export.record.mirror.files {
                        if checker.mirror_path_ok(id, file) {
                            checker.mirror_checked(file.len);
                        }
                    }
                }
                // Deleted since it was listed.
                Ok(None) => continue,
                Err(error) => checker.damage(ProblemKind::Session, Some(id), error)?,
            }
            checker.session_checked();
        }
        match page.next_after {
            Some(next) => after = Some(next),
            None => return Ok(checker.finish(true)),
        }
    }
}
