//! Replays every saved input of the fuzz targets `fake_appserver` (`fuzz/regressions/<target>/`:
//! crashes found so far, and a few seeds) through the same property harness the target runs
//! (`fuzz/src/<target>.rs`, compiled in here with `#[path]`). See docs/fuzzing.md.

#[path = "../../../fuzz/src/fake_appserver.rs"]
mod fake_appserver;
#[path = "../../../fuzz/src/input.rs"]
mod input;
#[path = "../../../fuzz/src/replay.rs"]
mod replay;
use replay::replay;

#[test]
fn fake_appserver_saved_inputs_hold() {
    replay("fake_appserver", fake_appserver::run);
}
