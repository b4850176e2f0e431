//! What the store holds of one local rollout file ([`KnownFile`]), and the checks that it is
//! still the file's start (`docs/design.md`, "What a commit checks"): for a plain file, a
//! check whose cost does not grow with the file (its identity, its length, and the CRC-32 of
//! a window at each end of what the store holds); for a compressed one, or a plain one that is
//! no longer the file the store took its bytes from, the whole held prefix read through.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, MetadataExt};

/// The bytes of each window: the first and the last this many of what the store holds.
pub(super) const WINDOW: usize = 64 << 10;

/// What the store holds of one local file: its first `len` bytes, CRC-32 `crc32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct KnownFile {
    pub(super) len: u64,
    pub(super) crc32: u32,
    /// The plain file the store took them from and its windows' CRC-32s; `None` for a
    /// compressed file (read through every time).
    pub(super) witness: Option<Witness>,
}

/// A plain file's identity and the CRC-32s of the windows of its first `len` bytes
/// ([`Windows`]), remembered when the store took them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Witness {
    /// `(device, inode)`: a file replaced (a temp file renamed over it) is another file.
    id: (u64, u64),
    head: u32,
    tail: u32,
}

/// The identity of an open file: `(device, inode)`.
pub(super) fn file_id(file: &File) -> io::Result<(u64, u64)> {
    let meta = file.metadata()?;
    Ok((meta.dev(), meta.ino()))
}

/// The first and the last [`WINDOW`] bytes of a file's first `len` bytes (the whole of them,
/// twice, when they are fewer).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Windows {
    head: Vec<u8>,
    tail: Vec<u8>,
}

impl Windows {
    /// The windows of the first `len` bytes of `file`, read at their offsets; `None` when the
    /// file is shorter.
    pub(super) fn read(file: &File, len: u64) -> io::Result<Option<Windows>> {
        let size = len.min(WINDOW as u64) as usize;
        let (mut head, mut tail) = (vec![0; size], vec![0; size]);
        let read = file
            .read_exact_at(&mut head, 0)
            .and_then(|()| file.read_exact_at(&mut tail, len - size as u64));
        match read {
            Ok(()) => Ok(Some(Windows { head, tail })),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The witness of a file with identity `id` whose held bytes have these windows.
    pub(super) fn witness(&self, id: (u64, u64)) -> Witness {
        Witness {
            id,
            head: crc32fast::hash(&self.head),
            tail: crc32fast::hash(&self.tail),
        }
    }

    /// The windows of the bytes these are the windows of, followed by `bytes`.
    pub(super) fn extended(&self, bytes: &[u8]) -> Windows {
        let mut head = self.head.clone();
        if head.len() < WINDOW {
            // The head window held all the bytes: it fills up from the new ones.
            head.extend_from_slice(&bytes[..bytes.len().min(WINDOW - head.len())]);
        }
        let tail = if bytes.len() >= WINDOW {
            bytes[bytes.len() - WINDOW..].to_vec()
        } else {
            let keep = self.tail.len().min(WINDOW - bytes.len());
            [&self.tail[self.tail.len() - keep..], bytes].concat()
        };
        Windows { head, tail }
    }
}

impl KnownFile {
    /// What the store holds once it holds `bytes` after `base` (from nothing when `base` is
    /// `None`), `base` having windows `windows`, in the file of identity `id` (`None`:
    /// compressed).
    pub(super) fn after(
        base: Option<(KnownFile, Windows)>,
        bytes: &[u8],
        id: Option<(u64, u64)>,
    ) -> KnownFile {
        let (len, crc32, windows) = match base {
            Some((k, windows)) => (
                k.len + bytes.len() as u64,
                rethread_store::crc32_extend(k.crc32, k.len, bytes),
                windows.extended(bytes),
            ),
            None => (
                bytes.len() as u64,
                crc32fast::hash(bytes),
                Windows::default().extended(bytes),
            ),
        };
        KnownFile {
            len,
            crc32,
            witness: id.map(|id| windows.witness(id)),
        }
    }

    /// The windows of what the store holds, when `file` (plain, identity `id`) is still the
    /// file it took them from, at least as long, with the same bytes in both windows; `None`
    /// otherwise (then only reading the whole prefix can tell). Reads at most 2 × [`WINDOW`]
    /// bytes, whatever the file's length.
    pub(super) fn windows_in(&self, file: &File, id: (u64, u64)) -> io::Result<Option<Windows>> {
        let Some(witness) = self.witness.filter(|w| w.id == id) else {
            return Ok(None);
        };
        if file.metadata()?.len() < self.len {
            return Ok(None);
        }
        let windows = Windows::read(file, self.len)?;
        Ok(windows.filter(|w| w.witness(id) == witness))
    }
}

/// The CRC-32 and the windows of the next `len` bytes of `reader` (a file just opened: its
/// first), read in chunks; `None` when it is shorter.
pub(super) fn read_prefix(reader: &mut dyn Read, len: u64) -> io::Result<Option<(u32, Windows)>> {
    let mut crc = crc32fast::Hasher::new();
    let mut windows = Windows::default();
    let tail_from = len.saturating_sub(WINDOW as u64);
    let mut buffer = vec![0; (1 << 18).min(len as usize)];
    let mut prefix = reader.take(len);
    let mut read = 0u64;
    loop {
        match prefix.read(&mut buffer)? {
            0 => return Ok((read == len).then(|| (crc.finalize(), windows))),
            n => {
                let chunk = &buffer[..n];
                crc.update(chunk);
                let head_room = WINDOW.saturating_sub(windows.head.len()).min(n);
                windows.head.extend_from_slice(&chunk[..head_room]);
                let end = read + n as u64;
                if end > tail_from {
                    let skip = tail_from.saturating_sub(read) as usize;
                    windows.tail.extend_from_slice(&chunk[skip..]);
                }
                read = end;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The windows of `bytes`, as a file holding them gives them.
    fn of(bytes: &[u8]) -> Windows {
        let mut file = tempfile::tempfile().unwrap();
        io::Write::write_all(&mut file, bytes).unwrap();
        Windows::read(&file, bytes.len() as u64).unwrap().unwrap()
    }

    #[test]
    fn windows_are_the_same_read_streamed_or_extended() {
        let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        for len in [
            0,
            10,
            WINDOW - 1,
            WINDOW,
            WINDOW + 1,
            2 * WINDOW + 5,
            300_000,
        ] {
            let want = of(&bytes[..len]);
            let (crc, streamed) = read_prefix(&mut &bytes[..], len as u64).unwrap().unwrap();
            assert_eq!(crc, crc32fast::hash(&bytes[..len]), "{len}");
            assert_eq!(streamed, want, "{len}");
            for cut in [0, len.min(1), len / 2, len.saturating_sub(WINDOW), len] {
                let extended = of(&bytes[..cut]).extended(&bytes[cut..len]);
                assert_eq!(extended, want, "{len} cut at {cut}");
            }
        }
        assert_eq!(read_prefix(&mut &bytes[..5], 6).unwrap(), None);
    }
}
