//! Damage to a mirrored rollout file of a file store, made outside rethread: a changed chunk
//! and a lost chunk are `Corrupt` when the file is read (never restored as other bytes) and
//! `verify` reports them as `Mirror` problems, on both file backends.

use std::path::{Path, PathBuf};

use redb::ReadableTable;
use rethread_store::{
    BindingStore, MirrorAppend, MirrorUpdate, OpenOptions, ProblemKind, StoreError, TurnCommit,
};
use serde_json::json;

const PATH: &str = "sessions/2026/12/01/rollout-2026-12-01T10-00-00-thr_a.jsonl";

#[derive(Clone, Copy, Debug)]
enum Backend {
    Redb,
    Sqlite,
}

async fn open(backend: Backend, path: &Path) -> BindingStore {
    let options = OpenOptions::new();
    match backend {
        Backend::Redb => BindingStore::redb(path, options).await.unwrap(),
        Backend::Sqlite => BindingStore::sqlite(path, options).await.unwrap(),
    }
}

/// A closed store whose session `a` mirrors two chunks of `PATH`.
async fn fixture(backend: Backend, dir: &Path) -> PathBuf {
    let path = dir.join(match backend {
        Backend::Redb => "s.redb",
        Backend::Sqlite => "s.db",
    });
    let store = open(backend, &path).await;
    let first = b"{\"type\":\"session_meta\"}\n".to_vec();
    let mirror = |appends| Some(MirrorUpdate::new(appends));
    store
        .commit_turn(
            TurnCommit::new("a", "thr_a", vec![json!(1)])
                .mirror(mirror(vec![MirrorAppend::whole(PATH, first.clone())])),
        )
        .await
        .unwrap();
    store
        .commit_turn(
            TurnCommit::new("a", "thr_a", vec![json!(2)]).mirror(mirror(vec![
                MirrorAppend::extend(
                    PATH,
                    first.len() as u64,
                    crc32fast::hash(&first),
                    b"{\"type\":\"turn\"}\n".to_vec(),
                ),
            ])),
        )
        .await
        .unwrap();
    drop(store);
    path
}

type Chunks<'t> = redb::Table<'t, (&'static str, &'static str, &'static str, u64), &'static [u8]>;

fn redb_chunks(path: &Path, edit: impl FnOnce(&mut Chunks<'_>)) {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let def: redb::TableDefinition<(&str, &str, &str, u64), &[u8]> =
            redb::TableDefinition::new("mirror_chunks");
        edit(&mut txn.open_table(def).unwrap());
    }
    txn.commit().unwrap();
}

fn sqlite_edit(path: &Path, sql: &str) {
    let conn = rusqlite::Connection::open(path).unwrap();
    assert_eq!(conn.execute(sql, []).unwrap(), 1, "{sql}");
}

/// Changes one byte of chunk 1 (its checksum column or suffix left as it was).
fn change_chunk(backend: Backend, path: &Path) {
    match backend {
        Backend::Sqlite => sqlite_edit(
            path,
            "UPDATE mirror_chunks SET bytes = CAST('{\"type\":\"tUrn\"}' || char(10) AS BLOB) \
             WHERE seq = 1",
        ),
        Backend::Redb => redb_chunks(path, |chunks| {
            let key = ("a", "thr_a", PATH, 1);
            let mut value = chunks.get(key).unwrap().unwrap().value().to_vec();
            value[3] ^= 0x20;
            chunks.insert(key, value.as_slice()).unwrap();
        }),
    }
}

/// Removes chunk 1.
fn lose_chunk(backend: Backend, path: &Path) {
    match backend {
        Backend::Sqlite => sqlite_edit(path, "DELETE FROM mirror_chunks WHERE seq = 1"),
        Backend::Redb => redb_chunks(path, |chunks| {
            chunks.remove(("a", "thr_a", PATH, 1)).unwrap().unwrap();
        }),
    }
}

async fn damaged_is_found(backend: Backend, damage: fn(Backend, &Path)) {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture(backend, dir.path()).await;
    damage(backend, &path);
    let store = open(backend, &path).await;
    let read = store.mirror_file("a", "thr_a", PATH).await;
    assert!(
        matches!(read, Err(StoreError::Corrupt { .. })),
        "{backend:?}: {read:?}"
    );
    let written = store
        .write_mirror_file("a", "thr_a", PATH, Box::new(std::io::sink()))
        .await;
    assert!(
        matches!(written, Err(StoreError::Corrupt { .. })),
        "{backend:?}: {written:?}"
    );
    let export = store.export_session("a").await;
    assert!(
        matches!(export, Err(StoreError::Corrupt { .. })),
        "{backend:?}: {export:?}"
    );
    let report = store.verify(&mut |_| {}).await.unwrap();
    let kinds: Vec<_> = report
        .problems
        .iter()
        .map(|p| (p.kind, p.session_id.as_deref()))
        .collect();
    assert_eq!(
        kinds,
        [(ProblemKind::Mirror, Some("a"))],
        "{backend:?}: {report:?}"
    );
    // The rows and the binding are intact: the damage is the mirror's alone.
    assert_eq!(store.rows("a", 0..2).await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_changed_mirror_chunk_is_corrupt_when_read_and_reported() {
    for backend in [Backend::Redb, Backend::Sqlite] {
        damaged_is_found(backend, change_chunk).await;
    }
}

#[tokio::test]
async fn a_lost_mirror_chunk_is_corrupt_when_read_and_reported() {
    for backend in [Backend::Redb, Backend::Sqlite] {
        damaged_is_found(backend, lose_chunk).await;
    }
}

#[tokio::test]
async fn a_healthy_mirror_verifies_and_counts() {
    for backend in [Backend::Redb, Backend::Sqlite] {
        let dir = tempfile::tempdir().unwrap();
        let path = fixture(backend, dir.path()).await;
        let store = open(backend, &path).await;
        let report = store.verify(&mut |_| {}).await.unwrap();
        assert!(report.is_ok(), "{backend:?}: {report:?}");
        assert_eq!(
            (report.mirror_files, report.mirror_bytes),
            (1, 40),
            "{backend:?}"
        );
    }
}
