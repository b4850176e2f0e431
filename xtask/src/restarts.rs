//! `cargo xtask restarts [--kills N] [--seed S] [--backend B]... [--slow-turn-ms MS]`: the
//! restart harness of issue 12 (docs/reliability.md).
//!
//! For each backend (SQLite, redb, and PostgreSQL when `RETHREAD_TEST_POSTGRES_URL` is set), in
//! parallel: `rethread chat --json` processes for one session and one turn against
//! `fake-codex` (threads kept in a `CODEX_HOME` shared by the run), stopped with their codex
//! at random points of the turn (before the resume, during it, mid-turn, during the commit) by
//! SIGKILL, or sometimes SIGINT (a terminal's Ctrl-C) or SIGTERM, each stop followed at once by
//! a new process for the same session. Sometimes the bound
//! thread is first made unresumable (`no rollout found`), so fallbacks happen. After every
//! process:
//!
//! 1. the restart ran without waiting out the dead holder's lease (TTL 30 s);
//! 2. it resumed the bound thread unless that thread was lost (then it fell back);
//! 3. every acknowledged turn (exit 0 with a reply) is in the transcript, once;
//! 4. no retired thread is bound;
//! 5. each give-up write (the store's retired threads grew) is told by exactly one notice, in
//!    the first acknowledged turn after it (in its report and on its stderr); the one case
//!    counted apart is a host killed after committing that first turn and before its report
//!    (its reply is lost with it), which must have said the notice on stderr before the commit.
//! 6. a process stopped by SIGINT or SIGTERM that did not finish first exits 130 / 143 with an
//!    `interrupted` report, and then committed nothing (it said the turn was not committed).
//!
//! `cargo xtask ci` runs 300 kills per backend; the documented local run is `--kills 1000`.

mod host;
mod report;
mod run;
mod view;

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::util;

/// The options of a run.
#[derive(Debug, Clone)]
struct Options {
    kills: u32,
    seed: u64,
    backends: Vec<String>,
    slow_turn_ms: u64,
}

/// `cargo xtask restarts ARGS`.
pub(crate) fn command(args: &[String]) -> Result<(), String> {
    let mut options = Options {
        kills: 300,
        seed: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
        backends: Vec::new(),
        slow_turn_ms: 40,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        let number = |text: String, name: &str| {
            text.parse::<u64>()
                .map_err(|_| format!("{name}: `{text}` is not a number"))
        };
        match arg.as_str() {
            "--kills" => options.kills = number(value("--kills")?, "--kills")? as u32,
            "--seed" => options.seed = number(value("--seed")?, "--seed")?,
            "--slow-turn-ms" => {
                options.slow_turn_ms = number(value("--slow-turn-ms")?, "--slow-turn-ms")?
            }
            "--backend" => options.backends.push(value("--backend")?),
            other => return Err(format!("restarts: unknown argument `{other}`")),
        }
    }
    run_all(&options)
}

/// The shorter run of `cargo xtask ci`: 300 kills per backend, PostgreSQL included when
/// `RETHREAD_TEST_POSTGRES_URL` is set.
pub(crate) fn ci() -> Result<(), String> {
    command(&["--kills".to_string(), "300".to_string()])
}

fn run_all(options: &Options) -> Result<(), String> {
    let root = util::project_root();
    util::build_rethread_and(&["-p", "rethread-fake-appserver", "--bin", "fake-codex"])?;
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let binaries = host::Binaries {
        rethread: target.join("debug").join("rethread"),
        fake_codex: target.join("debug").join("fake-codex"),
    };
    let postgres = std::env::var("RETHREAD_TEST_POSTGRES_URL").ok();
    let wanted: Vec<&str> = if options.backends.is_empty() {
        vec!["sqlite", "redb", "postgres"]
    } else {
        options.backends.iter().map(String::as_str).collect()
    };
    let mut plans = Vec::new();
    for (index, backend) in wanted.iter().enumerate() {
        let dir = target.join("restarts").join(backend);
        let (name, url) = match *backend {
            "sqlite" => (
                "sqlite",
                format!("sqlite:{}", dir.join("store.sqlite").display()),
            ),
            "redb" => ("redb", format!("redb:{}", dir.join("store.redb").display())),
            "postgres" => match &postgres {
                Some(url) => ("postgres", url.clone()),
                None if options.backends.is_empty() => {
                    println!(
                        "restarts: PostgreSQL skipped: RETHREAD_TEST_POSTGRES_URL is not set \
                         (`source .ci/postgres.sh && rethread_start_postgres` sets it)"
                    );
                    continue;
                }
                None => return Err("--backend postgres needs RETHREAD_TEST_POSTGRES_URL".into()),
            },
            other => {
                return Err(format!(
                    "unknown backend `{other}` (sqlite, redb, postgres)"
                ))
            }
        };
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("codex-home"))
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        plans.push(run::Plan {
            backend: name,
            host_store_url: view::host_store_url(&url),
            store_url: url,
            dir,
            session_prefix: format!("restarts-{}-{}-{name}", options.seed, std::process::id()),
            kills: options.kills,
            seed: options.seed.wrapping_add(index as u64 * 0x9E37_79B9),
            slow_turn_ms: options.slow_turn_ms,
        });
    }
    println!(
        "restarts: {} kills per backend, seed {}, turns of {} ms (replay: --seed {})",
        options.kills, options.seed, options.slow_turn_ms, options.seed
    );
    let results: Vec<(&str, Result<report::Stats, String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = plans
            .iter()
            .map(|plan| (plan.backend, scope.spawn(|| run::execute(plan, &binaries))))
            .collect();
        handles
            .into_iter()
            .map(|(name, handle)| {
                let result = handle
                    .join()
                    .unwrap_or_else(|_| Err("the run panicked".to_string()));
                (name, result)
            })
            .collect()
    });
    let done: Vec<(&str, &report::Stats)> = results
        .iter()
        .filter_map(|(name, result)| result.as_ref().ok().map(|stats| (*name, stats)))
        .collect();
    println!("\n{}", report::table(&done));
    let failures: Vec<String> = results
        .iter()
        .filter_map(|(name, result)| result.as_ref().err().map(|e| format!("{name}: {e}")))
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "restart checks failed (seed {}):\n{}",
            options.seed,
            failures.join("\n")
        ))
    }
}
