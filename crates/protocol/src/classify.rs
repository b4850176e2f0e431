//! What a failed `thread/resume` means.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{ErrorCode, RpcError};

/// The meaning of a failed `thread/resume`, judged from code **and** message.
///
/// Codex answers -32600 both for a thread that is gone and for one that is busy in another
/// process, so the code alone is not enough.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ResumeFailure {
    /// The thread cannot be found: never materialized, rollout deleted, a different
    /// `CODEX_HOME`, or an id codex cannot parse.
    Gone,
    /// The thread exists but this codex cannot serve it: a paginated thread under an older
    /// release, or an unknown history mode.
    Incompatible,
    /// The rollout exists but cannot be read (empty or garbage, a writer killed early).
    Unreadable,
    /// Transient: another process holds the thread, or the server is overloaded. Retry.
    Busy,
    /// The request used a field that needs the `experimentalApi` capability. Never a dead
    /// thread: the client must retry without the field or with the capability.
    CapabilityRequired,
    /// Anything else; not evidence that the thread is lost.
    Other,
}

impl ResumeFailure {
    /// True when codex cannot hand the thread back, so the caller should fail closed: drop
    /// the binding and start a fresh thread.
    pub fn thread_is_lost(self) -> bool {
        matches!(
            self,
            ResumeFailure::Gone | ResumeFailure::Incompatible | ResumeFailure::Unreadable
        )
    }

    /// True when the same request may succeed later.
    pub fn is_transient(self) -> bool {
        matches!(self, ResumeFailure::Busy)
    }

    /// A stable snake_case name (`gone`, `incompatible`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ResumeFailure::Gone => "gone",
            ResumeFailure::Incompatible => "incompatible",
            ResumeFailure::Unreadable => "unreadable",
            ResumeFailure::Busy => "busy",
            ResumeFailure::CapabilityRequired => "capability_required",
            ResumeFailure::Other => "other",
        }
    }
}

impl fmt::Display for ResumeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Classifies the error of a failed `thread/resume` (also valid for `thread/read`).
///
/// ```
/// use rethread_protocol::{classify_resume_error, ResumeFailure, RpcError};
/// let gone = RpcError::new(-32600, "no rollout found for thread id 0199");
/// assert_eq!(classify_resume_error(&gone), ResumeFailure::Gone);
/// let busy = RpcError::new(-32600, "thread 0199 already has an active writer");
/// assert_eq!(classify_resume_error(&busy), ResumeFailure::Busy);
/// ```
pub fn classify_resume_error(error: &RpcError) -> ResumeFailure {
    let message = error.message.as_str();
    // Capability errors come first: a client that sent `excludeTurns` blindly must never
    // mistake the refusal for a dead thread.
    if message.contains("requires experimentalApi capability") {
        return ResumeFailure::CapabilityRequired;
    }
    // 0.169.0 answers a full read of a paginated thread whose rollout was deleted this way
    // (observed; not in the notes' table), whatever the code.
    if message.starts_with("invalid paginated history lineage") {
        return if message.contains("missing source rollout") {
            ResumeFailure::Gone
        } else {
            ResumeFailure::Unreadable
        };
    }
    match error.code {
        ErrorCode::OVERLOADED => ResumeFailure::Busy,
        ErrorCode::INVALID_REQUEST => {
            if message.contains("already has an active writer") {
                ResumeFailure::Busy
            } else if message.starts_with("no rollout found for thread id")
                || message.starts_with("failed to resolve rollout path")
                || message.starts_with("invalid session id")
                // `thread/read` spells "gone" and "malformed" its own way.
                || message.starts_with("thread not loaded")
                || message.starts_with("invalid thread id")
            {
                ResumeFailure::Gone
            } else {
                ResumeFailure::Other
            }
        }
        ErrorCode::METHOD_NOT_FOUND
            if message.starts_with("paginated_threads is not supported") =>
        {
            ResumeFailure::Incompatible
        }
        ErrorCode::INTERNAL_ERROR => {
            // The notes' wording, and what 0.169.0 actually says when the stored
            // `history_mode` is one it does not know (observed by the parity suite).
            if message.contains("unknown thread history mode")
                || message.contains("history_mode: unknown variant")
            {
                ResumeFailure::Incompatible
            } else if message.starts_with("failed to read thread")
                || message.contains("failed to read session metadata")
            {
                ResumeFailure::Unreadable
            } else {
                ResumeFailure::Other
            }
        }
        _ => ResumeFailure::Other,
    }
}
