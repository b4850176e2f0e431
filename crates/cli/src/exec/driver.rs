//! The session machine driven with `codex exec` processes (the table in
//! `docs/architecture.md`): a resume is a process started with `resume <id>`, a start one with
//! the run's own arguments; a commit is awaited before the `turn.completed` line goes on.

use std::ffi::OsString;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use rethread_protocol::messages::ThreadResumeParams;
use rethread_protocol::messages::{ThreadItem, UserInput};
use rethread_runtime::binding::{self, seeded_instructions, Answer, Opened, Opener, StoreSide};
use rethread_runtime::kept;
use rethread_runtime::machine::{Say, SessionMachine, Stored};
use rethread_runtime::projection::project_turn_input;
use rethread_runtime::{BoxError, ClientError, RuntimeError, SessionLease, Transcript};
use rethread_store::{BindingStore, LocalOwner};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use super::process::{field, write_stderr, Exit, First, Process};
use super::{kind_of, Kind, Setup};
use crate::chat::{late_signal, SIGNAL_GRACE};
use crate::output::{self, Interrupted};

/// Runs the session's turn: the store and the lease first, then codex; the lease is released
/// however it ends. Returns the exit code. Without a session, a thread codex names is kept
/// by that id: codex first, then the thread's lease.
pub(super) async fn run(mut setup: Setup) -> Result<u8, BoxError> {
    // Before codex starts: a signal from here on is this process's to handle.
    let mut signal: Signal<'_> = pin!(crate::chat::interrupted());
    let store = crate::open_store(setup.store.as_deref(), crate::Access::Write(Duration::ZERO));
    let store = store.await?;
    let mut started = None;
    if setup.session.is_empty() {
        match start_kept(&setup, &store, signal.as_mut()).await? {
            Ok((process, thread_id, lines)) => {
                setup.session = kept::key(&thread_id);
                started = Some((process, thread_id, lines));
            }
            Err(code) => return Ok(code),
        }
    }
    let setup = &setup;
    let (options, owner) = (&setup.options, Arc::new(LocalOwner::new()));
    // Always set: the library's default, or RETHREAD_LEASE_TTL.
    let ttl = options.lease_ttl.unwrap_or(Duration::from_secs(30));
    let acquire = SessionLease::acquire(
        store.clone(),
        &setup.session,
        owner,
        ttl,
        options.lease_wait,
    );
    let acquired = unless_interrupted(acquire, &mut signal).await;
    if let (Some((process, ..)), false) = (&mut started, matches!(acquired, Ok(Ok(_)))) {
        process.kill().await;
    }
    let lease = acquired??;
    let mirror = options.rollout_mirror();
    let side = StoreSide {
        store: &store,
        session_id: &setup.session,
        lease: Some(&lease),
        transcript: &Transcript::Store,
        mirror: mirror.as_ref(),
        codex_home: options.codex_home.as_deref(),
    };
    let mut driver = Driver::new(setup, side);
    let result = match (started, kind_of(&setup.run)) {
        (Some((process, thread_id, lines)), _) => {
            let stored = Some(&Stored::Unbound);
            driver
                .machine
                .handle_client_thread(&thread_id, false, stored);
            driver
                .forward(process, &thread_id, &lines, signal.as_mut())
                .await
        }
        (None, Kind::Own) => driver.own_thread(signal.as_mut()).await,
        (None, _) => driver.session_thread(signal.as_mut()).await,
    };
    if let Err(error) = lease.release().await {
        output::warning(&format!(
            "could not release the session's lease (it expires on its own): {error}"
        ));
    }
    result
}

/// A run without a session that does not name its thread by id: codex is started first (a
/// fork's source restored before, from its own record), and the thread it names is kept.
/// `Err(code)`: codex exited before its thread started, its output passed on.
async fn start_kept(
    setup: &Setup,
    store: &BindingStore,
    signal: Signal<'_>,
) -> Result<Result<(Process, String, Vec<u8>), u8>, BoxError> {
    let fork = setup.run.subcommand() == Some("fork");
    let source = setup.run.thread_id().filter(|_| fork).map(kept::key);
    let (key, mirror) = (source.unwrap_or_default(), setup.options.rollout_mirror());
    let side = StoreSide {
        store,
        session_id: &key,
        lease: None,
        transcript: &Transcript::Store,
        mirror: mirror.as_ref(),
        codex_home: None,
    };
    if let Some(source) = kept::thread_of(&key) {
        // A session's thread is never forked without its session.
        let source = binding::client_thread(store, &key, Some(source), true).await?;
        side.restore_named(source.as_str()).await;
    }
    let mut driver = Driver::new(setup, side);
    Ok(
        match driver.start_process(setup.run.args(), signal).await? {
            (process, First::Started { thread_id, lines }) => Ok((process, thread_id, lines)),
            (_, First::Exited(exit)) => Err(driver.pass_on(exit).await?),
        },
    )
}

struct Driver<'a> {
    setup: &'a Setup,
    /// The store side of the machine's actions (every driver's).
    side: StoreSide<'a>,
    machine: SessionMachine,
    /// What the machine said while opening, said once the new thread is known.
    said: Vec<Say>,
    /// The `error` items said so far (ids `rethread_0`, ...).
    items: u64,
    stdout: tokio::io::Stdout,
}

type Signal<'s> = Pin<&'s mut dyn Future<Output = Interrupted>>;

impl<'a> Driver<'a> {
    fn new(setup: &'a Setup, side: StoreSide<'a>) -> Self {
        let machine = SessionMachine::new(&setup.session, setup.options.machine_options());
        Driver {
            setup,
            side,
            machine,
            said: Vec::new(),
            items: 0,
            stdout: tokio::io::stdout(),
        }
    }
}

/// Writes `bytes` to the client; `Err` when a signal came, whether or not the line got out.
/// The write is tried first (a signal that came during the commit lets the committed turn's
/// line out) and, after a signal, given [`SIGNAL_GRACE`]: a client that stopped reading does
/// not hold the run.
async fn write_unless_interrupted(
    stdout: &mut tokio::io::Stdout,
    bytes: &[u8],
    signal: &mut Signal<'_>,
) -> Result<Result<(), BoxError>, Interrupted> {
    let write = write_line(stdout, bytes);
    tokio::pin!(write);
    tokio::select! {
        biased;
        written = &mut write => Ok(written),
        interrupted = signal.as_mut() => {
            let _ = tokio::time::timeout(SIGNAL_GRACE, write).await;
            Err(interrupted)
        }
    }
}

/// `work`'s output, or the interrupt when it comes first (`work` is then dropped).
async fn unless_interrupted<T>(
    work: impl Future<Output = T>,
    signal: &mut Signal<'_>,
) -> Result<T, Interrupted> {
    tokio::select! {
        done = work => Ok(done),
        interrupted = signal.as_mut() => Err(interrupted),
    }
}

impl Driver<'_> {
    /// A run with no subcommand: the session's thread, opened by the runtime's open loop
    /// (`StoreSide::open`) with a `codex exec` process per resume or start. A signal meanwhile
    /// ends the run (dropping a process kills it).
    async fn session_thread(&mut self, mut signal: Signal<'_>) -> Result<u8, BoxError> {
        let mut opener = ExecOpener {
            setup: self.setup,
            said: &mut self.said,
            exited: None,
        };
        let (side, mut machine) = (self.side, &mut self.machine);
        let open = side.open(&mut machine, &mut opener);
        let opened = unless_interrupted(open, &mut signal).await?;
        let exited = opener.exited;
        match opened {
            Ok(Opened::Open {
                open: (process, thread_id, lines),
                ..
            }) => self.forward(process, &thread_id, &lines, signal).await,
            Ok(_) => Err(RuntimeError::Internal("a start left unanswered".into()).into()),
            Err(error) => {
                let codex_failed =
                    matches!(error, RuntimeError::Resume { .. } | RuntimeError::Client(_));
                if let Some(interrupted) = late(exited.as_ref(), signal.as_mut()).await {
                    return Err(interrupted.into());
                }
                // A give-up was written: its notice is said even so (the next run starts
                // fresh and says nothing).
                self.say_held().await?;
                match exited {
                    // codex refused the run itself (arguments, a crash): its output and its
                    // exit code, as they were.
                    Some(exit) if codex_failed => self.pass_on(exit).await,
                    _ => Err(error.into()),
                }
            }
        }
    }

    /// A run that names its own thread (`resume <id>`, `fork <id>`, `resume --last`): refused
    /// unless [`binding::client_thread`] lets the session use that thread (`--last` pinned to
    /// the session's own), which is then restored from the store ([`StoreSide::restore_named`]);
    /// the machine decides on `thread.started` whether it is recorded.
    async fn own_thread(&mut self, mut signal: Signal<'_>) -> Result<u8, BoxError> {
        let (setup, store) = (self.setup, self.side.store);
        let (named, run) = (setup.run.thread_id(), &setup.run);
        let args = match named.is_some() || run.has_flag("last") {
            true => {
                let thread = binding::client_thread(store, &setup.session, named, true).await?;
                self.side.restore_named(thread.as_str()).await;
                run.with_last_as(thread.as_str())
            }
            false => run.args().to_vec(),
        };
        let stored = binding::read_stored(store, &setup.session).await?;
        match self.start_process(&args, signal.as_mut()).await? {
            (process, First::Started { thread_id, lines }) => {
                let machine = &mut self.machine;
                machine.handle_client_thread(&thread_id, false, Some(&stored));
                self.forward(process, &thread_id, &lines, signal).await
            }
            (_, First::Exited(exit)) => self.pass_on(exit).await,
        }
    }

    /// Starts `codex [globals] exec ARGS` with the prompt and reads up to its
    /// `thread.started` (or its exit). A signal meanwhile stops it.
    async fn start_process(
        &mut self,
        args: &[OsString],
        mut signal: Signal<'_>,
    ) -> Result<(Process, First), BoxError> {
        let started = unless_interrupted(spawn_first(self.setup, args), &mut signal).await??;
        if let (_, First::Exited(exit)) = &started {
            if let Some(interrupted) = late(Some(exit), signal).await {
                return Err(interrupted.into());
            }
        }
        Ok(started)
    }

    /// The run goes on in `process`, whose thread started with `lines`: they, what the machine
    /// says, then its output line by line, each `turn.completed` once its commit is done (or
    /// its failure said). A signal before a commit began stops codex (the turn is not
    /// committed); one during a commit lets it finish, and the run ends with exit 0, as it does
    /// when the client closes stdout after the commit.
    async fn forward(
        &mut self,
        mut process: Process,
        thread_id: &str,
        lines: &[u8],
        mut signal: Signal<'_>,
    ) -> Result<u8, BoxError> {
        self.write(lines).await?;
        self.say_held().await?;
        process.relay_stderr();
        let mut replies: Vec<ThreadItem> = Vec::new();
        let mut committed = false;
        // A signal while codex is read or the client written (a client that stopped reading
        // fills the pipe) stops codex.
        let interrupted = loop {
            let line = match unless_interrupted(process.next_line(), &mut signal).await {
                Ok(line) => line?,
                Err(interrupted) => break interrupted,
            };
            let Some(line) = line else {
                let code = process.wait().await?;
                // A Ctrl-C reaches codex too and may end it first ([`late_signal`]).
                let late = match code {
                    0 => None,
                    _ => late_signal(signal.as_mut()).await,
                };
                match late {
                    Some(interrupted) => break interrupted,
                    None => return Ok(code),
                }
            };
            let event = field(&line, "type");
            match event.as_deref() {
                Some("turn.started") => replies.clear(),
                Some("item.completed") => replies.extend(agent_message(&line)),
                Some("turn.completed") => {
                    let rows = self.rows(thread_id, &std::mem::take(&mut replies));
                    // A failed commit is said by the machine (an error item).
                    let machine = &mut &mut self.machine;
                    let (_, said) = self.side.complete_turn(machine, thread_id, rows).await;
                    for say in said {
                        self.say(&say).await?;
                    }
                    committed = true;
                }
                Some("turn.failed") => {
                    // Another account's thread is given up now; its notice stays owed (exec
                    // never marks it delivered), said once by the next run, which starts the
                    // seeded replacement. The failure itself is codex's, passed on.
                    let message = failed_turn_message(&line);
                    let machine = &mut &mut self.machine;
                    let side = self.side;
                    if let Some(error) = side
                        .turn_failed(machine, thread_id, &message, |_| false)
                        .await
                    {
                        tracing::warn!(%thread_id, %error, "could not give up the thread after its failed turn; the next run resumes it again");
                    }
                }
                _ => {}
            }
            match write_unless_interrupted(&mut self.stdout, &line, &mut signal).await {
                // A client that stopped reading a committed turn (`| head`): done, as after a
                // signal.
                Ok(Err(error)) if committed && is_broken_pipe(&*error) => {
                    process.kill().await;
                    tracing::info!("the client closed stdout after the turn was committed");
                    return Ok(output::EXIT_OK);
                }
                Ok(written) => written?,
                Err(interrupted) => break interrupted,
            }
            // The turn is durable and reported: a signal now ends the run as done, whatever
            // codex does next.
            if event.as_deref() == Some("turn.completed") {
                if let Some(interrupted) = signal.as_mut().now_or_never() {
                    break interrupted;
                }
            }
        };
        process.kill().await;
        if committed {
            // Done: a failure would make the SDK throw, and its user retry a committed turn.
            tracing::info!("{interrupted} after the turn was committed");
            return Ok(output::EXIT_OK);
        }
        Err(interrupted.into())
    }

    /// The rows of a completed turn: the prompt, then the agent messages; none for a thread
    /// kept without a session (its host keeps its own transcript).
    fn rows(&self, thread_id: &str, replies: &[ThreadItem]) -> Vec<Value> {
        if kept::thread_of(self.side.session_id).is_some() {
            return Vec::new();
        }
        let turn_id = format!("exec-{}", uuid::Uuid::now_v7());
        let input = &self.setup.input;
        let images = input
            .images
            .iter()
            .cloned()
            .map(|path| UserInput::LocalImage { path });
        let mut items = vec![UserInput::text(&input.text)];
        items.extend(images);
        project_turn_input(thread_id, &turn_id, &items, replies)
    }

    /// Says what the machine said while opening, then what it says next.
    async fn say_held(&mut self) -> Result<(), BoxError> {
        for say in std::mem::take(&mut self.said) {
            self.say(&say).await?;
        }
        for say in self.side.said(&mut &mut self.machine).await {
            self.say(&say).await?;
        }
        Ok(())
    }

    /// Says `say`: on stderr for people, and on stdout as codex reports a non-fatal problem
    /// (an `error` item), except a thread not recorded (the run is the client's own: its
    /// bytes stay as they are). Never marked delivered: see `docs/architecture.md`.
    async fn say(&mut self, say: &Say) -> Result<(), BoxError> {
        let described = binding::status_event(&self.setup.session, say).described();
        // Best effort: a client that closed stderr still gets the run (`eprintln!` panics).
        write_stderr(format!("rethread: {}\n", output::for_people(&described)).as_bytes());
        if matches!(say, Say::NotRecorded { .. }) {
            return Ok(());
        }
        let item = json!({"type": "item.completed", "item": {
            "id": format!("rethread_{}", self.items),
            "type": "error",
            "message": say.message(),
        }});
        self.items += 1;
        self.write(format!("{item}\n").as_bytes()).await
    }

    /// A process that ended before its thread started: its output and exit code, as they were.
    async fn pass_on(&mut self, exit: Exit) -> Result<u8, BoxError> {
        self.write(&exit.stdout).await?;
        write_stderr(&exit.stderr);
        Ok(exit.code)
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), BoxError> {
        write_line(&mut self.stdout, bytes).await
    }
}

/// `exec`'s part of an open: a `codex exec` process per resume or start, read up to its
/// `thread.started`; what the machine says is held until the thread's first lines are out.
struct ExecOpener<'a> {
    setup: &'a Setup,
    said: &'a mut Vec<Say>,
    /// The last process that exited before its thread started.
    exited: Option<Exit>,
}

/// A process whose thread started: it, the thread, its output so far.
type Started = (Process, String, Vec<u8>);

impl Opener for ExecOpener<'_> {
    type Open = Started;

    async fn resume(&mut self, params: ThreadResumeParams) -> Answer<Started> {
        let args = self.setup.run.with_resume(&params.thread_id);
        match spawn_first(self.setup, &args).await {
            Ok((process, First::Started { thread_id, lines })) => {
                let bound = &params.thread_id;
                if thread_id != *bound {
                    let under = "codex resumed the session's thread under another id";
                    tracing::warn!(%bound, %thread_id, "{under}");
                }
                Answer::Resumed((process, thread_id, lines))
            }
            Ok((_, First::Exited(exit))) => {
                let stderr = exit.stderr_text();
                self.exited = Some(exit);
                Answer::Exited(stderr)
            }
            Err(error) => Answer::Failed(error),
        }
    }

    async fn start(&mut self, seed: Option<String>) -> Answer<Started> {
        let args = match seed {
            Some(seed) => seeded_args(&self.setup.run, seed),
            None => self.setup.run.args().to_vec(),
        };
        match spawn_first(self.setup, &args).await {
            Ok((process, First::Started { thread_id, lines })) => Answer::Started {
                thread_id: thread_id.clone(),
                open: (process, thread_id, lines),
            },
            Ok((_, First::Exited(exit))) => {
                let closed = ClientError::Closed {
                    reason: format!(
                        "codex exec exited with {} before its thread started",
                        exit.code
                    ),
                    stderr: exit.stderr_text(),
                };
                self.exited = Some(exit);
                Answer::Failed(closed.into())
            }
            Err(error) => Answer::Failed(error),
        }
    }

    fn say(&mut self, say: Say) -> bool {
        self.said.push(say);
        false
    }
}

/// Starts `codex [globals] exec ARGS` with the prompt and reads up to its `thread.started`
/// (or its exit).
async fn spawn_first(setup: &Setup, args: &[OsString]) -> Result<(Process, First), RuntimeError> {
    let program = &setup.codex;
    let codex = crate::codex_child::codex_command(program).global_args(&setup.globals);
    let spawn = |source| ClientError::Spawn {
        program: program.display().to_string(),
        source,
    };
    let mut process =
        Process::spawn(&codex.args(args), setup.input.stdin.as_deref()).map_err(spawn)?;
    let first = process.first().await.map_err(|e| ClientError::Closed {
        reason: format!("reading codex exec's output failed: {e}"),
        stderr: String::new(),
    })?;
    Ok((process, first))
}

/// A signal that came just after `exit`, when its exit names no resume error: it may be the
/// user's Ctrl-C, which reaches codex too ([`late_signal`]).
async fn late(exit: Option<&Exit>, signal: Signal<'_>) -> Option<Interrupted> {
    let exit = exit?;
    let unexplained =
        exit.code != 0 && rethread_protocol::exec_resume_error(&exit.stderr_text()).is_none();
    match unexplained {
        true => late_signal(signal).await,
        false => None,
    }
}

/// The agent message an `item.completed` line carries, as the projection reads one.
/// The error message of a `turn.failed` line (`{"type":"turn.failed","error":{"message":..}}`).
fn failed_turn_message(line: &[u8]) -> String {
    let value: Value = serde_json::from_slice(line).unwrap_or_default();
    let message = value.pointer("/error/message").and_then(Value::as_str);
    message.unwrap_or_default().to_string()
}

fn agent_message(line: &[u8]) -> Option<ThreadItem> {
    let event: Value = serde_json::from_slice(line).ok()?;
    let item = event.get("item")?;
    if item.get("type")?.as_str()? != "agent_message" {
        return None;
    }
    serde_json::from_value(json!({
        "type": "agentMessage",
        "id": item.get("id").cloned().unwrap_or_default(),
        "text": item.get("text")?.as_str()?,
    }))
    .ok()
}

/// The run's arguments with the seed in its developer instructions: after the host's own
/// (`-c developer_instructions=...` among them), as a `-c` override of its own, last (codex
/// takes the last value of a key).
fn seeded_args(run: &rethread_protocol::exec::ExecArgs, seed: String) -> Vec<OsString> {
    let own = run.config("developer_instructions");
    let instructions = toml::Value::String(seeded_instructions(own.as_deref(), seed));
    let mut args = run.args().to_vec();
    args.push(OsString::from("-c"));
    args.push(OsString::from(format!(
        "developer_instructions={instructions}"
    )));
    args
}

/// Whether `error` is a write to a pipe whose reader is gone.
fn is_broken_pipe(error: &(dyn std::error::Error + 'static)) -> bool {
    let io = error.downcast_ref::<std::io::Error>();
    io.is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}

/// Writes bytes to `stdout`, flushed: the client reads each line as it comes.
async fn write_line(stdout: &mut tokio::io::Stdout, bytes: &[u8]) -> Result<(), BoxError> {
    stdout.write_all(bytes).await?;
    Ok(stdout.flush().await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rethread_protocol::exec::ExecArgs;

    #[test]
    fn the_seed_follows_the_hosts_own_instructions_as_a_toml_string() {
        let run = ExecArgs::parse([
            "-c",
            "developer_instructions=\"be brief\"",
            "--image",
            "a.png",
        ]);
        let args = seeded_args(
            &run,
            "<transcript>\n{\"role\":\"user\"}\n</transcript>".into(),
        );
        let read_back = |args: &[OsString]| ExecArgs::parse(args).config("developer_instructions");
        assert_eq!(
            read_back(&args).as_deref(),
            Some("be brief\n\n<transcript>\n{\"role\":\"user\"}\n</transcript>")
        );
        // Behind the image list, whose greed an option ends.
        assert_eq!(args[args.len() - 2], "-c");
        assert_eq!(args[3], "a.png");
        let plain = seeded_args(&ExecArgs::parse(["hi"]), "seed \u{7f} \"q\"".into());
        assert_eq!(read_back(&plain).as_deref(), Some("seed \u{7f} \"q\""));
    }

    #[test]
    fn agent_messages_are_read_from_item_lines() {
        let line = br#"{"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"hi"}}"#;
        let item = agent_message(line).expect("an agent message");
        let rows = project_turn_input("t", "u", &[UserInput::text("q")], &[item]);
        assert_eq!(rows[1]["role"], "assistant");
        assert_eq!(rows[1]["text"], "hi");
        let error =
            br#"{"type":"item.completed","item":{"id":"item_0","type":"error","message":"m"}}"#;
        assert!(agent_message(error).is_none());
        assert!(agent_message(b"not json").is_none());
    }
}
