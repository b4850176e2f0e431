//! `cargo xtask bench fake [--seconds S]`: request throughput of the in-process fake
//! app-server (see `docs/benchmarks.md`). Runs the `bench_fake` example of
//! `rethread-fake-appserver` in release mode.

use crate::util;

pub(crate) fn run(extra: &[String]) -> Result<(), String> {
    let root = util::project_root();
    let mut args: Vec<&str> = vec![
        "run",
        "--release",
        "-p",
        "rethread-fake-appserver",
        "--example",
        "bench_fake",
        "--",
    ];
    args.extend(extra.iter().map(String::as_str));
    util::run(&root, "cargo", &args)
}
