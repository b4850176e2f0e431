//! Durability as documented: `Durability::Relaxed` may lose the last acknowledged writes only
//! on a power failure or OS crash, never at a process exit. A child process (this test binary,
//! re-executed) commits relaxed and exits without closing the store; the parent reopens it.
//!
//! redb: relaxed commits are made durable on close (a drop included) and at least every
//! 100 ms while writing, so a process that exits without closing loses at most its last
//! 100 ms. SQLite: relaxed is WAL with `synchronous=NORMAL`, whose commits reach the file at
//! once (only the OS may hold them).

use std::process::Command;
use std::time::Duration;

use rethread_store::{open_url, BindingStore, Durability, OpenOptions, TurnCommit};
use serde_json::json;

const CHILD_ENV: &str = "RETHREAD_DURABILITY_CHILD";
const TURNS: usize = 50;

fn commit(session: &str) -> TurnCommit {
    TurnCommit::new(
        session.to_string(),
        format!("thr-{session}"),
        vec![json!({"session": session})],
    )
}

/// Whether this process is a child a test below started (this test binary run with `--exact`
/// that test's name and `RETHREAD_DURABILITY_CHILD=<scenario> <url>`): [`durability_child`]
/// has then run in place of the test (it exits the process). A plain run does not set the
/// variable, so every test is a parent.
fn ran_as_child() -> bool {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return false;
    };
    durability_child(&spec);
    true
}

/// The child's body: commits relaxed as `spec` (`<scenario> <url>`) says, then exits.
fn durability_child(spec: &str) {
    let (scenario, url) = spec.split_once(' ').expect("scenario and url");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let options = OpenOptions::new().durability(Durability::Relaxed);
        let store = open_url(url, options).await.expect("child open");
        match scenario {
            // Commits, then lets more than 100 ms pass, then exits without closing.
            "pause-then-exit" => {
                for i in 0..TURNS {
                    store.commit_turn(commit(&format!("s{i}"))).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
                std::process::exit(0);
            }
            // Commits, keeps writing 150 ms later, and exits right after that last commit:
            // the first commit is more than 100 ms old by then.
            "write-again-then-exit" => {
                store.commit_turn(commit("early")).await.unwrap();
                tokio::time::sleep(Duration::from_millis(150)).await;
                store.commit_turn(commit("late")).await.unwrap();
                std::process::exit(0);
            }
            // Commits and drops the store (a clean exit that forgot `close`), then exits at
            // once: dropping is closing.
            "drop-then-exit" => {
                for i in 0..TURNS {
                    store.commit_turn(commit(&format!("s{i}"))).await.unwrap();
                }
                drop(store);
                std::process::exit(0);
            }
            other => panic!("unknown scenario {other}"),
        }
    });
}

/// Runs [`durability_child`] in `scenario` on `url`, as a child of `test`.
fn run_child(test: &str, scenario: &str, url: &str) {
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "-q"])
        .env(CHILD_ENV, format!("{scenario} {url}"))
        .status()
        .unwrap();
    assert!(status.success(), "{scenario}: child failed: {status}");
}

/// The sessions the reopened store holds, opened durable (as the next process would).
async fn sessions_after(url: &str) -> Vec<String> {
    let (scheme, path) = url.split_once(':').unwrap();
    let options = OpenOptions::new().create(false);
    let ids = |records: Vec<rethread_store::SessionRecord>| {
        records
            .into_iter()
            .map(|r| r.session_id)
            .collect::<Vec<_>>()
    };
    if scheme == "redb" {
        let store = BindingStore::redb(path, options).await.unwrap();
        let sessions = ids(store.all_sessions().await.unwrap());
        store.close().await;
        sessions
    } else {
        let store = BindingStore::sqlite(path, options).await.unwrap();
        let sessions = ids(store.all_sessions().await.unwrap());
        store.close().await;
        sessions
    }
}

async fn check_backend(test: &str, scheme: &str, file: &str) {
    let dir = tempfile::tempdir().unwrap();
    for scenario in ["pause-then-exit", "drop-then-exit"] {
        let url = format!(
            "{scheme}:{}",
            dir.path().join(format!("{scenario}-{file}")).display()
        );
        run_child(test, scenario, &url);
        let sessions = sessions_after(&url).await;
        assert_eq!(
            sessions.len(),
            TURNS,
            "{scheme} {scenario}: relaxed commits lost at a process exit: {sessions:?}"
        );
    }
    let url = format!(
        "{scheme}:{}",
        dir.path().join(format!("again-{file}")).display()
    );
    run_child(test, "write-again-then-exit", &url);
    let sessions = sessions_after(&url).await;
    assert!(
        sessions.iter().any(|s| s == "early"),
        "{scheme}: a relaxed commit more than 100 ms old was lost at a process exit: {sessions:?}"
    );
}

#[test]
fn redb_relaxed_commits_survive_a_process_exit() {
    if ran_as_child() {
        return;
    }
    let test = "redb_relaxed_commits_survive_a_process_exit";
    parent_runtime().block_on(check_backend(test, "redb", "d.redb"));
}

#[test]
fn sqlite_relaxed_commits_survive_a_process_exit() {
    if ran_as_child() {
        return;
    }
    let test = "sqlite_relaxed_commits_survive_a_process_exit";
    parent_runtime().block_on(check_backend(test, "sqlite", "d.db"));
}

/// The parent's runtime (a child builds its own: [`durability_child`]).
fn parent_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}
