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
//! use rethread_runtime::machine::{Action, MachineOptions, SessionMachine, Stored};
//! use rethread_runtime::Restored;
//!
//! let mut machine = SessionMachine::new("chat-42", MachineOptions::default());
//! machine.open();
//! assert!(matches!(machine.poll(), Some(Action::ReadSession)));
//! machine.handle_session(Stored::Bound { thread_id: "thr_1".into() });
//! // The rollout mirror first puts the thread's files where codex looks for them.
//! assert!(matches!(machine.poll(), Some(Action::Restore { thread_id }) if thread_id == "thr_1"));
//! machine.handle_restored(Ok(Restored::default()));
//! let Some(Action::Resume(params)) = machine.poll() else { panic!() };
//! assert_eq!(params.thread_id, "thr_1");
//! machine.handle_resume_error(&RpcError::new(-32600, "no rollout found for thread id thr_1"));
//! assert!(matches!(machine.poll(), Some(Action::GiveUp(lost)) if lost.thread_id == "thr_1"));
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use rethread_protocol::messages::ThreadResumeParams;
use rethread_protocol::{
    classify_resume_error, exec_resume_error, ErrorCode, ResumeFailure, RpcError,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::RuntimeError;
use crate::options::SeedOptions;
use crate::projection::render_seed;
use crate::session::OpenOutcome;

mod mirroring;

/// The one lifecycle notice of a fallback.
pub const RESUME_FALLBACK_NOTICE: &str = "Codex thread could not be resumed; starting a new one.";

/// How many other threads a machine remembers having warned about (a client that opens
/// threads without end is warned again about old ones rather than growing memory).
const REMEMBERED_THREADS: usize = 256;

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
    /// ([`Action::Restore`], [`Action::Commit`]'s `mirror`).
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

/// What the store holds for a session, as the machine reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stored {
    /// No thread: a new session, or one whose thread its host ended.
    Unbound,
    /// Bound to a thread whose last committed turn is durable.
    Bound {
        /// The thread.
        thread_id: String,
    },
    /// The bound thread was lost and given up; no turn on a new thread committed since.
    GivenUp {
        /// The lost (retired) thread.
        thread_id: String,
        /// Why it was lost.
        reason: ResumeFailure,
        /// Codex's error message.
        message: String,
        /// Whether the fallback notice reached the user.
        notice_delivered: bool,
    },
}

/// A bound thread codex cannot hand back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostThread {
    /// The thread.
    pub thread_id: String,
    /// Why it is lost (`gone`, `incompatible` or `unreadable`).
    pub reason: ResumeFailure,
    /// Codex's error message.
    pub message: String,
}

/// Why a thread's turns are not recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotRecorded {
    /// The session stays on its own thread; this one was opened beside it.
    OtherThread {
        /// The session's thread, if it has one on this connection.
        session_thread: Option<String>,
    },
    /// The thread belongs to another session of the store.
    OtherSession {
        /// That session.
        session_id: String,
    },
}

/// To whom a lease went.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseLostTo {
    /// Another process took the session over (after this one stalled past the lease's TTL).
    Another {
        /// The new holder, for people.
        holder: String,
    },
    /// The session was deleted (`rethread sessions forget`).
    Forgotten,
    /// Released, or lost for a reason the store did not say.
    Unknown,
}

/// Something to tell the user. Drivers render it on their surface: the status rail, a
/// JSON-RPC `warning`, a `codex exec` error item.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Say {
    /// [`RESUME_FALLBACK_NOTICE`]: the session's thread was lost and a new one starts. Once
    /// the user has it, the driver calls [`SessionMachine::handle_notice_delivered`].
    FallbackNotice {
        /// The lost thread.
        previous_thread_id: String,
        /// Why.
        reason: ResumeFailure,
        /// Codex's error message.
        message: String,
        /// An earlier process gave the thread up and died before delivering the notice.
        pending: bool,
    },
    /// A thread's turns are not recorded for the session (said once per thread).
    NotRecorded {
        /// The thread.
        thread_id: String,
        /// Why.
        why: NotRecorded,
    },
    /// The session's lease is gone: nothing more is recorded on this connection.
    LeaseLost {
        /// To whom.
        to: LeaseLostTo,
    },
    /// A completed turn could not be recorded.
    CommitFailed {
        /// The thread.
        thread_id: String,
        /// What failed.
        message: String,
    },
    /// The transcript could not be read to seed the replacement thread.
    SeedUnavailable {
        /// What failed.
        message: String,
    },
    /// The thread's rollout could not be restored from the store; the resume goes ahead and
    /// codex's answer decides.
    RestoreFailed {
        /// The thread.
        thread_id: String,
        /// What failed.
        message: String,
    },
    /// The session's mirror passed its cap: mirroring stopped for the session (said once).
    MirrorStopped {
        /// The bytes it would have held.
        bytes: u64,
        /// The cap.
        cap: u64,
    },
    /// A turn was committed without its rollout (said once per connection).
    MirrorFailed {
        /// The thread.
        thread_id: String,
        /// What failed.
        message: String,
    },
}

impl Say {
    /// The user-facing text.
    pub fn message(&self) -> String {
        match self {
            Say::FallbackNotice { .. } => RESUME_FALLBACK_NOTICE.to_string(),
            Say::NotRecorded {
                thread_id,
                why: NotRecorded::OtherThread { session_thread },
            } => match session_thread {
                Some(own) => format!(
                    "rethread keeps this session on thread {own}; thread {thread_id} is not \
                     recorded and will not be resumed after a restart."
                ),
                None => format!(
                    "rethread does not record thread {thread_id} for this session: the \
                     session is bound to another thread, which a thread/start resumes."
                ),
            },
            Say::NotRecorded {
                thread_id,
                why: NotRecorded::OtherSession { session_id },
            } => format!(
                "thread {thread_id} belongs to rethread session {session_id}; it is not \
                 recorded for this session."
            ),
            Say::LeaseLost { to } => match to {
                LeaseLostTo::Another { holder } => format!(
                    "rethread lost this session to another process ({holder}): turns on this \
                     connection are no longer recorded."
                ),
                LeaseLostTo::Forgotten => "rethread: this session was forgotten (deleted from \
                     the store): turns on this connection are no longer recorded."
                    .to_string(),
                LeaseLostTo::Unknown => "rethread no longer holds this session's lease: turns \
                     on this connection are no longer recorded."
                    .to_string(),
            },
            Say::CommitFailed { message, .. } => {
                format!("rethread could not record this turn of the session: {message}")
            }
            Say::SeedUnavailable { message } => {
                format!("Could not read the transcript to seed the new thread: {message}")
            }
            Say::RestoreFailed { .. } | Say::MirrorStopped { .. } | Say::MirrorFailed { .. } => {
                self.mirror_message()
            }
        }
    }
}

/// What a driver must do next. Each action that asks for something names the `handle_*`
/// method that takes its answer.
///
/// Not `#[non_exhaustive]` on purpose: every driver must decide what a new action means.
#[derive(Debug)]
pub enum Action {
    /// Read the session from the store: [`SessionMachine::handle_session`] (or
    /// [`SessionMachine::handle_failed`]).
    ReadSession,
    /// Restore the thread's rollout files from the store's mirror where this `CODEX_HOME`
    /// lacks them ([`RolloutMirror::restore`](crate::RolloutMirror::restore)), before its
    /// first resume: [`SessionMachine::handle_restored`].
    Restore {
        /// The bound thread.
        thread_id: String,
    },
    /// Send `thread/resume` with these params (a driver may add the thread settings its host
    /// gave): [`SessionMachine::handle_resumed`], [`SessionMachine::handle_resume_error`],
    /// [`SessionMachine::handle_resume_timeout`], [`SessionMachine::handle_resume_exited`]
    /// (a driver that resumes by starting a process), or `handle_failed` when the connection
    /// itself failed).
    Resume(ThreadResumeParams),
    /// Wait this long, then [`SessionMachine::handle_wait_over`].
    Wait(Duration),
    /// Give the thread up in one store write (retire it, drop the binding if it still names
    /// it, record the pending notice): [`SessionMachine::handle_given_up`] (or `handle_failed`:
    /// then nothing was written and the binding is kept).
    GiveUp(LostThread),
    /// Say this to the user.
    Say(Say),
    /// Record in the store that the fallback notice for this lost thread was delivered.
    /// Nothing is handed back (a failure only means the notice may be said once more).
    MarkNoticeDelivered {
        /// The lost thread.
        thread_id: String,
    },
    /// Read the newest rows of the transcript, at most this many:
    /// [`SessionMachine::handle_transcript`].
    ReadTranscript {
        /// How many.
        max_rows: u64,
    },
    /// Start a thread (with the host's own settings), with this seed appended to its
    /// developer instructions: [`SessionMachine::handle_started`] (or `handle_failed`).
    Start {
        /// The seed, already rendered and quoted ([`render_seed`]).
        seed: Option<String>,
    },
    /// The session's thread is open; turns may run.
    Opened(OpenOutcome),
    /// Opening failed; nothing more happens until [`SessionMachine::open`] is called again.
    /// The binding is kept unless a give-up was written (which the outcome of the next open
    /// reports).
    OpenFailed(RuntimeError),
    /// Commit a completed turn's rows with the binding to its thread (one fenced store write):
    /// [`SessionMachine::handle_committed`] (or `handle_failed`), then, when it took the
    /// mirror, [`SessionMachine::handle_mirrored`].
    Commit {
        /// The thread.
        thread_id: String,
        /// The projected rows.
        rows: Vec<Value>,
        /// Whether the commit takes what the thread's rollout grew by
        /// ([`RolloutMirror::prepare`](crate::RolloutMirror::prepare)).
        mirror: bool,
    },
    /// The host ends the session's thread: retire it without a notice
    /// ([`SessionMachine::handle_retired`] or `handle_failed`).
    Retire {
        /// The thread.
        thread_id: String,
    },
}

impl fmt::Display for Action {
    /// One line per action, wire params as literal JSON: what the machine's tables pin.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::ReadSession => f.write_str("read_session"),
            Action::Restore { thread_id } => write!(f, "restore {thread_id}"),
            Action::Resume(params) => write!(f, "resume {}", json(params)),
            Action::Wait(delay) => write!(f, "wait {}ms", delay.as_millis()),
            Action::GiveUp(lost) => write!(f, "give_up {} {}", lost.thread_id, lost.reason),
            Action::Say(Say::FallbackNotice {
                previous_thread_id,
                reason,
                pending,
                ..
            }) => write!(
                f,
                "notice {previous_thread_id} {reason}{}",
                if *pending { " pending" } else { "" }
            ),
            Action::Say(say) => write!(f, "say {}", say.message()),
            Action::MarkNoticeDelivered { thread_id } => write!(f, "mark_delivered {thread_id}"),
            Action::ReadTranscript { max_rows } => write!(f, "read_transcript {max_rows}"),
            Action::Start { seed: None } => f.write_str("start"),
            Action::Start { seed: Some(_) } => f.write_str("start seeded"),
            Action::Opened(outcome) => write!(f, "opened {}", json(outcome)),
            Action::OpenFailed(error) => write!(f, "open_failed {}", error.kind()),
            Action::Commit {
                thread_id,
                rows,
                mirror,
            } => write!(
                f,
                "commit {thread_id} {}{}",
                rows.len(),
                if *mirror { " +mirror" } else { "" }
            ),
            Action::Retire { thread_id } => write!(f, "retire {thread_id}"),
        }
    }
}

/// A wire shape as literal JSON, for [`Action`]'s `Display`.
fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|error| format!("<{error}>"))
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

/// The attempts to resume one bound thread.
#[derive(Debug, Clone)]
struct Attempts {
    thread_id: String,
    exclude_turns: bool,
    transient_left: u32,
    backoff: Duration,
    sent: u32,
}

/// What a failed `thread/resume` means.
enum Verdict {
    Retry(Duration),
    Lost(LostThread),
    Stop(RuntimeError),
}

impl Attempts {
    fn params(&self) -> ThreadResumeParams {
        let mut params = ThreadResumeParams::new(self.thread_id.clone());
        if self.exclude_turns {
            params.exclude_turns = Some(true);
        }
        params
    }

    /// The rules of a failed resume: a capability refusal of `excludeTurns` is retried at
    /// once without it (never a dead thread); `gone`, `incompatible` and `unreadable` are a
    /// loss at once; a temporary failure is retried after a growing pause, within the
    /// budget, then stops with the binding kept; anything else stops at once.
    fn judge(&mut self, failure: ResumeFailure, error: &RpcError) -> Verdict {
        self.sent += 1;
        if failure == ResumeFailure::CapabilityRequired && self.exclude_turns {
            self.exclude_turns = false;
            return Verdict::Retry(Duration::ZERO);
        }
        if failure.thread_is_lost() {
            return Verdict::Lost(LostThread {
                thread_id: self.thread_id.clone(),
                reason: failure,
                message: error.message.clone(),
            });
        }
        if !failure.is_transient() {
            return Verdict::Stop(RuntimeError::Resume {
                thread_id: self.thread_id.clone(),
                failure,
                error: error.clone(),
            });
        }
        if self.transient_left > 0 {
            self.transient_left -= 1;
            let delay = self.backoff;
            self.backoff = self.backoff.saturating_mul(2);
            return Verdict::Retry(delay);
        }
        Verdict::Stop(match failure {
            ResumeFailure::Busy => RuntimeError::ThreadBusy {
                thread_id: self.thread_id.clone(),
                message: error.message.clone(),
            },
            _ => RuntimeError::ResumeUnavailable {
                thread_id: self.thread_id.clone(),
                failure,
                message: error.message.clone(),
                attempts: self.sent,
            },
        })
    }
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
        self.actions.push_back(Action::ReadSession);
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
                };
                if self.mirroring {
                    self.actions.push_back(Action::Restore {
                        thread_id: attempts.thread_id.clone(),
                    });
                    self.phase = Phase::Restoring(attempts);
                } else {
                    self.actions.push_back(Action::Resume(attempts.params()));
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
                    self.say_notice(&lost, true);
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
                self.actions.push_back(Action::Resume(attempts.params()));
                self.phase = Phase::Resuming(attempts);
            }
            Verdict::Retry(delay) => {
                self.actions.push_back(Action::Wait(delay));
                self.phase = Phase::Backoff(attempts);
            }
            Verdict::Lost(lost) => {
                self.actions.push_back(Action::GiveUp(lost.clone()));
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
        self.actions.push_back(Action::Resume(attempts.params()));
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
                self.actions
                    .push_back(Action::Say(Say::SeedUnavailable { message }));
                None
            }
        };
        self.start(lost, seed);
    }

    /// The thread of an [`Action::Start`] started.
    pub fn handle_started(&mut self, thread_id: impl Into<String>) {
        let Some(Phase::Starting { lost, seeded }) =
            self.take_phase(|p| matches!(p, Phase::Starting { .. }))
        else {
            return;
        };
        let thread_id = thread_id.into();
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
            self.actions.push_back(Action::Say(Say::LeaseLost { to }));
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
                        self.say_notice(
                            &LostThread {
                                thread_id: lost.clone(),
                                reason: *reason,
                                message: message.clone(),
                            },
                            true,
                        );
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
        self.actions.push_back(Action::Commit {
            thread_id: thread_id.to_string(),
            rows,
            mirror: self.mirroring,
        });
    }

    /// How an [`Action::Commit`] went: `Ok` once durable; a lost lease stops recording; a
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
            other => self.actions.push_back(Action::Say(Say::CommitFailed {
                thread_id: thread_id.to_string(),
                message: other.to_string(),
            })),
        }
    }

    /// The host ends the session's thread (its own decision: no notice): the next open starts
    /// fresh.
    pub fn handle_retire(&mut self) {
        if let Some(thread_id) = self.thread.take() {
            self.actions.push_back(Action::Retire { thread_id });
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

    fn say_notice(&mut self, lost: &LostThread, pending: bool) {
        self.owed = Some(Owed {
            thread_id: lost.thread_id.clone(),
            delivered: false,
        });
        self.actions.push_back(Action::Say(Say::FallbackNotice {
            previous_thread_id: lost.thread_id.clone(),
            reason: lost.reason,
            message: lost.message.clone(),
            pending,
        }));
    }

    fn seed_then_start(&mut self, lost: Option<LostThread>) {
        match &self.options.seed {
            Some(seed) => {
                self.actions.push_back(Action::ReadTranscript {
                    max_rows: seed.max_rows,
                });
                self.phase = Phase::Seeding(lost);
            }
            None => self.start(lost, None),
        }
    }

    fn start(&mut self, lost: Option<LostThread>, seed: Option<String>) {
        let seeded = seed.is_some();
        self.actions.push_back(Action::Start { seed });
        self.phase = Phase::Starting { lost, seeded };
    }

    fn opened(&mut self, outcome: OpenOutcome) {
        self.phase = Phase::Idle;
        self.thread = Some(outcome.thread_id().to_string());
        self.actions.push_back(Action::Opened(outcome));
    }

    fn fail(&mut self, error: RuntimeError) {
        self.phase = Phase::Idle;
        self.actions.push_back(Action::OpenFailed(error));
    }

    fn not_recorded(&mut self, thread_id: &str, why: NotRecorded) {
        if self.warned.iter().any(|t| t == thread_id) {
            return;
        }
        remember(&mut self.warned, thread_id);
        self.actions.push_back(Action::Say(Say::NotRecorded {
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
