//! [`SessionMachine`]: every rule of `docs/design.md` ("Resume or fall back", the mirror's
//! steps) as one type with no I/O: events go in through `handle_*`, [`Action`]s come out of
//! [`SessionMachine::poll`]; it sends no request, touches no store, reads no clock. Each driver
//! (the library's [`SessionBinder`](crate::SessionBinder), `rethread app-server`, `rethread
//! exec`) opens through the one open loop,
//! [`StoreSide::open`](crate::binding::StoreSide::open), doing only its own requests; the
//! machine's errors are its own ([`OpenStop`], [`CommitFailure`]), never the runtime's.
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
    classify_resume_error, classify_turn_error, exec_resume_error, ErrorCode, ResumeFailure,
    RpcError,
};
use serde_json::Value;

use crate::projection::render_seed;

mod actions;
mod attempts;
mod mirroring;

pub use actions::{
    Action, CommitFailure, DriverAction, LeaseLostTo, LostThread, NotRecorded, OpenOutcome,
    OpenStop, Say, Stored,
};
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

setters!(SeedOptions {
    max_rows: u64,
    max_chars: usize
});

/// The rules' settings (as [`BinderOptions`](crate::BinderOptions)' fields of the same names).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MachineOptions {
    /// Ask for `excludeTurns: true` on resume; dropped when the server wants a capability.
    pub exclude_turns: bool,
    /// Extra attempts after a temporary resume failure.
    pub transient_retries: u32,
    /// The pause before the first retry; doubled on each further one.
    pub retry_backoff: Duration,
    /// Seed a thread that replaces a lost one; `None` disables seeding.
    pub seed: Option<SeedOptions>,
    /// Restore the rollout before a resume and mirror it with every commit.
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
    /// The give-up is being written; `reopen`: the replacement starts right after the notice
    /// (a failed resume), else at the next open (a failed first turn: the turn is over).
    GivingUp {
        lost: LostThread,
        reopen: bool,
    },
    Seeding(Option<LostThread>),
    Starting {
        lost: Option<LostThread>,
        seeded: bool,
    },
}

/// Takes the phase (leaving `Idle`) when it matches `$pat`, else returns: an answer out of
/// turn (late, stray) leaves the open under way as it was.
macro_rules! take_phase {
    ($self:ident, $pat:pat => $out:expr) => {
        match std::mem::replace(&mut $self.phase, Phase::Idle) {
            $pat => $out,
            other => {
                $self.phase = other;
                return;
            }
        }
    };
}
use take_phase;

/// One session's thread on one connection to codex (see the module docs).
#[derive(Debug)]
pub struct SessionMachine {
    session_id: String,
    options: MachineOptions,
    phase: Phase,
    actions: VecDeque<Action>,
    /// The thread this connection drives for the session, once open.
    thread: Option<String>,
    /// The session's thread as resumed, until a turn on it completes: a thread made elsewhere
    /// (restored from another home, perhaps another account's) that no turn proved readable
    /// here yet ([`SessionMachine::handle_turn_failed`]).
    unproven: Option<String>,
    /// The lost thread whose notice this machine said, and whether it was delivered.
    owed: Option<(String, bool)>,
    lease_lost: bool,
    /// Threads already said to be not recorded (bounded), and ephemeral ones (never said).
    warned: VecDeque<String>,
    ephemeral: VecDeque<String>,
    /// Whether commits take the mirror (off once it stopped at the session's cap, until a new
    /// thread starts).
    mirroring: bool,
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
            unproven: None,
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

    /// Opens the session's thread: read the store, then resume the bound thread or start one
    /// (seeded after a loss). Also after a failure, and on a new connection to codex. Ignored
    /// while an open is under way.
    pub fn open(&mut self) {
        if self.is_opening() {
            return;
        }
        self.thread = None;
        self.phase = Phase::Reading;
        self.push(Action::ReadSession);
    }

    /// The client sent a `thread/start` (a driver whose client starts threads itself). Returns
    /// whether it opens the session's thread (then [`SessionMachine::open`] is done). It does
    /// not when it is ephemeral, when the session has its thread or lost its lease, or while
    /// the session's own open is under way (it must not be taken for that start); such a
    /// thread is told on its answer by [`SessionMachine::handle_client_thread`].
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
                let attempts = Attempts::new(thread_id, &self.options);
                if self.mirroring {
                    self.push(Action::Restore {
                        thread_id: attempts.thread_id.clone(),
                    });
                    self.phase = Phase::Restoring(attempts);
                } else {
                    self.resume(attempts);
                }
            }
            Stored::Unbound => self.start(None, None),
            given_up => {
                // Pending: an earlier process gave the thread up and died before the user had
                // the notice. Delivered: nothing is said again, the replacement is seeded anew.
                let lost = given_up.pending_notice();
                if let Some(lost) = &lost {
                    self.say_pending_notice(lost);
                }
                // Given up by this machine after a failed turn: its replacement reports it.
                let lost = lost.or_else(|| given_up.lost().filter(|l| self.owes(&l.thread_id)));
                self.seed_then_start(lost);
            }
        }
    }

    /// `thread/resume` answered: the bound thread is back.
    pub fn handle_resumed(&mut self) {
        let attempts = take_phase!(self, Phase::Resuming(a) => a);
        self.opened(OpenOutcome::Resumed {
            thread_id: attempts.thread_id,
        });
    }

    /// `thread/resume` answered with an error.
    pub fn handle_resume_error(&mut self, error: &RpcError) {
        self.judge(classify_resume_error(error), error);
    }

    /// The process that was to answer the resume exited first (a `codex exec ... resume <id>`
    /// that failed before its `thread.started`; `stderr` is what it wrote). Codex's report of
    /// a failed resume in it ([`exec_resume_error`]) is judged as on the wire; an exit without
    /// one (bad arguments, a crash) stops the open with [`OpenStop::Refused`] and the
    /// binding kept: nothing says the thread is lost.
    pub fn handle_resume_exited(&mut self, stderr: &str) {
        if let Some(error) = exec_resume_error(stderr) {
            return self.handle_resume_error(&error);
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
        let mut attempts = take_phase!(self, Phase::Resuming(a) => a);
        match attempts.judge(failure, error) {
            Verdict::Retry(delay) if delay.is_zero() => self.resume(attempts),
            Verdict::Retry(delay) => {
                self.push(Action::Wait(delay));
                self.phase = Phase::Backoff(attempts);
            }
            Verdict::Lost(lost) => {
                self.push(Action::GiveUp(lost.clone()));
                self.phase = Phase::GivingUp { lost, reopen: true };
            }
            Verdict::Stop(error) => self.fail(error),
        }
    }

    /// The pause of an [`Action::Wait`] is over.
    pub fn handle_wait_over(&mut self) {
        let attempts = take_phase!(self, Phase::Backoff(a) => a);
        self.resume(attempts);
    }

    /// The give-up was written: the notice is said (never before: a failed write keeps the
    /// binding), then the replacement starts.
    pub fn handle_given_up(&mut self) {
        let (lost, reopen) = take_phase!(self, Phase::GivingUp { lost, reopen } => (lost, reopen));
        self.say_notice(&lost, false);
        if reopen {
            self.seed_then_start(Some(lost));
        }
    }

    /// The user has the fallback notice: it is recorded as delivered, and never said again.
    pub fn handle_notice_delivered(&mut self) {
        if let Some((thread_id, delivered @ false)) = &mut self.owed {
            *delivered = true;
            let thread_id = thread_id.clone();
            self.push(Action::MarkNoticeDelivered { thread_id });
        }
    }

    /// The newest transcript rows ([`Action::ReadTranscript`]), or why they could not be read
    /// (that only costs the seed).
    pub fn handle_transcript(&mut self, rows: Result<Vec<Value>, String>) {
        let lost = take_phase!(self, Phase::Seeding(lost) => lost);
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
        let (lost, seeded) = take_phase!(self, Phase::Starting { lost, seeded } => (lost, seeded));
        let thread_id = thread_id.into();
        let outcome = match lost {
            // Not a new thread: the one just given up, whose binding is never published again.
            Some(lost) if lost.thread_id == thread_id => {
                return self.fail(OpenStop::StartedLost { thread_id });
            }
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
    /// while opening, the open fails ([`OpenStop::Failed`]; the driver holds the error); for a
    /// commit, see [`SessionMachine::handle_committed`].
    pub fn handle_failed(&mut self) {
        if self.is_opening() {
            self.fail(OpenStop::Failed);
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
    /// `thread/fork`). An ephemeral one is never bound and nothing is said; one beside the
    /// session's thread is not recorded (said once).
    ///
    /// When the session has no thread on this connection yet, `stored` is what the store
    /// holds: the client's thread becomes the session's when it is the bound one or none is
    /// bound (a pending notice is said then). `None` never adopts it.
    pub fn handle_client_thread(
        &mut self,
        thread_id: &str,
        ephemeral: bool,
        stored: Option<&Stored>,
    ) {
        if ephemeral {
            return remember(&mut self.ephemeral, thread_id);
        }
        if self.thread.as_deref() == Some(thread_id) || self.is_opening() {
            return;
        }
        let adopt = match (&self.thread, stored) {
            (None, Some(Stored::Bound { thread_id: bound })) => bound == thread_id,
            (None, Some(_)) => true,
            _ => false,
        };
        if !adopt {
            return self.not_recorded_beside(thread_id);
        }
        if let Some(lost) = stored.and_then(Stored::pending_notice) {
            self.say_pending_notice(&lost);
        }
        self.thread = Some(thread_id.to_string());
    }

    /// A turn completed on `thread_id` with these projected rows: committed when it is the
    /// session's thread and the lease holds; otherwise not recorded (said once per thread).
    pub fn handle_turn_completed(&mut self, thread_id: &str, rows: Vec<Value>) {
        if self.lease_lost || self.ephemeral.iter().any(|t| t == thread_id) {
            return;
        }
        if self.thread.as_deref() != Some(thread_id) {
            return self.not_recorded_beside(thread_id);
        }
        if self.unproven.as_deref() == Some(thread_id) {
            self.unproven = None;
        }
        self.push(DriverAction::Commit {
            thread_id: thread_id.to_string(),
            rows,
            mirror: self.mirroring,
        });
    }

    /// A turn on `thread_id` failed (codex's `turn/completed` with `status: "failed"`, or
    /// `codex exec`'s `turn.failed`), codex's error saying `message`. The first turn on the
    /// session's thread after its resume that fails because codex cannot use the thread here
    /// ([`classify_turn_error`]: another account's encrypted reasoning) gives the thread up:
    /// [`Action::GiveUp`], then ([`SessionMachine::handle_given_up`]) the notice, and the
    /// session has no thread on this connection until the next [`SessionMachine::open`]
    /// starts a seeded replacement. The failed turn is not run again. Any other failure, or
    /// the same on a later turn (a thread this home ran a turn on is not another account's),
    /// is the turn's own: the binding is kept and nothing is said.
    pub fn handle_turn_failed(&mut self, thread_id: &str, message: &str) {
        if self.unproven.as_deref() != Some(thread_id) || self.is_opening() || self.lease_lost {
            return;
        }
        let Some(reason) = classify_turn_error(message).filter(|f| f.thread_is_lost()) else {
            return;
        };
        self.unproven = None;
        self.thread = None;
        let lost = LostThread {
            thread_id: thread_id.to_string(),
            reason,
            message: message.to_string(),
        };
        self.push(Action::GiveUp(lost.clone()));
        self.phase = Phase::GivingUp {
            lost,
            reopen: false,
        };
    }

    /// How a [`DriverAction::Commit`] went: a lost lease stops recording; a thread of another
    /// session is not this one's; any other failure is said.
    pub fn handle_committed(&mut self, thread_id: &str, result: Result<(), CommitFailure>) {
        match result {
            Ok(()) => {}
            Err(CommitFailure::LeaseLost(to)) => self.handle_lease_lost(to),
            Err(CommitFailure::ThreadTaken { session_id }) => {
                self.not_recorded(thread_id, NotRecorded::OtherSession { session_id })
            }
            Err(CommitFailure::Other(message)) => self.push(DriverAction::Say(Say::CommitFailed {
                thread_id: thread_id.to_string(),
                message,
            })),
        }
    }

    /// The host ends the session's thread (no notice): the next open starts fresh.
    pub fn handle_retire(&mut self) {
        if let Some(thread_id) = self.thread.take() {
            self.push(DriverAction::Retire { thread_id });
        }
    }

    fn resume(&mut self, attempts: Attempts) {
        self.push(DriverAction::Resume(attempts.params()));
        self.phase = Phase::Resuming(attempts);
    }

    /// The store says the notice for `lost` is pending. When this machine already delivered it
    /// (the record failed, then the open was retried), only the record is tried again.
    fn say_pending_notice(&mut self, lost: &LostThread) {
        match &self.owed {
            Some((thread_id, true)) if *thread_id == lost.thread_id => {
                let thread_id = thread_id.clone();
                self.push(Action::MarkNoticeDelivered { thread_id });
            }
            _ => self.say_notice(lost, true),
        }
    }

    /// Whether this machine said the notice for `thread_id` (it gave the thread up).
    fn owes(&self, thread_id: &str) -> bool {
        self.owed
            .as_ref()
            .is_some_and(|(owed, _)| owed == thread_id)
    }

    fn say_notice(&mut self, lost: &LostThread, pending: bool) {
        self.owed = Some((lost.thread_id.clone(), false));
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
        // The cap stopped mirroring for the thread that passed it: a new thread is mirrored
        // again (the store starts its mirror afresh when it replaces the capped one).
        self.mirroring = self.options.mirror;
        let seeded = seed.is_some();
        self.push(DriverAction::Start { seed });
        self.phase = Phase::Starting { lost, seeded };
    }

    fn opened(&mut self, outcome: OpenOutcome) {
        self.phase = Phase::Idle;
        self.thread = Some(outcome.thread_id().to_string());
        self.unproven = match &outcome {
            OpenOutcome::Resumed { thread_id } => Some(thread_id.clone()),
            _ => None,
        };
        self.push(DriverAction::Opened(outcome));
    }

    fn fail(&mut self, stop: OpenStop) {
        self.phase = Phase::Idle;
        self.push(DriverAction::OpenFailed(stop));
    }

    fn not_recorded_beside(&mut self, thread_id: &str) {
        let session_thread = self.thread.clone();
        self.not_recorded(thread_id, NotRecorded::OtherThread { session_thread });
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
