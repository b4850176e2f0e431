//! What the session says to the client (as `warning` notifications, and on stderr), and when a
//! fallback notice counts as delivered: once its line is flushed to the client; with
//! [`NoticeDelivery::Item`], once its item is, in the new thread's next turn.

use rethread_runtime::binding;
use rethread_runtime::machine::{Action, DriverAction, Say};

use super::turns::Forgot;
use super::{BindingHooks, Locked};
use crate::hooks::ServerContext;
use crate::line::{Line, LineKind};
use crate::ProxyError;
use rethread_protocol::Message;
use serde_json::json;

/// How the fallback notice reaches the client (`RETHREAD_NOTICE`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum NoticeDelivery {
    /// A `warning` notification, right before the start's answer; delivered once written.
    /// Clients that render codex's warnings (codex's own TUI) show it.
    #[default]
    Warning,
    /// The warning, and an `agentMessage` item of its own (`item/started`, `item/completed`)
    /// at the start of the new thread's next turn, for clients that show their user a turn's
    /// items only (Hermes, the Python SDK). Delivered once that item is written. codex never
    /// sees it, so it is in neither the model's context nor the session's transcript, and the
    /// model's own reply, which follows it, stays the turn's last message.
    Item,
}

/// Where an `item/*` notification belongs.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ItemOf {
    #[serde(deserialize_with = "super::canonical")]
    thread_id: String,
    turn_id: String,
}

impl BindingHooks {
    /// With [`NoticeDelivery::Item`], before the first `item/*` notification of the new
    /// thread's turn goes on: the notice as an item of that turn, once.
    pub(super) async fn say_notice_item(
        &self,
        line: &Line,
        ctx: &ServerContext,
    ) -> Result<(), ProxyError> {
        let item_line = line.kind() == LineKind::Notification
            && line.method().is_some_and(|m| m.starts_with("item/"));
        if !item_line || self.state().notice_item.is_none() {
            return Ok(());
        }
        let Some(ItemOf { thread_id, turn_id }) = line.params() else {
            return Ok(());
        };
        if self.state().notice_item.as_deref() != Some(thread_id.as_str()) {
            return Ok(());
        }
        self.state().notice_item = None;
        let item = json!({
            "type": "agentMessage",
            "id": format!("rethread-notice-{thread_id}"),
            "text": rethread_runtime::machine::RESUME_FALLBACK_NOTICE,
        });
        // Typed clients (the Python SDK) require the lifecycle's time, as codex sends it.
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis());
        for (method, at) in [
            ("item/started", "startedAtMs"),
            ("item/completed", "completedAtMs"),
        ] {
            let mut params = json!({"threadId": thread_id, "turnId": turn_id, "item": item});
            params[at] = json!(now_ms);
            let message = Message::notification(method, Some(params));
            ctx.send_to_client(Line::from_message(&message)).await?;
        }
        let written = ctx.client_flushed().await?;
        self.state().notice_written = Some(written);
        Ok(())
    }

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
            match (self.options.notice, thread_id) {
                (NoticeDelivery::Warning, _) => {
                    let written = ctx.client_flushed().await?;
                    self.state().notice_written = Some(written);
                }
                // Delivered with the new thread's next turn; without a thread (its start
                // failed) it stays owed, and the next open says it again.
                (NoticeDelivery::Item, thread) => {
                    self.state().notice_item = thread.map(str::to_string);
                }
            }
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
