//! `cargo xtask codex-check --version V`: judges a codex release in one command.
//!
//! Asks npm whether `@openai/codex@V` exists (a version it does not know fails at once, nothing
//! installed), then installs it (and the supported releases, which the cross-release tests
//! use), runs every real-binary suite with `RETHREAD_CODEX_RELEASES=V` (so the tests about
//! "the current release" run against V; see `rethread_testkit::releases`), then probes V and
//! prints its row of the README's compatibility table. Fails when a suite fails or a refusal
//! of V classifies differently from what rethread relies on.

use std::time::Instant;

use crate::codex;
use crate::util::{project_root, run};

/// The real-binary suites: (package, test targets, name filter).
const SUITES: [(&str, &[&str], Option<&str>); 4] = [
    ("rethread-protocol", &["real_schema"], None),
    ("rethread-runtime", &["real_codex"], None),
    ("rethread-cli", &["cli"], Some("real_codex")),
    (
        "rethread-fake-appserver",
        &["parity", "shared_home", "real_smoke", "schema"],
        None,
    ),
];

/// `cargo xtask codex-check --version V`.
pub(crate) fn command(args: &[String]) -> Result<(), String> {
    let version = match args {
        [flag, v] if flag == "--version" => v.clone(),
        _ => return Err("usage: cargo xtask codex-check --version V".to_string()),
    };
    // Before anything is installed: a version npm does not have fails here, not after the
    // supported releases' downloads.
    codex::check_release("npm", &version)?;
    for (_, supported) in codex::supported() {
        let path = codex::install(supported)?;
        std::env::set_var(codex::env_var_for(supported), &path);
    }
    let binary = codex::install(&version)?;
    std::env::set_var(codex::env_var_for(&version), &binary);
    std::env::set_var("RETHREAD_CODEX_RELEASES", &version);
    std::env::set_var("RETHREAD_REQUIRE_REAL_CODEX", "1");
    let root = project_root();
    let mut results = Vec::new();
    for (package, targets, filter) in SUITES {
        // Every test binary runs even when one fails: the point is the whole picture.
        let mut args = vec!["test", "--no-fail-fast", "-p", package];
        for target in targets {
            args.extend(["--test", target]);
        }
        if let Some(filter) = filter {
            args.push(filter);
        }
        let started = Instant::now();
        let outcome = run(&root, "cargo", &args);
        results.push((
            format!("{package} ({})", targets.join(", ")),
            outcome.is_ok(),
            started.elapsed().as_secs(),
        ));
    }
    let binary_arg = binary.to_string_lossy().into_owned();
    let probe = std::process::Command::new("cargo")
        .args([
            "run",
            "--quiet",
            "-p",
            "rethread-testkit",
            "--bin",
            "codex-probe",
            "--",
            "--header",
            &binary_arg,
        ])
        .current_dir(&root)
        .output()
        .map_err(|e| format!("could not start the probe: {e}"))?;
    eprint!("{}", String::from_utf8_lossy(&probe.stderr));
    println!("\ncodex {version}: real-binary suites");
    for (suite, ok, seconds) in &results {
        println!(
            "  {} {suite} ({seconds} s)",
            if *ok { "ok    " } else { "FAILED" }
        );
    }
    println!("\ncompatibility row (README, \"Compatibility\"):\n");
    print!("{}", String::from_utf8_lossy(&probe.stdout));
    let failed: Vec<&str> = results
        .iter()
        .filter(|(_, ok, _)| !ok)
        .map(|(suite, _, _)| suite.as_str())
        .collect();
    if !failed.is_empty() {
        return Err(format!("codex {version}: failed: {}", failed.join(", ")));
    }
    if !probe.status.success() {
        return Err(format!("codex {version}: the probe failed"));
    }
    Ok(())
}
