//! The reads, each with its typed output and its checks. A read runs on one snapshot.

use std::io::Write;
use std::ops::Range;
use std::sync::Mutex;

use super::{check_row_ends, check_rows, load_session, mirror, ReadTxn};
use crate::Result;
use crate::{MirroredFile, SessionExport, SessionPage, SessionRecord, StoreError, TranscriptRow};

/// One read: how it runs on a snapshot.
pub(crate) trait ReadOp: Send + 'static {
    /// What the read returns.
    type Output: Send + 'static;
    /// Runs the read on `txn`.
    fn run(&self, txn: &mut dyn ReadTxn) -> Result<Self::Output>;
}

/// [`BindingStore::session`](crate::BindingStore::session).
#[derive(Debug)]
pub(crate) struct GetSession(pub(crate) String);

impl ReadOp for GetSession {
    type Output = Option<SessionRecord>;

    fn run(&self, txn: &mut dyn ReadTxn) -> Result<Self::Output> {
        load_session(txn, &self.0)
    }
}

/// [`BindingStore::rows`](crate::BindingStore::rows): the range clipped to the session's row
/// count, and exactly those rows, in order.
#[derive(Debug)]
pub(crate) struct GetRows {
    pub(crate) session_id: String,
    pub(crate) range: Range<u64>,
}

impl ReadOp for GetRows {
    type Output = Vec<TranscriptRow>;

    fn run(&self, txn: &mut dyn ReadTxn) -> Result<Self::Output> {
        if self.range.start >= self.range.end {
            return Ok(Vec::new());
        }
        let Some(record) = load_session(txn, &self.session_id)? else {
            return Ok(Vec::new());
        };
        let end = self.range.end.min(record.row_count);
        if self.range.start >= end {
            return Ok(Vec::new());
        }
        let start = self.range.start;
        let rows = txn.load_rows(&self.session_id, start..end)?;
        check_rows(txn.label(), &self.session_id, start, end - start, &rows)?;
        Ok(rows)
    }
}

/// [`BindingStore::list_sessions`](crate::BindingStore::list_sessions).
#[derive(Debug)]
pub(crate) struct ListPage {
    pub(crate) after: Option<String>,
    pub(crate) limit: usize,
}

impl ReadOp for ListPage {
    type Output = SessionPage;

    fn run(&self, txn: &mut dyn ReadTxn) -> Result<Self::Output> {
        if self.limit == 0 {
            return Err(StoreError::InvalidInput(
                "list limit must be at least 1".to_string(),
            ));
        }
        if self.after.is_none() {
            check_row_ends(txn)?;
        }
        // One more than asked: whether it comes back says whether another page follows.
        let mut sessions = txn.list(self.after.as_deref(), self.limit.saturating_add(1))?;
        let next_after = if sessions.len() > self.limit {
            sessions.truncate(self.limit);
            sessions.last().map(|s| s.session_id.clone())
        } else {
            None
        };
        Ok(SessionPage {
            sessions,
            next_after,
        })
    }
}

/// [`BindingStore::export_session`](crate::BindingStore::export_session): the record and all
/// its rows from one snapshot.
#[derive(Debug)]
pub(crate) struct ExportSession(pub(crate) String);

impl ReadOp for ExportSession {
    type Output = Option<SessionExport>;

    fn run(&self, txn: &mut dyn ReadTxn) -> Result<Self::Output> {
        export(txn, &self.0)
    }
}

/// Reads one whole session and checks that its rows are exactly `0..row_count` and its
/// mirrored files what its record says. Its threads are sorted, so two stores holding the same
/// session export it equal.
pub(crate) fn export(txn: &mut dyn ReadTxn, session_id: &str) -> Result<Option<SessionExport>> {
    let Some(record) = load_session(txn, session_id)? else {
        return Ok(None);
    };
    let rows = txn.load_rows(session_id, 0..record.row_count)?;
    check_rows(txn.label(), session_id, 0, record.row_count, &rows)?;
    let mirror = mirror::export(txn, &record)?;
    let threads = session_threads(txn, &record)?;
    Ok(Some(SessionExport {
        record,
        rows,
        mirror,
        threads,
    }))
}

/// The threads of `record`'s session, sorted. Every thread the record names was claimed with
/// it: one missing from the list was lost to damage (a row of the threads table changed
/// outside rethread), and is [`StoreError::Corrupt`], never an answer without it.
pub(crate) fn session_threads(
    txn: &mut dyn ReadTxn,
    record: &SessionRecord,
) -> Result<Vec<String>> {
    let mut threads = txn.session_threads(&record.session_id)?;
    threads.sort_unstable();
    if let Some(missing) = record
        .named_threads()
        .find(|named| threads.binary_search_by(|t| t.as_str().cmp(named)).is_err())
    {
        return Err(StoreError::corrupt(
            txn.label(),
            format!(
                "thread {missing} of session {} is missing from its threads",
                record.session_id
            ),
        ));
    }
    Ok(threads)
}

/// One mirrored file, named as [`WriteMirrorFile`] is asked for it.
#[derive(Debug)]
pub(crate) struct MirrorFileRef {
    pub(crate) session_id: String,
    pub(crate) thread_id: String,
    pub(crate) path: String,
}

impl MirrorFileRef {
    /// The file's entry in the session's record, if the session mirrors it.
    fn stored(&self, txn: &mut dyn ReadTxn) -> Result<Option<MirroredFile>> {
        let Some(record) = load_session(txn, &self.session_id)? else {
            return Ok(None);
        };
        let file = record
            .mirror
            .files_of(&self.thread_id)
            .find(|f| f.path == self.path)
            .cloned();
        Ok(file)
    }
}

/// [`BindingStore::write_mirror_file`](crate::BindingStore::write_mirror_file): one mirrored
/// file written into `out` chunk by chunk as it is read, checked as it goes.
pub(crate) struct WriteMirrorFile {
    pub(crate) file: MirrorFileRef,
    pub(crate) out: Mutex<Box<dyn Write + Send>>,
}

impl ReadOp for WriteMirrorFile {
    type Output = Option<MirroredFile>;

    fn run(&self, txn: &mut dyn ReadTxn) -> Result<Self::Output> {
        let Some(file) = self.file.stored(txn)? else {
            return Ok(None);
        };
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let failed = |source| StoreError::Io {
            path: format!("the destination of the mirror of {}", file.path),
            source,
        };
        mirror::stream_file(txn, &self.file.session_id, &file, &mut |chunk| {
            out.write_all(chunk).map_err(failed)
        })?;
        out.flush().map_err(failed)?;
        Ok(Some(file))
    }
}

/// [`BindingStore::thread_session`](crate::BindingStore::thread_session).
#[derive(Debug)]
pub(crate) struct ThreadSession(pub(crate) String);

impl ReadOp for ThreadSession {
    type Output = Option<String>;

    fn run(&self, txn: &mut dyn ReadTxn) -> Result<Self::Output> {
        txn.thread_owner(&self.0)
    }
}
