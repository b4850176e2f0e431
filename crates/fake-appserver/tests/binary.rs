//! The `fake-codex` binary: started like codex, keeps threads under `CODEX_HOME`, survives its
//! own restart, takes faults from `--faults FILE` and `FAKE_CODEX_FAULTS`.

use std::path::Path;
use std::time::Duration;

use rethread_fake_appserver::ModelRequest;
use rethread_testkit::real::{error_of, thread_id, AppServerProcess};
use serde_json::json;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_fake-codex"))
}

fn model_log(home: &Path) -> Vec<ModelRequest> {
    std::fs::read_to_string(home.join("fake-model-requests.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn survives_its_own_restart_with_memory() {
    let home = tempfile::tempdir().unwrap();
    let mut server = AppServerProcess::spawn(binary(), home.path())
        .await
        .unwrap();
    server.peer.initialize(false).await.unwrap();
    let started = server.peer.start_thread().await.unwrap();
    let id = thread_id(&started);
    assert_eq!(started["result"]["thread"]["historyMode"], "paginated");
    server
        .peer
        .run_turn(&id, "remember zebra", None)
        .await
        .unwrap();
    server.shutdown(Duration::from_secs(5)).await.unwrap();

    let mut server = AppServerProcess::spawn(binary(), home.path())
        .await
        .unwrap();
    server.peer.initialize(false).await.unwrap();
    let resumed = server
        .peer
        .request("thread/resume", Some(json!({"threadId": id})))
        .await
        .unwrap();
    assert_eq!(
        resumed["result"]["thread"]["turns"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let run = server
        .peer
        .run_turn(&id, "what was it?", None)
        .await
        .unwrap();
    assert_eq!(run.status().as_deref(), Some("completed"));
    server.shutdown(Duration::from_secs(5)).await.unwrap();
    let log = model_log(home.path());
    assert_eq!(log.len(), 2);
    assert!(log[1].saw("remember zebra"));
}

#[tokio::test]
async fn killed_holder_releases_the_writer_lock() {
    let home = tempfile::tempdir().unwrap();
    let mut first = AppServerProcess::spawn(binary(), home.path())
        .await
        .unwrap();
    first.peer.initialize(false).await.unwrap();
    let started = first.peer.start_thread().await.unwrap();
    let id = thread_id(&started);
    first.peer.run_turn(&id, "hold", None).await.unwrap();
    let mut second = AppServerProcess::spawn(binary(), home.path())
        .await
        .unwrap();
    second.peer.initialize(false).await.unwrap();
    let busy = second
        .peer
        .request("thread/resume", Some(json!({"threadId": id})))
        .await
        .unwrap();
    assert_eq!(
        error_of(&busy),
        Some((-32600, format!("thread {id} already has an active writer")))
    );
    first.kill().await.unwrap();
    let resumed = second
        .peer
        .request("thread/resume", Some(json!({"threadId": id})))
        .await
        .unwrap();
    assert!(resumed.get("result").is_some(), "{resumed}");
}

#[tokio::test]
async fn faults_from_a_file_and_from_the_environment() {
    let home = tempfile::tempdir().unwrap();
    let script = home.path().join("faults.json");
    std::fs::write(
        &script,
        r#"{"faults": [{"kind": "exit_at_request", "n": 2}]}"#,
    )
    .unwrap();
    let script_arg = script.to_string_lossy().into_owned();
    let mut server =
        AppServerProcess::spawn_with(binary(), home.path(), &["--faults", &script_arg], &[])
            .await
            .unwrap();
    server.peer.initialize(false).await.unwrap();
    let err = server
        .peer
        .request("thread/list", Some(json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);

    let inline = r#"{"faults": [{"kind": "overloaded", "attempts": 1}]}"#;
    let mut server = AppServerProcess::spawn_with(
        binary(),
        home.path(),
        &["--profile", "release-n"],
        &[("FAKE_CODEX_FAULTS", inline)],
    )
    .await
    .unwrap();
    let first = server
        .peer
        .request(
            "initialize",
            Some(json!({"clientInfo": {"name": "t", "version": "0"}})),
        )
        .await
        .unwrap();
    assert_eq!(error_of(&first).map(|e| e.0), Some(-32001));
    server.peer.initialize(false).await.unwrap();
    let started = server.peer.start_thread().await.unwrap();
    assert_eq!(started["result"]["thread"]["historyMode"], "legacy");
}
