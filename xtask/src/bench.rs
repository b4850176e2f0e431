//! `cargo xtask bench <what>`: benchmarks (see `docs/benchmarks.md`).
//!
//! - `store [--seconds S] [--sessions N] [--rows R] [--dir PATH]`: `commit_turn` rates and
//!   latencies of the redb and SQLite stores beside raw engine and fsync baselines. Runs the
//!   `bench_store` example of `rethread-store` in release mode; `--dir` puts the files on the
//!   filesystem you want to measure (default: the system temp dir). With a PostgreSQL URL
//!   (`--postgres URL`, `RETHREAD_BENCH_POSTGRES_URL` or `RETHREAD_TEST_POSTGRES_URL`) it adds
//!   the PostgreSQL store (1 and N sessions) beside a raw tokio-postgres baseline. Then, per
//!   backend, the time a prune of `--prune-sessions N` (default 10000) idle sessions takes and
//!   the p99 of one session's commits during it beside their p99 alone, and the longest of
//!   them (`--prune-only`: only those).
//! - `runtime [--iterations N] [--turns 1,100,1000] [--samples N] [--skip-real]`: time from
//!   opening a conversation to `turn/start` sent (resumed vs fresh), and `thread/resume`
//!   latency on the real codex by history length, with and without `excludeTurns`.
//! - `proxy [--rounds N] [--turns N] [--large-kib K]`: `rethread app-server` in front of
//!   `fake-codex` against `fake-codex` alone, in one run (see `xtask/src/proxy.rs`).
//! - `mirror [--commits N] [--samples N] [--turns 100,1000,5000] [--dir PATH] [--postgres URL]
//!   [--big-mib N] [--big-only] [--restores-only]`: what the rollout mirror adds to a turn's
//!   commit (5 KB, 100 KB, 1 MB of rollout growth) beside the same commits without it,
//!   restoring rollouts of 100 to 5,000 turns beside a plain copy, and a thread of `--big-mib`
//!   MiB (default 512, 0 skips it) of codex-shaped JSONL: the store's share of its bytes, a
//!   5 KB turn's commit on it beside a 1 MB thread's, its restore's time and peak memory; on
//!   SQLite, redb and PostgreSQL (with a URL). Runs the `bench_mirror` example of
//!   `rethread-runtime` in release mode.

use crate::util;

pub(crate) fn command(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("store") => store(&args[1..]),
        Some("fake") => crate::bench_fake::run(&args[1..]),
        Some("open") => crate::bench_open::run(&args[1..]),
        Some("runtime") => util::run_example("rethread-runtime", &[], "bench_runtime", &args[1..]),
        Some("proxy") => crate::proxy::bench(&args[1..]),
        Some("mirror") => util::run_example("rethread-runtime", &[], "bench_mirror", &args[1..]),
        Some(other) => Err(format!(
            "unknown benchmark `{other}`; available: store, fake, runtime, proxy, open, mirror"
        )),
        None => Err(
            "usage: cargo xtask bench <what>; available: store, fake, runtime, proxy, open, mirror"
                .to_string(),
        ),
    }
}

fn store(extra: &[String]) -> Result<(), String> {
    util::run_example("rethread-store", &["postgres"], "bench_store", extra)
}
