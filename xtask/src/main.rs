//! Project automation, run as `cargo xtask <command>` (see `.cargo/config.toml`).
//!
//! Commands:
//! - `ci`: install the supported codex releases (`codex-releases.txt`), check formatting, run clippy with
//!   warnings denied, run the whole test suite, the restart harness (300 kills per backend) and
//!   the Python SDK tests, check docs, features and packaging, then a 20-second smoke of each
//!   fuzz target.
//!   This is what `.ci/run` calls.
//! - `codex [--version V]`: install `@openai/codex@V` into `target/codex/V`
//!   (idempotent) and print the binary's path.
//! - `codex-check --version V`: install any codex release, run the real-binary suites against
//!   it and print its row of the README's compatibility table.
//! - `bench <what>`: benchmarks (see `docs/benchmarks.md`).
//! - `python`: the Python SDK tests of `rethread app-server` (also a step of `ci`).
//! - `restarts [--kills N] [--seed S] [--backend B]...`: host processes SIGKILLed at random
//!   points of a turn, each followed at once by a new one (docs/reliability.md); a run of 300
//!   kills per backend is a step of `ci`.

mod bench;
mod bench_fake;
mod bench_open;
mod codex;
mod codex_check;
mod fuzz;
mod packaging;
mod proxy;
mod restarts;
mod util;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("codex") => codex::command(&args[1..]),
        Some("codex-check") => codex_check::command(&args[1..]),
        Some("fuzz") => fuzz::command(&args[1..]),
        Some("bench") => bench::command(&args[1..]),
        Some("python") => proxy::python_tests(),
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
         ci                    install the supported codex releases, fmt check, clippy -D warnings, all tests\n\
         codex [--version V]   install @openai/codex@V (default {}) and print its path\n\
         codex-check --version V  run the real-codex suites against V, print its compatibility row\n\
         fuzz [--seconds N] [TARGET...]  build, seed and run the fuzz targets (docs/fuzzing.md)\n\
         bench store [--seconds S]  store commit rates vs raw baselines (docs/benchmarks.md)\n\
         bench fake [--seconds S]   in-process fake app-server requests per second\n\
         bench open [--sizes N,N,N] [--verify]  store open time by store size (docs/benchmarks.md)\n\
         bench proxy [--rounds N]   rethread app-server vs codex direct (fake-codex), p50/p99\n\
         python                the openai-codex Python SDK driving rethread app-server (pytest)\n\
         restarts [--kills N] [--seed S] [--backend B]...  SIGKILLed hosts restart at once (docs/reliability.md)",
        codex::current()
    );
}

/// The whole gate: what `.ci/run` runs on a fresh machine.
fn ci() -> Result<(), String> {
    let root = util::project_root();
    // Every supported release is installed first so the real-codex tests run (and never
    // silently skip) wherever this command runs.
    for (role, version) in codex::supported() {
        let path = codex::install(version)?;
        std::env::set_var(codex::env_var_for(version), &path);
        println!("codex {version} ({role}): {}", path.display());
    }
    // The gate tests the supported releases, never a list left over from `codex-check`.
    std::env::remove_var("RETHREAD_CODEX_RELEASES");
    // Tests that need a real codex fail instead of skipping when this is set.
    std::env::set_var("RETHREAD_REQUIRE_REAL_CODEX", "1");
    // The runtime's model-based proptest runs more histories in CI than locally.
    if std::env::var_os("RETHREAD_MODEL_CASES").is_none() {
        std::env::set_var("RETHREAD_MODEL_CASES", "2000");
    }
    util::run(&root, "cargo", &["fmt", "--all", "--", "--check"])?;
    util::run(
        &root,
        "cargo",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    util::run(&root, "cargo", &["test", "--workspace", "--locked"])?;
    // Hosts SIGKILLed at random points of a turn, restarted at once: 300 kills per backend
    // (PostgreSQL when RETHREAD_TEST_POSTGRES_URL is set), checked after every process.
    restarts::ci()?;
    // A real, unmodified client (the openai-codex Python SDK) through `rethread app-server`.
    proxy::python_tests()?;
    // What publishing needs: the docs build without warnings, each backend builds alone, and
    // every publishable crate packages.
    packaging::checks(&root)?;
    // A short smoke of every fuzz target (docs/fuzzing.md): 20 s each, so that the whole of
    // `.ci/run` stays within its budget on 2 cores. `RETHREAD_FUZZ_SMOKE_SECONDS=0` skips it,
    // e.g. while iterating locally; `cargo xtask fuzz` runs longer.
    let seconds = std::env::var("RETHREAD_FUZZ_SMOKE_SECONDS").unwrap_or_else(|_| "20".to_string());
    if seconds != "0" {
        fuzz::command(&["--seconds".to_string(), seconds])?;
    }
    Ok(())
}
