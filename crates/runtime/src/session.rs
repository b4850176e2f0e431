//! [`CodexSession`]: one codex thread opened for a host session; runs turns (`turn.rs`). And
//! the library's part of an open ([`drive`]: typed requests, the rail), for the binder's open
//! and for a session whose thread was given up after a failed turn.

use rethread_protocol::messages::{ThreadResume, ThreadResumeParams, ThreadStart};
use rethread_store::{Lease, Retirement};
use tracing::field::Empty;
use tracing::Instrument;

use crate::binding::{seeded_instructions, status_event, Answer, Opened, Opener};
use crate::client::AppServerClient;
use crate::error::RuntimeError;
use crate::lease::{fresh_fence, note_refusal, SessionLease};
use crate::machine::{Action, DriverAction, OpenOutcome, Say, SessionMachine};
use crate::telemetry;
use crate::turn::{start_turn, Parts, TurnContext, TurnInput, TurnReport, TurnStream};

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

/// Opens through the one open loop (`StoreSide::open`), with typed requests on `client` and
/// the rail for what is said: a binder's open, and a codex session's after its thread was given
/// up.
pub(crate) async fn drive(
    parts: &Parts,
    mut machine: &mut SessionMachine,
    client: &AppServerClient,
    lease: Option<&SessionLease>,
) -> Result<OpenOutcome, RuntimeError> {
    let mut opener = BinderOpener {
        parts,
        client,
        resume: ResumeTrace::default(),
        fallback: None,
    };
    let opened = parts.side(lease).open(&mut machine, &mut opener).await;
    let outcome = match opened {
        Ok(Opened::Open { outcome, .. }) => outcome,
        Ok(_) => return Err(RuntimeError::Internal("a start left unanswered".into())),
        Err(error) => {
            opener.resume.finish("failed");
            if let Some(span) = &opener.fallback {
                span.record("outcome", "failed");
            }
            return Err(error);
        }
    };
    if let (
        Some(span),
        OpenOutcome::FellBack {
            thread_id, seeded, ..
        },
    ) = (&opener.fallback, &outcome)
    {
        span.record("thread_id", thread_id.as_str());
        span.record("seeded", *seeded);
        span.record("outcome", "started");
    }
    Ok(outcome)
}

/// The binder's part of an open: typed requests on the client, the rail for what is said.
struct BinderOpener<'a> {
    parts: &'a Parts,
    client: &'a AppServerClient,
    resume: ResumeTrace,
    /// The `rethread.fallback` span, from the notice to the replacement's start.
    fallback: Option<tracing::Span>,
}

impl Opener for BinderOpener<'_> {
    type Open = ();

    async fn resume(&mut self, params: ThreadResumeParams) -> Answer<()> {
        // The host's own thread settings: the thread goes on as configured.
        let mut with_settings = self.parts.options.thread_start.resume(params.thread_id);
        with_settings.exclude_turns = params.exclude_turns;
        let span = self
            .resume
            .begin(&self.parts.session_id, &with_settings.thread_id);
        let resumed = self.client.request::<ThreadResume>(&with_settings);
        let answer = Answer::of_resume(resumed.instrument(span).await.map(drop));
        if let Answer::Resumed(()) = answer {
            self.resume.finish("resumed");
        }
        answer
    }

    async fn start(&mut self, seed: Option<String>) -> Answer<()> {
        // A start after resumes: the thread was lost.
        self.resume.finish("lost");
        let mut params = self.parts.options.thread_start.clone();
        if let Some(seed) = seed {
            let own = params.developer_instructions.as_deref();
            params.developer_instructions = Some(seeded_instructions(own, seed));
        }
        match self.client.request::<ThreadStart>(&params).await {
            Ok(response) => Answer::Started {
                thread_id: response.thread.id,
                open: (),
            },
            Err(error) => Answer::Failed(error.into()),
        }
    }

    fn say(&mut self, say: Say) -> bool {
        let session_id = &self.parts.session_id;
        if let Say::FallbackNotice {
            previous_thread_id,
            reason,
            pending: false,
            ..
        } = &say
        {
            self.fallback = Some(tracing::info_span!(
                telemetry::SPAN_FALLBACK,
                session_id = %session_id,
                previous_thread_id = %previous_thread_id,
                reason = reason.as_str(),
                thread_id = Empty,
                seeded = Empty,
                outcome = Empty,
            ));
        }
        self.parts.rail.emit(status_event(session_id, &say));
        // The rail's sinks take an event synchronously: it is delivered.
        true
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

    /// Records the verdict once the attempts are over (`resumed`, `lost` or `failed`).
    fn finish(&mut self, outcome: &'static str) {
        let Some((span, started_at, sent)) = self.open.take() else {
            return;
        };
        span.record("outcome", outcome);
        span.record("attempts", sent);
        metrics::histogram!(telemetry::RESUME_SECONDS, "outcome" => outcome)
            .record(started_at.elapsed().as_secs_f64());
    }
}
