//! What a failed `thread/resume` means.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{ErrorCode, RpcError};

/// The meaning of a failed `thread/resume`, judged from code **and** message (codex answers
/// -32600 both for a thread that is gone and for one busy in another process).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ResumeFailure {
    /// Not found: never materialized, rollout deleted, another `CODEX_HOME`, a malformed id.
    Gone,
    /// This codex cannot serve it: a paginated thread on an older release, an unknown mode.
    Incompatible,
    /// The rollout exists but is structurally unreadable: empty, no session metadata, or not
    /// JSON (a writer killed early); not an I/O error ([`ResumeFailure::Io`]).
    Unreadable,
    /// The thread was made under another ChatGPT account or organisation than this home's: its
    /// encrypted reasoning cannot be read here (the first turn after a restore fails with
    /// `invalid_encrypted_content`, [`classify_turn_error`]), or codex refuses the resume
    /// itself ("created with a different ChatGPT account or workspace"). Lost for this home.
    AccountMismatch,
    /// Transient: another app-server process is writing the thread. Retry later; a new thread
    /// would fork a live conversation.
    Busy,
    /// Transient: the server is overloaded (`-32001`). Retry later.
    Overloaded,
    /// Transient: codex hit an operating-system I/O error reading the thread (`(os error N)`);
    /// the rollout may be intact.
    Io,
    /// Transient: no answer in time (a client's verdict, never [`classify_resume_error`]'s).
    Timeout,
    /// A field needs the `experimentalApi` capability: never a dead thread.
    CapabilityRequired,
    /// Anything else; not evidence that the thread is lost.
    Other,
}

impl ResumeFailure {
    /// Codex cannot hand the thread back: fail closed (drop the binding, start a fresh thread).
    pub fn thread_is_lost(self) -> bool {
        matches!(
            self,
            ResumeFailure::Gone
                | ResumeFailure::Incompatible
                | ResumeFailure::Unreadable
                | ResumeFailure::AccountMismatch
        )
    }

    /// The same request may succeed later: retry within a bound, then report a retryable error
    /// and keep the binding.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            ResumeFailure::Busy
                | ResumeFailure::Overloaded
                | ResumeFailure::Io
                | ResumeFailure::Timeout
        )
    }

    /// A stable snake_case name (`gone`, `incompatible`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ResumeFailure::Gone => "gone",
            ResumeFailure::Incompatible => "incompatible",
            ResumeFailure::Unreadable => "unreadable",
            ResumeFailure::AccountMismatch => "account_mismatch",
            ResumeFailure::Busy => "busy",
            ResumeFailure::Overloaded => "overloaded",
            ResumeFailure::Io => "io",
            ResumeFailure::Timeout => "timeout",
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
/// // An I/O error is not evidence of a damaged rollout.
/// let io = RpcError::new(-32603, "failed to read thread: Permission denied (os error 13)");
/// assert_eq!(classify_resume_error(&io), ResumeFailure::Io);
/// ```
pub fn classify_resume_error(error: &RpcError) -> ResumeFailure {
    let message = error.message.as_str();
    // First: a client that sent `excludeTurns` blindly must never take this for a dead thread.
    if message.contains("requires experimentalApi capability") {
        return ResumeFailure::CapabilityRequired;
    }
    // An OS error (Rust spells it `(os error N)`) inside codex's "failed to read thread" says
    // the rollout could not be read *now*, not that it is damaged: before the structural ones.
    if mentions_os_error(message) {
        return ResumeFailure::Io;
    }
    // Whatever the code: codex's refusal of a thread another account made.
    if another_account(message) {
        return ResumeFailure::AccountMismatch;
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
        ErrorCode::OVERLOADED => ResumeFailure::Overloaded,
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
                // Structural: empty, no `session_meta` first line, not JSON.
                ResumeFailure::Unreadable
            } else {
                ResumeFailure::Other
            }
        }
        _ => ResumeFailure::Other,
    }
}

/// What a failed turn's error (`turn/completed`'s `turn.error.message`, the `error`
/// notification's, `codex exec`'s `turn.failed`) says of its thread: `Some` only for a loss,
/// [`ResumeFailure::AccountMismatch`], when the Responses API refused the thread's encrypted
/// reasoning (`invalid_encrypted_content`; codex puts the API's body in the message) or codex
/// refused another account's thread; `None` for everything else (a network error, a rate
/// limit, a bad request of another kind), which is the turn's failure, never the thread's.
/// Whether it is a loss also depends on the turn: only the first after a resume counts (the
/// session machine decides, `docs/design.md`).
///
/// ```
/// use rethread_protocol::{classify_turn_error, ResumeFailure};
/// let refused = r#"{"error":{"message":"The encrypted content gAAA...Zg== could not be verified.","type":"invalid_request_error","param":null,"code":"invalid_encrypted_content"}}"#;
/// assert_eq!(classify_turn_error(refused), Some(ResumeFailure::AccountMismatch));
/// assert_eq!(classify_turn_error("stream disconnected before completion"), None);
/// ```
pub fn classify_turn_error(message: &str) -> Option<ResumeFailure> {
    (message.contains("invalid_encrypted_content") || another_account(message))
        .then_some(ResumeFailure::AccountMismatch)
}

/// codex's refusal of a thread another ChatGPT account or workspace made.
fn another_account(message: &str) -> bool {
    message.contains("created with a different ChatGPT account or workspace")
}

/// The JSON-RPC error of a failed resume as `codex exec ... resume <id>` prints it on stderr
/// before it exits 1: `Error: thread/resume: thread/resume failed: <message> (code <code>)`;
/// `None` without such a line. Judge it with [`classify_resume_error`], as on the wire.
///
/// ```
/// use rethread_protocol::{classify_resume_error, exec_resume_error, ResumeFailure};
/// let stderr = "Reading prompt from stdin...\nError: thread/resume: thread/resume failed: \
///               no rollout found for thread id 0199 (code -32600)\n\nStack backtrace:\n";
/// let error = exec_resume_error(stderr).unwrap();
/// assert_eq!((error.code.code(), error.message.as_str()), (-32600, "no rollout found for thread id 0199"));
/// assert_eq!(classify_resume_error(&error), ResumeFailure::Gone);
/// assert!(exec_resume_error("No prompt provided via stdin.").is_none());
/// ```
pub fn exec_resume_error(stderr: &str) -> Option<RpcError> {
    const PREFIX: &str = "Error: thread/resume: thread/resume failed: ";
    // The last report wins: codex prints one, then a backtrace.
    let line = stderr
        .lines()
        .rev()
        .find_map(|line| line.trim_end().strip_prefix(PREFIX))?;
    let (message, code) = line.strip_suffix(')')?.rsplit_once(" (code ")?;
    let code: i64 = code.parse().ok()?;
    Some(RpcError::new(code, message))
}

/// Whether `message` carries an operating-system error as Rust prints one: `(os error N)`.
fn mentions_os_error(message: &str) -> bool {
    message.match_indices("(os error ").any(|(at, marker)| {
        let rest = &message[at + marker.len()..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        digits > 0 && rest[digits..].starts_with(')')
    })
}
