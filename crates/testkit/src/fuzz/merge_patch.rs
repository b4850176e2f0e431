//! Target `merge_patch`: sequences of `model_config` merge-patches of arbitrary JSON (with
//! commits, give-ups and the host's own retirements in between) against a plain model.
//!
//! Properties, checked after every step:
//! - The config returned by `patch_config` and the stored one equal the model's RFC 7396
//!   merge; keys a patch does not name are never lost.
//! - The binding always agrees with `model_config.codex_thread_id`, which is the store's view:
//!   a patch naming it is `InvalidInput`, and then nothing at all is written (not even the
//!   session); a retired thread is never bound.
//! - A give-up of the bound thread makes the session given up from it, a host's retire of it
//!   unbinds it; a published commit binds anew.
//! - `bound_at_ms` is kept while the binding names the same thread; row counts only grow by
//!   the rows committed.
//! - When the input asks for it, every step is replayed on the redb backend (relaxed
//!   durability, on a temporary file) and must give the same answers and records: JSON that
//!   does not survive the backend's encoding would show up here.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use rethread_store::{
    BindingStore, OpenOptions, Retirement, SessionRecord, StoreError, TurnCommit,
    CODEX_THREAD_ID_KEY,
};
use serde_json::{json, Map, Number, Value};

use crate::fuzz::input::Input;

const SESSIONS: [&str; 2] = ["a", "b"];
const THREADS: [&str; 3] = ["t0", "t1", "t2"];
const KEYS: [&str; 7] = ["k0", "k1", "k2", CODEX_THREAD_ID_KEY, "", "ü", "k0\u{0}"];

#[derive(Debug, Default, Clone)]
struct ModelSession {
    config: Map<String, Value>,
    binding: Option<String>,
    given_up: Option<String>,
    retired: Vec<String>,
    rows: u64,
}

/// The model's merge: RFC 7396 section 2, written from the RFC's pseudo-code.
pub fn rfc7396(target: Value, patch: &Value) -> Value {
    let Value::Object(patch) = patch else {
        return patch.clone();
    };
    let mut target = match target {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            let current = target.remove(key).unwrap_or(Value::Null);
            target.insert(key.clone(), rfc7396(current, value));
        }
    }
    Value::Object(target)
}

fn json_value(input: &mut Input<'_>, depth: u32) -> Value {
    match input.below(if depth >= 3 { 7 } else { 9 }) {
        0 => Value::Null,
        1 => Value::Bool(input.byte() & 1 == 1),
        2 => json!(input.byte() as i64 - 128),
        3 => match input.below(4) {
            0 => json!(u64::MAX),
            1 => json!(i64::MIN),
            2 => json!(input.u32() as u64 * 1_000_003),
            _ => json!(-(input.u32() as i64)),
        },
        4 => {
            let bits = u64::from(input.u32()) << 32 | u64::from(input.u32());
            Number::from_f64(f64::from_bits(bits))
                .map(Value::Number)
                .unwrap_or(Value::Null)
        }
        5 => Value::String(input.pick(&THREADS).to_string()),
        6 => Value::String(String::from_utf8_lossy(input.chunk(12)).into_owned()),
        7 => {
            let n = input.below(4);
            Value::Array((0..n).map(|_| json_value(input, depth + 1)).collect())
        }
        _ => Value::Object(json_object(input, depth + 1)),
    }
}

fn json_object(input: &mut Input<'_>, depth: u32) -> Map<String, Value> {
    let n = input.below(5);
    let mut map = Map::new();
    for _ in 0..n {
        let key = input.pick(&KEYS).to_string();
        let value = json_value(input, depth);
        map.insert(key, value);
    }
    map
}

#[derive(Debug, Clone)]
enum Op {
    Patch(&'static str, Map<String, Value>),
    Commit(&'static str, &'static str, usize),
    /// The give-up (`Retirement::Lost`).
    Retire(&'static str, &'static str),
    /// The host's own retire (`Retirement::Ended`).
    End(&'static str, &'static str),
}

/// The store's id of thread `t` of session `s`: a thread belongs to one session.
fn thread_of(s: &str, t: &str) -> String {
    format!("{s}.{t}")
}

fn op(input: &mut Input<'_>) -> Op {
    let session = *input.pick(&SESSIONS);
    match input.below(6) {
        0 | 1 => Op::Patch(session, json_object(input, 0)),
        2 => {
            // Arbitrary JSON text; anything that is an object is a patch.
            let text = input.chunk(200);
            match serde_json::from_slice::<Value>(text) {
                Ok(Value::Object(map)) => Op::Patch(session, map),
                _ => Op::Patch(session, Map::new()),
            }
        }
        3 => Op::Commit(session, THREADS[input.below(3)], input.below(3)),
        4 => Op::Retire(session, THREADS[input.below(3)]),
        _ => Op::End(session, THREADS[input.below(3)]),
    }
}

/// What one step answered, with time stamps left out.
#[derive(Debug, PartialEq)]
enum Answer {
    Config(Map<String, Value>),
    Published(bool, u64, u64),
    Bool(bool),
    Unit,
    InvalidInput,
    Other(String),
}

fn answer_of<T>(result: Result<T, StoreError>, ok: impl FnOnce(T) -> Answer) -> Answer {
    match result {
        Ok(v) => ok(v),
        Err(StoreError::InvalidInput(_)) => Answer::InvalidInput,
        Err(other) => Answer::Other(other.to_string()),
    }
}

async fn apply(store: &BindingStore, prefix: &str, op: &Op) -> Answer {
    match op {
        Op::Patch(s, patch) => answer_of(
            store
                .patch_config(&format!("{prefix}{s}"), patch.clone(), None)
                .await,
            Answer::Config,
        ),
        Op::Commit(s, t, n) => {
            let rows = (0..*n).map(|i| json!({"i": i, "t": t})).collect();
            let commit = TurnCommit::new(format!("{prefix}{s}"), thread_of(s, t), rows);
            answer_of(store.commit_turn(commit).await, |o| {
                Answer::Published(o.is_published(), o.first_seq(), o.row_count())
            })
        }
        Op::Retire(s, t) | Op::End(s, t) => {
            let retirement = match op {
                Op::Retire(..) => Retirement::Lost {
                    reason: "gone".to_string(),
                    message: "fuzz".to_string(),
                },
                _ => Retirement::Ended,
            };
            let session = format!("{prefix}{s}");
            answer_of(
                store
                    .retire_thread(&session, &thread_of(s, t), retirement, None)
                    .await,
                |()| Answer::Unit,
            )
        }
    }
}

/// The model's answer, and the model updated.
fn model_apply(model: &mut BTreeMap<&'static str, ModelSession>, op: &Op) -> Answer {
    match op {
        Op::Patch(s, patch) => {
            if patch.contains_key(CODEX_THREAD_ID_KEY) {
                // The store's view of the binding: hosts cannot write it.
                return Answer::InvalidInput;
            }
            let current = model.get(s).cloned().unwrap_or_default();
            let merged = match rfc7396(
                Value::Object(current.config.clone()),
                &Value::Object(patch.clone()),
            ) {
                Value::Object(map) => map,
                _ => unreachable!("merging an object patch yields an object"),
            };
            let entry = model.entry(s).or_default();
            entry.config = merged.clone();
            Answer::Config(merged)
        }
        Op::Commit(s, t, n) => {
            let thread = thread_of(s, t);
            let entry = model.entry(s).or_default();
            let first = entry.rows;
            entry.rows += *n as u64;
            let published = !entry.retired.contains(&thread);
            if published {
                entry
                    .config
                    .insert(CODEX_THREAD_ID_KEY.to_string(), json!(thread));
                entry.binding = Some(thread);
                entry.given_up = None;
            }
            Answer::Published(published, first, entry.rows)
        }
        Op::Retire(s, t) | Op::End(s, t) => {
            let thread = thread_of(s, t);
            let entry = model.entry(s).or_default();
            if !entry.retired.contains(&thread) {
                entry.retired.push(thread.clone());
            }
            if entry.binding.as_ref() == Some(&thread) {
                entry.binding = None;
                entry.config.remove(CODEX_THREAD_ID_KEY);
                if matches!(op, Op::Retire(..)) {
                    entry.given_up = Some(thread);
                }
            }
            Answer::Unit
        }
    }
}

fn check_record(
    what: &str,
    record: Option<&SessionRecord>,
    model: Option<&ModelSession>,
    before: Option<&SessionRecord>,
) {
    match (record, model) {
        (None, None) => {}
        (Some(r), Some(m)) => {
            assert_eq!(r.model_config, m.config, "{what}: model_config differs");
            assert_eq!(
                r.thread_id(),
                m.binding.as_deref(),
                "{what}: binding differs"
            );
            assert_eq!(
                r.given_up().map(|g| g.thread_id.as_str()),
                m.given_up.as_deref(),
                "{what}: give-up differs"
            );
            assert_eq!(
                r.retired_threads, m.retired,
                "{what}: retired threads differ"
            );
            assert_eq!(r.row_count, m.rows, "{what}: row count differs");
            if let (Some(b), Some(prev)) = (r.binding(), before.and_then(|p| p.binding())) {
                if b.thread_id == prev.thread_id {
                    assert_eq!(
                        b.bound_at_ms, prev.bound_at_ms,
                        "{what}: bound_at_ms changed while the binding kept its thread"
                    );
                }
            }
        }
        (r, m) => panic!("{what}: store has {r:?}, model has {m:?}"),
    }
}

struct Shared {
    runtime: tokio::runtime::Runtime,
    redb: BindingStore,
    _dir: tempfile::TempDir,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("merge.redb");
        let options = OpenOptions::new().durability(rethread_store::Durability::Relaxed);
        let redb = runtime
            .block_on(BindingStore::redb(&path, options))
            .expect("open redb");
        Shared {
            runtime,
            redb,
            _dir: dir,
        }
    })
}

/// Runs one input.
pub fn run(data: &[u8]) {
    static EXEC: AtomicU64 = AtomicU64::new(0);
    let mut input = Input::new(data);
    let durable = input.byte() & 1 == 1;
    let mut ops = Vec::new();
    while !input.is_empty() && ops.len() < 24 {
        ops.push(op(&mut input));
    }
    let shared = shared();
    let prefix = format!("x{}/", EXEC.fetch_add(1, Ordering::Relaxed));
    shared.runtime.block_on(async {
        let memory = BindingStore::memory();
        let mut model: BTreeMap<&'static str, ModelSession> = BTreeMap::new();
        let mut before: BTreeMap<&'static str, Option<SessionRecord>> = BTreeMap::new();
        for (step, op) in ops.iter().enumerate() {
            let expected = model_apply(&mut model, op);
            let got = apply(&memory, "", op).await;
            assert_eq!(got, expected, "step {step} {op:?}: memory store answer");
            if durable {
                let got = apply(&shared.redb, &prefix, op).await;
                assert_eq!(got, expected, "step {step} {op:?}: redb answer");
            }
            for s in SESSIONS {
                let record = memory.session(s).await.expect("memory read");
                let prev = before.get(s).cloned().flatten();
                check_record(
                    &format!("step {step} {op:?} memory {s}"),
                    record.as_ref(),
                    model.get(s),
                    prev.as_ref(),
                );
                if durable {
                    let on_disk = shared
                        .redb
                        .session(&format!("{prefix}{s}"))
                        .await
                        .expect("redb read");
                    check_record(
                        &format!("step {step} {op:?} redb {s}"),
                        on_disk.as_ref(),
                        model.get(s),
                        None,
                    );
                }
                before.insert(s, record);
            }
        }
        if durable {
            for s in SESSIONS {
                let _ = shared.redb.delete_session(&format!("{prefix}{s}")).await;
            }
        }
    });
}
