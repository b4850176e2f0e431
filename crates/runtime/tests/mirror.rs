//! The rollout mirror's file side ([`RolloutMirror`]) on real files: what a commit takes of a
//! thread's rollout, and what a restore does to a home that lacks it, holds a strict prefix,
//! holds more, diverged, has a torn tail, or holds a paginated thread's head file beside its
//! source. Codex's `state_5.sqlite` is never touched; its history index loses the thread's
//! rows only when a diverged copy was replaced.

#[cfg(unix)]
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use rethread_runtime::binding::{commit_turn, Committed, TurnRows};
use rethread_runtime::{MirrorError, MirrorReport, Publication, RolloutMirror, Transcript};
use rethread_store::{BindingStore, MirrorAppend, MirrorUpdate, TurnCommit};
use serde_json::json;

const THREAD: &str = "01a2329f-e3f7-7240-889a-d40328142d21";
const DIR: &str = "sessions/2026/12/01";

fn source() -> String {
    format!("{DIR}/rollout-2026-12-01T17-21-09-{THREAD}.jsonl")
}

fn head() -> String {
    format!("{DIR}/rollout-2026-12-01T17-21-09-{THREAD}_01a2329f-e5b6-7042-9394-7a57204ad2b7.jsonl")
}

fn line(kind: &str, text: &str) -> String {
    format!("{}\n", json!({"type": kind, "payload": {"text": text}}))
}

fn write(home: &Path, rel: &str, text: &str) {
    let path = home.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn append(home: &Path, rel: &str, text: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(home.join(rel))
        .unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

fn read(home: &Path, rel: &str) -> String {
    std::fs::read_to_string(home.join(rel)).unwrap()
}

async fn commit(store: &BindingStore, mirror: &RolloutMirror) -> Committed {
    let rows = [json!({"role": "user", "text": "turn"})];
    let turn = TurnRows::new("s", THREAD, &rows).mirror(Some(mirror));
    commit_turn(store, &Transcript::Store, None, turn)
        .await
        .unwrap()
}

async fn stored(store: &BindingStore, rel: &str) -> Option<String> {
    store
        .mirror_file("s", THREAD, rel)
        .await
        .unwrap()
        .map(|bytes| String::from_utf8(bytes).unwrap())
}

/// A failed restore left nothing in the thread's folder of `home`: no rollout, no temp file.
fn assert_nothing_left(home: &Path) {
    let left: Vec<_> = std::fs::read_dir(home.join(DIR))
        .map(|dir| dir.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

/// Home A ran two turns of the thread and committed each with its mirror.
async fn two_turns_on_a(store: &BindingStore) -> (tempfile::TempDir, String) {
    let a = tempfile::tempdir().unwrap();
    let mirror = RolloutMirror::new(a.path());
    write(a.path(), &source(), &line("session_meta", "meta"));
    append(a.path(), &source(), &line("turn", "one"));
    assert_eq!(commit(store, &mirror).await.mirror, MirrorReport::Written);
    append(a.path(), &source(), &line("turn", "two"));
    assert_eq!(commit(store, &mirror).await.mirror, MirrorReport::Written);
    let text = read(a.path(), &source());
    assert_eq!(
        stored(store, &source()).await.as_deref(),
        Some(text.as_str())
    );
    (a, text)
}

#[tokio::test]
async fn a_commit_takes_what_the_rollout_grew_by_in_whole_lines() {
    let store = BindingStore::memory();
    let home = tempfile::tempdir().unwrap();
    let mirror = RolloutMirror::new(home.path());
    write(home.path(), &source(), &line("session_meta", "meta"));
    let committed = commit(&store, &mirror).await;
    assert_eq!(committed.publication, Publication::Published);
    assert_eq!(committed.mirror, MirrorReport::Written);
    // A record still being written (no newline yet) is not mirrored.
    append(home.path(), &source(), &line("turn", "one"));
    append(home.path(), &source(), "{\"type\":\"turn\",\"pay");
    commit(&store, &mirror).await;
    let whole = line("session_meta", "meta") + &line("turn", "one");
    assert_eq!(stored(&store, &source()).await, Some(whole.clone()));
    // Once the line is complete the rest goes, appended to what the store holds.
    append(home.path(), &source(), "load\":{}}\n");
    commit(&store, &mirror).await;
    assert_eq!(
        stored(&store, &source()).await,
        Some(read(home.path(), &source()))
    );
    let record = store.require_session("s").await.unwrap();
    let file = record.mirror.files_of(THREAD).next().unwrap();
    // Only the growth was sent: the first line, then each addition (the longer first chunk is
    // not merged with the shorter ones after it).
    let meta = line("session_meta", "meta").len() as u64;
    let one = line("turn", "one").len() as u64;
    assert_eq!(file.chunk_lens, [meta, one, file.len - meta - one]);
}

#[tokio::test]
async fn a_thread_whose_rollout_is_not_under_the_home_commits_without_a_mirror() {
    let store = BindingStore::memory();
    let home = tempfile::tempdir().unwrap();
    let mirror = RolloutMirror::new(home.path());
    let committed = commit(&store, &mirror).await;
    assert_eq!(committed.publication, Publication::Published);
    assert!(
        matches!(&committed.mirror, MirrorReport::Failed(m) if m.contains("no rollout of thread")),
        "{committed:?}"
    );
    assert!(store
        .require_session("s")
        .await
        .unwrap()
        .mirror
        .files
        .is_empty());
}

#[tokio::test]
async fn a_home_that_lacks_the_rollout_gets_it_at_the_same_path() {
    let store = BindingStore::memory();
    let (_a, text) = two_turns_on_a(&store).await;
    let b = tempfile::tempdir().unwrap();
    let restored = RolloutMirror::new(b.path())
        .restore(&store, "s", THREAD)
        .await
        .unwrap();
    assert_eq!(restored.written, [source()]);
    assert!(!restored.diverged);
    assert_eq!(read(b.path(), &source()), text);
    // Nothing else: no temp file left, codex's own files untouched (there are none).
    let names: Vec<_> = std::fs::read_dir(b.path().join(DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(!b.path().join("state_5.sqlite").exists());
}

/// A restore writes only the thread's own rollout files: a store whose mirror of this thread
/// names another thread's rollout (written by another program, or damaged) gets nothing
/// written, so one session's mirror can never rewrite another thread's history in a home.
#[tokio::test]
async fn a_mirror_naming_another_threads_rollout_is_refused_and_nothing_is_written() {
    let store = BindingStore::memory();
    let other =
        format!("{DIR}/rollout-2026-12-01T17-21-09-019a0000-0000-7000-8000-000000000000.jsonl");
    let update = MirrorUpdate::new(vec![MirrorAppend::whole(
        &other,
        line("turn", "not yours").into_bytes(),
    )]);
    store
        .commit_turn(
            TurnCommit::new("s", THREAD, vec![json!({"role": "user"})]).mirror(Some(update)),
        )
        .await
        .unwrap();
    let b = tempfile::tempdir().unwrap();
    let restored = RolloutMirror::new(b.path())
        .restore(&store, "s", THREAD)
        .await;
    assert!(
        matches!(restored, Err(MirrorError::BadPath(_))),
        "{restored:?}"
    );
    assert_nothing_left(b.path());
}

/// A mirrored file without one whole line (written outside rethread, or damaged) has nothing
/// to restore: the home's own copy is kept as it is, never replaced by an empty file.
#[tokio::test]
async fn a_mirror_without_a_whole_line_never_replaces_the_homes_copy() {
    let store = BindingStore::memory();
    let update = MirrorUpdate::new(vec![MirrorAppend::whole(
        source(),
        b"{\"type\":\"session_meta\"".to_vec(),
    )]);
    store
        .commit_turn(
            TurnCommit::new("s", THREAD, vec![json!({"role": "user"})]).mirror(Some(update)),
        )
        .await
        .unwrap();
    let b = tempfile::tempdir().unwrap();
    let local = line("turn", "here");
    write(b.path(), &source(), &local);
    let restored = RolloutMirror::new(b.path())
        .restore(&store, "s", THREAD)
        .await;
    assert_eq!(read(b.path(), &source()), local, "{restored:?}");
    assert!(restored.is_err(), "{restored:?}");
}

/// What `doctor` calls restorable is what a restore would write: a thread whose files are all
/// its own rollouts, mirroring not stopped.
#[tokio::test]
async fn a_thread_can_be_restored_only_from_files_a_restore_would_write() {
    let store = BindingStore::memory();
    let (_a, _) = two_turns_on_a(&store).await;
    let record = store.require_session("s").await.unwrap();
    assert!(RolloutMirror::can_restore(&record, THREAD));
    assert!(!RolloutMirror::can_restore(
        &record,
        "019a0000-0000-7000-8000-000000000000"
    ));
    let mut config = record.clone();
    config.mirror.files[0].path = "config.toml".to_string();
    assert!(!RolloutMirror::can_restore(&config, THREAD));
    let mut stopped = record;
    stopped.mirror.stopped = true;
    assert!(!RolloutMirror::can_restore(&stopped, THREAD));
}

/// A process that died mid-restore left its temp file; the next restore into that folder
/// removes it once it is old enough that no live restore can be writing it, and leaves a
/// fresh one (another process's restore under way) and anything not a restore's temp file.
#[tokio::test]
async fn a_dead_restores_temp_file_is_removed_by_the_next_restore() {
    let store = BindingStore::memory();
    let (_a, text) = two_turns_on_a(&store).await;
    let b = tempfile::tempdir().unwrap();
    let name = |pid: u32| format!(".rethread-restore-{pid}-0-rollout-x.jsonl.tmp");
    let (dead, live, other) = (name(4_000_001), name(4_000_002), "notes.tmp".to_string());
    let hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 3600);
    for left in [&dead, &live, &other] {
        write(b.path(), &format!("{DIR}/{left}"), "partial");
    }
    for old in [&dead, &other] {
        std::fs::File::options()
            .write(true)
            .open(b.path().join(DIR).join(old))
            .unwrap()
            .set_modified(hours_ago)
            .unwrap();
    }
    RolloutMirror::new(b.path())
        .restore(&store, "s", THREAD)
        .await
        .unwrap();
    assert_eq!(read(b.path(), &source()), text);
    let mut names: Vec<_> = std::fs::read_dir(b.path().join(DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut kept = vec![
        live,
        other,
        source().rsplit('/').next().unwrap().to_string(),
    ];
    kept.sort();
    assert_eq!(names, kept);
}

/// Whoever can write the sessions folder (a home shared between containers) can guess the
/// temp file's name: a link planted there is never written through, and its target is kept.
#[cfg(unix)]
#[tokio::test]
async fn a_link_planted_at_the_temp_files_name_is_never_written_through() {
    let store = BindingStore::memory();
    let (_a, text) = two_turns_on_a(&store).await;
    let b = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("precious");
    std::fs::write(&target, "keep me").unwrap();
    let dir = b.path().join(DIR);
    std::fs::create_dir_all(&dir).unwrap();
    let name = source().rsplit('/').next().unwrap().to_string();
    // Every name this process's restores may take (the counter is shared by the tests).
    for restore in 0..512 {
        let temp = format!(
            ".rethread-restore-{}-{restore}-{name}.tmp",
            std::process::id()
        );
        std::os::unix::fs::symlink(&target, dir.join(temp)).unwrap();
    }
    RolloutMirror::new(b.path())
        .restore(&store, "s", THREAD)
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    assert_eq!(read(b.path(), &source()), text);
    let restored = std::fs::symlink_metadata(b.path().join(source())).unwrap();
    assert!(
        restored.file_type().is_file(),
        "the rollout is a file, not a link"
    );
}

/// A FIFO (or any file that is not a regular file) at the rollout's path is refused, never
/// opened: opening a FIFO blocks until a writer comes, and the open would hold the lease.
#[cfg(unix)]
#[tokio::test]
async fn a_fifo_at_the_rollouts_path_is_refused_not_waited_on() {
    let store = BindingStore::memory();
    let (_a, _text) = two_turns_on_a(&store).await;
    let b = tempfile::tempdir().unwrap();
    let fifo = b.path().join(source());
    std::fs::create_dir_all(fifo.parent().unwrap()).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let mirror = RolloutMirror::new(b.path());
    let restore = mirror.restore(&store, "s", THREAD);
    let restored = tokio::time::timeout(std::time::Duration::from_secs(10), restore)
        .await
        .expect("the restore waited on the FIFO");
    assert!(restored.is_err(), "{restored:?}");
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    // At the compressed form's path, where codex would read it (no plain file): the same.
    std::fs::remove_file(&fifo).unwrap();
    let zst = b.path().join(format!("{}.zst", source()));
    let made = std::process::Command::new("mkfifo")
        .arg(&zst)
        .status()
        .unwrap();
    assert!(made.success());
    let restore = mirror.restore(&store, "s", THREAD);
    let restored = tokio::time::timeout(std::time::Duration::from_secs(10), restore)
        .await
        .expect("the restore waited on the FIFO");
    assert!(
        matches!(&restored, Err(MirrorError::InTheWay { path, .. }) if *path == zst),
        "{restored:?}"
    );
}

/// The store streams a file into the restore as it reads it: a mirror whose damage shows
/// only after its first chunk was written leaves nothing behind, no rollout, no temp file.
#[tokio::test]
async fn a_mirror_damaged_part_way_through_leaves_no_file_behind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite");
    let store = rethread_store::BindingStore::sqlite(&path, Default::default())
        .await
        .unwrap();
    let (_a, _) = two_turns_on_a(&store).await;
    let record = store.require_session("s").await.unwrap();
    assert_eq!(record.mirror.files[0].chunks(), 2);
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute("DELETE FROM mirror_chunks WHERE seq = 1", [])
        .unwrap();
    let b = tempfile::tempdir().unwrap();
    let restored = RolloutMirror::new(b.path())
        .restore(&store, "s", THREAD)
        .await;
    assert!(restored.is_err(), "{restored:?}");
    assert_nothing_left(b.path());
}

/// A stored chunk damaged since (another program, a disk) must not stop the session's turns
/// from committing: the commit that meets it sends the rollout whole, which replaces the
/// damaged mirror, and the rows and the binding commit with it.
#[tokio::test]
async fn a_damaged_stored_chunk_is_replaced_by_the_next_commit_not_blocking_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite");
    let store = rethread_store::BindingStore::sqlite(&path, Default::default())
        .await
        .unwrap();
    let a = tempfile::tempdir().unwrap();
    let mirror = RolloutMirror::new(a.path());
    write(a.path(), &source(), &line("session_meta", "meta"));
    append(a.path(), &source(), &line("turn", "one"));
    assert_eq!(commit(&store, &mirror).await.mirror, MirrorReport::Written);
    append(a.path(), &source(), &line("turn", "two"));
    assert_eq!(commit(&store, &mirror).await.mirror, MirrorReport::Written);
    let changed = rusqlite::Connection::open(&path)
        .unwrap()
        .execute(
            "UPDATE mirror_chunks SET bytes = CAST(replace(CAST(bytes AS TEXT), 'two', 'tWo') AS BLOB) WHERE seq = 1",
            [],
        )
        .unwrap();
    assert_eq!(changed, 1);
    // The next turn's growth is merged with the damaged chunk at the tail.
    append(a.path(), &source(), &line("turn", "three"));
    let rows = [json!({"role": "user", "text": "turn"})];
    let turn = TurnRows::new("s", THREAD, &rows).mirror(Some(&mirror));
    let committed = commit_turn(&store, &Transcript::Store, None, turn).await;
    let committed = committed.expect("the turn commits");
    assert_eq!(committed.mirror, MirrorReport::Written);
    assert_eq!(store.all_rows("s").await.unwrap().len(), 3);
    let text = read(a.path(), &source());
    assert_eq!(
        stored(&store, &source()).await.as_deref(),
        Some(text.as_str())
    );
}

/// A restore makes the temp file of every file the home needs before the store writes the
/// first: when the first file's mirror is damaged, the temp file of the file not reached goes
/// too.
#[tokio::test]
async fn a_damaged_first_file_leaves_no_temp_file_of_the_next_behind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite");
    let store = rethread_store::BindingStore::sqlite(&path, Default::default())
        .await
        .unwrap();
    let (a, _) = two_turns_on_a(&store).await;
    let mirror = RolloutMirror::new(a.path());
    mirror.restore(&store, "s", THREAD).await.unwrap();
    write(a.path(), &head(), &line("session_meta", "history_base"));
    assert_eq!(commit(&store, &mirror).await.mirror, MirrorReport::Written);
    let record = store.require_session("s").await.unwrap();
    let paths: Vec<_> = record.mirror.files.iter().map(|f| f.path.clone()).collect();
    assert_eq!(paths, [source(), head()]);
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute(
            "DELETE FROM mirror_chunks WHERE seq = 1 AND path = ?1",
            [source()],
        )
        .unwrap();
    let b = tempfile::tempdir().unwrap();
    let restored = RolloutMirror::new(b.path())
        .restore(&store, "s", THREAD)
        .await;
    assert!(restored.is_err(), "{restored:?}");
    assert_nothing_left(b.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_restores_of_one_thread_into_one_home_at_once_each_write_the_mirror_whole() {
    // Two openers of the session in one process (two binders without a lease, say) may
    // restore the same thread into the same home together; neither may tear the other's file.
    let store = BindingStore::memory();
    let a = tempfile::tempdir().unwrap();
    let mirror = RolloutMirror::new(a.path());
    write(a.path(), &source(), &line("session_meta", "meta"));
    for turn in 0..4 {
        append(
            a.path(),
            &source(),
            &line("turn", &format!("{turn}{}", "x".repeat(512 << 10))),
        );
        assert_eq!(commit(&store, &mirror).await.mirror, MirrorReport::Written);
    }
    let text = read(a.path(), &source());
    for _ in 0..10 {
        let b = tempfile::tempdir().unwrap();
        let (first, second) = (RolloutMirror::new(b.path()), RolloutMirror::new(b.path()));
        let (one, two) = tokio::join!(
            first.restore(&store, "s", THREAD),
            second.restore(&store, "s", THREAD)
        );
        one.unwrap();
        two.unwrap();
        assert!(
            read(b.path(), &source()) == text,
            "the restored rollout is not the mirror"
        );
        let names: Vec<_> = std::fs::read_dir(b.path().join(DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "temp files left behind: {names:?}");
    }
}

#[tokio::test]
async fn a_strict_prefix_is_completed_and_a_longer_copy_is_left_as_it_is() {
    let store = BindingStore::memory();
    let (_a, text) = two_turns_on_a(&store).await;
    let b = tempfile::tempdir().unwrap();
    write(b.path(), &source(), &line("session_meta", "meta"));
    let restored = RolloutMirror::new(b.path())
        .restore(&store, "s", THREAD)
        .await
        .unwrap();
    assert_eq!(restored.written, [source()]);
    assert!(!restored.diverged);
    assert_eq!(read(b.path(), &source()), text);

    // A copy the mirror is a prefix of: a turn codex ran there that was never committed.
    let c = tempfile::tempdir().unwrap();
    let longer = text.clone() + &line("turn", "uncommitted");
    write(c.path(), &source(), &longer);
    let mirror = RolloutMirror::new(c.path());
    let restored = mirror.restore(&store, "s", THREAD).await.unwrap();
    assert!(restored.written.is_empty());
    assert_eq!(read(c.path(), &source()), longer);
    // The next commit there sends what the store lacks: the uncommitted turn and the new one.
    append(c.path(), &source(), &line("turn", "three"));
    commit(&store, &mirror).await;
    assert_eq!(
        stored(&store, &source()).await,
        Some(read(c.path(), &source()))
    );
}

/// A history index as a paginated codex keeps it: rows of the thread and of another.
fn history_index(home: &Path) -> PathBuf {
    let path = home.join("thread_history_1.sqlite");
    let db = rusqlite::Connection::open(&path).unwrap();
    db.execute_batch(
        "CREATE TABLE thread_turns (thread_id TEXT, turn_id TEXT);
         CREATE TABLE thread_items (thread_id TEXT, item_id TEXT);
         CREATE TABLE thread_history_projection_state (thread_id TEXT PRIMARY KEY, next_rollout_byte_offset INTEGER);",
    )
    .unwrap();
    for thread in [THREAD, "other-thread"] {
        db.execute("INSERT INTO thread_turns VALUES (?1, 'turn')", [thread])
            .unwrap();
        db.execute("INSERT INTO thread_items VALUES (?1, 'item')", [thread])
            .unwrap();
        db.execute(
            "INSERT INTO thread_history_projection_state VALUES (?1, 10)",
            [thread],
        )
        .unwrap();
    }
    path
}

fn rows_of(index: &Path, thread: &str) -> i64 {
    let db = rusqlite::Connection::open(index).unwrap();
    [
        "thread_turns",
        "thread_items",
        "thread_history_projection_state",
    ]
    .iter()
    .map(|table| {
        db.query_row(
            &format!("SELECT count(*) FROM {table} WHERE thread_id = ?1"),
            [thread],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
    })
    .sum()
}

#[tokio::test]
async fn a_diverged_copy_is_replaced_and_the_threads_history_index_rows_go() {
    let store = BindingStore::memory();
    let (_a, text) = two_turns_on_a(&store).await;
    let b = tempfile::tempdir().unwrap();
    let diverged = line("session_meta", "meta") + &line("turn", "one") + &line("turn", "elsewhere");
    write(b.path(), &source(), &diverged);
    let index = history_index(b.path());
    let state = b.path().join("state_5.sqlite");
    std::fs::write(&state, b"codex's own index, never touched").unwrap();
    let restored = RolloutMirror::new(b.path())
        .restore(&store, "s", THREAD)
        .await
        .unwrap();
    assert!(restored.diverged);
    assert_eq!(restored.index_error, None);
    assert_eq!(read(b.path(), &source()), text, "the mirror wins");
    assert_eq!(rows_of(&index, THREAD), 0);
    assert_eq!(
        rows_of(&index, "other-thread"),
        3,
        "other threads keep theirs"
    );
    assert_eq!(
        std::fs::read(&state).unwrap(),
        b"codex's own index, never touched"
    );

    // A strict prefix is no divergence: the index is left alone.
    let c = tempfile::tempdir().unwrap();
    write(c.path(), &source(), &line("session_meta", "meta"));
    let index = history_index(c.path());
    let restored = RolloutMirror::new(c.path())
        .restore(&store, "s", THREAD)
        .await
        .unwrap();
    assert!(!restored.diverged);
    assert_eq!(rows_of(&index, THREAD), 3);
}

/// The history index goes before a diverged copy is replaced, not after the whole restore:
/// a restore that fails on a later file (or a host that dies) after the rename would
/// otherwise leave the index of the replaced turns for good, since the next restore finds the
/// file whole and sees no divergence.
#[tokio::test]
async fn a_restore_failing_after_a_diverged_copy_was_replaced_still_clears_its_index() {
    let memory = BindingStore::memory();
    let (a, _text) = two_turns_on_a(&memory).await;
    let mirror = RolloutMirror::new(a.path());
    write(a.path(), &head(), &line("session_meta", "history_base"));
    assert_eq!(commit(&memory, &mirror).await.mirror, MirrorReport::Written);
    let b = tempfile::tempdir().unwrap();
    let diverged = line("session_meta", "meta") + &line("turn", "elsewhere");
    write(b.path(), &source(), &diverged);
    let index = history_index(b.path());
    let faults = rethread_testkit::faulty_store::Faults::default();
    // The source is read first (its name sorts first), then the head file's read fails.
    faults.fail("write_mirror_file", 2);
    let store = rethread_testkit::faulty_store::over(memory.clone(), faults);
    let restored = RolloutMirror::new(b.path())
        .restore(&store, "s", THREAD)
        .await;
    assert!(restored.is_err(), "{restored:?}");
    assert_ne!(
        read(b.path(), &source()),
        diverged,
        "the source was replaced"
    );
    assert_eq!(rows_of(&index, THREAD), 0);
    RolloutMirror::new(b.path())
        .restore(&memory, "s", THREAD)
        .await
        .unwrap();
    assert_eq!(rows_of(&index, THREAD), 0);
    assert_eq!(rows_of(&index, "other-thread"), 3);
}

#[tokio::test]
async fn a_torn_tail_is_completed_from_the_mirror_or_left_for_codex() {
    let store = BindingStore::memory();
    let (_a, text) = two_turns_on_a(&store).await;
    // A writer killed mid-append left a partial line that the mirror goes on past: the home
    // holds a strict prefix, and the mirror completes it.
    let b = tempfile::tempdir().unwrap();
    let cut = text.len() - 5;
    write(b.path(), &source(), &text[..cut]);
    let restored = RolloutMirror::new(b.path())
        .restore(&store, "s", THREAD)
        .await
        .unwrap();
    assert!(!restored.diverged);
    assert_eq!(read(b.path(), &source()), text);
    // A partial line after everything the mirror holds: left (codex closes it on resume).
    let c = tempfile::tempdir().unwrap();
    let torn = text.clone() + "{\"type\":\"tu";
    write(c.path(), &source(), &torn);
    let restored = RolloutMirror::new(c.path())
        .restore(&store, "s", THREAD)
        .await
        .unwrap();
    assert!(restored.written.is_empty());
    assert_eq!(read(c.path(), &source()), torn);
    // Garbage in place of the last line: diverged, replaced.
    let d = tempfile::tempdir().unwrap();
    write(
        d.path(),
        &source(),
        &(line("session_meta", "meta") + "\0\0\0garbage"),
    );
    let restored = RolloutMirror::new(d.path())
        .restore(&store, "s", THREAD)
        .await
        .unwrap();
    assert!(restored.diverged);
    assert_eq!(read(d.path(), &source()), text);
}

#[tokio::test]
async fn a_paginated_head_file_is_mirrored_and_restored_with_its_source() {
    let store = BindingStore::memory();
    let (a, text) = two_turns_on_a(&store).await;
    // A paginated `thread/revert`: the source stays, a head file starts beside it.
    let mirror = RolloutMirror::new(a.path());
    mirror.restore(&store, "s", THREAD).await.unwrap();
    write(a.path(), &head(), &line("session_meta", "history_base"));
    append(a.path(), &head(), &line("turn", "after the revert"));
    assert_eq!(commit(&store, &mirror).await.mirror, MirrorReport::Written);
    let head_text = read(a.path(), &head());
    assert_eq!(stored(&store, &head()).await, Some(head_text.clone()));
    assert_eq!(stored(&store, &source()).await, Some(text.clone()));

    let b = tempfile::tempdir().unwrap();
    let restored = RolloutMirror::new(b.path())
        .restore(&store, "s", THREAD)
        .await
        .unwrap();
    let mut written = restored.written.clone();
    written.sort();
    assert_eq!(written, [source(), head()]);
    assert_eq!(read(b.path(), &source()), text);
    assert_eq!(read(b.path(), &head()), head_text);
}

#[tokio::test]
async fn a_stale_idea_of_the_stored_file_is_refused_then_sent_whole() {
    let store = BindingStore::memory();
    let (a, _) = two_turns_on_a(&store).await;
    let mirror_a = RolloutMirror::new(a.path());
    mirror_a.restore(&store, "s", THREAD).await.unwrap();
    // Another home mirrored the thread meanwhile (the store's file is not what A knows).
    let b = tempfile::tempdir().unwrap();
    write(
        b.path(),
        &source(),
        &(line("session_meta", "meta") + &line("turn", "on b")),
    );
    commit(&store, &RolloutMirror::new(b.path())).await;
    append(a.path(), &source(), &line("turn", "three"));
    let committed = commit(&store, &mirror_a).await;
    assert_eq!(committed.mirror, MirrorReport::Written);
    assert_eq!(
        stored(&store, &source()).await,
        Some(read(a.path(), &source()))
    );
}

#[tokio::test]
async fn nothing_is_restored_without_a_mirror_or_once_mirroring_stopped() {
    let store = BindingStore::memory();
    let home = tempfile::tempdir().unwrap();
    let restored = RolloutMirror::new(home.path())
        .restore(&store, "s", THREAD)
        .await
        .unwrap();
    assert!(restored.written.is_empty() && !restored.stopped);

    let a = tempfile::tempdir().unwrap();
    let small = RolloutMirror::with_cap(a.path(), 10);
    write(
        a.path(),
        &source(),
        &line("session_meta", "longer than ten bytes"),
    );
    let committed = commit(&store, &small).await;
    assert!(
        matches!(committed.mirror, MirrorReport::StoppedNow { cap: 10, .. }),
        "{committed:?}"
    );
    assert_eq!(commit(&store, &small).await.mirror, MirrorReport::Stopped);
    let restored = RolloutMirror::new(home.path())
        .restore(&store, "s", THREAD)
        .await
        .unwrap();
    assert!(restored.stopped);
    assert!(!home.path().join(source()).exists());
}

/// Another writer rewrote the rollout in place between two turns (the same file, as long as
/// before or longer): the store's start is no longer the file's, so the commit sends the file
/// whole, never the old start spliced to the new tail.
#[tokio::test]
async fn a_rollout_rewritten_in_place_is_sent_whole_never_spliced() {
    use std::io::{Seek, Write};
    for extra in ["", "and longer"] {
        let store = BindingStore::memory();
        let (a, text) = two_turns_on_a(&store).await;
        let mirror = RolloutMirror::new(a.path());
        mirror.restore(&store, "s", THREAD).await.unwrap();
        // Same length as what the store holds, other bytes, then maybe more: written over the
        // file through the same inode.
        let first = line("session_meta", "META");
        let rest = text.len() - first.len();
        let more = if extra.is_empty() {
            String::new()
        } else {
            line("turn", extra)
        };
        let rewritten = first + &"x".repeat(rest - 1) + "\n" + &more;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(a.path().join(source()))
            .unwrap();
        file.rewind().unwrap();
        file.write_all(rewritten.as_bytes()).unwrap();
        drop(file);
        assert_eq!(read(a.path(), &source()), rewritten);
        assert_eq!(commit(&store, &mirror).await.mirror, MirrorReport::Written);
        assert_eq!(
            stored(&store, &source()).await,
            Some(rewritten),
            "{extra:?}"
        );
    }
}

/// A directory link under the home that leads out of it (`sessions/` itself, or a folder
/// below it) is never followed by a restore: it fails, and nothing is written outside the home
/// (the link's target stays empty). The home itself may be a link.
#[cfg(unix)]
#[tokio::test]
async fn a_restore_follows_no_link_out_of_the_home() {
    let store = BindingStore::memory();
    let (_a, _text) = two_turns_on_a(&store).await;
    for linked in ["sessions", "sessions/2026", DIR] {
        let b = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let link = b.path().join(linked);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(outside.path(), &link).unwrap();
        let restored = RolloutMirror::new(b.path())
            .restore(&store, "s", THREAD)
            .await;
        let err = restored.expect_err(linked);
        // Issue 41, item 8: no retry passes while the link stays (it was an I/O error, which
        // may pass: every open then ended "retry later").
        assert!(!err.is_transient(), "{linked}: {err}");
        let err = err.to_string();
        assert!(err.contains("link"), "{err}");
        let mut found = Vec::new();
        let mut dirs = vec![outside.path().to_path_buf()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path.clone());
                }
                found.push(path);
            }
        }
        let files: Vec<_> = found.iter().filter(|p| p.is_file()).collect();
        assert!(
            files.is_empty(),
            "{linked}: written outside the home: {files:?}"
        );
    }
}

/// Codex's history index at the home's top is a link out of it: a restore that replaces a
/// diverged copy does not clear rows through it (said in `index_error`); the linked file keeps
/// every row.
#[cfg(unix)]
#[tokio::test]
async fn a_restore_clears_no_history_index_through_a_link() {
    let store = BindingStore::memory();
    let (_a, text) = two_turns_on_a(&store).await;
    let b = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let index = history_index(outside.path());
    std::os::unix::fs::symlink(&index, b.path().join("thread_history_1.sqlite")).unwrap();
    let diverged = line("session_meta", "meta") + &line("turn", "elsewhere");
    write(b.path(), &source(), &diverged);
    let restored = RolloutMirror::new(b.path())
        .restore(&store, "s", THREAD)
        .await
        .unwrap();
    assert!(restored.diverged);
    assert_eq!(read(b.path(), &source()), text);
    let said = restored.index_error.expect("the link is said");
    assert!(said.contains("link"), "{said}");
    assert_eq!(
        rows_of(&index, THREAD),
        3,
        "nothing cleared outside the home"
    );
}

/// A fork's mirror carries its source's rollout (codex 0.171.0 refuses a paginated fork
/// without it): a restore writes the source only when the fork's own rollout, as restored,
/// names it (`forked_from_id`), and only where the home lacks it: a home's own copy of the
/// source is that thread's, left as it is.
#[tokio::test]
async fn a_forks_source_is_restored_only_as_named_and_only_where_missing() {
    const SOURCE: &str = "019a0000-0000-7000-8000-000000000000";
    let source_file = format!("{DIR}/rollout-2026-12-01T17-00-00-{SOURCE}.jsonl");
    let source_text = line("turn", "the source's turn");
    let fork_meta = |from: &str| {
        let meta =
            json!({"type": "session_meta", "payload": {"id": THREAD, "forked_from_id": from}});
        format!("{meta}\n{}", line("turn", "the fork's turn"))
    };
    let commit_fork = |store: BindingStore, from: &str| {
        let update = MirrorUpdate::new(vec![
            MirrorAppend::whole(source(), fork_meta(from).into_bytes()),
            MirrorAppend::whole(&source_file, source_text.clone().into_bytes()),
        ]);
        let turn = TurnCommit::new("s", THREAD, vec![json!({"role": "user"})]);
        async move { store.commit_turn(turn.mirror(Some(update))).await.unwrap() }
    };
    let store = BindingStore::memory();
    commit_fork(store.clone(), SOURCE).await;
    // An empty home: both.
    let b = tempfile::tempdir().unwrap();
    let mirror = RolloutMirror::new(b.path());
    let restored = mirror.restore(&store, "s", THREAD).await.unwrap();
    assert_eq!(restored.written, [source(), source_file.clone()]);
    assert_eq!(read(b.path(), &source_file), source_text);
    // A home holding the source as it went on there: the fork only, the source left.
    let c = tempfile::tempdir().unwrap();
    let theirs = line("turn", "the source went on here");
    write(c.path(), &source_file, &theirs);
    let restored = RolloutMirror::new(c.path())
        .restore(&store, "s", THREAD)
        .await
        .unwrap();
    assert_eq!(restored.written, [source()]);
    assert_eq!(read(c.path(), &source_file), theirs);
    // A fork naming another source: the file it does not name is refused.
    let store = BindingStore::memory();
    commit_fork(store.clone(), "019a0000-0000-7000-8000-0000000000ff").await;
    let d = tempfile::tempdir().unwrap();
    let restored = RolloutMirror::new(d.path())
        .restore(&store, "s", THREAD)
        .await;
    assert!(
        matches!(restored, Err(MirrorError::BadPath(_))),
        "{restored:?}"
    );
    assert!(!d.path().join(&source_file).exists());
}

/// codex compresses `rel` as its `local_thread_store_compression` worker does: `rel.zst`
/// holds `text` as zstd level 3, and the plain file is gone.
fn compress(home: &Path, rel: &str, text: &[u8]) -> PathBuf {
    use std::io::Write;
    let path = home.join(format!("{rel}.zst"));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut encoder =
        zstd::stream::write::Encoder::new(std::fs::File::create(&path).unwrap(), 3).unwrap();
    encoder.write_all(text).unwrap();
    encoder.finish().unwrap();
    let _ = std::fs::remove_file(home.join(rel));
    path
}

/// The names in the thread's folder of `home`.
fn names(home: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(home.join(DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn file_name(rel: &str) -> String {
    rel.rsplit('/').next().unwrap().to_string()
}

#[tokio::test]
async fn a_rollout_codex_compressed_between_two_turns_is_appended_to_not_sent_whole() {
    let store = BindingStore::memory();
    let a = tempfile::tempdir().unwrap();
    let mirror = RolloutMirror::new(a.path());
    write(a.path(), &source(), &line("session_meta", "meta"));
    append(a.path(), &source(), &line("turn", "one"));
    assert_eq!(commit(&store, &mirror).await.mirror, MirrorReport::Written);
    let held = read(a.path(), &source());
    // Compressed as it is: nothing to send, the same bytes under the plain path.
    compress(a.path(), &source(), held.as_bytes());
    let prepared = mirror.prepare(THREAD).await.unwrap();
    assert!(prepared.update.appends.is_empty(), "{prepared:?}");
    // Compressed once it held more (a turn never committed, then a week idle): only that.
    let longer = held.clone() + &line("turn", "two");
    compress(a.path(), &source(), longer.as_bytes());
    let prepared = mirror.prepare(THREAD).await.unwrap();
    let [append] = &prepared.update.appends[..] else {
        panic!("{prepared:?}")
    };
    assert_eq!(append.path, source(), "the plain path");
    assert_eq!(
        append.base_len,
        held.len() as u64,
        "an append, not the file whole"
    );
    assert_eq!(append.bytes, line("turn", "two").as_bytes());
    assert_eq!(commit(&store, &mirror).await.mirror, MirrorReport::Written);
    assert_eq!(stored(&store, &source()).await, Some(longer.clone()));
    // A new process knows nothing: the compressed file goes whole, decompressed.
    let fresh = RolloutMirror::new(a.path());
    let prepared = fresh.prepare(THREAD).await.unwrap();
    let [append] = &prepared.update.appends[..] else {
        panic!("{prepared:?}")
    };
    assert_eq!((append.base_len, &append.bytes[..]), (0, longer.as_bytes()));
}

#[tokio::test]
async fn a_compressed_copy_is_kept_when_it_extends_the_mirror_else_the_plain_file_replaces_it() {
    let store = BindingStore::memory();
    let (_a, text) = two_turns_on_a(&store).await;
    let plain = file_name(&source());
    let compressed = format!("{plain}.zst");

    // The mirror and a turn never committed: kept as codex left it, compressed.
    let b = tempfile::tempdir().unwrap();
    let longer = text.clone() + &line("turn", "uncommitted");
    let zst = compress(b.path(), &source(), longer.as_bytes());
    let before = std::fs::read(&zst).unwrap();
    let mirror = RolloutMirror::new(b.path());
    let restored = mirror.restore(&store, "s", THREAD).await.unwrap();
    assert!(restored.written.is_empty(), "{restored:?}");
    assert_eq!(names(b.path()), [compressed.as_str()]);
    assert_eq!(std::fs::read(&zst).unwrap(), before, "untouched");
    // The next commit sends what the store lacks, from the compressed file.
    commit(&store, &mirror).await;
    assert_eq!(stored(&store, &source()).await, Some(longer));

    // A strict prefix, compressed: the plain file is written and the compressed one goes.
    let (store, c) = (BindingStore::memory(), tempfile::tempdir().unwrap());
    let (_a, text) = two_turns_on_a(&store).await;
    compress(c.path(), &source(), line("session_meta", "meta").as_bytes());
    let index = history_index(c.path());
    let restored = RolloutMirror::new(c.path())
        .restore(&store, "s", THREAD)
        .await
        .unwrap();
    assert_eq!(restored.written, [source()]);
    assert!(!restored.diverged);
    assert_eq!(names(c.path()), [plain.as_str()], "never both forms");
    assert_eq!(read(c.path(), &source()), text);
    assert_eq!(rows_of(&index, THREAD), 3, "no divergence");

    // A copy that diverged, compressed: replaced by the plain file, its index rows gone.
    let d = tempfile::tempdir().unwrap();
    let diverged = line("session_meta", "meta") + &line("turn", "elsewhere");
    compress(d.path(), &source(), diverged.as_bytes());
    let index = history_index(d.path());
    let restored = RolloutMirror::new(d.path())
        .restore(&store, "s", THREAD)
        .await
        .unwrap();
    assert!(restored.diverged);
    assert_eq!(names(d.path()), [plain.as_str()]);
    assert_eq!(read(d.path(), &source()), text, "the mirror wins");
    assert_eq!(rows_of(&index, THREAD), 0);

    // Both forms (codex stopped between writing one and removing the other): codex reads the
    // plain file, and so does the restore.
    let e = tempfile::tempdir().unwrap();
    compress(e.path(), &source(), diverged.as_bytes());
    write(e.path(), &source(), &text);
    let restored = RolloutMirror::new(e.path())
        .restore(&store, "s", THREAD)
        .await
        .unwrap();
    assert!(restored.written.is_empty(), "{restored:?}");
}

#[tokio::test]
async fn a_compressed_copy_that_does_not_decompress_is_replaced_and_never_mirrored() {
    let store = BindingStore::memory();
    let (_a, text) = two_turns_on_a(&store).await;
    let plain = file_name(&source());
    let longer = text.clone() + &line("turn", "uncommitted");
    let mut frames = Vec::new();
    zstd::stream::copy_encode(longer.as_bytes(), &mut frames, 3).unwrap();
    let damaged: [(&str, Vec<u8>); 3] = [
        ("not zstd at all", b"this is not a zstd frame\n".to_vec()),
        ("cut short", frames[..frames.len() - 4].to_vec()),
        ("a flipped byte", {
            let mut flipped = frames.clone();
            let at = flipped.len() / 2;
            flipped[at] ^= 0x55;
            flipped
        }),
    ];
    for (what, bytes) in damaged {
        let home = tempfile::tempdir().unwrap();
        let zst = home.path().join(format!("{}.zst", source()));
        std::fs::create_dir_all(zst.parent().unwrap()).unwrap();
        std::fs::write(&zst, &bytes).unwrap();
        // A commit cannot read it: a typed error, not one that passes by itself.
        let error = RolloutMirror::new(home.path())
            .prepare(THREAD)
            .await
            .unwrap_err();
        assert!(
            matches!(&error, MirrorError::Damaged { path, .. } if *path == zst),
            "{what}: {error:?}"
        );
        assert!(!error.is_transient(), "{what}");
        // A restore replaces it from the mirror, as a copy that diverged.
        let restored = RolloutMirror::new(home.path())
            .restore(&store, "s", THREAD)
            .await
            .unwrap();
        assert_eq!(restored.written, [source()], "{what}");
        assert!(restored.diverged, "{what}");
        assert_eq!(names(home.path()), [plain.as_str()], "{what}");
        assert_eq!(read(home.path(), &source()), text, "{what}");
    }
}

/// A fork's source that codex compressed still names in, and goes with, the fork's mirror:
/// read as codex reads it, under its plain path, as the JSONL it holds.
#[tokio::test]
async fn a_forks_source_codex_compressed_is_mirrored_as_the_jsonl_it_holds() {
    const SOURCE: &str = "019a0000-0000-7000-8000-000000000000";
    let source_file = format!("{DIR}/rollout-2026-12-01T17-00-00-{SOURCE}.jsonl");
    let source_text = line("session_meta", "the source") + &line("turn", "the source's turn");
    let store = BindingStore::memory();
    let a = tempfile::tempdir().unwrap();
    let meta = json!({"type": "session_meta", "payload": {"id": THREAD, "forked_from_id": SOURCE}});
    write(a.path(), &source(), &format!("{meta}\n"));
    compress(a.path(), &source_file, source_text.as_bytes());
    let mirror = RolloutMirror::new(a.path());
    assert_eq!(commit(&store, &mirror).await.mirror, MirrorReport::Written);
    assert_eq!(
        stored(&store, &source_file).await,
        Some(source_text.clone())
    );
    // A fork that codex compressed too: its first record is read through the decoder.
    let b = tempfile::tempdir().unwrap();
    compress(b.path(), &source(), format!("{meta}\n").as_bytes());
    compress(b.path(), &source_file, source_text.as_bytes());
    let store = BindingStore::memory();
    assert_eq!(
        commit(&store, &RolloutMirror::new(b.path())).await.mirror,
        MirrorReport::Written
    );
    assert_eq!(stored(&store, &source_file).await, Some(source_text));
}

/// A rollout of `turns` records of 1 KiB each after its `session_meta`: larger than the two
/// windows a commit checks (64 KiB at each end), so its middle is read by no check on them.
fn big_rollout(turns: usize, tag: &str) -> String {
    let mut text = line("session_meta", "meta");
    for turn in 0..turns {
        text += &line("turn", &format!("{tag}{turn:05}-{}", "y".repeat(1000)));
    }
    text
}

/// Overwrites the start of `rel` with `bytes`, through the same inode.
fn overwrite_start(home: &Path, rel: &str, bytes: &str) {
    use std::io::{Seek, Write};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(home.join(rel))
        .unwrap();
    file.rewind().unwrap();
    file.write_all(bytes.as_bytes()).unwrap();
}

/// Replaces `rel` by a new file holding `text` (a temp file renamed over it: a new inode).
fn replace(home: &Path, rel: &str, text: &str) {
    let temp = home.join(format!("{rel}.new"));
    std::fs::write(&temp, text).unwrap();
    std::fs::rename(temp, home.join(rel)).unwrap();
}

#[tokio::test]
async fn a_first_record_rewritten_in_place_at_the_same_length_sends_a_big_rollout_whole() {
    let big = big_rollout(300, "a");
    // Known to the mirror by its commits, by a restore into a home holding it, and by a
    // restore into an empty home (the file the restore wrote).
    for known_by in [
        "commit",
        "restore over the home's copy",
        "restore into an empty home",
    ] {
        let store = BindingStore::memory();
        let home = tempfile::tempdir().unwrap();
        write(home.path(), &source(), &big);
        commit(&store, &RolloutMirror::new(home.path())).await;
        let (home, mirror) = match known_by {
            "commit" => {
                let mirror = RolloutMirror::new(home.path());
                commit(&store, &mirror).await;
                (home, mirror)
            }
            "restore over the home's copy" => {
                let mirror = RolloutMirror::new(home.path());
                assert!(mirror
                    .restore(&store, "s", THREAD)
                    .await
                    .unwrap()
                    .written
                    .is_empty());
                (home, mirror)
            }
            _ => {
                let empty = tempfile::tempdir().unwrap();
                let mirror = RolloutMirror::new(empty.path());
                let restored = mirror.restore(&store, "s", THREAD).await.unwrap();
                assert_eq!(restored.written, [source()]);
                (empty, mirror)
            }
        };
        // The first record rewritten at its length (what codex's rewrites change), the last
        // window and the length unchanged, then a turn appended.
        let first = line("session_meta", "META");
        assert_eq!(first.len(), line("session_meta", "meta").len());
        overwrite_start(home.path(), &source(), &first);
        append(home.path(), &source(), &line("turn", "next"));
        assert_eq!(commit(&store, &mirror).await.mirror, MirrorReport::Written);
        let now = read(home.path(), &source());
        assert!(now.starts_with(&first));
        assert_eq!(stored(&store, &source()).await, Some(now), "{known_by}");
    }
}

#[tokio::test]
async fn a_replaced_big_rollout_is_read_through_extended_when_its_start_is_kept_else_sent_whole() {
    let big = big_rollout(300, "a");
    let store = BindingStore::memory();
    let home = tempfile::tempdir().unwrap();
    let mirror = RolloutMirror::new(home.path());
    write(home.path(), &source(), &big);
    commit(&store, &mirror).await;
    // A new file (new inode) holding the same bytes and a turn more: only the turn is sent.
    let grown = big.clone() + &line("turn", "next");
    replace(home.path(), &source(), &grown);
    assert_eq!(commit(&store, &mirror).await.mirror, MirrorReport::Written);
    assert_eq!(stored(&store, &source()).await, Some(grown.clone()));
    let record = store.require_session("s").await.unwrap();
    let file = record.mirror.files_of(THREAD).next().unwrap();
    assert_eq!(
        file.chunk_lens.last(),
        Some(&(line("turn", "next").len() as u64))
    );
    // A new file whose both windows are those the store holds, its middle other bytes: the new
    // inode makes the commit read it through, and it goes whole.
    let other = big_rollout(300, "b");
    let (keep, tail) = (65 << 10, 65 << 10);
    let mixed =
        big[..keep].to_string() + &other[keep..grown.len() - tail] + &grown[grown.len() - tail..];
    assert_eq!(mixed.len(), grown.len());
    assert_ne!(mixed, grown);
    replace(home.path(), &source(), &mixed);
    append(home.path(), &source(), &line("turn", "last"));
    assert_eq!(commit(&store, &mirror).await.mirror, MirrorReport::Written);
    assert_eq!(
        stored(&store, &source()).await,
        Some(read(home.path(), &source()))
    );
}

/// Issue 43: a sealed store's mirror restores onto an empty home byte for byte with the key,
/// its rows too (the thread's memory travels sealed); without the key the store does not open.
#[tokio::test]
async fn a_sealed_stores_mirror_restores_onto_an_empty_home_with_its_key() {
    let key = rethread_store::StoreKey::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sealed.sqlite");
    let options = rethread_store::OpenOptions::new;
    let store = BindingStore::sqlite(&path, options().key(Some(key.clone())))
        .await
        .unwrap();
    let (_a, text) = two_turns_on_a(&store).await;
    store.close().await;
    let refused = BindingStore::sqlite(&path, options()).await;
    assert!(
        matches!(refused, Err(rethread_store::StoreError::KeyRequired { .. })),
        "{refused:?}"
    );
    let store = BindingStore::sqlite(&path, options().key(Some(key)))
        .await
        .unwrap();
    let b = tempfile::tempdir().unwrap();
    let restored = RolloutMirror::new(b.path())
        .restore(&store, "s", THREAD)
        .await
        .unwrap();
    assert_eq!(restored.written, [source()]);
    assert_eq!(read(b.path(), &source()), text);
    assert_eq!(store.rows("s", 0..2).await.unwrap().len(), 2);
    store.close().await;
}
