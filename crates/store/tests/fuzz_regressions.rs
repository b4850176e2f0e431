//! Replays every saved input of the fuzz targets `merge_patch`, `store_files` (`fuzz/regressions/<target>/`:
//! crashes found so far, and a few seeds) through the same property harness the target runs
//! (`fuzz/src/<target>.rs`, compiled in here with `#[path]`). See docs/fuzzing.md.

#[path = "../../../fuzz/src/input.rs"]
mod input;
#[path = "../../../fuzz/src/merge_patch.rs"]
mod merge_patch;
#[path = "../../../fuzz/src/store_files.rs"]
mod store_files;

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
fn merge_patch_saved_inputs_hold() {
    replay("merge_patch", merge_patch::run);
}

#[test]
fn store_files_saved_inputs_hold() {
    replay("store_files", store_files::run);
}

/// Damage SQLite cannot see yet (it keeps no checksums, so a flipped value reads back
/// changed): the inputs under
/// `fuzz/findings/store_files/` hold only with the strict property, which fails today. Run
/// with `cargo test -p rethread-store --test fuzz_regressions -- --ignored` once SQLite
/// stores verify themselves on open (docs/fuzzing.md, "Known limits").
#[test]
#[ignore = "open finding: SQLite keeps no checksums, a flipped value reads back changed"]
fn store_files_open_findings_hold_strictly() {
    std::env::set_var("RETHREAD_FUZZ_STORE_STRICT", "1");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/findings/store_files");
    for entry in std::fs::read_dir(&dir).expect("findings") {
        let path = entry.expect("entry").path();
        eprintln!("replaying {}", path.display());
        store_files::run(&std::fs::read(&path).expect("read"));
    }
}
