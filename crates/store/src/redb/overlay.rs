//! The storage of a redb store opened read-only: the file, with every write redb makes kept
//! in memory instead (its recovery flag, a crashed file's repair, the header it writes on
//! close), so redb still runs its writable open and its integrity check (its own
//! `ReadOnlyDatabase` checks nothing, and reads a damaged file as a store with no tables).
//! Every lock is taken shared: readers share the file, and a writer is refused while one
//! reads, as it is while another writes.

use crate::Unpoisoned;
use std::ops::Bound;
use std::sync::Mutex;

use ::redb::backends::FileBackend;
use ::redb::{BackendError, StorageBackend};

#[derive(Debug)]
pub(super) struct Overlay {
    file: FileBackend,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The storage's length as redb last set it.
    len: u64,
    /// The file's bytes below this offset are the storage's (a shrink hides the rest).
    file_visible: u64,
    /// What redb wrote, in order (a later write wins where two overlap).
    written: Vec<(u64, Vec<u8>)>,
}

impl Overlay {
    pub(super) fn new(file: FileBackend) -> std::io::Result<Overlay> {
        let len = file.len()?;
        Ok(Overlay {
            file,
            state: Mutex::new(State {
                len,
                file_visible: len,
                written: Vec::new(),
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unpoisoned()
    }
}

fn past_end() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "read past the end")
}

impl StorageBackend for Overlay {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.state().len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        let state = self.state();
        let end = offset + out.len() as u64;
        if end > state.len {
            return Err(past_end());
        }
        // The file's part, zeros past it, then every write over them.
        let from_file = state
            .file_visible
            .saturating_sub(offset)
            .min(out.len() as u64) as usize;
        out[from_file..].fill(0);
        if from_file > 0 {
            self.file.read(offset, &mut out[..from_file])?;
        }
        for (at, bytes) in &state.written {
            let start = offset.max(*at);
            let stop = end.min(at + bytes.len() as u64);
            if start < stop {
                out[(start - offset) as usize..(stop - offset) as usize]
                    .copy_from_slice(&bytes[(start - at) as usize..(stop - at) as usize]);
            }
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        let mut state = self.state();
        state.len = len;
        state.file_visible = state.file_visible.min(len);
        for (at, bytes) in &mut state.written {
            bytes.truncate(len.saturating_sub(*at) as usize);
        }
        state.written.retain(|(_, bytes)| !bytes.is_empty());
        Ok(())
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let mut state = self.state();
        if offset + data.len() as u64 > state.len {
            return Err(past_end());
        }
        // redb rewrites the same pages (its headers) over and over: keep one copy of each.
        match state
            .written
            .iter()
            .position(|(at, bytes)| *at == offset && bytes.len() == data.len())
        {
            Some(i) => {
                let mut same = state.written.remove(i);
                same.1.copy_from_slice(data);
                state.written.push(same);
            }
            None => state.written.push((offset, data.to_vec())),
        }
        Ok(())
    }

    fn close(&self) -> Result<(), std::io::Error> {
        self.file.close()
    }

    fn try_lock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_shared_range(s, e)
    }

    fn try_lock_shared_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_shared_range(s, e)
    }

    fn lock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_shared_range(s, e)
    }

    fn lock_shared_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_shared_range(s, e)
    }

    fn unlock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<(), BackendError> {
        self.file.unlock_range(s, e)
    }

    fn query_lock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<bool, BackendError> {
        self.file.query_lock_range(s, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlay_of(bytes: &[u8]) -> (tempfile::NamedTempFile, Overlay) {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, bytes).unwrap();
        let backend = FileBackend::new(std::fs::File::open(file.path()).unwrap()).unwrap();
        (file, Overlay::new(backend).unwrap())
    }

    fn read(overlay: &Overlay, offset: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0xAA; len];
        overlay.read(offset, &mut out).unwrap();
        out
    }

    /// Reads see the file under the writes, the later of two overlapping writes, zeros where
    /// the storage grew, and nothing the storage shrank away; the file never changes.
    #[test]
    fn writes_stay_in_memory_and_reads_see_them_over_the_file() {
        let (file, overlay) = overlay_of(b"abcdefgh");
        overlay.write(2, b"XY").unwrap();
        overlay.write(3, b"Z").unwrap();
        assert_eq!(read(&overlay, 0, 8), b"abXZefgh");
        overlay.write(2, b"xy").unwrap();
        assert_eq!(
            read(&overlay, 0, 8),
            b"abxyefgh",
            "a rewrite of the same range wins"
        );
        overlay.set_len(12).unwrap();
        assert_eq!(read(&overlay, 6, 6), b"gh\0\0\0\0");
        overlay.set_len(3).unwrap();
        overlay.set_len(6).unwrap();
        assert_eq!(
            read(&overlay, 0, 6),
            b"abx\0\0\0",
            "a shrink forgets the bytes past it"
        );
        assert!(overlay.read(4, &mut [0; 4]).is_err(), "past the end");
        assert!(overlay.write(5, b"12").is_err(), "past the end");
        assert_eq!(std::fs::read(file.path()).unwrap(), b"abcdefgh");
    }
}
