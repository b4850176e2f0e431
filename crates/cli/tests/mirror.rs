//! The rollout mirror through the `rethread` binary, on the `fake-codex` binary: a lost
//! rollout and a move to another `CODEX_HOME` resume the same thread with its memory;
//! `doctor` reports such a thread `restorable` (`gone` with mirroring off); `migrate` copies
//! the mirror, `verify` checks it, `sessions forget` removes it; `--no-mirror` and
//! `RETHREAD_MIRROR=off` turn it off, and a `RETHREAD_MIRROR` that is neither `on` nor `off` is
//! a usage error.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rethread_testkit::real::rollout_files;
use serde_json::Value;
use support::{fake_codex, rethread};

/// A store shared by several machines, each a `CODEX_HOME`.
struct Fleet {
    dir: tempfile::TempDir,
}

impl Fleet {
    fn new() -> Fleet {
        Fleet {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn home(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn store(&self) -> String {
        format!("sqlite:{}", self.dir.path().join("store.sqlite").display())
    }

    fn run(&self, home: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut command = Command::new(rethread());
        command
            .args(args)
            .env("RETHREAD_STORE", self.store())
            .env("RETHREAD_CODEX_BIN", fake_codex())
            .env("CODEX_HOME", self.home(home))
            .env("RUST_LOG", "error")
            .env_remove("RETHREAD_MIRROR")
            .env_remove("FAKE_CODEX_PROFILE");
        for (key, value) in env {
            command.env(key, value);
        }
        command.output().unwrap()
    }

    fn json(&self, home: &str, args: &[&str], env: &[(&str, &str)]) -> Value {
        let out = self.run(home, args, env);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{args:?} ({e}): {} {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    fn chat(&self, home: &str, message: &str, extra: &[&str], env: &[(&str, &str)]) -> Value {
        let mut args = vec!["chat", "--session", "s1", "--json"];
        args.extend_from_slice(extra);
        args.push(message);
        let report = self.json(home, &args, env);
        assert!(report.get("error").is_none(), "{report}");
        report
    }

    /// What the fake's model saw last on `home`.
    fn model_saw(&self, home: &str, word: &str) -> bool {
        let log = std::fs::read_to_string(self.home(home).join("fake-model-requests.jsonl"))
            .unwrap_or_default();
        log.lines().last().is_some_and(|line| line.contains(word))
    }
}

fn delete_rollouts(home: &Path) {
    let files = rollout_files(home);
    assert!(!files.is_empty());
    for file in files {
        std::fs::remove_file(file).unwrap();
    }
}

#[test]
fn a_lost_rollout_and_a_move_to_another_home_resume_the_same_thread() {
    let fleet = Fleet::new();
    let first = fleet.chat("a", "remember PAPAYA", &[], &[]);
    assert_eq!(first["outcome"], "started");
    delete_rollouts(&fleet.home("a"));
    let second = fleet.chat("a", "what was it?", &[], &[]);
    assert_eq!(second["outcome"], "resumed", "{second}");
    assert_eq!(second["thread_id"], first["thread_id"]);
    assert_eq!(second["notices"], serde_json::json!([]));
    assert!(fleet.model_saw("a", "PAPAYA"));
    // Another machine: a home that never saw the thread.
    let third = fleet.chat("b", "and now?", &[], &[]);
    assert_eq!(third["outcome"], "resumed", "{third}");
    assert_eq!(third["thread_id"], first["thread_id"]);
    assert!(fleet.model_saw("b", "PAPAYA") && fleet.model_saw("b", "what was it?"));
}

#[test]
fn without_the_mirror_a_lost_rollout_falls_back() {
    for (flag, env) in [
        (&["--no-mirror"][..], &[][..]),
        (&[][..], &[("RETHREAD_MIRROR", "off")][..]),
    ] {
        let fleet = Fleet::new();
        fleet.chat("a", "remember PAPAYA", flag, env);
        let verified = fleet.json("a", &["verify", "--json"], &[]);
        assert_eq!(verified["mirror_files"], 0, "{verified}");
        delete_rollouts(&fleet.home("a"));
        let second = fleet.chat("a", "what was it?", flag, env);
        assert_eq!(second["outcome"], "fell_back", "{second}");
    }
}

#[test]
fn a_mirror_setting_that_is_neither_on_nor_off_is_a_usage_error() {
    let fleet = Fleet::new();
    let out = fleet.run(
        "a",
        &["chat", "--session", "s1", "hi"],
        &[("RETHREAD_MIRROR", "maybe")],
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("RETHREAD_MIRROR"));
    let out = fleet.run(
        "a",
        &["app-server"],
        &[("RETHREAD_MIRROR", "maybe"), ("RETHREAD_SESSION", "s1")],
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !Path::new(&fleet.dir.path().join("store.sqlite")).exists(),
        "nothing created"
    );
}

#[test]
fn doctor_reports_a_thread_gone_here_but_mirrored_as_restorable() {
    let fleet = Fleet::new();
    fleet.chat("a", "remember PAPAYA", &[], &[]);
    let out = fleet.run("b", &["doctor", "--json"], &[]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report["bindings"][0]["status"], "restorable", "{report}");
    assert_eq!(report["summary"]["restorable"], 1);
    assert_eq!(report["all_live"], true);
    assert!(
        rollout_files(&fleet.home("b")).is_empty(),
        "doctor restores nothing"
    );
    // Not mirrored: gone.
    let plain = Fleet::new();
    plain.chat("a", "remember PAPAYA", &["--no-mirror"], &[]);
    let out = plain.run("b", &["doctor", "--json"], &[]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert_eq!(report["bindings"][0]["status"], "gone", "{report}");
}

/// A mirror `verify` finds damaged cannot be restored: `doctor` checks the thread's mirrored
/// files as the store's checker does and reports the binding `gone` (exit 1), as the next
/// turn then falls back.
#[test]
fn doctor_reports_a_damaged_mirror_as_not_restorable() {
    let fleet = Fleet::new();
    fleet.chat("a", "remember PAPAYA", &[], &[]);
    let path = fleet.dir.path().join("store.sqlite");
    let conn = rusqlite::Connection::open(&path).unwrap();
    let changed = conn
        .execute(
            "UPDATE mirror_chunks SET bytes = zeroblob(length(bytes)) WHERE seq = 0",
            [],
        )
        .unwrap();
    assert_eq!(changed, 1);
    drop(conn);
    assert_eq!(fleet.run("b", &["verify"], &[]).status.code(), Some(1));
    let out = fleet.run("b", &["doctor", "--json"], &[]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["bindings"][0]["status"], "gone", "{report}");
    assert_eq!(report["summary"]["restorable"], 0, "{report}");
    assert_eq!(report["all_live"], false, "{report}");
    assert_eq!(out.status.code(), Some(1), "{report}");
    let detail = report["bindings"][0]["detail"].as_str().unwrap();
    assert!(detail.contains("damaged"), "{detail}");
    // ... and the next turn there does what doctor said: a new thread.
    let next = fleet.chat("b", "what was it?", &[], &[]);
    assert_eq!(next["outcome"], "fell_back", "{next}");
}

/// With mirroring off the next open restores nothing, so `doctor` says what that open will
/// do: a thread gone from this home is `gone` (exit 1) even when the store mirrors it.
#[test]
fn with_mirroring_off_doctor_reports_a_mirrored_thread_gone_here_as_gone() {
    let fleet = Fleet::new();
    fleet.chat("a", "remember PAPAYA", &[], &[]);
    let off = [("RETHREAD_MIRROR", "off")];
    let out = fleet.run("b", &["doctor", "--json"], &off);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["bindings"][0]["status"], "gone", "{report}");
    assert_eq!(report["summary"]["restorable"], 0, "{report}");
    assert_eq!(report["all_live"], false, "{report}");
    assert_eq!(out.status.code(), Some(1), "{report}");
    let detail = report["bindings"][0]["detail"].as_str().unwrap();
    assert!(detail.contains("RETHREAD_MIRROR=off"), "{detail}");
    // A setting that is neither on nor off is refused here too.
    let out = fleet.run("b", &["doctor"], &[("RETHREAD_MIRROR", "maybe")]);
    assert_eq!(out.status.code(), Some(2));
    // ... and the next turn there does what doctor said: a new thread.
    let next = fleet.chat("b", "what was it?", &[], &off);
    assert_eq!(next["outcome"], "fell_back", "{next}");
}

#[test]
fn migrate_copies_the_mirror_verify_checks_it_and_forget_removes_it() {
    let fleet = Fleet::new();
    fleet.chat("a", "remember PAPAYA", &[], &[]);
    let verified = fleet.json("a", &["verify", "--json"], &[]);
    assert_eq!(verified["ok"], true, "{verified}");
    assert_eq!(verified["mirror_files"], 1, "{verified}");
    let rollout = std::fs::read(&rollout_files(&fleet.home("a"))[0]).unwrap();
    assert_eq!(verified["mirror_bytes"], rollout.len() as u64);

    let copy = format!("redb:{}", fleet.dir.path().join("copy.redb").display());
    let migrated = fleet.json(
        "a",
        &["migrate", "--from", &fleet.store(), "--to", &copy, "--json"],
        &[],
    );
    assert_eq!(
        migrated["mirror_bytes_copied"],
        rollout.len() as u64,
        "{migrated}"
    );
    // A machine on the copy resumes the thread from the copied mirror.
    let resumed = fleet.json(
        "c",
        &[
            "chat",
            "--session",
            "s1",
            "--json",
            "--store",
            &copy,
            "still PAPAYA?",
        ],
        &[],
    );
    assert_eq!(resumed["outcome"], "resumed", "{resumed}");

    let forgot = fleet.json("a", &["sessions", "forget", "s1", "--json"], &[]);
    assert_eq!(forgot["forgot"], "s1");
    let verified = fleet.json("a", &["verify", "--json"], &[]);
    assert_eq!(
        (
            verified["mirror_files"].clone(),
            verified["mirror_bytes"].clone()
        ),
        (serde_json::json!(0), serde_json::json!(0)),
        "{verified}"
    );
}

/// Issue 41, item 8: on a home whose `sessions/` (or a folder below it) is a link, the
/// restore is refused (it never writes through a link) and the open ended "retry later"
/// (exit 75) on every run for as long as the link stayed: a link does not pass by itself. The
/// open now stops for good (exit 1, the link named, nothing written through it, the binding
/// kept and no thread given up), and once the link is removed the thread resumes.
#[cfg(unix)]
#[test]
fn a_link_in_the_restores_way_is_refused_for_good_never_retry_later() {
    for linked in ["sessions", "sessions/2026"] {
        let fleet = Fleet::new();
        let first = fleet.chat("a", "remember PAPAYA", &[], &[]);
        let thread = first["thread_id"].as_str().unwrap().to_string();
        let outside = tempfile::tempdir().unwrap();
        let link = fleet.home("b").join(linked);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(outside.path(), &link).unwrap();
        for _ in 0..2 {
            let out = fleet.run("b", &["chat", "--session", "s1", "what was it?"], &[]);
            let said = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{linked}: {said}");
            assert!(said.contains("link"), "{linked}: {said}");
            assert!(
                !said.contains("could not be resumed; starting a new one"),
                "{linked}: {said}"
            );
        }
        let written: Vec<_> = walk(outside.path());
        assert!(
            written.is_empty(),
            "{linked}: through the link: {written:?}"
        );
        let shown = fleet.json("b", &["sessions", "show", "s1", "--json"], &[]);
        assert_eq!(shown["thread_id"], thread.as_str(), "the binding is kept");
        assert_eq!(shown["retired_threads"], serde_json::json!([]));
        std::fs::remove_file(&link).unwrap();
        let after = fleet.chat("b", "and now?", &[], &[]);
        assert_eq!(after["outcome"], "resumed", "{after}");
        assert_eq!(after["thread_id"], thread.as_str());
        assert!(fleet.model_saw("b", "PAPAYA"));
    }
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            match path.is_dir() {
                true => dirs.push(path),
                false => files.push(path),
            }
        }
    }
    files
}
