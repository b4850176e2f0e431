//! The fake's thread store is codex's own, on disk: a `CODEX_HOME` the fake wrote is one every
//! supported release starts in, lists and resumes from with the model remembering the thread,
//! and a home each release wrote is one the fake resumes from, and back again.
//!
//! The fake imitates the release with its profile: `current` for the current and the previous
//! release, `release-n` for the floor (which refuses the paginated threads `current` writes).

use std::path::Path;
use std::time::Duration;

use rethread_fake_appserver::{FakeAppServer, FakeHandle, Profile};
use rethread_testkit::real::{
    codex_or_skip, error_of, thread_id, AppServerProcess, CodexHome, WirePeer,
};
use rethread_testkit::responses::ResponsesStandIn;
use rethread_testkit::{supported_releases, FLOOR};
use serde_json::{json, Value};
use tokio::io::{DuplexStream, ReadHalf, WriteHalf};

type FakePeer = WirePeer<ReadHalf<DuplexStream>, WriteHalf<DuplexStream>>;

/// The profile that imitates `version`.
fn profile_for(version: &str) -> Profile {
    if version == FLOOR {
        Profile::ReleaseN
    } else {
        Profile::Current
    }
}

async fn fake_on(home: &Path, profile: Profile) -> (FakePeer, FakeHandle) {
    let (client, handle) = FakeAppServer::builder()
        .profile(profile)
        .codex_home(home)
        .spawn_in_process()
        .unwrap();
    let (read, write) = tokio::io::split(client);
    let mut peer = WirePeer::new(read, write);
    peer.initialize(false).await.unwrap();
    (peer, handle)
}

async fn real_on(codex: &Path, home: &Path) -> AppServerProcess {
    let mut server = AppServerProcess::spawn(codex, home).await.unwrap();
    let init = server.peer.initialize(false).await.unwrap();
    assert!(
        init.get("result").is_some(),
        "codex must start in this home: {init}\n{}",
        std::fs::read_to_string(home.join("app-server-stderr.log")).unwrap_or_default()
    );
    server
}

fn listed(list: &Value, id: &str) -> bool {
    list["result"]["data"]
        .as_array()
        .is_some_and(|data| data.iter().any(|t| t["id"] == id))
}

fn turns_of(response: &Value) -> usize {
    response["result"]["thread"]["turns"]
        .as_array()
        .map_or(0, Vec::len)
}

/// The model's last request (the real codex's) mentions every word.
fn real_model_saw(model: &ResponsesStandIn, words: &[&str]) -> bool {
    let last = model
        .model_requests()
        .last()
        .cloned()
        .expect("a model request");
    let body = String::from_utf8_lossy(&last.body).into_owned();
    words.iter().all(|w| body.contains(w))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_the_fake_wrote_resumes_in_each_supported_release() {
    for version in supported_releases() {
        let Some(codex) = codex_or_skip(&version) else {
            continue;
        };
        let profile = profile_for(&version);
        let model = ResponsesStandIn::start().unwrap();
        let home = CodexHome::new(&model).unwrap();

        let (mut fake, handle) = fake_on(home.path(), profile).await;
        let started = fake.start_thread().await.unwrap();
        let id = thread_id(&started);
        let run = fake.run_turn(&id, "remember PAPAYA", None).await.unwrap();
        assert_eq!(run.status().as_deref(), Some("completed"));
        handle.kill().await;
        assert!(home.path().join("state_5.sqlite").is_file());

        let mut real = real_on(&codex, home.path()).await;
        let resumed = real
            .peer
            .request("thread/resume", Some(json!({"threadId": id})))
            .await
            .unwrap();
        assert_eq!(error_of(&resumed), None, "{version}: {resumed}");
        assert_eq!(turns_of(&resumed), 1, "{version}: {resumed}");
        let run = real
            .peer
            .run_turn(&id, "what was the word?", None)
            .await
            .unwrap();
        assert_eq!(run.status().as_deref(), Some("completed"), "{version}");
        assert!(
            real_model_saw(&model, &["remember PAPAYA"]),
            "{version}: the real model saw the fake's turn"
        );
        let list = real
            .peer
            .request("thread/list", Some(json!({})))
            .await
            .unwrap();
        assert!(listed(&list, &id), "{version}: {list}");
        real.shutdown(Duration::from_secs(10)).await.unwrap();

        // And back: the fake reads what the real codex appended.
        let (mut fake, handle) = fake_on(home.path(), profile).await;
        let resumed = fake
            .request("thread/resume", Some(json!({"threadId": id})))
            .await
            .unwrap();
        assert_eq!(turns_of(&resumed), 2, "{version}: {resumed}");
        fake.run_turn(&id, "and now?", None).await.unwrap();
        let last = handle.model_requests().last().cloned().unwrap();
        assert!(
            last.saw("remember PAPAYA") && last.saw("what was the word?"),
            "{version}: {last:?}"
        );
        handle.kill().await;
    }
}

/// The floor refuses a paginated thread the `current` profile wrote, as it refuses one the
/// current release wrote, and still starts in that home.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_refuses_a_paginated_thread_the_fake_wrote() {
    let Some(codex) = codex_or_skip(FLOOR) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let home = CodexHome::new(&model).unwrap();
    let (mut fake, handle) = fake_on(home.path(), Profile::Current).await;
    let started = fake.start_thread().await.unwrap();
    let id = thread_id(&started);
    fake.run_turn(&id, "remember PAPAYA", None).await.unwrap();
    handle.kill().await;
    let mut real = real_on(&codex, home.path()).await;
    let resumed = real
        .peer
        .request("thread/resume", Some(json!({"threadId": id})))
        .await
        .unwrap();
    assert_eq!(
        error_of(&resumed),
        Some((-32601, "paginated_threads is not supported yet".to_string()))
    );
    real.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_each_supported_release_wrote_resumes_in_the_fake() {
    for version in supported_releases() {
        let Some(codex) = codex_or_skip(&version) else {
            continue;
        };
        let profile = profile_for(&version);
        let model = ResponsesStandIn::start().unwrap();
        let home = CodexHome::new(&model).unwrap();

        let mut real = real_on(&codex, home.path()).await;
        let started = real.peer.start_thread().await.unwrap();
        let id = thread_id(&started);
        let run = real
            .peer
            .run_turn(&id, "remember PAPAYA", None)
            .await
            .unwrap();
        assert_eq!(run.status().as_deref(), Some("completed"), "{version}");
        real.shutdown(Duration::from_secs(10)).await.unwrap();

        let (mut fake, handle) = fake_on(home.path(), profile).await;
        let list = fake.request("thread/list", Some(json!({}))).await.unwrap();
        assert!(listed(&list, &id), "{version}: {list}");
        let resumed = fake
            .request("thread/resume", Some(json!({"threadId": id})))
            .await
            .unwrap();
        assert_eq!(error_of(&resumed), None, "{version}: {resumed}");
        assert_eq!(turns_of(&resumed), 1, "{version}: {resumed}");
        let turn = &resumed["result"]["thread"]["turns"][0];
        assert_eq!(turn["status"], "completed", "{version}: {turn}");
        let run = fake
            .run_turn(&id, "what was the word?", None)
            .await
            .unwrap();
        assert_eq!(run.status().as_deref(), Some("completed"));
        let last = handle.model_requests().last().cloned().unwrap();
        assert!(
            last.saw("remember PAPAYA"),
            "{version}: the fake's model saw the real turn: {last:?}"
        );
        handle.kill().await;

        // And back: the real codex reads what the fake appended to its rollout.
        let mut real = real_on(&codex, home.path()).await;
        let resumed = real
            .peer
            .request("thread/resume", Some(json!({"threadId": id})))
            .await
            .unwrap();
        assert_eq!(error_of(&resumed), None, "{version}: {resumed}");
        real.peer.run_turn(&id, "and now?", None).await.unwrap();
        assert!(
            real_model_saw(&model, &["remember PAPAYA", "what was the word?"]),
            "{version}: the real model saw both turns"
        );
        real.shutdown(Duration::from_secs(10)).await.unwrap();
    }
}
