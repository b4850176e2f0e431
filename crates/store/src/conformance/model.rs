//! A property test against a plain model.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRng, TestRunner};
use serde_json::{json, Map, Value};

use super::{turn, unique_id};
use crate::{
    BindingStore, BindingStoreExt, ImportOutcome, StoreError, CODEX_THREAD_ID_KEY,
    PENDING_NOTICE_KEY,
};

/// One operation of the model test, over small domains (3 sessions, 4 threads, few keys).
#[derive(Clone, Debug)]
pub enum Op {
    /// `commit_turn` with `rows` rows.
    Commit {
        /// Session index.
        s: usize,
        /// Thread index.
        t: usize,
        /// Number of rows.
        rows: usize,
    },
    /// `patch_config` with these `(key, value)` entries.
    Patch {
        /// Session index.
        s: usize,
        /// Entries of the patch.
        entries: Vec<(String, Value)>,
    },
    /// `drop_binding_if`.
    DropIf {
        /// Session index.
        s: usize,
        /// Thread index.
        t: usize,
    },
    /// `retire_thread`.
    Retire {
        /// Session index.
        s: usize,
        /// Thread index.
        t: usize,
    },
    /// `delete_session`.
    Delete {
        /// Session index.
        s: usize,
    },
    /// `export_session`, `delete_session`, `import_session` twice: must leave it unchanged.
    ReExport {
        /// Session index.
        s: usize,
    },
    /// `rows` of a range.
    Rows {
        /// Session index.
        s: usize,
        /// Range start.
        start: u64,
        /// Range length.
        len: u64,
    },
    /// `list_sessions` after session `after` (or from the case's start).
    List {
        /// Session index to list after, if any.
        after: Option<usize>,
        /// Page size.
        limit: usize,
    },
}

const THREADS: usize = 4;

fn thread_name(t: usize) -> String {
    format!("th{t}")
}

fn patch_value() -> impl Strategy<Value = (String, Value)> {
    let plain_key = prop_oneof![Just("a"), Just("b"), Just("c")].prop_map(str::to_string);
    let plain_value = prop_oneof![
        Just(Value::Null),
        (0..3i64).prop_map(|i| json!(i)),
        (prop::option::of(0..2i64), prop::option::of(0..2i64))
            .prop_map(|(x, y)| json!({"x": x, "y": y})),
    ];
    prop_oneof![
        4 => (plain_key, plain_value),
        1 => prop_oneof![
            (0..THREADS).prop_map(|t| json!(thread_name(t))),
            Just(Value::Null),
            Just(json!(17)),
        ]
        .prop_map(|v| (CODEX_THREAD_ID_KEY.to_string(), v)),
    ]
}

/// The strategy for one [`Op`].
pub fn op_strategy() -> impl Strategy<Value = Op> {
    let s = 0..3usize;
    prop_oneof![
        6 => (s.clone(), 0..THREADS, 0..4usize).prop_map(|(s, t, rows)| Op::Commit { s, t, rows }),
        4 => (s.clone(), prop::collection::vec(patch_value(), 0..4))
            .prop_map(|(s, entries)| Op::Patch { s, entries }),
        2 => (s.clone(), 0..THREADS).prop_map(|(s, t)| Op::DropIf { s, t }),
        2 => (s.clone(), 0..THREADS).prop_map(|(s, t)| Op::Retire { s, t }),
        1 => s.clone().prop_map(|s| Op::Delete { s }),
        1 => s.clone().prop_map(|s| Op::ReExport { s }),
        2 => (s.clone(), 0..8u64, 0..6u64).prop_map(|(s, start, len)| Op::Rows { s, start, len }),
        1 => (prop::option::of(s), 1..4usize).prop_map(|(after, limit)| Op::List { after, limit }),
    ]
}

#[derive(Clone, Debug, Default, PartialEq)]
struct ModelSession {
    config: Map<String, Value>,
    thread: Option<String>,
    codex_home: Option<String>,
    rows: Vec<Value>,
    retired: Vec<String>,
}

/// The plain model: written independently of the stores' shared logic on purpose.
#[derive(Debug, Default)]
struct Model {
    sessions: BTreeMap<String, ModelSession>,
}

fn model_merge(target: &mut Map<String, Value>, patch: &Map<String, Value>) {
    for (k, v) in patch {
        if v.is_null() {
            target.remove(k);
        } else if let Some(p) = v.as_object() {
            let mut inner = target
                .get(k)
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            model_merge(&mut inner, p);
            target.insert(k.clone(), Value::Object(inner));
        } else {
            target.insert(k.clone(), v.clone());
        }
    }
}

/// What an operation returned, reduced to what the model can predict.
#[derive(Debug, PartialEq)]
enum Seen {
    Commit {
        first_seq: u64,
        row_count: u64,
        published: bool,
    },
    Config(Map<String, Value>),
    Bool(bool),
    Unit,
    Rows(Vec<(u64, Value)>),
    List(Vec<String>),
    Refused(&'static str),
}

fn refused(e: &StoreError) -> Seen {
    match e {
        StoreError::InvalidInput(_) => Seen::Refused("invalid"),
        StoreError::RetiredThread { .. } => Seen::Refused("retired"),
        StoreError::Conflict { .. } => Seen::Refused("conflict"),
        other => panic!("unexpected store failure: {other}"),
    }
}

impl Model {
    fn apply(&mut self, ids: &[String], op: &Op) -> Seen {
        match op {
            Op::Commit { s, t, rows } => {
                let sess = self.sessions.entry(ids[*s].clone()).or_default();
                let first_seq = sess.rows.len() as u64;
                sess.rows.extend(row_bodies(*s, first_seq, *rows));
                let thread = thread_name(*t);
                let published = !sess.retired.contains(&thread);
                if published {
                    sess.config
                        .insert(CODEX_THREAD_ID_KEY.into(), json!(thread));
                    sess.config.remove(PENDING_NOTICE_KEY);
                    sess.codex_home = Some(format!("/codex-home/{thread}"));
                    sess.thread = Some(thread);
                }
                Seen::Commit {
                    first_seq,
                    row_count: sess.rows.len() as u64,
                    published,
                }
            }
            Op::Patch { s, entries } => {
                let patch: Map<String, Value> = entries.iter().cloned().collect();
                let current = self.sessions.get(&ids[*s]).cloned().unwrap_or_default();
                let mut config = current.config.clone();
                model_merge(&mut config, &patch);
                let mut next = current.clone();
                match config.get(CODEX_THREAD_ID_KEY) {
                    None => {
                        next.thread = None;
                        next.codex_home = None;
                    }
                    Some(Value::String(t)) if current.retired.contains(t) => {
                        return Seen::Refused("retired")
                    }
                    Some(Value::String(t)) => {
                        if current.thread.as_ref() != Some(t) {
                            next.thread = Some(t.clone());
                            next.codex_home = None;
                        }
                    }
                    Some(_) => return Seen::Refused("invalid"),
                }
                next.config = config.clone();
                self.sessions.insert(ids[*s].clone(), next);
                Seen::Config(config)
            }
            Op::DropIf { s, t } => {
                let thread = thread_name(*t);
                match self.sessions.get_mut(&ids[*s]) {
                    Some(sess) if sess.thread.as_ref() == Some(&thread) => {
                        sess.thread = None;
                        sess.codex_home = None;
                        sess.config.remove(CODEX_THREAD_ID_KEY);
                        Seen::Bool(true)
                    }
                    _ => Seen::Bool(false),
                }
            }
            Op::Retire { s, t } => {
                let thread = thread_name(*t);
                let sess = self.sessions.entry(ids[*s].clone()).or_default();
                if !sess.retired.contains(&thread) {
                    sess.retired.push(thread.clone());
                }
                if sess.thread.as_ref() == Some(&thread) {
                    sess.thread = None;
                    sess.codex_home = None;
                    sess.config.remove(CODEX_THREAD_ID_KEY);
                }
                if sess.thread.is_none() {
                    sess.config
                        .insert(PENDING_NOTICE_KEY.into(), json!({ "thread_id": thread }));
                }
                Seen::Unit
            }
            Op::Delete { s } => Seen::Bool(self.sessions.remove(&ids[*s]).is_some()),
            Op::ReExport { .. } => Seen::Unit,
            Op::Rows { s, start, len } => {
                let rows = self
                    .sessions
                    .get(&ids[*s])
                    .map(|x| x.rows.clone())
                    .unwrap_or_default();
                Seen::Rows(
                    rows.into_iter()
                        .enumerate()
                        .map(|(i, b)| (i as u64, b))
                        .filter(|(i, _)| *i >= *start && *i < start + len)
                        .collect(),
                )
            }
            Op::List { after, limit } => {
                let lower = after
                    .map(|a| ids[a].clone())
                    .unwrap_or_else(|| list_floor(ids));
                let names: Vec<String> = self
                    .sessions
                    .keys()
                    .filter(|k| **k > lower)
                    .take(*limit)
                    .cloned()
                    .collect();
                Seen::List(names)
            }
        }
    }
}

fn row_bodies(s: usize, first_seq: u64, n: usize) -> Vec<Value> {
    (0..n as u64)
        .map(|i| json!({"s": s, "seq": first_seq + i}))
        .collect()
}

/// The `after` key just below this case's session ids.
fn list_floor(ids: &[String]) -> String {
    let mut floor = ids[0].clone();
    floor.truncate(floor.len() - 1);
    floor
}

async fn apply_to_store(store: &dyn BindingStore, ids: &[String], op: &Op) -> Seen {
    match op {
        Op::Commit { s, t, rows } => {
            let sid = &ids[*s];
            let first = store.session(sid).await.unwrap().map_or(0, |r| r.row_count);
            match store
                .commit_turn(turn(sid, &thread_name(*t), row_bodies(*s, first, *rows)))
                .await
            {
                Ok(out) => Seen::Commit {
                    first_seq: out.first_seq(),
                    row_count: out.row_count(),
                    published: out.is_published(),
                },
                Err(e) => refused(&e),
            }
        }
        Op::Patch { s, entries } => {
            match store
                .patch_config(&ids[*s], entries.iter().cloned().collect(), None)
                .await
            {
                Ok(config) => Seen::Config(config),
                Err(e) => refused(&e),
            }
        }
        Op::DropIf { s, t } => Seen::Bool(
            store
                .drop_binding_if(&ids[*s], &thread_name(*t), None)
                .await
                .unwrap(),
        ),
        Op::Retire { s, t } => {
            store
                .retire_thread(&ids[*s], &thread_name(*t), None)
                .await
                .unwrap();
            Seen::Unit
        }
        Op::Delete { s } => Seen::Bool(store.delete_session(&ids[*s]).await.unwrap()),
        Op::ReExport { s } => {
            if let Some(export) = store.export_session(&ids[*s]).await.unwrap() {
                assert!(store.delete_session(&ids[*s]).await.unwrap());
                assert_eq!(
                    store.import_session(export.clone()).await.unwrap(),
                    ImportOutcome::Imported
                );
                assert_eq!(
                    store.import_session(export.clone()).await.unwrap(),
                    ImportOutcome::AlreadyPresent
                );
                assert_eq!(store.export_session(&ids[*s]).await.unwrap(), Some(export));
            }
            Seen::Unit
        }
        Op::Rows { s, start, len } => Seen::Rows(
            store
                .rows(&ids[*s], *start..start + len)
                .await
                .unwrap()
                .into_iter()
                .map(|r| (r.seq, r.body))
                .collect(),
        ),
        Op::List { after, limit } => {
            let lower = after
                .map(|a| ids[a].clone())
                .unwrap_or_else(|| list_floor(ids));
            let page = store.list_sessions(Some(&lower), *limit).await.unwrap();
            assert!(page.sessions.len() <= *limit);
            if page.sessions.len() == *limit {
                assert_eq!(
                    page.next_after.as_ref(),
                    page.sessions.last().map(|r| &r.session_id)
                );
            }
            // The store is shared with other cases; this case's ids sort together, first.
            let names: Vec<String> = page
                .sessions
                .into_iter()
                .map(|r| r.session_id)
                .take_while(|n| ids.contains(n))
                .collect();
            Seen::List(names)
        }
    }
}

async fn compare_state(
    store: &dyn BindingStore,
    model: &Model,
    ids: &[String],
) -> Result<(), String> {
    for id in ids {
        let got = store.session(id).await.map_err(|e| e.to_string())?;
        let want = model.sessions.get(id);
        match (got, want) {
            (None, None) => {}
            (Some(rec), Some(want)) => {
                let rows: Vec<Value> = store
                    .all_rows(id)
                    .await
                    .map_err(|e| e.to_string())?
                    .into_iter()
                    .enumerate()
                    .map(|(i, r)| {
                        assert_eq!(r.seq, i as u64);
                        r.body
                    })
                    .collect();
                let seen = ModelSession {
                    config: rec.model_config.clone(),
                    thread: rec.binding.as_ref().map(|b| b.thread_id.clone()),
                    codex_home: rec.binding.as_ref().and_then(|b| b.codex_home.clone()),
                    rows,
                    retired: rec.retired_threads.clone(),
                };
                if seen != *want {
                    return Err(format!("session {id}: store {seen:?} != model {want:?}"));
                }
                if rec.row_count != want.rows.len() as u64 {
                    return Err(format!("session {id}: row_count {}", rec.row_count));
                }
            }
            (got, want) => return Err(format!("session {id}: store {got:?} != model {want:?}")),
        }
    }
    Ok(())
}

async fn run_case(store: &dyn BindingStore, ops: &[Op]) -> Result<(), String> {
    // Ids share a prefix ending in a digit so `list_floor` sorts just below all three.
    let prefix = unique_id("model");
    let ids: Vec<String> = (0..3).map(|i| format!("{prefix}-s{i}")).collect();
    let mut model = Model::default();
    for (step, op) in ops.iter().enumerate() {
        let want = model.apply(&ids, op);
        let got = apply_to_store(store, &ids, op).await;
        if got != want {
            return Err(format!(
                "step {step} {op:?}: store returned {got:?}, model {want:?}"
            ));
        }
        compare_state(store, &model, &ids)
            .await
            .map_err(|e| format!("after step {step} {op:?}: {e}"))?;
    }
    Ok(())
}

/// Applies random operation sequences to the store and to a plain in-memory model and compares
/// results and state after every step; a failure is shrunk to a minimal sequence.
///
/// Cases: `RETHREAD_PROPTEST_CASES` (default 24); seed: `RETHREAD_PROPTEST_SEED` (default fixed).
pub async fn random_ops_match_model(store: &dyn BindingStore) {
    let cases: u32 = std::env::var("RETHREAD_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let seed: u64 = std::env::var("RETHREAD_PROPTEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed);
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let rng = TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &seed_bytes);
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases,
            ..Config::default()
        },
        rng,
    );
    let strategy = prop::collection::vec(op_strategy(), 1..40);
    for case in 0..cases {
        let mut tree = strategy.new_tree(&mut runner).expect("generate ops");
        let Err(first) = run_case(store, &tree.current()).await else {
            continue;
        };
        // Shrink by hand (the store is async, so proptest's own runner cannot drive it).
        let mut minimal = (tree.current(), first);
        let mut budget = 2000;
        if tree.simplify() {
            while budget > 0 {
                budget -= 1;
                match run_case(store, &tree.current()).await {
                    Err(e) => {
                        minimal = (tree.current(), e);
                        if !tree.simplify() {
                            break;
                        }
                    }
                    Ok(()) => {
                        if !tree.complicate() {
                            break;
                        }
                    }
                }
            }
        }
        panic!(
            "model test failed (case {case}, seed {seed}); minimal ops {:#?}\n{}",
            minimal.0, minimal.1
        );
    }
}
