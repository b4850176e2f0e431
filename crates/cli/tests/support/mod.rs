//! What the `rethread` binary's process tests share.

#![allow(dead_code, unreachable_pub)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use rethread_testkit::real::AppServerProcess;
use rethread_testkit::responses::ResponsesStandIn;
use serde_json::Value;

/// The `rethread` binary under test.
pub fn rethread() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_rethread"))
}

/// The `fake-codex` binary beside ours, brought up to date once per test process (a fake
/// left from an older build would answer as an older fake; cargo does nothing when it is
/// current, as after `cargo test --workspace`).
pub fn fake_codex() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let ours = rethread();
            let target_dir = ours.parent().and_then(Path::parent).expect("target dir");
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
            ours.with_file_name("fake-codex")
        })
        .clone()
}

/// The SQLite store in `dir`.
pub fn store_url(dir: &Path) -> String {
    format!("sqlite:{}", dir.join("rethread.sqlite").display())
}

/// A run's exit code, stdout and stderr, for a failure's message.
pub fn describe(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `output`'s stderr as text.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `output`'s stdout as text.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `output`'s stdout as one JSON object; fails describing the run otherwise.
pub fn json_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {}", describe(output)))
}

/// Runs `future` to its end on a runtime of its own (for a `#[test]` that is not async).
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

/// [`describe`], each stream on the lines after its name.
pub fn describe_lines(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Points `command` at a redb store and a `CODEX_HOME` of their own in `dir` (`store.redb`,
/// `codex-home`), with the fake codex and none of its profile.
pub fn in_sandbox<'c>(command: &'c mut Command, dir: &Path) -> &'c mut Command {
    command
        .env(
            "RETHREAD_STORE",
            format!("redb:{}", dir.join("store.redb").display()),
        )
        .env("RETHREAD_CODEX_BIN", fake_codex())
        .env("CODEX_HOME", dir.join("codex-home"))
        .env_remove("FAKE_CODEX_PROFILE")
}

/// `rethread exec --experimental-json --skip-git-repo-check --cd HOME` with `codex` on `home`
/// and `store`, a lease still held refused at once; the caller adds the rest.
pub fn exec_command(codex: &Path, home: &Path, store: &str) -> Command {
    let mut command = Command::new(rethread());
    command
        .args([
            "exec",
            "--experimental-json",
            "--skip-git-repo-check",
            "--cd",
        ])
        .arg(home)
        .env("CODEX_HOME", home)
        .env("RETHREAD_STORE", store)
        .env("RETHREAD_CODEX_BIN", codex)
        .env("RETHREAD_SESSION_WAIT", "0")
        .env_remove("RUST_LOG");
    command
}

/// `command` started with its stdin, stdout and stderr piped.
pub fn spawn_piped(command: &mut Command) -> Child {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `command` started with its stdio piped, `prompt` written to its stdin and that closed (a run
/// refused before it reads its prompt closes its stdin first, so a write it refuses is no error).
pub fn spawn_with_prompt(command: &mut Command, prompt: &[u8]) -> Child {
    let mut child = spawn_piped(command);
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all(prompt);
    drop(stdin);
    child
}

/// `command` run to its end with `prompt` on its stdin.
pub fn run_with_prompt(command: &mut Command, prompt: &[u8]) -> Output {
    spawn_with_prompt(command, prompt)
        .wait_with_output()
        .unwrap()
}

/// The thread a successful `rethread exec --experimental-json` run's `thread.started` names.
pub fn started_thread(output: &Output) -> String {
    assert_eq!(output.status.code(), Some(0), "{}", describe(output));
    let first = output.stdout.split(|b| *b == b'\n').next().unwrap();
    let event: Value = serde_json::from_slice(first).unwrap();
    event["thread_id"].as_str().unwrap().to_string()
}

/// `rethread --store STORE sessions ARGS --json`.
pub fn sessions(store: &str, args: &[&str]) -> Value {
    let output = Command::new(rethread())
        .args(["--store", store, "sessions"])
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The shortest span `sessions prune --idle` takes: zero and less than a second are refused.
pub const SHORTEST_IDLE: &str = "1s";

/// Waits [`SHORTEST_IDLE`] and a millisecond from now: every record written before the call
/// (whose times the file stores take from this machine's clock) is then idle for a prune
/// `--idle 1s`. A wait for a known moment, not for an event that may be late.
pub fn wait_out_the_shortest_idle() {
    std::thread::sleep(Duration::from_millis(1_001));
}

/// Waits until the fake codex's event log (`FAKE_CODEX_EVENT_LOG`) at `log` holds `event`
/// (e.g. `request turn/start`: the turn is under way); fails after 60 s.
pub fn wait_for_event(log: &Path, event: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(log)
        .unwrap_or_default()
        .contains(event)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the fake codex never logged {event:?} in {}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How many of the Responses stand-in's model requests hold `text`.
pub fn requests_holding(model: &ResponsesStandIn, text: &str) -> usize {
    (model.model_requests().iter())
        .filter(|r| r.conversation().iter().any(|m| m.text.contains(text)))
        .count()
}

/// Whether the Responses stand-in's newest model request holds `text`.
pub fn last_request_holds(model: &ResponsesStandIn, text: &str) -> bool {
    let requests = model.model_requests();
    let last = requests.last().expect("a model request");
    last.conversation().iter().any(|m| m.text.contains(text))
}

/// How `server` exited (`None`: by a signal); fails after 20 s.
pub async fn exit_code(server: &mut AppServerProcess) -> Option<i32> {
    tokio::time::timeout(Duration::from_secs(20), server.wait())
        .await
        .expect("rethread exits")
        .unwrap()
        .code()
}

/// What `rethread app-server` on `home` wrote to its stderr (`AppServerProcess` keeps it in
/// the home's `app-server-stderr.log`).
pub fn app_server_stderr(home: &Path) -> String {
    std::fs::read_to_string(home.join("app-server-stderr.log")).unwrap_or_default()
}

/// `rethread app-server --listen stdio://` with the real `codex` on `home`, its store
/// [`store_url`]`(home)`, for `session` (`None`: no session, threads kept by their ids),
/// initialized with codex's experimental API (`path`, `thread/search`) or without.
pub async fn app_server_of(
    codex: &Path,
    home: &Path,
    session: Option<&str>,
    experimental: bool,
) -> AppServerProcess {
    let store = store_url(home);
    let mut env = vec![
        ("RETHREAD_CODEX_BIN", codex.to_str().unwrap()),
        ("RETHREAD_STORE", store.as_str()),
    ];
    env.extend(session.map(|session| ("RETHREAD_SESSION", session)));
    let args = ["--listen", "stdio://"];
    let mut process = AppServerProcess::spawn_with(&rethread(), home, &args, &env)
        .await
        .unwrap();
    process.peer.initialize(experimental).await.unwrap();
    process
}

/// `rethread app-server ARGS` on `home` with `env`, initialized.
pub async fn app_server_with(home: &Path, args: &[&str], env: &[(&str, &str)]) -> AppServerProcess {
    let mut process = AppServerProcess::spawn_with(&rethread(), home, args, env)
        .await
        .unwrap();
    process.peer.initialize(false).await.unwrap();
    process
}

/// `server`'s stdin closed, then its exit with 0 waited for.
pub async fn close(mut server: AppServerProcess) {
    server.peer.close_writer().await;
    let status = tokio::time::timeout(Duration::from_secs(20), server.wait()).await;
    assert_eq!(status.expect("rethread exits").unwrap().code(), Some(0));
}
