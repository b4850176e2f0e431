//! Issue 22, `doctor`: it starts no codex when there is nothing to probe, its probe never makes
//! codex warn (0.171.0 says full-history reads of paginated threads are deprecated), and every
//! verdict is still told: `live`, `gone`, `incompatible`, `unreadable`, `busy` (and `error`,
//! in `cli.rs`). Against the `fake-codex` binary, which imitates 0.171.0's notice.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rethread_testkit::real::rollout_files;
use serde_json::Value;
use support::{fake_codex, rethread};

/// A store and a CODEX_HOME of their own; `env` is added to every command.
struct Sandbox {
    dir: tempfile::TempDir,
    env: Vec<(&'static str, String)>,
}

impl Sandbox {
    fn new() -> Sandbox {
        Sandbox {
            dir: tempfile::tempdir().unwrap(),
            env: Vec::new(),
        }
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("codex-home")
    }

    fn store(&self) -> String {
        format!("sqlite:{}", self.dir.path().join("store.sqlite").display())
    }

    fn run(&self, args: &[&str]) -> Output {
        let mut command = Command::new(rethread());
        command
            .args(args)
            .env("RETHREAD_STORE", self.store())
            .env("RETHREAD_CODEX_BIN", fake_codex())
            .env("CODEX_HOME", self.home())
            .env_remove("RUST_LOG")
            .env_remove("FAKE_CODEX_PROFILE")
            .env_remove("FAKE_CODEX_FAULTS");
        for (key, value) in &self.env {
            command.env(key, value);
        }
        command.output().unwrap()
    }

    /// `chat` one turn for `session` under the fake's `profile`, without the rollout mirror
    /// (a deleted rollout is then gone, not restorable: `tests/mirror.rs` has the mirror);
    /// its thread id.
    fn chat(&self, session: &str, profile: &str) -> String {
        let mut command = Command::new(rethread());
        command
            .args(["chat", "--json", "--session", session, "hello"])
            .env("RETHREAD_MIRROR", "off")
            .env("RETHREAD_STORE", self.store())
            .env("RETHREAD_CODEX_BIN", fake_codex())
            .env("CODEX_HOME", self.home())
            .env("RUST_LOG", "off")
            .env("FAKE_CODEX_PROFILE", profile)
            .env_remove("FAKE_CODEX_FAULTS");
        let out = command.output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
        reply["thread_id"].as_str().unwrap().to_string()
    }

    fn rollout(&self, thread: &str) -> PathBuf {
        let found: Vec<PathBuf> = rollout_files(&self.home())
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(thread))
            .collect();
        assert_eq!(found.len(), 1, "{found:?}");
        found[0].clone()
    }

    /// `doctor --json --jobs 1`: each session's verdict, and stderr.
    fn verdicts(&self) -> (Vec<(String, String)>, String) {
        let out = self.run(&["doctor", "--json", "--jobs", "1"]);
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stderr)));
        let verdicts = report["bindings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b["session"].as_str().unwrap().to_string(),
                    b["status"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        (verdicts, text(&out.stderr))
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(s, v)| (s.to_string(), v.to_string()))
        .collect()
}

/// A "codex" that leaves a mark when it is started, and fails.
fn marking_codex(dir: &Path) -> (PathBuf, PathBuf) {
    let mark = dir.join("codex-was-started");
    let script = dir.join("marking-codex");
    std::fs::write(
        &script,
        format!("#!/bin/sh\ntouch '{}'\nexit 1\n", mark.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (script, mark)
}

#[test]
fn doctor_with_nothing_to_probe_starts_no_codex() {
    let mut sandbox = Sandbox::new();
    // An empty store (doctor only reads: it never creates one).
    let out = sandbox.run(&["migrate", "--from", "memory:", "--to", &sandbox.store()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (codex, mark) = marking_codex(sandbox.dir.path());
    sandbox
        .env
        .push(("RETHREAD_CODEX_BIN", codex.display().to_string()));
    for args in [&["doctor"][..], &["doctor", "--json"]] {
        let out = sandbox.run(args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        assert!(
            !mark.exists(),
            "{args:?} started codex with nothing to probe"
        );
    }
    let out = sandbox.run(&["doctor", "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["total"], 0);
    assert_eq!(report["all_live"], true);
    // Nor does it need one installed.
    sandbox.env.pop();
    sandbox
        .env
        .push(("RETHREAD_CODEX_BIN", "/nonexistent/codex".to_string()));
    let out = sandbox.run(&["doctor"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("0 binding(s)"),
        "{}",
        text(&out.stdout)
    );
}

/// A paginated thread probed by a codex that warns about full-history reads (0.171.0, and the
/// fake imitating it): the probe reads its turns the way codex asks, so nothing is warned.
#[test]
fn doctor_probes_make_codex_warn_of_nothing() {
    let sandbox = Sandbox::new();
    sandbox.chat("paginated", "current");
    for args in [&["doctor"][..], &["doctor", "--json"], &["-v", "doctor"]] {
        let out = sandbox.run(args);
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{args:?}: {stderr}");
        assert!(
            !stderr.to_lowercase().contains("deprecat"),
            "{args:?}: {stderr}"
        );
    }
}

/// Every verdict but `error` (tested in `cli.rs`) from one report, under the older profile
/// (0.144.6): live (legacy), gone, incompatible (a paginated thread), unreadable, busy.
#[test]
fn doctor_tells_each_verdict() {
    let mut sandbox = Sandbox::new();
    sandbox.chat("a-busy", "release-n");
    let gone = sandbox.chat("b-gone", "release-n");
    sandbox.chat("c-incompatible", "current");
    let unreadable = sandbox.chat("d-unreadable", "release-n");
    sandbox.chat("e-live", "release-n");
    std::fs::remove_file(sandbox.rollout(&gone)).unwrap();
    std::fs::write(sandbox.rollout(&unreadable), b"garbage{{{ not json\n").unwrap();
    sandbox.env.push(("FAKE_CODEX_PROFILE", "release-n".into()));
    // The first probe (`a-busy`, with --jobs 1 in session order) is answered "overloaded".
    sandbox.env.push((
        "FAKE_CODEX_FAULTS",
        r#"{"faults": [{"kind": "overloaded", "method": "thread/read", "attempts": 1}]}"#.into(),
    ));
    let (verdicts, stderr) = sandbox.verdicts();
    assert_eq!(
        verdicts,
        pairs(&[
            ("a-busy", "busy"),
            ("b-gone", "gone"),
            ("c-incompatible", "incompatible"),
            ("d-unreadable", "unreadable"),
            ("e-live", "live"),
        ]),
        "{stderr}"
    );
}

/// A legacy thread whose rollout was deleted: 0.169+ still answer a metadata `thread/read`
/// from their index, but its turns are gone and so is the thread for a resume.
#[test]
fn a_legacy_thread_whose_rollout_was_deleted_is_gone() {
    let sandbox = Sandbox::new();
    let lost = sandbox.chat("lost", "release-n");
    sandbox.chat("kept", "release-n");
    std::fs::remove_file(sandbox.rollout(&lost)).unwrap();
    let (verdicts, stderr) = sandbox.verdicts();
    assert_eq!(
        verdicts,
        pairs(&[("kept", "live"), ("lost", "gone")]),
        "{stderr}"
    );
}
