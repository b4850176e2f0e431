//! Codex's thread store, as the fake keeps it under `CODEX_HOME`.
//!
//! - A JSONL rollout per thread, `$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<ts>-<id>.jsonl`,
//!   written only when the thread's first turn runs. Its first line is a `session_meta` record
//!   carrying `history_mode` (absent under the pre-history-mode profile, which means legacy).
//!   The rollout is the source of truth for the mode: it never changes after that first line.
//! - A SQLite index, `$CODEX_HOME/state_5.sqlite`, table `threads`
//!   (`history_mode TEXT NOT NULL DEFAULT 'legacy'`), with a row per materialized thread. Like
//!   codex, a row whose mode disagrees with its rollout is corrected from the rollout.
//! - One advisory lock file per thread, `$CODEX_HOME/thread-writer-locks/<id>.lock`, held by
//!   the process that writes the thread, so a second process cannot resume it; the OS drops
//!   the lock when the holder dies.
//!
//! Architecture invariant: nothing here reads an unknown `history_mode` as legacy; such a
//! rollout is an error for every reader.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use rethread_protocol::HistoryMode;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value};

use crate::profile::Profile;
use crate::util::{now_ms, Utc};

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
    db: Connection,
}

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS threads (
    id TEXT PRIMARY KEY,
    rollout_path TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    source TEXT NOT NULL DEFAULT 'vscode',
    model_provider TEXT NOT NULL DEFAULT 'mock',
    cwd TEXT NOT NULL,
    title TEXT NOT NULL DEFAULT '',
    archived INTEGER NOT NULL DEFAULT 0,
    cli_version TEXT NOT NULL DEFAULT '',
    first_user_message TEXT NOT NULL DEFAULT '',
    created_at_ms INTEGER,
    updated_at_ms INTEGER,
    preview TEXT NOT NULL DEFAULT '',
    history_mode TEXT NOT NULL DEFAULT 'legacy'
)";

impl Store {
    /// Opens (creating) the store under `home`.
    pub(crate) fn open(home: &Path) -> io::Result<Store> {
        std::fs::create_dir_all(home.join("sessions"))?;
        let db = Connection::open(home.join("state_5.sqlite")).map_err(sql)?;
        db.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sql)?;
        // WAL, like codex; another process on the same home may hold the database open.
        let _ = db.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()));
        db.execute_batch(SCHEMA).map_err(sql)?;
        Ok(Store {
            home: home.to_path_buf(),
            db,
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

    /// The `threads` row of `id`.
    pub(crate) fn row(&self, id: &str) -> io::Result<Option<Row>> {
        self.db
            .query_row(
                "SELECT id, rollout_path, history_mode, cwd, created_at_ms, updated_at_ms, preview, \
                 cli_version FROM threads WHERE id = ?1",
                [id],
                row_of,
            )
            .optional()
            .map_err(sql)
    }

    /// Every row, most recently updated first.
    pub(crate) fn rows(&self) -> io::Result<Vec<Row>> {
        let mut statement = self
            .db
            .prepare_cached(
                "SELECT id, rollout_path, history_mode, cwd, created_at_ms, updated_at_ms, preview, \
                 cli_version FROM threads WHERE archived = 0 ORDER BY updated_at_ms DESC, id DESC",
            )
            .map_err(sql)?;
        let rows = statement.query_map([], row_of).map_err(sql)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(sql)
    }

    /// The rollout of `id`: the indexed path when that file exists, else a scan of `sessions/`.
    ///
    /// 0.169.0 trusts its index: an indexed thread whose file is not at the indexed path has
    /// no rollout (`scan_when_indexed: false`); 0.144.6 looks for the file anyway.
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
        Ok(scan_for(
            &self.home.join("sessions"),
            &format!("-{id}.jsonl"),
        ))
    }

    /// Writes the `session_meta` first line (the rollout's creation) and indexes the thread.
    pub(crate) fn create_rollout(&self, meta: &ThreadMeta, profile: Profile) -> io::Result<()> {
        if let Some(dir) = meta.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut payload = json!({
            "session_id": meta.id,
            "id": meta.id,
            "timestamp": Utc::from_ms(meta.created_ms).rfc3339(),
            "cwd": meta.cwd,
            "originator": "rethread-fake",
            "cli_version": meta.cli_version,
            "source": "vscode",
            "model_provider": "mock",
        });
        if profile.has_history_mode() {
            payload["history_mode"] = json!(meta.history_mode.as_str());
        }
        if let Some(instructions) = &meta.developer_instructions {
            payload["developer_instructions"] = json!(instructions);
        }
        let line = record(0, "session_meta", payload);
        let mut file = OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&meta.path)?;
        file.write_all(line.as_bytes())?;
        file.sync_data()?;
        self.db
            .execute(
                "INSERT OR REPLACE INTO threads (id, rollout_path, created_at, updated_at, cwd, \
                 cli_version, created_at_ms, updated_at_ms, history_mode) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    meta.id,
                    meta.path.to_string_lossy(),
                    (meta.created_ms / 1000) as i64,
                    (meta.updated_ms / 1000) as i64,
                    meta.cwd,
                    meta.cli_version,
                    meta.created_ms as i64,
                    meta.updated_ms as i64,
                    meta.history_mode.as_str(),
                ],
            )
            .map_err(sql)?;
        Ok(())
    }

    /// Appends one turn's records to the rollout and updates the index.
    pub(crate) fn append_turn(&self, meta: &ThreadMeta, turn: &TurnRecord) -> io::Result<()> {
        let mut lines = String::new();
        lines.push_str(&record(
            1,
            "event_msg",
            json!({"type": "task_started", "turn_id": turn.id}),
        ));
        lines.push_str(&record(
            2,
            "response_item",
            json!({"type": "message", "role": "user", "turn_id": turn.id,
                   "content": [{"type": "input_text", "text": turn.user_text}]}),
        ));
        if let Some(text) = &turn.agent_text {
            lines.push_str(&record(
                3,
                "response_item",
                json!({"type": "message", "role": "assistant", "turn_id": turn.id,
                       "content": [{"type": "output_text", "text": text}]}),
            ));
        }
        let end = if turn.status == "completed" {
            "task_complete"
        } else {
            "turn_aborted"
        };
        lines.push_str(&record(
            4,
            "event_msg",
            json!({"type": end, "turn_id": turn.id, "status": turn.status,
                   "started_ms": turn.started_ms, "completed_ms": turn.completed_ms}),
        ));
        let mut file = OpenOptions::new().append(true).open(&meta.path)?;
        file.write_all(lines.as_bytes())?;
        file.sync_data()?;
        self.db
            .execute(
                "UPDATE threads SET updated_at = ?2, updated_at_ms = ?3, preview = ?4, title = ?4, \
                 first_user_message = ?4 WHERE id = ?1",
                params![meta.id, (meta.updated_ms / 1000) as i64, meta.updated_ms as i64, meta.preview],
            )
            .map_err(sql)?;
        Ok(())
    }

    /// Corrects the indexed mode of `id` from its rollout (codex's reconciliation).
    pub(crate) fn reconcile_mode(&self, id: &str, mode: &HistoryMode) -> io::Result<()> {
        self.db
            .execute(
                "UPDATE threads SET history_mode = ?2 WHERE id = ?1 AND history_mode <> ?2",
                params![id, mode.as_str()],
            )
            .map_err(sql)?;
        Ok(())
    }

    /// Sets the indexed mode of `id` verbatim (a test's storage edit).
    pub(crate) fn set_indexed_mode(&self, id: &str, mode: &str) -> io::Result<usize> {
        self.db
            .execute(
                "UPDATE threads SET history_mode = ?2 WHERE id = ?1",
                params![id, mode],
            )
            .map_err(sql)
    }
}

/// Reads a rollout: its `session_meta` and its turns. A torn or unparseable line after the
/// first is skipped (a writer killed mid-append leaves earlier turns intact).
pub(crate) fn read_rollout(path: &Path) -> Result<Rollout, ReadError> {
    let text = match std::fs::read(path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ReadError::Missing),
        Err(e) => return Err(ReadError::Io(e.to_string())),
    };
    let mut lines = text.split('\n');
    let first = lines.next().unwrap_or_default();
    let meta_line: Value = serde_json::from_str(first).map_err(|_| ReadError::Empty)?;
    if meta_line.get("type").and_then(Value::as_str) != Some("session_meta") {
        return Err(ReadError::Empty);
    }
    let payload = meta_line.get("payload").cloned().unwrap_or_default();
    let history_mode = match payload.get("history_mode") {
        None | Some(Value::Null) => HistoryMode::Legacy,
        Some(Value::String(mode)) => match HistoryMode::parse(mode) {
            HistoryMode::Unknown(other) => return Err(ReadError::UnknownMode(other)),
            known => known,
        },
        Some(other) => return Err(ReadError::UnknownMode(other.to_string())),
    };
    let str_of = |key: &str| payload.get(key).and_then(Value::as_str).map(str::to_string);
    let id = str_of("id").ok_or(ReadError::Empty)?;
    let mut meta = ThreadMeta {
        id,
        history_mode,
        cwd: str_of("cwd").unwrap_or_default(),
        created_ms: 0,
        updated_ms: 0,
        preview: String::new(),
        path: path.to_path_buf(),
        cli_version: str_of("cli_version").unwrap_or_default(),
        developer_instructions: str_of("developer_instructions"),
    };
    let mut turns: Vec<TurnRecord> = Vec::new();
    for line in lines {
        let Ok(value) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let payload = value.get("payload").cloned().unwrap_or_default();
        let turn_id = payload
            .get("turn_id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let kind = payload
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let text_of = |p: &Value| {
            p.pointer("/content/0/text")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        match (value.get("type").and_then(Value::as_str), kind) {
            (Some("response_item"), "message") => {
                let role = payload
                    .get("role")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if role == "user" {
                    turns.push(TurnRecord {
                        id: turn_id,
                        user_text: text_of(&payload),
                        agent_text: None,
                        status: "inProgress".into(),
                        started_ms: 0,
                        completed_ms: 0,
                    });
                } else if let Some(turn) = turns.iter_mut().rev().find(|t| t.id == turn_id) {
                    turn.agent_text = Some(text_of(&payload));
                }
            }
            (Some("event_msg"), "task_complete" | "turn_aborted") => {
                if let Some(turn) = turns.iter_mut().rev().find(|t| t.id == turn_id) {
                    turn.status = payload
                        .get("status")
                        .and_then(Value::as_str)
                        .unwrap_or("completed")
                        .into();
                    turn.started_ms = payload
                        .get("started_ms")
                        .and_then(Value::as_u64)
                        .unwrap_or(0);
                    turn.completed_ms = payload
                        .get("completed_ms")
                        .and_then(Value::as_u64)
                        .unwrap_or(0);
                }
            }
            _ => {}
        }
    }
    if let Some(first) = turns.first() {
        meta.preview = first.user_text.clone();
    }
    Ok(Rollout { meta, turns })
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

fn record(ordinal: u64, kind: &str, payload: Value) -> String {
    let mut line = json!({
        "timestamp": Utc::from_ms(now_ms()).rfc3339(),
        "ordinal": ordinal,
        "type": kind,
        "payload": payload,
    })
    .to_string();
    line.push('\n');
    line
}

fn row_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        id: row.get(0)?,
        path: PathBuf::from(row.get::<_, String>(1)?),
        history_mode: row.get(2)?,
        cwd: row.get(3)?,
        created_ms: row.get::<_, Option<i64>>(4)?.unwrap_or(0) as u64,
        updated_ms: row.get::<_, Option<i64>>(5)?.unwrap_or(0) as u64,
        preview: row.get(6)?,
        cli_version: row.get(7)?,
    })
}

/// Every `rollout-*.jsonl` file under `dir`, recursively.
pub(crate) fn all_rollouts(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("rollout-") && n.ends_with(".jsonl"))
            {
                out.push(path);
            }
        }
    }
    out
}

fn scan_for(dir: &Path, suffix: &str) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = scan_for(&path, suffix) {
                return Some(found);
            }
        } else if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with(suffix))
        {
            return Some(path);
        }
    }
    None
}

fn sql(e: rusqlite::Error) -> io::Error {
    io::Error::other(format!("state_5.sqlite: {e}"))
}
