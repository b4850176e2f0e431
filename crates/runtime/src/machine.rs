//! [`SessionMachine`]: the resume-or-fallback rules as one type with no I/O.
//!
//! Events go in through the `handle_*` methods, actions come out of [`SessionMachine::poll`];
//! nothing here sends a request, touches the store, sleeps or reads a clock (quinn-proto's
//! `Connection` is the model). The library's [`SessionBinder`](crate::SessionBinder),
//! `rethread app-server` and `rethread exec` are loops over it: each carries the actions out
//! its own way (a typed request, a JSON-RPC line, a `codex exec` process) and feeds back what
//! happened. So every rule of `docs/design.md` about a session's thread is decided here once:
//!
//! - which thread a session resumes, and when it starts one instead;
//! - what a failed `thread/resume` means (retry, give up, or stop with the binding kept);
//! - that a give-up is one store write before anything is said;
//! - that the fallback notice is said exactly once: once delivered, never again; pending (with
//!   its reason) when the process died before delivering it;
//! - that the thread replacing a lost one is seeded from the transcript;
//! - which completed turns are committed: only the session's own thread's, never an
//!   ephemeral one's, never after the lease was lost;
//! - the rollout mirror's steps (`mirroring.rs`): a bound thread is restored from the store
//!   before its first resume, each commit takes the rollout's growth, and what the mirror
//!   could not do is said (once), never hiding codex's own answer to the resume.
//!
//! ```
//! use rethread_protocol::RpcError;
//! use rethread_runtime::machine::{Action, DriverAction, MachineOptions, SessionMachine, Stored};
//! use rethread_runtime::Restored;
//!
//! let mut machine = SessionMachine::new("chat-42", MachineOptions::default());
//! machine.open();
//! assert!(matches!(machine.poll(), Some(Action::ReadSession)));
//! machine.handle_session(Stored::Bound { thread_id: "thr_1".into() });
//! // The rollout mirror first puts the thread's files where codex looks for them.
//! assert!(matches!(machine.poll(), Some(Action::Restore { thread_id }) if thread_id == "thr_1"));
//! machine.handle_restored(Ok(Restored::default()));
//! let Some(Action::Driver(DriverAction::Resume(params))) = machine.poll() else { panic!() };
//! assert_eq!(params.thread_id, "thr_1");
//! machine.handle_resume_error(&RpcError::new(-32600, "no rollout found for thread id thr_1"));
//! assert!(matches!(machine.poll(), Some(Action::GiveUp(lost)) if lost.thread_id == "thr_1"));
//! ```

use std::collections::VecDeque;
use std::time::Duration;

use rethread_protocol::{
    classify_resume_error, exec_resume_error, ErrorCode, ResumeFailure, RpcError,
};
use serde_json::Value;

use crate::error::RuntimeError;
use crate::projection::render_seed;

mod actions;
mod attempts;
mod mirroring;

pub use crate::error::LeaseLostTo;
pub use actions::{Action, DriverAction, LostThread, NotRecorded, OpenOutcome, Say, Stored};
use attempts::{Attempts, Verdict};

/// The one lifecycle notice of a fallback.
pub const RESUME_FALLBACK_NOTICE: &str = "Codex thread could not be resumed; starting a new one.";

/// How many other threads a machine remembers having warned about (a client that opens
/// threads without end is warned again about old ones rather than growing memory).
const REMEMBERED_THREADS: usize = 256;

/// Seeding a fresh thread that replaces a lost one with the tail of the host transcript.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SeedOptions {
    /// At most this many of the newest rows are considered.
    pub max_rows: u64,
    /// The rendering is cut to at most this many bytes (whole rows only).
    pub max_chars: usize,
}

impl Default for SeedOptions {
    fn default() -> Self {
        SeedOptions {
            max_rows: 40,
            max_chars: 8 * 1024,
        }
    }
}

crate::setters::setters!(SeedOptions {
    max_rows: u64,
    max_chars: usize
});

/// The rules' settings.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MachineOptions {
    /// Ask for `excludeTurns: true` on resume (the host keeps its own transcript); dropped,
    /// and the resume sent again, when the server wants a capability for it.
    pub exclude_turns: bool,
    /// Extra attempts after a temporary resume failure (overloaded, timeout, I/O, busy).
    pub transient_retries: u32,
    /// The pause before the first retry; doubled on each further one.
    pub retry_backoff: Duration,
    /// Seed a thread that replaces a lost one; `None` disables seeding.
    pub seed: Option<SeedOptions>,
    /// Mirror the thread's rollout with every commit and restore it before a resume
    /// ([`Action::Restore`], [`DriverAction::Commit`]'s `mirror`).
    pub mirror: bool,
}

impl Default for MachineOptions {
    fn default() -> Self {
        MachineOptions {
            exclude_turns: true,
            transient_retries: 3,
            retry_backoff: Duration::from_millis(200),
            seed: Some(SeedOptions::default()),
            mirror: true,
        }
    }
}

/// Where the machine is in opening the session's thread.
#[derive(Debug)]
enum Phase {
    /// Not opening: before [`SessionMachine::open`], after a failure, or open.
    Idle,
    Reading,
    Restoring(Attempts),
    Resuming(Attempts),
    Backoff(Attempts),
    GivingUp(LostThread),
    Seeding(Option<LostThread>),
    Starting {
        lost: Option<LostThread>,
        seeded: bool,
    },
}

/// The notice this machine said, until it is known delivered.
#[derive(Debug)]
struct Owed {
    thread_id: String,
    delivered: bool,
}

/// One session's thread on one connection to codex: the resume-or-fallback rules, with no
/// I/O (see the module docs).
#[derive(Debug)]
pub struct SessionMachine {
    session_id: String,
    options: MachineOptions,
    phase: Phase,
    actions: VecDeque<Action>,
    /// The thread this connection drives for the session, once open.
    thread: Option<String>,
    /// The fallback notice said on this connection, until delivered.
    owed: Option<Owed>,
    /// Set once the lease is known lost; nothing is committed after it.
    lease_lost: bool,
    /// Threads already said to be not recorded (bounded), and ephemeral ones (never said).
    warned: VecDeque<String>,
    ephemeral: VecDeque<String>,
    /// Whether commits take the mirror (off once it stopped at the session's cap).
    mirroring: bool,
    /// Whether a failed mirror was said on this connection.
    mirror_failure_said: bool,
}

impl SessionMachine {
    /// A machine for `session_id`, not yet open.
    pub fn new(session_id: impl Into<String>, options: MachineOptions) -> Self {
        SessionMachine {
            session_id: session_id.into(),
            phase: Phase::Idle,
            actions: VecDeque::new(),
            thread: None,
            owed: None,
            lease_lost: false,
            warned: VecDeque::new(),
            ephemeral: VecDeque::new(),
            mirroring: options.mirror,
            mirror_failure_said: false,
            options,
        }
    }

    /// The session id.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The session's thread on this connection, once open.
    pub fn thread_id(&self) -> Option<&str> {
        self.thread.as_deref()
    }

    /// Whether an open is under way (its actions not yet all answered).
    pub fn is_opening(&self) -> bool {
        !matches!(self.phase, Phase::Idle)
    }

    /// The next action, if any.
    pub fn poll(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    fn push(&mut self, action: impl Into<Action>) {
        self.actions.push_back(action.into());
    }

    /// Opens the session's thread: read the store, then resume the bound thread, or start a
    /// thread (seeded after a loss). Also after a failure (retry) and on a new connection to
    /// codex (a host whose codex died: the same thread comes back). A call while an open is
    /// under way is ignored.
    pub fn open(&mut self) {
        if self.is_opening() {
            return;
        }
        self.thread = None;
        self.phase = Phase::Reading;
        self.push(Action::ReadSession);
    }

    /// The client sent a `thread/start` (a driver whose client starts threads itself:
    /// `rethread app-server`). Returns whether it opens the session's thread (then
    /// [`SessionMachine::open`] is done). Otherwise it is the client's own thread, told on its
    /// answer by [`SessionMachine::handle_client_thread`]: an ephemeral one, any once the
    /// session has its thread or lost its lease, and one sent while the session's open is
    /// still under way (its own start unanswered), which must not be taken for that start.
    pub fn handle_client_start(&mut self, ephemeral: bool) -> bool {
        let opens = !ephemeral && self.thread.is_none() && !self.lease_lost && !self.is_opening();
        if opens {
            self.open();
        }
        opens
    }

    /// What the store holds for the session ([`Action::ReadSession`]).
    pub fn handle_session(&mut self, stored: Stored) {
        if !matches!(self.phase, Phase::Reading) {
            return;
        }
        match stored {
            Stored::Bound { thread_id } => {
                let attempts = Attempts {
                    thread_id,
                    exclude_turns: self.options.exclude_turns,
                    transient_left: self.options.transient_retries,
                    backoff: self.options.retry_backoff,
                    sent: 0,
                    restore_may_pass: false,
                };
                if self.mirroring {
                    self.push(Action::Restore {
                        thread_id: attempts.thread_id.clone(),
                    });
                    self.phase = Phase::Restoring(attempts);
                } else {
                    self.push(DriverAction::Resume(attempts.params()));
                    self.phase = Phase::Resuming(attempts);
                }
            }
            Stored::GivenUp {
                thread_id,
                reason,
                message,
                notice_delivered,
            } => {
                let lost = LostThread {
                    thread_id,
                    reason,
                    message,
                };
                if !notice_delivered {
                    // An earlier process gave the thread up and died before the user had the
                    // notice: this one says it, with the recorded reason.
                    self.say_pending_notice(&lost);
                    self.seed_then_start(Some(lost));
                } else {
                    // Said and delivered before; the replacement never committed a turn. A
                    // new replacement, seeded like the first, and nothing said again.
                    self.seed_then_start(None);
                }
            }
            Stored::Unbound => self.start(None, None),
        }
    }

    /// `thread/resume` answered: the bound thread is back.
    pub fn handle_resumed(&mut self) {
        let Some(Phase::Resuming(attempts)) = self.take_phase(|p| matches!(p, Phase::Resuming(_)))
        else {
            return;
        };
        self.opened(OpenOutcome::Resumed {
            thread_id: attempts.thread_id,
        });
    }

    /// `thread/resume` answered with an error.
    pub fn handle_resume_error(&mut self, error: &RpcError) {
        self.judge(classify_resume_error(error), error);
    }

    /// The process that was to answer the resume exited before it did: a `codex exec ...
    /// resume <id>` that failed before its `thread.started`, `stderr` being what it wrote
    /// there. Codex's report of a failed resume in it ([`exec_resume_error`]) is judged as
    /// that error on the wire would be ([`SessionMachine::handle_resume_error`]: retried,
    /// given up, or stopped); an exit that carries none (bad arguments, a crash) stops the
    /// open with [`RuntimeError::Resume`] (`other`) and the binding kept: nothing says the
    /// thread is lost.
    pub fn handle_resume_exited(&mut self, stderr: &str) {
        if let Some(error) = exec_resume_error(stderr) {
            self.handle_resume_error(&error);
            return;
        }
        let last = stderr.lines().rev().find(|line| !line.trim().is_empty());
        let error = RpcError::new(
            ErrorCode::INTERNAL_ERROR,
            format!(
                "codex exited before the resume was answered: {}",
                last.unwrap_or("(nothing on stderr)").trim()
            ),
        );
        self.judge(ResumeFailure::Other, &error);
    }

    /// `thread/resume` got no answer within `after` (a temporary failure).
    pub fn handle_resume_timeout(&mut self, after: Duration) {
        let error = RpcError::new(
            ErrorCode::OVERLOADED,
            format!("thread/resume got no answer within {after:?}"),
        );
        self.judge(ResumeFailure::Timeout, &error);
    }

    fn judge(&mut self, failure: ResumeFailure, error: &RpcError) {
        let Some(Phase::Resuming(mut attempts)) =
            self.take_phase(|p| matches!(p, Phase::Resuming(_)))
        else {
            return;
        };
        match attempts.judge(failure, error) {
            Verdict::Retry(delay) if delay.is_zero() => {
                self.push(DriverAction::Resume(attempts.params()));
                self.phase = Phase::Resuming(attempts);
            }
            Verdict::Retry(delay) => {
                self.push(Action::Wait(delay));
                self.phase = Phase::Backoff(attempts);
            }
            Verdict::Lost(lost) => {
                self.push(Action::GiveUp(lost.clone()));
                self.phase = Phase::GivingUp(lost);
            }
            Verdict::Stop(error) => self.fail(error),
        }
    }

    /// The pause of an [`Action::Wait`] is over.
    pub fn handle_wait_over(&mut self) {
        let Some(Phase::Backoff(attempts)) = self.take_phase(|p| matches!(p, Phase::Backoff(_)))
        else {
            return;
        };
        self.push(DriverAction::Resume(attempts.params()));
        self.phase = Phase::Resuming(attempts);
    }

    /// The give-up was written: the notice is said (never before the write: a failed write
    /// keeps the binding, and the thread is judged again next time), then the replacement
    /// starts.
    pub fn handle_given_up(&mut self) {
        let Some(Phase::GivingUp(lost)) = self.take_phase(|p| matches!(p, Phase::GivingUp(_)))
        else {
            return;
        };
        self.say_notice(&lost, false);
        self.seed_then_start(Some(lost));
    }

    /// The user has the fallback notice (the rail took it, the client read past it, the
    /// line was written): it is recorded as delivered, and never said again.
    pub fn handle_notice_delivered(&mut self) {
        if let Some(owed) = self.owed.as_mut().filter(|owed| !owed.delivered) {
            owed.delivered = true;
            self.actions.push_back(Action::MarkNoticeDelivered {
                thread_id: owed.thread_id.clone(),
            });
        }
    }

    /// The newest transcript rows ([`Action::ReadTranscript`]), or why they could not be read
    /// (that only costs the seed).
    pub fn handle_transcript(&mut self, rows: Result<Vec<Value>, String>) {
        let Some(Phase::Seeding(lost)) = self.take_phase(|p| matches!(p, Phase::Seeding(_))) else {
            return;
        };
        let max_chars = self.options.seed.as_ref().map_or(0, |s| s.max_chars);
        let seed = match rows {
            Ok(rows) => render_seed(&rows, max_chars),
            Err(message) => {
                self.push(DriverAction::Say(Say::SeedUnavailable { message }));
                None
            }
        };
        self.start(lost, seed);
    }

    /// The thread of a [`DriverAction::Start`] started.
    pub fn handle_started(&mut self, thread_id: impl Into<String>) {
        let Some(Phase::Starting { lost, seeded }) =
            self.take_phase(|p| matches!(p, Phase::Starting { .. }))
        else {
            return;
        };
        let thread_id = thread_id.into();
        if lost
            .as_ref()
            .is_some_and(|lost| lost.thread_id == thread_id)
        {
            // Not a new thread: the one just given up, whose binding is never published again.
            self.fail(RuntimeError::Internal(format!(
                "codex answered thread/start with thread {thread_id}, the thread it could not \
                 resume; no new thread was started"
            )));
            return;
        }
        let outcome = match lost {
            Some(lost) => OpenOutcome::FellBack {
                thread_id,
                previous_thread_id: lost.thread_id,
                reason: lost.reason,
                message: lost.message,
                seeded,
            },
            None => OpenOutcome::Started { thread_id },
        };
        self.opened(outcome);
    }

    /// The action in flight failed (a store error, a closed connection, a refused start):
    /// while opening, the open fails with it; for a commit or a retire, see
    /// [`SessionMachine::handle_committed`].
    pub fn handle_failed(&mut self, error: RuntimeError) {
        if self.is_opening() {
            self.fail(error);
        }
    }

    /// The session's lease is gone (a renewal or a fenced write was refused): nothing more is
    /// committed on this connection, and the user is told once.
    pub fn handle_lease_lost(&mut self, to: LeaseLostTo) {
        if !std::mem::replace(&mut self.lease_lost, true) {
            self.push(DriverAction::Say(Say::LeaseLost { to }));
        }
    }

    /// Whether the lease was found lost.
    pub fn lease_lost(&self) -> bool {
        self.lease_lost
    }

    /// The client opened a thread itself (a second `thread/start`, `thread/resume`,
    /// `thread/fork`), after the session's thread was opened or instead of it: the session
    /// stays on its own thread; a thread opened beside it is not recorded (said once), an
    /// ephemeral one (codex keeps no rollout) is never bound and nothing is said.
    ///
    /// When the session has no thread on this connection yet, `stored` is what the store
    /// holds: the client's thread becomes the session's thread when it is the bound one or
    /// the session has none bound (a pending notice is said then). `None` (the store could
    /// not say, or the session already has its thread) never adopts it.
    pub fn handle_client_thread(
        &mut self,
        thread_id: &str,
        ephemeral: bool,
        stored: Option<&Stored>,
    ) {
        if ephemeral {
            remember(&mut self.ephemeral, thread_id);
            return;
        }
        if self.thread.as_deref() == Some(thread_id) || self.is_opening() {
            return;
        }
        if let (None, Some(stored)) = (&self.thread, stored) {
            let adopt = match stored {
                Stored::Bound { thread_id: bound } => bound == thread_id,
                Stored::Unbound => true,
                Stored::GivenUp {
                    thread_id: lost,
                    reason,
                    message,
                    notice_delivered,
                } => {
                    if !notice_delivered {
                        self.say_pending_notice(&LostThread {
                            thread_id: lost.clone(),
                            reason: *reason,
                            message: message.clone(),
                        });
                    }
                    true
                }
            };
            if adopt {
                self.thread = Some(thread_id.to_string());
                return;
            }
        }
        self.not_recorded(
            thread_id,
            NotRecorded::OtherThread {
                session_thread: self.thread.clone(),
            },
        );
    }

    /// A turn completed on `thread_id` with these projected rows: committed when it is the
    /// session's thread and the lease holds; otherwise not recorded (said once per thread).
    pub fn handle_turn_completed(&mut self, thread_id: &str, rows: Vec<Value>) {
        if self.lease_lost || self.ephemeral.iter().any(|t| t == thread_id) {
            return;
        }
        if self.thread.as_deref() != Some(thread_id) {
            let why = NotRecorded::OtherThread {
                session_thread: self.thread.clone(),
            };
            self.not_recorded(thread_id, why);
            return;
        }
        self.push(DriverAction::Commit {
            thread_id: thread_id.to_string(),
            rows,
            mirror: self.mirroring,
        });
    }

    /// How a [`DriverAction::Commit`] went: `Ok` once durable; a lost lease stops recording; a
    /// thread that belongs to another session is not this one's; anything else is said.
    pub fn handle_committed(&mut self, thread_id: &str, result: Result<(), &RuntimeError>) {
        let error = match result {
            Ok(()) => return,
            Err(error) => error,
        };
        match error {
            RuntimeError::LeaseLost { to, .. } => self.handle_lease_lost(to.clone()),
            RuntimeError::ThreadTaken { session_id, .. } => {
                let why = NotRecorded::OtherSession {
                    session_id: session_id.clone(),
                };
                self.not_recorded(thread_id, why)
            }
            other => self.push(DriverAction::Say(Say::CommitFailed {
                thread_id: thread_id.to_string(),
                message: other.to_string(),
            })),
        }
    }

    /// The host ends the session's thread (its own decision: no notice): the next open starts
    /// fresh.
    pub fn handle_retire(&mut self) {
        if let Some(thread_id) = self.thread.take() {
            self.push(DriverAction::Retire { thread_id });
        }
    }

    /// The phase, taken (leaving `Idle`) only when it is the one an answer is for: an answer
    /// out of turn (late, stray) leaves the open under way as it was.
    fn take_phase(&mut self, awaited: impl Fn(&Phase) -> bool) -> Option<Phase> {
        if awaited(&self.phase) {
            Some(std::mem::replace(&mut self.phase, Phase::Idle))
        } else {
            None
        }
    }

    /// The store says the notice for `lost` is not delivered yet. When this machine already
    /// delivered it (the record failed, then the open was retried), the user has it: only
    /// the record is tried again.
    fn say_pending_notice(&mut self, lost: &LostThread) {
        match &self.owed {
            Some(owed) if owed.delivered && owed.thread_id == lost.thread_id => {
                self.push(Action::MarkNoticeDelivered {
                    thread_id: lost.thread_id.clone(),
                });
            }
            _ => self.say_notice(lost, true),
        }
    }

    fn say_notice(&mut self, lost: &LostThread, pending: bool) {
        self.owed = Some(Owed {
            thread_id: lost.thread_id.clone(),
            delivered: false,
        });
        self.push(DriverAction::Say(Say::FallbackNotice {
            previous_thread_id: lost.thread_id.clone(),
            reason: lost.reason,
            message: lost.message.clone(),
            pending,
        }));
    }

    fn seed_then_start(&mut self, lost: Option<LostThread>) {
        match &self.options.seed {
            Some(seed) => {
                self.push(Action::ReadTranscript {
                    max_rows: seed.max_rows,
                });
                self.phase = Phase::Seeding(lost);
            }
            None => self.start(lost, None),
        }
    }

    fn start(&mut self, lost: Option<LostThread>, seed: Option<String>) {
        let seeded = seed.is_some();
        self.push(DriverAction::Start { seed });
        self.phase = Phase::Starting { lost, seeded };
    }

    fn opened(&mut self, outcome: OpenOutcome) {
        self.phase = Phase::Idle;
        self.thread = Some(outcome.thread_id().to_string());
        self.push(DriverAction::Opened(outcome));
    }

    fn fail(&mut self, error: RuntimeError) {
        self.phase = Phase::Idle;
        self.push(DriverAction::OpenFailed(error));
    }

    fn not_recorded(&mut self, thread_id: &str, why: NotRecorded) {
        if self.warned.iter().any(|t| t == thread_id) {
            return;
        }
        remember(&mut self.warned, thread_id);
        self.push(DriverAction::Say(Say::NotRecorded {
            thread_id: thread_id.to_string(),
            why,
        }));
    }
}

fn remember(threads: &mut VecDeque<String>, thread_id: &str) {
    if threads.iter().any(|t| t == thread_id) {
        return;
    }
    if threads.len() == REMEMBERED_THREADS {
        threads.pop_front();
    }
    threads.push_back(thread_id.to_string());
}
