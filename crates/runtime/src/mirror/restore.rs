//! The restore (`docs/design.md`, "Restore"): each file the home needs goes through a temp
//! file the store streams into, cut at the last newline and renamed into place.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rethread_store::{check_mirror_path, BindingStore, MirroredFile, SessionRecord};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::compressed::{compressed_path, COMPRESSED};
use super::known::{file_id, read_prefix, KnownFile, Windows, Witness};
use super::{
    blocking, io_error, is_thread_file, open_rollout, parent_of, rollout_thread_id, Known,
    MirrorError, Restored, RolloutMirror, HISTORY_INDEX,
};

/// The tables of [`HISTORY_INDEX`] that hold a thread's projected history (each keyed by
/// `thread_id`; deleting the projection state also deletes the realtime items, by trigger).
const HISTORY_TABLES: [&str; 4] = [
    "thread_turns",
    "thread_items",
    "thread_realtime_items",
    "thread_history_projection_state",
];

impl RolloutMirror {
    /// Whether `record`'s mirror can restore `thread_id` into a home that lacks its rollout:
    /// mirroring did not stop, the thread has files, and a restore may write each of them.
    /// What `doctor` calls restorable.
    pub fn can_restore(record: &SessionRecord, thread_id: &str) -> bool {
        !record.mirror.stopped
            && record.mirror.has_thread(thread_id)
            && record
                .mirror
                .files_of(thread_id)
                .all(|file| check_file(file).is_ok())
    }

    /// Restores `thread_id`'s rollout files from the store's mirror of `session_id` before a
    /// resume: each file the home lacks, or holds a strict prefix of, is written at its path.
    /// A local file the mirror is a prefix of (a turn never committed) is left as it is; one
    /// that diverged is replaced, and the thread's rows leave codex's [`HISTORY_INDEX`] (codex
    /// rebuilds them from the rollout, so `thread/read` shows what the model sees). A file
    /// codex compressed (`.jsonl.zst`) is compared by what it decompresses to; a restore
    /// writes the plain file, and then removes the compressed one (codex prefers a plain
    /// file, so one left beside it would hide nothing but could never be compressed again).
    pub async fn restore(
        &self,
        store: &BindingStore,
        session_id: &str,
        thread_id: &str,
    ) -> Result<Restored, MirrorError> {
        match store.session(session_id).await? {
            Some(record) => self.restore_from(store, &record, thread_id).await,
            None => Ok(Restored::default()),
        }
    }

    /// [`RolloutMirror::restore`] from the session's record as the caller has just read it:
    /// one store read fewer. The record only decides which files to look at; each is then read
    /// from the store's own snapshot.
    pub async fn restore_from(
        &self,
        store: &BindingStore,
        record: &SessionRecord,
        thread_id: &str,
    ) -> Result<Restored, MirrorError> {
        if record.mirror.stopped {
            return Ok(Restored {
                stopped: true,
                ..Restored::default()
            });
        }
        let (own, mut sources): (Vec<MirroredFile>, Vec<MirroredFile>) = (record.mirror)
            .files_of(thread_id)
            .cloned()
            .partition(|file| source_of(file).is_none());
        let (mut known, mut restored) = (Known::default(), Restored::default());
        known.dir = own.first().and_then(|file| parent_of(&file.path));
        let home = self.inner.home.clone();
        if !own.is_empty() {
            self.restore_files(
                store,
                record,
                thread_id,
                own.clone(),
                &mut known,
                &mut restored,
            )
            .await?;
        }
        // A fork's sources, each once the thread before it in the lineage, as restored, names
        // it: a mirror cannot place another thread's file that its own rollout does not name.
        let (mut current, mut named) = (thread_id.to_string(), paths(&own));
        while !sources.is_empty() {
            let home = home.clone();
            let (of, files) = (current.clone(), named.clone());
            let Some(source) = blocking(move || super::forked_from(&home, &of, &files)).await?
            else {
                break;
            };
            let these: Vec<MirroredFile>;
            (these, sources) = sources
                .into_iter()
                .partition(|file| source_of(file) == Some(source.as_str()));
            if these.is_empty() {
                break;
            }
            if let Some(dir) = parent_of(&these[0].path) {
                known.source_dirs.insert(source.clone(), dir);
            }
            self.restore_files(
                store,
                record,
                thread_id,
                these.clone(),
                &mut known,
                &mut restored,
            )
            .await?;
            (current, named) = (source, paths(&these));
        }
        if let Some(stray) = sources.first() {
            return Err(MirrorError::BadPath(format!(
                "mirrored path {:?} is not a rollout of thread {} or of a thread it was forked from",
                stray.path, stray.thread_id
            )));
        }
        self.known().insert(thread_id.to_string(), known);
        Ok(restored)
    }

    /// Restores `files` (all of `thread_id`'s mirror in `record`, or one fork source's) into
    /// the home, noting what it then holds in `known` and what was done in `restored`.
    async fn restore_files(
        &self,
        store: &BindingStore,
        record: &SessionRecord,
        thread_id: &str,
        files: Vec<MirroredFile>,
        known: &mut Known,
        restored: &mut Restored,
    ) -> Result<(), MirrorError> {
        let home = self.inner.home.clone();
        // What the home holds of each file, and a temp file for each it needs.
        let locals = {
            let (home, files) = (home.clone(), files.clone());
            blocking(move || check_locals(&home, &files)).await?
        };
        let mut locals = files.iter().zip(locals);
        let written = async {
            for (file, local) in locals.by_ref() {
                let (temp, out, existing) = match local {
                    Local::Holds(held) => {
                        known.files.insert(file.path.clone(), held);
                        continue;
                    }
                    Local::Left => continue,
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
                    // Dropped since the record was read (a concurrent forget).
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
                let home = home.clone();
                let (diverged, held, index_error) =
                    blocking(move || temp.finish(&stored, &existing, &home)).await?;
                restored.diverged |= diverged;
                restored.index_error = restored.index_error.take().or(index_error);
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
            discard(temps(locals.map(|(_, local)| local))).await?;
            return Err(error);
        }
        Ok(())
    }
}

fn paths(files: &[MirroredFile]) -> Vec<String> {
    files.iter().map(|file| file.path.clone()).collect()
}

/// Removes temp files that will not be renamed into place.
async fn discard(temps: Vec<TempFile>) -> Result<(), MirrorError> {
    blocking(move || {
        temps.into_iter().for_each(TempFile::discard);
        Ok(())
    })
    .await
}

/// What the home holds of one mirrored file.
enum Local {
    /// The mirror's bytes, maybe followed by more (left as they are).
    Holds(KnownFile),
    /// A fork source's file the home already holds, whatever it holds: left as it is.
    Left,
    /// Less, or other bytes: the temp file to restore it through, the writer the store fills
    /// it with, and what the home holds.
    Needs {
        temp: TempFile,
        out: Box<dyn Write + Send>,
        existing: Existing,
    },
}

/// What the home holds of a file the restore writes.
enum Existing {
    /// Nothing.
    Missing,
    /// These bytes (up to one past the mirror's length): a strict prefix of the mirror, or a
    /// copy that diverged.
    Bytes(Vec<u8>),
    /// A compressed file that does not decompress ([`MirrorError::Damaged`]): codex cannot
    /// read it either, so it is replaced as a copy that diverged is.
    Damaged,
}

/// What the home holds of each of `files`, with a temp file for each it needs; none is left
/// behind on an error.
fn check_locals(home: &Path, files: &[MirroredFile]) -> Result<Vec<Local>, MirrorError> {
    let mut locals = Vec::with_capacity(files.len());
    for file in files {
        match check_local(home, file) {
            Ok(local) => locals.push(local),
            Err(error) => {
                temps(locals).into_iter().for_each(TempFile::discard);
                return Err(error);
            }
        }
    }
    Ok(locals)
}

/// The temp files of `locals`.
fn temps(locals: impl IntoIterator<Item = Local>) -> Vec<TempFile> {
    let temps = locals.into_iter().filter_map(|local| match local {
        Local::Needs { temp, .. } => Some(temp),
        Local::Holds(_) | Local::Left => None,
    });
    temps.collect()
}

/// The thread a mirrored file belongs to when it is not the file's own: a rollout of a thread
/// the mirrored thread was forked from (`docs/design.md`, "Forks").
fn source_of(file: &MirroredFile) -> Option<&str> {
    let name = file.path.rsplit('/').next().unwrap_or_default();
    rollout_thread_id(name)
        .filter(|id| !is_thread_file(name, &file.thread_id) && *id != file.thread_id)
}

/// Whether a restore may write `file`: the store's path rule, and a rollout of the file's
/// own thread or of a thread it was forked from (which a restore only ever creates: see
/// [`check_local`]).
fn check_file(file: &MirroredFile) -> Result<(), MirrorError> {
    check_mirror_path(&file.path).map_err(MirrorError::BadPath)?;
    let name = file.path.rsplit('/').next().unwrap_or_default();
    if !is_thread_file(name, &file.thread_id) && source_of(file).is_none() {
        return Err(MirrorError::BadPath(format!(
            "mirrored path {:?} is not a rollout of thread {}",
            file.path, file.thread_id
        )));
    }
    Ok(())
}

fn check_local(home: &Path, file: &MirroredFile) -> Result<Local, MirrorError> {
    check_file(file)?;
    let abs = home.join(&file.path);
    // A fork source's file is the source thread's own: the home's copy, if any, is that
    // thread's truth here (it may have gone on, or belong to another holder), so a restore
    // only creates one the home lacks, never extends or replaces it (nor writes a plain
    // file beside the one codex compressed).
    let present = |path: &Path| std::fs::symlink_metadata(path).is_ok();
    if source_of(file).is_some() && (present(&abs) || present(&compressed_path(&abs))) {
        return Ok(Local::Left);
    }
    // Only a regular file is opened: opening a FIFO blocks until a writer comes, and the open
    // holds the session's lease meanwhile. The compressed form is opened only without a plain
    // file, as codex does.
    let read = match std::fs::metadata(&abs) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => compressed_path(&abs),
        _ => abs.clone(),
    };
    if std::fs::metadata(&read).is_ok_and(|meta| !meta.is_file()) {
        let reason = "not a regular file".to_string();
        return Err(MirrorError::InTheWay { path: read, reason });
    }
    let existing = match local_bytes(&abs, file) {
        Ok(Err(existing)) => existing,
        Ok(Ok(witness)) => {
            return Ok(Local::Holds(KnownFile {
                len: file.len,
                crc32: file.crc32,
                witness,
            }))
        }
        Err(MirrorError::Damaged { .. }) => Existing::Damaged,
        Err(error) => return Err(error),
    };
    let (temp, out) = TempFile::create(home, &file.path)?;
    Ok(Local::Needs {
        temp,
        out,
        existing,
    })
}

/// What the home holds of `file` (plain at `abs`, or compressed beside it, read as codex
/// reads it); `Ok` when it holds the mirror's bytes, maybe followed by more, with the plain
/// file's witness for the next commit's check. Summed through one buffer, not read whole:
/// every open of a local thread comes here. The whole prefix is compared, not its windows
/// (`docs/design.md`, "What a commit checks"): a restore is rare, and what it keeps is what
/// every later commit extends.
fn local_bytes(
    abs: &Path,
    file: &MirroredFile,
) -> Result<Result<Option<Witness>, Existing>, MirrorError> {
    let Some(mut rollout) = open_rollout(abs)? else {
        return Ok(Err(Existing::Missing));
    };
    let read = io_error(&rollout.path);
    let id = rollout
        .plain
        .as_ref()
        .map(file_id)
        .transpose()
        .map_err(read)?;
    let read = io_error(&rollout.path);
    let prefix = read_prefix(&mut rollout.reader, file.len).map_err(read)?;
    if let Some((_, windows)) = prefix.filter(|(crc32, _)| *crc32 == file.crc32) {
        // A compressed file is decoded to its end: one whose later frames are damaged would
        // fail codex's resume, so it is not kept.
        if rollout.compressed {
            io::copy(&mut rollout.reader, &mut io::sink()).map_err(io_error(&rollout.path))?;
        }
        return Ok(Ok(id.map(|id| windows.witness(id))));
    }
    // Less, or other bytes: kept to tell a strict prefix from a divergence. One byte past the
    // mirror's length tells a longer copy; the rest is not needed.
    let Some(rollout) = open_rollout(abs)? else {
        return Ok(Err(Existing::Missing));
    };
    let mut bytes = Vec::new();
    rollout
        .reader
        .take(file.len.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io_error(&rollout.path))?;
    Ok(Err(Existing::Bytes(bytes)))
}

/// A restored file on its way in, renamed over its place once whole, so codex never sees a
/// partial file. No fsync: the store holds the truth, and a torn write after a crash is a
/// strict prefix that the next restore rewrites.
struct TempFile {
    file: File,
    /// The file's folder, opened through no link ([`open_dir`]); the names below are in it.
    dir: OwnedFd,
    temp: String,
    name: String,
    abs: PathBuf,
    /// Where the last line the store wrote ends.
    line_end: Arc<AtomicU64>,
}

impl TempFile {
    /// The temp file for `rel` (a checked path under `home`), and a buffered writer into
    /// it for the store.
    fn create(home: &Path, rel: &str) -> Result<(TempFile, Box<dyn Write + Send>), MirrorError> {
        let abs = home.join(rel);
        let (dir_rel, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        let dir = open_dir(home, dir_rel)?;
        remove_abandoned(&dir);
        // Not `rollout-*.jsonl`, so codex's scan never takes it for a rollout. Created new
        // (`O_EXCL`): a name that exists (a planted link, another pid namespace's restore, a
        // dead process's) is never written through; the next name is taken.
        static RESTORES: AtomicU64 = AtomicU64::new(0);
        let (file, temp) = loop {
            let restore = RESTORES.fetch_add(1, Ordering::Relaxed);
            let temp = format!("{TEMP_PREFIX}{}-{restore}-{name}.tmp", std::process::id());
            let flags = OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
            match rustix::fs::openat(&dir, &temp, flags | OFlags::CLOEXEC, Mode::from(0o666)) {
                Ok(file) => break (File::from(file), temp),
                Err(Errno::EXIST) => continue,
                Err(error) => return Err(io_error(&home.join(dir_rel).join(&temp))(error.into())),
            }
        };
        let out = match file.try_clone() {
            Ok(out) => out,
            Err(error) => {
                let _ = rustix::fs::unlinkat(&dir, &temp, AtFlags::empty());
                return Err(io_error(&abs)(error));
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
            dir,
            temp,
            name: name.to_string(),
            abs,
            line_end,
        };
        Ok((temp, out))
    }

    fn discard(self) {
        drop(self.file);
        let _ = rustix::fs::unlinkat(&self.dir, &self.temp, AtFlags::empty());
    }

    /// Cuts what the store wrote (`stored`) at its last newline, compares it with the local
    /// copy it replaces, and renames it into place. Returns whether the local copy diverged,
    /// what the store holds of the new file (`None` when the cut dropped a partial line: the
    /// next commit sends the file whole), and why the history index could not be cleared.
    /// The index is cleared before the rename: a restore that fails later never leaves the
    /// index of the replaced turns behind, which the next restore would not see.
    fn finish(
        self,
        stored: &MirroredFile,
        existing: &Existing,
        home: &Path,
    ) -> Result<(bool, Option<KnownFile>, Option<String>), MirrorError> {
        let cut = self.line_end.load(Ordering::Acquire).min(stored.len);
        let TempFile {
            file,
            dir,
            temp,
            name,
            abs,
            ..
        } = self;
        let result = (|| {
            if cut == 0 && stored.len > 0 {
                // Written outside rethread, or damaged: an empty file would replace the
                // home's own copy with nothing.
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the mirrored file holds no whole line: nothing to restore",
                ));
            }
            let mut file = file;
            if cut < stored.len {
                file.set_len(cut)?;
            }
            let diverged = match existing {
                Existing::Bytes(local) => !starts_with(&mut file, cut, local)?,
                Existing::Missing => false,
                Existing::Damaged => true,
            };
            let index_error = diverged
                .then(|| clear_history_index(home, &stored.thread_id).err())
                .flatten();
            // The renamed file keeps its inode: its witness is taken now.
            let windows = Windows::read(&file, cut)?;
            let witness = windows.map(|w| file_id(&file).map(|id| w.witness(id)));
            let witness = witness.transpose()?;
            drop(file);
            rustix::fs::renameat(&dir, &temp, &dir, &name)?;
            // Never a plain file beside a compressed one: codex would read the plain one and
            // its worker would never compress it again. Removed after the rename, as codex
            // removes it once it has decompressed it to append; a link is removed, not
            // followed. Best effort: the plain file is in place, and codex prefers it.
            let _ = rustix::fs::unlinkat(&dir, format!("{name}{COMPRESSED}"), AtFlags::empty());
            Ok((diverged, index_error, witness))
        })();
        let (diverged, index_error, witness) = match result {
            Ok(done) => done,
            Err(error) => {
                let _ = rustix::fs::unlinkat(&dir, &temp, AtFlags::empty());
                return Err(io_error(&abs)(error));
            }
        };
        let held = (cut == stored.len).then_some(KnownFile {
            len: stored.len,
            crc32: stored.crc32,
            witness,
        });
        Ok((diverged, held, index_error))
    }
}

/// How every restore's temp file is named first.
const TEMP_PREFIX: &str = ".rethread-restore-";

/// A temp file left unchanged this long belongs to a process that died mid-restore (a restore
/// takes seconds even for the largest mirror).
const ABANDONED_AFTER: Duration = Duration::from_secs(60 * 60);

/// Removes the temp files of dead restores from `dir`, best effort. By age, not by pid: homes
/// shared between containers see other pid namespaces' live restores.
fn remove_abandoned(dir: &OwnedFd) {
    let Ok(entries) = rustix::fs::Dir::read_from(dir) else {
        return;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |now| now.as_secs() as i64);
    for entry in entries.flatten() {
        let name = entry.file_name();
        let text = name.to_string_lossy();
        if !(text.starts_with(TEMP_PREFIX) && text.ends_with(".tmp")) {
            continue;
        }
        // Not followed: a link is never a restore's temp file. (`st_mtime` is not `i64` on
        // every target.)
        #[allow(clippy::unnecessary_cast)]
        let abandoned = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| {
            FileType::from_raw_mode(st.st_mode).is_file()
                && now.saturating_sub(st.st_mtime as i64) >= ABANDONED_AFTER.as_secs() as i64
        });
        if abandoned {
            let _ = rustix::fs::unlinkat(dir, name, AtFlags::empty());
        }
    }
}

/// The folder `rel` under `home`, created where it is missing and opened through no link:
/// each folder below the home is opened from the one above it without following a link
/// (`O_NOFOLLOW`), so a link anywhere under the home (one leading out of it, or one swapped
/// in meanwhile) is refused, never written through. The home itself may be a link.
fn open_dir(home: &Path, rel: &str) -> Result<OwnedFd, MirrorError> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    std::fs::create_dir_all(home).map_err(io_error(home))?;
    let mut dir = rustix::fs::open(home, flags, Mode::empty())
        .map_err(|error| io_error(home)(error.into()))?;
    let mut at = home.to_path_buf();
    for part in rel.split('/').filter(|part| !part.is_empty()) {
        at.push(part);
        let opened = match rustix::fs::mkdirat(&dir, part, Mode::from(0o777)) {
            Ok(()) | Err(Errno::EXIST) => {
                rustix::fs::openat(&dir, part, flags | OFlags::NOFOLLOW, Mode::empty())
            }
            Err(error) => Err(error),
        };
        dir = opened.map_err(|error| match error {
            Errno::LOOP | Errno::NOTDIR => MirrorError::InTheWay {
                path: at.clone(),
                reason: "a link or not a folder (a restore writes only inside the home, through \
                         no link)"
                    .to_string(),
            },
            error => io_error(&at)(error.into()),
        })?;
    }
    Ok(dir)
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
/// does not have are skipped. An index that is a link is not written through (a restore
/// writes only inside the home).
fn clear_history_index(home: &Path, thread_id: &str) -> Result<(), String> {
    let path = home.join(HISTORY_INDEX);
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.is_symlink() => {
            return Err(format!("{}: a link, not written through", path.display()))
        }
        Ok(meta) if meta.is_file() => {}
        _ => return Ok(()),
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
}
