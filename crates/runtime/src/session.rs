//! [`CodexSession`]: one codex thread opened for a host session; runs turns (`turn.rs`).

use rethread_store::{Lease, Retirement};

use crate::binder::drive;
use crate::error::RuntimeError;
use crate::lease::{fresh_fence, note_refusal};
use crate::machine::{Action, DriverAction, OpenOutcome, SessionMachine};
use crate::turn::{start_turn, TurnContext, TurnInput, TurnReport, TurnStream};

/// A codex thread opened for a session by [`SessionBinder::open`](crate::SessionBinder::open):
/// runs turns and publishes the binding once a turn's rows are durable. It shares its binder's
/// session lease (held while either lives; see
/// [`SessionBinder::close`](crate::SessionBinder::close)).
#[derive(Debug)]
pub struct CodexSession {
    pub(crate) context: TurnContext,
    pub(crate) outcome: OpenOutcome,
    /// The rules of this session's thread (which turns are committed).
    pub(crate) machine: SessionMachine,
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
        self.context.lease.as_ref().map(|lease| lease.lease())
    }

    /// Runs one turn, projects it into rows, makes them durable and then publishes the
    /// binding ([`commit_turn`](crate::binding::commit_turn)). A turn that does not complete
    /// writes nothing. This is [`run_turn_streamed`](CodexSession::run_turn_streamed) read to
    /// its end.
    pub async fn run_turn(
        &mut self,
        input: impl Into<TurnInput>,
    ) -> Result<TurnReport, RuntimeError> {
        self.run_turn_streamed(input).await?.finish().await
    }

    /// Starts one turn and returns its events as they come, last
    /// [`TurnEvent::Completed`](crate::TurnEvent::Completed) once the turn was committed as by
    /// [`run_turn`](CodexSession::run_turn). Returns once codex answered `turn/start` (its
    /// error is this call's). Other subscribers of the thread
    /// ([`AppServerClient::subscribe`](crate::AppServerClient::subscribe)) see the same
    /// events.
    ///
    /// When a failed turn gave the session's thread up (the first turn after a resume, on a
    /// home of another account: `docs/design.md`, "Resume or fall back" rule 9), this turn
    /// first opens a replacement seeded from the transcript, as [`SessionBinder::open`]
    /// would, and [`outcome`](CodexSession::outcome) then reports the fallback.
    ///
    /// [`SessionBinder::open`]: crate::SessionBinder::open
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
        if self.machine.thread_id().is_none() && !self.machine.lease_lost() {
            // Its thread was given up after a failed turn (another account's,
            // `docs/design.md`): this turn runs on a seeded replacement, opened as the binder
            // opens.
            let (context, lease) = (&self.context, self.context.lease.as_deref());
            let machine = &mut self.machine;
            self.outcome = drive(&context.parts, machine, &context.client, lease).await?;
        }
        let thread_id = self.outcome.thread_id();
        start_turn(&self.context, &mut self.machine, thread_id, input.into()).await
    }

    /// Retires this thread for the session (`Retirement::Ended`, one fenced write, no notice:
    /// the host chose to end it). The binder's next open starts fresh.
    pub async fn retire(mut self) -> Result<(), RuntimeError> {
        self.machine.handle_retire();
        let (context, lease) = (&self.context, self.context.lease.as_deref());
        while let Some(action) = self.machine.poll() {
            if let Action::Driver(DriverAction::Retire { thread_id }) = action {
                let fence = fresh_fence(lease).await?;
                let (store, session_id) = (&context.parts.store, &context.parts.session_id);
                let ended = store
                    .retire_thread(session_id, &thread_id, Retirement::Ended, fence.as_ref())
                    .await
                    .map_err(RuntimeError::from);
                note_refusal(lease, &ended);
                ended?;
            }
        }
        Ok(())
    }
}
