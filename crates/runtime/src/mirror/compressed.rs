//! codex's compressed rollouts (`rollout-*.jsonl.zst`, written by its
//! `local_thread_store_compression` feature; `docs/design.md`, "codex's compressed rollouts"):
//! a rollout file opened as codex reads it, its decoder's errors told from the disk's.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::{io_error, MirrorError};

/// The suffix codex gives a rollout it compressed: `rollout-*.jsonl.zst` holds the zstd
/// frames of `rollout-*.jsonl`.
pub(super) const COMPRESSED: &str = ".zst";

/// The name of a rollout's plain file, given the name of either of its forms.
pub(super) fn plain_name(name: &str) -> &str {
    name.strip_suffix(COMPRESSED).unwrap_or(name)
}

/// The compressed form of the plain file at `plain`.
pub(super) fn compressed_path(plain: &Path) -> PathBuf {
    let mut path = plain.as_os_str().to_owned();
    path.push(COMPRESSED);
    PathBuf::from(path)
}

/// A rollout file opened as codex reads it.
pub(super) struct Rollout {
    /// Its JSONL bytes, decompressed as they are read when the file is compressed.
    pub(super) reader: Box<dyn Read + Send>,
    /// The file opened (the plain one, or its compressed form).
    pub(super) path: PathBuf,
    /// Whether that is the compressed form.
    pub(super) compressed: bool,
    /// The plain file, for positioned reads and its identity (the same open file as
    /// `reader`: a seek of one moves the other); `None` for a compressed one, which has no
    /// stable byte offsets.
    pub(super) plain: Option<File>,
}

/// Opens the rollout whose plain file is `plain` as codex does: the plain file when there is
/// one (codex prefers it to a compressed sibling), else the compressed one through zstd's
/// streaming decoder (nothing is read whole); `None` when neither exists.
pub(super) fn open_rollout(plain: &Path) -> Result<Option<Rollout>, MirrorError> {
    match File::open(plain) {
        Ok(file) => {
            let same = file.try_clone().map_err(io_error(plain))?;
            return Ok(Some(Rollout {
                reader: Box::new(file),
                path: plain.to_path_buf(),
                compressed: false,
                plain: Some(same),
            }));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error(plain)(e)),
    }
    let path = compressed_path(plain);
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(&path)(e)),
    };
    let decoder = zstd::stream::read::Decoder::new(FileReads(file)).map_err(io_error(&path))?;
    Ok(Some(Rollout {
        reader: Box::new(Decoded(decoder)),
        path,
        compressed: true,
        plain: None,
    }))
}

/// A read error of the file under a decoder, told apart from the decoder's own ([`Decoded`]).
#[derive(Debug)]
struct FromFile(io::Error);

impl std::fmt::Display for FromFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for FromFile {}

/// The decoder's own error: the compressed bytes are not a zstd stream.
#[derive(Debug)]
pub(super) struct Undecodable(pub(super) String);

impl std::fmt::Display for Undecodable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Undecodable {}

/// The compressed file under the decoder: its read errors are marked ([`FromFile`]).
struct FileReads(File);

impl Read for FileReads {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0
            .read(buf)
            .map_err(|e| io::Error::new(e.kind(), FromFile(e)))
    }
}

/// The decoder: a read error of the file is given back as it was (the disk's, which may
/// pass); any other is the stream's damage ([`Undecodable`], [`MirrorError::Damaged`]).
struct Decoded<R: Read>(R);

impl<R: Read> Read for Decoded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf).map_err(|e| {
            if e.get_ref().is_some_and(|inner| inner.is::<FromFile>()) {
                let inner = e
                    .into_inner()
                    .and_then(|inner| inner.downcast::<FromFile>().ok());
                if let Some(from_file) = inner {
                    return from_file.0;
                }
                return io::Error::other("the compressed rollout could not be read");
            }
            io::Error::new(io::ErrorKind::InvalidData, Undecodable(e.to_string()))
        })
    }
}
