//! `BindingHooks` with the rollout mirror, in front of in-process fakes on two `CODEX_HOME`s
//! (two machines) and one store: the session moves between them and keeps its thread and
//! its memory, with no warning; a home where the rollout cannot be found is said once and the
//! turn still commits; a restore that fails is said, and the resume goes ahead.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use faulty_store::Faults;
use rethread_proxy::{BindingHooks, SessionOptions};
use rethread_store::BindingStore;
use serde_json::Value;
use support::*;

const SESSION: &str = "fleet";

async fn hooks(store: &BindingStore, home: &Path) -> Arc<BindingHooks> {
    let mut options = SessionOptions::default();
    options.binder.retry_backoff = Duration::from_millis(5);
    options.binder.codex_home = Some(home.display().to_string());
    options.binder.mirror = true;
    Arc::new(
        BindingHooks::open(SESSION, store.clone(), options)
            .await
            .unwrap(),
    )
}

fn warnings(log: &[Value]) -> Vec<String> {
    log.iter()
        .filter(|m| m["method"] == "warning")
        .map(|m| {
            m["params"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

/// One process on `fake`'s home: the client's `thread/start` and one turn saying `text`.
/// Returns the thread and what the client was warned of.
async fn process(
    store: &BindingStore,
    fake: &FakeHandle,
    home: &Path,
    text: &str,
) -> (String, Vec<String>) {
    let mut proxied = connect(hooks(store, home).await, fake.restart().await.unwrap());
    let thread = open_thread(&mut proxied.client).await;
    let turn = proxied.client.run_turn(&thread, text, None).await.unwrap();
    assert_eq!(turn.agent_text(), [format!("echo: {text}")]);
    proxied.client.close_writer().await;
    while proxied.client.next_message().await.unwrap().is_some() {}
    proxied.task.await.unwrap().unwrap();
    (thread, warnings(&proxied.client.log))
}

#[tokio::test]
async fn a_session_that_moves_between_homes_keeps_its_thread_and_its_memory() {
    let store: BindingStore = BindingStore::memory();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_, a) = FakeAppServer::builder()
        .codex_home(dir_a.path())
        .spawn_in_process()
        .unwrap();
    let (_, b) = FakeAppServer::builder()
        .codex_home(dir_b.path())
        .spawn_in_process()
        .unwrap();

    let (thread, warned) = process(&store, &a, dir_a.path(), "remember zebra").await;
    assert!(warned.is_empty(), "{warned:?}");
    let rollouts = rollout_files(dir_a.path());
    assert_eq!(rollouts.len(), 1);
    let relative = rollouts[0]
        .strip_prefix(dir_a.path())
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert_eq!(
        store
            .mirror_file(SESSION, &thread, &relative)
            .await
            .unwrap(),
        Some(std::fs::read(&rollouts[0]).unwrap()),
        "turn/completed reached the client with the rollout in the store"
    );

    // Machine B never saw the thread: it is restored there, resumed, and remembers.
    let (again, warned) = process(&store, &b, dir_b.path(), "which animal?").await;
    assert_eq!(again, thread);
    assert!(warned.is_empty(), "{warned:?}");
    assert!(
        dir_b.path().join(&relative).is_file(),
        "restored at the same path"
    );
    assert!(b.model_requests().last().unwrap().saw("remember zebra"));

    // Back on A, which holds only the first turn: completed from the store.
    let (again, warned) = process(&store, &a, dir_a.path(), "and before that?").await;
    assert_eq!(again, thread);
    assert!(warned.is_empty(), "{warned:?}");
    let seen = a.model_requests();
    let last = seen.last().unwrap();
    assert!(last.saw("remember zebra") && last.saw("which animal?"));
    a.kill().await;
    b.kill().await;
}

#[tokio::test]
async fn a_rollout_the_proxy_cannot_find_is_said_once_and_the_turns_still_commit() {
    let store: BindingStore = BindingStore::memory();
    let (dir, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (stream, fake) = FakeAppServer::builder()
        .codex_home(dir.path())
        .spawn_in_process()
        .unwrap();
    drop(stream);
    // The hooks look in another home than codex writes to (a misconfigured CODEX_HOME).
    let stream = fake.restart().await.unwrap();
    let mut proxied = connect(hooks(&store, elsewhere.path()).await, stream);
    let thread = open_thread(&mut proxied.client).await;
    for text in ["one", "two"] {
        proxied.client.run_turn(&thread, text, None).await.unwrap();
    }
    let said = warnings(&proxied.client.log);
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].starts_with(&format!(
            "rethread could not mirror thread {thread}'s rollout"
        )),
        "{said:?}"
    );
    let record = store.session(SESSION).await.unwrap().unwrap();
    assert_eq!(record.row_count, 4);
    assert_eq!(record.thread_id(), Some(thread.as_str()));
    assert!(record.mirror.files.is_empty());
    fake.kill().await;
}

#[tokio::test]
async fn a_restore_that_fails_is_said_and_the_resume_goes_ahead() {
    let memory = BindingStore::memory();
    let store: BindingStore = memory.clone();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_, a) = FakeAppServer::builder()
        .codex_home(dir_a.path())
        .spawn_in_process()
        .unwrap();
    let (_, b) = FakeAppServer::builder()
        .codex_home(dir_b.path())
        .spawn_in_process()
        .unwrap();
    let (thread, _) = process(&store, &a, dir_a.path(), "remember zebra").await;
    process(&store, &b, dir_b.path(), "which animal?").await;

    // Back on A, which holds only the first turn: a restore is due, and reading the mirror
    // from the store fails. A keeps a rollout codex can resume.
    let faults = Faults::default();
    faults.fail("write_mirror_file", 1);
    let faulty: BindingStore = faulty_store::over(memory, faults.clone());
    let (again, warned) = process(&faulty, &a, dir_a.path(), "and before that?").await;
    assert_eq!(faults.calls("write_mirror_file"), 1);
    assert_eq!(again, thread, "the resume went ahead");
    let restore = format!("rethread could not restore thread {thread}'s rollout from the store");
    let said = warned.iter().filter(|w| w.starts_with(&restore)).count();
    assert_eq!(said, 1, "{warned:?}");
    a.kill().await;
    b.kill().await;
}
