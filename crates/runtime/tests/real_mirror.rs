//! The rollout mirror against the real codex releases, offline through the Responses-API
//! stand-in: each behaviour of "Moving a thread between homes" (`docs/design.md`) that rethread
//! relies on. A thread moves by its rollout file alone (every release, a torn copy included);
//! a diverged copy is replaced and `thread/read` then shows what the model sees; a paginated
//! `thread/revert`'s head file goes with its source; a paginated thread restored under the
//! floor still falls back (the restore hides nothing).

use std::path::Path;
use std::time::Duration;

use rethread_protocol::ResumeFailure;
use rethread_runtime::{
    AppServerClient, BinderOptions, CodexCommand, OpenOutcome, SessionBinder, StatusKind,
    StatusRail, TurnReport,
};
use rethread_store::BindingStore;
use rethread_testkit::real::{codex_or_skip, rollout_files, AppServerProcess, CodexHome};
use rethread_testkit::responses::ResponsesStandIn;
use rethread_testkit::{recent_releases, supported_releases, CURRENT, FLOOR};
use serde_json::{json, Value};

const SESSION: &str = "moving";

/// One host process on `home`: a client of `codex`, a binder with the mirror on.
struct Host {
    client: AppServerClient,
    binder: SessionBinder,
}

impl Host {
    async fn start(codex: &Path, home: &Path, store: &BindingStore) -> Host {
        let command = CodexCommand::new(codex)
            .env("CODEX_HOME", home.display().to_string())
            .env("RUST_LOG", "error");
        let client = AppServerClient::spawn(&command).await.unwrap();
        let options = BinderOptions::default()
            .codex_home(Some(home.display().to_string()))
            .mirror(true)
            .retry_backoff(Duration::from_millis(50));
        let binder = SessionBinder::new(SESSION, store.clone(), StatusRail::recording().0)
            .with_options(options);
        Host { client, binder }
    }

    async fn stop(self) {
        self.binder.close().await.unwrap();
        self.client.shutdown().await;
    }
}

/// Opens the session on `home` and runs one turn per text; the outcome of the open and the
/// reports.
async fn turns(
    codex: &Path,
    home: &Path,
    store: &BindingStore,
    texts: &[&str],
) -> (OpenOutcome, Vec<TurnReport>) {
    let mut host = Host::start(codex, home, store).await;
    let mut session = host.binder.open(&host.client).await.unwrap();
    let mut reports = Vec::new();
    for text in texts {
        reports.push(session.run_turn(*text).await.unwrap());
    }
    let outcome = session.outcome().clone();
    drop(session);
    host.stop().await;
    (outcome, reports)
}

/// The user texts of the last model request.
fn model_saw(model: &ResponsesStandIn) -> Vec<String> {
    model
        .model_requests()
        .last()
        .unwrap()
        .conversation()
        .into_iter()
        .filter(|m| m.role == "user")
        .map(|m| m.text)
        .collect()
}

fn relative(home: &Path, file: &Path) -> std::path::PathBuf {
    file.strip_prefix(home).unwrap().to_path_buf()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_moves_by_its_rollout_alone_on_every_release_a_torn_copy_included() {
    for version in supported_releases() {
        let Some(codex) = codex_or_skip(&version) else {
            continue;
        };
        let model = ResponsesStandIn::start().unwrap();
        let (a, b, c) = (
            CodexHome::new(&model).unwrap(),
            CodexHome::new(&model).unwrap(),
            CodexHome::new(&model).unwrap(),
        );
        let store: BindingStore = BindingStore::memory();
        let (first, _) = turns(&codex, a.path(), &store, &["one", "two"]).await;
        let thread = first.thread_id().to_string();
        // Machine B holds a torn copy (a writer killed mid-append): a strict prefix the
        // mirror completes, cut at no newline of its own.
        let source = &rollout_files(a.path())[0];
        let bytes = std::fs::read(source).unwrap();
        let torn = b.path().join(relative(a.path(), source));
        std::fs::create_dir_all(torn.parent().unwrap()).unwrap();
        std::fs::write(&torn, &bytes[..bytes.len() - 7]).unwrap();
        let (outcome, _) = turns(&codex, b.path(), &store, &["three"]).await;
        assert_eq!(
            outcome,
            OpenOutcome::Resumed {
                thread_id: thread.clone()
            },
            "{version}"
        );
        let saw = model_saw(&model);
        assert!(
            ["one", "two", "three"]
                .iter()
                .all(|t| saw.contains(&t.to_string())),
            "{version}: {saw:?}"
        );
        // Machine C never saw the thread.
        let (outcome, _) = turns(&codex, c.path(), &store, &["four"]).await;
        assert_eq!(outcome.thread_id(), thread, "{version}");
        assert!(matches!(outcome, OpenOutcome::Resumed { .. }), "{version}");
        let saw = model_saw(&model);
        assert!(
            ["one", "two", "three", "four"]
                .iter()
                .all(|t| saw.contains(&t.to_string())),
            "{version}: {saw:?}"
        );
        // The store's mirror is the rollout as of the last turn, byte for byte.
        let file = &rollout_files(c.path())[0];
        let path = relative(c.path(), file).to_string_lossy().into_owned();
        assert_eq!(
            store.mirror_file(SESSION, &thread, &path).await.unwrap(),
            Some(std::fs::read(file).unwrap()),
            "{version}"
        );
    }
}

/// The turns' user texts as `thread/read` shows them.
async fn read_turns(client: &AppServerClient, thread: &str) -> Vec<String> {
    let read = client
        .request_value(
            "thread/read",
            Some(json!({"threadId": thread, "includeTurns": true})),
        )
        .await
        .unwrap();
    read["thread"]["turns"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|turn| {
            turn["items"]
                .as_array()?
                .iter()
                .find(|i| i["type"] == "userMessage")
                .and_then(|i| i["content"][0]["text"].as_str())
                .map(str::to_string)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diverged_copy_is_replaced_and_thread_read_shows_what_the_model_sees() {
    for version in recent_releases() {
        let Some(codex) = codex_or_skip(&version) else {
            continue;
        };
        let model = ResponsesStandIn::start().unwrap();
        let (a, b) = (
            CodexHome::new(&model).unwrap(),
            CodexHome::new(&model).unwrap(),
        );
        let store: BindingStore = BindingStore::memory();
        let (first, _) = turns(&codex, a.path(), &store, &["alpha", "bravo"]).await;
        let thread = first.thread_id().to_string();
        // B resumes the thread by hand and runs a turn rethread never commits...
        let (_, _) = turns(&codex, b.path(), &store, &[]).await;
        let mut by_hand = AppServerProcess::spawn(&codex, b.path()).await.unwrap();
        by_hand.peer.initialize(true).await.unwrap();
        let peer = &mut by_hand.peer;
        peer.request("thread/resume", Some(json!({"threadId": thread})))
            .await
            .unwrap();
        peer.run_turn(&thread, "xray", None).await.unwrap();
        by_hand.shutdown(Duration::from_secs(15)).await.unwrap();
        // ... while the session goes on on A.
        turns(&codex, a.path(), &store, &["charlie"]).await;

        // Back on B: the mirror wins over the diverged copy.
        let mut host = Host::start(&codex, b.path(), &store).await;
        let mut session = host.binder.open(&host.client).await.unwrap();
        assert!(
            matches!(session.outcome(), OpenOutcome::Resumed { .. }),
            "{version}"
        );
        assert_eq!(
            read_turns(&host.client, &thread).await,
            ["alpha", "bravo", "charlie"],
            "{version}: thread/read shows the restored history"
        );
        session.run_turn("delta").await.unwrap();
        let saw = model_saw(&model);
        assert!(saw.contains(&"charlie".to_string()), "{version}: {saw:?}");
        assert!(!saw.contains(&"xray".to_string()), "{version}: {saw:?}");
        drop(session);
        host.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paginated_revert_head_file_goes_with_its_source() {
    for version in recent_releases() {
        let Some(codex) = codex_or_skip(&version) else {
            continue;
        };
        let model = ResponsesStandIn::start().unwrap();
        let (a, b) = (
            CodexHome::new(&model).unwrap(),
            CodexHome::new(&model).unwrap(),
        );
        let store: BindingStore = BindingStore::memory();
        let mut host = Host::start(&codex, a.path(), &store).await;
        let mut session = host.binder.open(&host.client).await.unwrap();
        let thread = session.thread_id().to_string();
        let mut ids = Vec::new();
        for text in ["alpha", "bravo", "charlie"] {
            ids.push(session.run_turn(text).await.unwrap().turn_id);
        }
        let reverted: Value = host
            .client
            .request_value(
                "thread/revert",
                Some(json!({"threadId": thread, "beforeTurnId": ids[2]})),
            )
            .await
            .unwrap();
        assert_eq!(reverted["thread"]["id"], json!(thread), "{version}");
        session.run_turn("delta").await.unwrap();
        drop(session);
        host.stop().await;
        let files = rollout_files(a.path());
        assert_eq!(
            files.len(),
            2,
            "{version}: a source and a head file: {files:?}"
        );
        let record = store.session(SESSION).await.unwrap().unwrap();
        assert_eq!(record.mirror.files_of(&thread).count(), 2, "{version}");

        let (outcome, _) = turns(&codex, b.path(), &store, &["echo"]).await;
        assert_eq!(outcome.thread_id(), thread, "{version}");
        assert!(matches!(outcome, OpenOutcome::Resumed { .. }), "{version}");
        let saw = model_saw(&model);
        for said in ["alpha", "bravo", "delta", "echo"] {
            assert!(
                saw.contains(&said.to_string()),
                "{version}: {said} in {saw:?}"
            );
        }
        assert!(!saw.contains(&"charlie".to_string()), "{version}: {saw:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paginated_thread_restored_under_the_floor_still_falls_back() {
    let (Some(current), Some(floor)) = (codex_or_skip(CURRENT), codex_or_skip(FLOOR)) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let (a, b) = (
        CodexHome::new(&model).unwrap(),
        CodexHome::new(&model).unwrap(),
    );
    let store: BindingStore = BindingStore::memory();
    let (first, _) = turns(&current, a.path(), &store, &["alpha"]).await;
    let lost = first.thread_id().to_string();
    let mut host = Host::start(&floor, b.path(), &store).await;
    let (rail, recorded) = StatusRail::recording();
    host.binder = SessionBinder::new(SESSION, store.clone(), rail).with_options(
        BinderOptions::default()
            .codex_home(Some(b.path().display().to_string()))
            .mirror(true),
    );
    let mut session = host.binder.open(&host.client).await.unwrap();
    let OpenOutcome::FellBack {
        previous_thread_id,
        reason,
        ..
    } = session.outcome().clone()
    else {
        panic!("{:?}", session.outcome())
    };
    assert_eq!(previous_thread_id, lost);
    assert_eq!(reason, ResumeFailure::Incompatible);
    assert_eq!(recorded.messages(StatusKind::Lifecycle).len(), 1);
    assert_eq!(
        rollout_files(b.path()).len(),
        1,
        "the restore wrote the rollout"
    );
    session.run_turn("bravo").await.unwrap();
    drop(session);
    host.stop().await;
}
