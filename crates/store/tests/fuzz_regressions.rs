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

#[test]
fn merge_patch_saved_inputs_hold() {
    replay("merge_patch", merge_patch::run);
}

#[test]
fn store_files_saved_inputs_hold() {
    replay("store_files", store_files::run);
}
