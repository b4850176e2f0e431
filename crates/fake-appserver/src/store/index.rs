//! The thread index in `$CODEX_HOME/state_5.sqlite`, shared with the real codex.
//!
//! The database belongs to codex: each release creates its tables through its own numbered
//! migrations and records every one it applied (version, description, checksum) in a
//! bookkeeping table. A release refuses to start when a table one of its migrations creates
//! already exists unrecorded (a `threads` table made by anyone else is exactly that), and
//! tolerates tables it does not know. So the fake never creates or writes codex's tables:
//!
//! - it keeps its own rows in a table of its own, `rethread_fake_threads`, which no codex
//!   migration touches (a home the fake made is one every real release starts in: it creates
//!   its tables beside ours and finds the fake's threads by scanning `sessions/`);
//! - it reads codex's `threads` table, when a real codex made one, for threads it has no row
//!   of (a home a real release made is one the fake resumes from); the columns it reads exist
//!   in every supported release.
//!
//! Observed on 0.144.6, 0.169.0 and 0.171.0 (40, 62 and 64 migrations): each starts, lists
//! and resumes in a home whose `state_5.sqlite` holds only a foreign table, and keeps that
//! table.

use std::path::{Path, PathBuf};

use rethread_protocol::HistoryMode;
use rusqlite::{params, Connection, OptionalExtension};

use super::{sql, Row, ThreadMeta};

/// The fake's own table.
const FAKE_TABLE: &str = "rethread_fake_threads";
/// Codex's table of threads (read only).
const CODEX_TABLE: &str = "threads";

/// The columns of a [`Row`], in the order [`row_of`] reads them; the same names in the fake's
/// table and in codex's.
const ROW_COLUMNS: &str =
    "id, rollout_path, history_mode, cwd, created_at_ms, updated_at_ms, preview, cli_version";

/// The index of one home, opened by one (fake) process.
#[derive(Debug)]
pub(crate) struct Index {
    db: Connection,
    /// Whether a real codex has created its `threads` table here.
    codex_threads: bool,
}

impl Index {
    /// Opens (creating) `state_5.sqlite` under `home` and the fake's table in it.
    pub(crate) fn open(home: &Path) -> std::io::Result<Index> {
        let db = Connection::open(home.join("state_5.sqlite")).map_err(sql)?;
        db.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sql)?;
        // WAL, like codex; a real codex may hold the database open at the same time.
        let _ = db.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()));
        let has = |table: &str| -> std::io::Result<bool> {
            db.query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
                [table],
                |row| row.get::<_, i64>(0),
            )
            .map(|n| n > 0)
            .map_err(sql)
        };
        db.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS {FAKE_TABLE} (
                id TEXT PRIMARY KEY,
                rollout_path TEXT NOT NULL,
                created_at INTEGER NOT NULL,
                updated_at INTEGER NOT NULL,
                cwd TEXT NOT NULL,
                cli_version TEXT NOT NULL DEFAULT '',
                created_at_ms INTEGER,
                updated_at_ms INTEGER,
                preview TEXT NOT NULL DEFAULT '',
                history_mode TEXT NOT NULL DEFAULT 'legacy',
                archived INTEGER NOT NULL DEFAULT 0
            )"
        ))
        .map_err(sql)?;
        let codex_threads = has(CODEX_TABLE)?;
        Ok(Index { db, codex_threads })
    }

    /// The row of `id`: the fake's, else codex's.
    pub(crate) fn row(&self, id: &str) -> std::io::Result<Option<Row>> {
        let fake = self.row_in(FAKE_TABLE, id)?;
        if fake.is_some() || !self.codex_threads {
            return Ok(fake);
        }
        self.row_in(CODEX_TABLE, id)
    }

    fn row_in(&self, table: &str, id: &str) -> std::io::Result<Option<Row>> {
        self.db
            .query_row(
                &format!("SELECT {ROW_COLUMNS} FROM {table} WHERE id = ?1"),
                [id],
                row_of,
            )
            .optional()
            .map_err(sql)
    }

    /// Every row not archived: the fake's, and codex's for threads the fake has no row of.
    pub(crate) fn rows(&self) -> std::io::Result<Vec<Row>> {
        let mut rows = self.rows_in(FAKE_TABLE)?;
        if self.codex_threads {
            let known: std::collections::HashSet<String> =
                rows.iter().map(|r| r.id.clone()).collect();
            rows.extend(
                self.rows_in(CODEX_TABLE)?
                    .into_iter()
                    .filter(|r| !known.contains(&r.id)),
            );
        }
        Ok(rows)
    }

    fn rows_in(&self, table: &str) -> std::io::Result<Vec<Row>> {
        let mut statement = self
            .db
            .prepare(&format!(
                "SELECT {ROW_COLUMNS} FROM {table} WHERE archived = 0"
            ))
            .map_err(sql)?;
        let rows = statement.query_map([], row_of).map_err(sql)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(sql)
    }

    /// Writes the fake's row of a thread (its rollout exists from now on).
    pub(crate) fn upsert(&self, meta: &ThreadMeta) -> std::io::Result<()> {
        self.db
            .execute(
                &format!(
                    "INSERT INTO {FAKE_TABLE} (id, rollout_path, cwd, cli_version, created_at_ms, \
                     updated_at_ms, preview, history_mode, created_at, updated_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?5 / 1000, ?6 / 1000) \
                     ON CONFLICT(id) DO UPDATE SET rollout_path = ?2, updated_at_ms = ?6, \
                     updated_at = ?6 / 1000, preview = ?7"
                ),
                params![
                    meta.id,
                    meta.path.to_string_lossy(),
                    meta.cwd,
                    meta.cli_version,
                    meta.created_ms as i64,
                    meta.updated_ms as i64,
                    meta.preview,
                    meta.history_mode.as_str(),
                ],
            )
            .map_err(sql)?;
        Ok(())
    }

    /// Corrects the fake's indexed mode of `id` from its rollout (codex's reconciliation).
    pub(crate) fn reconcile_mode(&self, id: &str, mode: &HistoryMode) -> std::io::Result<()> {
        self.db
            .execute(
                &format!(
                    "UPDATE {FAKE_TABLE} SET history_mode = ?2 WHERE id = ?1 AND history_mode <> ?2"
                ),
                params![id, mode.as_str()],
            )
            .map_err(sql)?;
        Ok(())
    }

    /// Sets the fake's indexed mode of `id` verbatim (a test's storage edit); how many rows
    /// changed.
    pub(crate) fn set_mode(&self, id: &str, mode: &str) -> std::io::Result<usize> {
        self.db
            .execute(
                &format!("UPDATE {FAKE_TABLE} SET history_mode = ?2 WHERE id = ?1"),
                params![id, mode],
            )
            .map_err(sql)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tables(home: &Path) -> Vec<String> {
        let db = Connection::open(home.join("state_5.sqlite")).unwrap();
        let mut statement = db
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .unwrap();
        let names = statement.query_map([], |row| row.get(0)).unwrap();
        names.collect::<Result<_, _>>().unwrap()
    }

    fn meta(id: &str) -> ThreadMeta {
        ThreadMeta {
            id: id.into(),
            history_mode: HistoryMode::Paginated,
            cwd: "/".into(),
            created_ms: 1_000,
            updated_ms: 2_000,
            preview: "hi".into(),
            path: PathBuf::from("/sessions/rollout.jsonl"),
            cli_version: "0.171.0".into(),
            developer_instructions: None,
        }
    }

    /// A database a real codex made: its `threads` rows are read, never written.
    #[test]
    fn codexs_rows_are_read_and_the_fakes_go_to_its_own_table() {
        let home = tempfile::tempdir().unwrap();
        let db = Connection::open(home.path().join("state_5.sqlite")).unwrap();
        db.execute_batch(
            "CREATE TABLE _sqlx_migrations (version BIGINT PRIMARY KEY); \
             CREATE TABLE threads (id TEXT PRIMARY KEY, rollout_path TEXT NOT NULL, \
             cwd TEXT NOT NULL, archived INTEGER NOT NULL DEFAULT 0, \
             cli_version TEXT NOT NULL DEFAULT '', created_at_ms INTEGER, updated_at_ms INTEGER, \
             preview TEXT NOT NULL DEFAULT '', history_mode TEXT NOT NULL DEFAULT 'legacy', \
             title TEXT NOT NULL); \
             INSERT INTO threads (id, rollout_path, cwd, history_mode, title) \
             VALUES ('real', '/r.jsonl', '/', 'paginated', 't');",
        )
        .unwrap();
        drop(db);
        let index = Index::open(home.path()).unwrap();
        assert_eq!(
            index.row("real").unwrap().unwrap().path,
            Path::new("/r.jsonl")
        );
        index.upsert(&meta("real")).unwrap();
        index.upsert(&meta("fake")).unwrap();
        // The fake's own row now wins for `real`; codex's table is untouched.
        assert_eq!(
            index.row("real").unwrap().unwrap().path,
            Path::new("/sessions/rollout.jsonl")
        );
        assert_eq!(index.rows().unwrap().len(), 2);
        let db = Connection::open(home.path().join("state_5.sqlite")).unwrap();
        let codex_rows: i64 = db
            .query_row("SELECT count(*) FROM threads", [], |row| row.get(0))
            .unwrap();
        assert_eq!(codex_rows, 1);
        assert_eq!(
            tables(home.path()),
            ["_sqlx_migrations", FAKE_TABLE, "threads"]
        );
    }
}
