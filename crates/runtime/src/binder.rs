//! [`SessionBinder`]: binds one host session id to its codex thread across restarts. It is
//! the library's driver of the [`SessionMachine`]: it carries each action out with typed
//! requests on an [`AppServerClient`] and the store, and feeds back what happened.
//!
//! Every [`SessionBinder::open`] reads the session and resumes its bound thread (also on a new
//! client after codex died: the conversation goes on); a lost thread falls back to a new,
//! seeded one with the notice said once; only the host's own [`CodexSession::retire`] makes
//! the next open start fresh. Before it resumes or starts a thread, a binder takes the
//! session's lease ([`SessionLease`]) and keeps it until [`SessionBinder::close`] (or, in the
//! background, until it and its sessions are dropped). A session held elsewhere is
//! [`RuntimeError::SessionBusy`]: no thread is resumed or started. With the rollout mirror on
//! ([`BinderOptions::mirror`], the default) a bound thread's rollout is restored from the
//! store before its resume and every turn's commit carries what the rollout grew by, so the
//! session can move to a machine whose `CODEX_HOME` never saw the thread.

use std::sync::Arc;

use rethread_protocol::messages::{ThreadResume, ThreadResumeParams, ThreadStart};
use rethread_store::{BindingStore, Lease, LeaseOwner, LocalOwner};
use tracing::field::Empty;
use tracing::Instrument;

use crate::binding::{self, apply_seed, StoreSide};
use crate::client::{AppServerClient, ClientError};
use crate::error::RuntimeError;
use crate::lease::SessionLease;
use crate::machine::DriverAction;
use crate::machine::{OpenOutcome, Say, SessionMachine};
use crate::mirror::RolloutMirror;
use crate::options::BinderOptions;
use crate::rail::StatusRail;
use crate::session::CodexSession;
use crate::sink::{Transcript, TranscriptSink};
use crate::telemetry;

/// Binds one host session id to its codex thread: opens [`CodexSession`]s for it.
///
/// ```no_run
/// # async fn demo(client: rethread_runtime::AppServerClient) -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use rethread_runtime::{SessionBinder, StatusRail};
/// use rethread_store::MemoryStore;
///
/// let store = Arc::new(MemoryStore::new());
/// let mut binder = SessionBinder::new("session-1", store, StatusRail::default());
/// let mut session = binder.open(&client).await?; // resumes the stored thread, if any
/// let report = session.run_turn("hello").await?; // binding published once rows are durable
/// println!("{} ({})", report.reply, session.outcome().as_str());
/// binder.close().await?; // the next host may take the session at once
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SessionBinder {
    session_id: String,
    store: Arc<dyn BindingStore>,
    rail: StatusRail,
    options: BinderOptions,
    transcript: Transcript,
    /// This binder as a lease holder: while it (or a lease it took) lives, no other holder
    /// takes its leases before they expire; once both are dropped, any holder on this machine
    /// may take them at once.
    owner: Arc<LocalOwner>,
    /// The lease this binder holds, shared with its live codex sessions.
    lease: Option<Arc<SessionLease>>,
    /// The rollout mirror (what this process knows of the thread's files), when on.
    mirror: Option<RolloutMirror>,
}

impl SessionBinder {
    /// A binder for `session_id` over `store`, reporting on `rail`.
    pub fn new(
        session_id: impl Into<String>,
        store: Arc<dyn BindingStore>,
        rail: StatusRail,
    ) -> Self {
        let options = BinderOptions::default();
        SessionBinder {
            session_id: session_id.into(),
            store,
            rail,
            mirror: options.rollout_mirror(),
            options,
            transcript: Transcript::Store,
            owner: Arc::new(LocalOwner::new()),
            lease: None,
        }
    }

    /// Replaces the options.
    pub fn with_options(mut self, options: BinderOptions) -> Self {
        self.mirror = options.rollout_mirror();
        self.options = options;
        self
    }

    /// Keeps the transcript in the host's sink instead of the store's rows.
    pub fn with_transcript_sink(mut self, sink: Arc<dyn TranscriptSink>) -> Self {
        self.transcript = Transcript::Sink(sink);
        self
    }

    /// The session id.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// Who this binder's session lease names as its holder.
    pub fn lease_owner(&self) -> &LeaseOwner {
        self.owner.owner()
    }

    /// The session lease the binder holds (as last granted or renewed), if any.
    pub fn lease(&self) -> Option<Lease> {
        self.lease.as_ref().map(|lease| lease.lease())
    }

    /// Opens a codex session on `client`: resumes the session's bound thread, falls back to a
    /// new one when codex cannot hand it back, or starts one when the session has none (a new
    /// session, or one whose thread the host retired).
    ///
    /// The session's lease is taken first (waiting up to [`BinderOptions::lease_wait`]) and
    /// kept by the binder; a lease held elsewhere is [`RuntimeError::SessionBusy`] and nothing
    /// else happens. A temporary resume failure is a retryable error with the binding kept
    /// ([`RuntimeError::is_retryable`]). A host whose codex died opens again on a new client
    /// and gets the same thread back.
    pub async fn open(&mut self, client: &AppServerClient) -> Result<CodexSession, RuntimeError> {
        let span = tracing::info_span!(
            telemetry::SPAN_OPEN,
            session_id = %self.session_id,
            thread_id = Empty,
            outcome = Empty,
            reason = Empty,
        );
        let opened = self.open_traced(client).instrument(span.clone()).await;
        let (outcome, reason) = match &opened {
            Ok(session) => {
                span.record("thread_id", session.thread_id());
                match session.outcome() {
                    OpenOutcome::FellBack { reason, .. } => ("fell_back", reason.as_str()),
                    other => (other.as_str(), "none"),
                }
            }
            Err(error) => ("failed", error.kind()),
        };
        span.record("outcome", outcome);
        span.record("reason", reason);
        metrics::counter!(telemetry::OPENS_TOTAL, "outcome" => outcome, "reason" => reason)
            .increment(1);
        opened
    }

    async fn open_traced(
        &mut self,
        client: &AppServerClient,
    ) -> Result<CodexSession, RuntimeError> {
        let lease = self.take_lease().await?;
        let mut machine = SessionMachine::new(&self.session_id, self.options.machine_options());
        machine.open();
        let outcome = self.drive(&mut machine, client, lease.as_deref()).await?;
        Ok(CodexSession {
            client: client.clone(),
            session_id: self.session_id.clone(),
            store: self.store.clone(),
            rail: self.rail.clone(),
            codex_home: self.options.codex_home.clone(),
            turn_timeout: self.options.turn_timeout,
            transcript: self.transcript.clone(),
            outcome,
            lease,
            machine,
            mirror: self.mirror.clone(),
        })
    }

    /// Carries the machine's actions out until the open has an outcome: the store-side ones
    /// through [`StoreSide::next_action`], the requests to codex and the rail here.
    async fn drive(
        &self,
        mut machine: &mut SessionMachine,
        client: &AppServerClient,
        lease: Option<&SessionLease>,
    ) -> Result<OpenOutcome, RuntimeError> {
        let side = StoreSide {
            store: self.store.as_ref(),
            session_id: &self.session_id,
            lease,
            transcript: &self.transcript,
            mirror: self.mirror.as_ref(),
            codex_home: self.options.codex_home.as_deref(),
        };
        let mut resume = ResumeTrace::default();
        // The `rethread.fallback` span, from the notice to the replacement's start.
        let mut fallback: Option<tracing::Span> = None;
        loop {
            let Some(action) = side.next_action(&mut machine).await else {
                // The machine always ends an open with `Opened` or `OpenFailed`.
                return Err(RuntimeError::Internal(
                    "the session machine stopped without an outcome".into(),
                ));
            };
            if !matches!(action, DriverAction::Resume(_)) {
                resume.finish(machine);
            }
            match action {
                DriverAction::Resume(params) => {
                    let params = self.resume_params(params);
                    let span = resume.begin(&self.session_id, &params.thread_id);
                    match client
                        .request::<ThreadResume>(&params)
                        .instrument(span)
                        .await
                    {
                        Ok(_) => machine.handle_resumed(),
                        Err(ClientError::Rpc { error, .. }) => machine.handle_resume_error(&error),
                        Err(ClientError::Timeout { after, .. }) => {
                            machine.handle_resume_timeout(after)
                        }
                        Err(other) => machine.handle_failed(other.into()),
                    }
                }
                DriverAction::Say(say) => {
                    if let Say::FallbackNotice {
                        previous_thread_id,
                        reason,
                        pending: false,
                        ..
                    } = &say
                    {
                        fallback = Some(tracing::info_span!(
                            telemetry::SPAN_FALLBACK,
                            session_id = %self.session_id,
                            previous_thread_id = %previous_thread_id,
                            reason = reason.as_str(),
                            thread_id = Empty,
                            seeded = Empty,
                            outcome = Empty,
                        ));
                    }
                    self.rail
                        .emit(binding::status_event(&self.session_id, &say));
                    // The rail's sinks take an event synchronously: it is delivered.
                    machine.handle_notice_delivered();
                }
                DriverAction::Start { seed } => {
                    let mut params = self.options.thread_start.clone();
                    if let Some(seed) = seed {
                        apply_seed(&mut params, seed);
                    }
                    match client.request::<ThreadStart>(&params).await {
                        Ok(response) => machine.handle_started(response.thread.id),
                        Err(error) => machine.handle_failed(error.into()),
                    }
                }
                DriverAction::Opened(outcome) => {
                    if let (
                        Some(span),
                        OpenOutcome::FellBack {
                            thread_id, seeded, ..
                        },
                    ) = (&fallback, &outcome)
                    {
                        span.record("thread_id", thread_id.as_str());
                        span.record("seeded", *seeded);
                        span.record("outcome", "started");
                    }
                    // What the machine still asks (a delivered notice's record) is done now.
                    self.drain(&side, machine).await;
                    return Ok(outcome);
                }
                DriverAction::OpenFailed(error) => {
                    if let Some(span) = &fallback {
                        span.record("outcome", "failed");
                    }
                    self.drain(&side, machine).await;
                    return Err(error);
                }
                // A commit or a retire never comes while opening.
                DriverAction::Commit { .. } | DriverAction::Retire { .. } => {}
            }
        }
    }

    /// Finishes the bookkeeping actions left after an open's outcome.
    async fn drain(&self, side: &StoreSide<'_>, mut machine: &mut SessionMachine) {
        while let Some(action) = side.next_action(&mut machine).await {
            if let DriverAction::Say(say) = action {
                self.rail
                    .emit(binding::status_event(&self.session_id, &say));
            }
        }
    }

    /// The machine's resume params plus the host's own settings for its thread (what a resume
    /// takes of them: the thread goes on as the host configured it).
    fn resume_params(&self, machine: ThreadResumeParams) -> ThreadResumeParams {
        let mut params = self.options.thread_start.resume(machine.thread_id);
        params.exclude_turns = machine.exclude_turns;
        params
    }

    /// Releases the session's lease now, so that the next host (or process) takes the session
    /// at once. A codex session still open loses its lease: its next commit is
    /// [`RuntimeError::LeaseLost`].
    ///
    /// Dropping the binder (and its sessions) releases the lease in the background instead. A
    /// failure here changes nothing that was committed: the lease then expires on its own.
    pub async fn close(mut self) -> Result<(), RuntimeError> {
        if let Some(lease) = self.lease.take() {
            lease.release().await?;
        }
        Ok(())
    }

    async fn take_lease(&mut self) -> Result<Option<Arc<SessionLease>>, RuntimeError> {
        let Some(ttl) = self.options.lease_ttl else {
            return Ok(None);
        };
        if let Some(lease) = &self.lease {
            if !lease.is_lost() {
                return Ok(Some(Arc::clone(lease)));
            }
        }
        let lease = Arc::new(
            SessionLease::acquire(
                self.store.clone(),
                &self.session_id,
                Arc::clone(&self.owner),
                ttl,
                self.options.lease_wait,
            )
            .await?,
        );
        self.lease = Some(Arc::clone(&lease));
        Ok(Some(lease))
    }
}

/// The `rethread.resume` span over one open's resume attempts, and its histogram.
#[derive(Default)]
struct ResumeTrace {
    open: Option<(tracing::Span, tokio::time::Instant, u32)>,
}

impl ResumeTrace {
    fn begin(&mut self, session_id: &str, thread_id: &str) -> tracing::Span {
        let (span, _, sent) = self.open.get_or_insert_with(|| {
            let span = tracing::info_span!(
                telemetry::SPAN_RESUME,
                session_id = %session_id,
                thread_id = %thread_id,
                outcome = Empty,
                attempts = Empty,
            );
            (span, tokio::time::Instant::now(), 0)
        });
        *sent += 1;
        span.clone()
    }

    /// Records the verdict once the attempts are over (the next action is not a resume).
    fn finish(&mut self, machine: &SessionMachine) {
        let Some((span, started_at, sent)) = self.open.take() else {
            return;
        };
        let outcome = match machine.thread_id() {
            Some(_) => "resumed",
            None if machine.is_opening() => "lost",
            None => "failed",
        };
        span.record("outcome", outcome);
        span.record("attempts", sent);
        metrics::histogram!(telemetry::RESUME_SECONDS, "outcome" => outcome)
            .record(started_at.elapsed().as_secs_f64());
    }
}
