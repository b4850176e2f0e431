//! `rethread`: one turn at a time against `codex app-server`, with the codex thread kept
//! bound to the session across invocations. See `rethread --help` and the README.

#![forbid(unsafe_code)]
// Runtime errors carry codex's whole error for the one-line cause; they are the cold path.
#![allow(clippy::result_large_err)]

mod chat;
mod demo;
mod doctor;
mod migrate;
mod output;
mod sessions;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use rethread_store::{open_url, redact_url, BindingStore, OpenOptions};

/// The error every command returns: printed as one line, exit code 1.
type CliResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Debug, Parser)]
#[command(
    name = "rethread",
    version,
    about = "Keep a host session and its codex thread together across restarts."
)]
struct Cli {
    /// Store URL: `redb:PATH` (default: a file under the user's data directory) or `sqlite:PATH`.
    #[arg(long, env = "RETHREAD_STORE", global = true, value_name = "URL")]
    store: Option<String>,
    /// The codex binary (default: `codex` on PATH).
    #[arg(long, env = "RETHREAD_CODEX_BIN", global = true, value_name = "PATH")]
    codex_bin: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one turn for a session; resumes the session's codex thread across invocations.
    Chat {
        /// The host session id.
        #[arg(long, value_name = "ID")]
        session: String,
        /// Print one JSON object instead of the reply.
        #[arg(long)]
        json: bool,
        /// The message.
        message: String,
    },
    /// Inspect and forget sessions.
    Sessions {
        #[command(subcommand)]
        command: SessionsCommand,
    },
    /// Probe every binding with a side-effect-free `thread/read`.
    Doctor {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Copy every session between stores.
    Migrate {
        /// Source store URL.
        #[arg(long, value_name = "URL")]
        from: String,
        /// Destination store URL.
        #[arg(long, value_name = "URL")]
        to: String,
    },
    /// Play the restart story on the bundled fake app-server; needs nothing installed.
    Demo,
}

#[derive(Debug, Subcommand)]
enum SessionsCommand {
    /// List sessions.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one session.
    Show {
        /// The session id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a session, its transcript and its binding.
    Forget {
        /// The session id.
        id: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return output::fail(&format!("could not start the async runtime: {error}")),
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => output::fail(&error.to_string()),
    }
}

async fn run(cli: Cli) -> CliResult {
    let codex = cli
        .codex_bin
        .clone()
        .unwrap_or_else(|| PathBuf::from("codex"));
    match cli.command {
        Command::Chat {
            session,
            json,
            message,
        } => {
            let store = open_store(cli.store.as_deref()).await?;
            chat::run(store, &codex, &session, &message, json).await
        }
        Command::Sessions { command } => {
            let store = open_store(cli.store.as_deref()).await?;
            match command {
                SessionsCommand::List { json } => sessions::list(store, json).await,
                SessionsCommand::Show { id, json } => sessions::show(store, &id, json).await,
                SessionsCommand::Forget { id } => sessions::forget(store, &id).await,
            }
        }
        Command::Doctor { json } => {
            let store = open_store(cli.store.as_deref()).await?;
            doctor::run(store, &codex, json).await
        }
        Command::Migrate { from, to } => migrate::run(&from, &to).await,
        Command::Demo => demo::run().await,
    }
}

/// The default store: `redb:<data dir>/rethread/rethread.redb`.
fn default_store_url() -> CliResult<String> {
    let data = dirs::data_dir().ok_or("no user data directory; pass --store URL")?;
    Ok(format!(
        "redb:{}",
        data.join("rethread").join("rethread.redb").display()
    ))
}

async fn open_store(url: Option<&str>) -> CliResult<Arc<dyn BindingStore>> {
    let url = match url {
        Some(url) => url.to_string(),
        None => default_store_url()?,
    };
    open_store_url(&url).await
}

/// Opens a store by URL, creating the directory of a new store file.
async fn open_store_url(url: &str) -> CliResult<Arc<dyn BindingStore>> {
    open_url(url, OpenOptions::default().create_dirs(true))
        .await
        .map_err(|e| format!("cannot open store {}: {e}", redact_url(url)).into())
}
