//! `rethread exec` as a process, the way the TypeScript SDK runs `codex exec` (prompt on
//! stdin, JSONL on stdout, one process per turn): against `fake-codex exec` (a codex with
//! threads, memory and codex's resume errors) and against shell stand-ins (exact bytes, a
//! failed turn, a busy thread, a turn that waits); and rethread installed as `codex`.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{describe_lines as describe, fake_codex, rethread, spawn_piped};

const NOTICE_ITEM: &str = r#"{"type":"item.completed","item":{"id":"rethread_0","type":"error","message":"Codex thread could not be resumed; starting a new one."}}"#;

/// One test's world: a codex home, a store, a working directory.
struct World {
    dir: tempfile::TempDir,
}

impl World {
    fn new() -> World {
        let world = World {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir_all(world.home()).unwrap();
        std::fs::create_dir_all(world.work()).unwrap();
        world
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("codex-home")
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    fn store(&self) -> String {
        format!(
            "sqlite:{}",
            self.dir.path().join("rethread.sqlite").display()
        )
    }

    /// `rethread exec --experimental-json --skip-git-repo-check --cd WORK ARGS...` with
    /// `codex` behind it and `stdin`, for session `session` (none: unset).
    fn exec(&self, codex: &Path, session: Option<&str>, args: &[&str], stdin: &[u8]) -> Output {
        let mut command = self.command(codex, session);
        command
            .args([
                "exec",
                "--experimental-json",
                "--skip-git-repo-check",
                "--cd",
            ])
            .arg(self.work())
            .args(args);
        run(command, stdin)
    }

    /// `rethread` for `session`, without the rollout mirror: a deleted rollout is a lost
    /// thread (`a_deleted_rollout_is_restored_from_the_mirror` has the mirror).
    fn command(&self, codex: &Path, session: Option<&str>) -> Command {
        let mut command = Command::new(rethread());
        command
            .env("RETHREAD_MIRROR", "off")
            .env("CODEX_HOME", self.home())
            .env("RETHREAD_STORE", self.store())
            .env("RETHREAD_CODEX_BIN", codex)
            .env("RETHREAD_SESSION_WAIT", "0")
            .env_remove("RETHREAD_SESSION")
            .env_remove("RUST_LOG");
        if let Some(session) = session {
            command.env("RETHREAD_SESSION", session);
        }
        command
    }

    /// `rethread sessions show ID --json`, or `None` when there is no such session.
    fn session(&self, id: &str) -> Option<Value> {
        let output = Command::new(rethread())
            .args(["--store", &self.store(), "sessions", "show", id, "--json"])
            .output()
            .unwrap();
        output
            .status
            .success()
            .then(|| serde_json::from_slice(&output.stdout).unwrap())
    }

    /// The conversation of fake-codex's last model request, as `role: text` lines.
    fn last_model_request(&self) -> Vec<String> {
        let log = std::fs::read_to_string(self.home().join("fake-model-requests.jsonl")).unwrap();
        let last: Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
        last["conversation"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                format!(
                    "{}: {}",
                    m["role"].as_str().unwrap(),
                    m["text"].as_str().unwrap()
                )
            })
            .collect()
    }

    /// A shell script standing in for codex: `body` runs with the arguments; each run's
    /// arguments are appended to `codex-args.log`.
    fn script(&self, name: &str, body: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        let log = self.dir.path().join("codex-args.log");
        std::fs::write(
            &path,
            format!("#!/bin/sh\necho \"$*\" >> '{}'\n{body}\n", log.display()),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// The arguments of each run of a script, in order.
    fn script_runs(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("codex-args.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

fn run(mut command: Command, stdin: &[u8]) -> Output {
    let mut child = spawn_piped(&mut command);
    let mut pipe = child.stdin.take().unwrap();
    let stdin = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(&stdin);
    });
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap();
    output
}

fn events(output: &Output) -> Vec<Value> {
    String::from_utf8(output.stdout.clone())
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}")))
        .collect()
}

fn thread_of(output: &Output) -> String {
    events(output)
        .iter()
        .find(|e| e["type"] == "thread.started")
        .and_then(|e| e["thread_id"].as_str())
        .unwrap_or_else(|| panic!("no thread.started: {}", describe(output)))
        .to_string()
}

fn notices(output: &Output) -> usize {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| *line == NOTICE_ITEM)
        .count()
}

#[test]
fn a_session_resumes_its_thread_across_processes_and_each_turn_is_committed() {
    let world = World::new();
    let first = world.exec(&fake_codex(), Some("s1"), &[], b"remember zebra\n");
    assert!(first.status.success(), "{}", describe(&first));
    let thread = thread_of(&first);
    let stored = world.session("s1").expect("the session is stored");
    assert_eq!(stored["thread_id"], thread.as_str());
    assert_eq!(stored["row_count"], 2, "the prompt and the reply");

    let second = world.exec(&fake_codex(), Some("s1"), &[], b"what did I say?");
    assert!(second.status.success(), "{}", describe(&second));
    assert_eq!(thread_of(&second), thread, "the same thread, resumed");
    assert_eq!(notices(&second), 0);
    let seen = world.last_model_request();
    assert!(
        seen.contains(&"user: remember zebra\n".to_string()),
        "{seen:?}"
    );
    assert_eq!(world.session("s1").unwrap()["row_count"], 4);
    // What the client reads is codex's own run of that resume.
    let kinds: Vec<String> = events(&second)
        .iter()
        .map(|e| e["type"].to_string())
        .collect();
    assert_eq!(
        kinds,
        [
            r#""thread.started""#,
            r#""turn.started""#,
            r#""item.completed""#,
            r#""turn.completed""#
        ]
    );
}

/// With the mirror on (the default), a run on a home that lost the thread's rollout gets it
/// back from the store and resumes the same thread with its memory: nothing is said.
#[test]
fn a_deleted_rollout_is_restored_from_the_mirror() {
    let world = World::new();
    let mirrored = |session| {
        let mut command = world.command(&fake_codex(), Some(session));
        command.env_remove("RETHREAD_MIRROR").args([
            "exec",
            "--experimental-json",
            "--skip-git-repo-check",
            "--cd",
        ]);
        command.arg(world.work());
        command
    };
    let first = run(mirrored("s1"), b"remember zebra");
    assert!(first.status.success(), "{}", describe(&first));
    std::fs::remove_dir_all(world.home().join("sessions")).unwrap();
    let again = run(mirrored("s1"), b"what animal?");
    assert!(again.status.success(), "{}", describe(&again));
    assert_eq!(thread_of(&again), thread_of(&first));
    assert_eq!(notices(&again), 0, "{}", describe(&again));
    assert!(
        world
            .last_model_request()
            .contains(&"user: remember zebra".to_string()),
        "{:?}",
        world.last_model_request()
    );
}

#[test]
fn a_lost_thread_falls_back_once_seeded_with_the_notice_as_an_error_item() {
    let world = World::new();
    let first = world.exec(&fake_codex(), Some("s1"), &[], b"remember zebra");
    let lost = thread_of(&first);
    std::fs::remove_dir_all(world.home().join("sessions")).unwrap();

    let fell_back = world.exec(&fake_codex(), Some("s1"), &[], b"still there?");
    assert!(fell_back.status.success(), "{}", describe(&fell_back));
    let replacement = thread_of(&fell_back);
    assert_ne!(replacement, lost);
    assert_eq!(notices(&fell_back), 1, "{}", describe(&fell_back));
    let lines: Vec<&str> = std::str::from_utf8(&fell_back.stdout)
        .unwrap()
        .lines()
        .collect();
    assert_eq!(
        lines[1], NOTICE_ITEM,
        "right after the new thread's thread.started"
    );
    // The failed resume is not the client's to see.
    let stderr = String::from_utf8_lossy(&fell_back.stderr);
    assert!(!stderr.contains("Error: thread/resume"), "{stderr}");
    // Seeded: the transcript reached the new thread's developer instructions, quoted.
    let seen = world.last_model_request();
    assert!(
        seen.iter().any(|m| m.starts_with("developer: ")
            && m.contains(r#"{"role":"user","text":"remember zebra"}"#)),
        "{seen:?}"
    );
    let stored = world.session("s1").unwrap();
    assert_eq!(stored["thread_id"], replacement.as_str());
    assert_eq!(stored["last_fallback"]["thread_id"], lost.as_str());
    assert_eq!(stored["last_fallback"]["reason"], "gone");
    assert_eq!(stored["last_fallback"]["pending"], false);

    // Said once: the next run resumes the replacement and says nothing.
    let after = world.exec(&fake_codex(), Some("s1"), &[], b"and now?");
    assert_eq!(thread_of(&after), replacement);
    assert_eq!(notices(&after), 0, "{}", describe(&after));
}

#[test]
fn without_a_session_or_for_codexs_own_runs_every_byte_and_the_exit_code_are_codexs() {
    let world = World::new();
    // Prints what it read and its arguments, then fails with 7.
    let codex = world.script("codex", "cat\nprintf '\\n\\377 args: %s\\n' \"$*\"\nexit 7");
    let stdin = b"hello \xff\n".as_slice();
    let direct = |extra: &[&str]| {
        let mut command = Command::new(&codex);
        command.args([
            "exec",
            "--experimental-json",
            "--skip-git-repo-check",
            "--cd",
        ]);
        command.arg(world.work()).args(extra);
        run(command, stdin)
    };
    let cases: [(Option<&str>, &[&str]); 4] = [
        (None, &[]),
        (Some("s1"), &["--ephemeral"]),
        (Some("s1"), &["review"]),
        (Some("s1"), &["--help"]),
    ];
    for (session, extra) in cases {
        let expected = direct(extra);
        assert_eq!(expected.status.code(), Some(7));
        let through = world.exec(&codex, session, extra, stdin);
        assert_eq!(through.status.code(), Some(7), "{session:?} {extra:?}");
        assert_eq!(through.stdout, expected.stdout, "{session:?} {extra:?}");
    }
    assert!(world.session("s1").is_none(), "nothing was kept");
}

#[test]
fn a_run_that_names_its_own_resume_keeps_its_bytes_and_records_only_the_sessions_thread() {
    let world = World::new();
    let first = world.exec(&fake_codex(), Some("s1"), &[], b"one");
    let thread = thread_of(&first);
    // The client resumes the session's thread itself (the SDK's second run of a thread).
    let own = world.exec(&fake_codex(), Some("s1"), &["resume", &thread], b"two");
    assert!(own.status.success(), "{}", describe(&own));
    assert_eq!(thread_of(&own), thread);
    assert_eq!(world.session("s1").unwrap()["row_count"], 4, "recorded");
    assert_eq!(notices(&own), 0);

    // Another thread, made without a session: resumed in this session's run, untouched and
    // not recorded.
    let other = world.exec(&fake_codex(), None, &[], b"elsewhere");
    let other_thread = thread_of(&other);
    let direct = {
        let mut command = Command::new(fake_codex());
        command
            .env("CODEX_HOME", world.home())
            .args([
                "exec",
                "--experimental-json",
                "--skip-git-repo-check",
                "--cd",
            ])
            .arg(world.work())
            .args(["resume", &other_thread]);
        run(command, b"three")
    };
    let through = world.exec(
        &fake_codex(),
        Some("s1"),
        &["resume", &other_thread],
        b"three",
    );
    assert_eq!(
        through.stdout, direct.stdout,
        "the same bytes as codex's own run"
    );
    assert_eq!(through.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&through.stderr);
    assert!(
        stderr.contains(&format!("does not record thread {other_thread}")),
        "{stderr}"
    );
    let stored = world.session("s1").unwrap();
    assert_eq!(stored["row_count"], 4, "not recorded");
    assert_eq!(
        stored["thread_id"],
        thread.as_str(),
        "the session stays on its thread"
    );
}

#[test]
fn a_failed_turn_commits_nothing_and_codexs_refusals_pass_through() {
    let world = World::new();
    let failed = world.script(
        "failing-codex",
        "cat > /dev/null\n\
         echo '{\"type\":\"thread.started\",\"thread_id\":\"t-failed\"}'\n\
         echo '{\"type\":\"turn.started\"}'\n\
         echo '{\"type\":\"turn.failed\",\"error\":{\"message\":\"model down\"}}'\n\
         exit 1",
    );
    let output = world.exec(&failed, Some("s1"), &[], b"hello");
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(events(&output)[2]["type"], "turn.failed");
    assert!(world.session("s1").is_none(), "nothing committed");

    // A bound session whose codex refuses the arguments: codex's words and exit code, the
    // binding kept.
    let first = world.exec(&fake_codex(), Some("s2"), &[], b"one");
    let thread = thread_of(&first);
    let refusing = world.script(
        "refusing-codex",
        "echo \"error: unexpected argument '--frobnicate' found\" >&2\nexit 2",
    );
    let refused = world.exec(&refusing, Some("s2"), &["--frobnicate"], b"two");
    assert_eq!(refused.status.code(), Some(2), "{}", describe(&refused));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("unexpected argument '--frobnicate'"));
    assert_eq!(world.session("s2").unwrap()["thread_id"], thread.as_str());
}

#[test]
fn a_busy_thread_is_retried_then_a_typed_error_with_the_binding_kept() {
    let world = World::new();
    let first = world.exec(&fake_codex(), Some("s1"), &[], b"one");
    let thread = thread_of(&first);
    let busy = world.script(
        "busy-codex",
        "cat > /dev/null\n\
         echo \"Error: thread/resume: thread/resume failed: thread $6 already has an active writer (code -32600)\" >&2\n\
         exit 1",
    );
    let output = world.exec(&busy, Some("s1"), &[], b"two");
    assert_eq!(output.status.code(), Some(75), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("thread {thread} is busy")),
        "{stderr}"
    );
    let runs = world.script_runs();
    assert_eq!(runs.len(), 4, "one resume and three retries: {runs:?}");
    assert!(
        runs.iter()
            .all(|r| r.ends_with(&format!("resume {thread}"))),
        "{runs:?}"
    );
    assert!(output.stdout.is_empty());
    let stored = world.session("s1").unwrap();
    assert_eq!(stored["thread_id"], thread.as_str(), "kept");
    assert!(stored["last_fallback"].is_null());
}

/// The client reads `turn.completed` only once the turn is durable: the script waits after
/// printing it, and the store already holds the turn when the line arrives.
#[test]
fn turn_completed_reaches_the_client_only_once_the_turn_is_committed() {
    let world = World::new();
    let slow = world.script(
        "slow-exit-codex",
        "cat > /dev/null\n\
         echo '{\"type\":\"thread.started\",\"thread_id\":\"t-slow\"}'\n\
         echo '{\"type\":\"turn.started\"}'\n\
         echo '{\"type\":\"item.completed\",\"item\":{\"id\":\"item_0\",\"type\":\"agent_message\",\"text\":\"done\"}}'\n\
         echo '{\"type\":\"turn.completed\",\"usage\":{}}'\n\
         sleep 5",
    );
    let mut command = world.command(&slow, Some("s1"));
    command.args(["exec", "--experimental-json"]);
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"hello").unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let started = Instant::now();
    loop {
        let line = lines.next().expect("a line").unwrap();
        if line.contains("turn.completed") {
            break;
        }
    }
    let stored = world
        .session("s1")
        .expect("committed before turn.completed was written");
    assert_eq!(stored["thread_id"], "t-slow");
    assert_eq!(stored["row_count"], 2);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "read before codex exited"
    );
    let status = child.wait().unwrap();
    assert!(status.success());
}

#[test]
fn sigterm_during_a_turn_stops_codex_commits_nothing_and_releases_the_lease() {
    let world = World::new();
    let hanging = world.script(
        "hanging-codex",
        "cat > /dev/null\n\
         echo '{\"type\":\"thread.started\",\"thread_id\":\"t-hang\"}'\n\
         echo '{\"type\":\"turn.started\"}'\n\
         exec sleep 30",
    );
    let mut command = world.command(&hanging, Some("s1"));
    command.args(["exec", "--experimental-json"]);
    let mut child = spawn_piped(&mut command);
    child.stdin.take().unwrap().write_all(b"hello").unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while !lines.next().unwrap().unwrap().contains("turn.started") {}
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(143));
    assert!(world.session("s1").is_none(), "nothing committed");
    // The lease was released: the next run takes the session at once (no wait).
    let next = world.exec(&fake_codex(), Some("s1"), &[], b"again");
    assert!(next.status.success(), "{}", describe(&next));
}

#[test]
fn prompts_that_cannot_be_kept_are_refused_before_codex_starts() {
    let world = World::new();
    let codex = world.script("codex", "echo started > /dev/null");
    let huge = vec![b'a'; 1024 * 1024 + 10];
    for stdin in [&b""[..], b"\n\n", b"\xff\xfe", &huge] {
        let output = world.exec(&codex, Some("s1"), &[], stdin);
        assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    }
    assert!(world.script_runs().is_empty(), "codex never started");
    let bad_session = {
        let mut command = world.command(&codex, None);
        command.env(
            "RETHREAD_SESSION",
            <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(b"\xff"),
        );
        command.args(["exec", "--experimental-json"]);
        run(command, b"hi")
    };
    assert_eq!(bad_session.status.code(), Some(2));
}

/// rethread installed as `codex` (a link on `PATH` ahead of the real one): `exec` and
/// `app-server` are rethread's, every other command the real codex's.
#[test]
fn installed_as_codex_it_stands_in_and_hands_every_other_command_on() {
    let world = World::new();
    let ours = world.dir.path().join("ours");
    let theirs = world.dir.path().join("theirs");
    for dir in [&ours, &theirs] {
        std::fs::create_dir(dir).unwrap();
    }
    std::os::unix::fs::symlink(rethread(), ours.join("codex")).unwrap();
    std::os::unix::fs::symlink(fake_codex(), theirs.join("codex")).unwrap();
    let path = std::env::join_paths([&ours, &theirs]).unwrap();
    let codex = |args: &[&str], stdin: &[u8], session: Option<&str>| {
        let mut command = Command::new(ours.join("codex"));
        command
            .args(args)
            .env("PATH", &path)
            .env("CODEX_HOME", world.home())
            .env("RETHREAD_STORE", world.store())
            .env_remove("RETHREAD_CODEX_BIN")
            .env_remove("RETHREAD_SESSION");
        if let Some(session) = session {
            command.env("RETHREAD_SESSION", session);
        }
        run(command, stdin)
    };
    let version = codex(&["--version"], b"", None);
    assert!(version.status.success(), "{}", describe(&version));
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("codex-cli "));
    assert!(String::from_utf8_lossy(&version.stdout).contains("rethread fake"));
    let unknown = codex(&["frobnicate"], b"", None);
    assert_eq!(unknown.status.code(), Some(2), "the real codex's refusal");
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("fake-codex: unexpected argument"));

    let exec = ["exec", "--experimental-json", "--skip-git-repo-check"];
    let first = codex(&exec, b"remember zebra", Some("s1"));
    assert!(first.status.success(), "{}", describe(&first));
    let second = codex(&exec, b"and?", Some("s1"));
    assert_eq!(thread_of(&second), thread_of(&first), "kept by rethread");
    assert_eq!(world.session("s1").unwrap()["row_count"], 4);

    // app-server: rethread's proxy (it says that no session is named), codex behind it.
    let init =
        r#"{"id":1,"method":"initialize","params":{"clientInfo":{"name":"t","version":"1"}}}"#;
    let served = codex(
        &["-c", "x=1", "app-server", "--listen", "stdio://"],
        format!("{init}\n").as_bytes(),
        None,
    );
    let text = String::from_utf8_lossy(&served.stdout);
    assert!(text.contains("userAgent"), "{}", describe(&served));
    assert!(text.contains("No rethread session is named"), "{text}");

    // Nothing but rethread on PATH: refused, never started again and again.
    let alone = {
        let mut command = Command::new(ours.join("codex"));
        command
            .arg("--version")
            .env("PATH", &ours)
            .env_remove("RETHREAD_CODEX_BIN");
        run(command, b"")
    };
    assert_eq!(alone.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&alone.stderr).contains("other than rethread itself"));
}

#[test]
fn a_session_another_live_process_holds_is_refused_before_codex_starts() {
    let world = World::new();
    let hanging = world.script(
        "hanging-codex",
        "cat > /dev/null\n\
         echo '{\"type\":\"thread.started\",\"thread_id\":\"t-hang\"}'\n\
         exec sleep 30",
    );
    let mut command = world.command(&hanging, Some("s1"));
    command.args(["exec", "--experimental-json"]);
    let mut holder = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    holder.stdin.take().unwrap().write_all(b"hello").unwrap();
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().contains("thread.started"));
    let refused = world.exec(&hanging, Some("s1"), &[], b"me too");
    assert_eq!(refused.status.code(), Some(75), "{}", describe(&refused));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("session s1 is busy: held by"), "{stderr}");
    // Times a person reads (issue 35): UTC and how long ago, no epoch in milliseconds.
    let ago = stderr.contains(" ago)") || stderr.contains(" UTC (now)");
    assert!(stderr.contains(" UTC (") && ago, "{stderr}");
    assert!(!has_epoch_ms(&stderr), "{stderr}");
    assert_eq!(
        world.script_runs().len(),
        1,
        "codex started once, by the holder"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
}

/// The TypeScript SDK's `run()` returns a run's items only when its turn completes: a run that
/// said the notice and then failed has not told the user. The notice stays owed until the turn
/// on the new thread commits, and the next run says it again.
#[test]
fn a_notice_said_by_a_run_whose_turn_never_completed_is_said_again() {
    let world = World::new();
    let first = world.exec(&fake_codex(), Some("s1"), &[], b"remember zebra");
    let lost = thread_of(&first);
    std::fs::remove_dir_all(world.home().join("sessions")).unwrap();
    let dying = {
        let mut command = world.command(&fake_codex(), Some("s1"));
        command
            .env(
                "FAKE_CODEX_FAULTS",
                r#"{"faults":[{"kind":"exit_mid_turn","turn":1}]}"#,
            )
            .args(["exec", "--experimental-json", "--skip-git-repo-check"]);
        run(command, b"still there?")
    };
    assert_ne!(dying.status.code(), Some(0), "{}", describe(&dying));
    assert_eq!(notices(&dying), 1, "{}", describe(&dying));
    let owed = world.session("s1").unwrap();
    assert_eq!(owed["last_fallback"]["thread_id"], lost.as_str());
    assert_eq!(owed["last_fallback"]["pending"], true, "{owed}");

    let next = world.exec(&fake_codex(), Some("s1"), &[], b"and now?");
    assert!(next.status.success(), "{}", describe(&next));
    assert_eq!(notices(&next), 1, "said again: {}", describe(&next));
    let told = world.session("s1").unwrap();
    assert_eq!(told["last_fallback"]["pending"], false);
    let after = world.exec(&fake_codex(), Some("s1"), &[], b"and then?");
    assert_eq!(notices(&after), 0);
}

/// A signal after a turn was committed and reported (codex still running, or dying of the
/// same Ctrl-C) ends the run with exit 0: the turn is durable, and a non-zero exit would make
/// the SDK throw and its user retry the turn (twice in the transcript). It used to end with
/// 143 and "the turn was not committed" (found by `cargo xtask restarts --hosts exec`).
#[test]
fn a_signal_after_the_turn_was_committed_ends_the_run_as_done() {
    let world = World::new();
    let lingering = world.script(
        "lingering-codex",
        "cat > /dev/null\n\
         echo '{\"type\":\"thread.started\",\"thread_id\":\"t-linger\"}'\n\
         echo '{\"type\":\"turn.started\"}'\n\
         echo '{\"type\":\"item.completed\",\"item\":{\"id\":\"item_0\",\"type\":\"agent_message\",\"text\":\"done\"}}'\n\
         echo '{\"type\":\"turn.completed\",\"usage\":{}}'\n\
         exec sleep 30",
    );
    let mut command = world.command(&lingering, Some("s1"));
    command.args(["exec", "--experimental-json"]);
    let mut child = spawn_piped(&mut command);
    child.stdin.take().unwrap().write_all(b"hello").unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while !lines.next().unwrap().unwrap().contains("turn.completed") {}
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("not committed"), "{stderr}");
    assert_eq!(world.session("s1").unwrap()["row_count"], 2);
}

/// A terminal's Ctrl-C reaches the whole process group: codex may die of it before its
/// `thread.started`, and before rethread sees the signal. That is the user's interrupt (130,
/// said so), not codex failing. It used to pass codex's silent exit on (130, nothing said;
/// found by `cargo xtask restarts --hosts exec`).
#[test]
fn a_ctrl_c_that_ends_codex_before_its_thread_started_is_an_interrupt() {
    use std::os::unix::process::CommandExt;
    let world = World::new();
    let first = world.exec(&fake_codex(), Some("s1"), &[], b"one");
    let thread = thread_of(&first);
    // Dies as codex does of a Ctrl-C (exit 130, nothing said), and the same Ctrl-C reaches
    // rethread a moment later.
    let interrupting = world.script(
        "interrupting-codex",
        "(sleep 0.2; kill -INT $PPID) </dev/null >/dev/null 2>&1 &\nexit 130",
    );
    let mut command = world.command(&interrupting, Some("s1"));
    command
        .args(["exec", "--experimental-json"])
        .process_group(0);
    let output = run(command, b"two");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted by SIGINT"), "{stderr}");
    let stored = world.session("s1").unwrap();
    assert_eq!(stored["thread_id"], thread.as_str(), "the binding is kept");
    assert_eq!(stored["row_count"], 2);
}

/// A client that does not read stderr (it closed it) still gets the run: what `rethread exec`
/// says for people on stderr is best effort, never a panic mid-turn.
#[test]
fn a_closed_stderr_does_not_stop_the_run() {
    let world = World::new();
    let first = world.exec(&fake_codex(), Some("s1"), &[], b"remember zebra");
    let lost = thread_of(&first);
    std::fs::remove_dir_all(world.home().join("sessions")).unwrap();
    let mut command = world.command(&fake_codex(), Some("s1"));
    command
        .args([
            "exec",
            "--experimental-json",
            "--skip-git-repo-check",
            "--cd",
        ])
        .arg(world.work());
    let mut child = spawn_piped(&mut command);
    // The read end closes before anything is said there.
    drop(child.stderr.take());
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"still there?")
        .unwrap();
    let fell_back = child.wait_with_output().unwrap();
    assert!(fell_back.status.success(), "{:?}", fell_back.status);
    assert_ne!(thread_of(&fell_back), lost);
    assert_eq!(notices(&fell_back), 1);
}

/// Waits (bounded) until a thread of process `pid` sleeps in a write to a full pipe (its
/// `wchan`, as Linux shows it: `pipe_write`, `anon_pipe_write` on newer kernels).
fn wait_until_writing_to_a_full_pipe(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let blocked = || {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
        tasks.filter_map(Result::ok).any(|task| {
            std::fs::read_to_string(task.path().join("wchan"))
                .is_ok_and(|wchan| wchan.contains("pipe_write"))
        })
    };
    while !blocked() {
        assert!(
            Instant::now() < deadline,
            "process {pid} never waited on a full pipe"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits (bounded) until process `pid` has taken signal `number` sent to it (no longer
/// pending: a thread of it is handling it).
fn wait_until_taken(pid: u32, number: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let pending = || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let mask = status
            .lines()
            .find_map(|line| line.strip_prefix("ShdPnd:"))
            .map(|hex| u64::from_str_radix(hex.trim(), 16).unwrap())
            .unwrap();
        mask & (1 << (number - 1)) != 0
    };
    while pending() {
        assert!(
            Instant::now() < deadline,
            "process {pid} never took signal {number}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A client that stops reading stdout and then sends SIGTERM ends the run: a write blocked on
/// the full pipe does not keep rethread (and codex behind it) from seeing the signal.
#[test]
fn sigterm_while_the_client_is_not_reading_ends_the_run() {
    let world = World::new();
    let chatty = world.script(
        "chatty-codex",
        "cat > /dev/null\n\
         echo '{\"type\":\"thread.started\",\"thread_id\":\"t-chatty\"}'\n\
         echo '{\"type\":\"turn.started\"}'\n\
         line='{\"type\":\"item.updated\",\"item\":{\"id\":\"i\",\"type\":\"agent_message\",\"text\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}}'\n\
         i=0; while [ $i -lt 4000 ]; do echo \"$line\"; i=$((i+1)); done\n\
         exec sleep 30",
    );
    let mut command = world.command(&chatty, Some("s1"));
    command.args(["exec", "--experimental-json"]);
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"hello").unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while !lines.next().unwrap().unwrap().contains("turn.started") {}
    // No more reading: the pipe fills and rethread's next write waits on it.
    wait_until_writing_to_a_full_pipe(child.id());
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(lines);
    let status = status.expect("rethread exec did not end on SIGTERM while its stdout was full");
    assert_eq!(status.code(), Some(143));
}

/// A signal that comes while a committed turn's `turn.completed` is being written to a client
/// that reads (slowly) still lets the whole line out: the run ends as done with the turn's
/// last line whole, never cut mid-line (the restarts check found one cut so).
#[test]
fn a_signal_during_the_write_of_a_committed_turn_lets_the_line_out_whole() {
    let world = World::new();
    let big = world.script(
        "big-codex",
        "cat > /dev/null\n\
         echo '{\"type\":\"thread.started\",\"thread_id\":\"t-big\"}'\n\
         echo '{\"type\":\"turn.started\"}'\n\
         echo '{\"type\":\"item.completed\",\"item\":{\"id\":\"i\",\"type\":\"agent_message\",\"text\":\"hi\"}}'\n\
         printf '{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":1,\"output_tokens\":1},\"pad\":\"%s\"}\\n' \"$(head -c 300000 /dev/zero | tr '\\0' x)\"",
    );
    let mut command = world.command(&big, Some("s1"));
    command.args(["exec", "--experimental-json"]);
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"hello").unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("turn.started") {
        line.clear();
        out.read_line(&mut line).unwrap();
    }
    // The turn commits and its 300 KB last line fills the pipe; then the signal, taken while
    // the write waits.
    wait_until_writing_to_a_full_pipe(child.id());
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    wait_until_taken(child.id(), 15);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let status = child.wait().unwrap();
    let last = rest.lines().last().unwrap_or_default();
    let event: Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("the last line is not whole ({e}): {} bytes", last.len()));
    assert_eq!(event["type"], "turn.completed");
    assert_eq!(status.code(), Some(0));
    assert_eq!(world.session("s1").unwrap()["row_count"], 2);
}

/// Issue 35: `rethread exec ... | head -n 3` closes rethread's stdout; once the turn is
/// committed, a line that cannot be written is no failure of the run (exit 0). It used to exit 1
/// with the turn committed. The script writes `turn.completed` only after the test closed its
/// end of the pipe.
#[test]
fn a_client_that_closes_stdout_after_the_commit_gets_exit_0() {
    let world = World::new();
    let go = world.dir.path().join("go");
    let waiting = world.script(
        "waiting-codex",
        &format!(
            "cat > /dev/null
             echo '{{\"type\":\"thread.started\",\"thread_id\":\"t-head\"}}'
             echo '{{\"type\":\"turn.started\"}}'
             echo '{{\"type\":\"item.completed\",\"item\":{{\"id\":\"item_0\",\"type\":\"agent_message\",\"text\":\"done\"}}}}'
             i=0; while [ ! -e '{}' ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
             echo '{{\"type\":\"turn.completed\",\"usage\":{{}}}}'",
            go.display()
        ),
    );
    let mut command = world.command(&waiting, Some("s1"));
    command.args(["exec", "--experimental-json"]);
    let mut child = spawn_piped(&mut command);
    child.stdin.take().unwrap().write_all(b"hello").unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for _ in 0..3 {
        lines.next().expect("a line").unwrap();
    }
    drop(lines);
    std::fs::write(&go, b"").unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(world.session("s1").unwrap()["row_count"], 2);
}

/// Issue 35, defect 4: `exec -m` (a valued option without its value) under a bound session
/// used to become `-m resume <id>`: codex started a new thread prompted with the id, exit 0,
/// nothing said. codex refuses such a command line (exit 2: checked against the real codex
/// when it is installed); rethread refuses it too, before codex starts, the session untouched.
#[test]
fn an_option_without_its_value_is_refused_never_rewritten() {
    let world = World::new();
    let first = world.exec(&fake_codex(), Some("s1"), &[], b"remember zebra");
    let thread = thread_of(&first);
    let dangling: [&[&str]; 4] = [
        &["-m"],
        &["--model", "--color", "never"],
        &["-c"],
        &["-m", "--", "hi"],
    ];
    for args in dangling {
        let out = world.exec(&fake_codex(), Some("s1"), args, b"hello");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", describe(&out));
        assert!(out.stdout.is_empty(), "{args:?}: {}", describe(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&format!("`{}`", args[0])), "{stderr}");
        let stored = world.session("s1").unwrap();
        assert_eq!(stored["thread_id"], thread.as_str(), "{args:?}");
        assert_eq!(stored["row_count"], 2, "{args:?}");
    }
    let Some(codex) = rethread_testkit::real::codex_or_skip(rethread_testkit::CURRENT) else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    for args in dangling {
        let out = Command::new(&codex)
            .args(["exec", "--experimental-json", "--skip-git-repo-check"])
            .args(args)
            .env("CODEX_HOME", home.path())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "codex {args:?}: {}",
            describe(&out)
        );
    }
}

/// Whether `text` holds a number of 13 digits or more (an epoch in milliseconds).
fn has_epoch_ms(text: &str) -> bool {
    text.split(|c: char| !c.is_ascii_digit())
        .any(|digits| digits.len() >= 13)
}

/// Issue 39: a resumed thread whose first turn fails as on a home of another account
/// (`invalid_encrypted_content`) is given up by that run (its failure passes through as
/// codex's; the notice is owed, since exec never marks it delivered); the next run starts a
/// seeded thread, says the notice once, and `sessions show` names the reason.
#[test]
fn another_accounts_first_turn_gives_the_thread_up_and_the_next_run_starts_fresh_once() {
    let world = World::new();
    let first = world.exec(&fake_codex(), Some("s1"), &[], b"remember zebra");
    let lost = thread_of(&first);
    let refused = {
        let mut command = world.command(&fake_codex(), Some("s1"));
        command
            .env(
                "FAKE_CODEX_FAULTS",
                r#"{"faults":[{"kind":"invalid_encrypted_content","turn":1}]}"#,
            )
            .args(["exec", "--experimental-json", "--skip-git-repo-check"]);
        run(command, b"still there?")
    };
    assert_ne!(refused.status.code(), Some(0), "{}", describe(&refused));
    assert_eq!(thread_of(&refused), lost, "resumed");
    let failed = events(&refused);
    let failed = failed.iter().find(|e| e["type"] == "turn.failed");
    let message = failed
        .and_then(|e| e["error"]["message"].as_str())
        .unwrap_or_default();
    assert!(
        message.contains("invalid_encrypted_content"),
        "{}",
        describe(&refused)
    );
    assert_eq!(
        notices(&refused),
        0,
        "owed to the next run: {}",
        describe(&refused)
    );
    let owed = world.session("s1").unwrap();
    assert_eq!(
        owed["thread_id"],
        Value::Null,
        "the binding is dropped: {owed}"
    );
    assert_eq!(owed["last_fallback"]["thread_id"], lost.as_str());
    assert_eq!(owed["last_fallback"]["reason"], "account_mismatch");
    assert_eq!(owed["last_fallback"]["pending"], true, "{owed}");

    let next = world.exec(&fake_codex(), Some("s1"), &[], b"and now?");
    assert!(next.status.success(), "{}", describe(&next));
    let replacement = thread_of(&next);
    assert_ne!(replacement, lost);
    assert_eq!(notices(&next), 1, "{}", describe(&next));
    let seen = world.last_model_request();
    assert!(
        seen.iter()
            .any(|m| m.starts_with("developer: ") && m.contains("remember zebra")),
        "seeded: {seen:?}"
    );
    let told = world.session("s1").unwrap();
    assert_eq!(told["thread_id"], replacement.as_str());
    assert_eq!(told["last_fallback"]["reason"], "account_mismatch");
    assert_eq!(told["last_fallback"]["pending"], false);
    let shown = Command::new(rethread())
        .args(["--store", &world.store(), "sessions", "show", "s1"])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    let line = format!("last fallback:   {lost} (account_mismatch) at ");
    assert!(shown.contains(&line), "{shown}");
    let after = world.exec(&fake_codex(), Some("s1"), &[], b"and then?");
    assert_eq!(thread_of(&after), replacement);
    assert_eq!(notices(&after), 0, "{}", describe(&after));
}
