//! What the `rethread` binary's process tests share.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::Command;

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
