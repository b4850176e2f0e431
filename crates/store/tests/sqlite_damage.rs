//! SQLite damage and edits made outside rethread are refused as `Corrupt`, never served.
//!
//! SQLite checks page structure (`PRAGMA quick_check`, on open) but not what a page holds; the
//! `store_files` fuzz target found a flipped byte in a value reading back changed
//! (`fuzz/regressions/store_files/sqlite-flipped-value-undetected`). Schema 2 gives every row a
//! checksum, verified on every read, and opening scans every record. These tests make each
//! kind of damage on purpose: a flipped byte in the file, a value, a key, a lease, and they
//! migrate a schema-1 file.

use std::path::{Path, PathBuf};

use rethread_store::{
    BindingStore, LocalOwner, OpenOptions, SqliteStore, StoreError, TurnCommit, SCHEMA_VERSION,
};
use serde_json::json;

fn commit(session: &str, thread: &str, texts: &[&str]) -> TurnCommit {
    TurnCommit {
        session_id: session.to_string(),
        thread_id: thread.to_string(),
        codex_home: None,
        rows: texts
            .iter()
            .map(|t| json!({"role": "user", "text": t}))
            .collect(),
        fence: None,
    }
}

fn is_corrupt<T: std::fmt::Debug>(result: &Result<T, StoreError>) -> bool {
    matches!(result, Err(StoreError::Corrupt { .. }))
}

async fn reopen(path: &Path) -> Result<SqliteStore, StoreError> {
    SqliteStore::open(path, OpenOptions::new().create(false)).await
}

/// Runs SQL on the file from a connection of its own, as another program would.
fn edit(path: &Path, sql: &str) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let changed = conn.execute(sql, []).unwrap();
    assert_eq!(changed, 1, "{sql}");
}

/// A new store in `dir` holding one turn of `texts` on session `a` (thread `thr_a`).
async fn store_with_turn(dir: &tempfile::TempDir, texts: &[&str]) -> (PathBuf, SqliteStore) {
    let path = dir.path().join("s.db");
    let store = SqliteStore::open(&path, OpenOptions::new()).await.unwrap();
    store
        .commit_turn(commit("a", "thr_a", texts))
        .await
        .unwrap();
    (path, store)
}

#[tokio::test]
async fn a_flipped_byte_in_a_row_is_refused_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store) = store_with_turn(&dir, &["needle-0123456789", "other"]).await;
    store.close().await;

    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes
        .windows(6)
        .position(|w| w == b"needle")
        .expect("the row is in the checkpointed file");
    // 'n' -> 'N': still valid UTF-8 and valid JSON, so only a checksum can tell.
    bytes[at] ^= 0x20;
    std::fs::write(&path, &bytes).unwrap();

    let opened = reopen(&path).await;
    assert!(is_corrupt(&opened), "{opened:?}");
}

#[tokio::test]
async fn a_value_changed_outside_rethread_is_refused_on_read_and_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store) = store_with_turn(&dir, &["hello", "world"]).await;
    assert_eq!(store.rows("a", 0..2).await.unwrap().len(), 2);

    edit(
        &path,
        r#"UPDATE transcript_rows SET body = '{"role":"user","text":"forged"}' WHERE session_id = 'a' AND seq = 1"#,
    );
    let rows = store.rows("a", 0..2).await;
    assert!(is_corrupt(&rows), "{rows:?}");
    let export = store.export_session("a").await;
    assert!(is_corrupt(&export), "{export:?}");
    // The row before the forged one still reads: damage is reported where it is.
    assert_eq!(
        store.rows("a", 0..1).await.unwrap()[0].body["text"],
        "hello"
    );
    store.close().await;
    let opened = reopen(&path).await;
    assert!(is_corrupt(&opened), "{opened:?}");
}

#[tokio::test]
async fn a_session_changed_outside_rethread_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store) = store_with_turn(&dir, &["hello"]).await;
    edit(
        &path,
        "UPDATE sessions SET row_count = 0 WHERE session_id = 'a'",
    );
    let session = store.session("a").await;
    assert!(is_corrupt(&session), "{session:?}");
    store.close().await;
    let opened = reopen(&path).await;
    assert!(is_corrupt(&opened), "{opened:?}");
}

#[tokio::test]
async fn a_session_whose_key_changed_is_refused_on_open() {
    // A changed key cannot be seen by a lookup (the lookup misses it): the scan on open finds
    // the record whose checksum no longer holds, and the rows left without their session.
    let dir = tempfile::tempdir().unwrap();
    let (path, store) = store_with_turn(&dir, &["hello"]).await;
    store
        .commit_turn(commit("b", "thr_b", &["hi"]))
        .await
        .unwrap();
    store.close().await;
    edit(
        &path,
        "UPDATE sessions SET session_id = 'c' WHERE session_id = 'a'",
    );
    let opened = reopen(&path).await;
    assert!(is_corrupt(&opened), "{opened:?}");
}

#[tokio::test]
async fn a_row_without_its_session_is_refused_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store) = store_with_turn(&dir, &["hello"]).await;
    store.close().await;
    // A row copied with its checksum under the same key space, one past the session's count.
    edit(
        &path,
        "INSERT INTO transcript_rows (session_id, seq, body, checksum) \
         SELECT session_id, 1, body, checksum FROM transcript_rows WHERE session_id = 'a'",
    );
    let opened = reopen(&path).await;
    assert!(is_corrupt(&opened), "{opened:?}");
}

#[tokio::test]
async fn a_lease_changed_outside_rethread_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = SqliteStore::open(&path, OpenOptions::new()).await.unwrap();
    let holder = LocalOwner::new();
    let owner = holder.owner().clone();
    let ttl = std::time::Duration::from_secs(30);
    let lease = store.acquire_lease("a", &owner, ttl).await.unwrap();
    edit(
        &path,
        "UPDATE leases SET expires_at_ms = expires_at_ms + 86400000 WHERE session_id = 'a'",
    );
    let renewed = store.renew_lease(&lease, ttl).await;
    assert!(is_corrupt(&renewed), "{renewed:?}");
    store.close().await;
    let opened = reopen(&path).await;
    assert!(is_corrupt(&opened), "{opened:?}");
}

/// Schema 1 exactly as rethread 0.1 wrote it (leases came later, so this file has none).
const SCHEMA_1: &str = "
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY NOT NULL,
    model_config TEXT NOT NULL,
    binding_thread_id TEXT,
    binding_codex_home TEXT,
    bound_at_ms INTEGER,
    row_count INTEGER NOT NULL,
    retired_threads TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE transcript_rows (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
PRAGMA application_id = 1920231524;
PRAGMA user_version = 1;
INSERT INTO sessions VALUES ('a', '{\"codex_thread_id\":\"thr_a\",\"model\":\"gpt-5\"}', 'thr_a',
    '/home/u/.codex', 5, 2, '[\"thr_0\"]', 1, 5);
INSERT INTO transcript_rows VALUES ('a', 0, '{\"role\":\"user\",\"text\":\"hello\"}');
INSERT INTO transcript_rows VALUES ('a', 1, '{\"role\":\"assistant\",\"text\":\"hi\"}');
";

#[tokio::test]
async fn a_schema_1_store_is_migrated_and_then_verified() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        let _: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .unwrap();
        conn.execute_batch(SCHEMA_1).unwrap();
    }
    let store = reopen(&path).await.expect("a schema-1 store opens");
    let session = store.session("a").await.unwrap().expect("kept");
    assert_eq!(session.row_count, 2);
    assert_eq!(session.binding.as_ref().unwrap().thread_id, "thr_a");
    assert_eq!(session.model_config["model"], "gpt-5");
    assert_eq!(session.retired_threads, vec!["thr_0".to_string()]);
    let rows = store.rows("a", 0..2).await.unwrap();
    assert_eq!(rows[1].body["text"], "hi");
    store
        .commit_turn(commit("a", "thr_a", &["again"]))
        .await
        .unwrap();
    let holder = LocalOwner::new();
    let owner = holder.owner().clone();
    store
        .acquire_lease("a", &owner, std::time::Duration::from_secs(30))
        .await
        .expect("the migration created the lease table");
    store.close().await;

    let version: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version as u64, rethread_store::SCHEMA_VERSION);
    let store = reopen(&path).await.expect("the migrated store opens");
    assert_eq!(store.rows("a", 0..3).await.unwrap().len(), 3);
    store.close().await;
    // The migrated rows carry checksums like new ones.
    edit(
        &path,
        r#"UPDATE transcript_rows SET body = '{"role":"user","text":"forged"}' WHERE session_id = 'a' AND seq = 0"#,
    );
    let opened = reopen(&path).await;
    assert!(is_corrupt(&opened), "{opened:?}");
}

/// Schema 3 gave stored leases their holder's process identity. A schema-2 lease (no such
/// columns) keeps its checksum through the migration and stays the session's live lease.
#[tokio::test]
async fn a_schema_2_lease_survives_the_migration_to_schema_3() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v2.db");
    let store = SqliteStore::open(&path, OpenOptions::new()).await.unwrap();
    let owner = rethread_store::LeaseOwner {
        host: "elsewhere".to_string(),
        pid: 7,
        started_at_ms: 1,
        instance: 1,
        process: None,
    };
    let ttl = std::time::Duration::from_secs(60);
    let lease = store.acquire_lease("a", &owner, ttl).await.unwrap();
    store.close().await;
    // Back to schema 2's layout, as a store written by the previous release.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "ALTER TABLE leases DROP COLUMN process_space;
         ALTER TABLE leases DROP COLUMN process_start;
         PRAGMA user_version = 2;",
    )
    .unwrap();
    drop(conn);

    let store = reopen(&path).await.expect("the schema-2 store opens");
    let renewed = store.renew_lease(&lease, ttl).await.expect("still live");
    assert_eq!(renewed.fence, lease.fence);
    let other = rethread_store::LocalOwner::new();
    assert!(matches!(
        store.acquire_lease("a", other.owner(), ttl).await,
        Err(StoreError::Busy { .. })
    ));
    store.close().await;
    let version: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version as u64, SCHEMA_VERSION);
}
