//! The store side of the [`SessionMachine`]'s actions, shared by every driver: none of it
//! sends a request to codex, none decides a rule.

use rethread_protocol::{ResumeFailure, ThreadId};
use rethread_store::{
    BindingState, BindingStore, CommitOutcome, Fence, Retirement, SessionRecord, StoreError,
    TurnCommit,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::RuntimeError;
use crate::lease::{fresh_fence, note_refusal, SessionLease};
use crate::machine::{Action, DriverAction, LostThread, Say, SessionMachine, Stored};
use crate::mirror::{MirrorReport, PreparedMirror, RestoreFailure, Restored, RolloutMirror};
use crate::rail::{StatusEvent, StatusKind};
use crate::sink::{SinkDurability, Transcript};
use crate::telemetry;

mod open;
pub use open::{Answer, Opened, Opener};

/// A driver's machine, reached one short step at a time: a driver whose machine sits behind a
/// lock (the proxy's) takes the lock only inside [`with`](MachineAccess::with), never across
/// an await.
pub trait MachineAccess: Send {
    /// Runs `f` on the machine.
    fn with<R>(&mut self, f: impl FnOnce(&mut SessionMachine) -> R) -> R;
}

impl MachineAccess for &mut SessionMachine {
    fn with<R>(&mut self, f: impl FnOnce(&mut SessionMachine) -> R) -> R {
        f(self)
    }
}

/// The store side of a driver's session: what the store-side actions need.
#[derive(Debug, Clone, Copy)]
pub struct StoreSide<'a> {
    /// The store.
    pub store: &'a BindingStore,
    /// The session.
    pub session_id: &'a str,
    /// The session's lease, whose fence every write carries (`None`: unfenced writes).
    pub lease: Option<&'a SessionLease>,
    /// Where the transcript (the seed's source) lives.
    pub transcript: &'a Transcript,
    /// The rollout mirror, when on: a thread this home lacks is restored from the store.
    pub mirror: Option<&'a RolloutMirror>,
    /// The `CODEX_HOME` recorded with a published binding.
    pub codex_home: Option<&'a str>,
}

impl StoreSide<'_> {
    /// Carries out what the machine still asks of the store once its open is over (a delivered
    /// notice's record) and returns what it says meanwhile, for the driver to say.
    pub async fn said(&self, machine: &mut impl MachineAccess) -> Vec<Say> {
        let mut said = Vec::new();
        while let Some(action) = self.step(machine, &mut None).await {
            if let DriverAction::Say(say) = action {
                said.push(say);
            }
        }
        said
    }

    /// Carries out the machine's store-side actions, feeding each answer back, and returns
    /// the first action that is the driver's own; `None` when the machine has nothing more
    /// to do. A store call that fails is kept in `failure` (the machine only hears that it
    /// failed).
    async fn step(
        &self,
        machine: &mut impl MachineAccess,
        failure: &mut Option<RuntimeError>,
    ) -> Option<DriverAction> {
        // The record `ReadSession` read, for the `Restore` that follows it: one read per open.
        let mut record = None;
        loop {
            match machine.with(SessionMachine::poll)? {
                Action::ReadSession => match self.store.session(self.session_id).await {
                    Ok(read) => {
                        let stored = stored_of(read.as_ref());
                        record = read;
                        machine.with(|m| m.handle_session(stored));
                    }
                    Err(error) => {
                        *failure = Some(error.into());
                        machine.with(SessionMachine::handle_failed);
                    }
                },
                Action::Restore { thread_id } => {
                    let restored = self.restore(record.take(), &thread_id).await;
                    machine.with(|m| m.handle_restored(restored));
                }
                Action::Wait(delay) => {
                    tokio::time::sleep(delay).await;
                    machine.with(SessionMachine::handle_wait_over);
                }
                Action::GiveUp(lost) => {
                    let given_up = async {
                        let fence = fresh_fence(self.lease).await?;
                        give_up(self.store, self.session_id, &lost, fence.as_ref()).await
                    }
                    .await;
                    note_refusal(self.lease, &given_up);
                    match given_up {
                        Ok(()) => machine.with(SessionMachine::handle_given_up),
                        Err(error) => {
                            *failure = Some(error);
                            machine.with(SessionMachine::handle_failed);
                        }
                    }
                }
                Action::MarkNoticeDelivered { thread_id } => {
                    // The one unfenced write: a lease that cannot be made fresh still records
                    // the notice (docs/architecture.md, "Invariants"). A failure only means
                    // another process may say the notice once more.
                    let fence = fresh_fence(self.lease).await.ok().flatten();
                    let (store, session_id) = (self.store, self.session_id);
                    if let Err(error) = store
                        .mark_notice_delivered(session_id, &thread_id, fence.as_ref())
                        .await
                    {
                        tracing::warn!(%session_id, %thread_id, %error, "could not record the fallback notice as delivered; another process may say it once more");
                    }
                }
                Action::ReadTranscript { max_rows } => {
                    let rows = self.transcript_tail(max_rows).await;
                    machine.with(|m| m.handle_transcript(rows));
                }
                Action::Driver(action) => return Some(action),
            }
        }
    }

    /// Carries out [`DriverAction::Commit`] ([`commit_turn`]) and tells the machine how the
    /// commit and the mirror went. Every driver commits through this.
    pub async fn commit(
        &self,
        machine: &mut impl MachineAccess,
        thread_id: &str,
        rows: &[Value],
        mirror: bool,
    ) -> Result<Committed, RuntimeError> {
        let mut turn = TurnRows::new(self.session_id, thread_id, rows);
        turn.codex_home = self.codex_home;
        turn.mirror = self.mirror.filter(|_| mirror);
        let committed = commit_turn(self.store, self.transcript, self.lease, turn).await;
        machine.with(|m| {
            m.handle_committed(
                thread_id,
                committed.as_ref().map(|_| ()).map_err(Into::into),
            );
            if let Ok(done) = &committed {
                m.handle_mirrored(thread_id, &done.mirror);
            }
        });
        committed
    }

    /// Records a completed turn of `thread_id` as the machine decides: tells it, carries out
    /// the [`DriverAction::Commit`] it asks for ([`StoreSide::commit`]; `None`: nothing was
    /// committed) and returns that with what the machine said meanwhile, in order, for the
    /// driver to say. Every driver records its turns through this.
    pub async fn complete_turn(
        &self,
        machine: &mut impl MachineAccess,
        thread_id: &str,
        rows: Vec<Value>,
    ) -> (Option<Result<Committed, RuntimeError>>, Vec<Say>) {
        machine.with(|m| m.handle_turn_completed(thread_id, rows));
        let (mut committed, mut said) = (None, Vec::new());
        while let Some(action) = machine.with(SessionMachine::poll) {
            match action {
                Action::Driver(DriverAction::Commit {
                    thread_id,
                    rows,
                    mirror,
                }) => committed = Some(self.commit(machine, &thread_id, &rows, mirror).await),
                Action::Driver(DriverAction::Say(say)) => said.push(say),
                _ => {}
            }
        }
        (committed, said)
    }

    /// A turn on `thread_id` failed, codex's error saying `message`: tells the machine
    /// ([`SessionMachine::handle_turn_failed`]: another account's thread, on its first turn
    /// after the resume, is given up), carries out the give-up it asks for, and hands what it
    /// says to `say`, which returns `true` when the user has it now (a fallback notice is then
    /// recorded delivered). Returns the give-up's error when its store write failed (the
    /// binding kept). Every driver tells its failed turns through this.
    pub async fn turn_failed(
        &self,
        machine: &mut impl MachineAccess,
        thread_id: &str,
        message: &str,
        mut say: impl FnMut(Say) -> bool + Send,
    ) -> Option<RuntimeError> {
        machine.with(|m| m.handle_turn_failed(thread_id, message));
        let mut failure = None;
        while let Some(action) = self.step(machine, &mut failure).await {
            if let DriverAction::Say(said) = action {
                if say(said) {
                    machine.with(SessionMachine::handle_notice_delivered);
                }
            }
        }
        failure
    }

    /// Before a `resume` or `fork` of a thread the client names, and [`client_thread`] let it
    /// use (`docs/design.md`, "A thread the client names"): the restore the session's own open
    /// makes, from the session's mirror (the thread's rollout into this home when the home
    /// lacks it or holds a strict prefix of it; nothing when the mirror holds none of it). The
    /// request goes to codex whatever happens, and the client gets codex's answer: a failed
    /// restore is logged, and the binding is left as it is.
    pub async fn restore_named(&self, thread_id: &str) {
        if let Err(failure) = self.restore(None, thread_id).await {
            let (session_id, error) = (self.session_id, failure.message);
            tracing::warn!(%session_id, %thread_id, %error, "could not restore the thread the client named; codex answers without it");
        }
    }

    /// The newest `max_rows` rows of the transcript, oldest first, or why not.
    async fn transcript_tail(&self, max_rows: u64) -> Result<Vec<Value>, String> {
        let (store, session_id) = (self.store, self.session_id);
        if let Transcript::Sink(sink) = self.transcript {
            let rows = sink.recent_rows(session_id, max_rows).await;
            return rows.map_err(|error| error.to_string());
        }
        let Some(record) = store.session(session_id).await.map_err(|e| e.to_string())? else {
            return Ok(Vec::new());
        };
        let start = record.row_count.saturating_sub(max_rows);
        let rows = store.rows(session_id, start..record.row_count).await;
        let rows = rows.map_err(|e| e.to_string())?;
        Ok(rows.into_iter().map(|row| row.body).collect())
    }

    /// The answer to [`Action::Restore`], from `record` (the open's read) when it is this
    /// session's, else from a fresh read. Without a mirror nothing is restored.
    async fn restore(
        &self,
        record: Option<SessionRecord>,
        thread_id: &str,
    ) -> Result<Restored, RestoreFailure> {
        let (store, session_id) = (self.store, self.session_id);
        let Some(mirror) = self.mirror else {
            return Ok(Restored::default());
        };
        let restored = match record.filter(|r| r.session_id == session_id) {
            Some(record) => mirror.restore_from(store, &record, thread_id).await,
            None => mirror.restore(store, session_id, thread_id).await,
        };
        let restored = restored.map_err(|error| RestoreFailure::from(&error))?;
        if !restored.written.is_empty() {
            tracing::info!(%session_id, %thread_id, files = ?restored.written, diverged = restored.diverged, "restored the thread's rollout from the store");
        }
        if let Some(error) = &restored.index_error {
            tracing::warn!(%session_id, %thread_id, %error, "could not clear codex's history index after replacing a diverged rollout; thread/read may show the replaced turns");
        }
        Ok(restored)
    }
}

/// What the store holds for `session_id`, as the machine reads it.
pub async fn read_stored(store: &BindingStore, session_id: &str) -> Result<Stored, RuntimeError> {
    Ok(stored_of(store.session(session_id).await?.as_ref()))
}

/// The thread a session's client names, decided once for every driver (`docs/design.md`, "A
/// thread the client names"): `thread/resume`, `thread/fork` or any request naming a
/// `threadId` (`rethread app-server`), `exec resume <id>` and `exec fork <id>`; `named` `None`
/// is `exec resume --last`, the session's own bound thread. Returns the thread's canonical id
/// when it is the session's own or no session's. `by_name`: the driver's codex reads text that
/// is not a UUID as a thread name (`codex exec`), a thread rethread cannot check.
///
/// # Errors
/// [`RuntimeError::ThreadTaken`] for another session's thread, in any spelling;
/// [`RuntimeError::ThreadUnnamed`] for `--last` while the session has no bound thread, or a
/// name with `by_name`; a store failure.
pub async fn client_thread(
    store: &BindingStore,
    session_id: &str,
    named: Option<&str>,
    by_name: bool,
) -> Result<ThreadId, RuntimeError> {
    let unnamed = |reason: &str| RuntimeError::ThreadUnnamed {
        session_id: session_id.to_string(),
        reason: reason.to_string(),
    };
    let thread = match named {
        Some(named) => ThreadId::new(named),
        None => match read_stored(store, session_id).await? {
            Stored::Bound { thread_id } => return Ok(ThreadId::new(&thread_id)),
            _ => return Err(unnamed("`resume --last` picks the newest thread of CODEX_HOME, which may be another session's, and this session has no thread yet (run without `resume` to start one)")),
        },
    };
    if by_name && !thread.is_uuid() {
        return Err(unnamed(&format!("`{thread}` is not a thread id, and codex would look it up as a thread name, which may be another session's thread (name it by id)")));
    }
    match store.thread_session(thread.as_str()).await? {
        Some(owner) if owner != session_id => Err(RuntimeError::ThreadTaken {
            thread_id: thread.into(),
            session_id: owner,
        }),
        _ => Ok(thread),
    }
}

/// The thread codex knows by `name` in `codex_home`: the newest entry of that name in codex's
/// own name index (`session_index.jsonl`, one `{"id", "thread_name", ...}` per line, appended
/// by `thread/name/set`), which `codex exec resume <name>` reads. `None` when no thread has
/// that name or the index cannot be read. Blocking: a small file, read before a run starts.
pub fn thread_named(codex_home: &std::path::Path, name: &str) -> Option<ThreadId> {
    #[derive(serde::Deserialize)]
    struct Entry {
        id: String,
        thread_name: String,
    }
    let index = std::fs::read(codex_home.join("session_index.jsonl")).ok()?;
    (index.split(|byte| *byte == b'\n'))
        .rev()
        .filter_map(|line| serde_json::from_slice::<Entry>(line).ok())
        .find(|entry| entry.thread_name == name)
        .map(|entry| ThreadId::new(&entry.id))
        .filter(ThreadId::is_uuid)
}

fn stored_of(record: Option<&SessionRecord>) -> Stored {
    match record.map(|record| &record.state) {
        Some(BindingState::Bound(binding)) => Stored::Bound {
            thread_id: binding.thread_id.clone(),
        },
        Some(BindingState::GivenUp(given_up)) => Stored::GivenUp {
            thread_id: given_up.thread_id.clone(),
            // A reason this build does not know is still a loss; never read as another kind.
            reason: serde_json::from_value(Value::String(given_up.reason.clone()))
                .unwrap_or(ResumeFailure::Gone),
            message: given_up.message.clone(),
            notice_delivered: given_up.notice_delivered,
        },
        _ => Stored::Unbound,
    }
}

/// Gives a lost thread up in **one** fenced store write: retires it, drops the binding if it
/// still names it (a binding written meanwhile for another thread survives), and records the
/// notice as pending. A stale `fence` is [`RuntimeError::LeaseLost`], nothing written.
pub async fn give_up(
    store: &BindingStore,
    session_id: &str,
    lost: &LostThread,
    fence: Option<&Fence>,
) -> Result<(), RuntimeError> {
    let retirement = Retirement::Lost {
        reason: lost.reason.as_str().to_string(),
        message: lost.message.clone(),
    };
    store
        .retire_thread(session_id, &lost.thread_id, retirement, fence)
        .await?;
    metrics::counter!(telemetry::FALLBACKS_TOTAL, "reason" => lost.reason.as_str()).increment(1);
    Ok(())
}

/// The developer instructions of a seeded start: `seed` after the host's own (`own`). Every
/// driver seeds through this (a `thread/start`'s `developerInstructions`, `codex exec`'s
/// `-c developer_instructions=...`).
pub fn seeded_instructions(own: Option<&str>, seed: String) -> String {
    match own {
        Some(own) => format!("{own}\n\n{seed}"),
        None => seed,
    }
}

/// What the machine says, as a status-rail event: the fallback notice is `lifecycle` (fields
/// `session_id`, `previous_thread_id`, `reason`, `error`, and `pending` for an earlier
/// process's), everything else `warn`.
pub fn status_event(session_id: &str, say: &Say) -> StatusEvent {
    let Say::FallbackNotice {
        previous_thread_id,
        reason,
        message,
        pending,
    } = say
    else {
        return StatusEvent::new(StatusKind::Warn, say.message()).with("session_id", session_id);
    };
    let mut event = StatusEvent::new(StatusKind::Lifecycle, say.message())
        .with("session_id", session_id)
        .with("previous_thread_id", previous_thread_id.as_str())
        .with("reason", reason.as_str());
    if !message.is_empty() {
        event = event.with("error", message.as_str());
    }
    if *pending {
        event = event.with("pending", true);
    }
    event
}

/// How a turn's binding publication went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Publication {
    /// Rows durable and the binding names this thread.
    Published,
    /// Rows durable; the thread was retired meanwhile, so it was not published.
    RetiredNotPublished,
    /// The host sink did not report durability; not published.
    NotDurable,
}

/// A completed turn's projected rows, ready to commit ([`commit_turn`]).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct TurnRows<'a> {
    /// The host session.
    pub session_id: &'a str,
    /// The thread the turn ran on: the binding to publish.
    pub thread_id: &'a str,
    /// The `CODEX_HOME` to record with the binding.
    pub codex_home: Option<&'a str>,
    /// The rows.
    pub rows: &'a [Value],
    /// The rollout mirror, when the commit takes it.
    pub mirror: Option<&'a RolloutMirror>,
}

impl<'a> TurnRows<'a> {
    /// The rows of a turn of `session_id` on `thread_id`, without a mirror or `CODEX_HOME`.
    pub fn new(session_id: &'a str, thread_id: &'a str, rows: &'a [Value]) -> Self {
        TurnRows {
            session_id,
            thread_id,
            codex_home: None,
            rows,
            mirror: None,
        }
    }

    /// Commits what the thread's rollout grew by, through `mirror`.
    pub fn mirror(mut self, mirror: Option<&'a RolloutMirror>) -> Self {
        self.mirror = mirror;
        self
    }
}

/// What [`commit_turn`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Committed {
    /// What happened to the binding.
    pub publication: Publication,
    /// What happened to the mirror.
    pub mirror: MirrorReport,
}

/// Makes a completed turn's rows durable and then publishes its thread as the session's
/// binding, under the lease's fence.
///
/// # Contract
/// - With a `lease`: [`SessionLease::ensure_fresh`] first, and the write carries its fence;
///   a lost lease is [`RuntimeError::LeaseLost`] and nothing is written.
/// - [`Transcript::Store`]: rows and binding in one transaction.
/// - [`Transcript::Sink`]: the sink persists the rows first; only on
///   [`SinkDurability::Durable`] is the binding published, [`Publication::NotDurable`]
///   otherwise. A sink error is [`RuntimeError::Sink`].
/// - A thread retired meanwhile commits its rows unpublished
///   ([`Publication::RetiredNotPublished`]).
/// - With a mirror the commit carries what the rollout grew by, in the same transaction. A
///   [`StoreError::MirrorMismatch`], or damaged stored chunks ([`StoreError::Corrupt`]), is
///   retried once with the files whole. A rollout that cannot be read does not stop the
///   turn: it commits without its mirror ([`MirrorReport::Failed`]).
pub async fn commit_turn(
    store: &BindingStore,
    transcript: &Transcript,
    lease: Option<&SessionLease>,
    turn: TurnRows<'_>,
) -> Result<Committed, RuntimeError> {
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
    note_refusal(lease, &committed);
    let outcome = match committed.as_ref().map(|c| c.publication) {
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
    store: &BindingStore,
    transcript: &Transcript,
    lease: Option<&SessionLease>,
    turn: TurnRows<'_>,
) -> Result<Committed, RuntimeError> {
    let fence = fresh_fence(lease).await?;
    let rows = match transcript {
        Transcript::Store => turn.rows.to_vec(),
        Transcript::Sink(sink) => match sink
            .persist_turn(turn.session_id, turn.rows)
            .await
            .map_err(RuntimeError::Sink)?
        {
            SinkDurability::Durable => Vec::new(),
            SinkDurability::NotDurable => {
                return Ok(Committed {
                    publication: Publication::NotDurable,
                    mirror: MirrorReport::Off,
                })
            }
        },
    };
    let commit = |mirror| {
        TurnCommit::new(turn.session_id, turn.thread_id, rows.clone())
            .codex_home(turn.codex_home.map(str::to_string))
            .fence(fence.clone())
            .mirror(mirror)
    };
    let Some(mirror) = turn.mirror else {
        let outcome = store.commit_turn(commit(None)).await?;
        return Ok(committed(&outcome, MirrorReport::Off));
    };
    let update = |prepared: &mut Result<PreparedMirror, _>| {
        prepared
            .as_mut()
            .ok()
            .map(|p| std::mem::take(&mut p.update))
    };
    let mut prepared = mirror.prepare(turn.thread_id).await;
    let mut outcome = store.commit_turn(commit(update(&mut prepared))).await;
    if prepared.is_ok()
        && matches!(
            outcome,
            Err(StoreError::MirrorMismatch { .. } | StoreError::Corrupt { .. })
        )
    {
        // The store's file is not what this process knew (another process mirrored it since,
        // or a restore was skipped), or its chunks are damaged (the commit was rolled back):
        // send the files whole, once, which replaces them. Damage elsewhere fails again.
        mirror.forget(turn.thread_id);
        prepared = mirror.prepare(turn.thread_id).await;
        outcome = store.commit_turn(commit(update(&mut prepared))).await;
    }
    let outcome = outcome?;
    let report = match prepared {
        Err(error) => MirrorReport::Failed(error.to_string()),
        Ok(prepared) => {
            let report = MirrorReport::of(outcome.mirror());
            if report == MirrorReport::Written {
                mirror.committed(prepared);
            }
            report
        }
    };
    Ok(committed(&outcome, report))
}

fn committed(outcome: &CommitOutcome, mirror: MirrorReport) -> Committed {
    Committed {
        publication: match outcome {
            CommitOutcome::Published { .. } => Publication::Published,
            CommitOutcome::RetiredNotPublished { .. } => Publication::RetiredNotPublished,
        },
        mirror,
    }
}
