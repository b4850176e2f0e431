//! [`NoSession`]: the hooks of `rethread app-server` when no session is named.

use rethread_store::{BindingStore, Unpoisoned};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use rethread_protocol::RequestId;
use rethread_runtime::kept::Keeper;
use rethread_runtime::BinderOptions;

use crate::hooks::{ClientAction, ClientContext, HookError, ServerAction, ServerContext};
use crate::line::{Line, LineKind};
use crate::session::{KeptThreads, Sessionless};
use crate::SessionHooks;

/// The one `warning` a client gets when no session is named and nothing is kept.
pub const NO_SESSION_WARNING: &str = "No rethread session is named (set RETHREAD_SESSION): \
     nothing is kept, so this conversation will not be resumed after a restart.";

/// The one `warning` a client gets when no session is named and threads are kept by their
/// ids ([`NoSession::keeping`]).
pub const KEPT_THREADS_WARNING: &str = "No rethread session is named (set RETHREAD_SESSION): \
     each thread is kept by its own id (its rollout, restored before thread/resume on any \
     machine sharing the store), but no transcript: a thread codex cannot resume is not \
     replaced, and thread/start always starts a new thread.";

/// Without a store, pure pass-through; with one ([`NoSession::keeping`]), each thread the
/// client starts, forks or resumes is kept by its own id (`docs/design.md`, "Threads kept
/// without a session"). Plus one `warning` `{"message": NO_SESSION_WARNING or
/// KEPT_THREADS_WARNING, "threadId": null}` (and on stderr), once per process, right after
/// codex's successful answer to the client's `initialize`: the first moment a server may
/// speak, before the answer to anything else.
#[derive(Debug, Default)]
pub struct NoSession {
    /// The id of the client's `initialize` request, until it is answered.
    initialize: Mutex<Option<RequestId>>,
    warned: AtomicBool,
    kept: Option<KeptThreads>,
    /// With a store: the guard, whether or not threads are kept.
    guard: Option<Sessionless>,
    /// The context `on_start` was given: where `on_shutdown` reports.
    reporter: OnceLock<ClientContext>,
}

impl NoSession {
    /// The pass-through.
    pub fn new() -> Self {
        NoSession::default()
    }

    /// Keeps each thread the client runs by its own id in `store`, under `options` (lease TTL
    /// and wait, `CODEX_HOME`, the mirror and its cap); a pass-through without the mirror.
    /// Sessions' threads stay out of reach either way (`docs/design.md`, "A thread the client
    /// names", rule 6).
    pub fn keeping(store: BindingStore, options: BinderOptions) -> Self {
        let guard = Some(Sessionless::new(store.clone(), options.codex_home.clone()));
        let kept = Keeper::new(store, options).map(KeptThreads::new);
        NoSession {
            kept,
            guard,
            ..NoSession::default()
        }
    }

    fn initialize(&self) -> std::sync::MutexGuard<'_, Option<RequestId>> {
        self.initialize.lock().unpoisoned()
    }
}

impl SessionHooks for NoSession {
    async fn on_start(&self, ctx: &ClientContext) -> Result<(), HookError> {
        let _ = self.reporter.set(ctx.clone());
        Ok(())
    }

    async fn on_client_message(
        &self,
        line: &Line,
        ctx: &ClientContext,
    ) -> Result<ClientAction, HookError> {
        if line.kind() == LineKind::Request
            && line.method() == Some("initialize")
            && !self.warned.load(Ordering::Relaxed)
        {
            *self.initialize() = line.id().cloned();
        }
        let (Some(guard), LineKind::Request, Some(id)) = (&self.guard, line.kind(), line.id())
        else {
            return Ok(ClientAction::Forward);
        };
        let named = match guard.check(line).await {
            Ok(named) => named,
            Err(refusal) => {
                ctx.report(&refusal.message);
                ctx.send_to_client(Line::error_response(Some(id.clone()), refusal))
                    .await?;
                return Ok(ClientAction::Consumed);
            }
        };
        match &self.kept {
            Some(kept) => kept.on_request(line, id.clone(), named, ctx).await,
            None => Ok(ClientAction::Forward),
        }
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
            if let Some(filtered) = self.guard.as_ref().map(|guard| guard.filter(line)) {
                if let Some(filtered) = filtered.await {
                    ctx.send_to_client(filtered).await?;
                    return Ok(ServerAction::Consumed);
                }
            }
            if let Some(kept) = &self.kept {
                kept.on_server_message(line, ctx).await?;
            }
            return Ok(ServerAction::Forward);
        }
        let warning = match self.kept {
            Some(_) => KEPT_THREADS_WARNING,
            None => NO_SESSION_WARNING,
        };
        ctx.report(warning);
        ctx.send_to_client(line.clone()).await?;
        ctx.send_to_client(Line::warning(warning, None)).await?;
        Ok(ServerAction::Consumed)
    }

    async fn on_shutdown(&self) {
        if let Some(kept) = &self.kept {
            kept.close(self.reporter.get().map(|ctx| &**ctx)).await;
        }
    }
}
