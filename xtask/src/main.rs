//! Project automation, run as `cargo xtask <command>` (see `.cargo/config.toml`).
//!
//! Commands:
//! - `ci`: install the pinned codex binaries, check formatting, run clippy with
//!   warnings denied, run the whole test suite, then a one-minute smoke of each fuzz target.
//!   This is what `.ci/run` calls.
//! - `codex [--version V]`: install a pinned `@openai/codex` into `target/codex/V`
//!   (idempotent) and print the binary's path.
//! - `bench <what>`: benchmarks (see `docs/benchmarks.md`).

mod bench;
mod bench_fake;
mod bench_open;
mod codex;
mod fuzz;
mod util;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("codex") => codex::command(&args[1..]),
        Some("fuzz") => fuzz::command(&args[1..]),
        Some("bench") => bench::command(&args[1..]),
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
         ci                    install pinned codex, fmt check, clippy -D warnings, all tests\n\
         codex [--version V]   install @openai/codex@V (default {}) and print its path\n\
         fuzz [--seconds N] [TARGET...]  build, seed and run the fuzz targets (docs/fuzzing.md)\n\
         bench store [--seconds S]  store commit rates vs raw baselines (docs/benchmarks.md)\n\
         bench fake [--seconds S]   in-process fake app-server requests per second\n\
         bench open [--sizes N,N,N] [--verify]  store open time by store size (docs/benchmarks.md)",
        codex::DEFAULT_VERSION
    );
}

/// The whole gate: what `.ci/run` runs on a fresh machine.
fn ci() -> Result<(), String> {
    let root = util::project_root();
    // Both pinned binaries are installed first so the real-codex tests run (and never
    // silently skip) wherever this command runs.
    for version in codex::PINNED_VERSIONS {
        let path = codex::install(version)?;
        std::env::set_var(codex::env_var_for(version), &path);
        println!("codex {version}: {}", path.display());
    }
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
    // A short smoke of every fuzz target (docs/fuzzing.md); `RETHREAD_FUZZ_SMOKE_SECONDS=0`
    // skips it, e.g. while iterating locally.
    let seconds = std::env::var("RETHREAD_FUZZ_SMOKE_SECONDS").unwrap_or_else(|_| "60".to_string());
    if seconds != "0" {
        fuzz::command(&["--seconds".to_string(), seconds])?;
    }
    Ok(())
}
