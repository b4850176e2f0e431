//! Replays every saved input of the fuzz targets `fake_appserver` (`fuzz/regressions/<target>/`:
//! crashes found so far, and a few seeds) through the same property harness the target runs
//! (`crates/testkit/src/fuzz/<target>.rs`). See docs/fuzzing.md.

use rethread_testkit::fuzz::fake_appserver;
use rethread_testkit::fuzz::replay::replay;

#[test]
fn fake_appserver_saved_inputs_hold() {
    replay("fake_appserver", fake_appserver::run);
}
