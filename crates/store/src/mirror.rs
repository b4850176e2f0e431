//! The rollout mirror's data: what a store keeps of the codex rollout files of a session's
//! thread, so that the thread can be restored on a machine whose `CODEX_HOME` lacks them (the
//! rules: [`BindingStore::commit_turn`](crate::BindingStore::commit_turn)).
//!
//! Per (session, thread, path relative to `CODEX_HOME`) the store keeps the file's bytes as
//! chunks of up to 1 MiB of rollout bytes, each stored as one zstd frame (`logic::codec`, the
//! one place every engine's chunks pass through; stores written before compression keep
//! their raw chunks, see [`MirroredFile::compressed_from`]), and in the session record its
//! [`MirroredFile`] (length, CRC-32, chunk lengths, all of rollout bytes): all a writer needs
//! to compute the next append. A commit merges the newest chunks while the one before the last
//! is no longer than the last (up to 1 MiB), like a binary counter: a file of n appends is
//! O(log n) small chunks after its full ones, and a commit rewrites (decompresses and
//! compresses again) on average a few times its own delta. CRC-32 is enough: it guards against an accident (a writer whose
//! idea of the file is stale, a local copy that diverged), not an adversary; the new CRC is
//! combined from the old one and the appended bytes', without reading what is stored.

use serde::{Deserialize, Serialize};

/// The default per-session cap of mirrored bytes (1 GiB of rollout bytes, as codex wrote
/// them, not of what the store keeps of them compressed): past it mirroring stops for the
/// session. Sized for the longest sessions users report (rollouts of 92 MiB to 765 MiB).
pub const DEFAULT_MIRROR_CAP: u64 = 1024 * 1024 * 1024;

/// The largest chunk a store writes: a longer append is split, and chunks are merged up to it.
pub(crate) const MAX_CHUNK: usize = 1024 * 1024;

/// One mirrored file, as the session record holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MirroredFile {
    /// The thread the file belongs to.
    pub thread_id: String,
    /// The file's path relative to `CODEX_HOME`, `/`-separated
    /// (`sessions/YYYY/MM/DD/rollout-<ts>-<id>.jsonl`).
    pub path: String,
    /// Its length in bytes.
    pub len: u64,
    /// The CRC-32 of all its bytes.
    pub crc32: u32,
    /// The length of each chunk that holds it, in order (chunks are numbered from 0): its
    /// rollout bytes, whatever the store keeps of them.
    pub chunk_lens: Vec<u64>,
    /// The first chunk stored compressed: every chunk from it on is a zstd frame, every one
    /// before it the rollout's bytes as they are. `None` (absent from a record written before
    /// compression): every chunk is raw. A file written since is compressed from chunk 0; an
    /// older file keeps its raw chunks and compresses what is appended (and the newest chunks
    /// it merges).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compressed_from: Option<u64>,
}

impl MirroredFile {
    /// How many chunks hold it.
    pub fn chunks(&self) -> u64 {
        self.chunk_lens.len() as u64
    }

    /// Whether chunk `seq` is stored compressed.
    pub fn is_compressed(&self, seq: u64) -> bool {
        self.compressed_from.is_some_and(|first| seq >= first)
    }
}

/// A session's rollout mirror, as the session record holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MirrorState {
    /// The mirrored files, by thread then path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<MirroredFile>,
    /// Mirroring stopped for this session when a commit would have passed its cap (and its
    /// mirror was dropped: one that stopped growing would restore a thread without its later
    /// turns).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
}

impl MirrorState {
    /// The mirrored bytes of the session, all threads.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.len).sum()
    }

    /// The mirrored files of `thread_id`.
    pub fn files_of<'a>(&'a self, thread_id: &'a str) -> impl Iterator<Item = &'a MirroredFile> {
        self.files.iter().filter(move |f| f.thread_id == thread_id)
    }

    /// Whether `thread_id` has a mirror.
    pub fn has_thread(&self, thread_id: &str) -> bool {
        self.files_of(thread_id).next().is_some()
    }

    /// Whether nothing is mirrored and mirroring did not stop.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && !self.stopped
    }
}

/// What one file of the thread grew by since the writer last knew it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MirrorAppend {
    /// The file's path relative to `CODEX_HOME`, `/`-separated.
    pub path: String,
    /// The length of what these bytes extend; 0 replaces the file whole.
    pub base_len: u64,
    /// The CRC-32 of what these bytes extend (ignored when `base_len` is 0).
    pub base_crc32: u32,
    /// The new bytes.
    pub bytes: Vec<u8>,
}

impl MirrorAppend {
    /// `bytes` appended to the file whose first `base_len` bytes have CRC-32 `base_crc32`.
    pub fn extend(path: impl Into<String>, base_len: u64, base_crc32: u32, bytes: Vec<u8>) -> Self {
        MirrorAppend {
            path: path.into(),
            base_len,
            base_crc32,
            bytes,
        }
    }

    /// The whole file.
    pub fn whole(path: impl Into<String>, bytes: Vec<u8>) -> Self {
        Self::extend(path, 0, 0, bytes)
    }
}

/// What a turn's commit writes of the mirror ([`TurnCommit::mirror`](crate::TurnCommit::mirror)).
///
/// ```
/// use rethread_store::{MirrorAppend, MirrorUpdate, DEFAULT_MIRROR_CAP};
/// let update = MirrorUpdate::new(vec![MirrorAppend::whole("sessions/rollout-r.jsonl", b"{}\n".to_vec())]);
/// assert_eq!(update.cap, DEFAULT_MIRROR_CAP);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MirrorUpdate {
    /// The files of the turn's thread that grew (files not named keep what they hold).
    pub appends: Vec<MirrorAppend>,
    /// The session's cap of mirrored bytes, all its threads ([`MirrorOutcome::StoppedNow`]).
    pub cap: u64,
}

impl Default for MirrorUpdate {
    /// No appends, the default cap.
    fn default() -> Self {
        MirrorUpdate::new(Vec::new())
    }
}

impl MirrorUpdate {
    /// These appends under the default cap ([`DEFAULT_MIRROR_CAP`]).
    pub fn new(appends: Vec<MirrorAppend>) -> Self {
        MirrorUpdate {
            appends,
            cap: DEFAULT_MIRROR_CAP,
        }
    }

    /// Sets the cap.
    pub fn cap(mut self, cap: u64) -> Self {
        self.cap = cap;
        self
    }
}

/// What a commit did with the mirror ([`CommitOutcome::mirror`](crate::CommitOutcome::mirror)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mirror", rename_all = "snake_case")]
#[non_exhaustive]
pub enum MirrorOutcome {
    /// The commit carried no mirror, or its thread is retired: the thread's mirror was dropped.
    None,
    /// The appends were written.
    Mirrored,
    /// This commit would have passed the session's cap: mirroring stopped for the session, its
    /// mirror was dropped, the turn committed without it. Later commits report `Stopped`.
    StoppedNow {
        /// The mirrored bytes the session would have had.
        bytes: u64,
        /// The cap.
        cap: u64,
    },
    /// Mirroring had stopped for the session before: nothing was written.
    Stopped,
}

/// One stored chunk of a mirrored file, as an export carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MirrorChunk {
    /// The thread.
    pub thread_id: String,
    /// The file's path relative to `CODEX_HOME`.
    pub path: String,
    /// The chunk's position in its file.
    pub seq: u64,
    /// Its rollout bytes (never the store's compressed form: an export is portable between
    /// stores and checked against its record's lengths and CRC-32).
    pub bytes: Vec<u8>,
}

impl MirrorChunk {
    /// Chunk `seq` of `path` of `thread_id`.
    pub fn new(
        thread_id: impl Into<String>,
        path: impl Into<String>,
        seq: u64,
        bytes: Vec<u8>,
    ) -> Self {
        MirrorChunk {
            thread_id: thread_id.into(),
            path: path.into(),
            seq,
            bytes,
        }
    }
}

/// The CRC-32 of `a` followed by `b`, from `a`'s CRC and length and `b`'s bytes.
pub fn crc32_extend(crc: u32, len: u64, bytes: &[u8]) -> u32 {
    let mut whole = crc32fast::Hasher::new_with_initial_len(crc, len);
    let mut tail = crc32fast::Hasher::new();
    tail.update(bytes);
    whole.combine(&tail);
    whole.finalize()
}

/// Checks a mirrored file's path: relative to `CODEX_HOME`, `/`-separated, no empty, `.` or
/// `..` component, no NUL or backslash, and a codex rollout under `sessions/`
/// (`sessions/.../rollout-*.jsonl`). A restore writes the file at this path under the home, so
/// nothing stored may name a place outside it, nor any other file of the home (codex's
/// databases, config, credentials), whoever wrote the store.
pub fn check_mirror_path(path: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("mirrored path {path:?} {why}"));
    if path.is_empty() {
        return bad("is empty");
    }
    if path.starts_with('/') {
        return bad("is absolute");
    }
    if path.contains('\0') || path.contains('\\') {
        return bad("holds a NUL or a backslash");
    }
    if path
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return bad("has an empty, `.` or `..` component");
    }
    let name = match path.split_once('/') {
        Some(("sessions", rest)) => rest.rsplit('/').next().unwrap_or(rest),
        _ => return bad("is not under `sessions/`"),
    };
    if !(name.starts_with("rollout-") && name.ends_with(".jsonl")) {
        return bad("does not name a rollout file (`rollout-*.jsonl`)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_extended_crc_is_the_crc_of_the_whole() {
        let (a, b) = (b"first line\n".as_slice(), b"second line\n".as_slice());
        let whole = [a, b].concat();
        assert_eq!(
            crc32_extend(crc32fast::hash(a), a.len() as u64, b),
            crc32fast::hash(&whole)
        );
        assert_eq!(crc32_extend(0, 0, &whole), crc32fast::hash(&whole));
    }

    /// A restore writes what the store names: nothing outside the home, and under it only a
    /// rollout under `sessions/`, never codex's databases, its config or its credentials,
    /// whoever wrote the store.
    #[test]
    fn only_a_rollout_under_sessions_is_a_mirrored_path() {
        for bad in [
            "",
            "/etc/passwd",
            "a/../b",
            "../x",
            "a//b",
            "./a",
            "a\\b",
            "a\0",
            "sessions/../config.toml",
            "state_5.sqlite",
            "thread_history_1.sqlite",
            "config.toml",
            "auth.json",
            "rollout-x.jsonl",
            "sessions/state_5.sqlite",
            "sessions/2026/12/01/config.toml",
            "sessions/2026/12/01/rollout-x.json",
            "sessions/2026/12/01/rollout-x.jsonl.tmp",
            "sessions/2026/12/01/.rethread-restore-1-0-rollout-x.jsonl.tmp",
            "archived_sessions/rollout-x.jsonl",
            "log/rollout-x.jsonl",
        ] {
            assert!(check_mirror_path(bad).is_err(), "{bad:?}");
        }
        check_mirror_path("sessions/2026/12/01/rollout-x.jsonl").unwrap();
        check_mirror_path("sessions/rollout-x.jsonl").unwrap();
    }
}
