//! The cargo-fuzz targets of rethread (see `docs/fuzzing.md`). Their property harnesses live in
//! `rethread_testkit::fuzz` (`crates/testkit/src/fuzz/`), where each crate's
//! `tests/fuzz_regressions.rs` replays the saved inputs too.
#![forbid(unsafe_code)]

pub use rethread_testkit::fuzz::*;
