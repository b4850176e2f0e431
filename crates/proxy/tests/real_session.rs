//! `BindingHooks` in front of the real codex, every supported release, offline through the
//! Responses-API stand-in: three processes keep one conversation (an approved turn, a restart
//! that resumes the thread with its memory, a lost rollout that gives one warning and a new
//! bound thread), a paginated thread under the floor falls back, and an interrupted turn
//! writes nothing. Clients use string and integer ids and do not ask for `experimentalApi`
//! (as the Python SDK does not).

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rethread_protocol::codec::DEFAULT_MAX_LINE_LENGTH;
use rethread_proxy::{BindingHooks, CodexCommand, SessionOptions};
use rethread_runtime::RESUME_FALLBACK_NOTICE;
use rethread_store::BindingStore;
use serde_json::{json, Value};
use support::*;

const SESSION: &str = "real-1";

/// A codex process behind a proxy with the session's hooks.
struct Process {
    proxied: Proxied,
    child: tokio::process::Child,
}

async fn start(codex: &Path, home: &Path, store: &BindingStore) -> Process {
    start_limited(codex, home, store, DEFAULT_MAX_LINE_LENGTH).await
}

/// [`start`] with the proxy's line limit at `limit` bytes.
async fn start_limited(codex: &Path, home: &Path, store: &BindingStore, limit: usize) -> Process {
    let mut options = SessionOptions::default();
    options.binder.retry_backoff = Duration::from_millis(50);
    options.binder.codex_home = Some(home.display().to_string());
    // Without the rollout mirror: a lost rollout stays lost (the fleet test has the mirror).
    options.binder.mirror = false;
    let hooks = BindingHooks::open(SESSION, store.clone(), options)
        .await
        .expect("the session is free");
    let mut child = spawn_app_server(
        &CodexCommand::new(codex)
            .args(["--listen", "stdio://"])
            .env("CODEX_HOME", home)
            .env("RUST_LOG", "error"),
    );
    let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
    let mut proxied = proxy(Arc::new(hooks), stdout, stdin, |mut o| {
        o.max_line_length = limit;
        o
    });
    proxied.client.initialize(false).await.unwrap();
    Process { proxied, child }
}

impl Process {
    async fn stop(mut self, version: &str) -> Proxied {
        self.proxied.client.close_writer().await;
        while self.proxied.client.next_message().await.unwrap().is_some() {}
        tokio::time::timeout(Duration::from_secs(15), &mut self.proxied.task)
            .await
            .unwrap_or_else(|_| panic!("{version}: the forwarder ends"))
            .unwrap()
            .unwrap();
        assert!(self.child.wait().await.unwrap().success(), "{version}");
        self.proxied
    }
}

fn warnings(log: &[Value]) -> Vec<Value> {
    log.iter()
        .filter(|m| m["method"] == "warning")
        .map(|m| m["params"].clone())
        .filter(|p| p["message"] == RESUME_FALLBACK_NOTICE)
        .collect()
}

async fn bound(store: &BindingStore) -> Option<String> {
    store
        .session(SESSION)
        .await
        .unwrap()
        .and_then(|s| s.thread_id().map(str::to_string))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_keep_one_conversation_then_a_lost_rollout_falls_back_once() {
    for (version, codex) in releases() {
        let model = ResponsesStandIn::start().unwrap();
        let home = CodexHome::new(&model).unwrap();
        ask_for_approvals(home.path()).unwrap();
        let store: BindingStore = BindingStore::memory();

        // Process 1: a new thread (a UUID id), a turn that asks for an approval.
        model.push_escalated_command("echo approved");
        let mut one = start(&codex, home.path(), &store).await;
        let start_id = json!("5a1d2c3b-4e5f-4a6b-8c7d-9e0f1a2b3c4d");
        one.proxied
            .client
            .send(&json!({"id": start_id, "method": "thread/start", "params": {"cwd": "/tmp"}}))
            .await
            .unwrap();
        let thread = thread_id(&one.proxied.client.response_to(&start_id).await.unwrap());
        let turn = one
            .proxied
            .client
            .run_turn(
                &thread,
                "remember zebra",
                Some(json!({"decision": "accept"})),
            )
            .await
            .unwrap();
        assert_eq!(turn.status().as_deref(), Some("completed"), "{version}");
        let approval = turn
            .messages
            .iter()
            .find(|m| m.get("id").is_some() && m.get("method").is_some())
            .unwrap_or_else(|| panic!("{version}: no approval reached the client"))
            .clone();
        assert_eq!(
            bound(&store).await.as_deref(),
            Some(thread.as_str()),
            "{version}"
        );
        let one = one.stop(&version).await;
        // No request of the proxy's own without a binding: codex read the client's bytes,
        // the approval's answer among them, and the client read codex's.
        assert_eq!(bytes(&one.codex_read), bytes(&one.client_sent), "{version}");
        let answer = format!(
            "{{\"id\":{},\"result\":{{\"decision\":\"accept\"}}}}",
            approval["id"]
        );
        assert!(lines(&one.client_sent).contains(&answer), "{version}");
        assert_eq!(lines(&one.client_got), lines(&one.codex_wrote), "{version}");

        // Process 2: `thread/start` (an integer id) gets the same thread; the model sees turn 1.
        let mut two = start(&codex, home.path(), &store).await;
        let answer = start_thread(&mut two.proxied.client).await;
        assert_eq!(thread_id(&answer), thread, "{version}: {answer}");
        assert_eq!(answer["result"]["thread"]["turns"], json!([]), "{version}");
        let turn = two
            .proxied
            .client
            .run_turn(&thread, "what did I say?", None)
            .await
            .unwrap();
        assert_eq!(turn.agent_text(), ["echo: what did I say?"], "{version}");
        let seen = model.model_requests().last().unwrap().conversation();
        assert!(
            seen.iter().any(|m| m.text == "remember zebra"),
            "{version}: {seen:?}"
        );
        let two = two.stop(&version).await;
        assert!(warnings(&two.client.log).is_empty(), "{version}");
        let own: Vec<String> = lines(&two.codex_read)
            .into_iter()
            .filter(|l| l.contains("\"rethread-proxy:"))
            .collect();
        assert!(!own.is_empty() && own.iter().all(|l| l.contains("thread/resume")));
        assert!(!lines(&two.client_got)
            .iter()
            .any(|l| l.contains("rethread-proxy:")));

        // The rollout is lost: process 3 gets a new thread and exactly one warning naming it.
        for rollout in rollout_files(home.path()) {
            std::fs::remove_file(rollout).unwrap();
        }
        let mut three = start(&codex, home.path(), &store).await;
        let answer = start_thread(&mut three.proxied.client).await;
        let new = thread_id(&answer);
        assert_ne!(new, thread, "{version}");
        let log = &three.proxied.client.log;
        assert_eq!(
            warnings(log),
            [json!({"message": RESUME_FALLBACK_NOTICE, "threadId": new})],
            "{version}"
        );
        let at = log.iter().position(|m| *m == answer).unwrap();
        assert_eq!(log[at - 1]["params"]["message"], RESUME_FALLBACK_NOTICE);
        let turn = three
            .proxied
            .client
            .run_turn(&new, "still there?", None)
            .await
            .unwrap();
        assert_eq!(turn.agent_text(), ["echo: still there?"], "{version}");
        // Seeded from the transcript: the model of the new thread saw the earlier words.
        let seen = model.model_requests().last().unwrap().conversation();
        assert!(
            seen.iter().any(|m| m
                .text
                .contains(r#"{"role":"user","text":"remember zebra"}"#)),
            "{version}: {seen:?}"
        );
        assert_eq!(
            bound(&store).await.as_deref(),
            Some(new.as_str()),
            "{version}"
        );
        three.stop(&version).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paginated_thread_under_the_floor_falls_back_with_one_warning() {
    let (Some(current), Some(floor)) = (
        codex_or_skip(rethread_testkit::CURRENT),
        codex_or_skip(rethread_testkit::FLOOR),
    ) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let home = CodexHome::new(&model).unwrap();
    let store: BindingStore = BindingStore::memory();
    let mut one = start(&current, home.path(), &store).await;
    let answer = start_thread(&mut one.proxied.client).await;
    assert_eq!(answer["result"]["thread"]["historyMode"], "paginated");
    let thread = thread_id(&answer);
    one.proxied
        .client
        .run_turn(&thread, "remember zebra", None)
        .await
        .unwrap();
    one.stop("current").await;

    let mut two = start(&floor, home.path(), &store).await;
    let answer = start_thread(&mut two.proxied.client).await;
    let new = thread_id(&answer);
    assert_ne!(new, thread);
    assert_eq!(
        warnings(&two.proxied.client.log),
        [json!({"message": RESUME_FALLBACK_NOTICE, "threadId": new})]
    );
    let reports = two.proxied.reports.lock().unwrap().clone();
    assert!(
        reports.iter().any(|r| r.contains("reason: incompatible")),
        "{reports:#?}"
    );
    two.proxied
        .client
        .run_turn(&new, "hello again", None)
        .await
        .unwrap();
    assert_eq!(bound(&store).await.as_deref(), Some(new.as_str()));
    two.stop("floor").await;
}

/// The floor refuses `excludeTurns` to a client without `experimentalApi`, so its answer to
/// the proxy's resume carries every turn. Past the proxy's line limit it still resumes the
/// thread, and the model still sees the earlier turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_resumes_a_thread_whose_resume_answer_passes_the_line_limit() {
    const LIMIT: usize = 64 * 1024;
    let Some(floor) = codex_or_skip(rethread_testkit::FLOOR) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let home = CodexHome::new(&model).unwrap();
    let store: BindingStore = BindingStore::memory();
    let mut one = start_limited(&floor, home.path(), &store, LIMIT).await;
    let thread = thread_id(&start_thread(&mut one.proxied.client).await);
    let long = "zebra ".repeat(4000);
    for i in 0..4 {
        let turn = one
            .proxied
            .client
            .run_turn(&thread, &format!("turn {i}: {long}"), None)
            .await
            .unwrap();
        assert_eq!(turn.status().as_deref(), Some("completed"));
    }
    one.stop("floor").await;

    let mut two = start_limited(&floor, home.path(), &store, LIMIT).await;
    let answer = start_thread(&mut two.proxied.client).await;
    assert_eq!(thread_id(&answer), thread, "{answer}");
    assert_eq!(answer["result"]["thread"]["turns"], json!([]));
    assert!(answer["result"]["model"].is_string(), "{answer}");
    assert!(
        lines(&two.proxied.codex_wrote)
            .iter()
            .any(|line| line.len() > LIMIT && line.contains("rethread-proxy:")),
        "codex answered the proxy's resume with a line past the limit"
    );
    two.proxied
        .client
        .run_turn(&thread, "what did I say?", None)
        .await
        .unwrap();
    let seen = model.model_requests().last().unwrap().conversation();
    assert!(
        seen.iter().any(|m| m.text.starts_with("turn 3: zebra")),
        "{seen:?}"
    );
    let two = two.stop("floor").await;
    assert!(warnings(&two.client.log).is_empty());
    assert_eq!(bound(&store).await.as_deref(), Some(thread.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_turn_writes_nothing() {
    for (version, codex) in releases() {
        let model = ResponsesStandIn::start().unwrap();
        let home = CodexHome::new(&model).unwrap();
        let store: BindingStore = BindingStore::memory();
        let mut one = start(&codex, home.path(), &store).await;
        let client = &mut one.proxied.client;
        let thread = thread_id(&start_thread(client).await);
        model.set_delay(Duration::from_secs(30));
        let started = client
            .request(
                "turn/start",
                Some(json!({"threadId": thread, "input": [{"type": "text", "text": "slow"}]})),
            )
            .await
            .unwrap();
        let turn = started["result"]["turn"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        client.wait_for("turn/started").await.unwrap();
        model
            .wait_for_model_requests(1, Duration::from_secs(10))
            .await;
        client
            .request(
                "turn/interrupt",
                Some(json!({"threadId": thread, "turnId": turn})),
            )
            .await
            .unwrap();
        let completed = client.wait_for("turn/completed").await.unwrap();
        assert_eq!(
            completed.last().unwrap()["params"]["turn"]["status"],
            "interrupted",
            "{version}"
        );
        assert_eq!(store.session(SESSION).await.unwrap(), None, "{version}");
        model.set_delay(Duration::ZERO);
        one.stop(&version).await;
    }
}

/// Issue 39 through `rethread app-server`'s session on the current codex: the bound thread
/// resumes for the client's `thread/start`, and the model refuses its first request as the
/// Responses API refuses another account's encrypted reasoning (HTTP 400
/// `invalid_encrypted_content`). The binding is dropped with one warning, and the client's
/// next `turn/start`, still naming the thread it was given, runs on a fresh seeded thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_accounts_first_turn_falls_back_once_and_the_next_turn_runs_fresh() {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let home = CodexHome::new(&model).unwrap();
    let store: BindingStore = BindingStore::memory();
    let mut one = start(&codex, home.path(), &store).await;
    let old = thread_id(&start_thread(&mut one.proxied.client).await);
    let client = &mut one.proxied.client;
    let turn = client.run_turn(&old, "remember zebra", None).await.unwrap();
    assert_eq!(turn.status().as_deref(), Some("completed"));
    one.stop(CURRENT).await;

    let mut two = start(&codex, home.path(), &store).await;
    let client = &mut two.proxied.client;
    assert_eq!(thread_id(&start_thread(client).await), old, "resumed");
    model.push_error(
        400,
        rethread_testkit::responses::invalid_encrypted_content(),
    );
    let failed = client.run_turn(&old, "which animal?", None).await.unwrap();
    assert_eq!(failed.status().as_deref(), Some("failed"));
    let error = &failed.completed.as_ref().unwrap()["params"]["turn"]["error"];
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("invalid_encrypted_content"),
        "{error}"
    );
    assert_eq!(bound(&store).await, None, "the binding is dropped");
    let given_up = store.session(SESSION).await.unwrap().unwrap();
    assert_eq!(given_up.given_up().unwrap().reason, "account_mismatch");
    assert_eq!(
        warnings(&client.log).len(),
        1,
        "said before the failed turn/completed"
    );

    let next = client.run_turn(&old, "and now?", None).await.unwrap();
    assert_eq!(
        next.status().as_deref(),
        Some("completed"),
        "{:?}",
        next.messages
    );
    let new = next.completed.as_ref().unwrap()["params"]["threadId"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(new, old);
    let seen = model
        .model_requests()
        .last()
        .unwrap()
        .json()
        .unwrap()
        .to_string();
    assert!(
        seen.contains("remember zebra"),
        "seeded from the transcript"
    );
    let again = client.run_turn(&old, "still there?", None).await.unwrap();
    assert_eq!(again.status().as_deref(), Some("completed"));
    assert_eq!(warnings(&client.log).len(), 1, "once");
    assert_eq!(bound(&store).await.as_deref(), Some(new.as_str()));
    let record = store.session(SESSION).await.unwrap().unwrap();
    let from = record.binding().unwrap().fell_back_from.clone().unwrap();
    assert_eq!(
        (from.thread_id, from.reason),
        (old, "account_mismatch".to_string())
    );
    two.stop(CURRENT).await;
}
