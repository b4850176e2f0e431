//! [`RuntimeError`], and the one mapping of store errors into it.

use rethread_protocol::{ResumeFailure, RpcError};
use rethread_store::{time_for_people, LeaseLoss, LeaseOwner, StoreError};

use crate::client::ClientError;
use crate::machine::LeaseLostTo;
use crate::machine::{CommitFailure, OpenStop};

/// A boxed error from host code (a [`TranscriptSink`](crate::TranscriptSink)), kept as the
/// source of [`RuntimeError::Sink`].
pub type BoxError = rethread_store::BoxError;

/// Errors of the runtime: [`RuntimeError::is_retryable`] tells a temporary condition from a
/// failure, [`RuntimeError::kind`] names the variant for machines.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The app-server connection failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The store failed (a held or lost lease, or a thread of another session, is its own
    /// variant).
    #[error("store: {0}")]
    Store(#[source] StoreError),
    /// `thread/resume` failed, neither for a lost thread nor for a temporary condition; the
    /// binding is kept and nothing was written.
    #[error("resuming thread {thread_id} failed ({failure}): {error}")]
    Resume {
        /// The bound thread.
        thread_id: String,
        /// The classification.
        failure: ResumeFailure,
        /// The server's error.
        error: RpcError,
    },
    /// `thread/resume` kept failing for a temporary reason past the retries. The binding is
    /// kept and nothing was written: retry later.
    #[error("thread {thread_id} could not be resumed now ({failure}, {attempts} attempts): {message}; the binding is kept")]
    ResumeUnavailable {
        /// The bound thread.
        thread_id: String,
        /// The last failure (`overloaded`, `timeout`, `io`).
        failure: ResumeFailure,
        /// The last error's message.
        message: String,
        /// How many `thread/resume` requests were sent.
        attempts: u32,
    },
    /// The thread has an active writer in another app-server process past the retries.
    /// Nothing was changed: starting a new thread would fork a live conversation.
    #[error("thread {thread_id} is busy: {message}")]
    ThreadBusy {
        /// The bound thread.
        thread_id: String,
        /// The last error.
        message: String,
    },
    /// The turn did not complete; nothing was written to the store.
    #[error("turn {turn_id} on thread {thread_id} did not complete ({status}): {message}")]
    TurnFailed {
        /// The thread.
        thread_id: String,
        /// The turn.
        turn_id: String,
        /// The final status (`failed`, `interrupted`, `timeout`, ...).
        status: String,
        /// What codex said.
        message: String,
    },
    /// The host's transcript sink failed; the binding was not published.
    #[error("transcript sink: {0}")]
    Sink(#[source] BoxError),
    /// Another holder has the session's lease. No thread was resumed or started and nothing
    /// was written; retry later.
    #[error("session {session_id} is busy: held by {holder} since {}, until {} unless renewed",
        time_for_people(*acquired_at_ms), time_for_people(*expires_at_ms))]
    SessionBusy {
        /// The session.
        session_id: String,
        /// Who holds the lease.
        holder: LeaseOwner,
        /// Since when (milliseconds since the Unix epoch, store clock).
        acquired_at_ms: i64,
        /// Until when unless renewed (milliseconds since the Unix epoch, store clock).
        expires_at_ms: i64,
    },
    /// The session's lease was taken over or the session forgotten before a write that
    /// needed it; nothing was written.
    #[error(
        "the lease on session {session_id} was lost ({}); nothing was written",
        lost_to(to)
    )]
    LeaseLost {
        /// The session.
        session_id: String,
        /// To whom.
        to: LeaseLostTo,
    },
    /// A bug in rethread: an internal rule was broken. Nothing was written.
    #[error("internal error (a bug in rethread): {0}")]
    Internal(String),
    /// The thread belongs to another session of the store; nothing was written.
    #[error("thread {thread_id} belongs to session {session_id}; nothing was written")]
    ThreadTaken {
        /// The thread.
        thread_id: String,
        /// The session it belongs to.
        session_id: String,
    },
    /// The client named a thread in a way rethread cannot check before codex runs a turn on it
    /// (`exec resume --last` in a session with no thread, a thread name); nothing was run.
    #[error("session {session_id} cannot run the thread the client names: {reason}")]
    ThreadUnnamed {
        /// The session.
        session_id: String,
        /// Why, for people.
        reason: String,
    },
}

fn lost_to(to: &LeaseLostTo) -> String {
    match to {
        LeaseLostTo::Another { holder } => format!("taken over by {holder}"),
        LeaseLostTo::Forgotten => "the session was forgotten".to_string(),
        LeaseLostTo::Unknown => "released or expired".to_string(),
    }
}

impl From<StoreError> for RuntimeError {
    /// A held lease is [`RuntimeError::SessionBusy`], a lost one [`RuntimeError::LeaseLost`],
    /// a thread of another session [`RuntimeError::ThreadTaken`], anything else
    /// [`RuntimeError::Store`].
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Busy {
                session_id,
                holder,
                acquired_at_ms,
                expires_at_ms,
            } => RuntimeError::SessionBusy {
                session_id,
                holder,
                acquired_at_ms,
                expires_at_ms,
            },
            StoreError::LeaseLost { session_id, cause } => RuntimeError::LeaseLost {
                session_id,
                to: match cause {
                    LeaseLoss::TakenOver { holder } => LeaseLostTo::Another {
                        holder: holder.to_string(),
                    },
                    LeaseLoss::Forgotten => LeaseLostTo::Forgotten,
                    _ => LeaseLostTo::Unknown,
                },
            },
            StoreError::ThreadTaken {
                thread_id,
                session_id,
            } => RuntimeError::ThreadTaken {
                thread_id,
                session_id,
            },
            other => RuntimeError::Store(other),
        }
    }
}

impl From<OpenStop> for RuntimeError {
    /// The machine's verdict as the runtime's error. [`OpenStop::Failed`] carries no error of
    /// its own: the open loop ([`StoreSide::open`](crate::binding::StoreSide::open)) returns
    /// the failed step's.
    fn from(stop: OpenStop) -> Self {
        match stop {
            OpenStop::Refused {
                thread_id,
                failure,
                error,
            } => RuntimeError::Resume {
                thread_id,
                failure,
                error,
            },
            OpenStop::Unavailable {
                thread_id,
                failure,
                message,
                attempts,
            } => RuntimeError::ResumeUnavailable {
                thread_id,
                failure,
                message,
                attempts,
            },
            OpenStop::Busy { thread_id, message } => {
                RuntimeError::ThreadBusy { thread_id, message }
            }
            OpenStop::StartedLost { thread_id } => RuntimeError::Internal(format!(
                "codex answered thread/start with thread {thread_id}, the thread it could not \
                 resume; no new thread was started"
            )),
            _ => RuntimeError::Internal("an open failed without its error".into()),
        }
    }
}

impl From<&RuntimeError> for CommitFailure {
    fn from(error: &RuntimeError) -> Self {
        match error {
            RuntimeError::LeaseLost { to, .. } => CommitFailure::LeaseLost(to.clone()),
            RuntimeError::ThreadTaken { session_id, .. } => CommitFailure::ThreadTaken {
                session_id: session_id.clone(),
            },
            other => CommitFailure::Other(other.to_string()),
        }
    }
}

impl RuntimeError {
    /// Whether the condition is temporary: nothing was written and the same request may
    /// succeed later.
    pub fn is_retryable(&self) -> bool {
        match self {
            RuntimeError::SessionBusy { .. }
            | RuntimeError::ThreadBusy { .. }
            | RuntimeError::ResumeUnavailable { .. }
            | RuntimeError::LeaseLost { .. } => true,
            RuntimeError::Store(error) => matches!(error, StoreError::Locked { .. }),
            RuntimeError::Client(error) => matches!(
                error,
                ClientError::Timeout { .. } | ClientError::TooManyPending { .. }
            ),
            RuntimeError::Resume { .. }
            | RuntimeError::ThreadTaken { .. }
            | RuntimeError::ThreadUnnamed { .. }
            | RuntimeError::Internal(_)
            | RuntimeError::TurnFailed { .. }
            | RuntimeError::Sink(_) => false,
        }
    }

    /// A stable snake_case name of the variant: `client`, `store`, `resume_failed`,
    /// `resume_unavailable`, `thread_busy`, `turn_failed`, `sink`, `session_busy`,
    /// `lease_lost`, `thread_taken`, `thread_unnamed`, `internal`.
    pub fn kind(&self) -> &'static str {
        match self {
            RuntimeError::Client(_) => "client",
            RuntimeError::Store(_) => "store",
            RuntimeError::Resume { .. } => "resume_failed",
            RuntimeError::ResumeUnavailable { .. } => "resume_unavailable",
            RuntimeError::ThreadBusy { .. } => "thread_busy",
            RuntimeError::TurnFailed { .. } => "turn_failed",
            RuntimeError::Sink(_) => "sink",
            RuntimeError::SessionBusy { .. } => "session_busy",
            RuntimeError::LeaseLost { .. } => "lease_lost",
            RuntimeError::ThreadTaken { .. } => "thread_taken",
            RuntimeError::ThreadUnnamed { .. } => "thread_unnamed",
            RuntimeError::Internal(_) => "internal",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_mapping_keeps_lease_errors_typed() {
        let lost: RuntimeError = StoreError::LeaseLost {
            session_id: "s".into(),
            cause: rethread_store::LeaseLoss::Released,
        }
        .into();
        assert!(
            matches!(lost, RuntimeError::LeaseLost { ref session_id, .. } if session_id == "s")
        );
        assert!(lost.is_retryable());
        let closed: RuntimeError = StoreError::Closed.into();
        assert_eq!(closed.kind(), "store");
        assert!(!closed.is_retryable());
    }
}
