//! [`KeptThreads`]: the threads `rethread app-server` keeps without a session, by their own
//! ids ([`rethread_runtime::kept`]), for [`NoSession::keeping`](crate::NoSession::keeping).

use std::collections::{HashMap, HashSet};

use rethread_protocol::messages::{TurnNotification, TurnStatus};
use rethread_protocol::RequestId;
use rethread_runtime::kept::Keeper;
use rethread_runtime::RuntimeError;
use rethread_store::Unpoisoned;
use serde_json::Value;

use super::answered_thread;
use super::start::start_refused;
use crate::hooks::{ClientAction, HookError, ServerContext};
use crate::line::{Line, LineKind};

/// Each thread the client starts, forks or resumes on the connection, kept by its own id:
/// its lease taken when it is first used (a `thread/resume` waits for it and restores the
/// thread's rollout before it goes to codex, a `thread/fork` restores its source), each
/// completed turn's rollout growth committed before `turn/completed` goes on; a lease is
/// released when codex refuses the resume that took it, every lease when the connection ends.
#[derive(Debug)]
pub(crate) struct KeptThreads {
    keeper: Keeper,
    /// The client's `thread/start` and `thread/fork` requests: their answers open a thread.
    opening: std::sync::Mutex<HashSet<RequestId>>,
    /// The client's `thread/resume` requests that took their thread's lease, by thread.
    resuming: std::sync::Mutex<HashMap<RequestId, String>>,
}

impl KeptThreads {
    pub(crate) fn new(keeper: Keeper) -> Self {
        KeptThreads {
            keeper,
            opening: Default::default(),
            resuming: Default::default(),
        }
    }

    /// A client request the guard let through (`named`: the thread it acts on,
    /// [`Named::target`](super::guard::Named::target)): a `thread/resume` takes its thread
    /// first (answered with an error when another live process keeps it); a start or fork's
    /// answer is awaited.
    pub(crate) async fn on_request(
        &self,
        line: &Line,
        id: RequestId,
        named: Option<String>,
        ctx: &ServerContext,
    ) -> Result<ClientAction, HookError> {
        match line.method() {
            Some("thread/start" | "thread/fork") => {
                if let Some(thread_id) = &named {
                    self.keeper.restore(thread_id).await;
                }
                let params = line.params::<Value>();
                if params.is_none_or(|p| p.get("ephemeral") != Some(&Value::Bool(true))) {
                    self.opening.lock().unpoisoned().insert(id);
                }
            }
            Some("thread/resume") => {
                let Some(thread_id) = named else {
                    return Ok(ClientAction::Forward);
                };
                match self.keeper.take(&thread_id, true).await {
                    Ok(true) => {
                        self.resuming.lock().unpoisoned().insert(id, thread_id);
                    }
                    Ok(false) => {}
                    Err(error) => return self.refuse(ctx, id, &error, &thread_id).await,
                }
            }
            _ => {}
        }
        Ok(ClientAction::Forward)
    }

    /// A codex message: the answer to a start or fork keeps its thread, a refused resume lets
    /// its thread go; a completed turn of a kept thread is recorded as its machine decides
    /// (awaited: the client sees `turn/completed` once it is durable, or after a `warning`
    /// saying why not).
    pub(crate) async fn on_server_message(
        &self,
        line: &Line,
        ctx: &ServerContext,
    ) -> Result<(), HookError> {
        match (line.kind(), line.method()) {
            (LineKind::Response | LineKind::Error, _) => {
                let resumed = line
                    .id()
                    .and_then(|id| self.resuming.lock().unpoisoned().remove(id));
                if let (Some(thread), LineKind::Error) = (resumed, line.kind()) {
                    if let Err(error) = self.keeper.release(&thread).await {
                        ctx.report(&format!(
                            "releasing thread {thread}'s lease failed ({error}); it expires on \
                             its own"
                        ));
                    }
                }
                let opened = line
                    .id()
                    .is_some_and(|id| self.opening.lock().unpoisoned().remove(id));
                let thread = opened.then(|| answered_thread(line)).flatten();
                if let Some(thread) = thread {
                    if let Err(error) = self.keeper.take(&thread, false).await {
                        let message = format!("rethread does not keep thread {thread}: {error}");
                        self.warn(ctx, &message, &thread).await?;
                    }
                }
            }
            (LineKind::Notification, Some("turn/completed")) => {
                let Some(TurnNotification { thread_id, turn }) = line.params() else {
                    return Ok(());
                };
                if turn.status != TurnStatus::Completed {
                    return Ok(());
                }
                // Said before the line goes on: a failed commit, the mirror's cap, a lost lease.
                for say in self.keeper.complete_turn(&thread_id).await {
                    self.warn(ctx, &say.message(), &thread_id).await?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Answers the client's request `id` about `thread` with an error instead of codex.
    async fn refuse(
        &self,
        ctx: &ServerContext,
        id: RequestId,
        error: &RuntimeError,
        thread: &str,
    ) -> Result<ClientAction, HookError> {
        let refusal = start_refused(error, None, Some(thread));
        ctx.report(&refusal.message);
        ctx.send_to_client(Line::error_response(Some(id), refusal))
            .await?;
        Ok(ClientAction::Consumed)
    }

    /// Releases every lease (the connection ended).
    pub(crate) async fn close(&self, ctx: Option<&ServerContext>) {
        if let (Err(error), Some(ctx)) = (self.keeper.release_all().await, ctx) {
            ctx.report(&format!(
                "releasing a kept thread's lease failed ({error}); it expires on its own"
            ));
        }
    }

    async fn warn(
        &self,
        ctx: &ServerContext,
        message: &str,
        thread: &str,
    ) -> Result<(), HookError> {
        ctx.report(message);
        Ok(ctx
            .send_to_client(Line::warning(message, Some(thread)))
            .await?)
    }
}
