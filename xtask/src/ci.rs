//! `cargo xtask ci`: the whole gate, what `.ci/run` runs on a fresh machine, in an order that
//! answers fast: formatting, the docs' paths, clippy and every test that needs no codex
//! release, no PostgreSQL, no Python and no node come first, all of them even when one fails;
//! the slow stages only when those passed, each of them even when an earlier one failed (the
//! Python SDK and the real-codex tests need the codex install). Each stage says at once when it
//! failed; the wall time of each is printed at the end.
//!
//! Every test runs once. The offline stage is `cargo test --workspace` without the tests of
//! the later stages ([`REAL_CODEX`], [`POSTGRES`]: whole test targets left out, single tests
//! skipped by exact name), and the doc tests; the later stages run exactly those. Under the
//! offline stage each supported codex release is named by a path that does not exist, with
//! `RETHREAD_REQUIRE_REAL_CODEX=1`, and PostgreSQL is required but unset: a real-codex or
//! PostgreSQL test missing from these tables fails there, naming this file, instead of
//! skipping.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{codex, docs, examples, fuzz, modules, node, packaging, proxy, restarts, util};

/// Tests that need a real codex release: (test target, `None` for all of its tests or the
/// names of those that do). Targets are named across the workspace (`--workspace --test T`),
/// so the build's features stay those of the offline stage and nothing is rebuilt.
const REAL_CODEX: [(&str, Option<&[&str]>); 21] = [
    ("real_schema", None),  // rethread-protocol
    ("real_codex", None),   // rethread-runtime and rethread-proxy
    ("real_mirror", None),  // rethread-runtime: the rollout mirror on every release
    ("real_session", None), // rethread-proxy
    // rethread-cli: the fleet story (several homes, one store; chat and app-server; SQLite,
    // and PostgreSQL when RETHREAD_TEST_POSTGRES_URL is set, as .ci/run sets it).
    ("fleet", None),
    ("client_thread", None), // rethread-cli: a thread the client names (issue 34)
    ("child_lifetime", None), // rethread-cli: codex dies with its rethread (issue 34)
    ("named_restore", None), // rethread-cli: a thread named by id restored first (issue 34)
    ("kept_threads", None),  // rethread-cli: threads kept without a session (issue 34)
    ("guard", None),         // rethread-cli: the guard fails closed (issue 41)
    ("parity", None),        // rethread-fake-appserver, and the four below
    ("exec_parity", None),
    ("shared_home", None),
    ("real_smoke", None),
    ("schema", None),
    ("compat", None), // rethread-testkit
    (
        "streaming",
        Some(&["against_the_real_codex_a_streamed_turn_streams_and_commits"]),
    ),
    (
        "cli",
        Some(&[
            "chat_against_real_codex_remembers_and_fails_closed",
            "doctor_against_real_codex",
        ]),
    ),
    // rethread-cli: `exec` under a session, on the fake and then on each release.
    (
        "exec",
        Some(&["an_option_without_its_value_is_refused_never_rewritten"]),
    ),
    (
        "app_server",
        Some(&[
            "the_real_codex_through_the_binary",
            "the_real_codex_keeps_a_session_through_the_binary",
        ]),
    ),
    // rethread-runtime: rollouts codex compressed itself (`.jsonl.zst`, issue 39).
    ("real_compressed", None),
];

/// Tests that need `RETHREAD_TEST_POSTGRES_URL`, in the same form.
const POSTGRES: [(&str, Option<&[&str]>); 4] = [
    ("postgres", None), // rethread-store
    (
        "postgres_connect",
        Some(&["a_role_or_database_that_does_not_exist_says_so"]),
    ),
    (
        "multi_process",
        Some(&[
            "a_killed_holder_is_taken_over_at_once_on_postgres",
            "a_stalled_holder_writes_nothing_after_a_takeover_on_postgres",
            "processes_share_sessions_on_one_postgres_database",
        ]),
    ),
    (
        "cli",
        Some(&["migrate_to_and_from_postgres_and_chat_on_it"]),
    ),
];

/// Unit tests (in a crate's `src/`) that need PostgreSQL, by their full name: skipped by the
/// offline stage, run by the PostgreSQL one (`cargo test --workspace --lib`).
const POSTGRES_UNIT: [&str; 1] =
    ["postgres::tests::a_write_stalled_under_its_lock_frees_the_lock_after_the_timeout"];

/// What each supported release's variable names during the offline stage: no file, and a
/// cause that says where to list the test that looked for it.
const NO_CODEX_OFFLINE: &str =
    "/nonexistent/offline-stage-of-cargo-xtask-ci:list-this-test-in-xtask/src/ci.rs";

/// `cargo xtask ci`.
pub(crate) fn command() -> Result<(), String> {
    let root = util::project_root();
    let mut stages = Stages::default();
    let result = run_stages(&root, &mut stages);
    println!("\ncargo xtask ci: wall time per stage\n{}", stages.table());
    result
}

fn run_stages(root: &Path, stages: &mut Stages) -> Result<(), String> {
    // The gate tests the supported releases, never a list left over from `codex-check`.
    std::env::remove_var("RETHREAD_CODEX_RELEASES");
    // A build from scratch gains nothing from incremental caches, and they would take
    // gigabytes of a CI machine's disk beside ~50 test binaries.
    if std::env::var_os("CARGO_INCREMENTAL").is_none() {
        std::env::set_var("CARGO_INCREMENTAL", "0");
    }
    // The runtime's model-based proptest runs more histories in CI than locally.
    if std::env::var_os("RETHREAD_MODEL_CASES").is_none() {
        std::env::set_var("RETHREAD_MODEL_CASES", "2000");
    }
    // The fast stages all run, so one failure does not hide another; the slow ones only when
    // they passed.
    stages.run("fmt", || {
        util::run(root, "cargo", &["fmt", "--all", "--", "--check"])
    });
    stages.run("doc paths", || docs::command(&[]));
    stages.run("module cycles", || modules::command(&[]));
    stages.run("clippy", || {
        util::run(
            root,
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
        )
    });
    stages.run("offline tests", || offline_tests(root));
    stages.failed()?;
    // Each slow stage runs even when an earlier one failed: one run shows every failure.
    // PostgreSQL needs no download: it answers before the codex releases are installed.
    // Without RETHREAD_TEST_POSTGRES_URL these tests skip with a message (outside CI).
    stages.run("postgres tests", || {
        run_selected(root, &POSTGRES)?;
        let mut args = vec!["test", "--workspace", "--locked", "--lib", "--", "--exact"];
        args.extend(POSTGRES_UNIT);
        util::run(root, "cargo", &args)
    });
    let installed = stages.run("codex install", || {
        for (role, version) in codex::supported() {
            let path = codex::install(version)?;
            std::env::set_var(codex::env_var_for(version), &path);
            println!("codex {version} ({role}): {}", path.display());
        }
        Ok(())
    });
    if installed {
        // Tests that need a real codex fail instead of skipping when this is set.
        std::env::set_var("RETHREAD_REQUIRE_REAL_CODEX", "1");
        stages.run("real-codex tests", || run_selected(root, &REAL_CODEX));
    }
    // Hosts stopped at random points (`rethread chat` and `rethread app-server`), restarted
    // at once, on every backend (PostgreSQL when RETHREAD_TEST_POSTGRES_URL is set).
    stages.run("restarts", restarts::ci);
    // The offline example of each language, on fake-codex, as a user who installed only
    // rethread and fake-codex runs it.
    stages.run("example quickstart", examples::quickstart);
    stages.run("example rust", examples::rust);
    stages.run("example python", examples::python);
    stages.run("example typescript", examples::typescript);
    if installed {
        // Real, unmodified clients against the current codex: the openai-codex Python SDK
        // and Hermes through `rethread app-server`, the TypeScript SDK through `rethread exec`.
        stages.run("python sdk", proxy::python_tests);
        // Hermes (hermes-agent from PyPI, by README.md's line) through a `codex` link.
        stages.run("hermes", proxy::hermes_tests);
        stages.run("typescript sdk", node::typescript_tests);
    }
    // What publishing needs: the docs build without warnings, each backend builds alone, and
    // every publishable crate packages.
    stages.run("packaging", || packaging::checks(root));
    // A short smoke of every fuzz target (docs/fuzzing.md): 20 s each, so that the whole of
    // `.ci/run` stays within its budget on 2 cores. `RETHREAD_FUZZ_SMOKE_SECONDS=0` skips it,
    // e.g. while iterating locally; `cargo xtask fuzz` runs longer.
    let seconds = std::env::var("RETHREAD_FUZZ_SMOKE_SECONDS").unwrap_or_else(|_| "20".to_string());
    if seconds != "0" {
        stages.run("fuzz smoke", || {
            fuzz::command(&["--seconds".to_string(), seconds.clone()])
        });
    }
    stages.failed()
}

/// Every test of the workspace but those of [`REAL_CODEX`] and [`POSTGRES`]: the targets
/// they take whole are left out, the tests they name are skipped by exact name (names that
/// must be unique in the workspace: `--skip` applies to every test binary).
fn offline_tests(root: &Path) -> Result<(), String> {
    let later: Vec<(&str, Option<&[&str]>)> = [&REAL_CODEX[..], &POSTGRES[..]].concat();
    let whole: Vec<&str> = later
        .iter()
        .filter(|(_, names)| names.is_none())
        .map(|(target, _)| *target)
        .collect();
    let mut skipped: Vec<&str> = later
        .iter()
        .filter_map(|(_, names)| *names)
        .flatten()
        .copied()
        .chain(
            POSTGRES_UNIT
                .iter()
                .map(|name| name.rsplit("::").next().unwrap_or(name)),
        )
        .collect();
    ensure_unique(root, &skipped)?;
    // A unit test's name for `--exact` is its module path.
    skipped.extend(POSTGRES_UNIT);
    let mut args = vec!["test", "--workspace", "--locked", "--lib", "--bins"];
    let targets = test_targets(root)?;
    for target in targets.iter().filter(|t| !whole.contains(&t.as_str())) {
        args.extend(["--test", target.as_str()]);
    }
    args.extend(["--", "--exact"]);
    for name in &skipped {
        args.extend(["--skip", name]);
    }
    let vars: Vec<(String, &str)> = codex::supported()
        .into_iter()
        .map(|(_, version)| (codex::env_var_for(version), NO_CODEX_OFFLINE))
        .chain([
            ("RETHREAD_REQUIRE_REAL_CODEX".to_string(), "1"),
            ("RETHREAD_REQUIRE_POSTGRES".to_string(), "1"),
        ])
        .collect();
    let set: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let unset = ["RETHREAD_TEST_POSTGRES_URL"];
    util::run_with_env(root, "cargo", &args, &set, &unset)?;
    util::run_with_env(
        root,
        "cargo",
        &["test", "--workspace", "--locked", "--doc"],
        &set,
        &unset,
    )
}

/// The names of the workspace's test targets (`tests/*.rs`), from `cargo metadata`.
fn test_targets(root: &Path) -> Result<Vec<String>, String> {
    let output = Command::new("cargo")
        .args(["metadata", "--no-deps", "--format-version", "1", "--locked"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("could not start `cargo metadata`: {e}"))?;
    if !output.status.success() {
        return Err(format!("`cargo metadata` failed with {}", output.status));
    }
    let metadata: Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("`cargo metadata` printed no JSON: {e}"))?;
    let mut targets: Vec<String> = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|package| package["targets"].as_array().into_iter().flatten())
        .filter(|target| {
            target["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "test"))
        })
        .filter_map(|target| target["name"].as_str().map(str::to_string))
        .collect();
    targets.sort();
    targets.dedup();
    Ok(targets)
}

/// Fails unless each of `names` is the name of one test function in the crates: a skip by
/// name must not drop another binary's test of the same name.
fn ensure_unique(root: &Path, names: &[&str]) -> Result<(), String> {
    let mut files = Vec::new();
    util::rust_files(&root.join("crates"), &mut files)?;
    let mut counts = vec![0usize; names.len()];
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (name, count) in names.iter().zip(&mut counts) {
            *count += text.matches(&format!("fn {name}(")).count();
        }
    }
    let shared: Vec<String> = names
        .iter()
        .zip(&counts)
        .filter(|(_, count)| **count != 1)
        .map(|(name, count)| format!("{name} ({count} functions)"))
        .collect();
    if shared.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the tests xtask/src/ci.rs skips by name must each be one function of the \
             workspace: {}",
            shared.join(", ")
        ))
    }
}

/// Runs the tests `table` names: whole targets in one `cargo test`, then the named tests of
/// the other targets in another.
fn run_selected(root: &Path, table: &[(&str, Option<&[&str]>)]) -> Result<(), String> {
    let whole: Vec<&str> = table
        .iter()
        .filter(|(_, names)| names.is_none())
        .map(|(target, _)| *target)
        .collect();
    if !whole.is_empty() {
        util::run(root, "cargo", &test_args(&whole, &[]))?;
    }
    let (targets, names): (Vec<&str>, Vec<&[&str]>) = table
        .iter()
        .filter_map(|(target, names)| names.map(|names| (*target, names)))
        .unzip();
    if !targets.is_empty() {
        let names: Vec<&str> = names.concat();
        util::run(root, "cargo", &test_args(&targets, &names))?;
    }
    Ok(())
}

/// `cargo test --workspace --locked --test T... [-- --exact NAME...]`.
fn test_args<'a>(targets: &[&'a str], names: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["test", "--workspace", "--locked"];
    for target in targets {
        args.extend(["--test", target]);
    }
    if !names.is_empty() {
        args.extend(["--", "--exact"]);
        args.extend_from_slice(names);
    }
    args
}

/// The stages run so far, with their wall times, the disk left free after each (a run that
/// fills the disk then says which stage took it) and failures.
#[derive(Debug, Default)]
struct Stages {
    done: Vec<Stage>,
}

#[derive(Debug)]
struct Stage {
    name: &'static str,
    took: Duration,
    free_after: Option<u64>,
    error: Option<String>,
}

impl Stages {
    /// Runs `stage`, timing it; says at once when it failed. Returns whether it passed.
    fn run(&mut self, name: &'static str, stage: impl FnOnce() -> Result<(), String>) -> bool {
        eprintln!("\n== cargo xtask ci: {name}");
        let started = Instant::now();
        let result = stage();
        if let Err(error) = &result {
            eprintln!("== cargo xtask ci: {name} FAILED: {error}");
        }
        let passed = result.is_ok();
        self.done.push(Stage {
            name,
            took: started.elapsed(),
            free_after: free_disk(&util::project_root()),
            error: result.err(),
        });
        passed
    }

    /// `Err` naming every stage that failed so far.
    fn failed(&self) -> Result<(), String> {
        let failed: Vec<String> = self
            .done
            .iter()
            .filter_map(|stage| {
                let error = stage.error.as_ref()?;
                Some(format!("{}: {error}", stage.name))
            })
            .collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(format!("failed stages:\n{}", failed.join("\n")))
        }
    }

    fn table(&self) -> String {
        let mut out = String::new();
        for stage in &self.done {
            let secs = stage.took.as_secs();
            let free = stage.free_after.map_or_else(String::new, |kib| {
                format!("  {:>6.1} GiB free", kib as f64 / (1024.0 * 1024.0))
            });
            out.push_str(&format!(
                "  {:<18} {:>3} min {:>2} s{free}{}\n",
                stage.name,
                secs / 60,
                secs % 60,
                if stage.error.is_some() {
                    "  FAILED"
                } else {
                    ""
                }
            ));
        }
        let total: Duration = self.done.iter().map(|stage| stage.took).sum();
        out.push_str(&format!(
            "  {:<18} {:>3} min {:>2} s\n",
            "total",
            total.as_secs() / 60,
            total.as_secs() % 60
        ));
        out
    }
}

/// KiB free on the file system holding `dir`, as `df -Pk` reports it; `None` when `df` is
/// missing or prints something else.
fn free_disk(dir: &Path) -> Option<u64> {
    let output = Command::new("df").arg("-Pk").arg(dir).output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    text.lines().nth(1)?.split_whitespace().nth(3)?.parse().ok()
}
