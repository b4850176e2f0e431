//! Replays every saved input of the fuzz targets `framing` (`fuzz/regressions/<target>/`:
//! crashes found so far, and a few seeds) through the same property harness the target runs
//! (`fuzz/src/<target>.rs`, compiled in here with `#[path]`). See docs/fuzzing.md.

#[path = "../../../fuzz/src/framing.rs"]
mod framing;
#[path = "../../../fuzz/src/input.rs"]
mod input;
#[path = "../../../fuzz/src/replay.rs"]
mod replay;
use replay::replay;

#[test]
fn framing_saved_inputs_hold() {
    replay("framing", framing::run);
}
