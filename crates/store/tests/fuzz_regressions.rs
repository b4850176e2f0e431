//! Replays every saved input of the fuzz targets `merge_patch`, `store_files` (`fuzz/regressions/<target>/`:
//! crashes found so far, and a few seeds) through the same property harness the target runs
//! (`fuzz/src/<target>.rs`, compiled in here with `#[path]`). See docs/fuzzing.md.

#[path = "../../../fuzz/src/input.rs"]
mod input;
#[path = "../../../fuzz/src/replay.rs"]
mod replay;
use replay::replay;
#[path = "../../../fuzz/src/merge_patch.rs"]
mod merge_patch;
#[path = "../../../fuzz/src/store_files.rs"]
mod store_files;

use std::path::Path;

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
