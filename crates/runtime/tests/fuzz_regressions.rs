//! Replays every saved input of the fuzz targets `runtime_hostile` (`fuzz/regressions/<target>/`:
//! crashes found so far, and a few seeds) through the same property harness the target runs
//! (`crates/testkit/src/fuzz/<target>.rs`). See docs/fuzzing.md.

use rethread_testkit::fuzz::replay::replay;
use rethread_testkit::fuzz::runtime_hostile;

use std::path::Path;

#[test]
fn runtime_hostile_saved_inputs_hold() {
    replay("runtime_hostile", runtime_hostile::run);
}

/// The seeds are honest servers: they must reach the deep states (a resumed, started or
/// fallen-back session whose turn is published), or the target would fuzz only the surface.
#[test]
fn honest_seeds_publish_their_turns() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions/runtime_hostile");
    for (name, opens) in [
        ("seed-honest-bound0-gone0", ["started", "resumed"]),
        ("seed-honest-bound1-gone0", ["resumed", "resumed"]),
        ("seed-honest-bound1-gone1", ["fell_back", "resumed"]),
    ] {
        let bytes = std::fs::read(dir.join(name)).expect("seed");
        let outcome = runtime_hostile::run_outcome(&bytes);
        assert_eq!(outcome.opens, opens, "{name}");
        assert_eq!(outcome.published.len(), 2, "{name}: {outcome:?}");
    }
}
