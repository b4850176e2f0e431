//! The resume-or-fallback state machine (design.md, "Resume-or-fallback"; invariants I1-I7).
//!
//! An [`Agent`] stands for one host session id. The **first** [`CodexSession`] it opens
//! resumes the stored thread before any turn; later ones (after a retire or a recreate) start
//! fresh. A resume codex cannot serve fails closed: the binding is compare-and-deleted, a new
//! thread starts on the same client and [`RESUME_FALLBACK_NOTICE`] goes on the lifecycle rail
//! exactly once. A turn's binding is published only once its rows are durable.
//!
//! Before it resumes or starts a thread, an agent takes the session's lease in the store (see
//! `lease.rs`); its codex sessions hold it through their turns' commits and release it when the
//! last of them goes away. A session held elsewhere is [`RuntimeError::SessionBusy`]: no thread
//! is resumed or started.

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use rethread_protocol::messages::{
    ServerNotification, ThreadResume, ThreadResumeParams, ThreadStart, ThreadStartParams,
    TurnInterrupt, TurnInterruptParams, TurnStart, TurnStartParams, TurnStatus, UserInput,
};
use rethread_protocol::{classify_resume_error, ErrorCode, ResumeFailure, RpcError};
use rethread_store::{
    BindingStore, CommitOutcome, Fence, Lease, LeaseOwner, LocalOwner, StoreError, TurnCommit,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::client::{AppServerClient, ClientError};
use crate::lease::LeaseGuard;
use crate::projection::{project_turn, render_seed, reply_of};
use crate::rail::{StatusEvent, StatusKind, StatusRail};

/// The one lifecycle notice of a fallback.
pub const RESUME_FALLBACK_NOTICE: &str = "Codex thread could not be resumed; starting a new one.";

/// Seeding a fresh thread that replaces a lost one with the tail of the host transcript.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// How an [`Agent`] behaves.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// The `CODEX_HOME` recorded with each binding (diagnostics). Defaults to the
    /// environment's `CODEX_HOME` when the options are built, else codex's own default
    /// `$HOME/.codex`.
    pub codex_home: Option<String>,
    /// Ask for `excludeTurns: true` on resume (the host keeps its own transcript). If the
    /// server refuses the field for lack of a capability, the resume is retried without it.
    pub exclude_turns: bool,
    /// Extra attempts after a transient resume failure (overloaded, busy, timeout).
    pub transient_retries: u32,
    /// The wait before the first retry; doubled on each further one.
    pub retry_backoff: Duration,
    /// When transient failures outlast the retries: `true` fails closed (design.md rule 4);
    /// `false` returns [`RuntimeError::ThreadBusy`] and leaves the store untouched. A thread
    /// that has an active writer in another process is never failed closed: starting a new
    /// thread would fork a live conversation.
    pub fall_back_after_transient: bool,
    /// Seed a thread that replaces a lost one; `None` disables seeding.
    pub seed: Option<SeedOptions>,
    /// How long one turn may run before it is interrupted and reported as failed.
    pub turn_timeout: Duration,
    /// Template of the `thread/start` params (cwd, model, ...).
    pub thread_start: ThreadStartParams,
    /// The TTL of the session lease taken before a thread is resumed or started (renewed every
    /// third of it while held; a crashed holder frees it after at most this long). `None` takes
    /// no lease: only for a host that serialises its sessions by other means, or a test that
    /// observes codex's own single-writer guard.
    pub lease_ttl: Option<Duration>,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            codex_home: effective_codex_home(),
            exclude_turns: true,
            transient_retries: 3,
            retry_backoff: Duration::from_millis(200),
            fall_back_after_transient: true,
            seed: Some(SeedOptions::default()),
            turn_timeout: Duration::from_secs(15 * 60),
            thread_start: ThreadStartParams::default(),
            lease_ttl: Some(Duration::from_secs(30)),
        }
    }
}

/// The `CODEX_HOME` a spawned codex will use: the variable, else codex's default `~/.codex`.
fn effective_codex_home() -> Option<String> {
    match std::env::var_os("CODEX_HOME") {
        Some(home) => Some(home.to_string_lossy().into_owned()),
        None => std::env::var_os("HOME").map(|home| {
            std::path::Path::new(&home)
                .join(".codex")
                .to_string_lossy()
                .into_owned()
        }),
    }
}

/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The app-server connection failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// `thread/resume` failed in a way that is not evidence the thread is lost; the binding
    /// is kept.
    #[error("resuming thread {thread_id} failed ({failure}): {error}")]
    Resume {
        /// The bound thread.
        thread_id: String,
        /// The classification.
        failure: ResumeFailure,
        /// The server's error.
        error: RpcError,
    },
    /// The thread is busy (active writer elsewhere, or transient failures outlasted the
    /// retries with fallback disabled); nothing in the store was changed.
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
    Sink(String),
    /// Another host (or agent) holds the session's lease: it is driving this session's codex
    /// thread. No thread was resumed or started and nothing was written; retry later.
    #[error("session {session_id} is busy: held by {holder} since {} (until {})", fmt_ms(*acquired_at_ms), fmt_ms(*expires_at_ms))]
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
    /// The session's lease expired or was taken over before the turn committed (the holder
    /// stalled past its TTL); the turn was not committed.
    #[error("the lease on session {session_id} was lost; the turn was not committed")]
    LeaseLost {
        /// The session.
        session_id: String,
    },
}

/// `YYYY-MM-DDTHH:MM:SSZ` (UTC) for a Unix time in milliseconds.
fn fmt_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
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
    /// A new thread was started (no binding, or a later session of the agent).
    Started {
        /// The thread.
        thread_id: String,
    },
    /// The stored thread could not be resumed; a new one was started on the same client.
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

/// Whether a host-kept transcript is durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkDurability {
    /// The rows are durable; the binding may be published.
    Durable,
    /// The rows were accepted but are not (yet) durable; the binding is not published.
    NotDurable,
}

/// A host that keeps its own transcript. The runtime publishes the binding only after
/// [`TranscriptSink::persist_turn`] reports [`SinkDurability::Durable`].
#[async_trait]
pub trait TranscriptSink: Send + Sync + fmt::Debug {
    /// Persists the projected rows of one turn.
    async fn persist_turn(
        &self,
        session_id: &str,
        rows: &[Value],
    ) -> Result<SinkDurability, String>;

    /// The newest `limit` rows, oldest first, for seeding a replacement thread.
    async fn recent_rows(&self, session_id: &str, limit: u64) -> Result<Vec<Value>, String>;
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

/// What one turn produced.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnReport {
    /// The thread.
    pub thread_id: String,
    /// The turn.
    pub turn_id: String,
    /// The assistant's reply.
    pub reply: String,
    /// The projected transcript rows.
    pub rows: Vec<Value>,
    /// What happened to the binding.
    pub publication: Publication,
}

/// One host session id: builds codex sessions for it.
///
/// ```no_run
/// # async fn demo(client: rethread_runtime::AppServerClient) -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use rethread_runtime::{Agent, StatusRail};
/// use rethread_store::MemoryStore;
///
/// let store = Arc::new(MemoryStore::new());
/// let mut agent = Agent::new("session-1", store, StatusRail::default());
/// let mut session = agent.open(&client).await?; // resumes the stored thread, if any
/// let report = session.run_turn("hello").await?; // binding published once rows are durable
/// println!("{} ({})", report.reply, session.outcome().as_str());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Agent {
    session_id: String,
    store: Arc<dyn BindingStore>,
    rail: StatusRail,
    options: AgentOptions,
    sink: Option<Arc<dyn TranscriptSink>>,
    opened: bool,
    /// This agent as a lease holder: while it lives no other holder takes its leases before
    /// they expire; once it is dropped, any holder on this machine may take them at once.
    lease_owner: LocalOwner,
    /// The lease the agent's live codex sessions share (dropped with the last of them).
    lease: Weak<LeaseGuard>,
}

impl Agent {
    /// An agent for `session_id` over `store`, reporting on `rail`.
    pub fn new(
        session_id: impl Into<String>,
        store: Arc<dyn BindingStore>,
        rail: StatusRail,
    ) -> Self {
        Agent {
            session_id: session_id.into(),
            store,
            rail,
            options: AgentOptions::default(),
            sink: None,
            opened: false,
            lease_owner: LocalOwner::new(),
            lease: Weak::new(),
        }
    }

    /// Replaces the options.
    pub fn with_options(mut self, options: AgentOptions) -> Self {
        self.options = options;
        self
    }

    /// Keeps the transcript in the host's sink instead of the store's rows.
    pub fn with_transcript_sink(mut self, sink: Arc<dyn TranscriptSink>) -> Self {
        self.sink = Some(sink);
        self
    }

    /// The session id.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// Who this agent's session lease names as its holder.
    pub fn lease_owner(&self) -> &LeaseOwner {
        self.lease_owner.owner()
    }

    /// Opens a codex session on `client`. The first call resumes the stored thread (or falls
    /// back); later calls start a fresh thread.
    ///
    /// The session's lease is taken (or, while another session of this agent lives, shared)
    /// first; a lease held elsewhere is [`RuntimeError::SessionBusy`] and nothing else happens.
    pub async fn open(&mut self, client: &AppServerClient) -> Result<CodexSession, RuntimeError> {
        let lease = self.take_lease().await?;
        // Only a successful open counts: after a busy or failed first open the next one must
        // still resume, or it would fork the conversation onto a fresh thread.
        let first = !self.opened;
        let bound = if first {
            self.store
                .session(&self.session_id)
                .await?
                .and_then(|s| s.binding)
        } else {
            None
        };
        let outcome = match bound {
            None => {
                let thread_id = self.start_thread(client, None).await?;
                OpenOutcome::Started { thread_id }
            }
            Some(binding) => {
                let fence = lease.as_ref().map(|guard| guard.lease().fence());
                self.resume_or_fall_back(client, binding.thread_id, fence)
                    .await?
            }
        };
        self.opened = true;
        Ok(CodexSession {
            client: client.clone(),
            session_id: self.session_id.clone(),
            store: self.store.clone(),
            rail: self.rail.clone(),
            options: self.options.clone(),
            sink: self.sink.clone(),
            outcome,
            lease,
        })
    }

    async fn take_lease(&mut self) -> Result<Option<Arc<LeaseGuard>>, RuntimeError> {
        let Some(ttl) = self.options.lease_ttl else {
            return Ok(None);
        };
        if let Some(guard) = self.lease.upgrade() {
            if !guard.is_lost() {
                return Ok(Some(guard));
            }
        }
        let guard = Arc::new(
            LeaseGuard::acquire(
                self.store.clone(),
                &self.session_id,
                self.lease_owner.owner(),
                ttl,
            )
            .await?,
        );
        self.lease = Arc::downgrade(&guard);
        Ok(Some(guard))
    }

    async fn resume_or_fall_back(
        &mut self,
        client: &AppServerClient,
        thread_id: String,
        fence: Option<Fence>,
    ) -> Result<OpenOutcome, RuntimeError> {
        let mut exclude_turns = self.options.exclude_turns;
        let mut transient_left = self.options.transient_retries;
        let mut backoff = self.options.retry_backoff;
        let (failure, error) = loop {
            let mut params = ThreadResumeParams::new(thread_id.clone());
            if exclude_turns {
                params.exclude_turns = Some(true);
            }
            let error = match client.request::<ThreadResume>(&params).await {
                Ok(_) => return Ok(OpenOutcome::Resumed { thread_id }),
                Err(ClientError::Rpc { error, .. }) => error,
                Err(ClientError::Timeout { after, .. }) => RpcError::new(
                    ErrorCode::OVERLOADED,
                    format!("thread/resume timed out after {after:?}"),
                ),
                Err(other) => return Err(other.into()),
            };
            let failure = classify_resume_error(&error);
            match failure {
                ResumeFailure::CapabilityRequired if exclude_turns => {
                    // The server does not serve `excludeTurns` to this client: not a dead thread.
                    exclude_turns = false;
                }
                ResumeFailure::Busy if transient_left > 0 => {
                    transient_left -= 1;
                    tokio::time::sleep(backoff).await;
                    backoff = backoff.saturating_mul(2);
                }
                ResumeFailure::Busy => {
                    let active_writer = error.code == ErrorCode::INVALID_REQUEST;
                    if active_writer || !self.options.fall_back_after_transient {
                        return Err(RuntimeError::ThreadBusy {
                            thread_id,
                            message: error.message,
                        });
                    }
                    break (failure, error);
                }
                f if f.thread_is_lost() => break (failure, error),
                _ => {
                    return Err(RuntimeError::Resume {
                        thread_id,
                        failure,
                        error,
                    })
                }
            }
        };
        self.fall_back(client, thread_id, failure, error, fence.as_ref())
            .await
    }

    async fn fall_back(
        &mut self,
        client: &AppServerClient,
        lost: String,
        reason: ResumeFailure,
        error: RpcError,
        fence: Option<&Fence>,
    ) -> Result<OpenOutcome, RuntimeError> {
        // One write: the lost thread is retired (so a late commit from elsewhere cannot
        // resurrect it) and the binding dropped if it still names it (a binding written
        // meanwhile by another host survives). Fenced: a holder that lost the lease writes
        // nothing.
        self.store
            .retire_thread(&self.session_id, &lost, fence)
            .await?;
        // Said as soon as the binding is gone, before `thread/start`: if the start fails, the
        // next open starts fresh (there is no binding left) and must not say it again.
        self.rail.emit(
            StatusEvent::new(StatusKind::Lifecycle, RESUME_FALLBACK_NOTICE)
                .with("session_id", self.session_id.clone())
                .with("previous_thread_id", lost.clone())
                .with("reason", reason.as_str())
                .with("error", error.message.clone()),
        );
        let seed = self.seed_text().await;
        let seeded = seed.is_some();
        let thread_id = self.start_thread(client, seed).await?;
        Ok(OpenOutcome::FellBack {
            thread_id,
            previous_thread_id: lost,
            reason,
            message: error.message,
            seeded,
        })
    }

    async fn seed_text(&self) -> Option<String> {
        let seed = self.options.seed.as_ref()?;
        let rows = match &self.sink {
            Some(sink) => match sink.recent_rows(&self.session_id, seed.max_rows).await {
                Ok(rows) => rows,
                Err(error) => {
                    self.warn(format!(
                        "Could not read the transcript to seed the new thread: {error}"
                    ));
                    return None;
                }
            },
            None => match self.store.session(&self.session_id).await {
                Ok(Some(record)) => {
                    let start = record.row_count.saturating_sub(seed.max_rows);
                    match self
                        .store
                        .rows(&self.session_id, start..record.row_count)
                        .await
                    {
                        Ok(rows) => rows.into_iter().map(|r| r.body).collect(),
                        Err(error) => {
                            self.warn(format!(
                                "Could not read the transcript to seed the new thread: {error}"
                            ));
                            return None;
                        }
                    }
                }
                Ok(None) => return None,
                Err(error) => {
                    self.warn(format!(
                        "Could not read the transcript to seed the new thread: {error}"
                    ));
                    return None;
                }
            },
        };
        render_seed(&rows, seed.max_chars)
    }

    fn warn(&self, message: String) {
        self.rail.emit(StatusEvent::new(StatusKind::Warn, message));
    }

    async fn start_thread(
        &self,
        client: &AppServerClient,
        seed: Option<String>,
    ) -> Result<String, RuntimeError> {
        let mut params = self.options.thread_start.clone();
        if let Some(seed) = seed {
            params.developer_instructions = Some(match params.developer_instructions.take() {
                Some(own) => format!("{own}\n\n{seed}"),
                None => seed,
            });
        }
        let response = client.request::<ThreadStart>(&params).await?;
        Ok(response.thread.id)
    }
}

/// A codex thread opened for a session: runs turns and publishes the binding.
#[derive(Debug)]
pub struct CodexSession {
    client: AppServerClient,
    session_id: String,
    store: Arc<dyn BindingStore>,
    rail: StatusRail,
    options: AgentOptions,
    sink: Option<Arc<dyn TranscriptSink>>,
    outcome: OpenOutcome,
    lease: Option<Arc<LeaseGuard>>,
}

impl CodexSession {
    /// How the session was opened.
    pub fn outcome(&self) -> &OpenOutcome {
        &self.outcome
    }

    /// The thread the session runs on.
    pub fn thread_id(&self) -> &str {
        self.outcome.thread_id()
    }

    /// The session lease this codex session holds (as last granted or renewed), if the agent
    /// takes leases.
    pub fn lease(&self) -> Option<Lease> {
        self.lease.as_ref().map(|guard| guard.lease())
    }

    /// Ends the session and, if it was the agent's last live one, releases the session lease
    /// now (dropping the session releases it in the background instead).
    pub async fn close(self) -> Result<(), RuntimeError> {
        if let Some(guard) = self.lease.and_then(|guard| Arc::try_unwrap(guard).ok()) {
            guard.release().await?;
        }
        Ok(())
    }

    /// Runs one turn, projects it into rows, makes them durable and then publishes the
    /// binding. A turn that does not complete writes nothing.
    pub async fn run_turn(&mut self, text: &str) -> Result<TurnReport, RuntimeError> {
        let thread_id = self.thread_id().to_string();
        let mut events = self.client.subscribe(&thread_id)?;
        let started = self
            .client
            .request::<TurnStart>(&TurnStartParams {
                thread_id: thread_id.clone(),
                input: vec![UserInput::text(text)],
            })
            .await?;
        let turn_id = started.turn.id;
        let deadline = tokio::time::Instant::now() + self.options.turn_timeout;
        let mut items = Vec::new();
        let completed = loop {
            let next = match tokio::time::timeout_at(deadline, events.next()).await {
                Ok(next) => next?,
                Err(_elapsed) => {
                    // Unsubscribe first: a turn still streaming would otherwise fill the
                    // subscription, stall the reader, and the interrupt's answer could never be
                    // read (found by resource_bounds.rs).
                    drop(events);
                    let interrupt = TurnInterruptParams {
                        thread_id: thread_id.clone(),
                        turn_id: turn_id.clone(),
                    };
                    let _ = self.client.request::<TurnInterrupt>(&interrupt).await;
                    return Err(RuntimeError::TurnFailed {
                        thread_id,
                        turn_id,
                        status: "timeout".to_string(),
                        message: format!(
                            "no turn/completed within {:?}",
                            self.options.turn_timeout
                        ),
                    });
                }
            };
            match next {
                ServerNotification::ItemCompleted(n) if n.turn_id == turn_id => items.push(n.item),
                ServerNotification::TurnCompleted(n) if n.turn.id == turn_id => break n.turn,
                _ => {}
            }
        };
        drop(events);
        if completed.status != TurnStatus::Completed {
            let status = serde_json::to_value(&completed.status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| "unknown".to_string());
            return Err(RuntimeError::TurnFailed {
                thread_id,
                turn_id,
                status,
                message: completed.error.map(|e| e.message).unwrap_or_default(),
            });
        }
        // Prefer the items streamed during the turn; a server that only reports them on
        // completion is served too.
        if items.is_empty() {
            items = completed.items;
        }
        let rows = project_turn(&thread_id, &turn_id, text, &items);
        let publication = self.commit(&thread_id, &rows).await?;
        if publication != Publication::Published {
            self.rail.emit(
                StatusEvent::new(
                    StatusKind::Warn,
                    format!(
                        "The binding to thread {thread_id} was not published ({publication:?})."
                    ),
                )
                .with("thread_id", thread_id.clone()),
            );
        }
        Ok(TurnReport {
            reply: reply_of(&rows),
            thread_id,
            turn_id,
            rows,
            publication,
        })
    }

    async fn commit(&self, thread_id: &str, rows: &[Value]) -> Result<Publication, RuntimeError> {
        // The lease must hold through the commit (see `lease.rs`).
        if let Some(guard) = &self.lease {
            guard.ensure_fresh().await?;
        }
        let store_rows = match &self.sink {
            None => rows.to_vec(),
            Some(sink) => match sink
                .persist_turn(&self.session_id, rows)
                .await
                .map_err(RuntimeError::Sink)?
            {
                SinkDurability::Durable => Vec::new(),
                SinkDurability::NotDurable => return Ok(Publication::NotDurable),
            },
        };
        let commit = TurnCommit {
            session_id: self.session_id.clone(),
            thread_id: thread_id.to_string(),
            codex_home: self.options.codex_home.clone(),
            rows: store_rows,
            fence: self.lease.as_ref().map(|guard| guard.lease().fence()),
        };
        Ok(match self.store.commit_turn(commit).await? {
            CommitOutcome::Published { .. } => Publication::Published,
            _ => Publication::RetiredNotPublished,
        })
    }

    /// Retires this thread for the session: its binding is dropped and never published again.
    pub async fn retire(self) -> Result<(), RuntimeError> {
        let fence = self.lease.as_ref().map(|guard| guard.lease().fence());
        self.store
            .retire_thread(&self.session_id, self.thread_id(), fence.as_ref())
            .await?;
        Ok(())
    }
}
