//! Replays every saved input of the fuzz target `proxy_routing` (`fuzz/regressions/<target>/`:
//! crashes found so far, and a few seeds) through the same property harness the target runs
//! (`crates/testkit/src/fuzz/<target>.rs`). See docs/fuzzing.md.

use rethread_testkit::fuzz::proxy_routing;
use rethread_testkit::fuzz::replay::replay;

#[test]
fn proxy_routing_saved_inputs_hold() {
    replay("proxy_routing", proxy_routing::run);
}
