//! Threads kept without a session (issue 34, defect 3), on `fake-codex`: what
//! `kept_threads.rs` shows against the real codex, here in the offline stage too, plus the
//! refusals and leases of the sessionless path. With a store and no `RETHREAD_SESSION`,
//! `rethread app-server` keeps a thread by its own id, so an empty `CODEX_HOME` sharing the
//! store resumes it with its memory; a session's thread is refused in the session path's
//! shape; a resume codex refuses leaves the thread free; `rethread exec` exits 75 while
//! another live process runs the kept thread.

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use rethread_testkit::real::{thread_id, AppServerProcess};
use serde_json::{json, Value};
use support::{app_server_with, fake_codex, rethread, spawn_with_prompt, store_url};

/// `rethread app-server` on `home` over the fake, `session` if any, initialized.
async fn app_server(home: &Path, store: &str, session: Option<&str>) -> AppServerProcess {
    let fake = fake_codex();
    let mut env = vec![
        ("RETHREAD_STORE", store),
        ("RETHREAD_CODEX_BIN", fake.to_str().unwrap()),
        ("RETHREAD_MIRROR", "on"),
        ("RETHREAD_SESSION_WAIT", "0"),
    ];
    if let Some(session) = session {
        env.push(("RETHREAD_SESSION", session));
    }
    app_server_with(home, &[], &env).await
}

/// A new thread with one completed turn saying `text`.
async fn thread_with_a_turn(process: &mut AppServerProcess, text: &str) -> String {
    let start = process.peer.start_thread().await.unwrap();
    let thread = thread_id(&start);
    let run = process.peer.run_turn(&thread, text, None).await.unwrap();
    assert_eq!(run.status().as_deref(), Some("completed"));
    thread
}

async fn resume(process: &mut AppServerProcess, thread: &str) -> Value {
    let params = json!({"threadId": thread});
    process
        .peer
        .request("thread/resume", Some(params))
        .await
        .unwrap()
}

/// What the fake's model saw on `home`, one conversation per request.
fn model_requests(home: &Path) -> Vec<String> {
    let log = std::fs::read_to_string(home.join("fake-model-requests.jsonl"));
    log.unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn a_kept_thread_is_resumed_on_an_empty_home_with_its_memory() {
    let (first, second, dir) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let store = store_url(dir.path());
    let mut host = app_server(first.path(), &store, None).await;
    let thread = thread_with_a_turn(&mut host, "my word is zebra-42").await;
    host.shutdown(Duration::from_secs(15)).await.unwrap();

    let mut moved = app_server(second.path(), &store, None).await;
    let resumed = resume(&mut moved, &thread.to_uppercase()).await;
    assert_eq!(thread_id(&resumed), thread, "{resumed}");
    let run = moved.peer.run_turn(&thread, "what is my word?", None).await;
    assert_eq!(run.unwrap().status().as_deref(), Some("completed"));
    moved.shutdown(Duration::from_secs(15)).await.unwrap();
    let seen = model_requests(second.path());
    let last = seen.last().expect("a model request on the second home");
    assert!(last.contains("zebra-42"), "{last}");

    // A prune says a kept thread is one (issue 36): kind `thread`, with its id.
    support::wait_out_the_shortest_idle();
    let out = Command::new(rethread())
        .args([
            "--store",
            &store,
            "sessions",
            "prune",
            "--idle",
            support::SHORTEST_IDLE,
            "--dry-run",
            "--json",
        ])
        .env_remove("RETHREAD_STORE")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let kept = json!({"kind": "thread", "thread": thread, "session": format!("thread:{thread}")});
    let listed = report["removed"].as_array().unwrap();
    assert!(
        listed.iter().any(|entry| ["kind", "thread", "session"]
            .iter()
            .all(|key| entry[key] == kept[key])),
        "{report}"
    );
}

#[tokio::test]
async fn a_sessions_thread_is_refused_without_a_session_in_the_session_paths_shape() {
    let (home, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store = store_url(dir.path());
    let mut bob = app_server(home.path(), &store, Some("bob")).await;
    let thread = thread_with_a_turn(&mut bob, "bob's secret").await;
    bob.shutdown(Duration::from_secs(15)).await.unwrap();

    let mut alice = app_server(home.path(), &store, Some("alice")).await;
    let by_session = resume(&mut alice, &thread).await;
    alice.shutdown(Duration::from_secs(15)).await.unwrap();
    let mut host = app_server(home.path(), &store, None).await;
    let sessionless = resume(&mut host, &thread.to_uppercase()).await;
    host.shutdown(Duration::from_secs(15)).await.unwrap();

    for refusal in [&by_session, &sessionless] {
        let error = &refusal["error"];
        assert_eq!(error["code"], -32600, "{refusal}");
        let data = &error["data"]["rethread"];
        assert_eq!(data["kind"], "thread_taken", "{refusal}");
        assert_eq!(data["threadId"], thread.as_str(), "{refusal}");
        assert_eq!(data["ownerSessionId"], "bob", "{refusal}");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains("belongs to rethread session bob"),
            "{message}"
        );
    }
    assert_eq!(
        by_session["error"]["data"]["rethread"]["sessionId"],
        "alice"
    );
    let data = &sessionless["error"]["data"]["rethread"];
    assert_eq!(data["sessionId"], Value::Null, "{sessionless}");
    let message = sessionless["error"]["message"].as_str().unwrap();
    assert!(!message.contains("the session's thread"), "{message}");
}

/// Issue 34, item 2 (and "no session ever touches another's thread"): a client without a
/// session, its threads kept by their ids, could still fork a session's thread (its copy held
/// the session's conversation) or read its turns; only `thread/resume` was refused.
#[tokio::test]
async fn a_sessions_thread_is_never_forked_or_read_without_a_session() {
    let (home, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store = store_url(dir.path());
    let mut bob = app_server(home.path(), &store, Some("bob")).await;
    let thread = thread_with_a_turn(&mut bob, "bob's secret").await;
    bob.shutdown(Duration::from_secs(15)).await.unwrap();

    let mut host = app_server(home.path(), &store, None).await;
    let upper = thread.to_uppercase();
    for (method, params) in [
        (
            "thread/read",
            json!({"threadId": upper, "includeTurns": true}),
        ),
        ("thread/fork", json!({"threadId": upper})),
    ] {
        let answer = host.peer.request(method, Some(params)).await.unwrap();
        let data = &answer["error"]["data"]["rethread"];
        assert_eq!(data["kind"], "thread_taken", "{method}: {answer}");
        assert_eq!(data["ownerSessionId"], "bob", "{method}: {answer}");
        assert!(!answer.to_string().contains("bob's secret"), "{answer}");
    }
    host.shutdown(Duration::from_secs(15)).await.unwrap();

    // `rethread exec fork <id>` without a session: refused before codex runs (exit 1).
    let forked = exec(home.path(), &store, &["fork", &upper], None);
    let forked = forked.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&forked.stderr);
    assert_eq!(forked.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("belongs to session bob"), "{stderr}");
    assert!(forked.stdout.is_empty(), "{forked:?}");
}

/// Issue 41: with a store and no session the guard holds whether or not threads are kept
/// (`RETHREAD_MIRROR=off` keeps nothing): a session's thread is refused, and a listing does not
/// show it.
#[tokio::test]
async fn a_sessions_thread_is_guarded_without_a_session_even_with_the_mirror_off() {
    let (home, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store = store_url(dir.path());
    let mut bob = app_server(home.path(), &store, Some("bob")).await;
    let thread = thread_with_a_turn(&mut bob, "bob's secret").await;
    bob.shutdown(Duration::from_secs(15)).await.unwrap();

    let fake = fake_codex();
    let env = [
        ("RETHREAD_STORE", store.as_str()),
        ("RETHREAD_CODEX_BIN", fake.to_str().unwrap()),
        ("RETHREAD_MIRROR", "off"),
    ];
    let mut host = app_server_with(home.path(), &[], &env).await;
    let params = json!({"threadId": thread, "includeTurns": true});
    let answer = host
        .peer
        .request("thread/read", Some(params))
        .await
        .unwrap();
    assert_eq!(
        answer["error"]["data"]["rethread"]["kind"], "thread_taken",
        "{answer}"
    );
    assert!(!answer.to_string().contains("bob's secret"), "{answer}");
    let listed = host
        .peer
        .request("thread/list", Some(json!({})))
        .await
        .unwrap();
    assert!(listed["result"]["data"].is_array(), "{listed}");
    assert!(!listed.to_string().contains(&thread), "{listed}");
    host.shutdown(Duration::from_secs(15)).await.unwrap();
}

#[tokio::test]
async fn a_resume_codex_refuses_leaves_the_thread_free_for_another_process() {
    let (home, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store = store_url(dir.path());
    // No home holds this thread: codex refuses its resume.
    let thread = "0195ec6b-66c5-7e31-9f2f-3ad0a1f2b9c4";
    let mut first = app_server(home.path(), &store, None).await;
    let refused = resume(&mut first, thread).await;
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("no rollout found"), "{refused}");

    // While the first connection is still open, another process gets codex's answer, not
    // `session_busy`: the refused resume holds no lease.
    let mut second = app_server(home.path(), &store, None).await;
    let again = resume(&mut second, thread).await;
    assert_eq!(
        again["error"]["message"], refused["error"]["message"],
        "{again}"
    );
    second.shutdown(Duration::from_secs(15)).await.unwrap();
    first.shutdown(Duration::from_secs(15)).await.unwrap();
}

/// `rethread exec --experimental-json ARGS` on `home` over the fake, no session, the prompt
/// on stdin; `faults` for the fake when given.
fn exec(home: &Path, store: &str, args: &[&str], faults: Option<&str>) -> Child {
    let mut command = Command::new(rethread());
    command
        .args(["exec", "--experimental-json"])
        .args(args)
        .env("CODEX_HOME", home)
        .env("RETHREAD_STORE", store)
        .env("RETHREAD_CODEX_BIN", fake_codex())
        .env("RETHREAD_SESSION_WAIT", "0")
        .env("RETHREAD_MIRROR", "on")
        .env_remove("RETHREAD_SESSION")
        .env_remove("FAKE_CODEX_FAULTS")
        .env_remove("RUST_LOG");
    if let Some(faults) = faults {
        command.env("FAKE_CODEX_FAULTS", faults);
    }
    spawn_with_prompt(&mut command, b"hello")
}

#[test]
fn exec_exits_75_while_another_process_runs_the_kept_thread() {
    let (home, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store = store_url(dir.path());
    let first = exec(home.path(), &store, &[], None)
        .wait_with_output()
        .unwrap();
    assert_eq!(first.status.code(), Some(0), "{first:?}");
    let line = first.stdout.split(|b| *b == b'\n').next().unwrap();
    let started: Value = serde_json::from_slice(line).unwrap();
    let thread = started["thread_id"].as_str().unwrap().to_string();

    // A run of the thread whose turn stays open: it holds the thread once it has started.
    let slow = r#"{"faults": [{"kind": "slow_turn", "millis": 60000}]}"#;
    let mut holder = exec(home.path(), &store, &["resume", &thread], Some(slow));
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    let first_line = lines.next().expect("the holder's first event").unwrap();
    assert!(first_line.contains("thread.started"), "{first_line}");

    let busy = exec(
        home.path(),
        &store,
        &["resume", &thread.to_uppercase()],
        None,
    );
    let busy = busy.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&busy.stderr);
    assert_eq!(busy.status.code(), Some(75), "{stderr}");
    assert!(stderr.contains(&format!("thread:{thread}")), "{stderr}");
    holder.kill().unwrap();
    holder.wait().unwrap();
}
