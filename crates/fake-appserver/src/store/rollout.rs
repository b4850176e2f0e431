//! The rollout file: one JSON record per line, `{"timestamp", "type", "payload"}`, the first a
//! `session_meta`.
//!
//! The fake writes the records a real codex needs to resume the thread and give its model the
//! earlier turns: `session_meta` (id, timestamp, cwd, originator, cli version, source, model
//! provider, `history_mode`), then per turn `event_msg`/`task_started`, the user's and the
//! assistant's `response_item` messages (carrying the turn id) and `event_msg`/`task_complete`
//! or `turn_aborted`.
//!
//! It reads its own rollouts and those every supported real release writes. A real rollout
//! holds much more (instructions, environment context, token counts, world state); what the
//! fake takes from it is the turns: a turn starts at `task_started`, its user text is the user
//! `response_item` message that carries the turn's id (directly, or in the message's
//! pass-through metadata: context messages carry none), its agent text the assistant message,
//! and it ends at `task_complete` (completed) or `turn_aborted` (interrupted).

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use rethread_protocol::HistoryMode;
use serde_json::{json, Value};

use super::{ReadError, Rollout, ThreadMeta, TurnRecord};
use crate::profile::Profile;
use crate::util::{now_ms, parse_rfc3339_ms, Utc};

/// Writes a new rollout holding only its `session_meta` line.
pub(crate) fn create(meta: &ThreadMeta, profile: Profile) -> io::Result<()> {
    if let Some(dir) = meta.path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut payload = json!({
        "session_id": meta.id,
        "id": meta.id,
        "timestamp": Utc::from_ms(meta.created_ms).rfc3339(),
        "cwd": meta.cwd,
        "originator": "rethread-fake",
        "cli_version": meta.cli_version,
        "source": "vscode",
        "model_provider": "mock",
    });
    if profile.has_history_mode() {
        payload["history_mode"] = json!(meta.history_mode.as_str());
    }
    if let Some(instructions) = &meta.developer_instructions {
        payload["developer_instructions"] = json!(instructions);
    }
    let line = record(0, "session_meta", payload);
    let mut file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&meta.path)?;
    file.write_all(line.as_bytes())?;
    file.sync_data()
}

/// Appends one turn's records.
pub(crate) fn append_turn(path: &Path, turn: &TurnRecord) -> io::Result<()> {
    let mut lines = String::new();
    lines.push_str(&record(
        1,
        "event_msg",
        json!({"type": "task_started", "turn_id": turn.id, "started_ms": turn.started_ms}),
    ));
    lines.push_str(&record(
        2,
        "response_item",
        json!({"type": "message", "role": "user", "turn_id": turn.id,
               "content": [{"type": "input_text", "text": turn.user_text}]}),
    ));
    if let Some(text) = &turn.agent_text {
        lines.push_str(&record(
            3,
            "response_item",
            json!({"type": "message", "role": "assistant", "turn_id": turn.id,
                   "content": [{"type": "output_text", "text": text}]}),
        ));
    }
    let end = if turn.status == "completed" {
        "task_complete"
    } else {
        "turn_aborted"
    };
    lines.push_str(&record(
        4,
        "event_msg",
        json!({"type": end, "turn_id": turn.id, "status": turn.status,
               "started_ms": turn.started_ms, "completed_ms": turn.completed_ms}),
    ));
    let mut file = OpenOptions::new().append(true).open(path)?;
    file.write_all(lines.as_bytes())?;
    file.sync_data()
}

/// Reads a rollout: its `session_meta` and its turns. A torn or unparseable line after the
/// first is skipped (a writer killed mid-append leaves earlier turns intact).
pub(crate) fn read(path: &Path) -> Result<Rollout, ReadError> {
    let text = match std::fs::read(path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ReadError::Missing),
        Err(e) => return Err(ReadError::Io(e.to_string())),
    };
    let mut lines = text.split('\n');
    let first = lines.next().unwrap_or_default();
    let meta_line: Value = serde_json::from_str(first).map_err(|_| ReadError::Empty)?;
    if meta_line.get("type").and_then(Value::as_str) != Some("session_meta") {
        return Err(ReadError::Empty);
    }
    let payload = meta_line.get("payload").cloned().unwrap_or_default();
    let history_mode = match payload.get("history_mode") {
        None | Some(Value::Null) => HistoryMode::Legacy,
        Some(Value::String(mode)) => match HistoryMode::parse(mode) {
            HistoryMode::Unknown(other) => return Err(ReadError::UnknownMode(other)),
            known => known,
        },
        Some(other) => return Err(ReadError::UnknownMode(other.to_string())),
    };
    let str_of = |key: &str| payload.get(key).and_then(Value::as_str).map(str::to_string);
    let id = str_of("id").ok_or(ReadError::Empty)?;
    let created_ms = str_of("timestamp")
        .and_then(|t| parse_rfc3339_ms(&t))
        .unwrap_or(0);
    let mut meta = ThreadMeta {
        id,
        history_mode,
        cwd: str_of("cwd").unwrap_or_default(),
        created_ms,
        updated_ms: created_ms,
        preview: String::new(),
        path: path.to_path_buf(),
        cli_version: str_of("cli_version").unwrap_or_default(),
        developer_instructions: str_of("developer_instructions"),
    };
    let mut turns = Turns::default();
    for line in lines {
        if let Ok(value) = serde_json::from_str::<Value>(line) {
            turns.record(&value);
        }
    }
    let turns = turns.0;
    if let Some(first) = turns.first() {
        meta.preview = first.user_text.clone();
    }
    if let Some(last) = turns.iter().rev().find(|t| t.completed_ms > 0) {
        meta.updated_ms = meta.updated_ms.max(last.completed_ms);
    }
    Ok(Rollout { meta, turns })
}

/// The turns of a rollout, built record by record.
#[derive(Debug, Default)]
struct Turns(Vec<TurnRecord>);

impl Turns {
    fn record(&mut self, value: &Value) {
        let payload = value.get("payload").cloned().unwrap_or_default();
        let kind = payload
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let ms = |ms_key: &str, secs_key: &str| {
            payload
                .get(ms_key)
                .and_then(Value::as_u64)
                .or_else(|| {
                    payload
                        .get(secs_key)
                        .and_then(Value::as_u64)
                        .map(|s| s * 1000)
                })
                .unwrap_or(0)
        };
        match (value.get("type").and_then(Value::as_str), kind) {
            (Some("event_msg"), "task_started") => {
                let id = turn_id_of(&payload).unwrap_or_default();
                let started_ms = ms("started_ms", "started_at");
                self.turn(&id).started_ms = started_ms;
            }
            (Some("response_item"), "message") => {
                // Messages without a turn id are context codex adds, not the conversation.
                let Some(id) = turn_id_of(&payload) else {
                    return;
                };
                let text = text_of(&payload);
                match payload.get("role").and_then(Value::as_str) {
                    Some("user") => {
                        let turn = self.turn(&id);
                        if turn.user_text.is_empty() {
                            turn.user_text = text;
                        }
                    }
                    Some("assistant") => self.turn(&id).agent_text = Some(text),
                    _ => {}
                }
            }
            (Some("event_msg"), "task_complete" | "turn_aborted") => {
                let id = turn_id_of(&payload);
                let Some(turn) = (match id {
                    Some(id) => self.0.iter_mut().rev().find(|t| t.id == id),
                    None => self.0.last_mut(),
                }) else {
                    return;
                };
                let default = if kind == "task_complete" {
                    "completed"
                } else {
                    "interrupted"
                };
                turn.status = payload
                    .get("status")
                    .and_then(Value::as_str)
                    .unwrap_or(default)
                    .to_string();
                let started_ms = ms("started_ms", "started_at");
                if started_ms > 0 {
                    turn.started_ms = started_ms;
                }
                turn.completed_ms = ms("completed_ms", "completed_at");
            }
            _ => {}
        }
    }

    /// The turn `id`, added (in progress) when it is not known yet.
    fn turn(&mut self, id: &str) -> &mut TurnRecord {
        let index = match self.0.iter().rposition(|t| t.id == id) {
            Some(index) => index,
            None => {
                self.0.push(TurnRecord {
                    id: id.to_string(),
                    user_text: String::new(),
                    agent_text: None,
                    status: "inProgress".into(),
                    started_ms: 0,
                    completed_ms: 0,
                });
                self.0.len() - 1
            }
        };
        &mut self.0[index]
    }
}

/// The turn a record belongs to: `turn_id` (the fake's records, codex's events) or the
/// pass-through metadata of codex's messages.
fn turn_id_of(payload: &Value) -> Option<String> {
    payload
        .get("turn_id")
        .or_else(|| payload.pointer("/internal_chat_message_metadata_passthrough/turn_id"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// The text parts of a message, joined with `\n`.
fn text_of(payload: &Value) -> String {
    payload
        .get("content")
        .and_then(Value::as_array)
        .map(|parts| {
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

fn record(ordinal: u64, kind: &str, payload: Value) -> String {
    let mut line = json!({
        "timestamp": Utc::from_ms(now_ms()).rfc3339(),
        "ordinal": ordinal,
        "type": kind,
        "payload": payload,
    })
    .to_string();
    line.push('\n');
    line
}

/// Every `rollout-*.jsonl` file under `dir`, recursively.
pub(crate) fn all(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("rollout-") && n.ends_with(".jsonl"))
            {
                out.push(path);
            }
        }
    }
    out
}

/// The first file under `dir` whose name ends with `suffix`.
pub(crate) fn scan_for(dir: &Path, suffix: &str) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = scan_for(&path, suffix) {
                return Some(found);
            }
        } else if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with(suffix))
        {
            return Some(path);
        }
    }
    None
}
