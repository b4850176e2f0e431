//! `cargo xtask bench open [--sizes 1000,10000,100000] [--rows 40] [--runs N] [--verify]`:
//! how long opening a store takes by its size, per file backend (see `docs/benchmarks.md`).
//! Runs the `bench_open` example of `rethread-store` in release mode; the stores it measures
//! are built once and kept under `target/bench-open/`.

use crate::util;

pub(crate) fn run(extra: &[String]) -> Result<(), String> {
    let root = util::project_root();
    let dir = root.join("target").join("bench-open");
    let dir = dir.to_string_lossy().into_owned();
    let mut args: Vec<&str> = vec![
        "run",
        "--release",
        "-p",
        "rethread-store",
        "--example",
        "bench_open",
        "--",
        "--dir",
        &dir,
    ];
    args.extend(extra.iter().map(String::as_str));
    util::run(&root, "cargo", &args)
}
