//! Issue 34, defect 2: the session's own thread, named by id, on a new home, against the real
//! codex (whose answer to a thread it has no rollout of is `no rollout found`). One store,
//! several `CODEX_HOME`s: a thread the client names is restored from the store's mirror before
//! its resume or fork goes to codex, through `rethread exec` and `rethread app-server`; where
//! codex still refuses it (the floor, a paginated thread), the client gets codex's answer and
//! the binding is kept.

mod support;

use std::path::Path;
use std::process::Output;

use rethread_testkit::real::{codex_or_skip, error_of, thread_id, AppServerProcess, CodexHome};
use rethread_testkit::responses::ResponsesStandIn;
use rethread_testkit::{CURRENT, FLOOR};
use serde_json::{json, Value};
use support::{
    app_server_with, close, describe, exec_command, last_request_holds, run_with_prompt, sessions,
    started_thread, store_url,
};

const SESSION: &str = "named";
const WORD: &str = "remember the word okapi-31";

/// `rethread exec --experimental-json --skip-git-repo-check --cd HOME ARGS...` for the session
/// on `home`, `prompt` on stdin.
fn exec(codex: &Path, store: &str, home: &Path, args: &[&str], prompt: &str) -> Output {
    let mut command = exec_command(codex, home, store);
    command
        .args(args)
        .env("RETHREAD_SESSION", SESSION)
        .env("RETHREAD_MIRROR", "on");
    run_with_prompt(&mut command, prompt.as_bytes())
}

/// `rethread sessions show SESSION --json`.
fn session(store: &str) -> Value {
    sessions(store, &["show", SESSION])
}

#[test]
fn exec_resume_and_fork_of_the_sessions_own_thread_restore_it_on_an_empty_home() {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = store_url(dir.path());
    let homes: Vec<CodexHome> = (0..4).map(|_| CodexHome::new(&model).unwrap()).collect();
    let thread = started_thread(&exec(&codex, &store, homes[0].path(), &[], WORD));

    // `resume <id>` on a home that never saw the thread (the SDK's `resumeThread(id)`): the
    // rollout comes back from the store, and the model hears the earlier turn.
    let resumed = exec(
        &codex,
        &store,
        homes[1].path(),
        &["resume", &thread],
        "which word?",
    );
    assert_eq!(started_thread(&resumed), thread);
    assert!(last_request_holds(&model, WORD), "{}", describe(&resumed));

    // `resume --last` (pinned to the session's thread) on another empty home, likewise.
    let last = exec(
        &codex,
        &store,
        homes[2].path(),
        &["resume", "--last"],
        "and now?",
    );
    assert_eq!(started_thread(&last), thread);
    assert!(last_request_holds(&model, WORD), "{}", describe(&last));

    // A fork's source is restored too: the fork starts from the thread's history.
    let fork = exec(
        &codex,
        &store,
        homes[3].path(),
        &["fork", &thread.to_uppercase()],
        "a fork: which word?",
    );
    assert_ne!(started_thread(&fork), thread);
    assert!(last_request_holds(&model, WORD), "{}", describe(&fork));
    assert_eq!(session(&store)["thread_id"], thread.as_str());
}

/// `rethread app-server` for the session on `home` with `codex`.
async fn app_server(codex: &Path, store: &str, home: &Path) -> AppServerProcess {
    let env = [
        ("RETHREAD_CODEX_BIN", codex.to_str().unwrap()),
        ("RETHREAD_SESSION", SESSION),
        ("RETHREAD_STORE", store),
        ("RETHREAD_MIRROR", "on"),
    ];
    app_server_with(home, &["--listen", "stdio://"], &env).await
}

/// The session's first thread, with one turn saying [`WORD`], through `rethread app-server`
/// with `codex` on `home`.
async fn first_thread(codex: &Path, store: &str, home: &Path) -> String {
    let mut server = app_server(codex, store, home).await;
    let thread = thread_id(&server.peer.start_thread().await.unwrap());
    let turn = server.peer.run_turn(&thread, WORD, None).await.unwrap();
    assert_eq!(turn.status().as_deref(), Some("completed"));
    close(server).await;
    thread
}

/// rethread's own warnings and notices among what `server` said.
fn rethread_warnings(server: &AppServerProcess) -> Vec<Value> {
    let warnings = server.peer.log.iter().filter(|m| m["method"] == "warning");
    let ours = warnings.filter(|m| {
        let message = m["params"]["message"].as_str().unwrap_or_default();
        message.contains("rethread") || message.contains("starting a new one")
    });
    ours.cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_server_resume_and_fork_of_the_sessions_own_thread_restore_it_on_an_empty_home() {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = store_url(dir.path());
    let (one, two, three) = (
        CodexHome::new(&model).unwrap(),
        CodexHome::new(&model).unwrap(),
        CodexHome::new(&model).unwrap(),
    );
    let thread = first_thread(&codex, &store, one.path()).await;

    // The client resumes the thread it kept, by id, on a home that never saw it.
    let mut server = app_server(&codex, &store, two.path()).await;
    let params = json!({"threadId": thread.to_uppercase()});
    let answer = server.peer.request("thread/resume", Some(params)).await;
    let answer = answer.unwrap();
    assert_eq!(thread_id(&answer), thread, "{answer}");
    let turn = server.peer.run_turn(&thread, "which word?", None).await;
    assert_eq!(turn.unwrap().status().as_deref(), Some("completed"));
    assert!(last_request_holds(&model, WORD));
    assert_eq!(rethread_warnings(&server), Vec::<Value>::new());
    close(server).await;
    assert_eq!(session(&store)["row_count"], 4, "the turn is recorded");

    // A fork of it on a third empty home: the source is restored, the fork remembers.
    let mut server = app_server(&codex, &store, three.path()).await;
    let params = json!({"threadId": thread});
    let answer = server.peer.request("thread/fork", Some(params)).await;
    let fork = thread_id(&answer.unwrap());
    assert_ne!(fork, thread);
    let turn = server
        .peer
        .run_turn(&fork, "a fork: which word?", None)
        .await;
    assert_eq!(turn.unwrap().status().as_deref(), Some("completed"));
    assert!(last_request_holds(&model, WORD));
    close(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_thread_the_floor_refuses_after_its_restore_gets_codexs_answer_and_stays_bound() {
    let (Some(current), Some(floor)) = (codex_or_skip(CURRENT), codex_or_skip(FLOOR)) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = store_url(dir.path());
    let (one, two) = (
        CodexHome::new(&model).unwrap(),
        CodexHome::new(&model).unwrap(),
    );
    // The current release writes a paginated thread, which the floor cannot resume.
    let thread = first_thread(&current, &store, one.path()).await;

    let mut server = app_server(&floor, &store, two.path()).await;
    let params = json!({"threadId": thread});
    let answer = server.peer.request("thread/resume", Some(params)).await;
    let answer = answer.unwrap();
    // codex's own answer, about the restored thread (not `no rollout found`: it has it now).
    let (_, message) = error_of(&answer).unwrap_or_else(|| panic!("an error: {answer}"));
    assert!(message.contains("paginated"), "{answer}");
    assert!(answer["error"]["data"]["rethread"].is_null(), "{answer}");
    assert_eq!(rethread_warnings(&server), Vec::<Value>::new());
    close(server).await;
    let shown = session(&store);
    assert_eq!(shown["thread_id"], thread.as_str(), "the binding is kept");
    assert!(shown["last_fallback"].is_null(), "{shown}");
    assert_eq!(shown["row_count"], 2);
}
