//! `RETHREAD_LEASE_TTL`: the TTL of the session lease `chat` and `app-server` take (seconds,
//! fractional; default 30). A holder stalled past it (here: SIGSTOP) is taken over by the
//! next host, which with the default TTL would wait 30 s.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use support::{fake_codex, rethread, stderr, wait_for_event};

fn command(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(rethread());
    command
        .args(args)
        .env(
            "RETHREAD_STORE",
            format!("sqlite:{}", dir.join("store.sqlite").display()),
        )
        .env("RETHREAD_CODEX_BIN", fake_codex())
        .env("CODEX_HOME", dir.join("codex-home"))
        .env("RUST_LOG", "error")
        .env_remove("RETHREAD_LEASE_TTL")
        .env_remove("RETHREAD_SESSION")
        .env_remove("FAKE_CODEX_FAULTS");
    command
}

fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn a_lease_ttl_that_is_not_a_positive_number_of_seconds_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    for bad in ["abc", "0", "-1", "NaN", "inf", "1e9", "0.01"] {
        let chat = command(dir.path(), &["chat", "--session", "s", "hello"])
            .env("RETHREAD_LEASE_TTL", bad)
            .output()
            .unwrap();
        assert_eq!(
            chat.status.code(),
            Some(2),
            "chat, {bad}: {}",
            stderr(&chat)
        );
        assert!(
            stderr(&chat).contains("RETHREAD_LEASE_TTL"),
            "{}",
            stderr(&chat)
        );
        let proxy = command(dir.path(), &["app-server"])
            .env("RETHREAD_LEASE_TTL", bad)
            .env("RETHREAD_SESSION", "s")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(
            proxy.status.code(),
            Some(2),
            "app-server, {bad}: {}",
            stderr(&proxy)
        );
        assert!(
            stderr(&proxy).contains("RETHREAD_LEASE_TTL"),
            "{}",
            stderr(&proxy)
        );
    }
    assert!(
        !dir.path().join("store.sqlite").exists(),
        "a usage error opens no store"
    );
}

/// `chat --json` holding the session (in a slow turn) is stopped past its 1 s TTL: the next
/// `chat` takes the session over within its `--wait`, and the stopped one, continued, loses
/// its turn (exit 75) instead of committing over the new holder.
#[test]
fn a_chat_stopped_past_its_lease_ttl_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.log");
    let stalled = command(dir.path(), &["chat", "--json", "--session", "s", "first"])
        .env("RETHREAD_LEASE_TTL", "1")
        .env("FAKE_CODEX_EVENT_LOG", &events)
        .env(
            "FAKE_CODEX_FAULTS",
            r#"{"faults": [{"kind": "slow_turn", "millis": 4000}]}"#,
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The turn runs: the lease is held.
    wait_for_event(&events, "request turn/start");
    signal(&stalled, "-STOP");
    let next = command(
        dir.path(),
        &["chat", "--session", "s", "--wait", "10", "second"],
    )
    .output()
    .unwrap();
    signal(&stalled, "-CONT");
    assert!(next.status.success(), "taken over: {}", stderr(&next));
    let stalled = stalled.wait_with_output().unwrap();
    assert_eq!(stalled.status.code(), Some(75), "{}", stderr(&stalled));
    let report: serde_json::Value = serde_json::from_slice(&stalled.stdout).unwrap();
    assert_eq!(report["error"]["kind"], "lease_lost", "{report}");
}

/// `app-server` holding the session is stopped past its 1 s TTL: `chat` takes the session over
/// within its `--wait`.
#[test]
fn an_app_server_stopped_past_its_lease_ttl_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let mut proxy = command(dir.path(), &["app-server"])
        .env("RETHREAD_LEASE_TTL", "1")
        .env("RETHREAD_SESSION", "s")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Codex answers `initialize`: the lease, taken before codex starts, is held.
    let mut stdin = proxy.stdin.take().unwrap();
    writeln!(
        stdin,
        r#"{{"id": 1, "method": "initialize", "params": {{"clientInfo": {{"name": "t", "version": "0"}}}}}}"#
    )
    .unwrap();
    let mut answer = String::new();
    BufReader::new(proxy.stdout.take().unwrap())
        .read_line(&mut answer)
        .unwrap();
    assert!(answer.contains(r#""id":1"#), "{answer}");
    signal(&proxy, "-STOP");
    let next = command(
        dir.path(),
        &["chat", "--session", "s", "--wait", "10", "hello"],
    )
    .output()
    .unwrap();
    signal(&proxy, "-CONT");
    drop(stdin);
    let _ = proxy.kill();
    let _ = proxy.wait();
    assert!(next.status.success(), "taken over: {}", stderr(&next));
}
