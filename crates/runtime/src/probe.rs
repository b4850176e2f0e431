//! [`probe_thread`]: how a bound thread would fare on resume, asked with reads only
//! (`docs/design.md`, "historyMode"). Errors are classified as a failed resume's
//! ([`classify_resume_error`]).

use rethread_protocol::messages::{
    ThreadRead, ThreadReadParams, ThreadTurnsList, ThreadTurnsListParams,
};
use rethread_protocol::{classify_resume_error, ErrorCode, ResumeFailure, RpcError};
use serde::{Deserialize, Serialize};

use crate::client::{AppServerClient, ClientError};

/// What a probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ThreadHealth {
    /// Codex can hand the thread back.
    Live,
    /// The thread is gone (never materialized, rollout deleted, another `CODEX_HOME`).
    Gone,
    /// This codex cannot serve the thread (a paginated thread under an older release, an
    /// unknown history mode).
    Incompatible,
    /// The rollout is structurally unreadable.
    Unreadable,
    /// Temporarily unavailable: an active writer elsewhere, or codex overloaded.
    Busy,
    /// Anything else (an I/O error on codex's side, an unknown error).
    Error,
    /// Gone from this `CODEX_HOME`, but the store mirrors its rollout: the next open
    /// restores it here and resumes it ([`ThreadHealth::with_mirror`]).
    Restorable,
}

impl ThreadHealth {
    /// The snake_case name (as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            ThreadHealth::Live => "live",
            ThreadHealth::Gone => "gone",
            ThreadHealth::Incompatible => "incompatible",
            ThreadHealth::Unreadable => "unreadable",
            ThreadHealth::Busy => "busy",
            ThreadHealth::Error => "error",
            ThreadHealth::Restorable => "restorable",
        }
    }

    /// The health of a thread whose probe said `self`, given whether the store mirrors its
    /// rollout: a gone thread that is mirrored is [`ThreadHealth::Restorable`].
    pub fn with_mirror(self, mirrored: bool) -> Self {
        match self {
            ThreadHealth::Gone if mirrored => ThreadHealth::Restorable,
            other => other,
        }
    }

    /// Whether the thread's next open resumes it (live here, or restorable from the mirror).
    pub fn resumes(self) -> bool {
        matches!(self, ThreadHealth::Live | ThreadHealth::Restorable)
    }

    /// Every health, in report order.
    pub const ALL: [ThreadHealth; 7] = [
        ThreadHealth::Live,
        ThreadHealth::Restorable,
        ThreadHealth::Gone,
        ThreadHealth::Incompatible,
        ThreadHealth::Unreadable,
        ThreadHealth::Busy,
        ThreadHealth::Error,
    ];

    fn of_failure(failure: ResumeFailure) -> Self {
        match failure {
            ResumeFailure::Gone => ThreadHealth::Gone,
            ResumeFailure::Incompatible => ThreadHealth::Incompatible,
            ResumeFailure::Unreadable => ThreadHealth::Unreadable,
            ResumeFailure::Busy | ResumeFailure::Overloaded => ThreadHealth::Busy,
            _ => ThreadHealth::Error,
        }
    }
}

/// The result of [`probe_thread`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadProbe {
    /// The verdict.
    pub health: ThreadHealth,
    /// For a live thread `historyMode <mode>`; otherwise codex's error message.
    pub detail: String,
    /// The classification of codex's error, when there was one.
    pub failure: Option<ResumeFailure>,
}

/// Probes `thread_id` on `client` with reads only (`thread/read` without turns, then
/// `thread/turns/list` for one turn, which needs the rollout itself; never `thread/resume`):
/// nothing changes in codex or in any store, and codex warns of nothing.
///
/// # Contract
/// An error answer is a [`ThreadProbe`] (classified); a connection failure or timeout is the
/// [`ClientError`].
///
/// ```no_run
/// # async fn demo(client: rethread_runtime::AppServerClient) -> Result<(), rethread_runtime::ClientError> {
/// use rethread_runtime::{probe_thread, ThreadHealth};
/// let probe = probe_thread(&client, "0199a...").await?;
/// if probe.health != ThreadHealth::Live {
///     eprintln!("the next turn will start a new thread: {}", probe.detail);
/// }
/// # Ok(()) }
/// ```
pub async fn probe_thread(
    client: &AppServerClient,
    thread_id: &str,
) -> Result<ThreadProbe, ClientError> {
    let read = ThreadReadParams {
        thread_id: thread_id.to_string(),
        include_turns: false,
    };
    let list = ThreadTurnsListParams {
        thread_id: thread_id.to_string(),
        limit: Some(1),
    };
    let probed = async {
        let mode = client
            .request::<ThreadRead>(&read)
            .await?
            .thread
            .history_mode;
        if let Err(error) = client.request::<ThreadTurnsList>(&list).await {
            // A codex that does not serve the list (0.144.6 to a client without
            // `experimentalApi`, older releases): the full read it replaces, needed for
            // non-legacy threads only.
            if !error.rpc_error().is_some_and(list_unavailable) {
                return Err(error);
            }
            if !mode.is_legacy() {
                let full = ThreadReadParams {
                    include_turns: true,
                    ..read
                };
                client.request::<ThreadRead>(&full).await?;
            }
        }
        Ok(mode)
    };
    match probed.await {
        Ok(mode) => Ok(ThreadProbe {
            health: ThreadHealth::Live,
            detail: format!("historyMode {mode}"),
            failure: None,
        }),
        Err(error) => classify(error),
    }
}

/// Whether `rpc` refuses `thread/turns/list` itself, not the thread.
fn list_unavailable(rpc: &RpcError) -> bool {
    match classify_resume_error(rpc) {
        ResumeFailure::CapabilityRequired => true,
        ResumeFailure::Incompatible => false,
        _ => rpc.code == ErrorCode::METHOD_NOT_FOUND,
    }
}

fn classify(error: ClientError) -> Result<ThreadProbe, ClientError> {
    match error.rpc_error() {
        Some(rpc) => {
            let failure = classify_resume_error(rpc);
            Ok(ThreadProbe {
                health: ThreadHealth::of_failure(failure),
                detail: rpc.message.clone(),
                failure: Some(failure),
            })
        }
        None => Err(error),
    }
}
