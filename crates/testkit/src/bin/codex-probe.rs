//! `codex-probe [--header] CODEX_BINARY...`: prints one row of the compatibility table per
//! binary (see `rethread_testkit::compat`). `cargo xtask codex-check` runs it.

use std::path::PathBuf;
use std::process::ExitCode;

use rethread_testkit::compat::{probe, CompatRow};

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let header = args.first().is_some_and(|a| a == "--header");
    if header {
        args.remove(0);
    }
    if args.is_empty() {
        eprintln!("usage: codex-probe [--header] CODEX_BINARY...");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("codex-probe: {e}");
            return ExitCode::FAILURE;
        }
    };
    if header {
        println!("{}", CompatRow::header());
    }
    let mut failed = false;
    for binary in args {
        match runtime.block_on(probe(&PathBuf::from(&binary))) {
            Ok(row) => {
                failed |= !row.wording_mismatches.is_empty();
                println!("{row}");
            }
            Err(e) => {
                eprintln!("codex-probe: {binary}: {e}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
