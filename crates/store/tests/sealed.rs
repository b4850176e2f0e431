//! Issue 43, sealed at rest: a marker written in a turn (a transcript row and the rollout's
//! mirror) is found nowhere in a sealed store's bytes afterwards (SQLite's database, WAL and
//! shared memory; the redb file), while the same turn is found in an unsealed store's bytes
//! (the check can fail); and the sealed store gives the turn back whole with its key.

use std::path::{Path, PathBuf};

use rethread_store::{
    BindingStore, MirrorAppend, MirrorUpdate, OpenOptions, StoreError, StoreKey, TurnCommit,
};
use serde_json::json;

const MARKER: &str = "marker-7f3a-quince-sealed";
const ROLLOUT: &str = "sessions/2026/12/07/rollout-2026-12-07T20-40-28-t1.jsonl";

fn turn() -> TurnCommit {
    let rows = vec![json!({"role": "user", "text": format!("remember {MARKER}")})];
    let line = format!("{}\n", json!({"type": "response_item", "text": MARKER}));
    let update = MirrorUpdate::new(vec![MirrorAppend::whole(ROLLOUT, line.into_bytes())]);
    TurnCommit::new("s1", "t1", rows).mirror(Some(update))
}

/// Every byte of the files at `paths` that exist.
fn bytes_of(paths: &[PathBuf]) -> Vec<u8> {
    paths
        .iter()
        .filter_map(|p| std::fs::read(p).ok())
        .flatten()
        .collect()
}

fn holds(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// The files of the store at `path`: the file, and SQLite's WAL and shared memory.
fn files(path: &Path) -> Vec<PathBuf> {
    ["", "-wal", "-shm"]
        .iter()
        .map(|suffix| PathBuf::from(format!("{}{suffix}", path.display())))
        .collect()
}

async fn open(kind: &str, path: &Path, key: Option<&StoreKey>) -> Result<BindingStore, StoreError> {
    let options = OpenOptions::new().key(key.cloned());
    match kind {
        "redb" => BindingStore::redb(path, options).await,
        _ => BindingStore::sqlite(path, options).await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_written_in_a_turn_is_nowhere_in_a_sealed_stores_bytes() {
    let key = StoreKey::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    for kind in ["sqlite", "redb"] {
        for sealed in [false, true] {
            let path = dir.path().join(format!("{kind}-{sealed}.store"));
            let key = sealed.then_some(&key);
            let store = open(kind, &path, key).await.unwrap();
            store.commit_turn(turn()).await.unwrap();
            // Read while the WAL and shared memory still hold what was written.
            let live = bytes_of(&files(&path));
            store.close().await;
            let closed = bytes_of(&files(&path));
            // Asserted as booleans: a failure never prints the store's bytes.
            let found = [holds(&live, MARKER), holds(&closed, MARKER)];
            assert_eq!(found, [!sealed, !sealed], "{kind}, sealed {sealed}");
            // With its key, the turn comes back whole.
            let store = open(kind, &path, key).await.unwrap();
            let rows = store.rows("s1", 0..1).await.unwrap();
            assert_eq!(rows[0].body["text"], format!("remember {MARKER}"), "{kind}");
            let file = store
                .mirror_file("s1", "t1", ROLLOUT)
                .await
                .unwrap()
                .unwrap();
            assert!(holds(&file, MARKER), "{kind}");
            assert!(store.verify(&mut |_| {}).await.unwrap().is_ok(), "{kind}");
            store.close().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_store_refuses_no_key_and_another_key_and_changes_nothing() {
    let (key, other) = (StoreKey::generate().unwrap(), StoreKey::generate().unwrap());
    let dir = tempfile::tempdir().unwrap();
    for kind in ["sqlite", "redb"] {
        let path = dir.path().join(format!("{kind}.store"));
        let store = open(kind, &path, Some(&key)).await.unwrap();
        store.commit_turn(turn()).await.unwrap();
        store.close().await;
        let export = |key| {
            let path = path.clone();
            async move {
                let store = open(kind, &path, Some(&key)).await.unwrap();
                let export = store.export_session("s1").await.unwrap();
                store.close().await;
                export
            }
        };
        let before = export(key.clone()).await;
        let none = open(kind, &path, None).await;
        assert!(
            matches!(none, Err(StoreError::KeyRequired { .. })),
            "{kind}: {none:?}"
        );
        let wrong = open(kind, &path, Some(&other)).await;
        assert!(
            matches!(wrong, Err(StoreError::WrongKey { .. })),
            "{kind}: {wrong:?}"
        );
        // What the store holds is as it was (an open's own upkeep aside: SQLite's WAL).
        assert_eq!(
            export(key.clone()).await,
            before,
            "{kind}: a refusal changed the store"
        );
        // An unsealed store holding sessions takes no key.
        let plain = dir.path().join(format!("{kind}-plain.store"));
        let store = open(kind, &plain, None).await.unwrap();
        store.commit_turn(turn()).await.unwrap();
        store.close().await;
        let keyed = open(kind, &plain, Some(&key)).await;
        assert!(
            matches!(keyed, Err(StoreError::NotSealed { .. })),
            "{kind}: {keyed:?}"
        );
    }
}
