//! The long-running server pattern: one `codex app-server` client shared by many sessions,
//! one [`SessionBinder`] kept per session, and codex restarting under the server. When codex
//! exits, the server starts a new one and opens each session again with the binder it keeps:
//! every session goes on with its own thread (and the model with its memory).
//!
//! Runs offline against the bundled fake (CI does this):
//!
//! ```sh
//! cargo build -p rethread-fake-appserver --bin fake-codex
//! RETHREAD_CODEX_BIN=target/debug/fake-codex cargo run -p rethread --example long_running_server
//! ```
//!
//! With a real codex, point `RETHREAD_CODEX_BIN` at it (default: `codex` on `PATH`).

use std::collections::HashMap;
use std::error::Error;

use rethread::{
    open_url, AppServerClient, BinderOptions, BindingStore, CodexCommand, OpenOptions,
    RuntimeError, SessionBinder, StatusRail,
};

/// Starts codex with a fixed `CODEX_HOME`: the threads live there, across codex restarts.
async fn start_codex(
    program: &str,
    home: &std::path::Path,
) -> Result<AppServerClient, Box<dyn Error>> {
    let command = CodexCommand::new(program).env("CODEX_HOME", home.display().to_string());
    Ok(AppServerClient::spawn(&command).await?)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let program = std::env::var("RETHREAD_CODEX_BIN").unwrap_or_else(|_| "codex".to_string());
    let dir = tempfile::tempdir()?;
    let home = dir.path().join("codex-home");
    std::fs::create_dir_all(&home)?;
    let url = format!("sqlite:{}", dir.path().join("rethread.sqlite").display());
    let store: BindingStore = open_url(&url, OpenOptions::default()).await?;
    let (rail, notices) = StatusRail::recording();

    let mut client = start_codex(&program, &home).await?;
    // One binder per session, kept for the server's life: it holds the session's lease and
    // reopens the session on whatever client is current.
    let mut binders: HashMap<&str, SessionBinder> = HashMap::new();
    let mut threads: HashMap<&str, Vec<String>> = HashMap::new();
    for round in 1..=3 {
        for session in ["alice", "bob"] {
            let binder = binders.entry(session).or_insert_with(|| {
                let options = BinderOptions::default().codex_home(Some(home.display().to_string()));
                SessionBinder::new(session, store.clone(), rail.clone()).with_options(options)
            });
            let mut codex = match binder.open(&client).await {
                Ok(codex) => codex,
                // Codex exited: start a new one and open the session again. The binder reads
                // the store, so the session resumes its thread on the new client.
                Err(RuntimeError::Client(error)) => {
                    eprintln!("codex is gone ({error}); starting a new one");
                    client = start_codex(&program, &home).await?;
                    binder.open(&client).await?
                }
                Err(other) => return Err(other.into()),
            };
            let report = codex.run_turn(format!("{session}, round {round}")).await?;
            println!(
                "{session} round {round}: {} on thread {} ({})",
                report.reply,
                report.thread_id,
                codex.outcome().as_str()
            );
            threads.entry(session).or_default().push(report.thread_id);
        }
        if round == 1 {
            // Codex exits under the server (a crash, an upgrade, an OOM kill).
            client.shutdown().await;
        }
    }
    for (session, seen) in &threads {
        assert!(
            seen.iter().all(|thread| *thread == seen[0]),
            "{session} moved threads: {seen:?}"
        );
    }
    assert!(
        notices.events().is_empty(),
        "no notice: {:?}",
        notices.events()
    );
    for (_, binder) in binders {
        binder.close().await?;
    }
    println!("every session kept its thread across the codex restart");
    Ok(())
}
