//! `rethread app-server` as a process, driven over its stdin/stdout like any client drives
//! codex: against `fake-codex`, against small shell stand-ins (to see the arguments codex gets
//! and how it dies), and against the real codex.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rethread_testkit::real::{codex_or_skip, thread_id, AppServerProcess, CodexHome};
use rethread_testkit::responses::ResponsesStandIn;
use rethread_testkit::CURRENT;
use serde_json::{json, Value};
use support::{app_server_stderr, exit_code, fake_codex, rethread};

const WARNING: &str = "No rethread session is named (set RETHREAD_SESSION): nothing is kept, so \
                       this conversation will not be resumed after a restart.";

/// A shell script standing in for codex.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// `rethread [global...] app-server [args...]` with `codex` as the codex binary.
async fn spawn(
    codex: &Path,
    home: &Path,
    global: &[&str],
    args: &[&str],
    env: &[(&str, &str)],
) -> AppServerProcess {
    // `AppServerProcess` runs `<binary> app-server <extra>`; rethread's own options go in
    // front through a wrapper so that they precede `app-server` as a client would put them.
    let binary = if global.is_empty() {
        rethread()
    } else {
        let quoted: Vec<String> = global.iter().map(|a| format!("'{a}'")).collect();
        script(
            home,
            "rethread-with-globals",
            &format!(
                "shift\nexec '{}' {} app-server \"$@\"",
                rethread().display(),
                quoted.join(" ")
            ),
        )
    };
    let codex = codex.to_str().unwrap();
    let mut all_env = vec![("RETHREAD_CODEX_BIN", codex)];
    all_env.extend_from_slice(env);
    AppServerProcess::spawn_with(&binary, home, args, &all_env)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_turn_through_the_binary_and_a_clean_exit_when_the_client_leaves() {
    let home = tempfile::tempdir().unwrap();
    let mut server = spawn(&fake_codex(), home.path(), &[], &[], &[]).await;
    let init = server.peer.initialize(false).await.unwrap();
    assert!(init["result"]["userAgent"]
        .as_str()
        .unwrap()
        .contains("rethread fake"));
    let started = server.peer.start_thread().await.unwrap();
    let id = thread_id(&started);
    let turn = server.peer.run_turn(&id, "hello", None).await.unwrap();
    assert_eq!(turn.agent_text(), ["echo: hello"]);
    let warnings: Vec<&Value> = server
        .peer
        .log
        .iter()
        .filter(|m| m["method"] == "warning")
        .collect();
    assert_eq!(
        warnings,
        [&json!({"method": "warning", "params": {"message": WARNING, "threadId": null}})]
    );
    server.peer.close_writer().await;
    assert_eq!(exit_code(&mut server).await, Some(0));
    assert!(app_server_stderr(home.path()).contains(WARNING));
}

#[tokio::test]
async fn arguments_reach_codex_verbatim() {
    let home = tempfile::tempdir().unwrap();
    let seen = home.path().join("args");
    let codex = script(
        home.path(),
        "codex",
        &format!(
            "printf '%s\\n' \"$@\" > '{}'\nexec '{}' app-server",
            seen.display(),
            fake_codex().display()
        ),
    );
    let mut server = spawn(
        &codex,
        home.path(),
        &["-c", "model=\"o3\"", "--enable", "feat"],
        &["--listen", "stdio://", "-c", "k=v w", "--weird", "--help"],
        &[],
    )
    .await;
    server.peer.initialize(false).await.unwrap();
    server.peer.close_writer().await;
    assert_eq!(exit_code(&mut server).await, Some(0));
    let args = std::fs::read_to_string(&seen).unwrap();
    assert_eq!(
        args.lines().collect::<Vec<_>>(),
        [
            "--config",
            "model=\"o3\"",
            "--enable",
            "feat",
            "app-server",
            "--listen",
            "stdio://",
            "-c",
            "k=v w",
            "--weird",
            "--help"
        ]
    );
}

#[tokio::test]
async fn codex_dying_mid_turn_passes_on_what_it_said_and_its_status() {
    let home = tempfile::tempdir().unwrap();
    let faults = r#"{"faults": [{"kind": "exit_mid_turn", "turn": 1}]}"#;
    let mut server = spawn(
        &fake_codex(),
        home.path(),
        &[],
        &[],
        &[("FAKE_CODEX_FAULTS", faults)],
    )
    .await;
    server.peer.initialize(false).await.unwrap();
    let started = server.peer.start_thread().await.unwrap();
    let id = started["result"]["thread"]["id"].as_str().unwrap();
    let turn = server.peer.run_turn(id, "hello", None).await;
    assert!(turn.is_err(), "the stream ends mid-turn");
    assert!(
        server
            .peer
            .log
            .iter()
            .any(|m| m["method"] == "turn/started"),
        "what codex said before dying reached the client"
    );
    assert_eq!(exit_code(&mut server).await, Some(1));
}

#[tokio::test]
async fn a_codex_killed_by_a_signal_is_reported_as_128_plus_the_signal() {
    let home = tempfile::tempdir().unwrap();
    let codex = script(
        home.path(),
        "codex",
        "printf '{\"method\":\"hello\"}\\n'\nkill -9 $$",
    );
    let mut server = spawn(&codex, home.path(), &[], &[], &[]).await;
    let hello = server.peer.next_message().await.unwrap().unwrap();
    assert_eq!(hello, json!({"method": "hello"}));
    assert_eq!(exit_code(&mut server).await, Some(128 + 9));
}

#[tokio::test]
async fn sigterm_stops_codex_and_exits_143() {
    let home = tempfile::tempdir().unwrap();
    let mut server = spawn(&fake_codex(), home.path(), &[], &[], &[]).await;
    server.peer.initialize(false).await.unwrap();
    let pid = server.id().unwrap();
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    let codex_pid: u32 = children.split_whitespace().next().unwrap().parse().unwrap();
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(exit_code(&mut server).await, Some(143));
    // Codex is gone too (it exits when its input closes, or is killed after the grace).
    let gone = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        std::fs::read_to_string(format!("/proc/{codex_pid}/stat"))
            .map_or(true, |stat| stat.contains(") Z "))
    });
    assert!(gone, "codex {codex_pid} outlived the proxy");
}

/// The environment of a proxy that keeps `session` in the SQLite store under `home`.
fn session_env(home: &Path, session: &'static str) -> Vec<(&'static str, String)> {
    vec![
        ("RETHREAD_SESSION", session.to_string()),
        (
            "RETHREAD_STORE",
            format!("sqlite:{}", home.join("rethread.sqlite").display()),
        ),
    ]
}

fn borrowed<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

async fn start_thread(server: &mut AppServerProcess) -> Value {
    server.peer.initialize(false).await.unwrap();
    server.peer.start_thread().await.unwrap()
}

fn thread_of(answer: &Value) -> String {
    answer["result"]["thread"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a thread: {answer}"))
        .to_string()
}

/// What the fake's model saw, one conversation per model request.
fn fake_model_requests(home: &Path) -> Vec<Value> {
    std::fs::read_to_string(home.join("fake-model-requests.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[tokio::test]
async fn a_session_survives_a_restart_of_the_binary() {
    let home = tempfile::tempdir().unwrap();
    let env = session_env(home.path(), "chat-1");
    type Variant<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>);
    let variants: [Variant; 2] = [
        (vec![], borrowed(&env)),
        // `--session` before `app-server` names the session as the variable does.
        (vec!["--session", "chat-1"], borrowed(&env[1..])),
    ];
    for (global, env) in variants {
        let _ = std::fs::remove_file(home.path().join("rethread.sqlite"));
        let mut first = spawn(&fake_codex(), home.path(), &global, &[], &env).await;
        let thread = thread_of(&start_thread(&mut first).await);
        first
            .peer
            .run_turn(&thread, "remember zebra", None)
            .await
            .unwrap();
        first.peer.close_writer().await;
        assert_eq!(exit_code(&mut first).await, Some(0));
        assert!(first.peer.log.iter().all(|m| m["method"] != "warning"));

        let mut second = spawn(&fake_codex(), home.path(), &global, &[], &env).await;
        assert_eq!(thread_of(&start_thread(&mut second).await), thread);
        second
            .peer
            .run_turn(&thread, "what did I say?", None)
            .await
            .unwrap();
        second.peer.close_writer().await;
        assert_eq!(exit_code(&mut second).await, Some(0));
        let seen = fake_model_requests(home.path());
        let last = seen.last().unwrap().to_string();
        assert!(last.contains("remember zebra"), "{last}");
        assert!(second.peer.log.iter().all(|m| m["method"] != "warning"));
    }
}

#[tokio::test]
async fn a_killed_proxy_does_not_stall_the_next_one() {
    let home = tempfile::tempdir().unwrap();
    let env = session_env(home.path(), "chat-1");
    let mut env = borrowed(&env);
    let mut first = spawn(&fake_codex(), home.path(), &[], &[], &env).await;
    let thread = thread_of(&start_thread(&mut first).await);
    first.peer.run_turn(&thread, "hello", None).await.unwrap();
    // SIGKILL: no shutdown hook runs, the lease stays in the store naming a dead process.
    first.kill().await.unwrap();
    // No wait at all: the dead holder is taken over at once, not after the lease's TTL.
    env.push(("RETHREAD_SESSION_WAIT", "0"));
    let started = std::time::Instant::now();
    let mut second = spawn(&fake_codex(), home.path(), &[], &[], &env).await;
    assert_eq!(thread_of(&start_thread(&mut second).await), thread);
    assert!(started.elapsed() < Duration::from_secs(10));
    second.peer.close_writer().await;
    assert_eq!(exit_code(&mut second).await, Some(0));
}

#[tokio::test]
async fn a_second_proxy_on_a_held_session_is_refused_before_codex_starts() {
    let home = tempfile::tempdir().unwrap();
    let env = session_env(home.path(), "chat-1");
    let mut first = spawn(&fake_codex(), home.path(), &[], &[], &borrowed(&env)).await;
    start_thread(&mut first).await;

    let started = home.path().join("codex-started");
    let codex = script(
        home.path(),
        "codex",
        &format!("touch '{}'", started.display()),
    );
    let mut env = borrowed(&env);
    env.push(("RETHREAD_SESSION_WAIT", "0.2"));
    let mut second = spawn(&codex, home.path(), &[], &[], &env).await;
    assert_eq!(exit_code(&mut second).await, Some(75));
    let stderr = app_server_stderr(home.path());
    assert!(
        stderr.contains("session chat-1 is busy: held by"),
        "{stderr}"
    );
    assert!(!started.exists(), "codex was not started");

    // Another session on the same store is not held.
    let other = session_env(home.path(), "chat-2");
    let mut third = spawn(&fake_codex(), home.path(), &[], &[], &borrowed(&other)).await;
    start_thread(&mut third).await;
    third.peer.close_writer().await;
    assert_eq!(exit_code(&mut third).await, Some(0));
    first.peer.close_writer().await;
    assert_eq!(exit_code(&mut first).await, Some(0));
}

#[tokio::test]
async fn a_bad_session_wait_is_a_usage_error_and_an_empty_session_names_none() {
    let home = tempfile::tempdir().unwrap();
    let env = session_env(home.path(), "chat-1");
    let mut env = borrowed(&env);
    env.push(("RETHREAD_SESSION_WAIT", "soon"));
    let mut server = spawn(&fake_codex(), home.path(), &[], &[], &env).await;
    assert_eq!(exit_code(&mut server).await, Some(2));
    assert!(app_server_stderr(home.path()).contains("RETHREAD_SESSION_WAIT"));
    // An empty RETHREAD_SESSION names no session: the pass-through, with its warning.
    let mut server = spawn(
        &fake_codex(),
        home.path(),
        &[],
        &[],
        &[("RETHREAD_SESSION", "")],
    )
    .await;
    server.peer.initialize(false).await.unwrap();
    server.peer.close_writer().await;
    while server.peer.next_message().await.unwrap().is_some() {}
    assert_eq!(exit_code(&mut server).await, Some(0));
    assert!(server
        .peer
        .log
        .iter()
        .any(|m| m["params"]["message"] == WARNING));
}

/// `--mirror-cap BYTES` after `app-server` or before it (where `--no-mirror` goes too), as
/// `RETHREAD_MIRROR_CAP` does: a turn past the cap commits without its mirror; 0 or the flag
/// given twice is a usage error.
#[tokio::test]
async fn the_mirror_cap_is_set_by_the_flag_before_or_after_app_server() {
    let home = tempfile::tempdir().unwrap();
    let cap = ["--mirror-cap", "100"];
    let runs: [(&'static str, &[&str], &[&str]); 3] = [
        ("uncapped", &[], &[]),
        ("after", &[], &cap),
        ("before", &cap, &[]),
    ];
    for (session, global, args) in runs {
        let env = session_env(home.path(), session);
        let mut server = spawn(&fake_codex(), home.path(), global, args, &borrowed(&env)).await;
        let thread = thread_of(&start_thread(&mut server).await);
        server.peer.run_turn(&thread, "hello", None).await.unwrap();
        server.peer.close_writer().await;
        assert_eq!(exit_code(&mut server).await, Some(0), "{session}");
        let show = Command::new(rethread())
            .args(["sessions", "show", session, "--json"])
            .env("RETHREAD_STORE", &env[1].1)
            .output()
            .unwrap();
        let show: Value = serde_json::from_slice(&show.stdout).unwrap();
        let mirrored = show["mirror_bytes"].as_u64().unwrap();
        match session {
            "uncapped" => assert!(mirrored > 100, "{show}"),
            _ => assert_eq!(mirrored, 0, "{session}: {show}"),
        }
    }
    let env = session_env(home.path(), "refused");
    for (global, args) in [(&[][..], &["--mirror-cap", "0"][..]), (&cap[..], &cap[..])] {
        let mut server = spawn(&fake_codex(), home.path(), global, args, &borrowed(&env)).await;
        assert_eq!(exit_code(&mut server).await, Some(2), "{global:?} {args:?}");
    }
    let elsewhere = Command::new(rethread())
        .args(["--mirror-cap", "100", "sessions", "list"])
        .env("RETHREAD_STORE", &env[1].1)
        .output()
        .unwrap();
    assert_eq!(elsewhere.status.code(), Some(2), "{elsewhere:?}");
}

#[tokio::test]
async fn the_real_codex_through_the_binary() {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let home = CodexHome::new(&model).unwrap();
    let mut server = spawn(&codex, home.path(), &[], &["--listen", "stdio://"], &[]).await;
    let init = server.peer.initialize(true).await.unwrap();
    assert!(init["result"]["userAgent"]
        .as_str()
        .unwrap()
        .contains(CURRENT));
    let started = server.peer.start_thread().await.unwrap();
    let id = thread_id(&started);
    let turn = server.peer.run_turn(&id, "zebra", None).await.unwrap();
    assert_eq!(turn.agent_text(), ["echo: zebra"]);
    assert!(model.model_requests()[0]
        .conversation()
        .iter()
        .any(|m| m.text == "zebra"));
    server.peer.close_writer().await;
    assert_eq!(exit_code(&mut server).await, Some(0));
}

#[tokio::test]
async fn the_real_codex_keeps_a_session_through_the_binary() {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let home = CodexHome::new(&model).unwrap();
    let env = session_env(home.path(), "chat-real");
    let args = ["--listen", "stdio://"];
    let mut first = spawn(&codex, home.path(), &[], &args, &borrowed(&env)).await;
    let thread = thread_of(&start_thread(&mut first).await);
    first.peer.run_turn(&thread, "zebra", None).await.unwrap();
    first.peer.close_writer().await;
    assert_eq!(exit_code(&mut first).await, Some(0));

    let mut second = spawn(&codex, home.path(), &[], &args, &borrowed(&env)).await;
    assert_eq!(thread_of(&start_thread(&mut second).await), thread);
    let turn = second
        .peer
        .run_turn(&thread, "what did I say?", None)
        .await
        .unwrap();
    assert_eq!(turn.agent_text(), ["echo: what did I say?"]);
    let requests = model.model_requests();
    assert!(requests
        .last()
        .unwrap()
        .conversation()
        .iter()
        .any(|m| m.text == "zebra"));
    assert!(second
        .peer
        .log
        .iter()
        .all(|m| m["params"]["message"] != rethread_runtime::RESUME_FALLBACK_NOTICE));
    second.peer.close_writer().await;
    assert_eq!(exit_code(&mut second).await, Some(0));
}
