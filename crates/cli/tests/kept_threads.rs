//! Issue 34, defect 3: a host that keeps codex thread ids itself and names no session, against
//! the real current codex. With a store and no `RETHREAD_SESSION`, `rethread exec` and
//! `rethread app-server` keep each thread by its own id: a second, empty `CODEX_HOME` sharing
//! the store resumes it by id with its memory (without rethread, codex answers `no rollout
//! found` there); one live process holds a thread at a time; the threads are listed as
//! `thread:<id>` records holding no rows; no user session can take that key.

mod support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use rethread_testkit::real::{codex_or_skip, error_of, thread_id, AppServerProcess, CodexHome};
use rethread_testkit::responses::ResponsesStandIn;
use rethread_testkit::CURRENT;
use serde_json::json;
use support::{
    app_server_with, describe, exec_command, last_request_holds, rethread, run_with_prompt,
    sessions, started_thread, store_url,
};

/// `rethread exec --experimental-json ... ARGS` on `home` with `store`, `session` if any.
fn exec(
    codex: &Path,
    home: &Path,
    store: &str,
    session: Option<&str>,
    args: &[&str],
    prompt: &str,
) -> Output {
    let mut command = exec_command(codex, home, store);
    command
        .args(args)
        .env("RETHREAD_MIRROR", "on")
        .env_remove("RETHREAD_SESSION");
    if let Some(session) = session {
        command.env("RETHREAD_SESSION", session);
    }
    run_with_prompt(&mut command, prompt.as_bytes())
}

#[test]
fn exec_without_a_session_keeps_its_thread_for_a_second_home() {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let (first, second) = (
        CodexHome::new(&model).unwrap(),
        CodexHome::new(&model).unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let store = store_url(dir.path());
    let run = |home: &CodexHome, args: &[&str], prompt: &str| {
        exec(&codex, home.path(), &store, None, args, prompt)
    };

    // The host's first run: a new thread, whose id it keeps in its own database.
    let thread = started_thread(&run(&first, &[], "my word is zebra-42"));

    // Another machine, an empty home: resumed by the id (in another spelling), with memory.
    let upper = thread.to_uppercase();
    let moved = run(&second, &["resume", &upper], "what is my word?");
    assert_eq!(started_thread(&moved), thread, "{}", describe(&moved));
    assert!(
        last_request_holds(&model, "zebra-42"),
        "the model saw turn 1"
    );
    let shown = sessions(&store, &["show", &format!("thread:{thread}")]);
    assert_eq!(shown["thread_id"], thread.as_str(), "{shown}");
    assert_eq!(shown["row_count"], 0, "no transcript: {shown}");

    // Back on the first machine, whose copy lacks the second turn: restored before the resume.
    let back = run(&first, &["resume", &thread], "and again?");
    assert_eq!(started_thread(&back), thread);
    assert!(last_request_holds(&model, "what is my word?"), "turn 2 too");

    // A session's thread is not a sessionless run's, and no session takes a kept thread's key.
    let bob = exec(&codex, first.path(), &store, Some("bob"), &[], "bob's run");
    let bob = started_thread(&bob);
    let taken = run(&first, &["resume", &bob], "not mine");
    assert_eq!(taken.status.code(), Some(1), "{}", describe(&taken));
    assert!(String::from_utf8_lossy(&taken.stderr).contains("belongs to session bob"));
    let key = format!("thread:{thread}");
    let reserved = exec(&codex, first.path(), &store, Some(&key), &[], "mine now?");
    assert_eq!(reserved.status.code(), Some(2), "{}", describe(&reserved));
    assert!(String::from_utf8_lossy(&reserved.stderr).contains("reserved"));

    // The store's commands cover the kept thread as a session: doctor, verify, migrate,
    // prune, forget.
    let cli = |args: &[&str]| {
        let output = Command::new(rethread())
            .args(args)
            .env("CODEX_HOME", second.path())
            .env("RETHREAD_CODEX_BIN", &codex)
            .env_remove("RETHREAD_STORE")
            .output()
            .unwrap();
        assert!(output.status.success(), "{args:?}: {}", describe(&output));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    assert!(cli(&["--store", &store, "doctor"]).contains(&key));
    cli(&["--store", &store, "verify"]);
    let copy = format!("sqlite:{}", dir.path().join("copy.sqlite").display());
    cli(&["migrate", "--from", &store, "--to", &copy]);
    assert_eq!(
        sessions(&copy, &["show", &key])["thread_id"],
        thread.as_str()
    );
    support::wait_out_the_shortest_idle();
    let prunable = cli(&[
        "--store",
        &store,
        "sessions",
        "prune",
        "--idle",
        support::SHORTEST_IDLE,
        "--dry-run",
    ]);
    assert!(prunable.contains(&key), "{prunable}");
    cli(&["--store", &store, "sessions", "forget", &key]);
    let listed = sessions(&store, &["list"]).to_string();
    assert!(!listed.contains(&key) && listed.contains("bob"), "{listed}");
}

/// The environment of `rethread app-server` without a session, with `store`.
fn env<'a>(codex: &'a Path, store: &'a str) -> [(&'a str, &'a str); 4] {
    [
        ("RETHREAD_STORE", store),
        ("RETHREAD_CODEX_BIN", codex.to_str().unwrap()),
        ("RETHREAD_MIRROR", "on"),
        ("RETHREAD_SESSION_WAIT", "0"),
    ]
}

/// `rethread app-server` on `home` without a session, initialized.
async fn app_server(codex: &Path, home: &Path, store: &str) -> AppServerProcess {
    app_server_with(home, &[], &env(codex, store)).await
}

/// A turn of `thread` saying `text`, completed.
async fn turn(process: &mut AppServerProcess, thread: &str, text: &str) {
    let run = process.peer.run_turn(thread, text, None).await.unwrap();
    assert_eq!(run.status().as_deref(), Some("completed"));
}

#[tokio::test]
async fn app_server_without_a_session_keeps_each_thread_for_a_second_home() {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let (first, second) = (
        CodexHome::new(&model).unwrap(),
        CodexHome::new(&model).unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let store = store_url(dir.path());
    let start = Some(json!({"cwd": "/tmp"}));

    // One connection, two threads, a turn each; the client is told what is kept.
    let mut host = app_server(&codex, first.path(), &store).await;
    let apple = thread_id(
        &host
            .peer
            .request("thread/start", start.clone())
            .await
            .unwrap(),
    );
    turn(&mut host, &apple, "word one is apple").await;
    let pear = thread_id(
        &host
            .peer
            .request("thread/start", start.clone())
            .await
            .unwrap(),
    );
    turn(&mut host, &pear, "word two is pear").await;
    let warned = (host.peer.log.iter())
        .filter(|m| m["method"] == "warning")
        .filter_map(|m| m["params"]["message"].as_str())
        .any(|m| m.contains("each thread is kept by its own id"));
    host.shutdown(Duration::from_secs(15)).await.unwrap();

    // Another machine, an empty home: each thread resumed by its id, with its memory.
    let mut moved = app_server(&codex, second.path(), &store).await;
    for (thread, word) in [(&apple, "apple"), (&pear, "pear")] {
        let params = json!({"threadId": thread.to_uppercase()});
        let resumed = moved
            .peer
            .request("thread/resume", Some(params))
            .await
            .unwrap();
        assert_eq!(&thread_id(&resumed), thread, "{resumed}");
        turn(&mut moved, thread, "which word?").await;
        assert!(last_request_holds(&model, word), "{word}");
    }
    assert!(warned, "the client was told what is kept");

    // While that connection holds them, another process cannot resume them.
    let mut other = app_server(&codex, first.path(), &store).await;
    let params = json!({"threadId": apple});
    let busy = other
        .peer
        .request("thread/resume", Some(params.clone()))
        .await
        .unwrap();
    assert!(error_of(&busy).is_some(), "{busy}");
    assert_eq!(
        busy["error"]["data"]["rethread"]["kind"], "session_busy",
        "{busy}"
    );
    moved.shutdown(Duration::from_secs(15)).await.unwrap();
    let resumed = other
        .peer
        .request("thread/resume", Some(params))
        .await
        .unwrap();
    assert_eq!(thread_id(&resumed), apple, "{resumed}");
    turn(&mut other, &apple, "and now?").await;
    assert!(
        last_request_holds(&model, "which word?"),
        "the second home's turn"
    );
    other.shutdown(Duration::from_secs(15)).await.unwrap();

    // Listed as records of their own, holding the binding and the mirror, no rows.
    let listed = sessions(&store, &["list"]);
    let listed = listed.to_string();
    for thread in [&apple, &pear] {
        assert!(listed.contains(&format!("thread:{thread}")), "{listed}");
    }
}

#[tokio::test]
async fn app_server_without_a_session_forks_a_kept_thread_on_a_second_home() {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let (first, second) = (
        CodexHome::new(&model).unwrap(),
        CodexHome::new(&model).unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let store = store_url(dir.path());
    let mut host = app_server(&codex, first.path(), &store).await;
    let start = Some(json!({"cwd": "/tmp"}));
    let apple = thread_id(&host.peer.request("thread/start", start).await.unwrap());
    turn(&mut host, &apple, "my word is apple").await;
    host.shutdown(Duration::from_secs(15)).await.unwrap();

    // Another machine, an empty home: the fork's source is restored first, the fork remembers.
    let mut moved = app_server(&codex, second.path(), &store).await;
    let params = json!({"threadId": apple.to_uppercase()});
    let forked = moved.peer.request("thread/fork", Some(params)).await;
    let forked = forked.unwrap();
    assert!(error_of(&forked).is_none(), "{forked}");
    let fork = thread_id(&forked);
    assert_ne!(fork, apple);
    turn(&mut moved, &fork, "a fork: which word?").await;
    assert!(last_request_holds(&model, "apple"), "the fork holds turn 1");
    moved.shutdown(Duration::from_secs(15)).await.unwrap();
    let listed = sessions(&store, &["list"]).to_string();
    assert!(listed.contains(&format!("thread:{fork}")), "{listed}");
}

/// Issue 39: a fork's rollout refers to its source's (codex 0.171.0 writes a paginated fork as
/// `forked_from_id` plus the records after the fork point, and answers "missing source
/// rollout" without the source's file). Restored alone on an empty home, by the fork's id, the
/// fork still resumes with the whole history codex shows for it at home: with and without
/// `attachToSource`.
#[tokio::test]
async fn a_fork_restored_alone_on_an_empty_home_keeps_its_sources_history() {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = store_url(dir.path());
    for attach in [false, true] {
        let (first, second) = (
            CodexHome::new(&model).unwrap(),
            CodexHome::new(&model).unwrap(),
        );
        // `attachToSource` is behind `experimentalApi`.
        let mut host =
            AppServerProcess::spawn_with(&rethread(), first.path(), &[], &env(&codex, &store))
                .await
                .unwrap();
        host.peer.initialize(attach).await.unwrap();
        let start = Some(json!({"cwd": "/tmp"}));
        let source = thread_id(&host.peer.request("thread/start", start).await.unwrap());
        turn(&mut host, &source, "my word is quince").await;
        let params = json!({"threadId": source, "attachToSource": attach});
        let forked = host
            .peer
            .request("thread/fork", Some(params))
            .await
            .unwrap();
        assert!(error_of(&forked).is_none(), "{forked}");
        let fork = thread_id(&forked);
        turn(&mut host, &fork, "the fork says plum").await;
        host.shutdown(Duration::from_secs(15)).await.unwrap();

        // Another machine, an empty home: only the fork is named.
        let mut moved = app_server(&codex, second.path(), &store).await;
        let params = json!({"threadId": fork});
        let resumed = moved.peer.request("thread/resume", Some(params)).await;
        let resumed = resumed.unwrap();
        assert!(error_of(&resumed).is_none(), "attach {attach}: {resumed}");
        assert_eq!(thread_id(&resumed), fork);
        turn(&mut moved, &fork, "which fruits?").await;
        for word in ["quince", "plum"] {
            assert!(last_request_holds(&model, word), "attach {attach}: {word}");
        }
        moved.shutdown(Duration::from_secs(15)).await.unwrap();
    }
}

/// Issue 39: `exec fork <id>` without a session keeps the fork by its id, with its source:
/// another machine's empty home resumes the fork alone and the model sees the source's turn.
#[test]
fn exec_fork_restored_alone_on_an_empty_home_keeps_its_sources_history() {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let (first, second) = (
        CodexHome::new(&model).unwrap(),
        CodexHome::new(&model).unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let store = store_url(dir.path());
    let run = |home: &CodexHome, args: &[&str], prompt: &str| {
        exec(&codex, home.path(), &store, None, args, prompt)
    };
    let source = started_thread(&run(&first, &[], "my word is quince"));
    // `exec fork <id> [PROMPT]`: the prompt is an argument (without one, codex runs no turn).
    let forked = run(&first, &["fork", &source, "the fork says plum"], "");
    let fork = started_thread(&forked);
    assert_ne!(fork, source);
    let moved = run(&second, &["resume", &fork], "which fruits?");
    assert_eq!(started_thread(&moved), fork, "{}", describe(&moved));
    for word in ["quince", "plum"] {
        assert!(last_request_holds(&model, word), "{word}");
    }
}
