//! The log output of `rethread` as a process (against the `fake-codex` binary): `RUST_LOG`,
//! `-v`/`-vv`, `--log-format text|json`; logs on stderr only, never on stdout, never a secret.
//! And `chat`'s human output, the reply as codex streams it.

mod support;

use std::process::{Command, Output};

use serde_json::Value;
use support::in_sandbox;

/// A store and a CODEX_HOME of its own, and `rethread` run with `rust_log` as `RUST_LOG`
/// (unset when `None`).
struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Sandbox {
        Sandbox {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn run(&self, rust_log: Option<&str>, args: &[&str]) -> Output {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rethread"));
        in_sandbox(command.args(args), self.dir.path()).env_remove("NO_COLOR");
        match rust_log {
            Some(filter) => command.env("RUST_LOG", filter),
            None => command.env_remove("RUST_LOG"),
        };
        command.output().unwrap()
    }

    fn ok(&self, rust_log: Option<&str>, args: &[&str]) -> (String, String) {
        let out = self.run(rust_log, args);
        let (stdout, stderr) = texts(&out);
        assert!(out.status.success(), "{args:?}: {stderr}");
        (stdout, stderr)
    }

    fn thread_of(&self, session: &str) -> String {
        let (stdout, _) = self.ok(Some("off"), &["sessions", "show", session, "--json"]);
        let shown: Value = serde_json::from_str(&stdout).unwrap();
        shown["thread_id"].as_str().unwrap().to_string()
    }
}

fn texts(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The stderr lines of span `name` (text format: `name{field=value ...}: target: close ...`).
fn span_lines<'a>(stderr: &'a str, name: &str) -> Vec<&'a str> {
    let opening = format!("{name}{{");
    stderr
        .lines()
        .filter(|line| line.contains(&opening))
        .collect()
}

/// The line span `name` printed when it closed: the innermost span of a `close` line is the
/// last one of its span chain (`outer{..}:inner{..}: target: close ...`).
fn closed_line<'a>(stderr: &'a str, name: &str) -> Option<&'a str> {
    let opening = format!("{name}{{");
    stderr.lines().find(|line| {
        let Some(chain_end) = line.find("}: ") else {
            return false;
        };
        let chain = &line[..=chain_end];
        let innermost = chain
            .rfind("}:rethread.")
            .map(|at| at + 2)
            .or_else(|| chain.find(" rethread.").map(|at| at + 1))
            .map_or("", |at| &chain[at..]);
        innermost.starts_with(&opening) && line[chain_end..].contains(": close")
    })
}

#[test]
fn rust_log_debug_prints_the_spans_with_session_and_thread_ids_and_nothing_on_stdout() {
    let sandbox = Sandbox::new();
    let (stdout, stderr) = sandbox.ok(Some("debug"), &["chat", "--session", "s1", "hello"]);
    assert_eq!(stdout, "echo: hello\n", "the reply alone on stdout");
    let thread = sandbox.thread_of("s1");
    for span in [
        "rethread.open",
        "rethread.lease",
        "rethread.turn",
        "rethread.commit",
    ] {
        let lines = span_lines(&stderr, span);
        assert!(!lines.is_empty(), "no {span} in:\n{stderr}");
        assert!(
            lines.iter().all(|l| l.contains("session_id=s1")),
            "{span}: {lines:#?}"
        );
    }
    for span in ["rethread.open", "rethread.turn", "rethread.commit"] {
        let closed =
            closed_line(&stderr, span).unwrap_or_else(|| panic!("{span} never closed:\n{stderr}"));
        assert!(closed.contains(&thread), "{span}: {closed}");
        assert!(closed.contains("outcome="), "{span}: {closed}");
    }
    let open = closed_line(&stderr, "rethread.open").unwrap();
    assert!(open.contains("outcome=\"started\""), "{open}");
    assert!(stderr.contains("opening the store"), "{stderr}");

    // The next invocation resumes: its resume span says so.
    let (_, stderr) = sandbox.ok(Some("debug"), &["chat", "--session", "s1", "again"]);
    let resume = closed_line(&stderr, "rethread.resume")
        .unwrap_or_else(|| panic!("no resume span:\n{stderr}"));
    assert!(
        resume.contains(&thread) && resume.contains("outcome=\"resumed\""),
        "{resume}"
    );
}

#[test]
fn warnings_only_by_default_then_info_with_v_and_debug_with_vv() {
    let sandbox = Sandbox::new();
    let (stdout, quiet) = sandbox.ok(None, &["chat", "--session", "s1", "one"]);
    assert_eq!(stdout, "echo: one\n");
    assert!(span_lines(&quiet, "rethread.open").is_empty(), "{quiet}");
    assert!(
        !quiet.contains(" INFO ") && !quiet.contains(" DEBUG "),
        "{quiet}"
    );

    // -v: info, the spans as they close; -v works after the command too.
    let (_, info) = sandbox.ok(None, &["chat", "-v", "--session", "s1", "two"]);
    assert!(!span_lines(&info, "rethread.open").is_empty(), "{info}");
    assert!(info.contains(" INFO "), "{info}");
    assert!(!info.contains(" DEBUG "), "{info}");

    let (_, debug) = sandbox.ok(None, &["-vv", "chat", "--session", "s1", "three"]);
    assert!(debug.contains(" DEBUG "), "{debug}");

    // RUST_LOG decides over -v.
    let (_, off) = sandbox.ok(Some("off"), &["-vv", "chat", "--session", "s1", "four"]);
    assert_eq!(off, "", "{off}");
}

#[test]
fn log_format_json_writes_one_object_per_line_on_stderr_and_stdout_stays_json() {
    let sandbox = Sandbox::new();
    let (stdout, stderr) = sandbox.ok(
        None,
        &[
            "--log-format",
            "json",
            "-v",
            "chat",
            "--json",
            "--session",
            "s1",
            "hello",
        ],
    );
    let reply: Value = serde_json::from_str(&stdout).expect("stdout is exactly one JSON object");
    assert_eq!(reply["reply"], "echo: hello");
    let thread = reply["thread_id"].as_str().unwrap();
    let lines: Vec<Value> = stderr
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let open = lines
        .iter()
        .find(|l| l["span"]["name"] == "rethread.open")
        .unwrap_or_else(|| panic!("no open span in {stderr}"));
    assert_eq!(open["level"], "INFO");
    assert_eq!(open["span"]["session_id"], "s1");
    assert_eq!(open["span"]["thread_id"], thread);
    assert_eq!(open["span"]["outcome"], "started");
    let commit = lines
        .iter()
        .find(|l| l["span"]["name"] == "rethread.commit")
        .unwrap_or_else(|| panic!("no commit span in {stderr}"));
    assert_eq!(commit["span"]["outcome"], "published");
    // The commit ran inside the turn: the span list names both.
    let names: Vec<&str> = commit["spans"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert!(names.contains(&"rethread.turn"), "{commit}");
}

#[test]
fn a_bad_log_format_is_a_usage_error_and_a_bad_rust_log_only_a_warning() {
    let sandbox = Sandbox::new();
    let out = sandbox.run(None, &["--log-format", "yaml", "sessions", "list"]);
    assert_eq!(out.status.code(), Some(2), "{}", texts(&out).1);
    // The warning comes whatever the command does next (here: no store yet, exit 1).
    let out = sandbox.run(Some("=[nonsense"), &["sessions", "list"]);
    let stderr = texts(&out).1;
    assert!(stderr.contains("RUST_LOG"), "{stderr}");
    assert!(stderr.contains("not a valid filter"), "{stderr}");
}

/// The password of a store URL reaches no log line, at any level.
#[test]
fn no_log_level_prints_a_store_password() {
    let sandbox = Sandbox::new();
    // Nothing listens on port 9 of loopback: the connection is refused at once.
    let url = "postgres://alice:PASSWORD@127.0.0.1:9/db";
    for (rust_log, flags) in [(None, "-vvv"), (Some("trace"), "-v")] {
        let out = sandbox.run(rust_log, &[flags, "--store", url, "sessions", "list"]);
        let (stdout, stderr) = texts(&out);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("opening the store"), "{stderr}");
        assert!(stderr.contains("alice"), "{stderr}");
        assert!(
            !stderr.contains("PASSWORD") && !stdout.contains("PASSWORD"),
            "{stdout}{stderr}"
        );
    }
}
