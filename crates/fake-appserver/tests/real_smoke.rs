//! The real-codex harness drives every supported release through one offline turn.

use rethread_testkit::real::{codex_or_skip, thread_id, AppServerProcess, CodexHome};
use rethread_testkit::responses::ResponsesStandIn;
use rethread_testkit::supported_releases;

async fn one_turn(version: &str) {
    let Some(codex) = codex_or_skip(version) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let home = CodexHome::new(&model).unwrap();
    let mut server = AppServerProcess::spawn(&codex, home.path()).await.unwrap();
    server.peer.initialize(false).await.unwrap();
    let started = server.peer.start_thread().await.unwrap();
    let id = thread_id(&started);
    let turn = server
        .peer
        .run_turn(&id, "remember zebra", None)
        .await
        .unwrap();
    assert_eq!(turn.status().as_deref(), Some("completed"));
    assert_eq!(turn.agent_text(), vec!["echo: remember zebra".to_string()]);
    let conversation = model.model_requests()[0].conversation();
    assert!(conversation
        .iter()
        .any(|m| m.role == "user" && m.text == "remember zebra"));
}

#[tokio::test]
async fn every_supported_release_runs_a_turn_offline() {
    for version in supported_releases() {
        one_turn(&version).await;
    }
}
