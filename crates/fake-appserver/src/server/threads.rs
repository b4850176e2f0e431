//! The thread methods: `thread/start`, `thread/resume`, `thread/read`, `thread/list`, and the
//! `Thread` objects they answer with.

use std::fs::File;
use std::io;

use rethread_protocol::{ErrorCode, HistoryMode};
use serde_json::{json, Value};

use super::params::{field_bool, field_str, invalid, kind_of, Answer, Failure, Handled};
use super::process::{Emitter, Loaded, Proc};
use super::turns::{agent_item, token_usage};
use crate::faults::Fault;
use crate::profile::Profile;
use crate::store::{self, ReadError, ThreadMeta, TurnRecord};
use crate::util::{check_uuid, new_id, now_ms};

impl Proc {
    pub(super) fn thread_json(
        &self,
        meta: &ThreadMeta,
        turns: Option<&[TurnRecord]>,
        loaded: bool,
    ) -> Value {
        let mut thread = json!({
            "id": meta.id,
            "sessionId": meta.id,
            "forkedFromId": null,
            "parentThreadId": null,
            "preview": meta.preview,
            "ephemeral": false,
            "modelProvider": "mock",
            "model": "mock-model",
            "createdAt": meta.created_ms / 1000,
            "updatedAt": meta.updated_ms / 1000,
            "status": {"type": if loaded { "idle" } else { "notLoaded" }},
            "path": meta.path,
            "cwd": meta.cwd,
            "cliVersion": meta.cli_version,
            "source": "vscode",
            "name": null,
            "turns": turns.unwrap_or_default().iter().map(turn_json).collect::<Vec<_>>(),
        });
        if self.profile.has_history_mode() {
            thread["historyMode"] = json!(meta.history_mode.as_str());
        }
        if self.profile == Profile::Current {
            thread["projectId"] = Value::Null;
        }
        thread
    }

    pub(super) fn thread_response(&self, loaded: &Loaded, include_turns: bool) -> Value {
        let turns = include_turns.then_some(loaded.turns.as_slice());
        json!({
            "thread": self.thread_json(&loaded.meta, turns, true),
            "model": "mock-model",
            "modelProvider": "mock",
            "cwd": loaded.meta.cwd,
            "approvalPolicy": "never",
            "approvalsReviewer": "user",
            "sandbox": {"type": "readOnly", "networkAccess": false},
            "reasoningEffort": null,
        })
    }

    pub(super) fn lock_writer(&self, id: &str) -> Result<Option<File>, Failure> {
        if !self.profile.has_writer_lock() {
            return Ok(None);
        }
        match store::try_lock_writer(self.store.home(), id) {
            Ok(Some(file)) => Ok(Some(file)),
            Ok(None) => Err((
                ErrorCode::INVALID_REQUEST,
                format!("thread {id} already has an active writer"),
            )),
            Err(e) => Err((
                ErrorCode::INTERNAL_ERROR,
                format!("failed to lock thread {id}: {e}"),
            )),
        }
    }
}

fn turn_json(turn: &TurnRecord) -> Value {
    let mut items = vec![json!({
        "type": "userMessage",
        "id": format!("{}-user", turn.id),
        "content": [{"type": "text", "text": turn.user_text, "text_elements": []}],
    })];
    if let Some(text) = &turn.agent_text {
        items.push(agent_item(&turn.id, text));
    }
    json!({
        "id": turn.id,
        "items": items,
        "itemsView": "full",
        "status": turn.status,
        "error": null,
        "startedAt": turn.started_ms / 1000,
        "completedAt": turn.completed_ms / 1000,
        "durationMs": turn.completed_ms.saturating_sub(turn.started_ms),
    })
}

pub(super) fn thread_start(
    proc: &mut Proc,
    emitter: &Emitter,
    id: &Value,
    params: &Value,
) -> Handled {
    let requested = match params.get("historyMode") {
        None | Some(Value::Null) => None,
        Some(Value::String(mode)) => match HistoryMode::parse(mode) {
            HistoryMode::Unknown(other) => {
                return Err(invalid(&format!(
                    "unknown variant `{other}`, expected `legacy` or `paginated`"
                )))
            }
            known => Some(known),
        },
        Some(other) => {
            return Err(invalid(&format!(
                "invalid type: {}, expected a string",
                kind_of(other)
            )))
        }
    };
    if requested.is_some() && !proc.experimental {
        return Err((
            ErrorCode::INVALID_REQUEST,
            "thread/start.historyMode requires experimentalApi capability".into(),
        ));
    }
    let mode = requested.unwrap_or_else(|| proc.profile.default_history_mode());
    if mode == HistoryMode::Paginated && !proc.profile.serves_paginated() {
        return Err((
            ErrorCode::METHOD_NOT_FOUND,
            "paginated_threads is not supported yet".into(),
        ));
    }
    let cwd = match params.get("cwd").and_then(Value::as_str) {
        Some(cwd) => cwd.to_string(),
        None => std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_default(),
    };
    let thread_id = new_id();
    let created_ms = now_ms();
    let meta = ThreadMeta {
        path: proc.store.rollout_path_for(&thread_id, created_ms),
        id: thread_id.clone(),
        history_mode: mode,
        cwd,
        created_ms,
        updated_ms: created_ms,
        preview: String::new(),
        cli_version: proc.profile.cli_version().to_string(),
        developer_instructions: params
            .get("developerInstructions")
            .and_then(Value::as_str)
            .map(str::to_string),
    };
    let writer_lock = proc.lock_writer(&thread_id)?;
    let loaded = Loaded {
        meta,
        turns: Vec::new(),
        materialized: false,
        _writer_lock: writer_lock,
        active: None,
        interrupted: None,
    };
    let response = proc.thread_response(&loaded, false);
    let thread = response["thread"].clone();
    proc.threads.insert(thread_id, loaded);
    emitter.respond(id, Ok(response));
    emitter.notify("thread/started", json!({"thread": thread}));
    Ok(Answer::Sent)
}

fn no_rollout_error(id: &str) -> Failure {
    (
        ErrorCode::INVALID_REQUEST,
        format!("no rollout found for thread id {id}"),
    )
}

fn paginated_unsupported() -> Failure {
    (
        ErrorCode::METHOD_NOT_FOUND,
        "paginated_threads is not supported yet".into(),
    )
}

/// Answers `thread/resume`. Like codex, a successful resume is followed by the thread's status
/// (when it was not loaded yet) and its restored token usage (when it has turns).
pub(super) fn thread_resume(
    proc: &mut Proc,
    emitter: &Emitter,
    id: &Value,
    params: &Value,
    faults: &[Fault],
) -> Handled {
    let (response, newly_loaded, last_turn) = resume(proc, params, faults)?;
    let thread_id = response["thread"]["id"].clone();
    emitter.respond(id, Ok(response));
    if newly_loaded {
        emitter.notify(
            "thread/status/changed",
            json!({"threadId": thread_id, "status": {"type": "idle"}}),
        );
    }
    if let Some(turn_id) = last_turn {
        emitter.notify(
            "thread/tokenUsage/updated",
            token_usage(&thread_id, turn_id),
        );
    }
    Ok(Answer::Sent)
}

/// Resumes a thread: the response, whether it was newly loaded, and its last turn's id.
fn resume(
    proc: &mut Proc,
    params: &Value,
    faults: &[Fault],
) -> Result<(Value, bool, Option<String>), Failure> {
    let thread_id = field_str(params, "threadId")?;
    let exclude = field_bool(params, "excludeTurns")?;
    if exclude.is_some() && proc.profile.exclude_turns_is_experimental() && !proc.experimental {
        return Err((
            ErrorCode::INVALID_REQUEST,
            "thread/resume.excludeTurns requires experimentalApi capability".into(),
        ));
    }
    let include_turns = exclude != Some(true);
    for fault in faults {
        if let Fault::FailResume {
            thread_ids,
            code,
            message,
        } = fault
        {
            if thread_ids.contains(&thread_id) {
                let message = match message {
                    Some(m) => m.replace("<id>", &thread_id),
                    None => format!("no rollout found for thread id {thread_id}"),
                };
                return Err((ErrorCode::from(*code), message));
            }
        }
    }
    check_uuid(&thread_id).map_err(|e| {
        (
            ErrorCode::INVALID_REQUEST,
            format!("invalid session id: {e}"),
        )
    })?;
    if let Some(loaded) = proc.threads.get(&thread_id) {
        if !loaded.materialized {
            return Err(no_rollout_error(&thread_id));
        }
        // Resuming a loaded thread still checks its rollout: one deleted under a running
        // server is gone for resume (0.169.0 words it as a broken history lineage).
        if !loaded.meta.path.is_file() {
            return Err(match proc.profile {
                Profile::Current => (
                    ErrorCode::INVALID_REQUEST,
                    format!(
                        "invalid paginated history lineage for {thread_id}: missing source rollout"
                    ),
                ),
                _ => no_rollout_error(&thread_id),
            });
        }
        if loaded.meta.history_mode == HistoryMode::Paginated && !proc.profile.serves_paginated() {
            return Err(paginated_unsupported());
        }
        return Ok((
            proc.thread_response(loaded, include_turns),
            false,
            loaded.turns.last().map(|t| t.id.clone()),
        ));
    }
    let path = proc
        .store
        .find_rollout(&thread_id, proc.profile != Profile::Current)
        .map_err(internal)?
        .ok_or_else(|| no_rollout_error(&thread_id))?;
    let rollout = match store::read_rollout(&path) {
        Ok(rollout) => rollout,
        Err(ReadError::Missing) => return Err(no_rollout_error(&thread_id)),
        Err(e) => {
            return Err((
                ErrorCode::INTERNAL_ERROR,
                e.message(&path, proc.profile, true),
            ))
        }
    };
    let _ = proc
        .store
        .reconcile_mode(&thread_id, &rollout.meta.history_mode);
    if rollout.meta.history_mode == HistoryMode::Paginated && !proc.profile.serves_paginated() {
        return Err(paginated_unsupported());
    }
    let writer_lock = proc.lock_writer(&thread_id)?;
    let mut meta = rollout.meta;
    if let Ok(Some(row)) = proc.store.row(&thread_id) {
        meta.created_ms = row.created_ms;
        meta.updated_ms = row.updated_ms;
    }
    let loaded = Loaded {
        meta,
        turns: rollout.turns,
        materialized: true,
        _writer_lock: writer_lock,
        active: None,
        interrupted: None,
    };
    let response = proc.thread_response(&loaded, include_turns);
    let last_turn = loaded.turns.last().map(|t| t.id.clone());
    proc.threads.insert(thread_id, loaded);
    Ok((response, true, last_turn))
}

pub(super) fn internal(e: io::Error) -> Failure {
    (ErrorCode::INTERNAL_ERROR, e.to_string())
}

/// What a read of a stored thread returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// `thread/read`: the thread, with its turns when asked (`includeTurns`).
    Thread { include_turns: bool },
    /// `thread/turns/list`: a page of its turns, newest first.
    Turns { limit: Option<usize> },
}

pub(super) fn thread_read(proc: &mut Proc, emitter: &Emitter, params: &Value) -> Handled {
    let include_turns = field_bool(params, "includeTurns")?.unwrap_or(false);
    read_thread(proc, emitter, params, Read::Thread { include_turns })
}

/// `thread/turns/list {threadId, limit?}`: one page (no cursors: the fake's threads are short),
/// read the way a full `thread/read` reads the rollout, without its deprecation notice; 0.144.6
/// serves it only under `experimentalApi`.
pub(super) fn thread_turns_list(proc: &mut Proc, emitter: &Emitter, params: &Value) -> Handled {
    if proc.profile.turns_list_is_experimental() && !proc.experimental {
        return Err((
            ErrorCode::INVALID_REQUEST,
            "thread/turns/list requires experimentalApi capability".into(),
        ));
    }
    let limit = params
        .get("limit")
        .and_then(Value::as_u64)
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    read_thread(proc, emitter, params, Read::Turns { limit })
}

fn read_thread(proc: &mut Proc, emitter: &Emitter, params: &Value, what: Read) -> Handled {
    let thread_id = field_str(params, "threadId")?;
    let include_turns = what
        != Read::Thread {
            include_turns: false,
        };
    check_uuid(&thread_id).map_err(|e| {
        (
            ErrorCode::INVALID_REQUEST,
            format!("invalid thread id: {e}"),
        )
    })?;
    let not_loaded = || {
        (
            ErrorCode::INVALID_REQUEST,
            format!("thread not loaded: {thread_id}"),
        )
    };
    let paginated_check = |mode: &HistoryMode, materialized: bool| -> Result<(), Failure> {
        if include_turns && *mode == HistoryMode::Paginated {
            if !proc.profile.serves_paginated() {
                return Err(paginated_unsupported());
            }
            if !materialized {
                return Err((
                    ErrorCode::METHOD_NOT_FOUND,
                    "list_turns is not supported yet".into(),
                ));
            }
        }
        Ok(())
    };
    if let Some(loaded) = proc.threads.get(&thread_id) {
        paginated_check(&loaded.meta.history_mode, loaded.materialized)?;
        let paginated = loaded.meta.history_mode == HistoryMode::Paginated;
        return Ok(Answer::Reply(read_answer(
            proc,
            emitter,
            what,
            paginated,
            &loaded.meta,
            &loaded.turns,
            true,
        )));
    }
    let row = proc.store.row(&thread_id).map_err(internal)?;
    // 0.169.0 reads an indexed thread at its indexed path; 0.144.6 also finds a moved rollout.
    let path = match &row {
        Some(row) if row.path.is_file() || proc.profile == Profile::Current => row.path.clone(),
        Some(row) => proc
            .store
            .find_rollout(&thread_id, true)
            .map_err(internal)?
            .unwrap_or_else(|| row.path.clone()),
        None => proc
            .store
            .find_rollout(&thread_id, true)
            .map_err(internal)?
            .ok_or_else(not_loaded)?,
    };
    match store::read_rollout(&path) {
        Ok(rollout) => {
            let _ = proc
                .store
                .reconcile_mode(&thread_id, &rollout.meta.history_mode);
            paginated_check(&rollout.meta.history_mode, true)?;
            let paginated = rollout.meta.history_mode == HistoryMode::Paginated;
            let mut meta = rollout.meta;
            if let Some(row) = &row {
                meta.created_ms = row.created_ms;
                meta.updated_ms = row.updated_ms;
            }
            Ok(Answer::Reply(read_answer(
                proc,
                emitter,
                what,
                paginated,
                &meta,
                &rollout.turns,
                false,
            )))
        }
        // 0.169.0 answers a metadata-only read from its index when the rollout is gone;
        // 0.144.6 treats the thread as unknown.
        Err(ReadError::Missing) => match row {
            // The list of a legacy thread's turns needs the rollout: not loaded.
            Some(row)
                if what
                    != Read::Thread {
                        include_turns: false,
                    }
                    && HistoryMode::parse(&row.history_mode).is_legacy() =>
            {
                Err(not_loaded())
            }
            Some(row) if proc.profile == Profile::Current => {
                if include_turns {
                    return Err((
                        ErrorCode::INVALID_REQUEST,
                        format!("invalid paginated history lineage for {thread_id}: missing source rollout"),
                    ));
                }
                let meta = ThreadMeta {
                    id: row.id,
                    history_mode: HistoryMode::parse(&row.history_mode),
                    cwd: row.cwd,
                    created_ms: row.created_ms,
                    updated_ms: row.updated_ms,
                    preview: row.preview,
                    path: row.path,
                    cli_version: row.cli_version,
                    developer_instructions: None,
                };
                Ok(Answer::Reply(
                    json!({"thread": proc.thread_json(&meta, None, false)}),
                ))
            }
            _ => Err(not_loaded()),
        },
        Err(e) => Err((
            ErrorCode::INTERNAL_ERROR,
            e.message(&path, proc.profile, false),
        )),
    }
}

/// The answer to a read that found the thread: a full `thread/read` of a paginated thread also
/// says that such reads are deprecated (as 0.171.0 does); a list of turns does not.
fn read_answer(
    proc: &Proc,
    emitter: &Emitter,
    what: Read,
    paginated: bool,
    meta: &ThreadMeta,
    turns: &[TurnRecord],
    loaded: bool,
) -> Value {
    match what {
        Read::Thread { include_turns } => {
            if include_turns && paginated {
                deprecation_notice(emitter);
            }
            let turns = include_turns.then_some(turns);
            json!({"thread": proc.thread_json(meta, turns, loaded)})
        }
        Read::Turns { limit } => {
            let page: Vec<Value> = turns
                .iter()
                .rev()
                .take(limit.unwrap_or(usize::MAX))
                .map(turn_json)
                .collect();
            json!({"data": page, "nextCursor": null, "backwardsCursor": null})
        }
    }
}

fn deprecation_notice(emitter: &Emitter) {
    emitter.notify(
        "deprecationNotice",
        json!({"summary": "Full-history hydration is deprecated for paginated threads; omit \
               `includeTurns` or set it to `false`, then page with `thread/turns/list` and \
               `thread/items/list`.", "details": null}),
    );
}
