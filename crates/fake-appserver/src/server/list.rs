//! `thread/list`: the threads whose rollout can be read, one page at a time.
//!
//! As codex answers it (observed on 0.144.6, 0.169.0 and 0.171.0):
//! - ordered by `sortKey` (`created_at`, the default, or `updated_at`), newest first unless
//!   `sortDirection` is `asc`; ties by id;
//! - `limit` threads per page (25 when absent, at most 100; 0 counts as 1); a negative or
//!   non-integer limit is refused like any mistyped field (`expected u32`);
//! - `nextCursor` is an opaque string when more threads follow the page and `null` on the last
//!   page; passing it back as `cursor` answers the next page. `backwardsCursor` is a string (the
//!   time of the page's first thread) whenever the page is not empty. A cursor the server cannot
//!   read is refused: `-32600 invalid cursor: <cursor>`.
//!
//! The fake's cursor is `<time of the last thread, RFC 3339>|<its id>`, the shape 0.169.0 and
//! 0.171.0 use for the creation order (0.144.6 leaves out the id; the fake keeps it, so threads
//! created within one second are never skipped).

use std::cmp::Ordering;
use std::collections::HashMap;

use rethread_protocol::ErrorCode;
use serde_json::{json, Value};

use super::params::{invalid, kind_of, Answer, Failure, Handled};
use super::process::Proc;
use super::threads::internal;
use crate::profile::Profile;
use crate::store::{self, ThreadMeta};
use crate::util::{parse_rfc3339_ms, Utc};

/// Threads per page when `limit` is absent.
const DEFAULT_LIMIT: usize = 25;
/// The largest page.
const MAX_LIMIT: usize = 100;

/// What a thread is ordered by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SortKey {
    /// Creation time, to the second (as codex indexes it).
    Created,
    /// Last update, to the millisecond.
    Updated,
}

impl SortKey {
    /// The thread's position in this order: a time in ms (at this key's precision) and its id.
    fn position(self, meta: &ThreadMeta) -> (u64, String) {
        let ms = match self {
            SortKey::Created => meta.created_ms / 1000 * 1000,
            SortKey::Updated => meta.updated_ms,
        };
        (ms, meta.id.clone())
    }

    /// The time part of a cursor.
    fn stamp(self, ms: u64) -> String {
        let text = Utc::from_ms(ms).rfc3339();
        match self {
            // `2026-11-30T21:22:12.000Z` -> `2026-11-30T21:22:12Z`
            SortKey::Created => format!("{}Z", &text[..19]),
            SortKey::Updated => text,
        }
    }
}

/// A page request: its order, where it starts and how long it is.
#[derive(Debug)]
struct PageRequest {
    key: SortKey,
    ascending: bool,
    /// Start after this position (a time, and an id unless the cursor had none).
    after: Option<(u64, Option<String>)>,
    limit: usize,
}

impl PageRequest {
    fn from_params(params: &Value) -> Result<PageRequest, Failure> {
        let limit = match params.get("limit") {
            None | Some(Value::Null) => DEFAULT_LIMIT,
            Some(Value::Number(n)) => match n.as_u64().filter(|n| *n <= u64::from(u32::MAX)) {
                Some(n) => (n as usize).clamp(1, MAX_LIMIT),
                None => {
                    return Err(invalid(&format!(
                        "invalid value: integer `{n}`, expected u32"
                    )))
                }
            },
            Some(other) => {
                return Err(invalid(&format!(
                    "invalid type: {}, expected u32",
                    kind_of(other)
                )))
            }
        };
        let key = match params.get("sortKey").and_then(Value::as_str) {
            Some("updated_at") => SortKey::Updated,
            _ => SortKey::Created,
        };
        let ascending = params.get("sortDirection").and_then(Value::as_str) == Some("asc");
        let after = match params.get("cursor") {
            None | Some(Value::Null) => None,
            Some(Value::String(cursor)) => Some(parse_cursor(cursor).ok_or_else(|| {
                (
                    ErrorCode::INVALID_REQUEST,
                    format!("invalid cursor: {cursor}"),
                )
            })?),
            Some(other) => {
                return Err(invalid(&format!(
                    "invalid type: {}, expected a string",
                    kind_of(other)
                )))
            }
        };
        Ok(PageRequest {
            key,
            ascending,
            after,
            limit,
        })
    }

    /// Whether `position` comes after the cursor in this order.
    fn is_after_cursor(&self, position: &(u64, String)) -> bool {
        let Some((ms, id)) = &self.after else {
            return true;
        };
        let ordering = match id {
            Some(id) => (position.0, &position.1).cmp(&(*ms, id)),
            None => position.0.cmp(ms),
        };
        if self.ascending {
            ordering == Ordering::Greater
        } else {
            ordering == Ordering::Less
        }
    }
}

/// `<RFC 3339 time>` or `<RFC 3339 time>|<id>`.
fn parse_cursor(cursor: &str) -> Option<(u64, Option<String>)> {
    let (stamp, id) = match cursor.split_once('|') {
        Some((stamp, id)) if !id.is_empty() => (stamp, Some(id.to_string())),
        Some(_) => return None,
        None => (cursor, None),
    };
    Some((parse_rfc3339_ms(stamp)?, id))
}

/// Answers `thread/list`.
pub(super) fn thread_list(proc: &mut Proc, params: &Value) -> Handled {
    let page = PageRequest::from_params(params)?;
    let rows: HashMap<String, store::Row> = proc
        .store
        .rows()
        .map_err(internal)?
        .into_iter()
        .map(|row| (row.id.clone(), row))
        .collect();
    let mut listed: HashMap<String, ThreadMeta> = HashMap::new();
    // Wherever under `sessions/` a rollout lies: codex finds one moved to another day's folder.
    for path in store::all_rollouts(&proc.store.home().join("sessions")) {
        // A thread whose rollout cannot be read (empty, garbage, unknown mode) is left out:
        // never listed with a guessed mode.
        let Ok(rollout) = store::read_rollout(&path) else {
            continue;
        };
        let mut meta = rollout.meta;
        if let Some(row) = rows.get(&meta.id) {
            let _ = proc.store.reconcile_mode(&meta.id, &meta.history_mode);
            if row.created_ms > 0 {
                meta.created_ms = row.created_ms;
            }
            meta.updated_ms = meta.updated_ms.max(row.updated_ms);
        }
        listed.entry(meta.id.clone()).or_insert(meta);
    }
    let mut ordered: Vec<((u64, String), ThreadMeta)> = listed
        .into_values()
        .map(|meta| (page.key.position(&meta), meta))
        .filter(|(position, _)| page.is_after_cursor(position))
        .collect();
    ordered.sort_by(|a, b| {
        if page.ascending {
            a.0.cmp(&b.0)
        } else {
            b.0.cmp(&a.0)
        }
    });
    let more = ordered.len() > page.limit;
    ordered.truncate(page.limit);
    let next_cursor = match ordered.last() {
        Some(((ms, id), _)) if more => json!(format!("{}|{id}", page.key.stamp(*ms))),
        _ => Value::Null,
    };
    let backwards_cursor = match ordered.first() {
        Some((_, meta)) => json!(Utc::from_ms(match page.key {
            SortKey::Created => meta.created_ms,
            SortKey::Updated => meta.updated_ms,
        })
        .rfc3339()),
        None => Value::Null,
    };
    let data: Vec<Value> = ordered
        .iter()
        .map(|(_, meta)| proc.thread_json(meta, None, proc.threads.contains_key(&meta.id)))
        .collect();
    let mut result =
        json!({"data": data, "nextCursor": next_cursor, "backwardsCursor": backwards_cursor});
    if proc.profile == Profile::Current {
        result["readStates"] = json!({});
    }
    Ok(Answer::Reply(result))
}
