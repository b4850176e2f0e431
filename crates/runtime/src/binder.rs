//! [`SessionBinder`]: the library's driver of the [`SessionMachine`], with typed requests on
//! an [`AppServerClient`].

use std::sync::Arc;

use rethread_store::{BindingStore, Lease, LeaseOwner, LocalOwner};
use tracing::field::Empty;
use tracing::Instrument;

use crate::client::AppServerClient;
use crate::error::RuntimeError;
use crate::lease::SessionLease;
use crate::machine::{OpenOutcome, SessionMachine};
use crate::options::BinderOptions;
use crate::rail::StatusRail;
use crate::session::{drive, CodexSession};
use crate::sink::{Transcript, TranscriptSink};
use crate::telemetry;
use crate::turn::{Parts, TurnContext};

/// Binds one host session id to its codex thread: opens [`CodexSession`]s for it, under the
/// session's lease, taken at the first open and kept until [`SessionBinder::close`] (or, in
/// the background, until it and its sessions are dropped). See the crate docs' example.
#[derive(Debug)]
pub struct SessionBinder {
    parts: Parts,
    /// This binder as a lease holder: while it (or a lease it took) lives, no other holder
    /// takes its leases before they expire; once both are dropped, any holder on this machine
    /// may take them at once.
    owner: Arc<LocalOwner>,
    /// Shared with its live codex sessions.
    lease: Option<Arc<SessionLease>>,
}

impl SessionBinder {
    /// A binder for `session_id` over `store`, reporting on `rail`.
    pub fn new(session_id: impl Into<String>, store: BindingStore, rail: StatusRail) -> Self {
        let options = BinderOptions::default();
        let parts = Parts {
            session_id: session_id.into(),
            store,
            rail,
            mirror: options.rollout_mirror(),
            options,
            transcript: Transcript::Store,
        };
        let owner = Arc::new(LocalOwner::new());
        SessionBinder {
            parts,
            owner,
            lease: None,
        }
    }

    /// Replaces the options.
    pub fn with_options(mut self, options: BinderOptions) -> Self {
        self.parts.mirror = options.rollout_mirror();
        self.parts.options = options;
        self
    }

    /// Keeps the transcript in the host's sink instead of the store's rows.
    pub fn with_transcript_sink(mut self, sink: Arc<dyn TranscriptSink>) -> Self {
        self.parts.transcript = Transcript::Sink(sink);
        self
    }

    /// The session id.
    pub fn session_id(&self) -> &str {
        &self.parts.session_id
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
    /// new one when codex cannot hand it back, or starts one when the session has none.
    ///
    /// The session's lease is taken first (waiting up to [`BinderOptions::lease_wait`]); one
    /// held elsewhere is [`RuntimeError::SessionBusy`] and nothing else happens. A session id
    /// in the kept threads' key space (`thread:...`, [`crate::kept`]) is refused. A temporary
    /// resume failure is a retryable error with the binding kept. A host whose codex died
    /// opens again on a new client and gets the same thread back.
    pub async fn open(&mut self, client: &AppServerClient) -> Result<CodexSession, RuntimeError> {
        let span = tracing::info_span!(
            telemetry::SPAN_OPEN,
            session_id = %self.parts.session_id,
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
        let mut machine =
            SessionMachine::new(&self.parts.session_id, self.parts.options.machine_options());
        let context = TurnContext {
            client: client.clone(),
            parts: self.parts.clone(),
            lease,
        };
        let lease = context.lease.as_deref();
        let outcome = drive(&self.parts, &mut machine, client, lease).await?;
        Ok(CodexSession {
            context,
            outcome,
            machine,
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
        crate::kept::check_session_id(&self.parts.session_id)?;
        let Some(ttl) = self.parts.options.lease_ttl else {
            return Ok(None);
        };
        if let Some(lease) = self.lease.as_ref().filter(|lease| !lease.is_lost()) {
            return Ok(Some(Arc::clone(lease)));
        }
        let (store, owner) = (self.parts.store.clone(), Arc::clone(&self.owner));
        let wait = self.parts.options.lease_wait;
        let lease = SessionLease::acquire(store, &self.parts.session_id, owner, ttl, wait).await?;
        Ok(Some(Arc::clone(self.lease.insert(Arc::new(lease)))))
    }
}
