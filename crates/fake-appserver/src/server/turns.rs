//! The turn methods: `turn/start` (a task per turn that emits codex's notification sequence,
//! asks the model and appends to the rollout) and `turn/interrupt`.

use std::time::Duration;

use rethread_protocol::ErrorCode;
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use super::params::{field_str, invalid, Answer, Failure, Handled};
use super::process::{ActiveTurn, Emitter, Proc, ProcRef};
use super::{lock, ModelRequest};
use crate::faults::Fault;
use crate::model::{stream_pieces, AnswerShape, ConversationMessage};
use crate::profile::Profile;
use crate::store::TurnRecord;
use crate::util::{new_id, now_ms};

/// A `thread/tokenUsage/updated` params object (every model response counts 1 in, 1 out).
pub(super) fn token_usage(
    thread_id: impl serde::Serialize,
    turn_id: impl serde::Serialize,
) -> Value {
    let usage = json!({"totalTokens": 2, "inputTokens": 1, "cachedInputTokens": 0,
                       "outputTokens": 1, "reasoningOutputTokens": 0});
    json!({"threadId": thread_id, "turnId": turn_id,
           "tokenUsage": {"total": usage, "last": usage, "modelContextWindow": 258400}})
}

pub(super) fn agent_item(turn_id: &str, text: &str) -> Value {
    json!({"type": "agentMessage", "id": format!("{turn_id}-agent"), "text": text, "phase": null})
}

/// Answers `turn/interrupt`. After an interrupt, 0.144.6 keeps the interrupted turn as its
/// "active" one: an interrupt naming that turn is never answered (observed: the request stays
/// pending: [`Answer::Never`]) and one naming another turn is refused with
/// `expected active turn id <given> but found <interrupted>`.
pub(super) fn turn_interrupt(proc: &mut Proc, params: &Value) -> Handled {
    let thread_id = field_str(params, "threadId")?;
    let turn_id = field_str(params, "turnId")?;
    let profile = proc.profile;
    let Some(thread) = proc.threads.get_mut(&thread_id) else {
        return Err((
            ErrorCode::INVALID_REQUEST,
            "no active turn to interrupt".into(),
        ));
    };
    if let Some(interrupt) = thread.active.as_mut().and_then(|a| a.interrupt.take()) {
        let _ = interrupt.send(());
        return Ok(Answer::Reply(json!({})));
    }
    if let (false, Some(stale)) = (profile == Profile::Current, &thread.interrupted) {
        if *stale == turn_id {
            return Ok(Answer::Never);
        }
        return Err((
            ErrorCode::INVALID_REQUEST,
            format!("expected active turn id {turn_id} but found {stale}"),
        ));
    }
    Err((
        ErrorCode::INVALID_REQUEST,
        "no active turn to interrupt".into(),
    ))
}

fn input_text(params: &Value) -> Result<String, Failure> {
    let input = params
        .get("input")
        .ok_or_else(|| invalid("missing field `input`"))?;
    let items = input
        .as_array()
        .ok_or_else(|| invalid("invalid type: expected a sequence"))?;
    Ok(items
        .iter()
        .filter_map(|item| item.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n"))
}

pub(super) fn turn_start(
    proc_ref: &ProcRef,
    emitter: &Emitter,
    tasks: &mut JoinSet<()>,
    id: &Value,
    params: &Value,
    faults: &[Fault],
) -> Handled {
    let thread_id = field_str(params, "threadId")?;
    let text = input_text(params)?;
    let mut proc = lock(proc_ref);
    let turn_id = new_id();
    let (interrupt_tx, interrupt_rx) = oneshot::channel();
    {
        let Some(loaded) = proc.threads.get_mut(&thread_id) else {
            return Err((
                ErrorCode::INVALID_REQUEST,
                format!("thread not found: {thread_id}"),
            ));
        };
        if loaded.active.is_some() {
            return Err((
                ErrorCode::INVALID_REQUEST,
                format!("thread {thread_id} already has an active turn"),
            ));
        }
        loaded.interrupted = None;
        loaded.active = Some(ActiveTurn {
            interrupt: Some(interrupt_tx),
        });
    }
    let number = {
        let mut counters = lock(&proc.shared.counters);
        counters.turns += 1;
        counters.turns
    };
    // The rollout appears when the first turn runs, starting with its `session_meta`.
    let profile = proc.profile;
    if let Some(loaded) = proc.threads.get_mut(&thread_id) {
        if !loaded.materialized {
            loaded.materialized = true;
            let meta = loaded.meta.clone();
            if let Err(e) = proc.store.create_rollout(&meta, profile) {
                tracing::warn!("fake app-server: cannot write rollout: {e}");
            }
        }
    }
    drop(proc);
    emitter.respond(
        id,
        Ok(json!({"turn": {"id": turn_id, "items": [], "itemsView": "notLoaded", "status": "inProgress",
                   "error": null, "startedAt": null, "completedAt": null, "durationMs": null}})),
    );
    let run = TurnRun {
        proc: proc_ref.clone(),
        emitter: emitter.clone(),
        thread_id,
        turn_id,
        text,
        number,
        faults: faults.to_vec(),
        profile,
    };
    tasks.spawn(run.run(interrupt_rx));
    Ok(Answer::Sent)
}

struct TurnRun {
    proc: ProcRef,
    emitter: Emitter,
    thread_id: String,
    turn_id: String,
    text: String,
    number: u64,
    faults: Vec<Fault>,
    profile: Profile,
}

impl TurnRun {
    fn has(&self, check: impl Fn(&Fault) -> bool) -> bool {
        self.faults.iter().any(check)
    }

    async fn run(self, mut interrupt: oneshot::Receiver<()>) {
        let started_ms = now_ms();
        let n = self.number;
        if self.has(|f| matches!(f, Fault::ForeignNotifications { turn } if *turn == n)) {
            self.foreign_notifications();
        }
        let e = &self.emitter;
        let (thread, turn) = (&self.thread_id, &self.turn_id);
        e.notify(
            "thread/status/changed",
            json!({"threadId": thread, "status": {"type": "active", "activeFlags": []}}),
        );
        e.notify(
            "turn/started",
            json!({"threadId": thread, "turn": {"id": turn, "items": [], "itemsView": "notLoaded",
                   "status": "inProgress", "error": null, "startedAt": started_ms / 1000,
                   "completedAt": null, "durationMs": null}}),
        );
        let user_item = json!({"type": "userMessage", "id": format!("{turn}-user"),
                               "content": [{"type": "text", "text": self.text, "text_elements": []}]});
        e.notify(
            "item/started",
            json!({"item": user_item, "threadId": thread, "turnId": turn, "startedAtMs": now_ms()}),
        );
        e.notify(
            "item/completed",
            json!({"item": user_item, "threadId": thread, "turnId": turn, "completedAtMs": now_ms()}),
        );
        if self.has(|f| matches!(f, Fault::ExitMidTurn { turn } if *turn == n)) {
            e.exit();
            return;
        }
        if self.has(|f| matches!(f, Fault::InvalidEncryptedContent { turn } if *turn == n)) {
            return self.refused(started_ms);
        }
        let mut interrupted = false;
        if self.has(|f| matches!(f, Fault::Approval { turn } if *turn == n)) {
            let (answer_tx, answer_rx) = oneshot::channel();
            let request_id = {
                let mut proc = lock(&self.proc);
                let request_id = proc.next_server_request;
                proc.next_server_request += 1;
                proc.pending.insert(request_id.to_string(), answer_tx);
                request_id
            };
            // Like codex: the thread waits on the approval, the command item starts, the
            // request goes out; once answered the request is resolved, the item completes
            // (declined unless accepted), the thread is active again and the model's tool-call
            // response is accounted.
            let item_id = format!("{turn}-exec");
            let command = "/bin/bash -lc 'echo approved'";
            let actions = json!([{"type": "unknown", "command": "echo approved"}]);
            e.notify(
                "thread/status/changed",
                json!({"threadId": thread, "status": {"type": "active", "activeFlags": ["waitingOnApproval"]}}),
            );
            let exec_item = json!({"type": "commandExecution", "id": item_id, "command": command,
                                   "commandActions": actions, "cwd": "/", "status": "inProgress"});
            e.notify(
                "item/started",
                json!({"item": exec_item, "threadId": thread, "turnId": turn, "startedAtMs": now_ms()}),
            );
            e.line(
                json!({"id": request_id, "method": "item/commandExecution/requestApproval",
                       "params": {"kind": "command", "threadId": thread, "turnId": turn,
                                  "itemId": item_id, "startedAtMs": now_ms(),
                                  "reason": "rethread test approval", "command": command,
                                  "cwd": "/", "commandActions": actions,
                                  "availableDecisions": ["accept", "cancel"]}})
                .to_string(),
            );
            tokio::select! {
                answer = answer_rx => {
                    e.notify("serverRequest/resolved", json!({"threadId": thread, "requestId": request_id}));
                    let decision = answer.ok().and_then(|a| a.get("decision").cloned()).unwrap_or(Value::Null);
                    let status = if decision == json!("accept") || decision == json!("acceptForSession") { "completed" } else { "declined" };
                    let item = json!({"type": "commandExecution", "id": item_id, "command": command,
                                      "commandActions": actions, "cwd": "/", "status": status});
                    e.notify("item/completed", json!({"item": item, "threadId": thread, "turnId": turn, "completedAtMs": now_ms()}));
                    e.notify(
                        "thread/status/changed",
                        json!({"threadId": thread, "status": {"type": "active", "activeFlags": []}}),
                    );
                    e.notify("thread/tokenUsage/updated", token_usage(thread, turn));
                }
                _ = &mut interrupt => interrupted = true,
            }
        }
        let slow: u64 = self
            .faults
            .iter()
            .map(|f| {
                if let Fault::SlowTurn { millis } = f {
                    *millis
                } else {
                    0
                }
            })
            .sum();
        if !interrupted && slow > 0 {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(slow)) => {}
                _ = &mut interrupt => interrupted = true,
            }
        }
        let reply = if interrupted {
            None
        } else {
            Some(self.ask_model())
        };
        if let Some(text) = &reply {
            let item = agent_item(turn, text);
            e.notify(
                "item/started",
                json!({"item": item, "threadId": thread, "turnId": turn, "startedAtMs": now_ms()}),
            );
            // Like codex: a delta per piece the model streamed, none for a completed message.
            if *lock(&lock(&self.proc).shared.answer) == AnswerShape::Streamed {
                for piece in stream_pieces(text) {
                    e.notify(
                        "item/agentMessage/delta",
                        json!({"threadId": thread, "turnId": turn, "itemId": item["id"], "delta": piece}),
                    );
                }
            }
            e.notify(
                "item/completed",
                json!({"item": item, "threadId": thread, "turnId": turn, "completedAtMs": now_ms()}),
            );
            e.notify("thread/tokenUsage/updated", token_usage(thread, turn));
            e.notify(
                "account/rateLimits/updated",
                json!({"rateLimits": {"limitId": "codex", "primary": null, "secondary": null}}),
            );
        }
        let status = if interrupted {
            "interrupted"
        } else {
            "completed"
        };
        let completed_ms = now_ms();
        let record = TurnRecord {
            id: turn.clone(),
            user_text: self.text.clone(),
            agent_text: reply.clone(),
            status: status.into(),
            started_ms,
            completed_ms,
        };
        self.persist(&record);
        e.notify(
            "thread/status/changed",
            json!({"threadId": thread, "status": {"type": "idle"}}),
        );
        let (items, view) = match (&reply, self.profile) {
            (Some(text), Profile::Current) => (vec![agent_item(turn, text)], "summary"),
            _ => (Vec::new(), "notLoaded"),
        };
        e.notify(
            "turn/completed",
            json!({"threadId": thread, "turn": {"id": turn, "items": items, "itemsView": view,
                   "status": status, "error": null, "startedAt": started_ms / 1000,
                   "completedAt": completed_ms / 1000,
                   "durationMs": completed_ms.saturating_sub(started_ms)}}),
        );
    }

    /// Ends the turn as codex does when the model's API refused its request
    /// ([`Fault::InvalidEncryptedContent`]).
    fn refused(&self, started_ms: u64) {
        let (e, thread, turn) = (&self.emitter, &self.thread_id, &self.turn_id);
        let error = json!({"message": crate::faults::INVALID_ENCRYPTED_CONTENT,
                           "codexErrorInfo": "other", "additionalDetails": null});
        e.notify(
            "thread/status/changed",
            json!({"threadId": thread, "status": {"type": "systemError"}}),
        );
        e.notify(
            "error",
            json!({"error": error, "willRetry": false, "threadId": thread, "turnId": turn}),
        );
        let completed_ms = now_ms();
        e.notify(
            "turn/completed",
            json!({"threadId": thread, "turn": {"id": turn, "items": [], "itemsView": "notLoaded",
                   "status": "failed", "error": error, "startedAt": started_ms / 1000,
                   "completedAt": completed_ms / 1000,
                   "durationMs": completed_ms.saturating_sub(started_ms)}}),
        );
    }

    /// Builds the conversation the model sees (the thread's whole history plus this turn's
    /// message), records it, and returns the model's reply.
    fn ask_model(&self) -> String {
        let proc = lock(&self.proc);
        let mut conversation = Vec::new();
        if let Some(loaded) = proc.threads.get(&self.thread_id) {
            if let Some(instructions) = &loaded.meta.developer_instructions {
                conversation.push(ConversationMessage {
                    role: "developer".into(),
                    text: instructions.clone(),
                });
            }
            for turn in &loaded.turns {
                conversation.push(ConversationMessage {
                    role: "user".into(),
                    text: turn.user_text.clone(),
                });
                if let Some(text) = &turn.agent_text {
                    conversation.push(ConversationMessage {
                        role: "assistant".into(),
                        text: text.clone(),
                    });
                }
            }
        }
        conversation.push(ConversationMessage {
            role: "user".into(),
            text: self.text.clone(),
        });
        let shared = proc.shared.clone();
        drop(proc);
        let reply = lock(&shared.reply).next_reply(&conversation);
        shared.log_event(&format!("turn-done {}", self.thread_id));
        let request = ModelRequest {
            thread_id: self.thread_id.clone(),
            turn_id: self.turn_id.clone(),
            conversation,
            reply: reply.clone(),
        };
        if let Some(path) = &shared.model_log {
            if let Ok(mut line) = serde_json::to_string(&request) {
                line.push('\n');
                use std::io::Write;
                let _ = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .and_then(|mut f| f.write_all(line.as_bytes()));
            }
        }
        lock(&shared.model).push(request);
        reply
    }

    fn persist(&self, record: &TurnRecord) {
        let mut proc = lock(&self.proc);
        let Some(loaded) = proc.threads.get_mut(&self.thread_id) else {
            return;
        };
        loaded.active = None;
        if loaded.turns.is_empty() {
            loaded.meta.preview = record.user_text.clone();
        }
        loaded.meta.updated_ms = record.completed_ms;
        if record.status == "interrupted" {
            loaded.interrupted = Some(record.id.clone());
        }
        loaded.turns.push(record.clone());
        let meta = loaded.meta.clone();
        if let Err(e) = proc.store.append_turn(&meta, record) {
            tracing::warn!("fake app-server: cannot append to rollout: {e}");
        }
        let n = self.number;
        for fault in &self.faults {
            if let Fault::CorruptRollout {
                after_turn,
                corruption,
            } = fault
            {
                if *after_turn == n {
                    let _ = corruption.apply(&meta.path);
                }
            }
        }
    }

    fn foreign_notifications(&self) {
        let other = new_id();
        let turn = new_id();
        let e = &self.emitter;
        e.notify(
            "turn/started",
            json!({"threadId": other, "turn": {"id": turn, "items": [], "status": "inProgress"}}),
        );
        let item = agent_item(&turn, "not for you");
        e.notify(
            "item/completed",
            json!({"item": item, "threadId": other, "turnId": turn, "completedAtMs": now_ms()}),
        );
        e.notify(
            "turn/completed",
            json!({"threadId": other, "turn": {"id": turn, "items": [item], "status": "completed"}}),
        );
    }
}
