//! The binding's rules as pieces a host can drive its own way: judge a failed `thread/resume`
//! ([`ResumeAttempts`]), give a lost thread up ([`give_up_thread`]), seed the thread that
//! replaces it ([`seed_text`], [`apply_seed`]) and commit a completed turn with the binding
//! ([`commit_turn`]).
//!
//! [`SessionBinder`](crate::SessionBinder) and [`CodexSession`](crate::CodexSession) are built
//! from exactly these; a host that sends its own requests (a JSON-RPC proxy in front of codex)
//! uses them to apply the same rules without a second implementation. None of them sends a
//! request to codex.
//!
//! The whole cycle, as a proxy would run it (the requests are the proxy's own business):
//!
//! ```no_run
//! # async fn demo(
//! #     store: std::sync::Arc<dyn rethread_store::BindingStore>,
//! #     rail: rethread_runtime::StatusRail,
//! #     lease: rethread_runtime::SessionLease,
//! #     send_resume: impl Fn(rethread_protocol::messages::ThreadResumeParams) -> Result<(), rethread_protocol::RpcError>,
//! # ) -> Result<(), rethread_runtime::RuntimeError> {
//! use rethread_runtime::binding::{give_up_thread, seed_text, ResumeAttempts, ResumePolicy, ResumeVerdict};
//! use rethread_runtime::{SeedOptions, Transcript};
//!
//! let bound = "thr_1";
//! let mut attempts = ResumeAttempts::new(bound, &ResumePolicy::default());
//! let lost = loop {
//!     let error = match send_resume(attempts.params()) {
//!         Ok(()) => return Ok(()), // resumed: no notice, nothing written
//!         Err(error) => error,
//!     };
//!     match attempts.on_error(&error) {
//!         ResumeVerdict::Retry { delay } => tokio::time::sleep(delay).await,
//!         ResumeVerdict::Lost(lost) => break lost,
//!         ResumeVerdict::Stop(error) => return Err(error), // binding kept
//!     }
//! };
//! let fence = lease.ensure_fresh().await?;
//! give_up_thread(store.as_ref(), &rail, "chat-42", &lost, Some(&fence)).await?; // notice on the rail
//! let seed = seed_text(store.as_ref(), &Transcript::Store, "chat-42", &SeedOptions::default(), &rail).await;
//! // ... `thread/start` with `apply_seed`, run the turn, then `commit_turn`.
//! # let _ = seed;
//! # Ok(()) }
//! ```

use std::time::Duration;

use rethread_protocol::messages::{ThreadResumeParams, ThreadStartParams};
use rethread_protocol::{classify_resume_error, ResumeFailure, RpcError};
use rethread_store::{
    BindingStore, CommitOutcome, Fence, GivenUp, Retirement, SessionRecord, TurnCommit,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::RuntimeError;
use crate::lease::SessionLease;
use crate::options::SeedOptions;
use crate::projection::render_seed;
use crate::rail::{StatusEvent, StatusKind, StatusRail};
use crate::sink::{SinkDurability, Transcript};
use crate::telemetry;

/// The one lifecycle notice of a fallback.
pub const RESUME_FALLBACK_NOTICE: &str = "Codex thread could not be resumed; starting a new one.";

/// How a bound thread's `thread/resume` is retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumePolicy {
    /// Ask for `excludeTurns: true` (the host keeps its own transcript); dropped, and the resume
    /// sent again, when the server refuses the field for lack of a capability.
    pub exclude_turns: bool,
    /// Extra attempts after a temporary failure (overloaded, timeout, I/O, active writer).
    pub transient_retries: u32,
    /// The pause before the first retry; doubled on each further one.
    pub retry_backoff: Duration,
}

impl Default for ResumePolicy {
    fn default() -> Self {
        ResumePolicy {
            exclude_turns: true,
            transient_retries: 3,
            retry_backoff: Duration::from_millis(200),
        }
    }
}

/// What to do after a failed `thread/resume`. Exhaustive on purpose: a host that drives its
/// own requests must handle every verdict, and a new one must not slip past it.
#[derive(Debug)]
pub enum ResumeVerdict {
    /// Send `thread/resume` again, with [`ResumeAttempts::params`] (which may have dropped
    /// `excludeTurns`), after `delay`.
    Retry {
        /// How long to wait first (zero after a capability refusal).
        delay: Duration,
    },
    /// Codex cannot hand the thread back (gone, incompatible, structurally unreadable): give it
    /// up ([`give_up_thread`]) and start a new thread.
    Lost(LostThread),
    /// Stop: return this error. The binding is kept and nothing may be written
    /// ([`RuntimeError::ThreadBusy`], [`RuntimeError::ResumeUnavailable`] or
    /// [`RuntimeError::Resume`]).
    Stop(RuntimeError),
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

/// The attempts to resume one bound thread: which params to send, and what each failure
/// means.
///
/// # Contract
/// - A capability refusal of `excludeTurns` is retried at once without the field, never taken
///   for a lost thread.
/// - A temporary failure (`busy`, `overloaded`, `io`, `timeout`) is retried after a growing
///   pause, at most [`ResumePolicy::transient_retries`] times; then an active writer elsewhere
///   is [`RuntimeError::ThreadBusy`] and anything else [`RuntimeError::ResumeUnavailable`].
///   A temporary failure is never [`ResumeVerdict::Lost`].
/// - `gone`, `incompatible` and `unreadable` are [`ResumeVerdict::Lost`] at once.
/// - Anything else is [`RuntimeError::Resume`] at once.
///
/// ```
/// use rethread_protocol::RpcError;
/// use rethread_runtime::binding::{ResumeAttempts, ResumePolicy, ResumeVerdict};
///
/// let mut attempts = ResumeAttempts::new("thr_1", &ResumePolicy::default());
/// assert_eq!(attempts.params().exclude_turns, Some(true));
/// let overloaded = RpcError::new(-32001, "Server overloaded; retry later.");
/// assert!(matches!(attempts.on_error(&overloaded), ResumeVerdict::Retry { .. }));
/// let gone = RpcError::new(-32600, "no rollout found for thread id thr_1");
/// assert!(matches!(attempts.on_error(&gone), ResumeVerdict::Lost(_)));
/// ```
#[derive(Debug, Clone)]
pub struct ResumeAttempts {
    thread_id: String,
    exclude_turns: bool,
    transient_left: u32,
    backoff: Duration,
    sent: u32,
}

impl ResumeAttempts {
    /// The first attempt to resume `thread_id` under `policy`.
    pub fn new(thread_id: impl Into<String>, policy: &ResumePolicy) -> Self {
        ResumeAttempts {
            thread_id: thread_id.into(),
            exclude_turns: policy.exclude_turns,
            transient_left: policy.transient_retries,
            backoff: policy.retry_backoff,
            sent: 0,
        }
    }

    /// The thread being resumed.
    pub fn thread_id(&self) -> &str {
        &self.thread_id
    }

    /// The params of the next `thread/resume` to send.
    pub fn params(&self) -> ThreadResumeParams {
        let mut params = ThreadResumeParams::new(self.thread_id.clone());
        if self.exclude_turns {
            params.exclude_turns = Some(true);
        }
        params
    }

    /// Judges the server's error answer to the last `thread/resume`.
    pub fn on_error(&mut self, error: &RpcError) -> ResumeVerdict {
        self.judge(classify_resume_error(error), error)
    }

    /// Judges a `thread/resume` that got no answer within `after` (a temporary failure).
    pub fn on_timeout(&mut self, after: Duration) -> ResumeVerdict {
        let error = RpcError::new(
            rethread_protocol::ErrorCode::OVERLOADED,
            format!("thread/resume got no answer within {after:?}"),
        );
        self.judge(ResumeFailure::Timeout, &error)
    }

    fn judge(&mut self, failure: ResumeFailure, error: &RpcError) -> ResumeVerdict {
        self.sent += 1;
        if failure == ResumeFailure::CapabilityRequired && self.exclude_turns {
            // The server does not serve `excludeTurns` to this client: not a dead thread.
            self.exclude_turns = false;
            return ResumeVerdict::Retry {
                delay: Duration::ZERO,
            };
        }
        if failure.thread_is_lost() {
            return ResumeVerdict::Lost(LostThread {
                thread_id: self.thread_id.clone(),
                reason: failure,
                message: error.message.clone(),
            });
        }
        if !failure.is_transient() {
            return ResumeVerdict::Stop(RuntimeError::Resume {
                thread_id: self.thread_id.clone(),
                failure,
                error: error.clone(),
            });
        }
        if self.transient_left > 0 {
            self.transient_left -= 1;
            let delay = self.backoff;
            self.backoff = self.backoff.saturating_mul(2);
            return ResumeVerdict::Retry { delay };
        }
        ResumeVerdict::Stop(match failure {
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

/// Gives a lost thread up: retires it for the session and drops the binding if it still names
/// it, in **one** fenced store write, then puts [`RESUME_FALLBACK_NOTICE`] on `rail` (kind
/// `lifecycle`, fields `session_id`, `previous_thread_id`, `reason`, `error`).
///
/// # Contract
/// - The notice goes on the rail exactly once, right after the write succeeded, and never
///   when it failed: then the binding is kept (the write did nothing), the error is returned
///   and the next attempt judges the thread again.
/// - A binding written meanwhile for another thread survives (compare-and-delete); a retired
///   thread is never published again, whoever commits it later.
/// - With a `fence` that is no longer the session's live lease the store refuses the write:
///   [`RuntimeError::LeaseLost`], nothing written, no notice.
pub async fn give_up_thread(
    store: &dyn BindingStore,
    rail: &StatusRail,
    session_id: &str,
    lost: &LostThread,
    fence: Option<&Fence>,
) -> Result<(), RuntimeError> {
    store
        .retire_thread(
            session_id,
            &lost.thread_id,
            Retirement::Lost {
                reason: lost.reason.as_str().to_string(),
                message: lost.message.clone(),
            },
            fence,
        )
        .await?;
    metrics::counter!(telemetry::FALLBACKS_TOTAL, "reason" => lost.reason.as_str()).increment(1);
    rail.emit(
        fallback_notice(session_id, &lost.thread_id)
            .with("reason", lost.reason.as_str())
            .with("error", lost.message.clone()),
    );
    Ok(())
}

/// The fallback notice still owed for `record`: its thread was given up (the give-up write
/// recorded the notice as pending, [`SessionRecord::pending_notice`]) and no turn on a new
/// thread has been committed since, so the host that gave it up may have died before the user
/// saw the notice. `None` when the session is bound or nothing is pending.
///
/// # Contract
/// Every open of such a session reports a fallback from the recorded thread and says
/// [`RESUME_FALLBACK_NOTICE`] ([`announce_pending_fallback`]), until a turn on the new thread
/// is committed (the commit that publishes its binding clears the record). The notice is thus
/// said at least once per give-up, and once more per host that died before that commit.
pub fn pending_fallback(record: &SessionRecord) -> Option<GivenUp> {
    if record.binding().is_some() {
        return None;
    }
    record.pending_notice().cloned()
}

/// Says a pending fallback's [`RESUME_FALLBACK_NOTICE`] on `rail` (kind `lifecycle`, fields
/// `session_id`, `previous_thread_id`, `pending: true`); see [`pending_fallback`].
pub fn announce_pending_fallback(rail: &StatusRail, session_id: &str, pending: &GivenUp) {
    rail.emit(fallback_notice(session_id, &pending.thread_id).with("pending", true));
}

fn fallback_notice(session_id: &str, previous_thread_id: &str) -> StatusEvent {
    StatusEvent::new(StatusKind::Lifecycle, RESUME_FALLBACK_NOTICE)
        .with("session_id", session_id.to_string())
        .with("previous_thread_id", previous_thread_id.to_string())
}

/// The seed for a thread that replaces a lost one: the newest rows of the session's
/// transcript (at most `options.max_rows`, rendered within `options.max_chars`), or `None`
/// when there is nothing to render.
///
/// # Contract
/// Never fails: a transcript that cannot be read costs the seed and says so on `rail`
/// (kind `warn`).
pub async fn seed_text(
    store: &dyn BindingStore,
    transcript: &Transcript,
    session_id: &str,
    options: &SeedOptions,
    rail: &StatusRail,
) -> Option<String> {
    let rows = match transcript {
        Transcript::Sink(sink) => sink
            .recent_rows(session_id, options.max_rows)
            .await
            .map_err(|error| error.to_string()),
        Transcript::Store => store_tail(store, session_id, options.max_rows).await,
    };
    match rows {
        Ok(rows) => render_seed(&rows, options.max_chars),
        Err(error) => {
            rail.emit(StatusEvent::new(
                StatusKind::Warn,
                format!("Could not read the transcript to seed the new thread: {error}"),
            ));
            None
        }
    }
}

async fn store_tail(
    store: &dyn BindingStore,
    session_id: &str,
    max_rows: u64,
) -> Result<Vec<Value>, String> {
    let Some(record) = store.session(session_id).await.map_err(|e| e.to_string())? else {
        return Ok(Vec::new());
    };
    let start = record.row_count.saturating_sub(max_rows);
    let rows = store
        .rows(session_id, start..record.row_count)
        .await
        .map_err(|e| e.to_string())?;
    Ok(rows.into_iter().map(|row| row.body).collect())
}

/// Puts `seed` into the developer instructions of a `thread/start`, after the host's own.
pub fn apply_seed(params: &mut ThreadStartParams, seed: String) {
    params.developer_instructions = Some(match params.developer_instructions.take() {
        Some(own) => format!("{own}\n\n{seed}"),
        None => seed,
    });
}

/// How a turn's binding publication went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Publication {
    /// Rows durable and the binding names this thread.
    Published,
    /// Rows durable; the thread was retired meanwhile, so it was not published.
    RetiredNotPublished,
    /// The host sink did not report durability; not published.
    NotDurable,
}

/// A completed turn's projected rows, ready to commit (see
/// [`project_turn`](crate::projection::project_turn)).
#[derive(Debug, Clone, Copy)]
pub struct TurnRows<'a> {
    /// The host session.
    pub session_id: &'a str,
    /// The thread the turn ran on: the binding to publish.
    pub thread_id: &'a str,
    /// The `CODEX_HOME` to record with the binding.
    pub codex_home: Option<&'a str>,
    /// The rows.
    pub rows: &'a [Value],
}

/// Makes a completed turn's rows durable and then publishes its thread as the session's
/// binding, under the lease's fence.
///
/// # Contract
/// - With a `lease`: [`SessionLease::ensure_fresh`] first, and the store write carries its
///   fence; a lost lease is [`RuntimeError::LeaseLost`] and nothing is written to the store.
/// - [`Transcript::Store`]: rows and binding in one transaction
///   ([`BindingStore::commit_turn`]).
/// - [`Transcript::Sink`]: the sink persists the rows first; only on
///   [`SinkDurability::Durable`] is the binding published (a store commit without rows),
///   [`Publication::NotDurable`] otherwise. A sink error is [`RuntimeError::Sink`].
/// - A thread retired meanwhile commits its rows but is not published
///   ([`Publication::RetiredNotPublished`]).
pub async fn commit_turn(
    store: &dyn BindingStore,
    transcript: &Transcript,
    lease: Option<&SessionLease>,
    turn: TurnRows<'_>,
) -> Result<Publication, RuntimeError> {
    use tracing::Instrument;
    let span = tracing::info_span!(
        telemetry::SPAN_COMMIT,
        session_id = %turn.session_id,
        thread_id = %turn.thread_id,
        rows = turn.rows.len(),
        outcome = tracing::field::Empty,
    );
    let started_at = std::time::Instant::now();
    let committed = write_turn(store, transcript, lease, turn)
        .instrument(span.clone())
        .await;
    let outcome = match &committed {
        Ok(Publication::Published) => "published",
        Ok(Publication::RetiredNotPublished) => "retired_not_published",
        Ok(Publication::NotDurable) => "not_durable",
        Err(_) => "error",
    };
    span.record("outcome", outcome);
    metrics::histogram!(telemetry::COMMIT_SECONDS, "outcome" => outcome)
        .record(started_at.elapsed().as_secs_f64());
    committed
}

/// [`commit_turn`] without its span and metrics.
async fn write_turn(
    store: &dyn BindingStore,
    transcript: &Transcript,
    lease: Option<&SessionLease>,
    turn: TurnRows<'_>,
) -> Result<Publication, RuntimeError> {
    let fence = match lease {
        Some(lease) => Some(lease.ensure_fresh().await?),
        None => None,
    };
    let rows = match transcript {
        Transcript::Store => turn.rows.to_vec(),
        Transcript::Sink(sink) => match sink
            .persist_turn(turn.session_id, turn.rows)
            .await
            .map_err(RuntimeError::Sink)?
        {
            SinkDurability::Durable => Vec::new(),
            SinkDurability::NotDurable => return Ok(Publication::NotDurable),
        },
    };
    let commit = TurnCommit {
        session_id: turn.session_id.to_string(),
        thread_id: turn.thread_id.to_string(),
        codex_home: turn.codex_home.map(str::to_string),
        rows,
        fence,
    };
    Ok(match store.commit_turn(commit).await? {
        CommitOutcome::Published { .. } => Publication::Published,
        _ => Publication::RetiredNotPublished,
    })
}
