//! [`CodexSession`]: one codex thread opened for a host session; runs turns and commits them
//! with the binding. How it was opened is its [`OpenOutcome`]; what a turn produced, its
//! [`TurnReport`].

use std::sync::Arc;
use std::time::Duration;

use rethread_protocol::messages::{
    ServerNotification, TurnInterrupt, TurnInterruptParams, TurnStart, TurnStartParams, TurnStatus,
    UserInput,
};
use rethread_protocol::ResumeFailure;
use rethread_store::{BindingStore, Lease};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::binding::{commit_turn, Publication, TurnRows};
use crate::client::AppServerClient;
use crate::error::RuntimeError;
use crate::lease::SessionLease;
use crate::projection::{project_turn, reply_of};
use crate::rail::{StatusEvent, StatusKind, StatusRail};
use crate::sink::Transcript;

/// How a codex session was opened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum OpenOutcome {
    /// The stored thread was resumed.
    Resumed {
        /// The thread.
        thread_id: String,
    },
    /// A new thread was started (no binding, or a later session of the binder).
    Started {
        /// The thread.
        thread_id: String,
    },
    /// The stored thread could not be resumed; a new one was started on the same client. Also
    /// reported, with the notice said again, when an earlier open gave the thread up and no
    /// turn on a new thread has been committed since
    /// ([`pending_fallback`](crate::binding::pending_fallback)).
    FellBack {
        /// The new thread.
        thread_id: String,
        /// The thread that was lost.
        previous_thread_id: String,
        /// Why it was lost. For a fallback an earlier open gave up, `Gone`: the store keeps
        /// only the thread, and `message` says so.
        reason: ResumeFailure,
        /// Codex's error message (or, for an earlier open's fallback, that it was one).
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

/// A codex thread opened for a session by [`SessionBinder::open`](crate::SessionBinder::open):
/// runs turns and publishes the binding once a turn's rows are durable.
///
/// It shares its binder's session lease (the lease stays held while either lives; see
/// [`SessionBinder::close`](crate::SessionBinder::close)).
#[derive(Debug)]
pub struct CodexSession {
    pub(crate) client: AppServerClient,
    pub(crate) session_id: String,
    pub(crate) store: Arc<dyn BindingStore>,
    pub(crate) rail: StatusRail,
    pub(crate) codex_home: Option<String>,
    pub(crate) turn_timeout: Duration,
    pub(crate) transcript: Transcript,
    pub(crate) outcome: OpenOutcome,
    pub(crate) lease: Option<Arc<SessionLease>>,
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

    /// The session lease this codex session holds (as last granted or renewed), if its binder
    /// takes leases.
    pub fn lease(&self) -> Option<Lease> {
        self.lease.as_ref().map(|lease| lease.lease())
    }

    /// Runs one turn, projects it into rows, makes them durable and then publishes the
    /// binding ([`commit_turn`]). A turn that does not complete writes nothing.
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
        let deadline = tokio::time::Instant::now() + self.turn_timeout;
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
                        message: format!("no turn/completed within {:?}", self.turn_timeout),
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
        let publication = commit_turn(
            self.store.as_ref(),
            &self.transcript,
            self.lease.as_deref(),
            TurnRows {
                session_id: &self.session_id,
                thread_id: &thread_id,
                codex_home: self.codex_home.as_deref(),
                rows: &rows,
            },
        )
        .await?;
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

    /// Retires this thread for the session: its binding is dropped and never published again
    /// (one fenced write; no notice: the host chose to end the thread). The binder's next open
    /// starts fresh. Known gap: the store records any retire that leaves the session unbound
    /// as a give-up with a pending notice, so another binder (another process) opening before
    /// a turn commits reports a fallback and says the notice.
    pub async fn retire(self) -> Result<(), RuntimeError> {
        let fence = match &self.lease {
            Some(lease) => Some(lease.ensure_fresh().await?),
            None => None,
        };
        self.store
            .retire_thread(&self.session_id, self.thread_id(), fence.as_ref())
            .await?;
        Ok(())
    }
}
