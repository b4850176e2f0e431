//! [`CodexSession`]: one codex thread opened for a host session; runs turns (the loop is in
//! `turn.rs`) and commits them with the binding. How it was opened is its [`OpenOutcome`].

use std::sync::Arc;
use std::time::Duration;

use rethread_store::{BindingStore, Lease};

use crate::client::AppServerClient;
use crate::error::RuntimeError;
use crate::lease::SessionLease;
use crate::machine::{Action, DriverAction, OpenOutcome, SessionMachine};
use crate::rail::StatusRail;
use crate::sink::Transcript;
use crate::turn::{start_turn, TurnContext, TurnInput, TurnReport, TurnStream};

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
    /// The rules of this session's thread (which turns are committed).
    pub(crate) machine: SessionMachine,
    /// The rollout mirror, when on.
    pub(crate) mirror: Option<crate::mirror::RolloutMirror>,
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
    /// binding ([`commit_turn`](crate::binding::commit_turn)). A turn that does not complete
    /// writes nothing.
    ///
    /// This is [`run_turn_streamed`](CodexSession::run_turn_streamed) read to its end.
    pub async fn run_turn(
        &mut self,
        input: impl Into<TurnInput>,
    ) -> Result<TurnReport, RuntimeError> {
        self.run_turn_streamed(input).await?.finish().await
    }

    /// Starts one turn and returns its events as they come: agent message deltas, items
    /// started and completed, server requests with their answers, token usage, and last
    /// [`TurnEvent::Completed`](crate::TurnEvent::Completed) with the report, once the turn
    /// was committed under the same rules as [`run_turn`](CodexSession::run_turn).
    ///
    /// Returns once codex answered `turn/start` (its error is this call's error). Other
    /// subscribers of the thread ([`AppServerClient::subscribe`]) see the same events; the
    /// turn reads its own.
    ///
    /// ```no_run
    /// # async fn demo(session: &mut rethread_runtime::CodexSession) -> Result<(), rethread_runtime::RuntimeError> {
    /// use rethread_runtime::{TurnEvent, TurnInput};
    /// let input = TurnInput::text("Describe this diagram.").with_local_image("/srv/diagram.png");
    /// let mut turn = session.run_turn_streamed(input).await?;
    /// while let Some(event) = turn.next().await {
    ///     match event? {
    ///         TurnEvent::AgentMessageDelta { delta, .. } => print!("{delta}"),
    ///         TurnEvent::Completed(report) => println!("\n({:?} tokens)", report.token_usage.map(|u| u.last.total_tokens)),
    ///         _ => {}
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn run_turn_streamed(
        &mut self,
        input: impl Into<TurnInput>,
    ) -> Result<TurnStream<'_>, RuntimeError> {
        let context = TurnContext {
            client: &self.client,
            session_id: &self.session_id,
            thread_id: self.outcome.thread_id(),
            store: self.store.as_ref(),
            rail: &self.rail,
            codex_home: self.codex_home.as_deref(),
            turn_timeout: self.turn_timeout,
            transcript: &self.transcript,
            lease: self.lease.as_deref(),
            machine: &mut self.machine,
            mirror: self.mirror.as_ref(),
        };
        start_turn(context, input.into()).await
    }

    /// Retires this thread for the session: its binding is dropped and never published again
    /// (one fenced write, `BindingStore::retire_thread` with `Retirement::Ended`; no notice:
    /// the host chose to end the thread, and none is left pending for another process). The
    /// binder's next open starts fresh.
    pub async fn retire(mut self) -> Result<(), RuntimeError> {
        self.machine.handle_retire();
        while let Some(action) = self.machine.poll() {
            if let Action::Driver(DriverAction::Retire { thread_id }) = action {
                let fence = crate::lease::fresh_fence(self.lease.as_deref()).await?;
                let ended = crate::binding::end_thread(
                    self.store.as_ref(),
                    &self.session_id,
                    &thread_id,
                    fence.as_ref(),
                )
                .await;
                crate::lease::note_refusal(self.lease.as_deref(), &ended);
                ended?;
            }
        }
        Ok(())
    }
}
