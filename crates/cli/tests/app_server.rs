//! `rethread app-server` as a process, driven over its stdin/stdout like any client drives
//! codex: against `fake-codex`, against small shell stand-ins (to see the arguments codex gets
//! and how it dies), and against the real codex.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rethread_testkit::real::{codex_or_skip, AppServerProcess, CodexHome};
use rethread_testkit::responses::ResponsesStandIn;
use rethread_testkit::CURRENT;
use serde_json::{json, Value};

const WARNING: &str = "No rethread session is named (set RETHREAD_SESSION): nothing is kept, so \
                       this conversation will not be resumed after a restart.";

fn rethread() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_rethread"))
}

/// The `fake-codex` binary: built by `cargo test --workspace` beside ours; built on demand
/// when only this package is tested.
fn fake_codex() -> PathBuf {
    let fake = rethread().with_file_name("fake-codex");
    if !fake.is_file() {
        let target_dir = rethread()
            .parent()
            .and_then(Path::parent)
            .expect("target dir")
            .to_path_buf();
        let status = Command::new(env!("CARGO"))
            .args([
                "build",
                "-p",
                "rethread-fake-appserver",
                "--bin",
                "fake-codex",
            ])
            .env("CARGO_TARGET_DIR", target_dir)
            .status()
            .expect("cargo build fake-codex");
        assert!(status.success());
    }
    fake
}

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

async fn exit_code(server: &mut AppServerProcess) -> Option<i32> {
    tokio::time::timeout(Duration::from_secs(20), server.wait())
        .await
        .expect("rethread exits")
        .unwrap()
        .code()
}

fn stderr_of(home: &Path) -> String {
    std::fs::read_to_string(home.join("app-server-stderr.log")).unwrap_or_default()
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
    let started = server
        .peer
        .request("thread/start", Some(json!({"cwd": "/tmp"})))
        .await
        .unwrap();
    let id = started["result"]["thread"]["id"]
        .as_str()
        .unwrap()
        .to_string();
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
    assert!(stderr_of(home.path()).contains(WARNING));
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
    let started = server
        .peer
        .request("thread/start", Some(json!({"cwd": "/tmp"})))
        .await
        .unwrap();
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

#[tokio::test]
async fn a_session_key_is_refused_until_sessions_are_wired() {
    let home = tempfile::tempdir().unwrap();
    let started = home.path().join("codex-started");
    let codex = script(
        home.path(),
        "codex",
        &format!("touch '{}'", started.display()),
    );
    for (global, env) in [
        (vec!["--session", "chat-1"], vec![]),
        (vec![], vec![("RETHREAD_SESSION", "chat-1")]),
    ] {
        let mut server = spawn(&codex, home.path(), &global, &[], &env).await;
        assert_eq!(exit_code(&mut server).await, Some(2));
        assert!(stderr_of(home.path()).contains("sessions are not wired yet"));
        assert!(!started.exists(), "codex was not started");
    }
    // An empty RETHREAD_SESSION names no session.
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
    assert_eq!(exit_code(&mut server).await, Some(0));
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
    let started = server
        .peer
        .request("thread/start", Some(json!({"cwd": "/tmp"})))
        .await
        .unwrap();
    let id = started["result"]["thread"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let turn = server.peer.run_turn(&id, "zebra", None).await.unwrap();
    assert_eq!(turn.agent_text(), ["echo: zebra"]);
    assert!(model.model_requests()[0]
        .conversation()
        .iter()
        .any(|m| m.text == "zebra"));
    server.peer.close_writer().await;
    assert_eq!(exit_code(&mut server).await, Some(0));
}
