//! Project automation, run as `cargo xtask <command>` (see `.cargo/config.toml`).
//!
//! Commands:
//! - `ci`: the whole gate, fast stages first (`xtask/src/ci.rs`): formatting, the docs' paths,
//!   clippy with warnings denied and the offline tests; then the PostgreSQL tests, the supported
//!   codex releases (`codex-releases.txt`) installed and the real-codex tests, the restart
//!   harness, the offline examples, the Python and TypeScript SDK tests, docs, features and
//!   packaging, and a 20-second smoke of each
//!   fuzz target; each stage's wall time at the end. This is what `.ci/run` calls.
//! - `docs`: fail naming each repository path a doc names that does not exist.
//! - `loc`: the shipped lines of each crate and in all (each shipped `src/` file up to its test
//!   module, without the conformance suite).
//! - `modules`: fails on a module import cycle in any crate.
//! - `codex [--version V]`: install `@openai/codex@V` into `target/codex/V`
//!   (idempotent) and print the binary's path.
//! - `codex-check --version V`: install any codex release, run the real-binary suites against
//!   it and print its row of the README's compatibility table.
//! - `bench <what>`: benchmarks (see `docs/benchmarks.md`).
//! - `python`: the Python SDK tests of `rethread app-server` (also a step of `ci`).
//! - `hermes`: Hermes (hermes-agent from PyPI) through a `codex` link to rethread (also a step
//!   of `ci`).
//! - `node`: the TypeScript SDK tests of `rethread exec` (also a step of `ci`).
//! - `examples`: the offline example of each language on `fake-codex` (steps of `ci`).
//! - `restarts [--kills N] [--seed S] [--backend B]... [--hosts chat|app-server]...`: host
//!   processes stopped at random points of a turn, each followed at once by a new one
//!   (docs/reliability.md); a bounded run is a stage of `ci`.

mod bench;
mod bench_fake;
mod bench_open;
mod ci;
mod codex;
mod codex_check;
mod docs;
mod examples;
mod fuzz;
mod loc;
mod modules;
mod node;
mod packaging;
mod proxy;
mod readme;
mod restarts;
mod util;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci::command(),
        Some("docs") => docs::command(&args[1..]),
        Some("loc") => loc::command(&args[1..]),
        Some("modules") => modules::command(&args[1..]),
        Some("codex") => codex::command(&args[1..]),
        Some("codex-check") => codex_check::command(&args[1..]),
        Some("fuzz") => fuzz::command(&args[1..]),
        Some("bench") => bench::command(&args[1..]),
        Some("python") => proxy::python_tests(),
        Some("hermes") => proxy::hermes_tests(),
        Some("node") => node::typescript_tests(),
        Some("examples") => examples::command(),
        Some("restarts") => restarts::command(&args[1..]),
        Some("help") | Some("--help") | Some("-h") | None => {
            print_help();
            Ok(())
        }
        Some(other) => Err(format!("unknown command `{other}`; try `cargo xtask help`")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

fn print_help() {
    println!(
        "cargo xtask <command>\n\n\
         ci                    the whole gate, fast stages first; each stage's wall time at the end\n\
         docs                  fail naming each repository path a doc names that does not exist\n\
         loc                   shipped lines per crate and in all (src/ files up to their test module)\n\
         modules               fails on a module import cycle in any crate\n\
         codex [--version V]   install @openai/codex@V (default {}) and print its path\n\
         codex-check --version V  run the real-codex suites against V, print its compatibility row\n\
         fuzz [--seconds N] [TARGET...]  build, seed and run the fuzz targets (docs/fuzzing.md)\n\
         bench store [--seconds S]  store commit rates vs raw baselines (docs/benchmarks.md)\n\
         bench fake [--seconds S]   in-process fake app-server requests per second\n\
         bench open [--sizes N,N,N] [--verify]  store open time by store size (docs/benchmarks.md)\n\
         bench proxy [--rounds N]   rethread app-server vs codex direct (fake-codex), p50/p99\n\
         bench mirror [--commits N] what the rollout mirror adds to a commit; restore vs plain copy\n\
         python                the openai-codex Python SDK driving rethread app-server (pytest)\n\
         hermes                Hermes (hermes-agent) driving rethread app-server through a `codex` link (pytest)\n\
         node                  the @openai/codex-sdk TypeScript SDK driving rethread exec (node --test)\n\
         examples              the offline Rust, Python and TypeScript examples on fake-codex\n\
         restarts [--kills N] [--seed S] [--backend B]... [--hosts H]...  stopped hosts restart at once (docs/reliability.md)",
        codex::current()
    );
}
