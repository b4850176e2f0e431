//! A session's thread given up after its failed first turn (another account's, `docs/design.md`)
//! and its replacement on the same connection: the give-up and the notice when the turn fails,
//! then the client's next request naming the lost thread opens a seeded replacement (the
//! proxy's own `thread/start`), and every request naming it goes to the replacement.

use bytes::Bytes;
use rethread_protocol::messages::ThreadResumeParams;
use rethread_runtime::binding::{Answer, Opened, Opener};
use rethread_runtime::machine::Say;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::start::{resume_params, seeded_params, start_refused};
use super::{answered_thread_of, canonical, BindingHooks, Locked, NoticeDelivery};
use crate::hooks::{ClientContext, HookError, ServerContext};
use crate::line::Line;
use crate::ProxyError;

/// What becomes of a client request that may name the given-up thread.
pub(super) enum Reroute {
    /// It does not: it goes on as it is.
    Unchanged,
    /// It goes to codex as this line, naming the replacement.
    To(Line),
    /// The replacement could not be opened: the request was answered with the error.
    Answered,
}

/// The thread a request's params name at their top level.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ThreadIdOf {
    #[serde(deserialize_with = "canonical")]
    thread_id: String,
}

impl BindingHooks {
    /// A turn on `thread_id` failed with codex's `message`: the machine decides whether the
    /// thread is lost (`StoreSide::turn_failed`, the one rule); if it is, the notice is said now
    /// as a warning (before the failed `turn/completed` goes on), or, with
    /// [`NoticeDelivery::Item`], with the replacement's first turn.
    pub(super) async fn turn_failed(
        &self,
        thread_id: &str,
        message: &str,
        ctx: &ServerContext,
    ) -> Result<(), ProxyError> {
        let mut said = Vec::new();
        let side = self.store_side();
        let hold = |say: Say| {
            said.push(say);
            false
        };
        let failure = side
            .turn_failed(&mut Locked(self), thread_id, message, hold)
            .await;
        let session = &self.session_id;
        if let Some(error) = failure {
            ctx.report(&format!(
                "session {session}: could not give up thread {thread_id} after its failed turn \
                 ({error}); the next connection resumes it again"
            ));
            return Ok(());
        }
        if !said
            .iter()
            .any(|say| matches!(say, Say::FallbackNotice { .. }))
        {
            return Ok(());
        }
        self.state().given_up = Some(thread_id.to_string());
        ctx.report(&format!(
            "session {session}: thread {thread_id} was given up (its first turn here failed: \
             another account's thread); the client's next turn runs on a new thread"
        ));
        if self.options.notice == NoticeDelivery::Item {
            // Owed: said with the replacement, as an item of its first turn.
            return Ok(());
        }
        for say in &said {
            self.say(ctx, say, Some(thread_id)).await?;
        }
        Ok(())
    }

    /// A client request naming the thread given up on this connection goes to its
    /// replacement, opened by the first such request.
    pub(super) async fn reroute(
        &self,
        line: &Line,
        ctx: &ClientContext,
    ) -> Result<Reroute, HookError> {
        let Some(ThreadIdOf { thread_id }) = line.params::<ThreadIdOf>() else {
            return Ok(Reroute::Unchanged);
        };
        let (given_up, replaced, current) = {
            let state = self.state();
            let current = state.machine.thread_id().map(str::to_string);
            (state.given_up.clone(), state.replaced.clone(), current)
        };
        let to = match (given_up, replaced, current) {
            // The client opened the session's thread itself meanwhile (a `thread/start`): that
            // one replaces the lost thread, never a second new thread.
            (Some(lost), _, Some(current)) if lost == thread_id => {
                let mut state = self.state();
                state.given_up = None;
                state.replaced = Some((lost, current.clone()));
                current
            }
            (Some(lost), _, None) if lost == thread_id => {
                match self.replace(&lost, line, ctx).await? {
                    Some(new) => new,
                    None => return Ok(Reroute::Answered),
                }
            }
            (_, Some((lost, new)), _) if lost == thread_id => new,
            _ => return Ok(Reroute::Unchanged),
        };
        let mut value = line.value()?;
        if let Some(params) = value.get_mut("params").and_then(Value::as_object_mut) {
            params.insert("threadId".to_string(), Value::String(to));
        }
        // A new line, newline-terminated like every line the proxy writes itself.
        let mut bytes = serde_json::to_vec(&value)?;
        bytes.push(b'\n');
        Ok(Reroute::To(Line::new(Bytes::from(bytes))))
    }

    /// Opens the replacement of `lost` (the runtime's open loop: the store says the thread was
    /// given up, so a seeded start), says what the open said, and returns the new thread; on
    /// failure answers `line` with the error and returns `None`.
    async fn replace(
        &self,
        lost: &str,
        line: &Line,
        ctx: &ClientContext,
    ) -> Result<Option<String>, ProxyError> {
        let params = self.state().start_params.clone().unwrap_or_default();
        let mut opener = ReplaceOpener {
            hooks: self,
            ctx,
            params,
        };
        let opened = self.store_side().open(&mut Locked(self), &mut opener).await;
        let said = self.drain_open();
        let session = &self.session_id;
        let error = match opened {
            Ok(Opened::Open { outcome, .. }) => {
                let new = outcome.thread_id().to_string();
                {
                    let mut state = self.state();
                    state.given_up = None;
                    state.replaced = Some((lost.to_string(), new.clone()));
                }
                ctx.report(&format!(
                    "session {session}: thread {new} replaces thread {lost}; the client's \
                     requests naming {lost} go to it"
                ));
                for say in &said {
                    self.say(ctx, say, Some(&new)).await?;
                }
                return Ok(Some(new));
            }
            Ok(_) => rethread_runtime::RuntimeError::Internal("a start left unanswered".into()),
            Err(error) => error,
        };
        for say in &said {
            self.say(ctx, say, None).await?;
        }
        let refusal = start_refused(&error, Some(session), Some(lost));
        ctx.report(&format!(
            "session {session}: could not open a thread to replace {lost}: {error}"
        ));
        let id = line.id().cloned();
        ctx.send_to_client(Line::error_response(id, refusal))
            .await?;
        Ok(None)
    }
}

/// The proxy's part of opening a replacement: its own `thread/start` with the client's
/// session start's params, seeded (or a resume, should the store still hold the binding).
struct ReplaceOpener<'a> {
    hooks: &'a BindingHooks,
    ctx: &'a ClientContext,
    params: Map<String, Value>,
}

impl Opener for ReplaceOpener<'_> {
    type Open = ();

    async fn resume(&mut self, attempt: ThreadResumeParams) -> Answer<()> {
        let resume = resume_params(attempt, &self.params);
        let answer = self.ctx.request("thread/resume", Some(resume)).await;
        Answer::of_resume(answer.map(drop))
    }

    async fn start(&mut self, seed: Option<String>) -> Answer<()> {
        let params = match seed {
            Some(seed) => seeded_params(self.params.clone(), seed),
            None => self.params.clone(),
        };
        match self
            .ctx
            .request("thread/start", Some(Value::Object(params)))
            .await
        {
            Ok(result) => match answered_thread_of(&result) {
                Some(thread_id) => Answer::Started {
                    thread_id,
                    open: (),
                },
                None => Answer::Failed(rethread_runtime::RuntimeError::Internal(
                    "codex answered thread/start without a thread".into(),
                )),
            },
            Err(error) => Answer::Failed(error.into()),
        }
    }

    fn say(&mut self, say: Say) -> bool {
        // Said by `replace` once the open is over, naming the new thread.
        self.hooks.state().said.push(say);
        false
    }
}
