//! Codex's thread store, as the fake keeps it under `CODEX_HOME`: the same files a real codex
//! keeps, so a home either of them wrote is one the other starts in and resumes from.
//!
//! - A JSONL rollout per thread, `$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<ts>-<id>.jsonl`,
//!   written only when the thread's first turn runs ([`rollout`]). Its first line is a
//!   `session_meta` record carrying `history_mode` (absent under the pre-history-mode profile,
//!   which means legacy). The rollout is the source of truth for the mode: it never changes
//!   after that first line.
//! - The index, `$CODEX_HOME/state_5.sqlite` ([`index`]): codex's database, in which the fake
//!   keeps a table of its own and reads codex's. Like codex, an indexed mode that disagrees
//!   with the rollout is corrected from the rollout.
//! - One advisory lock file per thread, `$CODEX_HOME/thread-writer-locks/<id>.lock`, held by
//!   the process that writes the thread, so a second process cannot resume it; the OS drops
//!   the lock when the holder dies.
//!
//! Architecture invariant: nothing here reads an unknown `history_mode` as legacy; such a
//! rollout is an error for every reader.

mod index;
pub(crate) mod rollout;

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use rethread_protocol::HistoryMode;

use crate::profile::Profile;
use crate::util::Utc;

/// A thread's metadata, as kept in memory while it is loaded.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ThreadMeta {
    pub(crate) id: String,
    pub(crate) history_mode: HistoryMode,
    pub(crate) cwd: String,
    pub(crate) created_ms: u64,
    pub(crate) updated_ms: u64,
    pub(crate) preview: String,
    pub(crate) path: PathBuf,
    pub(crate) cli_version: String,
    pub(crate) developer_instructions: Option<String>,
}

/// One completed (or interrupted) turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TurnRecord {
    pub(crate) id: String,
    pub(crate) user_text: String,
    pub(crate) agent_text: Option<String>,
    pub(crate) status: String,
    pub(crate) started_ms: u64,
    pub(crate) completed_ms: u64,
}

/// A row of the `threads` table.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub(crate) id: String,
    pub(crate) path: PathBuf,
    pub(crate) history_mode: String,
    pub(crate) cwd: String,
    pub(crate) created_ms: u64,
    pub(crate) updated_ms: u64,
    pub(crate) preview: String,
    pub(crate) cli_version: String,
}

/// Why a rollout could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadError {
    /// The file does not exist.
    Missing,
    /// The file exists but holds no readable `session_meta` line.
    Empty,
    /// `session_meta.history_mode` is not a mode codex knows.
    UnknownMode(String),
    /// An I/O error.
    Io(String),
}

impl ReadError {
    /// The message codex gives for a failed read (code -32603) of the rollout at `path`, on
    /// `thread/resume` (`resume`) or `thread/read`. 0.169.0 wraps the cause twice and names an
    /// unknown mode; 0.144.6 wraps it once on resume (twice on read) and reports an unknown
    /// mode as a missing `session_meta`.
    pub(crate) fn message(&self, path: &Path, profile: Profile, resume: bool) -> String {
        let p = path.display();
        let detail = match self {
            ReadError::Missing => format!("rollout at {p} does not exist"),
            ReadError::Empty => format!("rollout at {p} is empty"),
            ReadError::UnknownMode(_) if profile != Profile::Current => {
                format!("rollout at {p} does not start with session metadata")
            }
            ReadError::UnknownMode(mode) => format!(
                "invalid session metadata history_mode: unknown variant `{mode}`, expected \
                 `legacy` or `paginated`"
            ),
            ReadError::Io(e) => e.clone(),
        };
        let prefix =
            "failed to read thread: thread-store internal error: failed to read session metadata";
        if profile == Profile::Current || !resume {
            format!("{prefix} {p}: thread-store internal error: failed to read session metadata {p}: {detail}")
        } else {
            format!("{prefix} {p}: {detail}")
        }
    }
}

/// What a rollout holds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rollout {
    pub(crate) meta: ThreadMeta,
    pub(crate) turns: Vec<TurnRecord>,
}

/// The store of one `CODEX_HOME`, opened by one (fake) process.
#[derive(Debug)]
pub(crate) struct Store {
    home: PathBuf,
    index: index::Index,
}

impl Store {
    /// Opens (creating) the store under `home`.
    pub(crate) fn open(home: &Path) -> io::Result<Store> {
        std::fs::create_dir_all(home.join("sessions"))?;
        Ok(Store {
            home: home.to_path_buf(),
            index: index::Index::open(home)?,
        })
    }

    /// The home this store lives in.
    pub(crate) fn home(&self) -> &Path {
        &self.home
    }

    /// Where a thread created at `created_ms` keeps its rollout.
    pub(crate) fn rollout_path_for(&self, id: &str, created_ms: u64) -> PathBuf {
        let t = Utc::from_ms(created_ms);
        self.home
            .join("sessions")
            .join(format!("{:04}", t.year))
            .join(format!("{:02}", t.month))
            .join(format!("{:02}", t.day))
            .join(format!("rollout-{}-{id}.jsonl", t.file_stamp()))
    }

    /// The indexed row of `id`.
    pub(crate) fn row(&self, id: &str) -> io::Result<Option<Row>> {
        self.index.row(id)
    }

    /// Every indexed row that is not archived.
    pub(crate) fn rows(&self) -> io::Result<Vec<Row>> {
        self.index.rows()
    }

    /// The rollout of `id`: the indexed path when that file exists, else a scan of `sessions/`.
    ///
    /// 0.169.0 and later trust their index: an indexed thread whose file is not at the
    /// indexed path has no rollout (`scan_when_indexed: false`); 0.144.6 looks for the file
    /// anyway.
    pub(crate) fn find_rollout(
        &self,
        id: &str,
        scan_when_indexed: bool,
    ) -> io::Result<Option<PathBuf>> {
        if let Some(row) = self.row(id)? {
            if row.path.is_file() {
                return Ok(Some(row.path));
            }
            if !scan_when_indexed {
                return Ok(None);
            }
        }
        Ok(rollout::scan_for(
            &self.home.join("sessions"),
            &format!("-{id}.jsonl"),
        ))
    }

    /// Writes the `session_meta` first line (the rollout's creation) and indexes the thread.
    pub(crate) fn create_rollout(&self, meta: &ThreadMeta, profile: Profile) -> io::Result<()> {
        rollout::create(meta, profile)?;
        self.index.upsert(meta)
    }

    /// Appends one turn's records to the rollout and updates the index.
    pub(crate) fn append_turn(&self, meta: &ThreadMeta, turn: &TurnRecord) -> io::Result<()> {
        rollout::append_turn(&meta.path, turn)?;
        self.index.upsert(meta)
    }

    /// Corrects the indexed mode of `id` from its rollout (codex's reconciliation).
    pub(crate) fn reconcile_mode(&self, id: &str, mode: &HistoryMode) -> io::Result<()> {
        self.index.reconcile_mode(id, mode)
    }

    /// Sets the indexed mode of `id` verbatim (a test's storage edit).
    pub(crate) fn set_indexed_mode(&self, id: &str, mode: &str) -> io::Result<usize> {
        self.index.set_mode(id, mode)
    }
}

/// Reads the rollout at `path`.
pub(crate) fn read_rollout(path: &Path) -> Result<Rollout, ReadError> {
    rollout::read(path)
}

/// Every rollout file under `dir`.
pub(crate) fn all_rollouts(dir: &Path) -> Vec<PathBuf> {
    rollout::all(dir)
}

/// Tries to take the writer lock of `id` under `home`; `Ok(None)` when another process (or
/// another fake in this process) holds it.
pub(crate) fn try_lock_writer(home: &Path, id: &str) -> io::Result<Option<File>> {
    let dir = home.join("thread-writer-locks");
    std::fs::create_dir_all(&dir)?;
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(format!("{id}.lock")))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

fn sql(e: rusqlite::Error) -> io::Error {
    io::Error::other(format!("state_5.sqlite: {e}"))
}
