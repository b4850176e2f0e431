//! Target `store_files`: store files written by the redb and SQLite backends, damaged (bytes
//! flipped, ranges overwritten, truncated), then opened and read.
//!
//! The pristine files are written once per process by the backends themselves (a few
//! sessions with commits, patches and a retirement) and their committed state is exported
//! before they are closed. Properties of every damaged copy:
//! - Opening never panics or hangs; a refusal is a typed `Corrupt`, `Io`, `Backend` or
//!   `NewerSchema` error. Opening reads no records (redb checks its pages by default),
//!   so most damage is found when it is touched.
//! - A session that reads whole has rows `0..row_count` (no row lost or duplicated).
//! - A store that opens is never empty (listing sessions is an error or lists sessions), and
//!   it is its last committed state or the damage shows as an error: no session of the
//!   committed state is silently missing, and a session that reads whole is exactly its
//!   committed state. Both backends checksum every record and check on each read that a
//!   missing record has no rows and that a session's rows are complete.
//! - A panic inside redb (which trusts a cleanly closed file) never reaches the caller: the
//!   store contains it on its own threads, answers `Corrupt`, and from then on answers
//!   `Corrupt` to everything (it is not used on as if nothing happened). The harness tells
//!   such panics (raised in redb's code) from any other panic, which still fails the input.
//! - `verify` on the damaged store returns a report (or a typed error), never panics, and
//!   reports a problem whenever a read above found damage that is in the file's records.
//! - A write on the damaged store is an error or succeeds; it never panics.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rethread_store::{BindingStore, OpenOptions, SessionExport, StoreError, TurnCommit};
use serde_json::{json, Map};

use crate::fuzz::input::{panicked, watch_panics, Input};

/// Panics raised inside redb's own code since the last [`take_redb_panics`].
static REDB_PANICS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Installs (once, over the hook of [`watch_panics`]) a panic hook that lets a panic raised in
/// redb's source pass as contained, counting it: the store catches those on its own threads.
/// Every other panic goes on to the previous hook (recorded, and fatal under libFuzzer).
fn contain_redb_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_redb = info
                .location()
                .is_some_and(|l| l.file().replace('\\', "/").contains("/redb-"));
            if in_redb {
                REDB_PANICS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            } else {
                previous(info);
            }
        }));
    });
}

fn take_redb_panics() -> usize {
    REDB_PANICS.swap(0, std::sync::atomic::Ordering::SeqCst)
}

/// The backends whose files are damaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The redb backend.
    Redb,
    /// The SQLite backend.
    Sqlite,
}

/// A pristine store file and what it holds.
#[derive(Debug)]
pub struct Pristine {
    /// The file's bytes after a clean close.
    pub bytes: Vec<u8>,
    /// Every session, exported before the close.
    pub sessions: Vec<SessionExport>,
}

struct Shared {
    runtime: tokio::runtime::Runtime,
    dir: tempfile::TempDir,
    redb: Pristine,
    sqlite: Pristine,
}

async fn fill(store: &BindingStore) -> Vec<SessionExport> {
    let commit = |s: &str, t: &str, n: usize| {
        TurnCommit::new(s.to_string(), t.to_string(), (0..n)
            .map(|i| json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "text": format!("{s} {t} row {i}")}))
            .collect())
.codex_home(Some("/home/u/.codex".to_string()))
    };
    let mut patch = Map::new();
    patch.insert("model".into(), json!("gpt-5"));
    patch.insert("temperature".into(), json!(0.25));
    patch.insert("nested".into(), json!({"a": [1, 2, {"b": null}], "c": "ü"}));
    for (s, t, n) in [
        ("chat-1", "thr_a", 2),
        ("chat-1", "thr_a", 2),
        ("chat-2", "thr_b", 4),
        ("chat-3", "thr_c", 1),
        ("chat-3", "thr_d", 2),
    ] {
        store.commit_turn(commit(s, t, n)).await.expect("commit");
    }
    store
        .patch_config("chat-1", patch.clone(), None)
        .await
        .expect("patch");
    store
        .patch_config("chat-2", patch, None)
        .await
        .expect("patch");
    store
        .retire_thread(
            "chat-3",
            "thr_c",
            rethread_store::Retirement::Lost {
                reason: "gone".to_string(),
                message: "seed".to_string(),
            },
            None,
        )
        .await
        .expect("retire");
    let mut out = Vec::new();
    for s in ["chat-1", "chat-2", "chat-3"] {
        out.push(
            store
                .export_session(s)
                .await
                .expect("export")
                .expect("present"),
        );
    }
    out
}

fn pristine(runtime: &tokio::runtime::Runtime, dir: &Path, backend: Backend) -> Pristine {
    let path = dir.join(match backend {
        Backend::Redb => "pristine.redb",
        Backend::Sqlite => "pristine.sqlite",
    });
    runtime.block_on(async {
        let sessions = match backend {
            Backend::Redb => {
                let store = BindingStore::redb(&path, OpenOptions::new())
                    .await
                    .expect("open");
                let sessions = fill(&store).await;
                store.close().await;
                sessions
            }
            Backend::Sqlite => {
                let store = BindingStore::sqlite(&path, OpenOptions::new())
                    .await
                    .expect("open");
                let sessions = fill(&store).await;
                store.close().await;
                sessions
            }
        };
        for suffix in ["-wal", "-shm"] {
            let mut side = path.clone().into_os_string();
            side.push(suffix);
            let side = PathBuf::from(side);
            if side.exists() {
                let len = std::fs::metadata(&side).map(|m| m.len()).unwrap_or(0);
                assert_eq!(
                    (suffix, len),
                    (suffix, 0),
                    "a closed SQLite store must be checkpointed into its main file"
                );
            }
        }
        Pristine {
            bytes: std::fs::read(&path).expect("read pristine"),
            sessions,
        }
    })
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let dir = tempfile::tempdir().expect("tempdir");
        let redb = pristine(&runtime, dir.path(), Backend::Redb);
        let sqlite = pristine(&runtime, dir.path(), Backend::Sqlite);
        Shared {
            runtime,
            dir,
            redb,
            sqlite,
        }
    })
}

/// The pristine file of `backend` (for seeding corpora and for tests).
pub fn pristine_bytes(backend: Backend) -> &'static [u8] {
    match backend {
        Backend::Redb => &shared().redb.bytes,
        Backend::Sqlite => &shared().sqlite.bytes,
    }
}

/// Applies the damage the input describes.
fn damage(input: &mut Input<'_>, pristine: &[u8]) -> Vec<u8> {
    let mut bytes = pristine.to_vec();
    let len = bytes.len();
    match input.below(4) {
        // Up to 16 single-byte flips anywhere.
        0 | 1 => {
            let n = 1 + input.below(16);
            for _ in 0..n {
                let at = input.below(len);
                let mask = input.byte().max(1);
                bytes[at] ^= mask;
            }
        }
        // A range overwritten with the input's bytes.
        2 => {
            let at = input.below(len);
            let with = input.chunk(512);
            let end = (at + with.len()).min(len);
            bytes[at..end].copy_from_slice(&with[..end - at]);
        }
        // Truncated (never to zero bytes: an empty file is a store whose creation was
        // interrupted before anything was committed, and is initialised by design).
        _ => {
            let keep = 1 + input.below(len.max(2) - 1);
            bytes.truncate(keep);
        }
    }
    bytes
}

/// `RETHREAD_FUZZ_STORE_BACKEND=redb|sqlite` restricts the target to one backend.
fn only_backend() -> Option<Backend> {
    match std::env::var("RETHREAD_FUZZ_STORE_BACKEND").ok()?.as_str() {
        "redb" => Some(Backend::Redb),
        "sqlite" => Some(Backend::Sqlite),
        _ => None,
    }
}

fn check_open_error(backend: Backend, error: &StoreError) {
    assert!(
        matches!(
            error,
            StoreError::Corrupt { .. }
                | StoreError::Io { .. }
                | StoreError::Backend { .. }
                | StoreError::NewerSchema { .. }
        ),
        "{backend:?}: opening a damaged store failed with an unexpected error: {error:?}"
    );
}

async fn check_store(backend: Backend, store: &BindingStore, pristine: &Pristine) {
    // Whether a read met damage in the records (not only a refusal to open).
    let mut damage_seen = false;
    match store.all_sessions().await {
        Ok(list) => assert!(
            !list.is_empty(),
            "{backend:?}: a damaged store was read as empty"
        ),
        Err(e) => damage_seen |= matches!(e, StoreError::Corrupt { .. }),
    }
    for expected in &pristine.sessions {
        let id = &expected.record.session_id;
        match store.session(id).await {
            Ok(None) => panic!("{backend:?}: session {id} silently disappeared"),
            Ok(Some(_)) => {}
            Err(e) => damage_seen |= matches!(e, StoreError::Corrupt { .. }),
        }
        match store.export_session(id).await {
            Ok(None) => panic!("{backend:?}: session {id} silently disappeared (export)"),
            Ok(Some(export)) => {
                let seqs: Vec<u64> = export.rows.iter().map(|r| r.seq).collect();
                let want: Vec<u64> = (0..export.record.row_count).collect();
                assert_eq!(seqs, want, "{backend:?}: rows of {id} are not 0..row_count");
                assert_eq!(
                    &export, expected,
                    "{backend:?}: session {id} reads whole but differs from its committed state"
                );
            }
            Err(e) => damage_seen |= matches!(e, StoreError::Corrupt { .. }),
        }
    }
    if take_redb_panics() > 0 {
        // Contained: the store must now refuse everything as damaged.
        let after = store.session("chat-1").await;
        assert!(
            matches!(after, Err(StoreError::Corrupt { .. })),
            "{backend:?}: redb panicked but the store went on: {after:?}"
        );
        damage_seen = true;
    }
    match store.verify(&mut |_| {}).await {
        Ok(report) => assert!(
            !damage_seen || !report.is_ok(),
            "{backend:?}: reads found damage that verify did not report: {report:?}"
        ),
        Err(e) => assert!(
            !matches!(e, StoreError::Corrupt { .. }),
            "{backend:?}: verify returned damage as an error instead of a report: {e:?}"
        ),
    }
    take_redb_panics();
    let _ = store
        .commit_turn(TurnCommit::new(
            "chat-new".to_string(),
            "thr_new".to_string(),
            vec![json!({"role": "user", "text": "after damage"})],
        ))
        .await;
}

/// Runs one input.
pub fn run(data: &[u8]) {
    watch_panics();
    contain_redb_panics();
    take_redb_panics();
    let shared = shared();
    let mut input = Input::new(data);
    let backend = if input.byte() & 1 == 0 {
        Backend::Redb
    } else {
        Backend::Sqlite
    };
    if only_backend().is_some_and(|only| only != backend) {
        return;
    }
    let pristine = match backend {
        Backend::Redb => &shared.redb,
        Backend::Sqlite => &shared.sqlite,
    };
    let bytes = damage(&mut input, &pristine.bytes);
    let path = shared.dir.path().join(match backend {
        Backend::Redb => "damaged.redb",
        Backend::Sqlite => "damaged.sqlite",
    });
    // Each damaged file is opened twice: as a host opens it, and read-only, as the commands
    // that only read do (redb's read-only open is another code path).
    for options in [
        OpenOptions::new().create(false),
        OpenOptions::new().create(false).read_only(true),
    ] {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut p = path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(PathBuf::from(p));
        }
        std::fs::write(&path, &bytes).expect("write damaged file");
        open_and_check(&shared.runtime, backend, &path, options, pristine);
    }
    assert!(
        !panicked(),
        "a thread panicked while handling a damaged store"
    );
}

/// Opens the damaged file at `path` with `options` and checks what the store says of it.
fn open_and_check(
    runtime: &tokio::runtime::Runtime,
    backend: Backend,
    path: &Path,
    options: OpenOptions,
    pristine: &Pristine,
) {
    runtime.block_on(async {
        let work = async {
            match backend {
                Backend::Redb => match BindingStore::redb(path, options).await {
                    Err(e) => {
                        take_redb_panics();
                        check_open_error(backend, &e)
                    }
                    Ok(store) => {
                        check_store(backend, &store, pristine).await;
                        store.close().await;
                    }
                },
                Backend::Sqlite => match BindingStore::sqlite(path, options).await {
                    Err(e) => check_open_error(backend, &e),
                    Ok(store) => {
                        check_store(backend, &store, pristine).await;
                        store.close().await;
                    }
                },
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(20), work)
            .await
            .unwrap_or_else(|_| panic!("{backend:?}: opening or reading a damaged store hung"));
    });
}
