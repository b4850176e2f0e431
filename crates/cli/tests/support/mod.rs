//! What the `rethread` binary's process tests share.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `rethread` binary under test.
pub fn rethread() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_rethread"))
}

/// The `fake-codex` binary: built by `cargo test --workspace` beside ours; built on demand
/// when only this package is tested.
pub fn fake_codex() -> PathBuf {
    let ours = rethread();
    let fake = ours.with_file_name("fake-codex");
    if !fake.is_file() {
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
    }
    fake
}
