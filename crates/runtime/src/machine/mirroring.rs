//! The machine's rollout-mirror steps. Neither hides codex's own answer: a failed restore is
//! said and the resume goes ahead; a turn committed without its mirror is said once.

#[cfg(doc)]
use super::Action;
use super::{take_phase, DriverAction, Phase, Say, SessionMachine};
use crate::mirror::{MirrorReport, RestoreFailure, Restored};

impl SessionMachine {
    /// The answer to [`Action::Restore`]; either way the resume follows. After a failure that
    /// may pass, codex not having the thread is no loss: the open stops with the binding kept
    /// (the next open's restore may give it back). A mirror stopped at its cap is not taken by
    /// commits on this connection.
    pub fn handle_restored(&mut self, restored: Result<Restored, RestoreFailure>) {
        let mut attempts = take_phase!(self, Phase::Restoring(a) => a);
        match restored {
            Ok(restored) => self.mirroring &= !restored.stopped,
            Err(failure) => {
                attempts.restore_may_pass = failure.transient;
                attempts.restore_in_the_way = failure.in_the_way.then(|| failure.message.clone());
                self.push(DriverAction::Say(Say::RestoreFailed {
                    thread_id: attempts.thread_id.clone(),
                    message: failure.message,
                }));
            }
        }
        self.resume(attempts);
    }

    /// What a commit that took the mirror did with it: past the cap mirroring stops (said by
    /// the commit that stopped it); a turn committed without its rollout is said once per
    /// connection.
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
