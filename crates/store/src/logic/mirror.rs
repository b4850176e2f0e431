//! The rules of the rollout mirror (see `crate::mirror`): what a commit does with its
//! [`MirrorUpdate`], decided before anything is written, and the checks of a stored file.

use std::ops::Range;

use super::codec::{self, Decoder};
use super::{FileKey, ReadTxn, WriteTxn};
use crate::mirror::MAX_CHUNK;
use crate::Result;
use crate::{
    check_mirror_path, crc32_extend, MirrorChunk, MirrorOutcome, MirrorUpdate, MirroredFile,
    SessionRecord, StoreError,
};

/// What a commit will do with the mirror, decided before its first write.
#[derive(Debug)]
pub(crate) enum Plan<'a> {
    /// No mirror in the commit, or a retired thread: the thread's files go.
    Drop,
    /// The commit would pass the cap: every file of the session goes, mirroring stops.
    Stop { bytes: u64, cap: u64 },
    /// Mirroring stopped before: nothing happens.
    Stopped,
    /// These files are written.
    Write(Vec<FileWrite<'a>>),
}

#[derive(Debug)]
pub(crate) struct FileWrite<'a> {
    path: &'a str,
    /// Replace the stored file (base length 0) rather than append to it.
    replace: bool,
    bytes: &'a [u8],
    len: u64,
    crc32: u32,
}

/// Decides what `update` does to `record`'s mirror of `thread_id`, refusing an append that
/// does not extend the stored file ([`StoreError::MirrorMismatch`]) and malformed input.
pub(crate) fn plan<'a>(
    record: &SessionRecord,
    thread_id: &str,
    update: Option<&'a MirrorUpdate>,
    retired: bool,
) -> Result<Plan<'a>> {
    let Some(update) = update.filter(|_| !retired) else {
        return Ok(Plan::Drop);
    };
    if record.mirror.stopped {
        return Ok(Plan::Stopped);
    }
    let mut writes: Vec<FileWrite<'a>> = Vec::new();
    for append in &update.appends {
        let (path, bytes) = (append.path.as_str(), append.bytes.as_slice());
        check_mirror_path(path).map_err(StoreError::InvalidInput)?;
        if writes.iter().any(|w| w.path == path) {
            let detail = format!("the mirror update names {path} twice");
            return Err(StoreError::InvalidInput(detail));
        }
        let stored = record.mirror.files_of(thread_id).find(|f| f.path == path);
        let (base_len, base_crc32) = (append.base_len, append.base_crc32);
        let replace = base_len == 0;
        if !replace && stored.is_none_or(|f| (f.len, f.crc32) != (base_len, base_crc32)) {
            let held = match stored {
                Some(f) => format!("{} bytes, CRC-32 {:08x}", f.len, f.crc32),
                None => "nothing".to_string(),
            };
            return Err(StoreError::MirrorMismatch {
                session_id: record.session_id.clone(),
                thread_id: thread_id.to_string(),
                path: path.to_string(),
                detail: format!(
                    "the append extends {base_len} bytes with CRC-32 {base_crc32:08x}; \
                     the store holds {held}"
                ),
            });
        }
        let crc32 = match replace {
            true => crc32fast::hash(bytes),
            false => crc32_extend(base_crc32, base_len, bytes),
        };
        // An empty replacement of a file never stored writes nothing.
        if !(replace && bytes.is_empty() && stored.is_none()) {
            let len = base_len + bytes.len() as u64;
            writes.push(FileWrite {
                path,
                replace,
                bytes,
                len,
                crc32,
            });
        }
    }
    let bytes: u64 = record
        .mirror
        .files
        .iter()
        .filter(|f| !(f.thread_id == thread_id && writes.iter().any(|w| w.path == f.path)))
        .map(|f| f.len)
        .chain(writes.iter().map(|w| w.len))
        .sum();
    if bytes > update.cap {
        return Ok(Plan::Stop {
            bytes,
            cap: update.cap,
        });
    }
    Ok(Plan::Write(writes))
}

/// Carries `plan` out on `record` (which the caller then puts).
pub(crate) fn write(
    txn: &mut dyn WriteTxn,
    record: &mut SessionRecord,
    thread_id: &str,
    plan: Plan<'_>,
) -> Result<MirrorOutcome> {
    let session_id = record.session_id.clone();
    match plan {
        Plan::Drop => {
            drop_thread(txn, record, thread_id)?;
            Ok(MirrorOutcome::None)
        }
        Plan::Stopped => Ok(MirrorOutcome::Stopped),
        Plan::Stop { bytes, cap } => {
            for file in std::mem::take(&mut record.mirror.files) {
                txn.remove_chunks(key(&session_id, &file), 0)?;
            }
            record.mirror.stopped = true;
            Ok(MirrorOutcome::StoppedNow { bytes, cap })
        }
        Plan::Write(writes) => {
            let files = &mut record.mirror.files;
            for w in writes {
                let chunks = FileKey::new(&session_id, thread_id, w.path);
                let at = files
                    .iter()
                    .position(|f| f.thread_id == thread_id && f.path == w.path);
                let (mut lens, compressed_from) = match at {
                    Some(at) if !w.replace => (
                        std::mem::take(&mut files[at].chunk_lens),
                        files[at].compressed_from,
                    ),
                    Some(_) => {
                        txn.remove_chunks(chunks, 0)?;
                        (Vec::new(), None)
                    }
                    None => (Vec::new(), None),
                };
                // New chunks are compressed; a file stored raw before keeps its raw chunks.
                let mut compressed_from = compressed_from.unwrap_or(lens.len() as u64);
                for piece in w.bytes.chunks(MAX_CHUNK) {
                    txn.put_chunk(chunks, lens.len() as u64, &encode(piece)?)?;
                    lens.push(piece.len() as u64);
                }
                merge_tail(txn, chunks, &mut lens, &mut compressed_from)?;
                let file = MirroredFile {
                    thread_id: thread_id.to_string(),
                    path: w.path.to_string(),
                    len: w.len,
                    crc32: w.crc32,
                    chunk_lens: lens,
                    compressed_from: Some(compressed_from),
                };
                match at {
                    Some(at) => files[at] = file,
                    None => files.push(file),
                }
            }
            files.sort_by(|a, b| (&a.thread_id, &a.path).cmp(&(&b.thread_id, &b.path)));
            Ok(MirrorOutcome::Mirrored)
        }
    }
}

/// The stored form of a chunk's rollout bytes ([`codec::encode`]).
fn encode(raw: &[u8]) -> Result<Vec<u8>> {
    codec::encode(raw).map_err(StoreError::Internal)
}

/// Merges a file's newest chunks while the one before the last is no longer than the last and
/// both fit in one chunk (see `crate::mirror`): the file stays a few dozen chunks, whatever
/// its number of appends. The merged chunk is compressed, whatever its halves were.
fn merge_tail(
    txn: &mut dyn WriteTxn,
    file: FileKey<'_>,
    lens: &mut Vec<u64>,
    compressed_from: &mut u64,
) -> Result<()> {
    while let [.., before, last] = lens[..] {
        if before > last || before + last > MAX_CHUNK as u64 {
            return Ok(());
        }
        let at = lens.len() as u64 - 2;
        let mut merged = Vec::with_capacity((before + last) as usize);
        let found = read_chunks(
            txn,
            file,
            lens,
            Some(*compressed_from),
            at..at + 2,
            &mut |raw| {
                merged.extend_from_slice(raw);
                Ok(())
            },
        )?;
        if found != 2 {
            return Err(damaged(
                txn.label(),
                file,
                format!("chunks {at} and {} are not both stored", at + 1),
            ));
        }
        txn.remove_chunks(file, at)?;
        txn.put_chunk(file, at, &encode(&merged)?)?;
        lens.pop();
        *lens.last_mut().expect("two chunks") = before + last;
        *compressed_from = (*compressed_from).min(at);
    }
    Ok(())
}

/// Damage to the mirror of `file`, as errors name it.
fn damaged(label: &str, file: FileKey<'_>, detail: String) -> StoreError {
    StoreError::corrupt(
        label,
        format!(
            "mirror of {} (thread {}, session {}): {detail}",
            file.path, file.thread_id, file.session_id
        ),
    )
}

/// Hands `sink` the rollout bytes of chunks `range` of a stored file whose chunks hold `lens`
/// bytes each, decoded one at a time (chunks from `compressed_from` on are compressed) and
/// checked: each is the next in order and of its recorded length, else `Corrupt`. Returns how
/// many chunks were stored: a caller that expects them all checks the count.
fn read_chunks(
    txn: &mut dyn ReadTxn,
    file: FileKey<'_>,
    lens: &[u64],
    compressed_from: Option<u64>,
    range: Range<u64>,
    sink: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<u64> {
    let label = txn.label().to_string();
    let (start, mut next) = (range.start, range.start);
    let mut decoder = Decoder::new();
    txn.load_chunks(file, range, &mut |seq, stored| {
        if seq != next {
            return Err(damaged(
                &label,
                file,
                format!("chunk {next} reads as chunk {seq}"),
            ));
        }
        let Some(&want) = lens.get(seq as usize) else {
            return Err(damaged(
                &label,
                file,
                format!("chunk {seq} is not recorded"),
            ));
        };
        let compressed = compressed_from.is_some_and(|first| seq >= first);
        let raw = decoder
            .decode(compressed, stored, want)
            .map_err(|detail| damaged(&label, file, format!("chunk {seq} {detail}")))?;
        if raw.len() as u64 != want {
            return Err(damaged(
                &label,
                file,
                format!("chunk {seq} holds {} bytes, {want} recorded", raw.len()),
            ));
        }
        next += 1;
        sink(raw)
    })?;
    Ok(next - start)
}

fn key<'a>(session_id: &'a str, file: &'a MirroredFile) -> FileKey<'a> {
    FileKey::new(session_id, &file.thread_id, &file.path)
}

/// Removes the mirror of `thread_id` from `record` and its chunks from the store.
pub(crate) fn drop_thread(
    txn: &mut dyn WriteTxn,
    record: &mut SessionRecord,
    thread_id: &str,
) -> Result<()> {
    let (gone, kept): (Vec<_>, _) = std::mem::take(&mut record.mirror.files)
        .into_iter()
        .partition(|f| f.thread_id == thread_id);
    record.mirror.files = kept;
    for file in gone {
        txn.remove_chunks(key(&record.session_id, &file), 0)?;
    }
    Ok(())
}

/// Hands `sink` a stored file's rollout bytes chunk by chunk, in order, checked: they are
/// exactly `0..chunks`, each decoded to its recorded length, and together of the file's length
/// and CRC-32. Anything else is damage (`Corrupt`), found at the chunk that shows it, or at
/// the end for the CRC-32: a sink must not act on what it was handed until this returns `Ok`.
/// One chunk is held at a time, never the file.
pub(crate) fn stream_file(
    txn: &mut dyn ReadTxn,
    session_id: &str,
    file: &MirroredFile,
    sink: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let chunks = key(session_id, file);
    let mut len = 0u64;
    // Summed chunk by chunk while each is in the cache, not in a second pass over the file.
    let mut crc = crc32fast::Hasher::new();
    let lens = &file.chunk_lens;
    let found = read_chunks(
        txn,
        chunks,
        lens,
        file.compressed_from,
        0..file.chunks(),
        &mut |raw| {
            crc.update(raw);
            len += raw.len() as u64;
            sink(raw)
        },
    )?;
    if found != file.chunks() || len != file.len {
        let detail = format!(
            "{len} bytes in {found} chunks stored; {} bytes in {} chunks recorded",
            file.len,
            file.chunks()
        );
        return Err(damaged(txn.label(), chunks, detail));
    }
    let crc = crc.finalize();
    if crc != file.crc32 {
        let detail = format!("CRC-32 {crc:08x}, {:08x} recorded", file.crc32);
        return Err(damaged(txn.label(), chunks, detail));
    }
    Ok(())
}

/// Every chunk of `record`'s mirror, checked file by file: what an export carries.
pub(crate) fn export(txn: &mut dyn ReadTxn, record: &SessionRecord) -> Result<Vec<MirrorChunk>> {
    let mut out = Vec::new();
    for file in &record.mirror.files {
        // Pushed as they come: a damaged file fails the whole export.
        let mut seq = 0;
        stream_file(txn, &record.session_id, file, &mut |bytes| {
            out.push(MirrorChunk::new(
                &file.thread_id,
                &file.path,
                seq,
                bytes.to_vec(),
            ));
            seq += 1;
            Ok(())
        })?;
    }
    Ok(out)
}

/// Writes an export's chunks (rollout bytes, checked by [`check_export`]) in the form its
/// record names for each: compressed from the file's `compressed_from` on, raw before.
pub(crate) fn import(
    txn: &mut dyn WriteTxn,
    record: &SessionRecord,
    chunks: &[MirrorChunk],
) -> Result<()> {
    for chunk in chunks {
        let file = FileKey::new(&record.session_id, &chunk.thread_id, &chunk.path);
        let compressed = record
            .mirror
            .files_of(&chunk.thread_id)
            .find(|f| f.path == chunk.path)
            .is_some_and(|f| f.is_compressed(chunk.seq));
        match compressed {
            true => txn.put_chunk(file, chunk.seq, &encode(&chunk.bytes)?)?,
            false => txn.put_chunk(file, chunk.seq, &chunk.bytes)?,
        }
    }
    Ok(())
}

/// Checks that an export's chunks are exactly its record's files, each consistent.
pub(crate) fn check_export(record: &SessionRecord, chunks: &[MirrorChunk]) -> Result<(), String> {
    let mut at = 0;
    for file in &record.mirror.files {
        check_mirror_path(&file.path)?;
        let mut bytes = Vec::new();
        for (seq, len) in (0..).zip(&file.chunk_lens) {
            match chunks.get(at) {
                Some(c)
                    if c.thread_id == file.thread_id
                        && c.path == file.path
                        && c.seq == seq
                        && c.bytes.len() as u64 == *len =>
                {
                    bytes.extend_from_slice(&c.bytes);
                    at += 1;
                }
                _ => {
                    return Err(format!(
                        "chunk {seq} of the mirror of {} is missing or out of order",
                        file.path
                    ))
                }
            }
        }
        if bytes.len() as u64 != file.len || crc32fast::hash(&bytes) != file.crc32 {
            return Err(format!(
                "the mirror of {} is not what its record says",
                file.path
            ));
        }
    }
    if at != chunks.len() {
        return Err("the export carries mirror chunks its record does not name".to_string());
    }
    Ok(())
}
