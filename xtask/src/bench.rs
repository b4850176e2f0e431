//! `cargo xtask bench <what>`: benchmarks (see `docs/benchmarks.md`).
//!
//! - `store [--seconds S] [--sessions N] [--rows R] [--dir PATH]`: `commit_turn` rates and
//!   latencies of the redb and SQLite stores beside raw engine and fsync baselines. Runs the
//!   `bench_store` example of `rethread-store` in release mode; `--dir` puts the files on the
//!   filesystem you want to measure (default: the system temp dir).

use crate::util;

pub(crate) fn command(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("store") => store(&args[1..]),
        Some("fake") => crate::bench_fake::run(&args[1..]),
        Some(other) => Err(format!(
            "unknown benchmark `{other}`; available: store, fake"
        )),
        None => Err("usage: cargo xtask bench <what>; available: store, fake".to_string()),
    }
}

fn store(extra: &[String]) -> Result<(), String> {
    let root = util::project_root();
    let mut args: Vec<&str> = vec![
        "run",
        "--release",
        "-p",
        "rethread-store",
        "--example",
        "bench_store",
        "--",
    ];
    args.extend(extra.iter().map(String::as_str));
    util::run(&root, "cargo", &args)
}
