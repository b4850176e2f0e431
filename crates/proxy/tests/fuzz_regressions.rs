//! Replays every saved input of the fuzz target `proxy_routing` (`fuzz/regressions/<target>/`:
//! crashes found so far, and a few seeds) through the same property harness the target runs
//! (`fuzz/src/<target>.rs`, compiled in here with `#[path]`). See docs/fuzzing.md.

#[path = "../../../fuzz/src/input.rs"]
mod input;
#[path = "../../../fuzz/src/proxy_routing.rs"]
mod proxy_routing;
#[path = "../../../fuzz/src/replay.rs"]
mod replay;
use replay::replay;

#[test]
fn proxy_routing_saved_inputs_hold() {
    replay("proxy_routing", proxy_routing::run);
}
