//! `fake-codex`: the fake app-server as a process, started like codex.
//!
//! ```text
//! fake-codex app-server [--profile current|release-n|pre-history-mode] [--faults FILE]
//! fake-codex --version
//! ```
//!
//! It speaks newline-delimited JSON-RPC on stdin/stdout and keeps its threads under
//! `$CODEX_HOME` (default `~/.codex`), so a restarted process finds them again. The profile can
//! also come from `FAKE_CODEX_PROFILE`, the fault script (JSON, or TOML for a `.toml` file) from
//! `FAKE_CODEX_FAULTS` (inline JSON or a path). Every model request is appended to `$CODEX_HOME/fake-model-requests.jsonl`;
//! `FAKE_CODEX_ANSWER` (`streamed`, the default, or `whole`) how the model delivers its answer;
//! `FAKE_CODEX_EVENT_LOG` names a file for the event log (requests and finished turns, with
//! times: what `cargo xtask restarts` reads to tell where a kill landed).

use std::path::PathBuf;
use std::process::ExitCode;

use rethread_fake_appserver::{Ended, FakeAppServer, FaultScript, Profile};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("fake-codex: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let mut profile = match std::env::var("FAKE_CODEX_PROFILE") {
        Ok(name) => name.parse::<Profile>()?,
        Err(_) => Profile::Current,
    };
    let mut faults = FaultScript::from_env()?.unwrap_or_default();
    let mut serve = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "app-server" => serve = true,
            "--profile" => profile = args.next().ok_or("--profile needs a value")?.parse()?,
            "--faults" => {
                let path = args.next().ok_or("--faults needs a file")?;
                faults = FaultScript::from_file(&PathBuf::from(path))?;
            }
            "--version" | "-V" => {
                println!(
                    "codex-cli {} (rethread fake, {profile})",
                    profile.cli_version()
                );
                return Ok(());
            }
            other => return Err(format!("unexpected argument `{other}`")),
        }
    }
    if !serve {
        return Err("usage: fake-codex app-server [--profile P] [--faults FILE]".into());
    }
    let home = match std::env::var_os("CODEX_HOME") {
        Some(home) => PathBuf::from(home),
        None => std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join(".codex"))
            .ok_or("neither CODEX_HOME nor HOME is set")?,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let builder = FakeAppServer::builder()
        .profile(profile)
        .faults(faults)
        .model_log(home.join("fake-model-requests.jsonl"))
        .codex_home(home);
    let builder = match std::env::var("FAKE_CODEX_ANSWER") {
        Ok(shape) => builder.answer(shape.parse()?),
        Err(_) => builder,
    };
    let builder = match std::env::var_os("FAKE_CODEX_EVENT_LOG") {
        Some(path) => builder.event_log(PathBuf::from(path)),
        None => builder,
    };
    let served = runtime.block_on(builder.serve(tokio::io::stdin(), tokio::io::stdout()));
    // The stdin reader may sit in a blocking read; do not wait for it.
    runtime.shutdown_background();
    match served.map_err(|e| e.to_string())? {
        Ended::InputClosed => Ok(()),
        // Like a crash: the caller sees a failed process, not a clean exit.
        Ended::Fault => Err("exiting as the fault script says".to_string()),
    }
}
