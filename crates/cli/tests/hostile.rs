//! Careless and hostile input to the `rethread` binary (issue 19, items 14, 16, 17 and 20): a
//! `codex` that is rethread itself, a flood on `chat -`'s stdin, session names that cannot be
//! kept, and ids that would drive the terminal. Each runs against the `fake-codex` binary
//! behind a script that leaves a mark when codex is started.

mod support;

use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::{fake_codex, rethread, stderr, stdout};

/// A store (in a directory that does not exist until something writes it), a CODEX_HOME, and
/// a codex that leaves a mark when it is started.
struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Sandbox {
        let sandbox = Sandbox {
            dir: tempfile::tempdir().unwrap(),
        };
        let codex = sandbox.dir.path().join("marking-codex");
        std::fs::write(
            &codex,
            format!(
                "#!/bin/sh\ntouch '{}'\nexec '{}' \"$@\"\n",
                sandbox.mark().display(),
                fake_codex().display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&codex, std::fs::Permissions::from_mode(0o755)).unwrap();
        sandbox
    }

    /// The store's directory: absent until a command writes the store.
    fn store_dir(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// Exists once codex was started.
    fn mark(&self) -> PathBuf {
        self.dir.path().join("codex-was-started")
    }

    fn nothing_started_or_written(&self) -> bool {
        !self.mark().exists() && !self.store_dir().exists()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(rethread());
        command
            .args(args)
            .env(
                "RETHREAD_STORE",
                format!("redb:{}", self.store_dir().join("rethread.redb").display()),
            )
            .env("RETHREAD_CODEX_BIN", self.dir.path().join("marking-codex"))
            .env("CODEX_HOME", self.dir.path().join("codex-home"))
            .env("RUST_LOG", "off")
            .env_remove("RETHREAD_SESSION")
            .env_remove("RETHREAD_SESSION_WAIT")
            .env_remove("FAKE_CODEX_PROFILE")
            .env_remove("FAKE_CODEX_FAULTS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }
}

/// The child's output, read while it runs. Past `limit`, the child and its process group
/// (everything it started, when it was started with a group of its own) are killed and the
/// test fails.
fn output_within(child: Child, limit: Duration) -> Output {
    let pid = child.id();
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    match result.recv_timeout(limit) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            for target in [format!("-{pid}"), pid.to_string()] {
                let _ = Command::new("kill").args(["-KILL", "--", &target]).status();
            }
            panic!("still running after {limit:?}: killed it and its process group");
        }
    }
}

/// Issue 19, item 14: `codex` on PATH (or RETHREAD_CODEX_BIN) naming rethread itself made
/// `rethread app-server` start itself without end (about 300 processes in half a second).
/// Every command that starts codex refuses, says how to name the real one, and starts nothing.
#[test]
fn rethread_as_its_own_codex_is_refused_with_how_to_name_the_real_one() {
    let sandbox = Sandbox::new();
    let bin = sandbox.dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let link = bin.join("codex");
    std::os::unix::fs::symlink(rethread(), &link).unwrap();
    let on_path = |args: &[&str]| {
        let mut command = sandbox.command(args);
        command.env_remove("RETHREAD_CODEX_BIN").env("PATH", &bin);
        command
    };
    let by_name = |args: &[&str]| {
        let mut command = sandbox.command(args);
        command.env("RETHREAD_CODEX_BIN", &link);
        command
    };
    let cases = [
        ("codex on PATH, app-server", on_path(&["app-server"])),
        ("RETHREAD_CODEX_BIN, app-server", by_name(&["app-server"])),
        (
            "--codex-bin, app-server",
            on_path(&["--codex-bin", link.to_str().unwrap(), "app-server"]),
        ),
        (
            "codex on PATH, chat",
            on_path(&["chat", "--session", "s", "hi"]),
        ),
        ("RETHREAD_CODEX_BIN, doctor", {
            // doctor starts codex only with a binding to probe: one, in a store of its own.
            let store = format!(
                "sqlite:{}",
                sandbox.dir.path().join("bound.sqlite").display()
            );
            let runtime = tokio::runtime::Runtime::new().unwrap();
            runtime.block_on(async {
                let bound = rethread_store::open_url(&store, Default::default())
                    .await
                    .unwrap();
                let rows = vec![serde_json::json!({"role": "user", "text": "hi"})];
                let commit = rethread_store::TurnCommit::new(
                    "s",
                    "0199aaaa-0000-7000-8000-000000000001",
                    rows,
                );
                bound.commit_turn(commit).await.unwrap();
            });
            let mut command = by_name(&["doctor"]);
            command.env("RETHREAD_STORE", store);
            command
        }),
    ];
    for (case, mut command) in cases {
        let child = command.process_group(0).spawn().unwrap();
        let out = output_within(child, Duration::from_secs(20));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{case}: {err}");
        assert!(err.contains("is rethread itself"), "{case}: {err}");
        assert!(
            err.contains("--codex-bin") && err.contains("RETHREAD_CODEX_BIN"),
            "{case}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{case}: {err}");
        assert!(sandbox.nothing_started_or_written(), "{case}");
    }
}

/// Issue 19, item 16: `chat -` read stdin to its end (1.9 GB from /dev/zero in 4 s). Codex
/// refuses input over 1 MiB: more is a usage error (2), found after reading at most a little
/// past the limit, with nothing started or written.
#[test]
fn chat_dash_refuses_more_than_a_mebibyte_and_stops_reading() {
    let sandbox = Sandbox::new();
    let mut child = sandbox
        .command(&["chat", "--session", "s1", "-"])
        .stdin(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        let chunk = [b'a'; 64 * 1024];
        let mut written = 0usize;
        while written < 64 * 1024 * 1024 {
            match input.write(&chunk) {
                Ok(n) => written += n,
                Err(_) => break,
            }
        }
        written
    });
    let out = output_within(child, Duration::from_secs(60));
    let written = feeder.join().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("1 MiB"), "{err}");
    assert!(
        written < 8 * 1024 * 1024,
        "stdin was read far past the limit: {written} bytes"
    );
    assert!(sandbox.nothing_started_or_written());

    // At the limit (a trailing newline aside) the message is sent.
    let mut child = sandbox
        .command(&["chat", "--json", "--session", "s1", "-"])
        .stdin(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut message = vec![b'b'; 1024 * 1024];
    message.push(b'\n');
    let mut input = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || input.write_all(&message));
    let out = output_within(child, Duration::from_secs(120));
    feeder.join().unwrap().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["reply"].as_str().map(str::len), Some(6 + 1024 * 1024));
}

/// Issue 19, items 17 and 20: a session name that cannot be kept ran a pass-through that keeps
/// nothing (a RETHREAD_SESSION that is not UTF-8, `--session ""`) or fell back to a default (a
/// RETHREAD_SESSION_WAIT that is not UTF-8); `chat --session ""` was a store error (exit 1).
/// Each is a usage error, before codex starts or the store is opened.
#[test]
fn session_names_that_cannot_be_kept_are_usage_errors() {
    let sandbox = Sandbox::new();
    let not_utf8 = OsStr::from_bytes(b"chat-\xff");
    let cases = [
        (
            "chat --session ''",
            sandbox.command(&["chat", "--session", "", "hi"]),
        ),
        (
            "app-server --session ''",
            sandbox.command(&["--session", "", "app-server"]),
        ),
        ("RETHREAD_SESSION not UTF-8", {
            let mut command = sandbox.command(&["app-server"]);
            command.env("RETHREAD_SESSION", not_utf8);
            command
        }),
        ("RETHREAD_SESSION_WAIT not UTF-8", {
            let mut command = sandbox.command(&["app-server"]);
            command
                .env("RETHREAD_SESSION", "s1")
                .env("RETHREAD_SESSION_WAIT", not_utf8);
            command
        }),
    ];
    for (case, mut command) in cases {
        let out = command.output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{case}: {err}");
        assert!(sandbox.nothing_started_or_written(), "{case}: {err}");
    }
}

/// Issue 41, item 8: a session id in the kept threads' key space (`thread:...`) is a usage
/// error (exit 2) on every command that takes a session, before codex starts or the store is
/// written; `chat --session thread:<id>` exited 1 after starting codex, where `exec` exited 2.
#[test]
fn a_reserved_session_id_is_a_usage_error_everywhere() {
    let sandbox = Sandbox::new();
    let reserved = "thread:0195ec6b-66c5-7e31-9f2f-3ad0a1f2b9c4";
    let with_env = |args: &[&str]| {
        let mut command = sandbox.command(args);
        command.env("RETHREAD_SESSION", reserved);
        command
    };
    let cases = [
        (
            "chat --session",
            sandbox.command(&["chat", "--session", reserved, "hi"]),
        ),
        (
            "chat --session --json",
            sandbox.command(&["chat", "--session", reserved, "--json", "hi"]),
        ),
        (
            "app-server --session",
            sandbox.command(&["app-server", "--session", reserved]),
        ),
        ("RETHREAD_SESSION app-server", with_env(&["app-server"])),
        (
            "RETHREAD_SESSION exec",
            with_env(&["exec", "--experimental-json", "hi"]),
        ),
    ];
    for (case, mut command) in cases {
        let out = command.output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{case}: {err}");
        assert!(err.contains("reserved"), "{case}: {err}");
        assert!(sandbox.nothing_started_or_written(), "{case}: {err}");
    }
    let out = sandbox.run(&["chat", "--session", reserved, "--json", "hi"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["error"]["kind"], "usage", "{report}");
}

/// Issue 41, item 8: `RETHREAD_MIRROR_CAP=' 100'` was taken where `--mirror-cap ' 100'` was
/// refused. One reader of the cap: the same verdict from the flag and the variable.
#[test]
fn the_mirror_cap_gets_one_verdict_from_the_flag_and_the_variable() {
    let sandbox = Sandbox::new();
    for value in [" 100", "100 ", "0", "-1", "1e3", "lots"] {
        let flag = sandbox.run(&["chat", "--session", "s1", "--mirror-cap", value, "hi"]);
        let mut command = sandbox.command(&["chat", "--session", "s1", "hi"]);
        let variable = command.env("RETHREAD_MIRROR_CAP", value).output().unwrap();
        let app_server = sandbox.run(&["app-server", "--session", "s1", "--mirror-cap", value]);
        for (how, out) in [
            ("flag", &flag),
            ("variable", &variable),
            ("app-server", &app_server),
        ] {
            assert_eq!(
                out.status.code(),
                Some(2),
                "{value:?} by the {how}: {}",
                stderr(out)
            );
        }
        assert!(sandbox.nothing_started_or_written(), "{value:?}");
    }
}

/// Issue 19, item 20: `sessions list` printed ids raw, so an id holding ANSI escapes or a
/// newline drove the terminal or forged a row. Output for people escapes control characters;
/// JSON keeps the id exact.
#[test]
fn ids_are_shown_to_people_with_control_characters_escaped() {
    let sandbox = Sandbox::new();
    let id = "evil\x1b[2J\nforged-row\u{202e}";
    let out = sandbox.run(&["chat", "--session", id, "hi"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = r"evil\u{1b}[2J\nforged-row\u{202e}";
    for args in [
        &["sessions", "list"][..],
        &["sessions", "show", id],
        &["doctor"],
        &["sessions", "forget", id],
    ] {
        let out = sandbox.run(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let text = stdout(&out) + &stderr(&out);
        assert!(
            !text.contains('\x1b') && !text.contains('\u{202e}'),
            "{args:?}: {text:?}"
        );
        assert!(text.contains(shown), "{args:?}: {text:?}");
        assert!(!text.contains("\nforged-row"), "{args:?}: {text:?}");
    }
    let out = sandbox.run(&["sessions", "forget", id]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!stderr(&out).contains('\x1b'), "{}", stderr(&out));
    // JSON carries the id exactly (the listing is empty now; a new session shows it).
    assert!(sandbox
        .run(&["chat", "--session", id, "again"])
        .status
        .success());
    let list: Value =
        serde_json::from_slice(&sandbox.run(&["sessions", "list", "--json"]).stdout).unwrap();
    assert_eq!(list["sessions"][0]["session"], id);
}
