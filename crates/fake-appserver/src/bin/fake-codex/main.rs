//! `fake-codex`: the fake app-server as a process, started like codex.
//!
//! ```text
//! fake-codex app-server [--listen stdio://] [--profile current|release-n|pre-history-mode] [--faults FILE]
//! fake-codex exec --experimental-json [OPTIONS] [resume <ID>] [PROMPT]
//! fake-codex --version | --help
//! ```
//!
//! It speaks newline-delimited JSON-RPC on stdin/stdout and keeps its threads under
//! `$CODEX_HOME`, so a restarted process finds them again. Without `CODEX_HOME` it keeps them in
//! a temporary home of its own (it says where on stderr, and removes it when it exits, SIGINT
//! and SIGTERM included: exit 130 and 143; killed, as rethread's client ends codex, a helper
//! process of its own removes it), never in the user's real `~/.codex`. Like codex it takes `--listen stdio://` (what the Python SDK
//! passes) and refuses any other transport; `--help` and `--version` print on stdout and exit
//! 0; a usage error exits 2. The profile can also come from `FAKE_CODEX_PROFILE`, the fault
//! script (JSON, or TOML for a `.toml` file) from `FAKE_CODEX_FAULTS` (inline JSON or a path).
//! Every model request is appended to `$CODEX_HOME/fake-model-requests.jsonl`;
//! `FAKE_CODEX_ANSWER` (`streamed`, the default, or `whole`) how the model delivers its answer;
//! `FAKE_CODEX_EVENT_LOG` names a file for the event log (requests and finished turns, with
//! times: what `cargo xtask restarts` reads to tell where a kill landed).
//!
//! `exec` stands in for `codex exec`'s JSONL mode (the TypeScript SDK's interface): one turn
//! on a fake of its own, under the same home, printed as codex prints it (see `exec.rs`).

use std::path::PathBuf;
use std::process::ExitCode;

use rethread_fake_appserver::{Ended, FakeAppServer, FakeBuilder, FaultScript, Profile};

mod exec;

const USAGE: &str = "\
Usage: fake-codex [-c key=value]... app-server [--listen stdio://] [--profile PROFILE] [--faults FILE]
       fake-codex exec --experimental-json [OPTIONS] [resume <ID>] [PROMPT]
       fake-codex --version
       fake-codex --help

A stand-in for `codex app-server` (rethread's fake): newline-delimited JSON-RPC on
stdin/stdout, threads kept under $CODEX_HOME (a temporary home when it is not set).
`exec` runs one turn and prints codex exec's JSONL events.

Options:
  -c, --config k=v    a codex config override (--enable F, --disable F too): taken, no effect
  --listen stdio://   the transport (stdio is the only one the fake serves)
  --profile PROFILE   current, release-n or pre-history-mode (or FAKE_CODEX_PROFILE)
  --faults FILE       a fault script, JSON or TOML (or FAKE_CODEX_FAULTS)
  -V, --version       print the codex version the profile imitates
  -h, --help          print this help
";

/// How a run ends badly.
pub(crate) enum Failure {
    /// Arguments the fake does not take: exit 2, like codex's argument parser.
    Usage(String),
    /// Anything else: exit 1.
    Failed(String),
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Failure::Failed(message)
    }
}

/// Set once a signal is being handled: from then on the signal thread removes the home and ends
/// the process, and the main thread (whose setup may fail because the home went away under it)
/// must not end it first with its own code.
static STOPPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Set (to a temporary home) in the helper [`TemporaryHome`] starts: that process only waits
/// for its stdin to close, then removes the home.
const REMOVER_ENV: &str = "FAKE_CODEX_REMOVE_HOME_WHEN_CLOSED";

fn main() -> ExitCode {
    #[cfg(unix)]
    if let Some(home) = std::env::var_os(REMOVER_ENV) {
        return remove_when_closed(&PathBuf::from(home));
    }
    let outcome = run();
    if STOPPING.load(std::sync::atomic::Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(Failure::Usage(message)) => {
            eprintln!("fake-codex: {message}\n\n{USAGE}");
            ExitCode::from(2)
        }
        Err(Failure::Failed(message)) => {
            eprintln!("fake-codex: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<u8, Failure> {
    let mut args = std::env::args().skip(1);
    let mut profile = match std::env::var("FAKE_CODEX_PROFILE") {
        Ok(name) => name.parse::<Profile>()?,
        Err(_) => Profile::Current,
    };
    let mut faults = FaultScript::from_env()?.unwrap_or_default();
    let mut serve = false;
    let usage = |message: String| Failure::Usage(message);
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = |what: &str| {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| usage(format!("{flag} needs {what}")))
        };
        match flag {
            "exec" | "e" if !serve => {
                let (builder, _home) = builder(profile, faults)?;
                return exec::run(args.collect(), builder);
            }
            "app-server" => serve = true,
            "--listen" => {
                let listen = value("a URL")?;
                if listen != "stdio://" {
                    return Err(usage(format!(
                        "--listen {listen}: the fake serves stdio:// only"
                    )));
                }
            }
            // codex's config overrides (what the Python SDK passes before `app-server`):
            // taken, and without effect on the fake.
            "-c" | "--config" | "--enable" | "--disable" => {
                value("a value")?;
            }
            "--profile" => profile = value("a profile")?.parse().map_err(usage)?,
            "--faults" => faults = FaultScript::from_file(&PathBuf::from(value("a file")?))?,
            "--version" | "-V" => {
                println!(
                    "codex-cli {} (rethread fake, {profile})",
                    profile.cli_version()
                );
                return Ok(0);
            }
            "--help" | "-h" => {
                print!("{USAGE}");
                return Ok(0);
            }
            _ => return Err(usage(format!("unexpected argument `{arg}`"))),
        }
    }
    if !serve {
        return Err(usage("no command given".into()));
    }
    let (builder, _home) = builder(profile, faults)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let served = runtime.block_on(builder.serve(tokio::io::stdin(), tokio::io::stdout()));
    // The stdin reader may sit in a blocking read; do not wait for it.
    runtime.shutdown_background();
    match served.map_err(|e| e.to_string())? {
        Ended::InputClosed => Ok(0),
        // Like a crash: the caller sees a failed process, not a clean exit.
        Ended::Fault => Err("exiting as the fault script says".to_string().into()),
    }
}

/// The fake for this process: `CODEX_HOME`, or a temporary home of its own (said on stderr,
/// removed when the returned guard drops), its model log there, the event log if asked for.
fn builder(
    profile: Profile,
    faults: FaultScript,
) -> Result<(FakeBuilder, Option<TemporaryHome>), Failure> {
    // Empty is unset, as codex reads it (never the working directory).
    let (home, temporary) = match std::env::var_os("CODEX_HOME").filter(|h| !h.is_empty()) {
        Some(home) => (PathBuf::from(home), None),
        None => {
            let temporary = TemporaryHome::create()?;
            eprintln!(
                "fake-codex: CODEX_HOME is not set; keeping threads in a temporary home at {} \
                 (removed when fake-codex exits)",
                temporary.path.display()
            );
            (temporary.path.clone(), Some(temporary))
        }
    };
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
    Ok((builder, temporary))
}

/// A home of the process's own under the temporary directory (owner-only), removed on drop,
/// and on SIGINT and SIGTERM. A process killed outright (SIGKILL: how rethread's client and a
/// dying rethread end codex) runs neither, so a helper process waits for the pipe the fake
/// holds to close, which the kernel does however the fake ends, and removes the home then.
struct TemporaryHome {
    path: PathBuf,
    /// The write end of the helper's stdin: never written, only closed (dropped after the
    /// removal on drop, so the helper then finds nothing left to do).
    #[cfg(unix)]
    _remover: std::process::ChildStdin,
}

impl TemporaryHome {
    fn create() -> Result<TemporaryHome, String> {
        let path = std::env::temp_dir().join(format!("fake-codex-home-{}", uuid::Uuid::now_v7()));
        let mut builder = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder
            .create(&path)
            .map_err(|e| format!("cannot create a temporary home {}: {e}", path.display()))?;
        #[cfg(unix)]
        let home = match spawn_remover(&path) {
            Ok(remover) => TemporaryHome {
                path,
                _remover: remover,
            },
            Err(error) => {
                let _ = std::fs::remove_dir_all(&path);
                return Err(error);
            }
        };
        #[cfg(not(unix))]
        let home = TemporaryHome { path };
        #[cfg(unix)]
        remove_on_signal(home.path.clone())?;
        Ok(home)
    }
}

/// Starts this binary again as the remover of `home` ([`REMOVER_ENV`]): in a process group of
/// its own, so that a terminal's Ctrl-C, which stops the fake's group, leaves it to do its work.
#[cfg(unix)]
fn spawn_remover(home: &std::path::Path) -> Result<std::process::ChildStdin, String> {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let cannot = |e: std::io::Error| format!("cannot start the remover of {}: {e}", home.display());
    let exe = std::env::current_exe().map_err(cannot)?;
    let mut child = std::process::Command::new(exe)
        .env(REMOVER_ENV, home)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(cannot)?;
    child
        .stdin
        .take()
        .ok_or_else(|| cannot(std::io::Error::other("no pipe to it")))
}

/// The remover's whole run: waits until its stdin closes (the fake that started it is gone,
/// or dropped its home), then removes `home`.
#[cfg(unix)]
fn remove_when_closed(home: &std::path::Path) -> ExitCode {
    let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
    remove_settled(home);
    ExitCode::SUCCESS
}

/// From now on SIGINT and SIGTERM remove `home` and end the process (exit 130 or 143, as a shell
/// reports a process those signals stopped): a fake its host stops leaves nothing behind.
#[cfg(unix)]
fn remove_on_signal(home: PathBuf) -> Result<(), String> {
    use tokio::signal::unix::{signal, SignalKind};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the signal runtime: {e}"))?;
    let (mut interrupt, mut terminate) = runtime
        .block_on(async {
            Ok::<_, std::io::Error>((
                signal(SignalKind::interrupt())?,
                signal(SignalKind::terminate())?,
            ))
        })
        .map_err(|e| format!("cannot handle SIGINT and SIGTERM: {e}"))?;
    std::thread::spawn(move || {
        let code = runtime.block_on(async {
            tokio::select! {
                _ = interrupt.recv() => 130,
                _ = terminate.recv() => 143,
            }
        });
        STOPPING.store(true, std::sync::atomic::Ordering::SeqCst);
        remove_settled(&home);
        std::process::exit(code);
    });
    Ok(())
}

/// Removes `home` and waits until it stays gone: the main thread may still be setting the fake
/// up (its store's `create_dir_all` makes the home again after a removal), so one removal can
/// race with it. Bounded: after two seconds the process exits whatever is left.
#[cfg(unix)]
fn remove_settled(home: &std::path::Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        let _ = std::fs::remove_dir_all(home);
        std::thread::sleep(std::time::Duration::from_millis(20));
        if !home.exists() {
            return;
        }
    }
}

impl Drop for TemporaryHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
