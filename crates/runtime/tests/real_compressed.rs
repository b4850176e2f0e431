//! codex's own compressed rollouts against the real codex (issue 39; `docs/design.md`,
//! "Moving a thread between homes"): with `local_thread_store_compression` on, codex rewrites a
//! rollout idle for 7 days as `rollout-*.jsonl.zst` and deletes the plain file. The mirror
//! reads the compressed file as the JSONL it holds: a turn codex ran that rethread never
//! committed is kept, on that home and on a new one; the restore never writes a plain file
//! beside a compressed one; and every supported release resumes a thread from the `.zst` alone.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use rethread_runtime::{
    probe_thread, AppServerClient, BinderOptions, CodexCommand, OpenOutcome, RolloutMirror,
    SessionBinder, StatusRail, ThreadHealth,
};
use rethread_store::BindingStore;
use rethread_testkit::real::{codex_or_skip, AppServerProcess, CodexHome};
use rethread_testkit::responses::ResponsesStandIn;
use rethread_testkit::{supported_releases, CURRENT};
use serde_json::json;

const SESSION: &str = "compressed";
const FEATURE: &str = "local_thread_store_compression";

/// Opens the session on `home` through rethread (mirror on) and runs one turn per text; the
/// outcome of the open.
async fn turns(codex: &Path, home: &Path, store: &BindingStore, texts: &[&str]) -> OpenOutcome {
    let command = CodexCommand::new(codex)
        .env("CODEX_HOME", home.display().to_string())
        .env("RUST_LOG", "error");
    let client = AppServerClient::spawn(&command).await.unwrap();
    let options = BinderOptions::default()
        .codex_home(Some(home.display().to_string()))
        .mirror(true)
        .retry_backoff(Duration::from_millis(50));
    let mut binder =
        SessionBinder::new(SESSION, store.clone(), StatusRail::recording().0).with_options(options);
    let mut session = binder.open(&client).await.unwrap();
    for text in texts {
        session.run_turn(*text).await.unwrap();
    }
    let outcome = session.outcome().clone();
    drop(session);
    binder.close().await.unwrap();
    client.shutdown().await;
    outcome
}

/// Resumes `thread` on `home` by hand and runs a turn rethread never sees.
async fn turn_by_hand(codex: &Path, home: &Path, thread: &str, text: &str) {
    let mut by_hand = AppServerProcess::spawn(codex, home).await.unwrap();
    by_hand.peer.initialize(true).await.unwrap();
    let resumed = by_hand
        .peer
        .request("thread/resume", Some(json!({"threadId": thread})))
        .await
        .unwrap();
    assert!(resumed.get("error").is_none(), "{resumed}");
    by_hand.peer.run_turn(thread, text, None).await.unwrap();
    by_hand.shutdown(Duration::from_secs(15)).await.unwrap();
}

/// Every file under `home/sessions`, sorted.
fn session_files(home: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            match path.is_dir() {
                true => walk(&path, out),
                false => out.push(path),
            }
        }
    }
    let mut out = Vec::new();
    walk(&home.join("sessions"), &mut out);
    out.sort();
    out
}

fn is_compressed(path: &Path) -> bool {
    path.to_string_lossy().ends_with(".jsonl.zst")
}

/// Sets every rollout's modification time 8 days back and starts `codex` with the feature on:
/// its own worker compresses them. Returns once no plain rollout is left (polled, with a
/// deadline), with the compressed files.
async fn compress_by_codex(codex: &Path, home: &Path) -> Vec<PathBuf> {
    let old = SystemTime::now() - Duration::from_secs(8 * 24 * 60 * 60);
    for file in session_files(home) {
        let handle = std::fs::File::options().append(true).open(&file).unwrap();
        handle.set_modified(old).unwrap();
    }
    let mut worker = AppServerProcess::spawn_with(codex, home, &["--enable", FEATURE], &[])
        .await
        .unwrap();
    worker.peer.initialize(true).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let files = session_files(home);
        let plain = files.iter().filter(|f| !is_compressed(f)).count();
        if plain == 0 && !files.is_empty() {
            worker.shutdown(Duration::from_secs(15)).await.unwrap();
            return files;
        }
        assert!(
            Instant::now() < deadline,
            "codex compressed nothing: {files:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The user texts of the last model request.
fn model_saw(model: &ResponsesStandIn) -> Vec<String> {
    let requests = model.model_requests();
    let conversation = requests.last().unwrap().conversation();
    let user = conversation.into_iter().filter(|m| m.role == "user");
    user.map(|m| m.text).collect()
}

fn assert_saw(model: &ResponsesStandIn, texts: &[&str], what: &str) {
    let saw = model_saw(model);
    for text in texts {
        assert!(saw.contains(&text.to_string()), "{what}: {text} in {saw:?}");
    }
}

/// No folder holds a rollout both plain and compressed.
fn assert_one_form(home: &Path) {
    let files = session_files(home);
    for file in files.iter().filter(|f| is_compressed(f)) {
        let plain = file.with_extension("");
        assert!(!files.contains(&plain), "{plain:?} beside {file:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_codex_compressed_keeps_its_uncommitted_turn_here_and_on_a_new_home() {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let (a, b) = (
        CodexHome::new(&model).unwrap(),
        CodexHome::new(&model).unwrap(),
    );
    let store = BindingStore::memory();
    let thread = turns(&codex, a.path(), &store, &["alpha"])
        .await
        .thread_id()
        .to_string();
    // A turn codex ran that rethread never committed, then a week idle: codex compresses it.
    turn_by_hand(&codex, a.path(), &thread, "bravo").await;
    let compressed = compress_by_codex(&codex, a.path()).await;
    assert!(
        compressed.iter().all(|f| is_compressed(f)),
        "{compressed:?}"
    );

    // Back on A: the compressed file extends the mirror, so it is kept, and bravo with it.
    let outcome = turns(&codex, a.path(), &store, &["charlie"]).await;
    assert_eq!(
        outcome,
        OpenOutcome::Resumed {
            thread_id: thread.clone()
        }
    );
    assert_saw(&model, &["alpha", "bravo", "charlie"], "home A");
    // codex decompressed it to append the turn: the plain file only, again.
    let files = session_files(a.path());
    assert!(files.iter().all(|f| !is_compressed(f)), "{files:?}");

    // B never saw the thread: the mirror holds bravo too.
    let outcome = turns(&codex, b.path(), &store, &["delta"]).await;
    assert_eq!(outcome.thread_id(), thread);
    assert!(
        matches!(outcome, OpenOutcome::Resumed { .. }),
        "{outcome:?}"
    );
    assert_saw(&model, &["alpha", "bravo", "charlie", "delta"], "home B");
    assert_one_form(b.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_rollout_that_is_the_mirror_costs_no_rewrite_and_is_kept() {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let a = CodexHome::new(&model).unwrap();
    let store = BindingStore::memory();
    let thread = turns(&codex, a.path(), &store, &["alpha", "bravo"])
        .await
        .thread_id()
        .to_string();
    let compressed = compress_by_codex(&codex, a.path()).await;
    let untouched: Vec<_> = compressed
        .iter()
        .map(|f| (f.clone(), std::fs::read(f).unwrap()))
        .collect();
    // The open restores nothing: the compressed file is what the store holds...
    let mirror = RolloutMirror::new(a.path());
    let restored = mirror.restore(&store, SESSION, &thread).await.unwrap();
    assert!(restored.written.is_empty(), "{restored:?}");
    assert!(!restored.diverged);
    for (file, bytes) in &untouched {
        assert_eq!(&std::fs::read(file).unwrap(), bytes, "{file:?} untouched");
    }
    // `doctor`'s probe (codex's own read) finds the thread live from the compressed file.
    let command = CodexCommand::new(&codex)
        .env("CODEX_HOME", a.path().display().to_string())
        .env("RUST_LOG", "error");
    let client = AppServerClient::spawn(&command).await.unwrap();
    let probe = probe_thread(&client, &thread).await.unwrap();
    assert_eq!(probe.health, ThreadHealth::Live, "{probe:?}");
    client.shutdown().await;
    // ... and a commit now sends nothing: compressing it changed no byte of what it holds.
    let prepared = mirror.prepare(&thread).await.unwrap();
    assert!(
        prepared.update.appends.is_empty(),
        "{:?}",
        prepared.update.appends
    );
    // The next turn's commit appends the turn to the stored file, under its plain path.
    let record = store.session(SESSION).await.unwrap().unwrap();
    let before: Vec<_> = record.mirror.files_of(&thread).cloned().collect();
    turns(&codex, a.path(), &store, &["charlie"]).await;
    let record = store.session(SESSION).await.unwrap().unwrap();
    let after: Vec<_> = record.mirror.files_of(&thread).cloned().collect();
    assert_eq!(after.len(), before.len());
    for (old, new) in before.iter().zip(&after) {
        assert_eq!(old.path, new.path, "the path stays the plain one");
        assert!(new.len > old.len, "{new:?} grew");
    }
    assert_one_form(a.path());
    assert_saw(&model, &["alpha", "bravo", "charlie"], "home A");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_supported_release_resumes_a_thread_from_its_compressed_rollout_alone() {
    let Some(current) = codex_or_skip(CURRENT) else {
        return;
    };
    for version in supported_releases() {
        let Some(codex) = codex_or_skip(&version) else {
            continue;
        };
        let model = ResponsesStandIn::start().unwrap();
        let a = CodexHome::new(&model).unwrap();
        let store = BindingStore::memory();
        let thread = turns(&codex, a.path(), &store, &["alpha"])
            .await
            .thread_id()
            .to_string();
        // Compressed by the current release's worker (the releases share the format).
        compress_by_codex(&current, a.path()).await;
        let outcome = turns(&codex, a.path(), &store, &["bravo"]).await;
        assert_eq!(
            outcome,
            OpenOutcome::Resumed {
                thread_id: thread.clone()
            },
            "{version}"
        );
        assert_saw(&model, &["alpha", "bravo"], &version);
        assert_one_form(a.path());
    }
}
