//! [`SessionBinder`]: binds one host session id to its codex thread across restarts: the
//! resume-or-fallback state machine (docs/architecture.md, "Fault model").
//!
//! The **first** [`CodexSession`] a binder opens resumes the stored thread before any turn;
//! later ones (after a retire or a recreate) start fresh. A resume codex cannot serve fails
//! closed: the lost thread is given up in one fenced write, a new thread starts on the same
//! client and [`RESUME_FALLBACK_NOTICE`](crate::RESUME_FALLBACK_NOTICE) goes on the lifecycle
//! rail once. The store keeps that notice pending until a turn on the new thread commits: a
//! binder that finds no binding but a pending notice (the host that gave the thread up died
//! first) reports the fallback and says the notice again
//! ([`pending_fallback`](crate::binding::pending_fallback)). A temporary failure never gives a
//! thread up. A turn's binding is published only once its rows are durable.
//!
//! Before it resumes or starts a thread, a binder takes the session's lease
//! ([`SessionLease`]) and keeps it until [`SessionBinder::close`] (or, in the background, until
//! it and its sessions are dropped). A session held elsewhere is
//! [`RuntimeError::SessionBusy`]: no thread is resumed or started.

use std::sync::Arc;

use rethread_protocol::messages::{ThreadResume, ThreadStart};
use rethread_store::{BindingStore, Lease, LeaseOwner, LocalOwner};
use tracing::field::Empty;
use tracing::Instrument;

use rethread_protocol::ResumeFailure;
use rethread_store::GivenUp;

use crate::binding::{
    announce_pending_fallback, apply_seed, give_up_thread, pending_fallback, seed_text, LostThread,
    ResumeAttempts, ResumeVerdict,
};
use crate::client::{AppServerClient, ClientError};
use crate::error::RuntimeError;
use crate::lease::SessionLease;
use crate::options::BinderOptions;
use crate::rail::StatusRail;
use crate::session::{CodexSession, OpenOutcome};
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
    opened: bool,
    /// This binder as a lease holder: while it (or a lease it took) lives, no other holder
    /// takes its leases before they expire; once both are dropped, any holder on this machine
    /// may take them at once.
    owner: Arc<LocalOwner>,
    /// The lease this binder holds, shared with its live codex sessions.
    lease: Option<Arc<SessionLease>>,
    /// The thread whose fallback notice this binder has said (it says it once).
    told: Option<String>,
}

impl SessionBinder {
    /// A binder for `session_id` over `store`, reporting on `rail`.
    pub fn new(
        session_id: impl Into<String>,
        store: Arc<dyn BindingStore>,
        rail: StatusRail,
    ) -> Self {
        SessionBinder {
            session_id: session_id.into(),
            store,
            rail,
            options: BinderOptions::default(),
            transcript: Transcript::Store,
            opened: false,
            owner: Arc::new(LocalOwner::new()),
            lease: None,
            told: None,
        }
    }

    /// Replaces the options.
    pub fn with_options(mut self, options: BinderOptions) -> Self {
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

    /// Opens a codex session on `client`. The first successful call resumes the stored thread
    /// (or falls back); later calls start a fresh thread.
    ///
    /// The session's lease is taken first (waiting up to
    /// [`BinderOptions::lease_wait`]) and kept by the binder; a lease held elsewhere is
    /// [`RuntimeError::SessionBusy`] and nothing else happens. A temporary resume failure is a
    /// retryable error with the binding kept ([`RuntimeError::is_retryable`]).
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
        // Only a successful open counts: after a busy or failed first open the next one must
        // still resume, or it would fork the conversation onto a fresh thread.
        let record = if self.opened {
            None
        } else {
            self.store.session(&self.session_id).await?
        };
        let bound = record.as_ref().and_then(|r| r.binding().cloned());
        let pending = record.as_ref().and_then(pending_fallback);
        let outcome = match (bound, pending) {
            (Some(binding), _) => {
                self.resume_or_fall_back(client, &binding.thread_id, lease.as_deref())
                    .await?
            }
            (None, Some(pending)) => self.resume_pending_fallback(client, pending).await?,
            (None, None) => OpenOutcome::Started {
                thread_id: self.start_thread(client, None).await?,
            },
        };
        self.opened = true;
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
        })
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

    async fn resume_or_fall_back(
        &mut self,
        client: &AppServerClient,
        thread_id: &str,
        lease: Option<&SessionLease>,
    ) -> Result<OpenOutcome, RuntimeError> {
        let span = tracing::info_span!(
            telemetry::SPAN_RESUME,
            session_id = %self.session_id,
            thread_id = %thread_id,
            outcome = Empty,
            attempts = Empty,
        );
        let started_at = tokio::time::Instant::now();
        let mut sent = 0u32;
        let judged = async {
            let mut attempts = ResumeAttempts::new(thread_id, &self.options.resume_policy());
            loop {
                sent += 1;
                let verdict = match client.request::<ThreadResume>(&attempts.params()).await {
                    Ok(_) => return Ok(None),
                    Err(ClientError::Rpc { error, .. }) => attempts.on_error(&error),
                    Err(ClientError::Timeout { after, .. }) => attempts.on_timeout(after),
                    Err(other) => return Err(RuntimeError::from(other)),
                };
                match verdict {
                    ResumeVerdict::Retry { delay } => tokio::time::sleep(delay).await,
                    ResumeVerdict::Lost(lost) => return Ok(Some(lost)),
                    ResumeVerdict::Stop(error) => return Err(error),
                }
            }
        }
        .instrument(span.clone())
        .await;
        let outcome = match &judged {
            Ok(None) => "resumed",
            Ok(Some(_)) => "lost",
            Err(_) => "failed",
        };
        span.record("outcome", outcome);
        span.record("attempts", sent);
        metrics::histogram!(telemetry::RESUME_SECONDS, "outcome" => outcome)
            .record(started_at.elapsed().as_secs_f64());
        let lost = match judged? {
            None => {
                return Ok(OpenOutcome::Resumed {
                    thread_id: thread_id.to_string(),
                })
            }
            Some(lost) => lost,
        };
        let span = tracing::info_span!(
            telemetry::SPAN_FALLBACK,
            session_id = %self.session_id,
            previous_thread_id = %lost.thread_id,
            reason = lost.reason.as_str(),
            thread_id = Empty,
            seeded = Empty,
            outcome = Empty,
        );
        let replaced = self
            .fall_back(client, lost, lease)
            .instrument(span.clone())
            .await;
        match &replaced {
            Ok(OpenOutcome::FellBack {
                thread_id, seeded, ..
            }) => {
                span.record("thread_id", thread_id.as_str());
                span.record("seeded", *seeded);
                span.record("outcome", "started");
            }
            _ => {
                span.record("outcome", "failed");
            }
        }
        replaced
    }

    /// Gives a lost thread up and starts its replacement on the same client.
    async fn fall_back(
        &mut self,
        client: &AppServerClient,
        lost: LostThread,
        lease: Option<&SessionLease>,
    ) -> Result<OpenOutcome, RuntimeError> {
        let fence = match lease {
            Some(lease) => Some(lease.ensure_fresh().await?),
            None => None,
        };
        // Said on the rail right after the write. The store keeps the notice pending until a
        // turn on the new thread commits: if this host dies first, the next open says it again
        // (`resume_pending_fallback`); this binder does not.
        give_up_thread(
            self.store.as_ref(),
            &self.rail,
            &self.session_id,
            &lost,
            fence.as_ref(),
        )
        .await?;
        self.told = Some(lost.thread_id.clone());
        let seeded_start = self.start_replacement(client).await?;
        Ok(OpenOutcome::FellBack {
            thread_id: seeded_start.0,
            previous_thread_id: lost.thread_id,
            reason: lost.reason,
            message: lost.message,
            seeded: seeded_start.1,
        })
    }

    /// No binding, but a give-up whose notice may not have been shown (the host that gave the
    /// thread up may have died before): say the notice (once per binder) and start the
    /// replacement, as the fallback would have.
    async fn resume_pending_fallback(
        &mut self,
        client: &AppServerClient,
        pending: GivenUp,
    ) -> Result<OpenOutcome, RuntimeError> {
        if self.told.as_deref() != Some(pending.thread_id.as_str()) {
            announce_pending_fallback(&self.rail, &self.session_id, &pending);
            self.told = Some(pending.thread_id.clone());
        }
        let (thread_id, seeded) = self.start_replacement(client).await?;
        Ok(OpenOutcome::FellBack {
            thread_id,
            message: format!(
                "thread {} was given up by an earlier open; no turn on a new thread was \
                 committed since",
                pending.thread_id
            ),
            previous_thread_id: pending.thread_id,
            // The store keeps only the thread; a give-up is always for a lost thread.
            reason: ResumeFailure::Gone,
            seeded,
        })
    }

    /// Starts the thread that replaces a given-up one, seeded from the transcript when the
    /// options say so; returns it and whether it was seeded.
    async fn start_replacement(
        &self,
        client: &AppServerClient,
    ) -> Result<(String, bool), RuntimeError> {
        let seed = match &self.options.seed {
            Some(options) => {
                seed_text(
                    self.store.as_ref(),
                    &self.transcript,
                    &self.session_id,
                    options,
                    &self.rail,
                )
                .await
            }
            None => None,
        };
        let seeded = seed.is_some();
        let thread_id = self.start_thread(client, seed).await?;
        Ok((thread_id, seeded))
    }

    async fn start_thread(
        &self,
        client: &AppServerClient,
        seed: Option<String>,
    ) -> Result<String, RuntimeError> {
        let mut params = self.options.thread_start.clone();
        if let Some(seed) = seed {
            apply_seed(&mut params, seed);
        }
        let response = client.request::<ThreadStart>(&params).await?;
        Ok(response.thread.id)
    }
}
