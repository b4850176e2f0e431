//! `rethread` tested as a process: against the fake app-server binary (`fake-codex`) and
//! against the real codex, current and previous release (and the floor for `doctor`), through
//! the Responses stand-in.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Output};

use rethread_testkit::real::{codex_or_skip, rollout_files, CodexHome};
use rethread_testkit::responses::ResponsesStandIn;
use rethread_testkit::{recent_releases, FLOOR};
use serde_json::Value;
use support::{block_on, fake_codex, stderr, wait_for_event};

const NOTICE: &str = "Codex thread could not be resumed; starting a new one.";

/// A sandbox: its own store file and CODEX_HOME.
struct Sandbox {
    dir: tempfile::TempDir,
    codex: PathBuf,
    home: PathBuf,
    env: Vec<(String, String)>,
}

impl Sandbox {
    fn new(codex: PathBuf, home: PathBuf) -> Sandbox {
        Sandbox {
            dir: tempfile::tempdir().unwrap(),
            codex,
            home,
            env: Vec::new(),
        }
    }

    fn fake() -> Sandbox {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("codex-home");
        let mut sandbox = Sandbox::new(fake_codex(), home);
        sandbox.dir = dir;
        sandbox
    }

    /// Without the rollout mirror (`RETHREAD_MIRROR=off`): a deleted rollout is a lost
    /// thread (`tests/mirror.rs` has the mirror).
    fn without_mirror(mut self) -> Sandbox {
        self.env.push(("RETHREAD_MIRROR".into(), "off".into()));
        self
    }

    fn store(&self) -> String {
        format!("redb:{}", self.dir.path().join("store.redb").display())
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rethread"));
        cmd.args(args)
            .env("RETHREAD_STORE", self.store())
            .env("RETHREAD_CODEX_BIN", &self.codex)
            .env("CODEX_HOME", &self.home)
            .env("RUST_LOG", "error")
            .env_remove("FAKE_CODEX_PROFILE");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    fn ok(&self, args: &[&str]) -> Output {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "{args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn chat_json(&self, session: &str, message: &str) -> Value {
        let out = self.ok(&["chat", "--session", session, "--json", message]);
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `doctor --json` plus `extra`: its report, after checking the exit code agrees with it
    /// (0 when every binding is live, 1 otherwise).
    fn doctor(&self, extra: &[&str]) -> Value {
        let mut args = vec!["doctor", "--json"];
        args.extend_from_slice(extra);
        let out = self.run(&args);
        let report: Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
        let expected = if report["all_live"] == true { 0 } else { 1 };
        assert_eq!(
            out.status.code(),
            Some(expected),
            "{report} {}",
            stderr(&out)
        );
        report
    }

    fn show(&self, session: &str) -> Value {
        serde_json::from_slice(&self.ok(&["sessions", "show", session, "--json"]).stdout).unwrap()
    }

    fn delete_rollout(&self, thread: &str) {
        let found = rollout_files(&self.home)
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(thread))
            .collect::<Vec<_>>();
        assert_eq!(found.len(), 1, "{found:?}");
        std::fs::remove_file(&found[0]).unwrap();
    }

    /// The conversations the fake binary's model saw, one JSON line per turn.
    fn fake_model_log(&self) -> String {
        std::fs::read_to_string(self.home.join("fake-model-requests.jsonl")).unwrap_or_default()
    }
}

#[test]
fn chat_resumes_across_invocations_on_the_fake() {
    let sandbox = Sandbox::fake();
    let first = sandbox.chat_json("s1", "remember PAPAYA");
    assert_eq!(first["outcome"], "started");
    assert_eq!(first["session"], "s1");
    assert_eq!(first["reply"], "echo: remember PAPAYA");
    assert_eq!(first["notices"], serde_json::json!([]));
    assert!(first.get("reason").is_none());
    let second = sandbox.chat_json("s1", "what was it?");
    assert_eq!(second["outcome"], "resumed");
    assert_eq!(second["thread_id"], first["thread_id"]);
    let log = sandbox.fake_model_log();
    let last: Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert!(
        last.to_string().contains("PAPAYA"),
        "the second process's model saw turn 1: {last}"
    );
    assert_eq!(sandbox.show("s1")["row_count"], 4);
}

#[test]
fn human_output_puts_the_reply_on_stdout_and_the_notice_once_on_stderr() {
    let sandbox = Sandbox::fake().without_mirror();
    let first = sandbox.chat_json("s1", "hello");
    sandbox.delete_rollout(first["thread_id"].as_str().unwrap());
    let out = sandbox.ok(&["chat", "--session", "s1", "again"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "echo: again\n");
    assert_eq!(stderr(&out).matches(NOTICE).count(), 1, "{}", stderr(&out));
    let shown = sandbox.show("s1");
    assert_ne!(shown["thread_id"], first["thread_id"]);
    assert_eq!(
        shown["retired_threads"],
        serde_json::json!([first["thread_id"]])
    );
}

#[test]
fn a_deleted_rollout_falls_back_with_one_notice_and_a_new_binding_on_the_fake() {
    let sandbox = Sandbox::fake().without_mirror();
    let first = sandbox.chat_json("s1", "hello");
    sandbox.delete_rollout(first["thread_id"].as_str().unwrap());
    let second = sandbox.chat_json("s1", "again");
    assert_eq!(second["outcome"], "fell_back");
    assert_eq!(second["reason"], "gone");
    assert_eq!(second["notices"], serde_json::json!([NOTICE]));
    assert_eq!(sandbox.show("s1")["thread_id"], second["thread_id"]);
    let third = sandbox.chat_json("s1", "and again");
    assert_eq!(third["outcome"], "resumed");
    assert_eq!(third["notices"], serde_json::json!([]));
}

#[test]
fn a_missing_codex_binary_fails_in_one_line_and_writes_nothing() {
    let mut sandbox = Sandbox::fake();
    sandbox.codex = sandbox.dir.path().join("no-such-codex");
    let out = sandbox.run(&["chat", "--session", "s1", "hi"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("rethread: could not start"), "{err}");
    let list: Value =
        serde_json::from_slice(&sandbox.ok(&["sessions", "list", "--json"]).stdout).unwrap();
    assert_eq!(
        list,
        serde_json::json!({"sessions": [], "next_after": null})
    );
}

#[test]
fn an_unreachable_store_fails_in_one_line() {
    let sandbox = Sandbox::fake();
    let out = sandbox.run(&[
        "--store",
        // Under a file that is not a directory (a path merely missing is nothing stored yet).
        "redb:/dev/null/store.redb",
        "sessions",
        "list",
    ]);
    assert!(!out.status.success());
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    let out = sandbox.run(&["--store", "nonsense", "sessions", "list"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).starts_with("rethread: cannot open store nonsense"),
        "{}",
        stderr(&out)
    );
}

/// A store URL's password is never printed, whichever command fails to open it and however
/// the URL spells it (issue 35: the driver decodes parameter names).
#[test]
fn a_store_password_is_never_printed() {
    let sandbox = Sandbox::fake();
    // Nothing listens on port 9 of loopback: the connection is refused at once.
    for url in [
        "postgres://alice:PASSWORD@127.0.0.1:9/db",
        "postgres://alice@127.0.0.1:9/db?pass%77ord=PASSWORD",
        "postgres://alice@127.0.0.1:9/db?%70assword=PASSWORD&sslmode=disable",
    ] {
        a_store_password_is_never_printed_by(&sandbox, url);
    }
}

/// Issue 41, item 6: a password in a `redb:` or `sqlite:` URL (the userinfo of
/// `redb://user:PW@host/path`, a parameter of `sqlite:///x?password=PW`) was printed in the
/// errors and the `-vv` logs, where every PostgreSQL spelling was masked. One rule masks
/// every scheme's: in the errors of every command, and in its debug log.
#[test]
fn a_file_store_urls_password_is_never_printed_nor_logged() {
    let sandbox = Sandbox::fake();
    for url in [
        "redb://alice:PASSWORD@host/var/x.redb",
        "sqlite://alice:PASSWORD@localhost/var/x.sqlite",
        "SQLITE://:PASSWORD@db/x.sqlite",
        "sqlite:///var/x.sqlite?password=PASSWORD",
        "redb:///var/x.redb?user=a&pass%77ord=PASSWORD",
    ] {
        for args in [
            vec!["-vv", "--store", url, "sessions", "list"],
            vec!["-vv", "--store", url, "sessions", "forget", "s1"],
            vec!["-vv", "--store", url, "doctor"],
            vec!["-vv", "--store", url, "verify", "--json"],
            vec![
                "-vv",
                "--store",
                url,
                "chat",
                "--session",
                "s1",
                "--json",
                "hi",
            ],
            vec!["-vv", "migrate", "--json", "--from", url, "--to", "memory:"],
            vec!["-vv", "migrate", "--from", "memory:", "--to", url],
        ] {
            let out = sandbox
                .command(&args)
                .env_remove("RUST_LOG")
                .output()
                .unwrap();
            assert!(!out.status.success(), "{args:?}");
            let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), stderr(&out));
            assert!(stderr.contains("***"), "{args:?}: {stderr}");
            assert!(
                !stderr.contains("PASSWORD") && !stdout.contains("PASSWORD"),
                "{args:?}: {stdout}{stderr}"
            );
        }
    }
    // The verbatim form takes such a URL as a file name: masked as its URL is, in the store's
    // own errors too (`no store at PATH`). Commands that create nothing.
    let missing = sandbox.dir.path().join("none");
    for tail in ["x.sqlite?password=PASSWORD", "a:PASSWORD@b.sqlite"] {
        let url = format!("sqlite:{}/{tail}", missing.display());
        for args in [
            vec!["-vv", "--store", &url, "sessions", "list"],
            vec!["-vv", "--store", &url, "sessions", "forget", "s1"],
            vec!["-vv", "--store", &url, "verify", "--json"],
            vec!["-vv", "migrate", "--from", &url, "--to", "memory:"],
        ] {
            let out = sandbox
                .command(&args)
                .env_remove("RUST_LOG")
                .output()
                .unwrap();
            let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), stderr(&out));
            assert!(stderr.contains("***"), "{args:?}: {stderr}");
            assert!(
                !stderr.contains("PASSWORD") && !stdout.contains("PASSWORD"),
                "{args:?}: {stdout}{stderr}"
            );
        }
        assert!(!missing.exists(), "nothing created");
    }
}

fn a_store_password_is_never_printed_by(sandbox: &Sandbox, url: &str) {
    for args in [
        vec!["--store", url, "sessions", "list"],
        vec!["--store", url, "doctor"],
        vec!["--store", url, "verify", "--json"],
        vec!["migrate", "--json", "--from", url, "--to", "memory:"],
        vec!["migrate", "--from", "memory:", "--to", url],
    ] {
        let out = sandbox.run(&args);
        assert!(!out.status.success(), "{args:?}");
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), stderr(&out));
        assert!(stderr.contains("alice"), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("PASSWORD") && !stdout.contains("PASSWORD"),
            "{args:?}: {stdout}{stderr}"
        );
    }
}

#[test]
fn a_failed_turn_writes_nothing() {
    let mut sandbox = Sandbox::fake();
    // The fake exits mid-turn.
    sandbox.env.push((
        "FAKE_CODEX_FAULTS".into(),
        r#"{"faults":[{"kind":"exit_mid_turn","turn":1}]}"#.into(),
    ));
    let out = sandbox.run(&["chat", "--session", "s1", "hi"]);
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    let out = sandbox.run(&["sessions", "show", "s1"]);
    assert!(!out.status.success(), "no session was written");
}

#[test]
fn sessions_list_show_and_forget() {
    let sandbox = Sandbox::fake();
    let a = sandbox.chat_json("a", "one");
    sandbox.chat_json("b", "two");
    let list: Value =
        serde_json::from_slice(&sandbox.ok(&["sessions", "list", "--json"]).stdout).unwrap();
    assert_eq!(list["next_after"], Value::Null);
    let ids: Vec<_> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    let shown = sandbox.show("a");
    assert_eq!(shown["thread_id"], a["thread_id"]);
    assert_eq!(shown["codex_home"], sandbox.home.display().to_string());
    assert_eq!(shown["row_count"], 2);
    assert!(shown["bound_at_ms"].as_i64().unwrap() > 0);
    let human = String::from_utf8_lossy(&sandbox.ok(&["sessions", "list"]).stdout).into_owned();
    assert!(human.contains(a["thread_id"].as_str().unwrap()), "{human}");
    sandbox.ok(&["sessions", "forget", "a"]);
    assert!(!sandbox.run(&["sessions", "show", "a"]).status.success());
    assert!(!sandbox.run(&["sessions", "forget", "a"]).status.success());
}

#[test]
fn doctor_classifies_live_gone_and_paginated_under_the_older_profile_on_the_fake() {
    let mut sandbox = Sandbox::fake().without_mirror();
    // Under the current profile threads are paginated by default.
    let paginated = sandbox.chat_json("paginated", "p");
    let gone = sandbox.chat_json("gone", "g");
    sandbox.delete_rollout(gone["thread_id"].as_str().unwrap());
    sandbox
        .env
        .push(("FAKE_CODEX_PROFILE".into(), "release-n".into()));
    let legacy = sandbox.chat_json("legacy", "l");
    let report: Value = sandbox.doctor(&[]);
    let status = |session: &str| {
        report["bindings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["session"] == session)
            .unwrap()["status"]
            .clone()
    };
    assert_eq!(status("paginated"), "incompatible", "{report}");
    assert_eq!(status("gone"), "gone");
    assert_eq!(status("legacy"), "live");
    assert_eq!(report["summary"]["live"], 1);
    assert_eq!(report["all_live"], false);
    // Probing changed nothing: the bindings are where they were.
    assert_eq!(
        sandbox.show("paginated")["thread_id"],
        paginated["thread_id"]
    );
    assert_eq!(sandbox.show("legacy")["thread_id"], legacy["thread_id"]);
    sandbox.env.clear();
    let report: Value = sandbox.doctor(&[]);
    assert_eq!(report["summary"]["live"], 2, "{report}");
    // Still one gone: the human report too exits 1, after every row and the summary.
    let out = sandbox.run(&["doctor"]);
    assert_eq!(out.status.code(), Some(1));
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    // The header, a row per binding, the summary.
    assert_eq!(table.lines().count(), 5, "{table}");
    assert!(table.starts_with("SESSION"), "{table}");
    assert!(table.ends_with("3 binding(s): 2 live, 1 gone\n"), "{table}");
    assert!(
        stderr(&out).contains("1 of 3 binding(s) not live"),
        "{}",
        stderr(&out)
    );
}

/// Every binding live: exit 0, whatever `--jobs`; a probe that fails outright (codex exits
/// under it) is an `error` row and the run goes on to every other binding, then exits 1.
#[test]
fn doctor_exits_0_only_when_all_live_and_reports_a_failed_probe_as_a_row() {
    let mut sandbox = Sandbox::fake();
    // An empty store (doctor only reads: it never creates one).
    sandbox.ok(&["migrate", "--from", "memory:", "--to", &sandbox.store()]);
    let empty = sandbox.doctor(&[]);
    assert_eq!(
        (empty["total"].clone(), empty["all_live"].clone()),
        (0.into(), true.into())
    );
    // The older profile: threads are legacy; each probe is `thread/read` and
    // `thread/turns/list`.
    sandbox
        .env
        .push(("FAKE_CODEX_PROFILE".into(), "release-n".into()));
    let sessions = ["a", "b", "c", "d", "e"];
    for session in sessions {
        sandbox.chat_json(session, "hi");
    }
    for jobs in ["1", "3", "64"] {
        let report = sandbox.doctor(&["--jobs", jobs]);
        assert_eq!(report["all_live"], true, "{report}");
        assert_eq!(report["summary"]["live"], 5, "{report}");
        let order: Vec<&str> = report["bindings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["session"].as_str().unwrap())
            .collect();
        assert_eq!(
            order, sessions,
            "session order whatever order the probes end in"
        );
    }
    let table = sandbox.ok(&["doctor", "--jobs", "2"]);
    assert!(String::from_utf8_lossy(&table.stdout).ends_with("5 binding(s): 5 live\n"));

    // Request 1 is `initialize`, 2 and 3 probe a, 4 probes b: codex exits there.
    sandbox.env.push((
        "FAKE_CODEX_FAULTS".into(),
        r#"{"faults": [{"kind": "exit_at_request", "n": 4}]}"#.into(),
    ));
    let report = sandbox.doctor(&["--jobs", "1"]);
    let rows = report["bindings"].as_array().unwrap();
    assert_eq!(rows.len(), 5, "{report}");
    assert_eq!(rows[0]["status"], "live", "{report}");
    for row in &rows[1..] {
        assert_eq!(row["status"], "error", "{report}");
        assert!(
            row["detail"]
                .as_str()
                .unwrap()
                .starts_with("probe failed: "),
            "{report}"
        );
    }
    assert_eq!(report["summary"]["error"], 4);
    let out = sandbox.run(&["doctor", "--jobs", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("4 of 5 binding(s) not live"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn doctor_jobs_out_of_range_is_a_usage_error() {
    let sandbox = Sandbox::fake();
    for jobs in ["0", "65", "many"] {
        let out = sandbox.run(&["doctor", "--jobs", jobs]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "--jobs {jobs}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn chat_on_a_session_another_host_holds_says_who_and_writes_nothing() {
    let sandbox = Sandbox::fake();
    let url = format!(
        "sqlite:{}",
        sandbox.dir.path().join("shared.sqlite").display()
    );
    let holder = rethread_store::LeaseOwner {
        host: "gateway-7".into(),
        pid: 31337,
        started_at_ms: 1_700_000_000_000,
        instance: 1,
        process: None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = rethread_store::open_url(&url, rethread_store::OpenOptions::new())
            .await
            .unwrap();
        store
            .acquire_lease("held", &holder, std::time::Duration::from_secs(120))
            .await
            .unwrap();
    });
    let out = sandbox.run(&["--store", &url, "chat", "--session", "held", "hello"]);
    assert_eq!(out.status.code(), Some(75), "busy is temporary");
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("busy")
            && err.contains("gateway-7")
            && err.contains("pid 31337")
            && err.contains(" since 20"),
        "{err}"
    );
    assert!(rollout_files(&sandbox.home).is_empty(), "no thread started");
    // Another session of the same store is free, and its lease is released at exit.
    sandbox.ok(&["--store", &url, "chat", "--session", "free", "hello"]);
    sandbox.ok(&["--store", &url, "chat", "--session", "free", "again"]);
}

/// Issue 19 item 10 and issue 35 item 12: commands that only read create nothing on a missing
/// store, neither the file nor its directory. For those that report what is stored (`sessions
/// list`, `doctor`, `verify`) nothing stored yet is no failure: exit 0, empty output, and
/// `no store yet at PATH` on stderr; `show` finds no such session (exit 1); `forget` and the
/// source of `migrate` fail with `no store at PATH` (exit 1).
#[test]
fn read_only_commands_on_a_missing_store_create_nothing() {
    let sandbox = Sandbox::fake();
    let missing = sandbox.dir.path().join("typo/rethread.sqlite");
    let url = format!("sqlite:{}", missing.display());
    let not_yet = format!("no store yet at {}", missing.display());
    let no_store = format!("no store at {}", missing.display());
    let cases: [(&[&str], i32, &str, &str); 9] = [
        (&["sessions", "list"], 0, &not_yet, "no sessions\n"),
        (
            &["sessions", "list", "--json"],
            0,
            &not_yet,
            "{\"sessions\":[],\"next_after\":null}\n",
        ),
        (&["doctor"], 0, &not_yet, "0 binding(s)\n"),
        (&["doctor", "--json"], 0, &not_yet, ""),
        (&["verify"], 0, &not_yet, ""),
        (&["verify", "--json"], 0, &not_yet, ""),
        (&["sessions", "show", "a"], 1, "no session a", ""),
        (&["sessions", "forget", "a"], 1, &no_store, ""),
        (
            &["migrate", "--from", &url, "--to", "memory:"],
            1,
            &no_store,
            "",
        ),
    ];
    for (args, code, says, prints) in cases {
        let mut with_store = vec!["--store", url.as_str()];
        if args[0] == "migrate" {
            with_store.clear();
        }
        with_store.extend(args);
        let out = sandbox.run(&with_store);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        match (prints, args.contains(&"--json")) {
            ("", true) => {
                let report: Value = serde_json::from_str(&stdout).unwrap();
                assert!(
                    report["total"] == 0 || report["sessions"] == 0,
                    "{args:?}: {report}"
                );
            }
            ("", false) => {}
            (prints, _) => assert_eq!(stdout, prints, "{args:?}"),
        }
    }
    assert!(!sandbox.dir.path().join("typo").exists(), "nothing created");
}

/// Commands that only read (`sessions list` and `show`, `verify`, `doctor`, the source of
/// `migrate`) open the store read-only: the redb file is left byte for byte and no holder
/// record appears beside it (a read-write open rewrites redb's header on close).
#[test]
fn read_only_commands_change_nothing_in_an_existing_store() {
    let sandbox = Sandbox::fake();
    sandbox.chat_json("a", "one");
    let path = sandbox.dir.path().join("store.redb");
    let files = || {
        let mut names: Vec<String> = std::fs::read_dir(sandbox.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        (names, std::fs::read(&path).unwrap())
    };
    let before = files();
    let target = format!(
        "sqlite:{}",
        sandbox.dir.path().join("copy/c.sqlite").display()
    );
    for args in [
        vec!["sessions", "list"],
        vec!["sessions", "show", "a"],
        vec!["verify"],
        vec!["doctor"],
    ] {
        sandbox.ok(&args);
        assert!(files() == before, "{args:?} changed the store");
    }
    sandbox.ok(&["migrate", "--from", &sandbox.store(), "--to", &target]);
    let (mut names, bytes) = files();
    names.retain(|n| n != "copy");
    assert!((names, bytes) == before, "migrate changed its source");
}

/// Issue 19 item 9: the default store is SQLite under the user's data directory, so several
/// processes (two `app-server` sessions, a `chat` beside them) share it.
#[test]
fn the_default_store_is_sqlite_under_the_data_directory() {
    let sandbox = Sandbox::fake();
    let data = sandbox.dir.path().join("data");
    let chat = |session: &str| {
        let mut cmd = sandbox.command(&["chat", "--session", session, "--json", "hi"]);
        cmd.env_remove("RETHREAD_STORE").env("XDG_DATA_HOME", &data);
        cmd.output().unwrap()
    };
    let out = chat("a");
    assert!(out.status.success(), "{}", stderr(&out));
    let store = data.join("rethread/rethread.sqlite");
    let header = std::fs::read(&store).expect("the default store");
    assert!(header.starts_with(b"SQLite format 3\0"), "not SQLite");
    // A second process on the default store while another holds it open.
    let url = format!("sqlite:{}", store.display());
    let held = block_on(rethread_store::open_url(
        &url,
        rethread_store::OpenOptions::new(),
    ))
    .unwrap();
    let out = chat("b");
    assert!(out.status.success(), "{}", stderr(&out));
    drop(held);
}

/// Issue 19 item 3: `sessions forget` of a session a live host holds is refused, exit 75,
/// naming the holder, and the session stays (a delete is never silently undone).
#[test]
fn forget_while_a_host_holds_the_session_exits_75_naming_it() {
    let sandbox = sqlite_sandbox();
    sandbox.chat_json("held", "hello");
    let url = sandbox_store_url(&sandbox);
    block_on(async {
        let store = rethread_store::open_url(&url, rethread_store::OpenOptions::new())
            .await
            .unwrap();
        store
            .acquire_lease(
                "held",
                &remote_holder("gateway-9"),
                std::time::Duration::from_secs(120),
            )
            .await
            .unwrap();
    });
    let out = sandbox.run(&["sessions", "forget", "held"]);
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("gateway-9") && err.contains("pid 31337"),
        "{err}"
    );
    assert_eq!(sandbox.show("held")["session"], "held", "the session stays");
}

fn postgres_url(test: &str) -> Option<String> {
    rethread_testkit::postgres::fresh_url(test)
}

#[test]
fn migrate_to_and_from_postgres_and_chat_on_it() {
    let Some(pg) = postgres_url("migrate") else {
        return;
    };
    let sandbox = Sandbox::fake();
    for (session, message) in [("a", "one"), ("b", "two"), ("a", "three")] {
        sandbox.chat_json(session, message);
    }
    let original = sandbox.store();
    let out = sandbox.ok(&["migrate", "--from", &original, "--to", &pg]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 copied"));
    let out = sandbox.ok(&["migrate", "--from", &original, "--to", &pg]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 already present"));
    let back = format!(
        "sqlite:{}",
        sandbox.dir.path().join("back.sqlite").display()
    );
    sandbox.ok(&["migrate", "--from", &pg, "--to", &back]);
    // What a session holds is the same in every store; how many bytes the store takes for
    // its rows is each engine's own (PostgreSQL keeps them as jsonb).
    let held = |mut show: Value| {
        let show = show.as_object_mut().unwrap();
        let row_bytes = show.remove("row_bytes").unwrap().as_u64().unwrap();
        show.remove("stored_bytes");
        (Value::Object(show.clone()), row_bytes)
    };
    for session in ["a", "b"] {
        let (before, _) = held(sandbox.show(session));
        for store in [&pg, &back] {
            let after: Value = serde_json::from_slice(
                &sandbox
                    .ok(&["--store", store, "sessions", "show", session, "--json"])
                    .stdout,
            )
            .unwrap();
            let (after, row_bytes) = held(after);
            assert_eq!(before, after, "{store}");
            assert!(row_bytes > 0, "{store}");
        }
    }
    let resumed: Value = serde_json::from_slice(
        &sandbox
            .ok(&["--store", &pg, "chat", "--session", "a", "--json", "four"])
            .stdout,
    )
    .unwrap();
    assert_eq!(resumed["outcome"], "resumed");
}

#[test]
fn migrate_redb_to_sqlite_and_back_loses_nothing_and_reruns_cleanly() {
    let sandbox = Sandbox::fake();
    for (session, message) in [("a", "one"), ("b", "two"), ("a", "three")] {
        sandbox.chat_json(session, message);
    }
    let sqlite = format!(
        "sqlite:{}",
        sandbox.dir.path().join("copy.sqlite").display()
    );
    let back = format!("redb:{}", sandbox.dir.path().join("back.redb").display());
    let original = sandbox.store();
    let out = sandbox.ok(&["migrate", "--from", &original, "--to", &sqlite]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("2 copied"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Rerun (as after an interruption): nothing duplicated.
    let out = sandbox.ok(&["migrate", "--from", &original, "--to", &sqlite]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 already present"));
    sandbox.ok(&["migrate", "--from", &sqlite, "--to", &back]);
    for session in ["a", "b"] {
        let before = sandbox.show(session);
        let after: Value = serde_json::from_slice(
            &sandbox
                .ok(&["--store", &back, "sessions", "show", session, "--json"])
                .stdout,
        )
        .unwrap();
        assert_eq!(before, after);
    }
    // The migrated store is usable: the session resumes from it.
    let resumed: Value = serde_json::from_slice(
        &sandbox
            .ok(&["--store", &back, "chat", "--session", "a", "--json", "four"])
            .stdout,
    )
    .unwrap();
    assert_eq!(resumed["outcome"], "resumed");
}

#[test]
#[cfg(feature = "demo")]
fn demo_tells_the_whole_story() {
    let out = Command::new(env!("CARGO_BIN_EXE_rethread"))
        .arg("demo")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches(NOTICE).count(), 1, "{text}");
    assert!(
        text.contains("ok: the model's request holds turn 1"),
        "{text}"
    );
    assert!(text.contains("done:"), "{text}");
}

#[test]
#[cfg(feature = "demo")]
fn demo_json_is_one_object_with_every_check() {
    let out = Command::new(env!("CARGO_BIN_EXE_rethread"))
        .args(["demo", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let story: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(story["ok"], true);
    assert!(story.get("error").is_none(), "{story}");
    let steps = story["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 5, "setup and four steps: {story}");
    let checks: Vec<&str> = steps
        .iter()
        .flat_map(|s| s["checks"].as_array().unwrap())
        .map(|c| c.as_str().unwrap())
        .collect();
    assert!(
        checks.contains(&"the model's request holds turn 1: it remembers"),
        "{checks:?}"
    );
    assert!(checks.contains(&"exactly one notice"), "{checks:?}");
    assert!(
        checks.contains(&"restored from the store, then thread/resume: the same thread"),
        "{checks:?}"
    );
    let text = out.stdout.escape_ascii().to_string();
    assert_eq!(text.matches(NOTICE).count(), 1, "{story}");
}

/// The real codex (current and previous): chat, restart (every invocation is a new process), chat again.
#[test]
fn chat_against_real_codex_remembers_and_fails_closed() {
    for version in recent_releases() {
        let Some(codex) = codex_or_skip(&version) else {
            continue;
        };
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let _guard = runtime.enter();
        let model = ResponsesStandIn::start().unwrap();
        let home = CodexHome::new(&model).unwrap();
        let sandbox = Sandbox::new(codex, home.path().to_path_buf()).without_mirror();
        let first = sandbox.chat_json("s1", "Please remember the word PAPAYA.");
        assert_eq!(first["outcome"], "started");
        assert_eq!(first["reply"], "echo: Please remember the word PAPAYA.");
        let second = sandbox.chat_json("s1", "What was the word?");
        assert_eq!(second["outcome"], "resumed");
        let last = model.model_requests().last().cloned().unwrap();
        assert!(
            String::from_utf8_lossy(&last.body).contains("PAPAYA"),
            "the model's request holds turn 1"
        );
        sandbox.delete_rollout(first["thread_id"].as_str().unwrap());
        let third = sandbox.chat_json("s1", "Still there?");
        assert_eq!(third["outcome"], "fell_back");
        assert_eq!(third["notices"], serde_json::json!([NOTICE]));
        assert_eq!(sandbox.show("s1")["thread_id"], third["thread_id"]);
    }
}

/// `doctor` against real codex: live, gone, unreadable, and paginated under 0.144.6; a legacy
/// thread whose rollout was deleted is gone (0.169+ still answer its metadata read from their
/// index); and the probe makes codex warn of nothing (0.171.0 warns that full-history reads of
/// paginated threads are deprecated).
#[test]
fn doctor_against_real_codex() {
    for version in recent_releases() {
        let (Some(current), Some(older)) = (codex_or_skip(&version), codex_or_skip(FLOOR)) else {
            continue;
        };
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let _guard = runtime.enter();
        let model = ResponsesStandIn::start().unwrap();
        let home = CodexHome::new(&model).unwrap();
        let mut sandbox = Sandbox::new(current.clone(), home.path().to_path_buf()).without_mirror();
        sandbox.chat_json("paginated", "p");
        let gone = sandbox.chat_json("gone", "g");
        sandbox.delete_rollout(gone["thread_id"].as_str().unwrap());
        let unreadable = sandbox.chat_json("unreadable", "u");
        let rollout = rollout_files(&sandbox.home)
            .into_iter()
            .find(|p| {
                p.to_string_lossy()
                    .contains(unreadable["thread_id"].as_str().unwrap())
            })
            .unwrap();
        std::fs::write(rollout, b"not json\n").unwrap();
        sandbox.codex = older;
        sandbox.chat_json("legacy", "l");
        let legacy_gone = sandbox.chat_json("legacy-gone", "lg");
        sandbox.delete_rollout(legacy_gone["thread_id"].as_str().unwrap());
        let report: Value = sandbox.doctor(&[]);
        let status = |report: &Value, session: &str| {
            report["bindings"]
                .as_array()
                .unwrap()
                .iter()
                .find(|b| b["session"] == session)
                .unwrap()["status"]
                .clone()
        };
        assert_eq!(status(&report, "paginated"), "incompatible", "{report}");
        assert_eq!(status(&report, "gone"), "gone", "{report}");
        assert_eq!(status(&report, "legacy"), "live", "{report}");
        assert_eq!(status(&report, "unreadable"), "unreadable", "{report}");
        sandbox.codex = current;
        let report: Value = sandbox.doctor(&[]);
        assert_eq!(status(&report, "paginated"), "live", "{report}");
        assert_eq!(status(&report, "gone"), "gone", "{report}");
        assert_eq!(status(&report, "legacy"), "live", "{report}");
        assert_eq!(status(&report, "unreadable"), "unreadable", "{report}");
        assert_eq!(status(&report, "legacy-gone"), "gone", "{report}");
        let out = sandbox.run(&["doctor"]);
        let warned = stderr(&out);
        assert!(
            !warned.to_lowercase().contains("deprecat"),
            "{version}: {warned}"
        );
    }
}

/// A sandbox on an SQLite store (several processes may open it at once, so a test can look at
/// the session's lease while `chat` runs).
fn sqlite_sandbox() -> Sandbox {
    let sandbox = Sandbox::fake();
    let url = format!(
        "sqlite:{}",
        sandbox.dir.path().join("store.sqlite").display()
    );
    let mut sandbox = sandbox;
    sandbox.env.push(("RETHREAD_STORE".into(), url));
    sandbox
}

fn sandbox_store_url(sandbox: &Sandbox) -> String {
    sandbox
        .env
        .iter()
        .find(|(k, _)| k == "RETHREAD_STORE")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| sandbox.store())
}

/// A lease holder on another machine (its liveness cannot be judged from here).
fn remote_holder(host: &str) -> rethread_store::LeaseOwner {
    rethread_store::LeaseOwner {
        host: host.into(),
        pid: 31337,
        started_at_ms: 1_700_000_000_000,
        instance: 1,
        process: None,
    }
}

/// Waits until process `pid` holds `session`'s lease (probing with a short lease of our own
/// while it is free: the chat under test runs with `--wait`, so it outwaits the probe).
fn wait_until_held_by(url: &str, session: &str, pid: u32) {
    block_on(async {
        let store = rethread_store::open_url(url, rethread_store::OpenOptions::new())
            .await
            .unwrap();
        let probe = remote_holder("probe");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "chat never took the lease"
            );
            match store
                .acquire_lease(session, &probe, std::time::Duration::from_millis(200))
                .await
            {
                Ok(lease) => {
                    store.release_lease(&lease).await.unwrap();
                }
                Err(rethread_store::StoreError::Busy { holder, .. }) if holder.pid == pid => return,
                Err(_) => {}
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
    });
}

/// Issue 12, "a crash stalls the restart": `chat` stopped by SIGINT or SIGTERM mid-turn exits
/// 130 / 143 (under `--json` with an `interrupted` error), and a rerun at once is not busy; so
/// is a rerun after a SIGKILL (the dead holder's lease is taken over).
#[test]
fn an_interrupted_or_killed_chat_never_stalls_the_next_one() {
    let mut sandbox = sqlite_sandbox();
    let url = sandbox_store_url(&sandbox);
    for (signal, code) in [("INT", Some(130)), ("TERM", Some(143)), ("KILL", None)] {
        let events = sandbox.dir.path().join(format!("events-{signal}.log"));
        sandbox
            .env
            .retain(|(k, _)| k != "FAKE_CODEX_FAULTS" && k != "FAKE_CODEX_EVENT_LOG");
        sandbox.env.push((
            "FAKE_CODEX_FAULTS".into(),
            r#"{"faults":[{"kind":"slow_turn","millis":60000}]}"#.into(),
        ));
        sandbox
            .env
            .push(("FAKE_CODEX_EVENT_LOG".into(), events.display().to_string()));
        let child = sandbox
            .command(&["chat", "--session", "s1", "--json", "--wait", "30", "slow"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        wait_until_held_by(&url, "s1", child.id());
        // The turn is under way: codex has it.
        wait_for_event(&events, "request turn/start");
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), code, "SIG{signal}: {}", stderr(&out));
        if code.is_some() {
            let report: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(report["error"]["kind"], "interrupted", "{report}");
            assert_eq!(report["session"], "s1");
        }
        // At once, without `--wait`: the session is free.
        sandbox
            .env
            .retain(|(k, _)| k != "FAKE_CODEX_FAULTS" && k != "FAKE_CODEX_EVENT_LOG");
        let out = sandbox.run(&["chat", "--session", "s1", "--json", "again"]);
        assert!(out.status.success(), "after SIG{signal}: {}", stderr(&out));
    }
}

/// A terminal's Ctrl-C reaches codex too (one process group). When codex dies of it before
/// `chat` has seen its own SIGINT, the turn still ends as interrupted (130), not as codex
/// closing (1), and the next run is not busy.
#[test]
fn a_ctrl_c_that_ends_codex_first_is_still_an_interrupt() {
    let mut sandbox = Sandbox::fake();
    let events = sandbox.dir.path().join("events.log");
    let fake = sandbox.codex.clone();
    // codex as the Ctrl-C leaves it: once the turn is under way codex dies at once (its output
    // closes), and the signal reaches `chat`, its parent, a moment later.
    let wrapper = sandbox.dir.path().join("codex-then-ctrl-c");
    // (A background job's stdin is /dev/null unless given one: codex gets ours through fd 3.)
    let body = format!(
        "exec 3<&0\n\"{fake}\" \"$@\" <&3 3<&- &\ncodex=$!\nexec >&- <&- 3<&-\n\
         until grep -q 'request turn/start' \"{events}\" 2>/dev/null; do sleep 0.01; done\n\
         kill -KILL $codex\nsleep 0.05\nkill -INT $PPID\nwait\n",
        fake = fake.display(),
        events = events.display()
    );
    std::fs::write(&wrapper, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    sandbox.codex = wrapper;
    sandbox
        .env
        .push(("FAKE_CODEX_EVENT_LOG".into(), events.display().to_string()));
    sandbox.env.push((
        "FAKE_CODEX_FAULTS".into(),
        r#"{"faults":[{"kind":"slow_turn","millis":60000}]}"#.into(),
    ));
    let out = sandbox.run(&["chat", "--session", "s1", "--json", "slow"]);
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["error"]["kind"], "interrupted", "{report}");
    // At once, without `--wait`: the session is free.
    sandbox.codex = fake;
    sandbox.env.clear();
    let again = sandbox.chat_json("s1", "again");
    assert_eq!(
        again["outcome"], "started",
        "the interrupted turn bound nothing"
    );
}

/// `--wait SECS` outwaits a holder whose lease expires meanwhile; without it, exit 75.
#[test]
fn chat_wait_outwaits_a_busy_session() {
    let sandbox = sqlite_sandbox();
    let url = sandbox_store_url(&sandbox);
    block_on(async {
        let store = rethread_store::open_url(&url, rethread_store::OpenOptions::new())
            .await
            .unwrap();
        store
            .acquire_lease(
                "s1",
                &remote_holder("gateway-7"),
                std::time::Duration::from_millis(1500),
            )
            .await
            .unwrap();
    });
    let out = sandbox.run(&["chat", "--session", "s1", "hello"]);
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    let out = sandbox.run(&["chat", "--session", "s1", "--wait", "20", "hello"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "echo: hello\n");
}

/// Usage errors exit 2 (clap), with nothing written.
#[test]
fn usage_errors_exit_2() {
    let sandbox = Sandbox::fake();
    assert_eq!(sandbox.run(&["chat", "hello"]).status.code(), Some(2));
    assert_eq!(
        sandbox
            .run(&["chat", "--session", "s", "--wait", "soon", "hello"])
            .status
            .code(),
        Some(2)
    );
}

/// Issue 12, "the notice can vanish", and issue 19 item 7, "said again after it was
/// delivered": a lost thread, then a turn that fails, under `--json`: stdout is still one
/// object, with the error and the fallback notice. In both modes the notice is on stderr,
/// once, said when the thread was given up. It was delivered, so the next run says nothing
/// and starts the (seeded) replacement; the run after that resumes it.
#[test]
fn a_fallback_whose_turn_fails_still_says_the_notice() {
    for json in [true, false] {
        let mut sandbox = Sandbox::fake().without_mirror();
        let first = sandbox.chat_json("s1", "hello");
        sandbox.delete_rollout(first["thread_id"].as_str().unwrap());
        // The fake exits during this process's first turn.
        sandbox.env.push((
            "FAKE_CODEX_FAULTS".into(),
            r#"{"faults":[{"kind":"exit_mid_turn","turn":1}]}"#.into(),
        ));
        let mut args = vec!["chat", "--session", "s1", "again"];
        if json {
            args.insert(3, "--json");
        }
        let out = sandbox.run(&args);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert_eq!(
            stderr(&out)
                .lines()
                .filter(|l| l.starts_with("rethread: "))
                .count(),
            1
        );
        assert_eq!(stderr(&out).matches(NOTICE).count(), 1, "{}", stderr(&out));
        if json {
            let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
                panic!(
                    "stdout is not one JSON object ({e}): {}",
                    String::from_utf8_lossy(&out.stdout)
                )
            });
            assert_eq!(report["notices"], serde_json::json!([NOTICE]), "{report}");
            assert_eq!(report["error"]["kind"], "client", "{report}");
            assert!(report["error"]["message"]
                .as_str()
                .unwrap()
                .contains("closed"));
            assert_eq!(report["outcome"], "fell_back");
            assert_eq!(report["reason"], "gone");
            assert_eq!(report["session"], "s1");
            assert!(report.get("reply").is_none());
        } else {
            assert!(out.stdout.is_empty());
        }
        sandbox.env.clear();
        // The notice reached the user (stderr, and the JSON report): the next turn starts the
        // replacement and says nothing again (issue 19, item 7).
        let next = sandbox.chat_json("s1", "and now?");
        assert_eq!(next["outcome"], "started");
        assert_eq!(next["notices"], serde_json::json!([]));
        let after = sandbox.chat_json("s1", "still there?");
        assert_eq!(after["outcome"], "resumed");
        assert_eq!(after["thread_id"], next["thread_id"]);
        assert_eq!(after["notices"], serde_json::json!([]));
    }
}

/// Issue 12: temporary failures of `thread/resume` (codex overloaded, an I/O error reading the
/// rollout) exit 75 with a typed error and keep the binding; nothing is retired.
#[test]
fn temporary_resume_failures_exit_75_and_keep_the_binding() {
    for fault in [
        r#"{"kind":"overloaded","method":"thread/resume","attempts":100}"#.to_string(),
        r#"{"kind":"fail_resume","thread_ids":["THREAD"],"code":-32603,"message":"failed to read thread: thread-store internal error: failed to read session metadata /h/x: Permission denied (os error 13)"}"#.to_string(),
    ] {
        let mut sandbox = Sandbox::fake();
        let first = sandbox.chat_json("s1", "hello");
        let thread = first["thread_id"].as_str().unwrap();
        let fault = fault.replace("THREAD", thread);
        sandbox
            .env
            .push(("FAKE_CODEX_FAULTS".into(), format!(r#"{{"faults":[{fault}]}}"#)));
        let out = sandbox.run(&["chat", "--session", "s1", "--json", "again"]);
        assert_eq!(out.status.code(), Some(75), "{fault}: {}", stderr(&out));
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["error"]["kind"], "resume_unavailable", "{report}");
        assert_eq!(report["notices"], serde_json::json!([]));
        let shown = sandbox.show("s1");
        assert_eq!(shown["thread_id"], first["thread_id"], "binding kept");
        assert_eq!(shown["retired_threads"], serde_json::json!([]));
        assert_eq!(shown["row_count"], 2);
        // Once codex recovers, the same thread resumes.
        sandbox.env.clear();
        assert_eq!(sandbox.chat_json("s1", "later")["outcome"], "resumed");
    }
}

/// A store another process has open (redb locks its file) is temporary: exit 75, and under
/// `--json` an `error.kind` of `store`.
#[test]
fn a_store_in_use_by_another_process_exits_75() {
    let mut sandbox = Sandbox::fake();
    sandbox.env.push((
        "FAKE_CODEX_FAULTS".into(),
        r#"{"faults":[{"kind":"slow_turn","millis":60000}]}"#.into(),
    ));
    let mut holder = sandbox
        .command(&["chat", "--session", "s1", "slow"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // `chat` opens the store before it starts codex, which makes its home.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !sandbox.home.join("state_5.sqlite").exists() {
        assert!(std::time::Instant::now() < deadline, "codex never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    sandbox.env.clear();
    let out = sandbox.run(&["chat", "--session", "s2", "--json", "hello"]);
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["error"]["kind"], "store", "{report}");
    assert!(stderr(&out).contains("in use"), "{}", stderr(&out));
    // The holder's start as a person reads it (issue 35): UTC and how long ago.
    let said = stderr(&out);
    let ago = said.contains(" ago)") || said.contains(" UTC (now)");
    assert!(said.contains(" UTC (") && ago, "{said}");
    let epoch_ms = said
        .split(|c: char| !c.is_ascii_digit())
        .any(|d| d.len() >= 13);
    assert!(!epoch_ms, "{said}");
}

/// Issue 22, "a fallback every SDK user can see": `sessions show --json` reports the session's
/// last fallback (the lost thread, why, when, and whether its notice is still owed), also
/// after turns on the replacement thread; a session that never fell back reports `null`.
#[test]
fn sessions_show_reports_the_last_fallback() {
    let sandbox = Sandbox::fake().without_mirror();
    let first = sandbox.chat_json("s1", "remember PAPAYA");
    assert_eq!(sandbox.show("s1")["last_fallback"], Value::Null);
    let lost = first["thread_id"].as_str().unwrap().to_string();
    sandbox.delete_rollout(&lost);
    let fell = sandbox.chat_json("s1", "and now?");
    assert_eq!(fell["outcome"], "fell_back");
    sandbox.chat_json("s1", "still there?");
    let last = &sandbox.show("s1")["last_fallback"];
    assert_eq!(last["thread_id"], serde_json::json!(lost), "{last}");
    assert_eq!(last["reason"], "gone");
    assert_eq!(last["pending"], false);
    assert!(last["at_ms"].as_i64().unwrap() > 0);
}
