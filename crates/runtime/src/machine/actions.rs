//! What the machine hears of the store ([`Stored`]) and what comes out of it ([`Action`],
//! [`Say`]). Each action's `Display` is the line the tables of `tests/machine.rs` are written in.

use std::fmt;
use std::time::Duration;

use rethread_protocol::messages::ThreadResumeParams;
use rethread_protocol::{ResumeFailure, RpcError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[cfg(doc)]
use super::SessionMachine;
use super::RESUME_FALLBACK_NOTICE;

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

impl Stored {
    /// The lost thread, if the session gave one up.
    pub(super) fn lost(&self) -> Option<LostThread> {
        match self {
            Stored::GivenUp {
                thread_id,
                reason,
                message,
                ..
            } => Some(LostThread {
                thread_id: thread_id.clone(),
                reason: *reason,
                message: message.clone(),
            }),
            _ => None,
        }
    }

    /// The lost thread whose notice is still owed, if any.
    pub(super) fn pending_notice(&self) -> Option<LostThread> {
        let delivered = matches!(
            self,
            Stored::GivenUp {
                notice_delivered: true,
                ..
            }
        );
        self.lost().filter(|_| !delivered)
    }
}

/// A bound thread codex cannot hand back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostThread {
    /// The thread.
    pub thread_id: String,
    /// Why it is lost (`gone`, `incompatible`, `unreadable` or `account_mismatch`).
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

/// Something to tell the user, on the driver's surface (the rail, a `warning`, an error item).
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
            Say::RestoreFailed { thread_id, message } => format!(
                "rethread could not restore thread {thread_id}'s rollout from the store \
                 ({message}); resuming it as codex has it."
            ),
            Say::MirrorStopped { bytes, cap } => format!(
                "rethread stopped mirroring this session's codex rollout: it would hold {bytes} \
                 bytes, past the cap of {cap}. Its thread resumes only where codex keeps its \
                 rollout."
            ),
            Say::MirrorFailed { thread_id, message } => format!(
                "rethread could not mirror thread {thread_id}'s rollout ({message}): it resumes \
                 only where codex keeps it."
            ),
        }
    }
}

/// What a driver must do next, naming the `handle_*` method that takes the answer. The
/// store-side actions are carried out by
/// [`StoreSide::open`](crate::binding::StoreSide::open) for every driver; the
/// rest are the driver's own ([`Action::Driver`]). Not `#[non_exhaustive]`: every driver must
/// decide what a new action means.
#[derive(Debug)]
pub enum Action {
    /// Read the session from the store: [`SessionMachine::handle_session`] (or
    /// [`SessionMachine::handle_failed`]).
    ReadSession,
    /// Restore the thread's rollout files from the store's mirror
    /// ([`RolloutMirror::restore`](crate::RolloutMirror::restore)) before its first resume:
    /// [`SessionMachine::handle_restored`].
    Restore {
        /// The bound thread.
        thread_id: String,
    },
    /// Wait this long, then [`SessionMachine::handle_wait_over`].
    Wait(Duration),
    /// Give the thread up in one store write ([`give_up`](crate::binding::give_up)):
    /// [`SessionMachine::handle_given_up`] (or `handle_failed`: the binding is kept).
    GiveUp(LostThread),
    /// Record that the notice for this lost thread was delivered. Nothing is handed back: a
    /// failure only means another process may say it once more.
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
    /// An action that is the driver's own.
    Driver(DriverAction),
}

/// The actions that are a driver's own (see [`Action`]).
#[derive(Debug)]
pub enum DriverAction {
    /// Send `thread/resume` with these params (plus the host's thread settings):
    /// [`SessionMachine::handle_resumed`], `handle_resume_error`, `handle_resume_timeout`,
    /// `handle_resume_exited` (a resume by a process), or `handle_failed`.
    Resume(ThreadResumeParams),
    /// Say this to the user.
    Say(Say),
    /// Start a thread (with the host's settings), the seed appended to its developer
    /// instructions: [`SessionMachine::handle_started`] (or `handle_failed`).
    Start {
        /// The seed, already rendered and quoted ([`render_seed`](crate::projection::render_seed)).
        seed: Option<String>,
    },
    /// The session's thread is open; turns may run.
    Opened(OpenOutcome),
    /// Opening failed, until [`SessionMachine::open`] again. The binding is kept unless a
    /// give-up was written (the next open's outcome reports it).
    OpenFailed(OpenStop),
    /// Commit a completed turn's rows with the binding to its thread
    /// ([`StoreSide::commit`](crate::binding::StoreSide::commit)):
    /// [`SessionMachine::handle_committed`], then [`SessionMachine::handle_mirrored`].
    Commit {
        /// The thread.
        thread_id: String,
        /// The projected rows.
        rows: Vec<Value>,
        /// Whether the commit takes what the thread's rollout grew by.
        mirror: bool,
    },
    /// Retire the thread without a notice ([`SessionMachine::handle_retire`]).
    Retire {
        /// The thread.
        thread_id: String,
    },
}

impl From<DriverAction> for Action {
    fn from(action: DriverAction) -> Self {
        Action::Driver(action)
    }
}

impl fmt::Display for Action {
    /// One line per action, wire params as literal JSON: what the machine's tables pin.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::ReadSession => f.write_str("read_session"),
            Action::Restore { thread_id } => write!(f, "restore {thread_id}"),
            Action::Wait(delay) => write!(f, "wait {}ms", delay.as_millis()),
            Action::GiveUp(lost) => write!(f, "give_up {} {}", lost.thread_id, lost.reason),
            Action::MarkNoticeDelivered { thread_id } => write!(f, "mark_delivered {thread_id}"),
            Action::ReadTranscript { max_rows } => write!(f, "read_transcript {max_rows}"),
            Action::Driver(action) => action.fmt(f),
        }
    }
}

impl fmt::Display for DriverAction {
    /// One line per action, as [`Action`]'s.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DriverAction::Resume(params) => write!(f, "resume {}", json(params)),
            DriverAction::Say(Say::FallbackNotice {
                previous_thread_id,
                reason,
                pending,
                ..
            }) => write!(
                f,
                "notice {previous_thread_id} {reason}{}",
                if *pending { " pending" } else { "" }
            ),
            DriverAction::Say(say) => write!(f, "say {}", say.message()),
            DriverAction::Start { seed: None } => f.write_str("start"),
            DriverAction::Start { seed: Some(_) } => f.write_str("start seeded"),
            DriverAction::Opened(outcome) => write!(f, "opened {}", json(outcome)),
            DriverAction::OpenFailed(stop) => write!(f, "open_failed {}", stop.kind()),
            DriverAction::Commit {
                thread_id,
                rows,
                mirror,
            } => write!(
                f,
                "commit {thread_id} {}{}",
                rows.len(),
                if *mirror { " +mirror" } else { "" }
            ),
            DriverAction::Retire { thread_id } => write!(f, "retire {thread_id}"),
        }
    }
}

/// A wire shape as literal JSON, for [`Action`]'s `Display`.
fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|error| format!("<{error}>"))
}

/// How a codex session was opened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum OpenOutcome {
    /// The stored thread was resumed.
    Resumed {
        /// The thread.
        thread_id: String,
    },
    /// A new thread was started (no binding).
    Started {
        /// The thread.
        thread_id: String,
    },
    /// The stored thread could not be resumed (now, or by an earlier process that died before
    /// the user had the notice); a new one was started on the same client.
    FellBack {
        /// The new thread.
        thread_id: String,
        /// The thread that was lost.
        previous_thread_id: String,
        /// Why it was lost.
        reason: ResumeFailure,
        /// Codex's error message.
        message: String,
        /// Whether the new thread was seeded from the transcript.
        seeded: bool,
    },
}

impl OpenOutcome {
    /// The thread the session runs on.
    pub fn thread_id(&self) -> &str {
        match self {
            OpenOutcome::Resumed { thread_id }
            | OpenOutcome::Started { thread_id }
            | OpenOutcome::FellBack { thread_id, .. } => thread_id,
        }
    }

    /// `resumed`, `started` or `fell_back`.
    pub fn as_str(&self) -> &'static str {
        match self {
            OpenOutcome::Resumed { .. } => "resumed",
            OpenOutcome::Started { .. } => "started",
            OpenOutcome::FellBack { .. } => "fell_back",
        }
    }
}

/// Why an open stopped with the binding kept: the machine's own verdicts, and the driver's
/// failed step (whose error the driver holds: the machine needs only to know it failed).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum OpenStop {
    /// A resume failed, neither for a lost thread nor for a temporary condition.
    Refused {
        /// The bound thread.
        thread_id: String,
        /// The classification.
        failure: ResumeFailure,
        /// Codex's error.
        error: RpcError,
    },
    /// A resume kept failing for a temporary reason past the retries.
    Unavailable {
        /// The bound thread.
        thread_id: String,
        /// The last failure.
        failure: ResumeFailure,
        /// What to tell the user (codex's last message, and why the binding is kept).
        message: String,
        /// How many resumes were sent.
        attempts: u32,
    },
    /// The thread has an active writer elsewhere past the retries.
    Busy {
        /// The bound thread.
        thread_id: String,
        /// Codex's last message.
        message: String,
    },
    /// Codex answered the replacement's start with the thread it could not resume.
    StartedLost {
        /// That thread.
        thread_id: String,
    },
    /// The driver's step failed (a store call, a request to codex, a refused start).
    Failed,
}

impl OpenStop {
    /// The kind, as the runtime's error names it (`failed`: the driver's step's own).
    pub fn kind(&self) -> &'static str {
        match self {
            OpenStop::Refused { .. } => "resume_failed",
            OpenStop::Unavailable { .. } => "resume_unavailable",
            OpenStop::Busy { .. } => "thread_busy",
            OpenStop::StartedLost { .. } => "internal",
            OpenStop::Failed => "failed",
        }
    }
}

/// Why a [`DriverAction::Commit`] failed, as far as the machine cares.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommitFailure {
    /// The session's lease is gone: nothing more is committed on this connection.
    LeaseLost(LeaseLostTo),
    /// The thread belongs to another session: it is not this one's.
    ThreadTaken {
        /// The session it belongs to.
        session_id: String,
    },
    /// Anything else, for people: said, and the next turn commits again.
    Other(String),
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
