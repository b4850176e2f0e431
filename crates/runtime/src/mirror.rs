//! [`RolloutMirror`]: the file side of the rollout mirror, used by every driver of the
//! [`SessionMachine`](crate::machine::SessionMachine): finding a thread's rollout files under
//! `CODEX_HOME`, computing what they grew by for the turn's commit, and restoring them from the
//! store before a resume. The rules (when to restore, which commits take the mirror, what is
//! said) are the machine's; the store's side is `rethread_store`'s mirror.
//!
//! What codex does, measured on 0.144.6, 0.169.0 and 0.171.0 (`docs/design.md`, "Moving a
//! thread between homes"): a thread moves by its rollout file alone, at the same path relative
//! to `CODEX_HOME` (`sessions/YYYY/MM/DD/rollout-<ts>-<id>.jsonl`): codex finds it by scanning
//! `sessions/` and indexes it itself. The file grows append-only between completed turns and
//! is complete when `turn/completed` arrives; a paginated `thread/revert` starts a head file
//! beside it (`rollout-<ts>-<id>_<rolloutId>.jsonl`) that needs its source. Codex's
//! `state_5.sqlite` holds absolute paths and is never touched here.
//!
//! All file work runs on blocking threads (`spawn_blocking`), never on the runtime's.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rethread_store::{
    check_mirror_path, crc32_extend, BindingStore, MirrorAppend, MirrorOutcome, MirrorUpdate,
    MirroredFile, SessionRecord, StoreError, DEFAULT_MIRROR_CAP,
};

/// Codex's index of paginated threads, rebuilt from the rollout when a thread's rows are gone.
pub const HISTORY_INDEX: &str = "thread_history_1.sqlite";

/// The tables of [`HISTORY_INDEX`] that hold a thread's projected history (each keyed by
/// `thread_id`; deleting the projection state also deletes the realtime items, by trigger).
const HISTORY_TABLES: [&str; 4] = [
    "thread_turns",
    "thread_items",
    "thread_realtime_items",
    "thread_history_projection_state",
];

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
    /// The store names a path outside `CODEX_HOME`: nothing is written.
    #[error("{0}")]
    BadPath(String),
    /// The blocking task running the file work was lost.
    #[error("the mirror's file work stopped: {0}")]
    Task(String),
}

/// What a restore did ([`RolloutMirror::restore`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Restored {
    /// The files written from the store (paths relative to `CODEX_HOME`); empty when the
    /// home already held them (or a longer copy) or the store has no mirror of the thread.
    pub written: Vec<String>,
    /// A local copy diverged from the mirror and was replaced (the mirror wins).
    pub diverged: bool,
    /// Mirroring had stopped for the session (its cap): nothing to restore, nothing to mirror.
    pub stopped: bool,
    /// The local history index could not be cleared after a divergence: the model sees the
    /// restored history, `thread/read` may show the replaced one.
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

/// A file's identity on its device: a file replaced since (a restore, another copy) is
/// another file, and what was known of the old one no longer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId(u64, u64);

fn file_id(meta: &std::fs::Metadata) -> Option<FileId> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some(FileId(meta.dev(), meta.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        None
    }
}

/// What the store holds of one local file: its first `len` bytes, CRC-32 `crc32`, are what
/// the store holds, in the file `id` (codex only appends to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KnownFile {
    len: u64,
    crc32: u32,
    id: Option<FileId>,
}

/// What this process knows of one thread's files.
#[derive(Debug, Clone, Default)]
struct Known {
    /// The directory of the thread's files, relative to the home.
    dir: Option<String>,
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
        RolloutMirror {
            inner: Arc::new(Inner {
                home: codex_home.into(),
                cap,
                known: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The `CODEX_HOME` it mirrors.
    pub fn home(&self) -> &Path {
        &self.inner.home
    }

    fn known(&self) -> MutexGuard<'_, HashMap<String, Known>> {
        // Every critical section is a plain map update.
        self.inner
            .known
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// What the thread's rollout files grew by since the store last got them, for the commit
    /// of a completed turn: only the new bytes of a file this process mirrored or restored
    /// (cut at the last newline), the whole file otherwise (base length 0).
    pub async fn prepare(&self, thread_id: &str) -> Result<PreparedMirror, MirrorError> {
        let known = self.known().get(thread_id).cloned().unwrap_or_default();
        let (home, thread, cap) = (
            self.inner.home.clone(),
            thread_id.to_string(),
            self.inner.cap,
        );
        blocking(move || {
            let (appends, known) = grown(&home, &thread, &known)?;
            Ok(PreparedMirror {
                update: MirrorUpdate::new(appends).cap(cap),
                thread_id: thread,
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

    /// Restores `thread_id`'s rollout files from the store's mirror of `session_id` before a
    /// resume: each file the home lacks, or holds a strict prefix of, is written from the
    /// mirror at its path (temp file and rename, cut at the last newline). A local file the
    /// mirror is a prefix of (a turn codex ran that was never committed) is left as it is.
    /// A local file that diverged is replaced (the mirror holds what was committed), and the
    /// thread's rows are removed from codex's history index ([`HISTORY_INDEX`]): codex
    /// rebuilds them from the rollout on resume, else `thread/read` would show the replaced
    /// history while the model sees the restored one.
    pub async fn restore(
        &self,
        store: &dyn BindingStore,
        session_id: &str,
        thread_id: &str,
    ) -> Result<Restored, MirrorError> {
        match store.session(session_id).await? {
            Some(record) => self.restore_from(store, &record, thread_id).await,
            None => Ok(Restored::default()),
        }
    }

    /// [`RolloutMirror::restore`] from the session's record as the caller has just read it
    /// (a driver's open reads it anyway, to find the binding): one store read fewer. Each
    /// file is then read from the store's own snapshot, so a record read a moment ago only
    /// decides which files to look at.
    pub async fn restore_from(
        &self,
        store: &dyn BindingStore,
        record: &SessionRecord,
        thread_id: &str,
    ) -> Result<Restored, MirrorError> {
        if record.mirror.stopped {
            return Ok(Restored {
                stopped: true,
                ..Restored::default()
            });
        }
        let files: Vec<MirroredFile> = record.mirror.files_of(thread_id).cloned().collect();
        if files.is_empty() {
            return Ok(Restored::default());
        }
        let home = self.inner.home.clone();
        // One hop to a blocking thread: what the home holds of each file, and a temp file
        // for each it needs.
        let locals = {
            let (home, files) = (home.clone(), files.clone());
            blocking(move || check_locals(&home, &files)).await?
        };
        let mut known = Known {
            dir: files.first().and_then(|f| parent_of(&f.path)),
            files: HashMap::new(),
        };
        let mut restored = Restored::default();
        let mut locals = files.iter().zip(locals);
        let written = async {
            for (file, local) in locals.by_ref() {
                let (temp, out, existing) = match local {
                    Local::Holds(held) => {
                        known.files.insert(file.path.clone(), held);
                        continue;
                    }
                    Local::Needs {
                        temp,
                        out,
                        existing,
                    } => (temp, out, existing),
                };
                let written = store
                    .write_mirror_file(&record.session_id, thread_id, &file.path, out)
                    .await;
                let stored = match written {
                    Ok(Some(stored)) => stored,
                    // Dropped since the record was read (a concurrent forget): nothing to
                    // restore.
                    Ok(None) => {
                        discard(vec![temp]).await?;
                        continue;
                    }
                    Err(error) => {
                        discard(vec![temp]).await?;
                        return Err(error.into());
                    }
                };
                // `finish` removes its temp file when it fails.
                let (diverged, held) =
                    blocking(move || temp.finish(&stored, existing.as_deref())).await?;
                restored.diverged |= diverged;
                restored.written.push(file.path.clone());
                if let Some(held) = held {
                    known.files.insert(file.path.clone(), held);
                }
            }
            Ok(())
        }
        .await;
        if let Err(error) = written {
            // The temp files of the files not reached.
            let temps = locals.filter_map(|(_, local)| match local {
                Local::Needs { temp, .. } => Some(temp),
                Local::Holds(_) => None,
            });
            discard(temps.collect()).await?;
            return Err(error);
        }
        if restored.diverged {
            let (home, thread) = (home.clone(), thread_id.to_string());
            restored.index_error = blocking(move || Ok(clear_history_index(&home, &thread)))
                .await?
                .err();
        }
        self.known().insert(thread_id.to_string(), known);
        Ok(restored)
    }
}

/// Removes temp files that will not be renamed into place.
async fn discard(temps: Vec<TempFile>) -> Result<(), MirrorError> {
    blocking(move || {
        temps.into_iter().for_each(TempFile::discard);
        Ok(())
    })
    .await
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, MirrorError> + Send + 'static,
) -> Result<T, MirrorError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| MirrorError::Task(error.to_string()))?
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> MirrorError + '_ {
    move |source| MirrorError::Io {
        path: path.to_path_buf(),
        source,
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
/// or a head file a paginated revert started (`rollout-<ts>-<id>_<rolloutId>.jsonl`).
fn is_thread_file(name: &str, thread_id: &str) -> bool {
    let Some(stem) = name
        .strip_prefix("rollout-")
        .and_then(|n| n.strip_suffix(".jsonl"))
    else {
        return false;
    };
    stem.ends_with(&format!("-{thread_id}")) || stem.contains(&format!("-{thread_id}_"))
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

fn files_in(home: &Path, dir: &str, thread_id: &str) -> Result<Vec<String>, MirrorError> {
    let abs = home.join(dir);
    let entries = match std::fs::read_dir(&abs) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error(&abs)(e)),
    };
    let mut files: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| is_thread_file(name, thread_id))
        .map(|name| format!("{dir}/{name}"))
        .collect();
    files.sort();
    Ok(files)
}

/// The first folder under `dir` (depth first, newest name first) holding a file of the thread.
fn find_dir(home: &Path, dir: &str, thread_id: &str) -> Result<Option<String>, MirrorError> {
    let abs = home.join(dir);
    let entries = match std::fs::read_dir(&abs) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(&abs)(e)),
    };
    let mut dirs = Vec::new();
    for entry in entries.flatten() {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        match entry.file_type() {
            Ok(t) if t.is_dir() => dirs.push(name),
            Ok(t) if t.is_file() && is_thread_file(&name, thread_id) => {
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
    let mut next = Known {
        dir: Some(dir),
        files: HashMap::new(),
    };
    let mut appends = Vec::new();
    for path in files {
        let abs = home.join(&path);
        let mut file = File::open(&abs).map_err(io_error(&abs))?;
        let meta = file.metadata().map_err(io_error(&abs))?;
        let id = file_id(&meta);
        let before = known.files.get(&path).copied();
        let (append, held) = match before {
            // The same file, only grown: read the new bytes only.
            Some(k) if k.id.is_some() && k.id == id && meta.len() >= k.len => {
                file.seek(SeekFrom::Start(k.len)).map_err(io_error(&abs))?;
                let mut tail = Vec::new();
                file.read_to_end(&mut tail).map_err(io_error(&abs))?;
                tail.truncate(whole_lines(&tail).len());
                let held = KnownFile {
                    len: k.len + tail.len() as u64,
                    crc32: crc32_extend(k.crc32, k.len, &tail),
                    id,
                };
                let append =
                    (!tail.is_empty()).then(|| MirrorAppend::extend(&path, k.len, k.crc32, tail));
                (append, held)
            }
            _ => {
                let mut bytes = Vec::new();
                file.read_to_end(&mut bytes).map_err(io_error(&abs))?;
                bytes.truncate(whole_lines(&bytes).len());
                let held = KnownFile {
                    len: bytes.len() as u64,
                    crc32: crc32fast::hash(&bytes),
                    id,
                };
                // What the store holds may still be a prefix of the file (another identity,
                // the same bytes): then only the rest goes.
                let append = match before {
                    Some(k)
                        if bytes.len() as u64 >= k.len
                            && crc32fast::hash(&bytes[..k.len as usize]) == k.crc32 =>
                    {
                        let tail = bytes[k.len as usize..].to_vec();
                        (!tail.is_empty())
                            .then(|| MirrorAppend::extend(&path, k.len, k.crc32, tail))
                    }
                    _ => Some(MirrorAppend::whole(&path, bytes)),
                };
                (append, held)
            }
        };
        appends.extend(append);
        next.files.insert(path, held);
    }
    Ok((appends, next))
}

/// What the home holds of one mirrored file.
enum Local {
    /// The mirror's bytes, maybe followed by more (left as they are).
    Holds(KnownFile),
    /// Less, or other bytes: the temp file to restore it through, the writer the store fills
    /// it with, and the file's current bytes, if it exists.
    Needs {
        temp: TempFile,
        out: Box<dyn Write + Send>,
        existing: Option<Vec<u8>>,
    },
}

/// What the home holds of each of `files`, with a temp file for each it needs; none is left
/// behind on an error.
fn check_locals(home: &Path, files: &[MirroredFile]) -> Result<Vec<Local>, MirrorError> {
    let mut locals = Vec::with_capacity(files.len());
    for file in files {
        match check_local(home, file) {
            Ok(local) => locals.push(local),
            Err(error) => {
                for local in locals {
                    if let Local::Needs { temp, .. } = local {
                        temp.discard();
                    }
                }
                return Err(error);
            }
        }
    }
    Ok(locals)
}

fn checked_path(home: &Path, path: &str) -> Result<PathBuf, MirrorError> {
    check_mirror_path(path).map_err(MirrorError::BadPath)?;
    Ok(home.join(path))
}

fn check_local(home: &Path, file: &MirroredFile) -> Result<Local, MirrorError> {
    let abs = checked_path(home, &file.path)?;
    let existing = match File::open(&abs) {
        Ok(mut handle) => {
            let id = file_id(&handle.metadata().map_err(io_error(&abs))?);
            let mut bytes = Vec::new();
            handle.read_to_end(&mut bytes).map_err(io_error(&abs))?;
            if bytes.len() as u64 >= file.len
                && crc32fast::hash(&bytes[..file.len as usize]) == file.crc32
            {
                return Ok(Local::Holds(KnownFile {
                    len: file.len,
                    crc32: file.crc32,
                    id,
                }));
            }
            Some(bytes)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_error(&abs)(e)),
    };
    let (temp, out) = TempFile::create(home, &file.path)?;
    Ok(Local::Needs {
        temp,
        out,
        existing,
    })
}

/// A restored file on its way in: written next to its place under a name codex's scan never
/// takes for a rollout, then renamed over it, so codex never sees a partial file. No fsync:
/// the store holds the truth, and a torn write after a crash is a strict prefix that the next
/// restore rewrites.
struct TempFile {
    file: File,
    temp: PathBuf,
    abs: PathBuf,
    /// Where the last line the store wrote ends.
    line_end: Arc<AtomicU64>,
}

impl TempFile {
    /// The temp file for `path`, and a buffered writer into it for the store.
    fn create(home: &Path, path: &str) -> Result<(TempFile, Box<dyn Write + Send>), MirrorError> {
        let abs = checked_path(home, path)?;
        let dir = abs.parent().unwrap_or(home);
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        let name = abs
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // Not `rollout-*.jsonl`: codex's scan never takes the temp file for a rollout. One
        // name per restore among live processes: two restores of a thread into one home at
        // once (two openers in one process) each write and rename their own file. A name
        // left by a process that died (its pid reused, as a container's is) is overwritten.
        static RESTORES: AtomicU64 = AtomicU64::new(0);
        let restore = RESTORES.fetch_add(1, Ordering::Relaxed);
        let temp = dir.join(format!(
            ".rethread-restore-{}-{restore}-{name}.tmp",
            std::process::id()
        ));
        // Read back too, when `finish` compares a local copy with it.
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&temp)
            .map_err(io_error(&temp))?;
        let out = match file.try_clone() {
            Ok(out) => out,
            Err(error) => {
                let _ = std::fs::remove_file(&temp);
                return Err(io_error(&temp)(error));
            }
        };
        let line_end = Arc::new(AtomicU64::new(0));
        let out = Box::new(LineEnds {
            out: io::BufWriter::with_capacity(1 << 16, out),
            written: 0,
            line_end: line_end.clone(),
        });
        let temp = TempFile {
            file,
            temp,
            abs,
            line_end,
        };
        Ok((temp, out))
    }

    fn discard(self) {
        drop(self.file);
        let _ = std::fs::remove_file(&self.temp);
    }

    /// Cuts what the store wrote (`stored`) at its last newline, compares it with the local
    /// copy it replaces, and renames it into place. Returns whether the local copy diverged,
    /// and what the store holds of the new file (`None` when the cut dropped a partial line:
    /// the next commit sends the file whole).
    fn finish(
        self,
        stored: &MirroredFile,
        existing: Option<&[u8]>,
    ) -> Result<(bool, Option<KnownFile>), MirrorError> {
        // A record being written is not mirrored, and 0.144.6 glues the next record onto a
        // partial line: only whole lines go in place.
        let cut = self.line_end.load(Ordering::Acquire).min(stored.len);
        let TempFile {
            file, temp, abs, ..
        } = self;
        let result = (|| {
            let mut file = file;
            if cut < stored.len {
                file.set_len(cut)?;
            }
            let diverged = match existing {
                Some(local) => !starts_with(&mut file, cut, local)?,
                None => false,
            };
            // The renamed file is this one (same inode).
            let id = file_id(&file.metadata()?);
            drop(file);
            std::fs::rename(&temp, &abs)?;
            Ok((diverged, id))
        })();
        let (diverged, id) = match result {
            Ok(done) => done,
            Err(error) => {
                let _ = std::fs::remove_file(&temp);
                return Err(io_error(&abs)(error));
            }
        };
        let held = (cut == stored.len).then_some(KnownFile {
            len: stored.len,
            crc32: stored.crc32,
            id,
        });
        Ok((diverged, held))
    }
}

/// The store's writer into a temp file: notes where the last whole line it was given ends, so
/// the cut needs no read back.
struct LineEnds {
    out: io::BufWriter<File>,
    written: u64,
    line_end: Arc<AtomicU64>,
}

impl Write for LineEnds {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        if let Some(at) = buf[..n].iter().rposition(|b| *b == b'\n') {
            self.line_end
                .store(self.written + at as u64 + 1, Ordering::Release);
        }
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Whether `file`'s first `len` bytes start with `local`.
fn starts_with(file: &mut File, len: u64, local: &[u8]) -> io::Result<bool> {
    if (local.len() as u64) > len {
        return Ok(false);
    }
    let mut held = vec![0; local.len()];
    file.seek(SeekFrom::Start(0))?;
    file.read_exact(&mut held)?;
    Ok(held == local)
}

/// Removes `thread_id`'s rows from codex's history index, if the home has one; codex rebuilds
/// them from the rollout when it resumes the thread. One transaction; the tables a release
/// does not have are skipped.
fn clear_history_index(home: &Path, thread_id: &str) -> Result<(), String> {
    let path = home.join(HISTORY_INDEX);
    if !path.is_file() {
        return Ok(());
    }
    let fail = |e: rusqlite::Error| format!("{}: {e}", path.display());
    let mut db = rusqlite::Connection::open(&path).map_err(fail)?;
    db.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(fail)?;
    let txn = db
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(fail)?;
    for table in HISTORY_TABLES {
        let exists: bool = txn
            .query_row(
                "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?1",
                [table],
                |row| row.get(0),
            )
            .map_err(fail)?;
        if exists {
            txn.execute(
                &format!("DELETE FROM {table} WHERE thread_id = ?1"),
                [thread_id],
            )
            .map_err(fail)?;
        }
    }
    txn.commit().map_err(fail)
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
    }

    #[test]
    fn a_restore_is_cut_after_the_last_newline_the_store_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let (temp, mut out) = TempFile::create(dir.path(), "sessions/x.jsonl").unwrap();
        for part in [&b"ab\ncd"[..], b"", b"ef\ng", b"hij"] {
            out.write_all(part).unwrap();
        }
        out.flush().unwrap();
        assert_eq!(temp.line_end.load(Ordering::Acquire), 8);
        let (temp, mut out) = TempFile::create(dir.path(), "sessions/y.jsonl").unwrap();
        out.write_all(b"no newline").unwrap();
        assert_eq!(temp.line_end.load(Ordering::Acquire), 0);
        temp.discard();
    }

    #[test]
    fn only_whole_lines_are_mirrored() {
        assert_eq!(whole_lines(b"a\nb\nc"), b"a\nb\n");
        assert_eq!(whole_lines(b"a\n"), b"a\n");
        assert_eq!(whole_lines(b"abc"), b"");
    }
}
