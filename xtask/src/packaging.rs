//! The publishing checks of `cargo xtask ci`: documentation without warnings, each store
//! backend built alone through the `rethread` crate's features, the CLI without its `demo`
//! feature, and `cargo package` for every publishable crate.

use std::path::Path;
use std::process::Command;

use crate::util;

/// The crates published to crates.io (`rethread-testkit` and `xtask` are `publish = false`).
pub(crate) const PUBLISHED: [&str; 7] = [
    "rethread-protocol",
    "rethread-store",
    "rethread-runtime",
    "rethread-fake-appserver",
    "rethread-proxy",
    "rethread",
    "rethread-cli",
];

/// The store backends, each of which must build without the others.
const BACKENDS: [&str; 3] = ["redb", "sqlite", "postgres"];

pub(crate) fn checks(root: &Path) -> Result<(), String> {
    docs(root)?;
    // Each backend alone, and none (memory only), with warnings denied: code a backend does
    // not use must not warn either.
    for backend in BACKENDS.iter().copied().chain([""]) {
        util::run(
            root,
            "cargo",
            &[
                "clippy",
                "--locked",
                "-p",
                "rethread",
                "--no-default-features",
                "--features",
                backend,
                "--",
                "-D",
                "warnings",
            ],
        )?;
    }
    // The CLI without `rethread demo` (and the fake app-server it links).
    util::run(
        root,
        "cargo",
        &[
            "check",
            "--locked",
            "-p",
            "rethread-cli",
            "--no-default-features",
        ],
    )?;
    let mut args = vec!["package", "--locked", "--no-verify", "--allow-dirty"];
    for name in PUBLISHED {
        args.extend(["-p", name]);
    }
    util::run(root, "cargo", &args)
}

/// `cargo doc` of every published crate with rustdoc's warnings denied.
fn docs(root: &Path) -> Result<(), String> {
    let mut args = vec!["doc", "--locked", "--no-deps", "--all-features"];
    for name in PUBLISHED {
        args.extend(["-p", name]);
    }
    eprintln!("$ RUSTDOCFLAGS='-D warnings' cargo {}", args.join(" "));
    let status = Command::new("cargo")
        .args(&args)
        .current_dir(root)
        .env("RUSTDOCFLAGS", "-D warnings")
        .status()
        .map_err(|e| format!("could not start `cargo doc`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo doc` failed with {status}"))
    }
}
