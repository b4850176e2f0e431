//! The machine's rollout-mirror steps: the answer to [`Action::Restore`] and what a commit
//! did with the mirror. Neither can hide codex's own answer: a failed restore is said and the
//! resume goes ahead (codex then resumes the thread as it has it, or says it is lost, and the
//! usual rules decide); a turn committed without its mirror is said once.

#[cfg(doc)]
use super::Action;
use super::{DriverAction, Phase, Say, SessionMachine};
use crate::mirror::{MirrorReport, RestoreFailure, Restored};

impl SessionMachine {
    /// The answer to [`Action::Restore`]: the files written (or why not). Either way the
    /// resume follows; a failure is said first. After a failure that may pass, codex not
    /// having the thread is no loss: the open stops with the binding kept (a retryable
    /// error), since the next open's restore may well give it back. A session whose mirroring
    /// stopped at its cap mirrors no more on this connection (that was said when it stopped).
    pub fn handle_restored(&mut self, restored: Result<Restored, RestoreFailure>) {
        if !matches!(self.phase, Phase::Restoring(_)) {
            return;
        }
        let Phase::Restoring(mut attempts) = std::mem::replace(&mut self.phase, Phase::Idle) else {
            return;
        };
        match restored {
            Ok(restored) => {
                if restored.stopped {
                    self.mirroring = false;
                }
            }
            Err(failure) => {
                attempts.restore_may_pass = failure.transient;
                self.push(DriverAction::Say(Say::RestoreFailed {
                    thread_id: attempts.thread_id.clone(),
                    message: failure.message,
                }));
            }
        }
        self.push(DriverAction::Resume(attempts.params()));
        self.phase = Phase::Resuming(attempts);
    }

    /// What a commit that took the mirror did with it ([`DriverAction::Commit`]'s `mirror`): past
    /// the session's cap mirroring stops, said once (by the commit that stopped it); a turn
    /// committed without its rollout is said once per connection.
    pub fn handle_mirrored(&mut self, thread_id: &str, report: &MirrorReport) {
        match report {
            MirrorReport::StoppedNow { bytes, cap } => {
                self.mirroring = false;
                self.push(DriverAction::Say(Say::MirrorStopped {
                    bytes: *bytes,
                    cap: *cap,
                }));
            }
            MirrorReport::Stopped => self.mirroring = false,
            MirrorReport::Failed(message)
                if !std::mem::replace(&mut self.mirror_failure_said, true) =>
            {
                self.push(DriverAction::Say(Say::MirrorFailed {
                    thread_id: thread_id.to_string(),
                    message: message.clone(),
                }));
            }
            _ => {}
        }
    }

    /// Whether commits take the mirror.
    pub fn is_mirroring(&self) -> bool {
        self.mirroring
    }
}

impl Say {
    /// The text of the mirror's sayings.
    pub(super) fn mirror_message(&self) -> String {
        match self {
            Say::RestoreFailed { thread_id, message } => format!(
                "rethread could not restore thread {thread_id}'s rollout from the store \
                 ({message}); resuming it as codex has it."
            ),
            Say::MirrorStopped { bytes, cap } => format!(
                "rethread stopped mirroring this session's codex rollout: it would hold {bytes} \
                 bytes, past the cap of {cap}. Its thread resumes only where codex keeps its \
                 rollout."
            ),
            Say::MirrorFailed { thread_id, message } => format!(
                "rethread could not mirror thread {thread_id}'s rollout ({message}): it resumes \
                 only where codex keeps it."
            ),
            other => other.message(),
        }
    }
}
