//! Replays every saved input of the fuzz targets `framing` (`fuzz/regressions/<target>/`:
//! crashes found so far, and a few seeds) through the same property harness the target runs
//! (`crates/testkit/src/fuzz/<target>.rs`). See docs/fuzzing.md.

use rethread_testkit::fuzz::framing;
use rethread_testkit::fuzz::replay::replay;

#[test]
fn framing_saved_inputs_hold() {
    replay("framing", framing::run);
}
