//! [`NoSession`]: the hooks of `rethread app-server` when no session is named.

use rethread_store::Unpoisoned;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use rethread_protocol::RequestId;

use crate::hooks::{ClientAction, ClientContext, HookError, ServerAction, ServerContext};
use crate::line::{Line, LineKind};
use crate::SessionHooks;

/// The one `warning` a client gets when no session is named.
pub const NO_SESSION_WARNING: &str = "No rethread session is named (set RETHREAD_SESSION): \
     nothing is kept, so this conversation will not be resumed after a restart.";

/// Pure pass-through, plus one `warning` `{"message": NO_SESSION_WARNING, "threadId": null}`
/// (and on stderr), once per process, right after codex's successful answer to the client's
/// `initialize`: the first moment a server may speak, before the answer to anything else.
#[derive(Debug, Default)]
pub struct NoSession {
    /// The id of the client's `initialize` request, until it is answered.
    initialize: Mutex<Option<RequestId>>,
    warned: AtomicBool,
}

impl NoSession {
    /// The pass-through.
    pub fn new() -> Self {
        NoSession::default()
    }

    fn initialize(&self) -> std::sync::MutexGuard<'_, Option<RequestId>> {
        self.initialize.lock().unpoisoned()
    }
}

impl SessionHooks for NoSession {
    async fn on_client_message(
        &self,
        line: &Line,
        _ctx: &ClientContext,
    ) -> Result<ClientAction, HookError> {
        if line.kind() == LineKind::Request
            && line.method() == Some("initialize")
            && !self.warned.load(Ordering::Relaxed)
        {
            *self.initialize() = line.id().cloned();
        }
        Ok(ClientAction::Forward)
    }

    async fn on_server_message(
        &self,
        line: &Line,
        ctx: &ServerContext,
    ) -> Result<ServerAction, HookError> {
        let answers_initialize = line.kind() == LineKind::Response
            && self
                .initialize()
                .take_if(|id| Some(&*id) == line.id())
                .is_some();
        if !answers_initialize || self.warned.swap(true, Ordering::Relaxed) {
            return Ok(ServerAction::Forward);
        }
        ctx.report(NO_SESSION_WARNING);
        ctx.send_to_client(line.clone()).await?;
        ctx.send_to_client(Line::warning(NO_SESSION_WARNING, None))
            .await?;
        Ok(ServerAction::Consumed)
    }
}
