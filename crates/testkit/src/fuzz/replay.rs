//! Replays saved fuzz inputs as plain tests (each crate's `tests/fuzz_regressions.rs`).

use std::path::{Path, PathBuf};

/// The saved inputs of `target` (`fuzz/regressions/<target>/`), sorted by name.
fn saved_inputs(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/regressions")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no saved inputs in {}", dir.display());
    files
}

/// Runs every saved input of `target` through its property harness `run`.
pub fn replay(target: &str, run: fn(&[u8])) {
    for path in saved_inputs(target) {
        let bytes = std::fs::read(&path).expect("read a saved input");
        eprintln!("replaying {}", path.display());
        run(&bytes);
    }
}
