//! `rethread`: one turn at a time against `codex app-server`, with the codex thread kept
//! bound to the session across invocations; drop-ins for `codex app-server` and `codex exec`;
//! and, run under the name `codex`, a stand-in for codex itself (`as_codex.rs`). See
//! `rethread --help` and the README.

#![forbid(unsafe_code)]
// Runtime errors carry codex's whole error for the one-line cause; they are the cold path.
#![allow(clippy::result_large_err)]

mod app_server;
mod as_codex;
mod chat;
mod codex_bin;
mod codex_child;
#[cfg(feature = "demo")]
mod demo;
mod doctor;
mod exec;
mod logging;
mod migrate;
mod output;
mod sessions;
mod verify;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use clap::builder::TypedValueParser as _;
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};
use rethread_runtime::{BinderOptions, BoxError};
use rethread_store::{
    open_url, redact_url, BindingStore, KeyError, OpenOptions, StoreError, StoreKey,
};

use output::UsageError;

/// What every command returns: an error is printed as one line, with the exit code
/// [`output::exit_code`] gives it.
type CliResult<T = ()> = Result<T, BoxError>;

#[derive(Debug, Parser)]
#[command(
    name = "rethread",
    version,
    about = "Keep a host session and its codex thread together across restarts.",
    after_help = "Exit codes: 0 ok, 1 failed (verify: damage found; doctor: a binding is not \
                  live), 2 usage, 75 busy or temporary (retry later), 130/143 interrupted by \
                  SIGINT/SIGTERM."
)]
struct Cli {
    /// Store URL for the command that follows (as its own `--store`; the commands that keep
    /// sessions take it).
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// The store's key file for the command that follows (as its own `--store-key-file`; the
    /// commands that keep sessions take it).
    #[arg(long, value_name = "PATH")]
    store_key_file: Option<PathBuf>,
    /// The codex binary for the command that follows (as its own `--codex-bin`; the commands
    /// that start codex take it).
    #[arg(long, value_name = "PATH")]
    codex_bin: Option<PathBuf>,
    #[command(flatten)]
    app_server: app_server::AppServerGlobals,
    #[command(flatten)]
    logging: logging::LogArgs,
    #[command(subcommand)]
    command: Command,
}

/// `--store URL` and `--store-key-file PATH`, on the commands that keep sessions.
#[derive(Debug, Clone, Default, clap::Args)]
struct StoreArg {
    /// Store URL: `sqlite:PATH` (default: `rethread/rethread.sqlite` under the user's data
    /// directory), `redb:PATH` (one process at a time), `postgres://USER@HOST/DB` or `memory:`.
    // The variable's value is not shown in help: a URL may hold a password.
    #[arg(id = STORE_ID, long = "store", env = "RETHREAD_STORE", hide_env_values = true,
          value_name = "URL")]
    url: Option<String>,
    /// The file of the key that seals the store (`rethread keygen PATH` writes one; owner-only,
    /// mode 0600). Default: an unsealed store.
    // Empty accepted, as for --codex-bin, so that an empty variable reads as unset.
    #[arg(id = STORE_KEY_FILE_ID, long = "store-key-file", env = STORE_KEY_FILE_ENV,
          hide_env_values = true, value_name = "PATH",
          value_parser = clap::builder::OsStringValueParser::new().map(PathBuf::from))]
    key_file: Option<PathBuf>,
}

/// `--codex-bin PATH`, on the commands that start codex.
#[derive(Debug, Clone, Default, clap::Args)]
struct CodexBinArg {
    /// The codex binary (default: `codex` on PATH).
    // Empty accepted here (clap's path parser refuses it) so that an empty variable can be
    // read as unset ([`empty_values`]). The variable's value is not shown in help, as no
    // variable's is: unset, clap would print it as `RETHREAD_CODEX_BIN=` (empty).
    #[arg(id = CODEX_BIN_ID, long = "codex-bin", env = "RETHREAD_CODEX_BIN", hide_env_values = true,
          value_name = "PATH",
          value_parser = clap::builder::OsStringValueParser::new().map(PathBuf::from))]
    path: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one turn for a session; resumes the session's codex thread across invocations.
    Chat(chat::ChatCommand),
    /// Inspect and forget sessions.
    Sessions {
        #[command(subcommand)]
        command: sessions::SessionsCommand,
    },
    /// Probe every binding with side-effect-free reads (never a resume); exits 1 when any
    /// binding is not live (after the whole report). A thread gone here but mirrored in the
    /// store is `restorable`, or `gone` with `RETHREAD_MIRROR=off` (nothing is then restored).
    Doctor(doctor::DoctorArgs),
    /// Copy every session between stores, one at a time, each verified; with key files,
    /// seal an unsealed store's copy, unseal one, or move it to a new key.
    #[command(
        after_help = "RETHREAD_STORE_KEY_FILE does not apply here (refused when set): \
                            each store's key is named by --from-key-file / --to-key-file."
    )]
    Migrate {
        /// Source store URL.
        #[arg(long, value_name = "URL")]
        from: String,
        /// Destination store URL.
        #[arg(long, value_name = "URL")]
        to: String,
        /// The key file of the source store (default: unsealed).
        #[arg(long, value_name = "PATH", value_parser = clap::builder::PathBufValueParser::new())]
        from_key_file: Option<PathBuf>,
        /// The key file of the destination store (default: unsealed).
        #[arg(long, value_name = "PATH", value_parser = clap::builder::PathBufValueParser::new())]
        to_key_file: Option<PathBuf>,
        /// Print one JSON object: `from`, `to`, `sessions`, `copied`, `already_present`,
        /// `rows_copied`, `mirror_bytes_copied`, `verified`.
        #[arg(long)]
        json: bool,
    },
    /// Check every record of the store; exit 1 when damage is found.
    Verify {
        #[command(flatten)]
        store: StoreArg,
        /// Print one JSON object: `store`, `ok`, `complete`, `sessions`, `rows`, `leases`,
        /// `mirror_files`, `mirror_bytes`, `problems` (each `kind`, `session_id`, `detail`),
        /// `unlisted_problems` (also when damage is found).
        #[arg(long)]
        json: bool,
    },
    /// Play the restart story on the bundled fake app-server; needs nothing installed.
    #[cfg(feature = "demo")]
    Demo {
        /// Print the story as one JSON object: `ok`, `steps` (`title`, `lines`, `checks`),
        /// and `error` when a check failed.
        #[arg(long)]
        json: bool,
    },
    /// Write a new key for a sealed store to a new file PATH (owner-only, mode 0600; never
    /// overwrites anything). Keep it apart from the store and its backups; name it with
    /// `--store-key-file PATH` or `RETHREAD_STORE_KEY_FILE`.
    Keygen {
        /// The key file to create.
        #[arg(value_name = "PATH", value_parser = clap::builder::PathBufValueParser::new())]
        path: PathBuf,
    },
    /// Print a completion script for SHELL on stdout, e.g. `rethread completions bash >
    /// ~/.local/share/bash-completion/completions/rethread` (the directory must exist).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// A drop-in `codex exec` (the TypeScript SDK's interface): ARGS go to `<codex> exec`;
    /// with RETHREAD_SESSION set, the run goes on the session's codex thread.
    #[command(disable_help_flag = true)]
    Exec(exec::ExecCommand),
    /// A drop-in `codex app-server` for any client: ARGS go to `<codex> app-server` verbatim.
    #[command(
        disable_help_flag = true,
        after_help = app_server::HELP,
        after_long_help = app_server::HELP
    )]
    AppServer(app_server::AppServerArgs),
}

fn main() -> ExitCode {
    // Started by rethread to become codex (`codex_child.rs`).
    if let Some(code) = codex_child::main_if_shim() {
        return code;
    }
    // Installed as `codex` (a link named so): every argument is codex's.
    if let Some(code) = as_codex::main_if_named_codex() {
        return code;
    }
    let matches = Cli::command()
        .try_get_matches()
        .unwrap_or_else(|error| typed_only(error).exit());
    let mut cli = Cli::from_arg_matches(&matches)
        .unwrap_or_else(|error| error.format(&mut Cli::command()).exit());
    logging::init(&cli.logging);
    let name = matches.subcommand_name().unwrap_or_default();
    if let Err(cause) = empty_values(&matches).and_then(|empty| cli.take_flags(name, empty)) {
        return output::fail(&cause, output::EXIT_USAGE);
    }
    // The key is read before anything else happens, and once: a refused key file changes
    // nothing.
    let key_file = cli
        .command
        .flags()
        .0
        .and_then(|store| store.key_file.clone());
    if let Err(error) = load_store_key(key_file.as_deref()) {
        return output::fail(&error.to_string(), output::EXIT_USAGE);
    }
    if let Command::AppServer(args) = cli.command {
        return match args.codex_bin.resolve() {
            Ok(codex) => app_server::main(&codex, &cli.app_server, args),
            Err(usage) => output::fail(&usage.0, output::EXIT_USAGE),
        };
    }
    if let Err(cause) = cli.app_server.ensure_unused() {
        return output::fail(&cause, output::EXIT_USAGE);
    }
    match cli.command {
        Command::Exec(cmd) => match cmd.codex_bin.resolve() {
            Ok(codex) => exec::main(&codex, cmd.store.url.as_deref(), Vec::new(), cmd.args),
            Err(usage) => output::fail(&usage.0, output::EXIT_USAGE),
        },
        Command::Completions { shell } => completions(shell),
        Command::Keygen { path } => keygen(&path),
        // Background work (a lease release of a dropped binder) gets a moment; the process
        // exit must not wait on a wedged store.
        command => output::run_to_exit(
            tokio::runtime::Builder::new_multi_thread(),
            Duration::from_secs(1),
            "",
            async { run(command).await.map(|()| output::EXIT_OK) },
        ),
    }
}

/// clap's usage line after an error lists the arguments given, and counts one set by its
/// variable (`RETHREAD_STORE`, `RETHREAD_CODEX_BIN`) as given: then it reads as required. The
/// same error from the command without its variables shows only what was typed. Help and
/// the version (no error) are kept as they are.
fn typed_only(error: clap::Error) -> clap::Error {
    fn without_env(command: clap::Command) -> clap::Command {
        command
            .mut_args(|arg| arg.env(None::<&str>))
            .mut_subcommands(without_env)
    }
    if !error.use_stderr() {
        return error;
    }
    match without_env(Cli::command()).try_get_matches() {
        Err(typed) if typed.kind() == error.kind() => typed,
        _ => error,
    }
}

impl Cli {
    /// Moves `--store`, `--store-key-file` and `--codex-bin` given before the command `name`
    /// into it, which takes them as its own (given there too, the one before the command
    /// wins); one the command does not take is a usage error. A value of the command's own
    /// that came from an empty variable (`empty`: store, store key file, codex-bin) is
    /// dropped. `migrate` refuses a store key file from `RETHREAD_STORE_KEY_FILE` too: it has
    /// two stores, and copying with the variable ignored would unseal without being asked.
    fn take_flags(&mut self, name: &str, empty: [bool; 3]) -> Result<(), String> {
        let migrate_keys = "migrate has two stores: name their keys with --from-key-file and \
                            --to-key-file";
        if matches!(self.command, Command::Migrate { .. }) {
            if self.store_key_file.is_some() {
                return Err(format!(
                    "--store-key-file does not apply to {name}; {migrate_keys}"
                ));
            }
            if env_var(STORE_KEY_FILE_ENV, "").map_err(|e| e.0)?.is_some() {
                return Err(format!(
                    "{STORE_KEY_FILE_ENV} does not apply to {name}; {migrate_keys} (and unset \
                     the variable)"
                ));
            }
        }
        let (store, codex_bin) = self.command.flags();
        let (url, key_file) = match store {
            Some(store) => (Some(&mut store.url), Some(&mut store.key_file)),
            None => (None, None),
        };
        let codex_bin = codex_bin.map(|codex_bin| &mut codex_bin.path);
        move_flag(self.store.take(), url, empty[0], "--store", name)?;
        move_flag(
            self.store_key_file.take(),
            key_file,
            empty[1],
            "--store-key-file",
            name,
        )?;
        move_flag(
            self.codex_bin.take(),
            codex_bin,
            empty[2],
            "--codex-bin",
            name,
        )
    }
}

/// Moves the value of `flag` given before the command `name` into the command's own `slot`
/// (a usage error when it has none); `from_empty_env`: the command's own value came from an
/// empty variable, and is dropped.
fn move_flag<T>(
    given: Option<T>,
    slot: Option<&mut Option<T>>,
    from_empty_env: bool,
    flag: &str,
    name: &str,
) -> Result<(), String> {
    match (given, slot) {
        (Some(value), Some(slot)) => *slot = Some(value),
        (Some(_), None) => return Err(format!("{flag} does not apply to {name}")),
        (None, Some(slot)) if from_empty_env => *slot = None,
        _ => {}
    }
    Ok(())
}

impl CodexBinArg {
    /// The codex to start; refused if it is rethread itself.
    fn resolve(&self) -> Result<PathBuf, UsageError> {
        codex_bin::resolve(self.path.as_deref(), codex_bin::Pick::First)
    }
}

impl Command {
    /// Its `--store` and `--codex-bin`, where it takes them.
    fn flags(&mut self) -> (Option<&mut StoreArg>, Option<&mut CodexBinArg>) {
        match self {
            Command::Exec(args) => (Some(&mut args.store), Some(&mut args.codex_bin)),
            Command::AppServer(args) => (Some(&mut args.store), Some(&mut args.codex_bin)),
            Command::Doctor(args) => (Some(&mut args.store), Some(&mut args.codex_bin)),
            Command::Chat(args) => (Some(&mut args.store), Some(&mut args.codex_bin)),
            Command::Sessions { command } => (Some(command.store()), None),
            Command::Verify { store, .. } => (Some(store), None),
            _ => (None, None),
        }
    }
}

/// `completions SHELL`: the script is rendered in memory (clap_complete panics on a failed
/// write), then written; a reader that stopped early (`| head`) is not a failure.
fn completions(shell: clap_complete::Shell) -> ExitCode {
    use std::io::Write;
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "rethread", &mut script);
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(&script).and_then(|()| stdout.flush()) {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => output::fail(
            &format!("cannot write the completion script: {error}"),
            output::EXIT_FAILED,
        ),
        _ => ExitCode::from(output::EXIT_OK),
    }
}

/// `keygen PATH`: a new key in a new file; what is printed names the file and the key's
/// fingerprint, never the key. A path already taken is a usage error.
fn keygen(path: &Path) -> ExitCode {
    match StoreKey::write_new(path) {
        Ok(key) => {
            output::outln!(
                "wrote a new store key to {} (fingerprint {}); keep it apart from the store and \
                 its backups",
                output::for_people(&path.display().to_string()),
                key.fingerprint()
            );
            ExitCode::from(output::EXIT_OK)
        }
        Err(error @ KeyError::Exists { .. }) => {
            output::fail(&error.to_string(), output::EXIT_USAGE)
        }
        Err(error) => output::fail(&error.to_string(), output::EXIT_FAILED),
    }
}

/// The clap ids of the commands' `--store`, `--store-key-file` and `--codex-bin` (read back by
/// [`empty_values`]).
const STORE_ID: &str = "store_url";
const STORE_KEY_FILE_ID: &str = "store_key_file_path";
const CODEX_BIN_ID: &str = "codex_bin_path";

/// The variable naming the store's key file.
pub(crate) const STORE_KEY_FILE_ENV: &str = "RETHREAD_STORE_KEY_FILE";

/// clap takes an empty variable as a value (it has no setting to skip one): whether the
/// command's `--store`, `--store-key-file` and `--codex-bin` came from an empty
/// `RETHREAD_STORE` / `RETHREAD_STORE_KEY_FILE` / `RETHREAD_CODEX_BIN`, to be read as unset.
/// Typed empty (`--store ""`, before the command or after it) is a usage error, as
/// `--session ""` is.
fn empty_values(matches: &ArgMatches) -> Result<[bool; 3], String> {
    let typed = |flag: &str| format!("{flag} is empty; name one or leave it out for the default");
    for (id, flag) in [
        ("store", "--store"),
        ("store_key_file", "--store-key-file"),
        ("codex_bin", "--codex-bin"),
    ] {
        if is_empty(matches, id) {
            return Err(typed(flag));
        }
    }
    let mut leaf = matches;
    while let Some((_, sub)) = leaf.subcommand() {
        leaf = sub;
    }
    let from_env = |id: &str, flag: &str| match is_empty(leaf, id) {
        false => Ok(false),
        true if leaf.value_source(id) == Some(ValueSource::EnvVariable) => Ok(true),
        true => Err(typed(flag)),
    };
    Ok([
        from_env(STORE_ID, "--store")?,
        from_env(STORE_KEY_FILE_ID, "--store-key-file")?,
        from_env(CODEX_BIN_ID, "--codex-bin")?,
    ])
}

/// Whether `id` was given, empty (`false` where the command has no such argument).
fn is_empty(matches: &ArgMatches, id: &str) -> bool {
    let values = matches.try_get_raw(id).ok().flatten();
    values.is_some_and(|mut values| values.all(|value| value.is_empty()))
}

/// The session settings of `chat`, `app-server` and `exec`: `wait` for a session another
/// process holds; the lease's TTL, `RETHREAD_LEASE_TTL` (seconds from 0.1 to 86400; unset or
/// empty keeps the library's 30 s); the mirror ([`mirror`]) and its cap, `RETHREAD_MIRROR_CAP`
/// (rollout bytes; unset or empty keeps the library's 1 GiB).
pub(crate) fn binder_options(wait: Duration, no_mirror: bool) -> Result<BinderOptions, UsageError> {
    const LEASE_TTL_ENV: &str = "RETHREAD_LEASE_TTL";
    let ttl = env_var(LEASE_TTL_ENV, "")?.map(|text| match text.parse::<f64>() {
        Ok(secs) if (0.1..=86_400.0).contains(&secs) => Ok(Duration::from_secs_f64(secs)),
        _ => Err(UsageError(format!(
            "{LEASE_TTL_ENV}: `{text}` is not a number of seconds between 0.1 and 86400"
        ))),
    });
    let ttl = ttl.transpose()?;
    let cap = std::env::var_os(rethread_runtime::MIRROR_CAP_ENV);
    let cap = rethread_runtime::mirror_cap_setting(cap.as_deref()).map_err(UsageError)?;
    let options = BinderOptions::default()
        .lease_wait(wait)
        .mirror(mirror(no_mirror)?)
        .mirror_cap(cap);
    Ok(match ttl {
        Some(ttl) => options.lease_ttl(Some(ttl)),
        None => options,
    })
}

/// A rethread variable: `None` when unset or empty, as every one is read; one that is not
/// UTF-8 is refused (`name is not UTF-8` and the `hint`).
pub(crate) fn env_var(name: &str, hint: &str) -> Result<Option<String>, UsageError> {
    match std::env::var(name) {
        Ok(value) => Ok(Some(value).filter(|value| !value.is_empty())),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(UsageError(format!("{name} is not UTF-8{hint}")))
        }
    }
}

/// Whether to mirror the session's rollout: on unless `no_mirror` or `RETHREAD_MIRROR=off`;
/// a `RETHREAD_MIRROR` that is neither `on` nor `off` is a usage error.
fn mirror(no_mirror: bool) -> Result<bool, UsageError> {
    let env = std::env::var_os(rethread_runtime::MIRROR_ENV);
    let on = rethread_runtime::mirror_setting(env.as_deref()).map_err(UsageError)?;
    Ok(on && !no_mirror)
}

/// `--wait SECS`: a finite, non-negative number of seconds.
fn parse_wait(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(secs) if secs.is_finite() && (0.0..=86_400.0).contains(&secs) => Ok(secs),
        _ => Err(format!(
            "`{text}` is not a number of seconds between 0 and 86400"
        )),
    }
}

async fn run(command: Command) -> CliResult {
    match command {
        Command::Chat(command) => chat::main(command).await,
        Command::Sessions { command } => sessions::run(command).await,
        Command::Doctor(args) => doctor::run(args).await,
        Command::Migrate {
            from,
            to,
            from_key_file,
            to_key_file,
            json,
        } => {
            let from = (from.as_str(), from_key_file.as_deref());
            migrate::run(from, (&to, to_key_file.as_deref()), json).await
        }
        Command::Verify { store, json } => {
            let url = store_url(store.url.as_deref())?;
            let store = open_store_url(&url, Access::Inspect, command_key()).await?;
            verify::run(store, &redact_url(&url), json).await
        }
        #[cfg(feature = "demo")]
        Command::Demo { json } => demo::run(json).await,
        Command::AppServer { .. }
        | Command::Exec { .. }
        | Command::Completions { .. }
        | Command::Keygen { .. } => {
            unreachable!("handled in main, without a runtime")
        }
    }
}

/// The store URL: `--store` / `RETHREAD_STORE`, else `sqlite:<data dir>/rethread/rethread.sqlite`
/// (several processes share it: `chat`s and `app-server`s at once).
fn store_url(url: Option<&str>) -> CliResult<String> {
    if let Some(url) = url {
        return Ok(url.to_string());
    }
    let data = dirs::data_dir().ok_or("no user data directory; pass --store URL")?;
    let path = data.join("rethread").join("rethread.sqlite");
    Ok(format!("sqlite:{}", path.display()))
}

/// What a command does with the store.
#[derive(Clone, Copy, Debug)]
enum Access {
    /// It writes: a missing store is created (with its directory); opening waits this long for
    /// another process that holds the store (redb).
    Write(Duration),
    /// It changes what exists only: a missing store is `no store at PATH` (exit 1).
    Existing,
    /// It removes what it finds (`sessions prune`): as `Existing`, but a missing store holds
    /// nothing to remove: it reads as an empty store, as for `Inspect`, and nothing is
    /// created.
    Tidy,
    /// It only reads: as `Existing`, and opened read-only, so nothing in it or beside it
    /// changes.
    Read,
    /// It reports what is stored: as `Read`, but a missing store is nothing stored yet, not a
    /// failure: it reads as an empty store, and a line on stderr says so.
    Inspect,
}

/// The key of the store the command opens (`--store-key-file` / `RETHREAD_STORE_KEY_FILE`),
/// read by [`load_store_key`] before the command runs. Kept here rather than passed along:
/// the store is opened in many places (each command, `exec`'s and `app-server`'s drivers,
/// rethread run as `codex`), always through [`open_store`], and the key is one per process.
static STORE_KEY: OnceLock<(StoreKey, PathBuf)> = OnceLock::new();

/// Reads the key file `path` (if any) as the key of the store the command opens.
pub(crate) fn load_store_key(path: Option<&Path>) -> Result<(), KeyError> {
    if let Some(path) = path {
        let key = StoreKey::read(path)?;
        tracing::debug!(key_file = %path.display(), fingerprint = %key.fingerprint(), "store key read");
        // Set once per process, by `main` or by rethread run as `codex`: never both.
        let _ = STORE_KEY.set((key, path.to_path_buf()));
    }
    Ok(())
}

/// The key read by [`load_store_key`], if any.
fn command_key() -> Option<StoreKey> {
    STORE_KEY.get().map(|(key, _)| key.clone())
}

/// Opens the command's store (`url`, else the default) with the command's key; a key that
/// does not fit the store is said with its file (never its content).
async fn open_store(url: Option<&str>, access: Access) -> CliResult<BindingStore> {
    let opened = open_store_url(&store_url(url)?, access, command_key()).await;
    opened.map_err(|error| {
        let refused = output::chain(&*error).any(|e| {
            matches!(
                e.downcast_ref::<StoreError>(),
                Some(StoreError::WrongKey { .. } | StoreError::NotSealed { .. })
            )
        });
        match STORE_KEY.get() {
            Some((_, path)) if refused => Box::new(WithKeyFile {
                source: error,
                path: path.clone(),
            }),
            _ => error,
        }
    })
}

/// A store refusing the key read from `path`.
#[derive(Debug, thiserror::Error)]
#[error("{source} (key file {})", path.display())]
struct WithKeyFile {
    source: BoxError,
    path: PathBuf,
}

/// Opens the store at `url` for `access`, sealed with `key` if given.
async fn open_store_url(
    url: &str,
    access: Access,
    key: Option<StoreKey>,
) -> CliResult<BindingStore> {
    tracing::debug!(store = %redact_url(url), ?access, sealed = key.is_some(), "opening the store");
    let options = match access {
        Access::Write(wait) => OpenOptions::default().wait(wait),
        Access::Existing | Access::Tidy => OpenOptions::default().create(false),
        Access::Read | Access::Inspect => OpenOptions::default().create(false).read_only(true),
    };
    let options = options.key(key);
    match open_url(url, options).await {
        Err(StoreError::NoStore { path, .. })
            if matches!(access, Access::Inspect | Access::Tidy) =>
        {
            output::eprint_line(&format!(
                "rethread: no store yet at {path}; nothing is stored before the first turn"
            ));
            Ok(BindingStore::memory())
        }
        opened => opened.map_err(|source| {
            let url = redact_url(url);
            OpenStoreError { url, source }.into()
        }),
    }
}

/// A store that could not be opened; the exit code follows from the store's error (a store
/// locked by another process is temporary).
#[derive(Debug, thiserror::Error)]
#[error("cannot open store {url}: {source}")]
struct OpenStoreError {
    /// The URL, password redacted.
    url: String,
    source: StoreError,
}

/// Runs `codex ARGS...` in this process's place (Unix: the same process, so every byte,
/// signal and exit code is codex's); elsewhere as a child whose exit code is passed on.
pub(crate) fn hand_over(codex: &Path, args: &[OsString]) -> ExitCode {
    let mut command = std::process::Command::new(codex);
    command.args(args);
    let cannot = |error| format!("could not start `{}`: {error}", codex.display());
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        output::fail(&cannot(command.exec()), output::EXIT_FAILED)
    }
    #[cfg(not(unix))]
    match command.status() {
        Ok(status) => ExitCode::from(status.code().map_or(1, |c| c as u8)),
        Err(error) => output::fail(&cannot(error), output::EXIT_FAILED),
    }
}
