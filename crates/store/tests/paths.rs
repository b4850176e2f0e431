//! Store paths a careless or unlucky host meets (issue 19, items 9-13 and 20): a path that is
//! not a regular file, a store that is missing for a command that only reads, `~`, a read-only
//! directory, a store file deleted or replaced under a live host, and a redb file another
//! process holds.

use std::path::Path;
use std::time::{Duration, Instant};

use rethread_store::{BindingStore, OpenOptions, StoreError, StoreUrl, TurnCommit};
use serde_json::json;

fn commit(session: &str, thread: &str) -> TurnCommit {
    TurnCommit::new(session, thread, vec![json!({"thread": thread})])
}

/// Opens `path` with each file backend, bounded in time (a FIFO would block an open forever).
async fn open_both(path: &Path, options: OpenOptions) -> Vec<Result<(), StoreError>> {
    let bound = Duration::from_secs(10);
    let redb = tokio::time::timeout(bound, BindingStore::redb(path, options.clone()))
        .await
        .expect("the redb open returned at once");
    let sqlite = tokio::time::timeout(bound, BindingStore::sqlite(path, options))
        .await
        .expect("the SQLite open returned at once");
    vec![redb.map(drop), sqlite.map(drop)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_that_is_not_a_regular_file_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    for (path, found) in [
        (fifo.as_path(), "a FIFO"),
        (dir.path(), "a directory"),
        (Path::new("/dev/null"), "a device"),
    ] {
        for result in open_both(path, OpenOptions::new()).await {
            assert!(
                matches!(&result, Err(StoreError::NotAFile { found: f, .. }) if *f == found),
                "{}: {result:?}",
                path.display()
            );
        }
    }
    assert!(
        !Path::new("/dev/null-journal").exists() && !Path::new("/dev/null-wal").exists(),
        "nothing created beside /dev/null"
    );
}

#[tokio::test]
async fn opening_without_create_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no/such/dir/s.db");
    let options = OpenOptions::new().create(false).create_dirs(true);
    for result in open_both(&missing, options.clone()).await {
        assert!(
            matches!(&result, Err(StoreError::NoStore { path }) if path.ends_with("s.db")),
            "{result:?}"
        );
    }
    assert!(!dir.path().join("no").exists(), "no directory was created");
    let err = rethread_store::open_url(&format!("sqlite:{}", missing.display()), options.clone())
        .await
        .expect_err("refused");
    assert_eq!(
        err.to_string(),
        format!("no store at {}", missing.display())
    );
    // An empty file is not a store yet: it is not initialised either.
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    for result in open_both(&empty, options).await {
        assert!(
            matches!(result, Err(StoreError::NoStore { .. })),
            "{result:?}"
        );
    }
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0, "left empty");
}

#[test]
fn a_tilde_is_the_home_directory() {
    let home = std::env::home_dir().expect("a home directory");
    for (url, file) in [("sqlite:~/x.db", "x.db"), ("redb:~/d/x.redb", "d/x.redb")] {
        let parsed = StoreUrl::parse(url).unwrap();
        assert_eq!(parsed.path(), Some(home.join(file).as_path()), "{url}");
    }
    // In the URI form (`sqlite://`) `~` is an authority, refused as SQLite refuses it.
    assert!(StoreUrl::parse("sqlite://~/x.db").is_err());
    // Only a leading `~/` is the home directory.
    let parsed = StoreUrl::parse("sqlite:a/~/x.db").unwrap();
    assert_eq!(parsed.path(), Some(Path::new("a/~/x.db")));
}

/// A directory this process may not write: "store PATH is not writable", never an engine's
/// "attempt to write a readonly database". (A process that writes anywhere, root, has no such
/// directory: then the case cannot be made and is said so.)
#[tokio::test]
async fn a_read_only_directory_is_not_writable() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let locked = dir.path().join("ro");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o500)).unwrap();
    if std::fs::write(locked.join("probe"), b"").is_ok() {
        eprintln!("skipping: this process writes into a 0500 directory (root)");
        return;
    }
    for result in open_both(&locked.join("s.db"), OpenOptions::new()).await {
        let error = result.expect_err("refused");
        assert!(matches!(error, StoreError::NotWritable { .. }), "{error:?}");
        assert!(error.to_string().ends_with("is not writable"), "{error}");
    }
}

/// A store file deleted (or replaced) under a live host: a commit is refused with `Gone`
/// before it is acknowledged, so nothing is reported durable that the next process cannot
/// find.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_file_deleted_or_replaced_under_a_live_host_refuses_commits() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["deleted.db", "deleted.redb", "replaced.db", "replaced.redb"] {
        let path = dir.path().join(name);
        let store: BindingStore = if name.ends_with(".db") {
            BindingStore::sqlite(&path, OpenOptions::new())
                .await
                .unwrap()
        } else {
            BindingStore::redb(&path, OpenOptions::new()).await.unwrap()
        };
        store.commit_turn(commit("s", "t1")).await.unwrap();
        if name.starts_with("deleted") {
            std::fs::remove_file(&path).unwrap();
        } else {
            let other = dir.path().join(format!("other-{name}"));
            std::fs::write(&other, b"").unwrap();
            std::fs::rename(&other, &path).unwrap();
        }
        let refused = store.commit_turn(commit("s", "t1")).await;
        assert!(
            matches!(&refused, Err(StoreError::Gone { path: p }) if p.ends_with(name)),
            "{name}: {refused:?}"
        );
        let refused = store.patch_config("s", serde_json::Map::new(), None).await;
        assert!(
            matches!(refused, Err(StoreError::Gone { .. })),
            "{name}: {refused:?}"
        );
    }
}

/// Counts the opens of one file (inotify): how an open that waits is seen trying again.
#[cfg(target_os = "linux")]
struct Opens {
    inotify: std::os::fd::OwnedFd,
    seen: usize,
}

#[cfg(target_os = "linux")]
impl Opens {
    fn watch(path: &Path) -> Opens {
        use rustix::fs::inotify::{add_watch, init, CreateFlags, WatchFlags};
        let inotify = init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).unwrap();
        add_watch(&inotify, path, WatchFlags::OPEN).unwrap();
        Opens { inotify, seen: 0 }
    }

    /// The opens of the file since the watch began.
    fn count(&mut self) -> usize {
        let mut buffer = [std::mem::MaybeUninit::uninit(); 4096];
        let mut events = rustix::fs::inotify::Reader::new(&self.inotify, &mut buffer);
        loop {
            match events.next() {
                Ok(_) => self.seen += 1,
                Err(rustix::io::Errno::AGAIN) => return self.seen,
                Err(error) => panic!("reading inotify events: {error}"),
            }
        }
    }

    /// Waits (bounded) until the file has been opened more than `count` times.
    async fn past(&mut self, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.count() <= count {
            assert!(
                Instant::now() < deadline,
                "the file was opened {count} times at most"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A redb file another process holds: an open waits up to `OpenOptions::wait` and gets the
/// file once it is free; one that gives up names the holder.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redb_open_waits_for_the_holder_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("held.redb");
    BindingStore::redb(&path, OpenOptions::new())
        .await
        .unwrap()
        .close()
        .await;
    // How many times an open that finds the file free opens it.
    let mut opens = Opens::watch(&path);
    BindingStore::redb(&path, OpenOptions::new())
        .await
        .unwrap()
        .close()
        .await;
    let one_open = opens.count();
    let holder = BindingStore::redb(&path, OpenOptions::new()).await.unwrap();
    holder.commit_turn(commit("s", "t1")).await.unwrap();

    let started = Instant::now();
    let refused =
        BindingStore::redb(&path, OpenOptions::new().wait(Duration::from_millis(300))).await;
    assert!(started.elapsed() >= Duration::from_millis(300), "it waited");
    match refused {
        Err(StoreError::Locked {
            holder: Some(named),
            ..
        }) => assert!(
            named.contains(&format!("pid {}", std::process::id())),
            "{named}"
        ),
        other => panic!("expected Locked naming the holder, got {other:?}"),
    }

    let before = opens.count();
    let waiter = tokio::spawn({
        let path = path.clone();
        async move { BindingStore::redb(&path, OpenOptions::new().wait(Duration::from_secs(20))).await }
    });
    // One open more than a free file takes: the waiter found it held and is trying again.
    opens.past(before + one_open).await;
    holder.close().await;
    let store = waiter
        .await
        .unwrap()
        .expect("opened once the holder closed");
    assert_eq!(store.thread_id("s").await.unwrap().as_deref(), Some("t1"));
}
