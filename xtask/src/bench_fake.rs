//! `cargo xtask bench fake [--seconds S]`: request throughput of the in-process fake
//! app-server (see `docs/benchmarks.md`). Runs the `bench_fake` example of
//! `rethread-fake-appserver` in release mode.

use crate::util;

pub(crate) fn run(extra: &[String]) -> Result<(), String> {
    util::run_example("rethread-fake-appserver", &[], "bench_fake", extra)
}
