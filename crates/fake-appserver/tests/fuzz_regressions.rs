//! Replays every saved input of the fuzz targets `fake_appserver` (`fuzz/regressions/<target>/`:
//! crashes found so far, and a few seeds) through the same property harness the target runs
//! (`fuzz/src/<target>.rs`, compiled in here with `#[path]`). See docs/fuzzing.md.

#[path = "../../../fuzz/src/fake_appserver.rs"]
mod fake_appserver;
#[path = "../../../fuzz/src/input.rs"]
mod input;

use std::path::{Path, PathBuf};

/// The saved inputs of `target`, sorted by name.
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

fn replay(target: &str, run: fn(&[u8])) {
    for path in saved_inputs(target) {
        let bytes = std::fs::read(&path).expect("read a saved input");
        eprintln!("replaying {}", path.display());
        run(&bytes);
    }
}

#[test]
fn fake_appserver_saved_inputs_hold() {
    replay("fake_appserver", fake_appserver::run);
}
