//! A command that only reads changes nothing in or beside the store, whoever runs it: a user
//! who can read the SQLite store but not write it (`sessions list`, `doctor`'s store side)
//! leaves no `-wal` or `-shm` file beside it, so its owner's next `chat` still writes.
//!
//! As root the reader and the owner are two other users (`setpriv`); otherwise the reader is
//! this user on a store file made read-only for the read.

#![cfg(unix)]

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

use support::{fake_codex, rethread};

/// The owner and the reader, as root runs them.
const OWNER: u32 = 65534;
const READER: u32 = 65533;

fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// `rethread args` as `uid` (when root), with the store, the fake codex and its home.
fn run(uid: u32, dir: &Path, args: &[&str]) -> Output {
    let mut cmd = if is_root() {
        let mut cmd = Command::new("setpriv");
        cmd.args([
            format!("--reuid={uid}"),
            format!("--regid={uid}"),
            "--clear-groups".to_string(),
        ])
        .arg(rethread());
        cmd
    } else {
        Command::new(rethread())
    };
    cmd.args(args)
        .current_dir(dir)
        .env(
            "RETHREAD_STORE",
            format!("sqlite:{}", dir.join("s.db").display()),
        )
        .env("RETHREAD_CODEX_BIN", fake_codex())
        .env("CODEX_HOME", dir.join("home"))
        .env("HOME", dir)
        .env("RUST_LOG", "error")
        .env_remove("FAKE_CODEX_PROFILE");
    cmd.output().unwrap()
}

fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The names in `dir` beside the store's own file.
fn beside_store(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("s.db"))
        .collect();
    names.sort();
    names
}

#[test]
fn a_reader_who_cannot_write_the_store_leaves_nothing_beside_it() {
    if is_root() && Command::new("setpriv").arg("--help").output().is_err() {
        panic!("root runs this test through setpriv, which is missing");
    }
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path();
    // Everyone may create files in the folder, as in a shared one.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    if is_root() {
        std::os::unix::fs::chown(dir, Some(OWNER), Some(OWNER)).unwrap();
    }
    let chat = ["chat", "--session", "s", "hello"];
    ok(run(OWNER, dir, &chat), "the owner's first chat");
    assert_eq!(beside_store(dir), ["s.db"]);
    // The reader may read the store and not write it.
    let store = dir.join("s.db");
    let mode = if is_root() { 0o644 } else { 0o444 };
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(mode)).unwrap();

    for read in [
        &["sessions", "list"][..],
        &["sessions", "show", "s"],
        &["verify"],
    ] {
        let out = ok(run(READER, dir, read), &format!("{read:?}"));
        assert!(!out.stdout.is_empty(), "{read:?} printed nothing");
        assert_eq!(
            beside_store(dir),
            ["s.db"],
            "{read:?} left files beside the store"
        );
    }

    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o644)).unwrap();
    ok(run(OWNER, dir, &chat), "the owner's chat after the reads");
    let out = ok(
        run(OWNER, dir, &["sessions", "show", "s", "--json"]),
        "show",
    );
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["row_count"], 4, "{shown}");
}
