//! Replays every saved input of the fuzz targets `merge_patch`, `store_files` (`fuzz/regressions/<target>/`:
//! crashes found so far, and a few seeds) through the same property harness the target runs
//! (`crates/testkit/src/fuzz/<target>.rs`). See docs/fuzzing.md.

use rethread_testkit::fuzz::replay::replay;
use rethread_testkit::fuzz::{merge_patch, store_files};

#[test]
fn merge_patch_saved_inputs_hold() {
    replay("merge_patch", merge_patch::run);
}

#[test]
fn store_files_saved_inputs_hold() {
    replay("store_files", store_files::run);
}
