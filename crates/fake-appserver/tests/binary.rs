//! The `fake-codex` binary: started like codex, keeps threads under `CODEX_HOME`, survives its
//! own restart, takes faults from `--faults FILE` and `FAKE_CODEX_FAULTS`.

use std::path::Path;
use std::time::Duration;

use rethread_fake_appserver::ModelRequest;
use rethread_testkit::real::{error_of, thread_id, AppServerProcess};
use serde_json::json;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_fake-codex"))
}

fn model_log(home: &Path) -> Vec<ModelRequest> {
    std::fs::read_to_string(home.join("fake-model-requests.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn survives_its_own_restart_with_memory() {
    let home = tempfile::tempdir().unwrap();
    let mut server = AppServerProcess::spawn(binary(), home.path())
        .await
        .unwrap();
    server.peer.initialize(false).await.unwrap();
    let started = server.peer.start_thread().await.unwrap();
    let id = thread_id(&started);
    assert_eq!(started["result"]["thread"]["historyMode"], "paginated");
    server
        .peer
        .run_turn(&id, "remember zebra", None)
        .await
        .unwrap();
    server.shutdown(Duration::from_secs(5)).await.unwrap();

    let mut server = AppServerProcess::spawn(binary(), home.path())
        .await
        .unwrap();
    server.peer.initialize(false).await.unwrap();
    let resumed = server
        .peer
        .request("thread/resume", Some(json!({"threadId": id})))
        .await
        .unwrap();
    assert_eq!(
        resumed["result"]["thread"]["turns"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let run = server
        .peer
        .run_turn(&id, "what was it?", None)
        .await
        .unwrap();
    assert_eq!(run.status().as_deref(), Some("completed"));
    server.shutdown(Duration::from_secs(5)).await.unwrap();
    let log = model_log(home.path());
    assert_eq!(log.len(), 2);
    assert!(log[1].saw("remember zebra"));
}

#[tokio::test]
async fn killed_holder_releases_the_writer_lock() {
    let home = tempfile::tempdir().unwrap();
    let mut first = AppServerProcess::spawn(binary(), home.path())
        .await
        .unwrap();
    first.peer.initialize(false).await.unwrap();
    let started = first.peer.start_thread().await.unwrap();
    let id = thread_id(&started);
    first.peer.run_turn(&id, "hold", None).await.unwrap();
    let mut second = AppServerProcess::spawn(binary(), home.path())
        .await
        .unwrap();
    second.peer.initialize(false).await.unwrap();
    let busy = second
        .peer
        .request("thread/resume", Some(json!({"threadId": id})))
        .await
        .unwrap();
    assert_eq!(
        error_of(&busy),
        Some((-32600, format!("thread {id} already has an active writer")))
    );
    first.kill().await.unwrap();
    let resumed = second
        .peer
        .request("thread/resume", Some(json!({"threadId": id})))
        .await
        .unwrap();
    assert!(resumed.get("result").is_some(), "{resumed}");
}

#[tokio::test]
async fn faults_from_a_file_and_from_the_environment() {
    let home = tempfile::tempdir().unwrap();
    let script = home.path().join("faults.json");
    std::fs::write(
        &script,
        r#"{"faults": [{"kind": "exit_at_request", "n": 2}]}"#,
    )
    .unwrap();
    let script_arg = script.to_string_lossy().into_owned();
    let mut server =
        AppServerProcess::spawn_with(binary(), home.path(), &["--faults", &script_arg], &[])
            .await
            .unwrap();
    server.peer.initialize(false).await.unwrap();
    let err = server
        .peer
        .request("thread/list", Some(json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);

    let inline = r#"{"faults": [{"kind": "overloaded", "attempts": 1}]}"#;
    let mut server = AppServerProcess::spawn_with(
        binary(),
        home.path(),
        &["--profile", "release-n"],
        &[("FAKE_CODEX_FAULTS", inline)],
    )
    .await
    .unwrap();
    let first = server
        .peer
        .request(
            "initialize",
            Some(json!({"clientInfo": {"name": "t", "version": "0"}})),
        )
        .await
        .unwrap();
    assert_eq!(error_of(&first).map(|e| e.0), Some(-32001));
    server.peer.initialize(false).await.unwrap();
    let started = server.peer.start_thread().await.unwrap();
    assert_eq!(started["result"]["thread"]["historyMode"], "legacy");
}

fn fake_codex(args: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(binary());
    command
        .args(args)
        .env_remove("FAKE_CODEX_PROFILE")
        .env_remove("FAKE_CODEX_FAULTS")
        .stdin(std::process::Stdio::null());
    command
}

/// `fake-codex ARGS` without `CODEX_HOME`, so that it makes a temporary home, under `temp`
/// (its `TMPDIR`); its stdin piped.
fn in_a_temporary_home(args: &[&str], temp: &Path) -> std::process::Command {
    let mut command = fake_codex(args);
    command
        .env_remove("CODEX_HOME")
        .env("TMPDIR", temp)
        .stdin(std::process::Stdio::piped());
    command
}

/// Says `initialize`, `initialized` and `thread/start` (in `/tmp`) on `input`, a fake's stdin.
fn start_a_thread(input: &mut impl std::io::Write) {
    for line in [
        json!({"id": 1, "method": "initialize", "params": {"clientInfo": {"name": "t", "version": "0"}}}),
        json!({"method": "initialized"}),
        json!({"id": 2, "method": "thread/start", "params": {"cwd": "/tmp"}}),
    ] {
        writeln!(input, "{line}").unwrap();
    }
}

/// Issue 22, "Offline": the fake is started the way codex is. The Python SDK always passes
/// `app-server --listen stdio://`; `--help` and `--version` answer on stdout and exit 0; any
/// other transport is refused clearly (the fake serves stdio only), as a usage error.
#[tokio::test]
async fn it_is_started_the_way_codex_is() {
    for args in [&["--help"][..], &["-h"], &["app-server", "--help"]] {
        let out = fake_codex(args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}: {out:?}");
        assert!(text.contains("Usage: fake-codex"), "{args:?}: {text}");
        assert!(text.contains("--listen stdio://"), "{args:?}: {text}");
    }
    let out = fake_codex(&["--version"]).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("codex-cli 0.171.0"));

    let home = tempfile::tempdir().unwrap();
    let mut server =
        AppServerProcess::spawn_with(binary(), home.path(), &["--listen", "stdio://"], &[])
            .await
            .unwrap();
    let init = server.peer.initialize(false).await.unwrap();
    assert!(init["result"]["userAgent"].is_string(), "{init}");
    server.shutdown(Duration::from_secs(5)).await.unwrap();

    for listen in ["ws://127.0.0.1:4500", "unix://", "off", "stdio"] {
        let out = fake_codex(&["app-server", "--listen", listen])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{listen}: {err}");
        assert!(
            err.contains(listen) && err.contains("stdio://"),
            "{listen}: {err}"
        );
    }
    let out = fake_codex(&["app-server", "--listen"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Issue 19, item 20: without `CODEX_HOME` the fake wrote its threads into the user's real
/// `~/.codex`. It now keeps them in a temporary home, says where on stderr, and removes it
/// when it exits. Issue 35, defect 1: an empty `CODEX_HOME` is unset, as codex reads it; the
/// fake took it for a path and wrote its threads into the working directory.
#[test]
fn without_codex_home_it_keeps_its_threads_in_a_temporary_home() {
    for empty in [false, true] {
        without_codex_home(empty);
    }
}

fn without_codex_home(empty: bool) {
    let user = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let mut command = fake_codex(&["app-server"]);
    match empty {
        true => command.env("CODEX_HOME", ""),
        false => command.env_remove("CODEX_HOME"),
    };
    let mut child = command
        .env("HOME", user.path())
        .current_dir(cwd.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    start_a_thread(&mut input);
    drop(input);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let answers = String::from_utf8_lossy(&out.stdout);
    assert!(answers.contains("\"thread\""), "{answers}");
    let err = String::from_utf8_lossy(&out.stderr);
    let said = err
        .lines()
        .find_map(|line| line.split_once("temporary home at ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("{err}"));
    let home = std::path::Path::new(said.split_whitespace().next().unwrap());
    assert!(home.starts_with(std::env::temp_dir()), "{err}");
    assert!(!home.exists(), "removed at exit: {err}");
    assert!(!user.path().join(".codex").exists(), "{err}");
    let left: Vec<_> = std::fs::read_dir(cwd.path()).unwrap().collect();
    assert!(
        left.is_empty(),
        "empty={empty}: wrote into the working directory: {left:?}"
    );
}

/// Issue 35, item 11: stopped by SIGTERM or SIGINT (as a host stops it), the fake left its
/// temporary home behind. It removes it, and exits 143 or 130, in both of its modes.
#[test]
fn a_signal_removes_the_temporary_home() {
    use std::io::BufRead;
    for (args, signal, code) in [
        (&["app-server"][..], "TERM", 143),
        (&["exec", "--experimental-json"], "INT", 130),
    ] {
        let temp = tempfile::tempdir().unwrap();
        let mut child = in_a_temporary_home(args, temp.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Said once the home is made and the signals are handled; then it waits for input.
        let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while !line.contains("temporary home at ") {
            line.clear();
            assert_ne!(
                err.read_line(&mut line).unwrap(),
                0,
                "{args:?}: no home said"
            );
        }
        assert_eq!(std::fs::read_dir(temp.path()).unwrap().count(), 1, "{line}");
        let kill = std::process::Command::new("kill")
            .args([format!("-{signal}"), child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        // Bounded: a fake that ignored the signal would wait on its stdin for ever.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("{args:?}: fake-codex did not end on SIG{signal}");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(status.code(), Some(code), "{args:?}: {status:?}");
        let left: Vec<_> = std::fs::read_dir(temp.path()).unwrap().collect();
        assert!(left.is_empty(), "{args:?}: left behind: {left:?}");
    }
}

/// Issue 22, "Offline": codex takes its config overrides before the command (the Python SDK
/// passes `--config k=v` pairs there, and `rethread app-server` passes them on in the same
/// place); the fake refused them (`unexpected argument --config`), so no SDK could drive it
/// with a config. It takes them now, without effect.
#[test]
fn codex_config_overrides_before_the_command_are_taken() {
    use std::io::Write;
    let home = tempfile::tempdir().unwrap();
    let mut child = fake_codex(&[
        "--config",
        "model=\"x\"",
        "-c",
        "a.b=1",
        "--enable",
        "f",
        "--disable",
        "g",
        "app-server",
        "--listen",
        "stdio://",
    ])
    .env("CODEX_HOME", home.path())
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let init = json!({"id": 1, "method": "initialize",
                      "params": {"clientInfo": {"name": "t", "version": "1"}}});
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{init}\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("userAgent"),
        "{out:?}"
    );
    let version = fake_codex(&["-c", "x=1", "--version"]).output().unwrap();
    assert!(version.status.success(), "{version:?}");
}

/// Issue 41, item 13: a host that ends the fake as rethread's library does (the client's
/// shutdown or drop kills codex with SIGKILL), after a normal run of `rethread chat` or the
/// quickstart, left its temporary home (`/tmp/fake-codex-home-*`) behind each time, where the
/// README says it is removed. Whatever ends the fake, the home goes: a helper of the fake's
/// own removes it once the fake is gone.
#[test]
fn a_host_that_kills_the_fake_leaves_no_temporary_home_behind() {
    use std::io::BufRead;
    let temp = tempfile::tempdir().unwrap();
    let mut child = in_a_temporary_home(&["app-server"], temp.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    start_a_thread(&mut input);
    // The thread is started (its rollout is in the home) before the host ends the fake.
    let mut answers = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("\"id\":2") {
        line.clear();
        assert_ne!(
            answers.read_line(&mut line).unwrap(),
            0,
            "no thread/start answer"
        );
    }
    assert_eq!(std::fs::read_dir(temp.path()).unwrap().count(), 1);
    child.kill().unwrap();
    child.wait().unwrap();
    // Removed by the helper once the fake is gone: polled, bounded.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let left: Vec<_> = std::fs::read_dir(temp.path()).unwrap().collect();
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "left behind: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
