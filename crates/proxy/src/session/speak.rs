//! What the session says to the client (as `warning` notifications, and on stderr), and when a
//! fallback notice counts as delivered: once its line is flushed to the client.

use rethread_runtime::binding;
use rethread_runtime::machine::{Action, DriverAction, Say};

use super::turns::Forgot;
use super::{BindingHooks, Locked};
use crate::hooks::ServerContext;
use crate::line::Line;
use crate::ProxyError;

impl BindingHooks {
    /// Says what the request tracker had to forget.
    pub(super) async fn say_forgot(
        &self,
        ctx: &ServerContext,
        forgot: Option<Forgot>,
    ) -> Result<(), ProxyError> {
        let Some(forgot) = forgot else { return Ok(()) };
        let message = forgot.message();
        ctx.report(&format!("session {}: {message}", self.session_id));
        ctx.send_to_client(Line::warning(&message, None)).await
    }

    /// Says what the machine queued outside an open (a thread not recorded, a lost lease).
    pub(super) async fn say_queued(
        &self,
        ctx: &ServerContext,
        thread_id: Option<&str>,
    ) -> Result<(), ProxyError> {
        loop {
            let action = self.state().machine.poll();
            match action {
                None => return Ok(()),
                Some(Action::Driver(DriverAction::Say(say))) => {
                    self.say(ctx, &say, thread_id).await?
                }
                Some(_) => {}
            }
        }
    }

    pub(super) async fn say(
        &self,
        ctx: &ServerContext,
        say: &Say,
        thread_id: Option<&str>,
    ) -> Result<(), ProxyError> {
        ctx.report(&binding::status_event(&self.session_id, say).described());
        let thread_id = match say {
            Say::NotRecorded { thread_id, .. } | Say::CommitFailed { thread_id, .. } => {
                Some(thread_id.as_str())
            }
            _ => thread_id,
        };
        ctx.send_to_client(Line::warning(&say.message(), thread_id))
            .await?;
        if matches!(say, Say::FallbackNotice { .. }) {
            let written = ctx.client_flushed().await?;
            self.state().notice_written = Some(written);
        }
        Ok(())
    }

    /// Records the fallback notice delivered once its line is written (whenever hooks run).
    pub(super) async fn record_notice_if_written(&self) {
        let written = {
            let mut state = self.state();
            let written = state
                .notice_written
                .as_mut()
                .is_some_and(|written| written.try_recv().is_ok());
            if written {
                state.notice_written = None;
            }
            written
        };
        if written {
            self.notice_delivered().await;
        }
    }

    pub(super) async fn notice_delivered(&self) {
        self.state().machine.handle_notice_delivered();
        // The machine asks for the record (a store write); nothing else is queued here.
        let _ = self.store_side().said(&mut Locked(self)).await;
    }
}
