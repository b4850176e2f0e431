//! codex dies with the rethread process that started it (issue 34, defect 4): a `rethread
//! exec`, `rethread app-server` or `rethread chat` killed alone mid-turn (SIGKILL to its pid,
//! not its group, as a supervisor or the OOM killer sends it) leaves no codex running, and the
//! next run of the session goes on at once on the same thread, with no turn lost or repeated.
//! Against the real current codex, run both as its native binary and through the npm
//! package's launcher (`bin/codex.js`, which on a Node without `process.execve` runs the
//! native binary as its child), whose model (the Responses stand-in) holds the turn open.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rethread_testkit::real::{codex_or_skip, thread_id, AppServerProcess, CodexHome};
use rethread_testkit::responses::ResponsesStandIn;
use rethread_testkit::CURRENT;
use serde_json::{json, Value};
use support::{describe_lines as describe, last_request_holds, rethread, spawn_with_prompt};

/// How long a model request or a process's end is waited for before the test fails.
const BOUND: Duration = Duration::from_secs(60);

/// The current codex: its native binary, then the npm launcher beside it when it was
/// installed with it (`cargo xtask codex`) and `node` runs.
fn codexes() -> Vec<PathBuf> {
    let Some(native) = codex_or_skip(CURRENT) else {
        return Vec::new();
    };
    // <node_modules>/@openai/codex-linux-x64/vendor/<triple>/bin/codex
    let launcher = native
        .ancestors()
        .nth(6)
        .map(|modules| modules.join("@openai/codex/bin/codex.js"));
    let node = Command::new("node").arg("--version").output();
    let mut codexes = vec![native];
    match launcher {
        Some(launcher) if launcher.is_file() && node.is_ok_and(|o| o.status.success()) => {
            codexes.push(launcher)
        }
        _ => eprintln!("the npm launcher of codex {CURRENT} or node is missing: native only"),
    }
    codexes
}

/// One home, one store, one session, one codex.
struct World {
    dir: tempfile::TempDir,
    model: ResponsesStandIn,
    home: CodexHome,
    codex: PathBuf,
}

impl World {
    fn new(codex: &Path) -> World {
        let model = ResponsesStandIn::start().unwrap();
        let home = CodexHome::new(&model).unwrap();
        std::fs::create_dir_all(home.path().join("work")).unwrap();
        World {
            dir: tempfile::tempdir().unwrap(),
            model,
            home,
            codex: codex.to_path_buf(),
        }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("CODEX_HOME", self.home.path().display().to_string()),
            ("RETHREAD_STORE", self.store()),
            ("RETHREAD_CODEX_BIN", self.codex.display().to_string()),
            ("RETHREAD_SESSION", "s1".into()),
            // A lease still held is refused at once: the next run is never "held up".
            ("RETHREAD_SESSION_WAIT", "0".into()),
            ("RUST_LOG", "error".into()),
        ]
    }

    fn store(&self) -> String {
        format!("sqlite:{}", self.dir.path().join("store.sqlite").display())
    }

    fn rethread(&self, args: &[&str]) -> Command {
        let mut command = Command::new(rethread());
        command.args(args).envs(self.env());
        command
    }

    /// `rethread exec` of `prompt` on the session, started.
    fn exec(&self, prompt: &str) -> Child {
        let work = self.home.path().join("work");
        let mut command = self.rethread(&[
            "exec",
            "--experimental-json",
            "--skip-git-repo-check",
            "--cd",
        ]);
        spawn_with_prompt(command.arg(work), prompt.as_bytes())
    }

    /// `rethread chat --json` of `message` on the session, started.
    fn chat(&self, message: &str) -> Child {
        self.rethread(&["chat", "--session", "s1", "--json", message])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// The session as `sessions show --json` prints it.
    fn session(&self) -> Value {
        let out = Command::new(rethread())
            .args(["--store", &self.store(), "sessions", "show", "s1", "--json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", describe(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Waits until the model has received `n` requests.
    fn wait_for_model_requests(&self, n: usize) {
        let deadline = Instant::now() + BOUND;
        while self.model.model_requests().len() < n {
            assert!(Instant::now() < deadline, "model request {n} never came");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The model's next answer waits an hour: the turn it answers stays open.
    fn hold_next_turn(&self) {
        self.model.set_delay(Duration::from_secs(3600));
    }

    /// Turns after the held one are answered at once.
    fn answer_at_once(&self) {
        self.model.set_delay(Duration::ZERO);
    }

    /// Fails unless every process of this home (codex, its launcher, anything codex started)
    /// is gone within the bound; the ones left are killed first.
    fn assert_no_codex_left(&self, what: &str) {
        let deadline = Instant::now() + BOUND;
        let mut left = processes_of(self.home.path());
        while !left.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            left = processes_of(self.home.path());
        }
        for (pid, _) in &left {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        assert!(
            left.is_empty(),
            "{what} killed alone left codex running ({}): {left:?}",
            self.codex.display()
        );
    }
}

/// Live processes (zombies left out) whose environment has `CODEX_HOME=home`: pid and command.
fn processes_of(home: &Path) -> Vec<(u32, String)> {
    let needle = format!("CODEX_HOME={}", home.display()).into_bytes();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let dir = entry.path();
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        if matches!(state, None | Some('Z' | 'X')) {
            continue;
        }
        let environ = std::fs::read(dir.join("environ")).unwrap_or_default();
        if environ
            .split(|b| *b == 0)
            .any(|var| var == needle.as_slice())
        {
            let cmdline = std::fs::read(dir.join("cmdline")).unwrap_or_default();
            found.push((pid, String::from_utf8_lossy(&cmdline).replace('\0', " ")));
        }
    }
    found
}

/// SIGKILL to the pid alone (std's `kill`), then reaped.
fn kill_alone(child: &mut Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

fn finish(child: Child) -> Output {
    child.wait_with_output().unwrap()
}

fn exec_thread(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|event| event["type"] == "thread.started")
        .and_then(|event| event["thread_id"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no thread.started: {}", describe(output)))
}

#[test]
fn exec_killed_alone_mid_turn_leaves_no_codex_and_the_next_run_goes_on() {
    for codex in codexes() {
        let world = World::new(&codex);
        let first = finish(world.exec("remember zebra"));
        assert!(first.status.success(), "{}", describe(&first));
        let thread = exec_thread(&first);

        world.hold_next_turn();
        let mut held = world.exec("a turn that never ends");
        world.wait_for_model_requests(2);
        assert!(!processes_of(world.home.path()).is_empty());
        world.answer_at_once();
        kill_alone(&mut held);
        world.assert_no_codex_left("rethread exec");

        let next = finish(world.exec("what did I say?"));
        assert!(next.status.success(), "{}", describe(&next));
        assert_eq!(exec_thread(&next), thread, "the session's thread goes on");
        assert!(last_request_holds(&world.model, "zebra"));
        // Turns 1 and 3, each once: the killed turn was never committed.
        assert_eq!(world.session()["row_count"], 4, "{}", codex.display());
    }
}

#[test]
fn chat_killed_alone_mid_turn_leaves_no_codex_and_the_next_run_goes_on() {
    for codex in codexes() {
        let world = World::new(&codex);
        let first = finish(world.chat("remember zebra"));
        assert!(first.status.success(), "{}", describe(&first));
        let first: Value = serde_json::from_slice(&first.stdout).unwrap();

        world.hold_next_turn();
        let mut held = world.chat("a turn that never ends");
        world.wait_for_model_requests(2);
        world.answer_at_once();
        kill_alone(&mut held);
        world.assert_no_codex_left("rethread chat");

        let next = finish(world.chat("what did I say?"));
        assert!(next.status.success(), "{}", describe(&next));
        let next: Value = serde_json::from_slice(&next.stdout).unwrap();
        assert_eq!(next["outcome"], "resumed");
        assert_eq!(next["thread_id"], first["thread_id"]);
        assert!(last_request_holds(&world.model, "zebra"));
        assert_eq!(world.session()["row_count"], 4, "{}", codex.display());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn app_server_killed_alone_mid_turn_leaves_no_codex_and_the_next_run_goes_on() {
    for codex in codexes() {
        let world = World::new(&codex);
        let env = world.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let binary = rethread();
        let spawn = || AppServerProcess::spawn_with(&binary, world.home.path(), &[], &env);
        let mut first = spawn().await.unwrap();
        first.peer.initialize(false).await.unwrap();
        let thread = thread_id(&first.peer.start_thread().await.unwrap());
        first
            .peer
            .run_turn(&thread, "remember zebra", None)
            .await
            .unwrap();

        world.hold_next_turn();
        let input = json!([{"type": "text", "text": "a turn that never ends"}]);
        let params = json!({"threadId": thread, "input": input});
        first
            .peer
            .request("turn/start", Some(params))
            .await
            .unwrap();
        let model = &world.model;
        assert!(model.wait_for_model_requests(2, BOUND).await >= 2);
        world.answer_at_once();
        first.kill().await.unwrap();
        world.assert_no_codex_left("rethread app-server");

        let mut next = spawn().await.unwrap();
        next.peer.initialize(false).await.unwrap();
        let resumed = thread_id(&next.peer.start_thread().await.unwrap());
        assert_eq!(resumed, thread, "the session's thread goes on");
        let turn = next.peer.run_turn(&thread, "what did I say?", None).await;
        assert_eq!(turn.unwrap().agent_text(), ["echo: what did I say?"]);
        assert!(last_request_holds(&world.model, "zebra"));
        next.shutdown(BOUND).await.unwrap();
        assert_eq!(world.session()["row_count"], 4, "{}", codex.display());
    }
}
