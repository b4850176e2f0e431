//! Replays every saved input of the fuzz targets `runtime_hostile` (`fuzz/regressions/<target>/`:
//! crashes found so far, and a few seeds) through the same property harness the target runs
//! (`fuzz/src/<target>.rs`, compiled in here with `#[path]`). See docs/fuzzing.md.

#[path = "../../../fuzz/src/input.rs"]
mod input;
#[path = "../../../fuzz/src/runtime_hostile.rs"]
mod runtime_hostile;

use std::path::{Path, PathBuf};

/// The saved inputs of `target`, sorted by name.
fn saved_inputs(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/regressions")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no saved inputs in {}", dir.display());
    files
}

fn replay(target: &str, run: fn(&[u8])) {
    for path in saved_inputs(target) {
        let bytes = std::fs::read(&path).expect("read a saved input");
        eprintln!("replaying {}", path.display());
        run(&bytes);
    }
}

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
        ("seed-honest-bound0-gone0", ["started", "started"]),
        ("seed-honest-bound1-gone0", ["resumed", "started"]),
        ("seed-honest-bound1-gone1", ["fell_back", "started"]),
    ] {
        let bytes = std::fs::read(dir.join(name)).expect("seed");
        let outcome = runtime_hostile::run_outcome(&bytes);
        assert_eq!(outcome.opens, opens, "{name}");
        assert_eq!(outcome.published.len(), 2, "{name}: {outcome:?}");
    }
}
