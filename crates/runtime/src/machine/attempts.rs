//! The attempts to resume one bound thread and what a failed resume means.

use std::time::Duration;

use rethread_protocol::messages::ThreadResumeParams;
use rethread_protocol::{ResumeFailure, RpcError};

use super::{LostThread, MachineOptions, OpenStop};

/// The attempts to resume one bound thread.
#[derive(Debug, Clone)]
pub(super) struct Attempts {
    pub(super) thread_id: String,
    pub(super) exclude_turns: bool,
    pub(super) transient_left: u32,
    pub(super) backoff: Duration,
    pub(super) sent: u32,
    /// The restore before the first resume failed for a reason that may pass.
    pub(super) restore_may_pass: bool,
    /// The restore before the first resume found something in its way in the home (a link):
    /// what, for people.
    pub(super) restore_in_the_way: Option<String>,
}

/// What a failed `thread/resume` means.
pub(super) enum Verdict {
    Retry(Duration),
    Lost(LostThread),
    Stop(OpenStop),
}

impl Attempts {
    pub(super) fn new(thread_id: String, options: &MachineOptions) -> Self {
        Attempts {
            thread_id,
            exclude_turns: options.exclude_turns,
            transient_left: options.transient_retries,
            backoff: options.retry_backoff,
            sent: 0,
            restore_may_pass: false,
            restore_in_the_way: None,
        }
    }

    pub(super) fn params(&self) -> ThreadResumeParams {
        let mut params = ThreadResumeParams::new(self.thread_id.clone());
        params.exclude_turns = self.exclude_turns.then_some(true);
        params
    }

    /// A capability refusal of `excludeTurns` is retried at once without it; `gone`,
    /// `incompatible` and `unreadable` are a loss; a temporary failure is retried after a
    /// growing pause within the budget, then stops with the binding kept; anything else stops.
    pub(super) fn judge(&mut self, failure: ResumeFailure, error: &RpcError) -> Verdict {
        self.sent += 1;
        if failure == ResumeFailure::CapabilityRequired && self.exclude_turns {
            self.exclude_turns = false;
            return Verdict::Retry(Duration::ZERO);
        }
        if failure == ResumeFailure::Gone && self.restore_may_pass {
            // Codex lacks the rollout the store could not give back this time: kept.
            return Verdict::Stop(OpenStop::Unavailable {
                thread_id: self.thread_id.clone(),
                failure,
                // The error itself says the binding is kept.
                message: format!(
                    "{} (its rollout could not be restored from the store this time)",
                    error.message
                ),
                attempts: self.sent,
            });
        }
        if let Some(in_the_way) = self
            .restore_in_the_way
            .as_ref()
            .filter(|_| failure == ResumeFailure::Gone)
        {
            // Codex lacks the rollout because the home would not take it: not lost (the store
            // holds it), and no retry passes until someone removes what is in the way.
            let mut error = error.clone();
            error.message = format!(
                "{} (its rollout could not be restored into this home: {in_the_way}; the binding \
                 is kept)",
                error.message
            );
            return Verdict::Stop(OpenStop::Refused {
                thread_id: self.thread_id.clone(),
                failure,
                error,
            });
        }
        if failure.thread_is_lost() {
            return Verdict::Lost(LostThread {
                thread_id: self.thread_id.clone(),
                reason: failure,
                message: error.message.clone(),
            });
        }
        if !failure.is_transient() {
            return Verdict::Stop(OpenStop::Refused {
                thread_id: self.thread_id.clone(),
                failure,
                error: error.clone(),
            });
        }
        if self.transient_left > 0 {
            self.transient_left -= 1;
            let delay = self.backoff;
            self.backoff = self.backoff.saturating_mul(2);
            return Verdict::Retry(delay);
        }
        Verdict::Stop(match failure {
            ResumeFailure::Busy => OpenStop::Busy {
                thread_id: self.thread_id.clone(),
                message: error.message.clone(),
            },
            _ => OpenStop::Unavailable {
                thread_id: self.thread_id.clone(),
                failure,
                message: error.message.clone(),
                attempts: self.sent,
            },
        })
    }
}
