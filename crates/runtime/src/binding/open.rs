//! The open loop every driver runs ([`StoreSide::open`]): the machine's store-side actions
//! carried out here, its requests to codex and what it says by the driver's [`Opener`], each
//! answer fed back, until the open has an outcome.

use std::future::Future;
use std::time::Duration;

use rethread_protocol::messages::ThreadResumeParams;
use rethread_protocol::RpcError;

use super::{MachineAccess, StoreSide};
use crate::client::ClientError;
use crate::error::RuntimeError;
use crate::machine::{DriverAction, OpenOutcome, Say, SessionMachine};

/// What became of a request a driver sent for the machine while opening.
#[derive(Debug)]
#[non_exhaustive]
pub enum Answer<T> {
    /// The bound thread is back, with the driver's hold on it.
    Resumed(T),
    /// The new thread started, with the driver's hold on it.
    Started {
        /// The new thread.
        thread_id: String,
        /// The driver's hold on it.
        open: T,
    },
    /// Codex answered the resume with an error.
    Refused(RpcError),
    /// No answer within this time (a temporary failure).
    TimedOut(Duration),
    /// The process meant to answer the resume exited first, having written this on stderr
    /// (`codex exec ... resume <id>`).
    Exited(String),
    /// The request is on its way and its answer reaches the machine later, through
    /// [`SessionMachine::handle_started`] or [`SessionMachine::handle_failed`] (a client's
    /// `thread/start` the proxy forwards).
    Sent,
    /// The request failed otherwise (the connection, the process, a refused start): the open
    /// fails with this error.
    Failed(RuntimeError),
}

impl<T> Answer<T> {
    /// A resume's answer as a JSON-RPC client gives it (the runtime's and the proxy's).
    pub fn of_resume(answer: Result<T, ClientError>) -> Self {
        match answer {
            Ok(open) => Answer::Resumed(open),
            Err(ClientError::Rpc { error, .. }) => Answer::Refused(error),
            Err(ClientError::Timeout { after, .. }) => Answer::TimedOut(after),
            Err(other) => Answer::Failed(other.into()),
        }
    }
}

/// A driver's own part of an open: its requests to codex, and where what the machine says
/// goes.
pub trait Opener: Send {
    /// The driver's hold on the open thread (a codex process, a resume's answer, nothing).
    type Open: Send;

    /// Resumes the bound thread with `params` (plus the driver's own thread settings).
    fn resume(
        &mut self,
        params: ThreadResumeParams,
    ) -> impl Future<Output = Answer<Self::Open>> + Send;

    /// Starts the session's thread, `seed` added to its developer instructions
    /// ([`seeded_instructions`](super::seeded_instructions)).
    fn start(&mut self, seed: Option<String>) -> impl Future<Output = Answer<Self::Open>> + Send;

    /// Says `say`, or holds it to say later; `true` when the user has it now (a fallback notice
    /// then counts as delivered, and is recorded so).
    fn say(&mut self, say: Say) -> bool;
}

/// How [`StoreSide::open`] ended.
#[derive(Debug)]
#[non_exhaustive]
pub enum Opened<T> {
    /// The session's thread is open.
    Open {
        /// How.
        outcome: OpenOutcome,
        /// The driver's hold on it.
        open: T,
    },
    /// A start went out ([`Answer::Sent`]); the open ends with its answer.
    Sent,
}

impl StoreSide<'_> {
    /// Opens the session's thread ([`SessionMachine::open`], unless an open is under way):
    /// carries out the machine's actions until the open has an outcome, the store's here and
    /// the rest by `opener`, then what the machine still asks (a delivered notice's record;
    /// what it says goes to `opener`). Every driver opens through this.
    ///
    /// # Errors
    /// The machine's verdict ([`OpenStop`](crate::machine::OpenStop) as a [`RuntimeError`]),
    /// or the error of the step that failed (a store call, an [`Answer::Failed`]). The
    /// binding is kept unless a give-up was written.
    pub async fn open<O: Opener>(
        &self,
        machine: &mut impl MachineAccess,
        opener: &mut O,
    ) -> Result<Opened<O::Open>, RuntimeError> {
        machine.with(SessionMachine::open);
        let (mut failure, mut open, mut sent) = (None, None, false);
        let ended = loop {
            let Some(action) = self.step(machine, &mut failure).await else {
                // The machine waits for the answer to a start that went out.
                break match sent {
                    true => Ok(Opened::Sent),
                    false => Err(stopped("the session machine stopped without an outcome")),
                };
            };
            let answer = match action {
                DriverAction::Resume(params) => opener.resume(params).await,
                DriverAction::Start { seed } => opener.start(seed).await,
                DriverAction::Say(say) => {
                    if opener.say(say) {
                        machine.with(SessionMachine::handle_notice_delivered);
                    }
                    continue;
                }
                DriverAction::Opened(outcome) => {
                    break match open.take() {
                        Some(open) => Ok(Opened::Open { outcome, open }),
                        None => Err(stopped("opened without the driver's hold on the thread")),
                    };
                }
                DriverAction::OpenFailed(stop) => break Err(failure.take().unwrap_or(stop.into())),
                // A commit or a retire never comes while opening.
                DriverAction::Commit { .. } | DriverAction::Retire { .. } => continue,
            };
            match answer {
                Answer::Resumed(hold) => {
                    open = Some(hold);
                    machine.with(SessionMachine::handle_resumed);
                }
                Answer::Started {
                    thread_id,
                    open: hold,
                } => {
                    open = Some(hold);
                    machine.with(|m| m.handle_started(thread_id));
                }
                Answer::Refused(error) => machine.with(|m| m.handle_resume_error(&error)),
                Answer::TimedOut(after) => machine.with(|m| m.handle_resume_timeout(after)),
                Answer::Exited(stderr) => machine.with(|m| m.handle_resume_exited(&stderr)),
                Answer::Sent => sent = true,
                Answer::Failed(error) => {
                    failure = Some(error);
                    machine.with(SessionMachine::handle_failed);
                }
            }
        };
        // A notice said now and delivered asks for its record: one more round.
        loop {
            let said = self.said(machine).await;
            if said.is_empty() {
                break ended;
            }
            for say in said {
                if opener.say(say) {
                    machine.with(SessionMachine::handle_notice_delivered);
                }
            }
        }
    }
}

fn stopped(what: &str) -> RuntimeError {
    RuntimeError::Internal(what.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::MachineOptions;
    use crate::sink::Transcript;
    use rethread_store::{BindingState, BindingStore, Retirement, TurnCommit};

    /// An opener whose every start answers `start` and whose says are kept (`delivers`: the
    /// user has them at once).
    struct Scripted {
        start: Option<Answer<()>>,
        said: Vec<Say>,
        delivers: bool,
    }

    impl Opener for Scripted {
        type Open = ();

        async fn resume(&mut self, _: ThreadResumeParams) -> Answer<()> {
            Answer::Refused(RpcError::new(-32600, "no rollout found for thread id t1"))
        }

        async fn start(&mut self, _: Option<String>) -> Answer<()> {
            self.start.take().unwrap_or(Answer::Sent)
        }

        fn say(&mut self, say: Say) -> bool {
            self.said.push(say);
            self.delivers
        }
    }

    /// A session bound to `t1`, which codex has lost.
    async fn bound_to_a_lost_thread() -> BindingStore {
        let store = BindingStore::memory();
        store
            .commit_turn(TurnCommit::new(
                "s",
                "t1",
                vec![serde_json::json!({"role": "user"})],
            ))
            .await
            .unwrap();
        store
    }

    async fn open(store: &BindingStore, opener: &mut Scripted) -> Result<Opened<()>, RuntimeError> {
        let mut machine = SessionMachine::new("s", MachineOptions::default());
        let side = StoreSide {
            store,
            session_id: "s",
            lease: None,
            transcript: &Transcript::Store,
            mirror: None,
            codex_home: None,
        };
        side.open(&mut &mut machine, opener).await
    }

    #[tokio::test]
    async fn a_failed_steps_own_error_is_the_opens_error() {
        let store = BindingStore::memory();
        let closed = ClientError::Closed {
            reason: "the server closed its output".into(),
            stderr: String::new(),
        };
        let mut opener = Scripted {
            start: Some(Answer::Failed(closed.into())),
            said: Vec::new(),
            delivers: true,
        };
        let error = open(&store, &mut opener).await.unwrap_err();
        assert!(
            matches!(error, RuntimeError::Client(ClientError::Closed { .. })),
            "{error:?}"
        );
    }

    #[tokio::test]
    async fn a_notice_the_driver_delivers_is_said_once_and_recorded() {
        for delivers in [true, false] {
            let store = bound_to_a_lost_thread().await;
            let mut opener = Scripted {
                start: Some(Answer::Started {
                    thread_id: "t2".into(),
                    open: (),
                }),
                said: Vec::new(),
                delivers,
            };
            let opened = open(&store, &mut opener).await.unwrap();
            assert!(
                matches!(&opened, Opened::Open { outcome: OpenOutcome::FellBack { thread_id, .. }, .. } if thread_id == "t2"),
                "{opened:?}"
            );
            let notices = opener.said.iter();
            let notices = notices.filter(|say| matches!(say, Say::FallbackNotice { .. }));
            assert_eq!(notices.count(), 1, "{:?}", opener.said);
            let record = store.session("s").await.unwrap().unwrap();
            let BindingState::GivenUp(given_up) = record.state else {
                panic!("{:?}", record.state)
            };
            assert_eq!(given_up.notice_delivered, delivers);
        }
    }

    #[tokio::test]
    async fn a_start_whose_answer_comes_later_ends_the_loop_as_sent() {
        let store = bound_to_a_lost_thread().await;
        store
            .retire_thread("s", "t1", Retirement::Ended, None)
            .await
            .unwrap();
        let mut opener = Scripted {
            start: None,
            said: Vec::new(),
            delivers: false,
        };
        let opened = open(&store, &mut opener).await.unwrap();
        assert!(matches!(opened, Opened::Sent), "{opened:?}");
    }
}
