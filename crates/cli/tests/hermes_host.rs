//! A host that runs `codex app-server` from `PATH` with its own environment and exports its
//! own session id (Hermes: `HERMES_SESSION_ID`): a plain link named `codex` to rethread and
//! `RETHREAD_SESSION_VAR` are the whole setup; and a session another process holds answers the
//! client's `initialize` with rethread's error before the process exits 75.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rethread_testkit::real::{thread_id, AppServerProcess};
use serde_json::Value;
use support::{app_server_stderr, describe, exit_code, fake_codex, rethread};

/// `dir/ours/codex` (a link to rethread) ahead of `dir/theirs/codex` (the fake) on `PATH`.
struct Linked {
    dir: tempfile::TempDir,
    path: std::ffi::OsString,
}

impl Linked {
    fn new() -> Linked {
        let dir = tempfile::tempdir().unwrap();
        let ours = dir.path().join("ours");
        let theirs = dir.path().join("theirs");
        for bin in [&ours, &theirs] {
            std::fs::create_dir(bin).unwrap();
        }
        std::os::unix::fs::symlink(rethread(), ours.join("codex")).unwrap();
        std::os::unix::fs::symlink(fake_codex(), theirs.join("codex")).unwrap();
        let path = std::env::join_paths([&ours, &theirs]).unwrap();
        Linked { dir, path }
    }

    fn codex(&self) -> PathBuf {
        self.dir.path().join("ours").join("codex")
    }

    fn home(&self) -> &Path {
        self.dir.path()
    }

    /// The host's environment: the store, `RETHREAD_SESSION_VAR`, and its session id.
    fn env(&self, session: &str) -> Vec<(&'static str, String)> {
        let store = format!(
            "sqlite:{}",
            self.dir.path().join("rethread.sqlite").display()
        );
        vec![
            ("PATH", self.path.to_string_lossy().into_owned()),
            ("RETHREAD_STORE", store),
            ("RETHREAD_SESSION_VAR", "HERMES_SESSION_ID".into()),
            ("HERMES_SESSION_ID", session.into()),
        ]
    }

    async fn spawn(&self, env: &[(&'static str, String)]) -> AppServerProcess {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        AppServerProcess::spawn_with(&self.codex(), self.home(), &[], &env)
            .await
            .unwrap()
    }
}

/// `initialize`, then `thread/start`: the thread.
async fn open(server: &mut AppServerProcess) -> String {
    server.peer.initialize(false).await.unwrap();
    thread_id(&server.peer.start_thread().await.unwrap())
}

#[tokio::test]
async fn a_plain_codex_link_keeps_the_session_the_host_exports() {
    let linked = Linked::new();
    let env = linked.env("20261207_hermes_a1");
    // `codex --version` is the real codex's (Hermes checks it).
    let version = Command::new(linked.codex())
        .arg("--version")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env_remove("RETHREAD_SESSION")
        .env_remove("RETHREAD_CODEX_BIN")
        .output()
        .unwrap();
    assert!(version.status.success(), "{}", describe(&version));
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    assert!(version.starts_with("codex-cli "), "{version}");
    assert!(version.contains("rethread fake"), "{version}");

    let mut first = linked.spawn(&env).await;
    let thread = open(&mut first).await;
    let turn = first.peer.run_turn(&thread, "remember zebra", None).await;
    assert_eq!(turn.unwrap().agent_text(), ["echo: remember zebra"]);
    first.peer.close_writer().await;
    assert_eq!(exit_code(&mut first).await, Some(0));
    // The host restarts: the same session, the same thread, and no word of a missing session.
    let mut second = linked.spawn(&env).await;
    assert_eq!(open(&mut second).await, thread);
    let warnings: Vec<&Value> = second
        .peer
        .log
        .iter()
        .filter(|m| m["method"] == "warning")
        .collect();
    assert!(warnings.is_empty(), "{warnings:?}");
    second.peer.close_writer().await;
    assert_eq!(exit_code(&mut second).await, Some(0));
    // Another session of the host is another thread.
    let mut other = linked.spawn(&linked.env("20261207_hermes_b2")).await;
    assert_ne!(open(&mut other).await, thread);
    other.peer.close_writer().await;
    assert_eq!(exit_code(&mut other).await, Some(0));
}

#[tokio::test]
async fn an_empty_or_invalid_session_in_the_named_variable_is_refused() {
    let linked = Linked::new();
    for (value, why) in [("", "is unset or empty"), ("thread:x", "is refused")] {
        let mut server = linked.spawn(&linked.env(value)).await;
        assert_eq!(exit_code(&mut server).await, Some(2), "{value:?}");
        let stderr = app_server_stderr(linked.home());
        assert!(
            stderr.contains(&format!(
                "HERMES_SESSION_ID (named by RETHREAD_SESSION_VAR) {why}"
            )),
            "{stderr}"
        );
    }
    // Unset, likewise.
    let mut env = linked.env("");
    env.retain(|(k, _)| *k != "HERMES_SESSION_ID");
    let mut server = linked.spawn(&env).await;
    assert_eq!(exit_code(&mut server).await, Some(2));
    // `RETHREAD_SESSION` still wins.
    let mut env = linked.env("");
    env.push(("RETHREAD_SESSION", "chat-1".into()));
    let mut server = linked.spawn(&env).await;
    open(&mut server).await;
    server.peer.close_writer().await;
    assert_eq!(exit_code(&mut server).await, Some(0));
}

#[tokio::test]
async fn initialize_on_a_busy_session_is_answered_with_rethreads_error_before_exit_75() {
    let linked = Linked::new();
    let env = linked.env("20261207_hermes_a1");
    let mut holder = linked.spawn(&env).await;
    open(&mut holder).await;
    let mut env = env.clone();
    env.push(("RETHREAD_SESSION_WAIT", "0.2".into()));
    let mut busy = linked.spawn(&env).await;
    // The request alone: the process is gone right after its answer.
    let params = serde_json::json!({"clientInfo": {"name": "hermes", "version": "0.19.0"}});
    let initialize = busy.peer.request("initialize", Some(params));
    let answer = tokio::time::timeout(Duration::from_secs(10), initialize)
        .await
        .expect("initialize is answered at once")
        .unwrap();
    let error = &answer["error"];
    assert_eq!(error["code"], -32001, "{answer}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("session 20261207_hermes_a1 is busy: held by"),
        "{message}"
    );
    assert_eq!(
        error["data"]["rethread"]["kind"], "session_busy",
        "{answer}"
    );
    assert_eq!(error["data"]["rethread"]["sessionId"], "20261207_hermes_a1");
    assert_eq!(error["data"]["rethread"]["retryable"], true);
    assert_eq!(error["data"]["codexErrorInfo"], "server_overloaded");
    assert_eq!(exit_code(&mut busy).await, Some(75));
    holder.peer.close_writer().await;
    assert_eq!(exit_code(&mut holder).await, Some(0));
}
