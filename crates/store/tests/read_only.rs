//! `OpenOptions::read_only`: a command that only reads changes nothing, on the store's file or
//! beside it (no `.holder`, no `-wal`, no header rewritten), and every write is refused as
//! `NotWritable` with nothing written.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use rethread_store::{open_url, LocalOwner, OpenOptions, StoreError, TurnCommit};
use serde_json::json;

/// Every file of `dir`: its name, length, a hash of its bytes and its modification time.
fn snapshot(dir: &Path) -> BTreeMap<String, (u64, u64, std::time::SystemTime)> {
    use std::hash::{Hash, Hasher};
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            std::fs::read(entry.path()).unwrap().hash(&mut hasher);
            (
                entry.file_name().to_string_lossy().into_owned(),
                (meta.len(), hasher.finish(), meta.modified().unwrap()),
            )
        })
        .collect()
}

fn is_not_writable<T: std::fmt::Debug>(result: &Result<T, StoreError>) -> bool {
    matches!(result, Err(StoreError::NotWritable { .. }))
}

async fn reads_change_nothing_and_writes_are_refused(scheme: &str) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("{scheme}:{}", dir.path().join("store").display());
    let store = open_url(&url, OpenOptions::new()).await.unwrap();
    store
        .commit_turn(TurnCommit::new("s1", "t1", vec![json!({"text": "hi"})]))
        .await
        .unwrap();
    drop(store);
    let before = snapshot(dir.path());
    // A modification time that moved would show even where the bytes are put back as they were.
    tokio::time::sleep(Duration::from_millis(20)).await;

    let store = open_url(&url, OpenOptions::new().read_only(true))
        .await
        .unwrap();
    assert_eq!(store.thread_id("s1").await.unwrap().as_deref(), Some("t1"));
    assert_eq!(store.all_rows("s1").await.unwrap().len(), 1);
    assert_eq!(
        store.list_sessions(None, 10).await.unwrap().sessions.len(),
        1
    );
    assert!(store.export_session("s1").await.unwrap().is_some());
    let report = store.verify(&mut |_| {}).await.unwrap();
    assert!(report.is_ok(), "{report:?}");

    let commit = store
        .commit_turn(TurnCommit::new("s1", "t1", vec![json!({"text": "again"})]))
        .await;
    assert!(is_not_writable(&commit), "{commit:?}");
    let deleted = store.delete_session("s1").await;
    assert!(is_not_writable(&deleted), "{deleted:?}");
    let owner = LocalOwner::new();
    let lease = store
        .acquire_lease("s1", owner.owner(), Duration::from_secs(30))
        .await;
    assert!(is_not_writable(&lease), "{lease:?}");
    drop(store);
    assert_eq!(
        snapshot(dir.path()),
        before,
        "{scheme}: the read-only open changed a file"
    );

    // A writer opens it as before, and finds nothing of the refused writes.
    let store = open_url(&url, OpenOptions::new()).await.unwrap();
    assert_eq!(store.all_rows("s1").await.unwrap().len(), 1);
    drop(store);
}

#[tokio::test]
async fn redb_read_only_changes_nothing() {
    reads_change_nothing_and_writes_are_refused("redb").await;
}

#[tokio::test]
async fn sqlite_read_only_changes_nothing() {
    reads_change_nothing_and_writes_are_refused("sqlite").await;
}

/// Read-only never creates: a missing store is `NoStore` even with `create(true)`, and
/// nothing appears.
#[tokio::test]
async fn read_only_never_creates_a_store() {
    let dir = tempfile::tempdir().unwrap();
    for scheme in ["redb", "sqlite"] {
        let url = format!(
            "{scheme}:{}",
            dir.path().join("new").join("store").display()
        );
        let options = OpenOptions::new()
            .create(true)
            .create_dirs(true)
            .read_only(true);
        let opened = open_url(&url, options).await;
        assert!(
            matches!(opened, Err(StoreError::NoStore { .. })),
            "{scheme}: {opened:?}"
        );
    }
    assert!(snapshot(dir.path()).is_empty(), "nothing is created");
}

/// A redb file whose process died with it open (here: a copy taken while it is open) needs
/// redb's recovery, which only a writable open runs: a read-only open recovers it, reads it
/// whole, and still refuses every write.
#[tokio::test]
async fn a_redb_file_left_open_by_a_crash_is_recovered_and_read() {
    let dir = tempfile::tempdir().unwrap();
    let (live, crashed) = (
        dir.path().join("live.redb"),
        dir.path().join("crashed.redb"),
    );
    let store = open_url(&format!("redb:{}", live.display()), OpenOptions::new())
        .await
        .unwrap();
    store
        .commit_turn(TurnCommit::new("s1", "t1", vec![json!({"text": "hi"})]))
        .await
        .unwrap();
    std::fs::copy(&live, &crashed).unwrap();
    drop(store);

    let url = format!("redb:{}", crashed.display());
    let store = open_url(&url, OpenOptions::new().read_only(true))
        .await
        .unwrap();
    assert_eq!(store.thread_id("s1").await.unwrap().as_deref(), Some("t1"));
    assert!(store.verify(&mut |_| {}).await.unwrap().is_ok());
    let commit = store
        .commit_turn(TurnCommit::new("s1", "t1", vec![json!({"text": "again"})]))
        .await;
    assert!(is_not_writable(&commit), "{commit:?}");
    drop(store);
    let store = open_url(&url, OpenOptions::new().read_only(true))
        .await
        .unwrap();
    assert_eq!(store.all_rows("s1").await.unwrap().len(), 1);
}

/// redb admits one writing process per file: a read-only open is refused (`Locked`) while a
/// host holds the file, and a host while one reads it; readers share it.
#[tokio::test]
async fn redb_readers_share_the_file_and_exclude_a_writer() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("redb:{}", dir.path().join("s.redb").display());
    let read_only = || OpenOptions::new().read_only(true);
    let host = open_url(&url, OpenOptions::new()).await.unwrap();
    let refused = open_url(&url, read_only()).await;
    assert!(
        matches!(refused, Err(StoreError::Locked { .. })),
        "{refused:?}"
    );
    drop(host);
    let (first, second) = (
        open_url(&url, read_only()).await.unwrap(),
        open_url(&url, read_only()).await.unwrap(),
    );
    let refused = open_url(&url, OpenOptions::new()).await;
    assert!(
        matches!(refused, Err(StoreError::Locked { .. })),
        "{refused:?}"
    );
    drop((first, second));
    open_url(&url, OpenOptions::new()).await.unwrap();
}
