//! `cargo xtask fuzz [--seconds N] [--build-only] [--no-seed] [TARGET...]`: builds the
//! cargo-fuzz targets of `fuzz/`, writes their seed corpora from real traffic and runs each
//! target for N seconds (default 60), one at a time, on one core. See `docs/fuzzing.md`.
//!
//! The toolchain here is stable; cargo-fuzz needs nightly-only flags (`-Zsanitizer`,
//! `-Cpasses=sancov-module`), which stable rustc accepts with `RUSTC_BOOTSTRAP=1`. That is set
//! for the fuzz commands only, never for the main workspace's build.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::util;

/// Every target, in the order they run.
pub(crate) const TARGETS: [&str; 6] = [
    "framing",
    "proxy_routing",
    "merge_patch",
    "fake_appserver",
    "runtime_hostile",
    "store_files",
];

/// The default seconds per target.
const DEFAULT_SECONDS: u64 = 60;

pub(crate) fn command(args: &[String]) -> Result<(), String> {
    let mut seconds = DEFAULT_SECONDS;
    let mut build_only = false;
    let mut seed = true;
    let mut targets: Vec<String> = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => {
                let value = args.next().ok_or("--seconds needs a value")?;
                seconds = value
                    .parse()
                    .map_err(|_| format!("--seconds: `{value}` is not a number"))?;
            }
            "--build-only" => build_only = true,
            "--no-seed" => seed = false,
            "-h" | "--help" => {
                println!(
                    "cargo xtask fuzz [--seconds N] [--build-only] [--no-seed] [TARGET...]\n\
                     targets: {}",
                    TARGETS.join(", ")
                );
                return Ok(());
            }
            t if TARGETS.contains(&t) => targets.push(t.to_string()),
            other => {
                return Err(format!(
                    "unknown fuzz target or option `{other}` (targets: {})",
                    TARGETS.join(", ")
                ))
            }
        }
    }
    if targets.is_empty() {
        targets = TARGETS.iter().map(|t| t.to_string()).collect();
    }
    let fuzz_dir = util::project_root().join("fuzz");
    ensure_cargo_fuzz()?;
    let started = Instant::now();
    // One build of every target (and of the seed generator, built with the same flags).
    cargo_fuzz(&fuzz_dir, &["build", "-O"])?;
    println!("fuzz: build took {:.0?}", started.elapsed());
    if build_only {
        return Ok(());
    }
    if seed {
        let generator = fuzz_dir.join("target/x86_64-unknown-linux-gnu/release/seed-corpus");
        let corpus = fuzz_dir.join("corpus");
        let corpus = corpus.to_str().ok_or("the corpus path is not UTF-8")?;
        util::run(
            &fuzz_dir,
            generator.to_str().ok_or("non-UTF-8 path")?,
            &[corpus],
        )?;
    }
    let mut failed = Vec::new();
    for target in &targets {
        let t0 = Instant::now();
        let corpus = format!("corpus/{target}");
        std::fs::create_dir_all(fuzz_dir.join(&corpus))
            .map_err(|e| format!("creating {corpus}: {e}"))?;
        let max_time = format!("-max_total_time={seconds}");
        let result = cargo_fuzz(
            &fuzz_dir,
            &[
                "run",
                "-O",
                target,
                &corpus,
                "--",
                &max_time,
                "-print_final_stats=1",
                "-rss_limit_mb=4096",
                "-timeout=60",
                // Off during the run; `ASAN_OPTIONS` (set in `cargo_fuzz`) turns off the
                // check at exit.
                "-detect_leaks=0",
            ],
        );
        println!("fuzz: {target} ran {:.0?}", t0.elapsed());
        if let Err(e) = result {
            eprintln!("fuzz: {target} FAILED: {e} (the input is under fuzz/artifacts/{target}/)");
            failed.push(target.clone());
        }
    }
    println!("fuzz: total {:.0?}", started.elapsed());
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("fuzz targets failed: {}", failed.join(", ")))
    }
}

/// Installs cargo-fuzz when `cargo fuzz` is not available.
fn ensure_cargo_fuzz() -> Result<(), String> {
    let present = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if present {
        return Ok(());
    }
    util::run(
        &util::project_root(),
        "cargo",
        &["install", "cargo-fuzz", "--locked"],
    )
}

/// `cargo fuzz ARGS` in `fuzz/` with `RUSTC_BOOTSTRAP=1`.
fn cargo_fuzz(fuzz_dir: &Path, args: &[&str]) -> Result<(), String> {
    let args: Vec<&str> = std::iter::once("fuzz")
        .chain(args.iter().copied())
        .collect();
    // The main workspace's target dir must not leak into the fuzz build. Threads still
    // parked at exit (store writers, the shared runtime's blocking pool) hold their spawn
    // closures, which LeakSanitizer's exit check reports as leaks even with libFuzzer's
    // `-detect_leaks=0`: a 900 s run ended that way with an empty "crash" input.
    util::run_with_env(
        fuzz_dir,
        "cargo",
        &args,
        &[("RUSTC_BOOTSTRAP", "1"), ("ASAN_OPTIONS", "detect_leaks=0")],
        &["CARGO_TARGET_DIR"],
    )
}
