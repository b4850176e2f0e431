//! The reads that check more than one lookup. A read runs on one snapshot.

use std::io::Write;
use std::ops::Range;

use super::{check_row_ends, check_rows, load_session, mirror, FileKey, ReadTxn};
use crate::Result;
use crate::{MirroredFile, SessionExport, SessionPage, SessionRecord, StoreError, TranscriptRow};

/// [`BindingStore::rows`](crate::BindingStore::rows): exactly the rows of `range` clipped to
/// the session's row count, in order.
pub(crate) fn rows(
    txn: &mut dyn ReadTxn,
    session_id: &str,
    range: Range<u64>,
) -> Result<Vec<TranscriptRow>> {
    let Some(record) = load_session(txn, session_id)? else {
        return Ok(Vec::new());
    };
    let (start, end) = (range.start, range.end.min(record.row_count));
    if start >= end {
        return Ok(Vec::new());
    }
    let rows = txn.load_rows(session_id, start..end)?;
    check_rows(txn.label(), session_id, start, end - start, &rows)?;
    Ok(rows)
}

/// [`BindingStore::list_sessions`](crate::BindingStore::list_sessions).
pub(crate) fn list_page(
    txn: &mut dyn ReadTxn,
    after: Option<&str>,
    limit: usize,
) -> Result<SessionPage> {
    if limit == 0 {
        return Err(StoreError::InvalidInput(
            "list limit must be at least 1".to_string(),
        ));
    }
    if after.is_none() {
        check_row_ends(txn)?;
    }
    // One more than asked: whether it comes back says whether another page follows.
    let mut sessions = txn.list(after, limit.saturating_add(1))?;
    let mut next_after = None;
    if sessions.len() > limit {
        sessions.truncate(limit);
        next_after = sessions.last().map(|s| s.session_id.clone());
    }
    Ok(SessionPage {
        sessions,
        next_after,
    })
}

/// [`BindingStore::export_session`](crate::BindingStore::export_session), checked: rows
/// exactly `0..row_count`, mirrored files what the record says. Threads are sorted, so two
/// stores holding the same session export it equal.
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
/// it: one missing from the list was lost to damage, and is [`StoreError::Corrupt`].
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

/// [`BindingStore::write_mirror_file`](crate::BindingStore::write_mirror_file): the file
/// written into `out` chunk by chunk as it is read, checked as it goes.
pub(crate) fn write_mirror_file(
    txn: &mut dyn ReadTxn,
    key: FileKey<'_>,
    out: &mut dyn Write,
) -> Result<Option<MirroredFile>> {
    let Some(record) = load_session(txn, key.session_id)? else {
        return Ok(None);
    };
    let mut files = record.mirror.files_of(key.thread_id);
    let Some(file) = files.find(|f| f.path == key.path) else {
        return Ok(None);
    };
    let failed = |source| {
        StoreError::io(
            format!("the destination of the mirror of {}", file.path),
            source,
        )
    };
    mirror::stream_file(txn, key.session_id, file, &mut |chunk| {
        out.write_all(chunk).map_err(failed)
    })?;
    out.flush().map_err(failed)?;
    Ok(Some(file.clone()))
}
