//! [`RolloutMirror`]: the file side of the rollout mirror (`docs/design.md`, "The rollout
//! mirror" and "Moving a thread between homes"): finds a thread's rollout files under
//! `CODEX_HOME`, computes what they grew by for a turn's commit, and restores them
//! (`restore.rs`). The rules are the machine's; all file work runs on blocking threads.
//!
//! A rollout codex compressed itself (`rollout-*.jsonl.zst`, its `local_thread_store_compression`
//! feature) is the same file to the mirror: read through a streaming decoder, mirrored and
//! compared under its plain path, as the JSONL it holds (`compressed.rs`).

use rethread_store::Unpoisoned;
use std::collections::HashMap;
use std::fs::DirEntry;
use std::io::{self, BufRead, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rethread_store::{MirrorAppend, MirrorOutcome, MirrorUpdate, StoreError, DEFAULT_MIRROR_CAP};

mod compressed;
mod known;
mod restore;

use compressed::{open_rollout, plain_name, Undecodable};
use known::{file_id, read_prefix, KnownFile};

/// Codex's index of paginated threads, rebuilt from the rollout when a thread's rows are gone.
pub const HISTORY_INDEX: &str = "thread_history_1.sqlite";

/// Why the mirror could not do its part.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MirrorError {
    /// No rollout file of the thread under `CODEX_HOME/sessions`.
    #[error("no rollout of thread {thread_id} under {}", home.join("sessions").display())]
    NoRollout {
        /// The thread.
        thread_id: String,
        /// The `CODEX_HOME` searched.
        home: PathBuf,
    },
    /// A rollout codex compressed (`rollout-*.jsonl.zst`) does not decompress: codex cannot
    /// read it either. Not the store's damage, and not transient (the same bytes fail again):
    /// a restore replaces it from the mirror, as it replaces a local copy that diverged.
    #[error("{}: the compressed rollout does not decompress: {reason}", path.display())]
    Damaged {
        /// The compressed file.
        path: PathBuf,
        /// What the decoder said.
        reason: String,
    },
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The store failed, or holds a file it cannot give back.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The store names a path outside `CODEX_HOME`, or a file that is not one of the thread's
    /// rollout files: nothing is written.
    #[error("{0}")]
    BadPath(String),
    /// The blocking task running the file work was lost.
    #[error("the mirror's file work stopped: {0}")]
    Task(String),
    /// Something in the home stands where a restore must write (a link, a folder that is
    /// not one, a file that is not a regular file): nothing is written through it, and a
    /// retry cannot pass until it is removed.
    #[error("{}: {reason}; remove it for the thread to be restored here", path.display())]
    InTheWay {
        /// What stands in the way.
        path: PathBuf,
        /// What it is, for people.
        reason: String,
    },
}

impl MirrorError {
    /// Whether a retry may succeed: the store's or the disk's failure (I/O, a locked or
    /// closed store, lost file work), not a mirror that can never give the thread back (a
    /// damaged one, one naming files a restore refuses).
    pub fn is_transient(&self) -> bool {
        match self {
            MirrorError::Io { .. } | MirrorError::Task(_) => true,
            MirrorError::Store(error) => {
                !(error.is_logical()
                    || matches!(
                        error,
                        StoreError::Corrupt { .. } | StoreError::NewerSchema { .. }
                    ))
            }
            MirrorError::NoRollout { .. }
            | MirrorError::Damaged { .. }
            | MirrorError::BadPath(_)
            | MirrorError::InTheWay { .. } => false,
        }
    }
}

/// Why a restore failed, as the machine hears it
/// ([`SessionMachine::handle_restored`](crate::machine::SessionMachine::handle_restored)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RestoreFailure {
    /// What failed, for people.
    pub message: String,
    /// Whether it may pass ([`MirrorError::is_transient`]): then codex not having the thread
    /// is no loss, and the binding is kept.
    pub transient: bool,
    /// Whether something in the home stood in the restore's way
    /// ([`MirrorError::InTheWay`]): it does not pass by itself, nor is the thread lost (the
    /// store still holds it): codex not having the thread then stops the open for good,
    /// the binding kept, until it is removed.
    pub in_the_way: bool,
}

impl RestoreFailure {
    /// A failure saying `message`, that may pass when `transient`.
    pub fn new(message: impl Into<String>, transient: bool) -> Self {
        RestoreFailure {
            message: message.into(),
            transient,
            in_the_way: false,
        }
    }
}

impl From<&MirrorError> for RestoreFailure {
    fn from(error: &MirrorError) -> Self {
        RestoreFailure {
            in_the_way: matches!(error, MirrorError::InTheWay { .. }),
            ..RestoreFailure::new(error.to_string(), error.is_transient())
        }
    }
}

/// What a restore did ([`RolloutMirror::restore`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Restored {
    /// The files written from the store (paths relative to `CODEX_HOME`).
    pub written: Vec<String>,
    /// A local copy diverged from the mirror and was replaced (the mirror wins).
    pub diverged: bool,
    /// Mirroring had stopped for the session (its cap): nothing to restore, nothing to mirror.
    pub stopped: bool,
    /// Why codex's history index could not be cleared after a divergence (`thread/read` may
    /// then show the replaced history).
    pub index_error: Option<String>,
}

/// How a turn's commit went for the mirror, as the machine hears it
/// ([`SessionMachine::handle_mirrored`](crate::machine::SessionMachine::handle_mirrored)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MirrorReport {
    /// The commit took no mirror.
    Off,
    /// The rollout's growth was committed with the turn.
    Written,
    /// This commit passed the session's cap: mirroring stopped for the session.
    StoppedNow {
        /// The bytes the session's mirror would have held.
        bytes: u64,
        /// The cap.
        cap: u64,
    },
    /// Mirroring had stopped for the session before.
    Stopped,
    /// The rollout could not be read: the turn committed without its mirror.
    Failed(String),
}

impl MirrorReport {
    /// The report of a commit the store answered with `outcome`.
    pub fn of(outcome: MirrorOutcome) -> Self {
        match outcome {
            MirrorOutcome::Mirrored => MirrorReport::Written,
            MirrorOutcome::StoppedNow { bytes, cap } => MirrorReport::StoppedNow { bytes, cap },
            MirrorOutcome::Stopped => MirrorReport::Stopped,
            _ => MirrorReport::Off,
        }
    }
}

/// What this process knows of one thread's files.
#[derive(Debug, Clone, Default)]
struct Known {
    /// The directory of the thread's files, relative to the home.
    dir: Option<String>,
    /// The directories of the threads it was forked from ([`lineage`]), by thread id.
    source_dirs: HashMap<String, String>,
    files: HashMap<String, KnownFile>,
}

/// The rollout files of the threads of one `CODEX_HOME`, as one process mirrors them: it
/// remembers what the store holds of each file it mirrored or restored, so a turn's commit
/// reads only what the file grew by. Clones share what they know.
#[derive(Debug, Clone)]
pub struct RolloutMirror {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    home: PathBuf,
    cap: u64,
    known: Mutex<HashMap<String, Known>>,
}

/// A turn's mirror update and what the store will hold once it commits
/// ([`RolloutMirror::committed`]).
#[derive(Debug)]
pub struct PreparedMirror {
    /// What to commit with the turn.
    pub update: MirrorUpdate,
    thread_id: String,
    known: Known,
}

impl RolloutMirror {
    /// The mirror of the threads under `codex_home`, with the default cap.
    pub fn new(codex_home: impl Into<PathBuf>) -> Self {
        Self::with_cap(codex_home, DEFAULT_MIRROR_CAP)
    }

    /// The mirror of the threads under `codex_home`, capped at `cap` mirrored bytes per
    /// session.
    pub fn with_cap(codex_home: impl Into<PathBuf>, cap: u64) -> Self {
        let known = Mutex::default();
        let home = codex_home.into();
        RolloutMirror {
            inner: Arc::new(Inner { home, cap, known }),
        }
    }

    /// The `CODEX_HOME` it mirrors.
    pub fn home(&self) -> &Path {
        &self.inner.home
    }

    fn known(&self) -> MutexGuard<'_, HashMap<String, Known>> {
        self.inner.known.lock().unpoisoned()
    }

    /// What the thread's rollout files grew by since the store last got them, for the commit
    /// of a completed turn: the new bytes of a file this process mirrored or restored whose
    /// start is still what the store holds (checked on the file's bytes: a file rewritten in
    /// place is not grown), cut at the last newline; the whole file otherwise (base length 0).
    pub async fn prepare(&self, thread_id: &str) -> Result<PreparedMirror, MirrorError> {
        let known = self.known().get(thread_id).cloned().unwrap_or_default();
        let (home, thread_id, cap) = (
            self.home().to_owned(),
            thread_id.to_string(),
            self.inner.cap,
        );
        blocking(move || {
            let (appends, known) = grown(&home, &thread_id, &known)?;
            let update = MirrorUpdate::new(appends).cap(cap);
            Ok(PreparedMirror {
                update,
                thread_id,
                known,
            })
        })
        .await
    }

    /// The store committed `prepared`: it now holds what the local files held.
    pub fn committed(&self, prepared: PreparedMirror) {
        self.known().insert(prepared.thread_id, prepared.known);
    }

    /// Forgets what this process knew of the thread's files (the store refused an append:
    /// its idea of them was stale); the next [`RolloutMirror::prepare`] sends them whole.
    pub fn forget(&self, thread_id: &str) {
        if let Some(known) = self.known().get_mut(thread_id) {
            known.files.clear();
        }
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, MirrorError> + Send + 'static,
) -> Result<T, MirrorError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| MirrorError::Task(error.to_string()))?
}

/// The error of a read or write of `path`: [`MirrorError::Damaged`] when the decoder of a
/// compressed rollout failed ([`Decoded`]), [`MirrorError::Io`] otherwise.
fn io_error(path: &Path) -> impl FnOnce(io::Error) -> MirrorError + '_ {
    move |source| match source
        .get_ref()
        .and_then(|e| e.downcast_ref::<Undecodable>())
    {
        Some(Undecodable(reason)) => MirrorError::Damaged {
            path: path.to_path_buf(),
            reason: reason.clone(),
        },
        None => MirrorError::Io {
            path: path.to_path_buf(),
            source,
        },
    }
}

/// `bytes` up to and including their last newline (a record being written is not mirrored,
/// and 0.144.6 glues the next record onto a partial line).
fn whole_lines(bytes: &[u8]) -> &[u8] {
    match bytes.iter().rposition(|b| *b == b'\n') {
        Some(at) => &bytes[..=at],
        None => &[],
    }
}

fn parent_of(path: &str) -> Option<String> {
    path.rsplit_once('/').map(|(dir, _)| dir.to_string())
}

/// Whether `name` is a rollout file of `thread_id`: its source (`rollout-<ts>-<id>.jsonl`)
/// or a head file a paginated revert started (`rollout-<ts>-<id>_<rolloutId>.jsonl`), with
/// codex's timestamp (`YYYY-MM-DDThh-mm-ss`) and a UUID for the head's id. Parsed, not
/// searched: an id that is the start or the tail of another thread's never names that
/// thread's files (a store written outside rethread could bind such an id).
fn is_thread_file(name: &str, thread_id: &str) -> bool {
    let Some(stem) = name
        .strip_prefix("rollout-")
        .and_then(|n| n.strip_suffix(".jsonl"))
    else {
        return false;
    };
    let Some(rest) = stem
        .get(..20)
        .filter(|ts| shaped(ts, "dddd-dd-ddTdd-dd-dd-"))
        .and_then(|_| stem.get(20..))
    else {
        return false;
    };
    match rest.strip_prefix(thread_id) {
        Some("") => true,
        Some(head) => head
            .strip_prefix('_')
            .is_some_and(|id| shaped(id, "hhhhhhhh-hhhh-hhhh-hhhh-hhhhhhhhhhhh")),
        None => false,
    }
}

/// Whether `text` has `shape`: `d` a digit, `h` a hex digit, any other character itself.
fn shaped(text: &str, shape: &str) -> bool {
    text.len() == shape.len()
        && text.bytes().zip(shape.bytes()).all(|(c, want)| match want {
            b'd' => c.is_ascii_digit(),
            b'h' => c.is_ascii_hexdigit(),
            _ => c == want,
        })
}

/// The entries of `dir` (relative to `home`); none when it does not exist.
fn entries(home: &Path, dir: &str) -> Result<Vec<DirEntry>, MirrorError> {
    let abs = home.join(dir);
    match std::fs::read_dir(&abs) {
        Ok(entries) => Ok(entries.flatten().collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io_error(&abs)(e)),
    }
}

/// The thread's files (paths relative to the home, sorted) and their directory: in `hint`
/// when it still holds them, else found by walking `sessions/`, newest folders first (a
/// head file keeps its source's folder).
fn thread_files(
    home: &Path,
    thread_id: &str,
    hint: Option<&str>,
) -> Result<Option<(String, Vec<String>)>, MirrorError> {
    if let Some(dir) = hint {
        let files = files_in(home, dir, thread_id)?;
        if !files.is_empty() {
            return Ok(Some((dir.to_string(), files)));
        }
    }
    let Some(dir) = find_dir(home, "sessions", thread_id)? else {
        return Ok(None);
    };
    let files = files_in(home, &dir, thread_id)?;
    Ok(Some((dir, files)))
}

/// The thread's files in `dir`, each by its plain path, whether codex compressed it or not.
fn files_in(home: &Path, dir: &str, thread_id: &str) -> Result<Vec<String>, MirrorError> {
    let mut files: Vec<String> = entries(home, dir)?
        .into_iter()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| is_thread_file(plain_name(name), thread_id))
        .map(|name| format!("{dir}/{}", plain_name(&name)))
        .collect();
    files.sort();
    files.dedup();
    Ok(files)
}

/// The first folder under `dir` (depth first, newest name first) holding a file of the thread.
fn find_dir(home: &Path, dir: &str, thread_id: &str) -> Result<Option<String>, MirrorError> {
    let mut dirs = Vec::new();
    for entry in entries(home, dir)? {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        match entry.file_type() {
            Ok(t) if t.is_dir() => dirs.push(name),
            Ok(t) if t.is_file() && is_thread_file(plain_name(&name), thread_id) => {
                return Ok(Some(dir.to_string()))
            }
            _ => {}
        }
    }
    dirs.sort_unstable_by(|a, b| b.cmp(a));
    for sub in dirs {
        if let Some(found) = find_dir(home, &format!("{dir}/{sub}"), thread_id)? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// The appends that bring the store from `known` to the thread's files as they are now, and
/// what the store then holds.
fn grown(
    home: &Path,
    thread_id: &str,
    known: &Known,
) -> Result<(Vec<MirrorAppend>, Known), MirrorError> {
    let Some((dir, files)) = thread_files(home, thread_id, known.dir.as_deref())? else {
        return Err(MirrorError::NoRollout {
            thread_id: thread_id.to_string(),
            home: home.to_path_buf(),
        });
    };
    let (source_dirs, sources) = lineage(home, thread_id, &files, &known.source_dirs)?;
    let mut next = Known {
        dir: Some(dir),
        source_dirs,
        files: HashMap::new(),
    };
    let mut appends = Vec::new();
    for path in files.into_iter().chain(sources) {
        let (base, bytes, held) = growth(&home.join(&path), known.files.get(&path))?;
        appends.extend(match base {
            Some(_) if bytes.is_empty() => None,
            Some(k) => Some(MirrorAppend::extend(&path, k.len, k.crc32, bytes)),
            None => Some(MirrorAppend::whole(&path, bytes)),
        });
        next.files.insert(path, held);
    }
    Ok((appends, next))
}

/// What the store holds of the file at `abs` (`known`, when this process knows it) that is
/// still the file's start, the file's whole lines after it (all of them when none is), and
/// what the store holds once it has them. Another writer may have rewritten the file in place
/// or replaced it; codex may have compressed it, which changes no byte of what it holds: a
/// plain file that is still the one the store took its bytes from is checked on its windows
/// (a cost that does not grow with the file, [`KnownFile::windows_in`]); any other, on the
/// whole held prefix read through. A file that fails goes whole, never spliced onto the
/// stored start.
fn growth(
    abs: &Path,
    known: Option<&KnownFile>,
) -> Result<(Option<KnownFile>, Vec<u8>, KnownFile), MirrorError> {
    let open = || open_rollout(abs)?.ok_or_else(|| io_error(abs)(io::ErrorKind::NotFound.into()));
    let id_of = |rollout: &compressed::Rollout| {
        let id = rollout.plain.as_ref().map(file_id).transpose();
        id.map_err(io_error(&rollout.path))
    };
    let mut rollout = open()?;
    let mut id = id_of(&rollout)?;
    let mut base = None;
    if let (Some(k), Some(file), Some(id)) = (known, rollout.plain.as_mut(), id) {
        if let Some(windows) = k.windows_in(file, id).map_err(io_error(&rollout.path))? {
            // The same open file as the reader: the rest is read from the held length on.
            io::Seek::seek(file, io::SeekFrom::Start(k.len)).map_err(io_error(&rollout.path))?;
            base = Some((*k, windows));
        }
    }
    if let (Some(k), None) = (known, &base) {
        let prefix = read_prefix(&mut rollout.reader, k.len).map_err(io_error(&rollout.path))?;
        match prefix {
            Some((crc32, windows)) if crc32 == k.crc32 => base = Some((*k, windows)),
            _ => {
                rollout = open()?;
                id = id_of(&rollout)?;
            }
        }
    }
    let mut bytes = Vec::new();
    rollout
        .reader
        .read_to_end(&mut bytes)
        .map_err(io_error(&rollout.path))?;
    bytes.truncate(whole_lines(&bytes).len());
    let start = base.as_ref().map(|(k, _)| *k);
    let held = KnownFile::after(base, &bytes, id);
    Ok((start, bytes, held))
}

/// How many forks deep a lineage is followed: codex forks a fork, but no real lineage is
/// this long, and a cycle (a damaged or hand-made rollout) must end.
const MAX_LINEAGE: usize = 64;

/// The threads `thread_id` was forked from, nearest first, and their files: codex writes a
/// paginated fork's rollout as a reference to its source's (`forked_from_id` in its first
/// record, then only the records after the fork point) and refuses to resume the fork
/// without the source's file ("missing source rollout"), so the fork's mirror carries them
/// (`docs/design.md`, "Forks"). A source this home no longer holds ends the lineage: what
/// is there is mirrored. `hints`: the folders where each source was last found.
fn lineage(
    home: &Path,
    thread_id: &str,
    files: &[String],
    hints: &HashMap<String, String>,
) -> Result<(HashMap<String, String>, Vec<String>), MirrorError> {
    let (mut dirs, mut sources) = (HashMap::new(), Vec::new());
    let mut next = forked_from(home, thread_id, files)?;
    while let Some(source) = next.take() {
        if source == thread_id || dirs.contains_key(&source) || dirs.len() == MAX_LINEAGE {
            break;
        }
        let hint = hints.get(&source).map(String::as_str);
        let Some((dir, files)) = thread_files(home, &source, hint)? else {
            break;
        };
        next = forked_from(home, &source, &files)?;
        sources.extend(files);
        dirs.insert(source, dir);
    }
    Ok((dirs, sources))
}

/// The thread the rollout of `thread_id` (among `files`) names as its fork source: the
/// `forked_from_id` of its first record, a `session_meta`. Read up to its first newline, at
/// most [`FIRST_RECORD_MAX`] bytes (its base instructions make it tens of KiB).
fn forked_from(
    home: &Path,
    thread_id: &str,
    files: &[String],
) -> Result<Option<String>, MirrorError> {
    const FIRST_RECORD_MAX: u64 = 4 << 20;
    let main = files.iter().find(|path| {
        let name = path.rsplit('/').next().unwrap_or_default();
        // The source file, not a head file (`..._<uuid>.jsonl`).
        is_thread_file(name, thread_id) && !name.contains('_')
    });
    let Some(main) = main else {
        return Ok(None);
    };
    // Compressed or not, as codex reads it.
    let Some(rollout) = open_rollout(&home.join(main))? else {
        return Ok(None);
    };
    let mut line = Vec::new();
    io::BufReader::new(rollout.reader.take(FIRST_RECORD_MAX))
        .read_until(b'\n', &mut line)
        .map_err(io_error(&rollout.path))?;
    #[derive(serde::Deserialize)]
    struct Record {
        #[serde(rename = "type")]
        kind: String,
        payload: Meta,
    }
    #[derive(serde::Deserialize)]
    struct Meta {
        forked_from_id: Option<String>,
    }
    let source = serde_json::from_slice::<Record>(&line)
        .ok()
        .filter(|record| record.kind == "session_meta")
        .and_then(|record| record.payload.forked_from_id);
    // Only an id a rollout file can be named by: never a path, never another shape.
    Ok(source.filter(|id| shaped(id, UUID)))
}

/// The shape of a codex thread id (lower-case, as codex names its files).
const UUID: &str = "hhhhhhhh-hhhh-hhhh-hhhh-hhhhhhhhhhhh";

/// The thread a rollout file's name names, when it has a codex thread id's shape: its
/// source (`rollout-<ts>-<id>.jsonl`) or a head file (`rollout-<ts>-<id>_<uuid>.jsonl`).
fn rollout_thread_id(name: &str) -> Option<&str> {
    let id = name
        .strip_prefix("rollout-")?
        .strip_suffix(".jsonl")?
        .get(20..)?
        .get(..36)?;
    is_thread_file(name, id)
        .then_some(id)
        .filter(|id| shaped(id, UUID))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_threads_files_are_its_source_and_its_head_files() {
        let t = "01a2329f-e3f7-7240-889a-d40328142d21";
        assert!(is_thread_file(
            &format!("rollout-2026-12-01T17-21-09-{t}.jsonl"),
            t
        ));
        assert!(is_thread_file(
            &format!("rollout-2026-12-01T17-21-09-{t}_01a2329f-e5b6-7042-9394-7a57204ad2b7.jsonl"),
            t
        ));
        assert!(!is_thread_file(&format!("rollout-x-{t}.jsonl.tmp"), t));
        assert!(!is_thread_file(
            &format!(".rethread-restore-1-rollout-x-{t}.jsonl.tmp"),
            t
        ));
        assert!(!is_thread_file(
            "rollout-2026-12-01T17-21-09-other.jsonl",
            t
        ));
        // An id that is the tail of another thread's, or its start: another thread's file.
        let source = format!("rollout-2026-12-01T17-21-09-{t}.jsonl");
        for part in [
            "d40328142d21",
            "889a-d40328142d21",
            "01a2329f",
            "01a2329f-e3f7",
        ] {
            assert!(!is_thread_file(&source, part), "{part}");
        }
        assert!(!is_thread_file(
            "rollout-2026-12-01T10-00-00-t_h.jsonl",
            "t"
        ));
        assert!(!is_thread_file(&format!("rollout-{t}.jsonl"), t));
    }

    /// A home holding `(thread, forked_from)` rollouts, each with a `session_meta` first line.
    fn home_of(threads: &[(&str, Option<&str>)]) -> tempfile::TempDir {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join("sessions/2026/12/07");
        std::fs::create_dir_all(&dir).unwrap();
        for (thread, source) in threads {
            let meta = serde_json::json!({"type": "session_meta",
                "payload": {"id": thread, "forked_from_id": source}});
            let name = format!("rollout-2026-12-07T20-40-28-{thread}.jsonl");
            std::fs::write(dir.join(name), format!("{meta}\n{{}}\n")).unwrap();
        }
        home
    }

    #[test]
    fn a_forks_mirror_carries_its_lineage_and_a_cycle_or_a_path_ends_it() {
        let [a, b, c] = [
            "01a2523c-84eb-7503-b3ff-51564b96c5ac",
            "01a2523c-867b-7361-b802-78832e5f2d9d",
            "01a2523c-86dc-7ed3-a987-2c8b3b9c00c5",
        ];
        let names = |files: &[String]| -> Vec<String> {
            files
                .iter()
                .map(|f| {
                    rollout_thread_id(f.rsplit('/').next().unwrap())
                        .unwrap()
                        .to_string()
                })
                .collect()
        };
        // c forked from b, forked from a: both sources, nearest first.
        let home = home_of(&[(a, None), (b, Some(a)), (c, Some(b))]);
        let (_, own) = thread_files(home.path(), c, None).unwrap().unwrap();
        let (dirs, sources) = lineage(home.path(), c, &own, &HashMap::new()).unwrap();
        assert_eq!(names(&sources), [b, a]);
        assert_eq!(dirs.len(), 2);
        // A cycle ends where it repeats; a source the home lacks ends the lineage.
        let home = home_of(&[(a, Some(b)), (b, Some(a))]);
        let (_, own) = thread_files(home.path(), a, None).unwrap().unwrap();
        assert_eq!(
            names(&lineage(home.path(), a, &own, &HashMap::new()).unwrap().1),
            [b]
        );
        let home = home_of(&[(c, Some(b))]);
        let (_, own) = thread_files(home.path(), c, None).unwrap().unwrap();
        assert!(lineage(home.path(), c, &own, &HashMap::new())
            .unwrap()
            .1
            .is_empty());
        // Only an id is followed: never a path or another shape.
        for hostile in [
            "../../etc/passwd",
            "01a2523c",
            "x/01a2523c-867b-7361-b802-78832e5f2d9d",
        ] {
            let home = home_of(&[(c, Some(hostile))]);
            let (_, own) = thread_files(home.path(), c, None).unwrap().unwrap();
            assert_eq!(
                forked_from(home.path(), c, &own).unwrap(),
                None,
                "{hostile}"
            );
        }
    }

    #[test]
    fn only_whole_lines_are_mirrored() {
        assert_eq!(whole_lines(b"a\nb\nc"), b"a\nb\n");
        assert_eq!(whole_lines(b"a\n"), b"a\n");
        assert_eq!(whole_lines(b"abc"), b"");
    }
}
