//! A property test against a plain model.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRng, TestRunner};
use serde_json::{json, Map, Value};

use super::{turn, unique_id};
use crate::{
    BindingState, BindingStore, ImportOutcome, Retirement, StoreError, CODEX_THREAD_ID_KEY,
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
    /// `retire_thread`: the give-up (`lost`) or the host's own end.
    Retire {
        /// Session index.
        s: usize,
        /// Thread index.
        t: usize,
        /// `Retirement::Lost` (else `Ended`).
        lost: bool,
    },
    /// `mark_notice_delivered`.
    Delivered {
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

fn patch_value() -> impl Strategy<Value = (String, Value)> {
    let plain_key = prop_oneof![Just("a"), Just("b"), Just("c")].prop_map(str::to_string);
    let plain_value = prop_oneof![
        Just(Value::Null),
        (0..3i64).prop_map(|i| json!(i)),
        (prop::option::of(0..2i64), prop::option::of(0..2i64))
            .prop_map(|(x, y)| json!({"x": x, "y": y})),
    ];
    prop_oneof![
        8 => (plain_key, plain_value),
        1 => prop_oneof![Just(json!("th0")), Just(Value::Null), Just(json!(17))]
            .prop_map(|v| (CODEX_THREAD_ID_KEY.to_string(), v)),
    ]
}

/// The strategy for one [`Op`].
pub fn op_strategy() -> impl Strategy<Value = Op> {
    let s = 0..3usize;
    prop_oneof![
        6 => (s.clone(), 0..THREADS, 0..4usize).prop_map(|(s, t, rows)| Op::Commit { s, t, rows }),
        3 => (s.clone(), prop::collection::vec(patch_value(), 0..4))
            .prop_map(|(s, entries)| Op::Patch { s, entries }),
        3 => (s.clone(), 0..THREADS, any::<bool>())
            .prop_map(|(s, t, lost)| Op::Retire { s, t, lost }),
        1 => (s.clone(), 0..THREADS).prop_map(|(s, t)| Op::Delivered { s, t }),
        1 => s.clone().prop_map(|s| Op::Delete { s }),
        1 => s.clone().prop_map(|s| Op::ReExport { s }),
        2 => (s.clone(), 0..8u64, 0..6u64).prop_map(|(s, start, len)| Op::Rows { s, start, len }),
        1 => (prop::option::of(s), 1..4usize).prop_map(|(after, limit)| Op::List { after, limit }),
    ]
}

/// The binding state as the model predicts it (a give-up's time is the store's).
#[derive(Clone, Debug, Default, PartialEq)]
enum ModelState {
    #[default]
    Unbound,
    Bound {
        thread: String,
        codex_home: Option<String>,
    },
    GivenUp {
        thread: String,
        delivered: bool,
    },
}

#[derive(Clone, Debug, Default, PartialEq)]
struct ModelSession {
    config: Map<String, Value>,
    state: ModelState,
    rows: Vec<Value>,
    retired: Vec<String>,
}

/// The plain model: written independently of the stores' shared logic on purpose.
#[derive(Debug, Default)]
struct Model {
    sessions: BTreeMap<String, ModelSession>,
    /// Which session each thread belongs to.
    owners: BTreeMap<String, String>,
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
        StoreError::ThreadTaken { .. } => Seen::Refused("taken"),
        StoreError::Conflict { .. } => Seen::Refused("conflict"),
        other => panic!("unexpected store failure: {other}"),
    }
}

/// One case's names: its sessions and its threads (unique to the case: the store is shared).
struct Names {
    sessions: Vec<String>,
    threads: Vec<String>,
}

impl Model {
    /// Refuses a thread of another session, else records it as `session`'s.
    fn claim(&mut self, session: &str, thread: &str) -> Result<(), Seen> {
        match self.owners.get(thread) {
            Some(owner) if owner != session => Err(Seen::Refused("taken")),
            _ => {
                self.owners.insert(thread.to_string(), session.to_string());
                Ok(())
            }
        }
    }

    fn apply(&mut self, names: &Names, op: &Op) -> Seen {
        let ids = &names.sessions;
        match op {
            Op::Commit { s, t, rows } => {
                let thread = names.threads[*t].clone();
                if let Err(refused) = self.claim(&ids[*s], &thread) {
                    return refused;
                }
                let sess = self.sessions.entry(ids[*s].clone()).or_default();
                let first_seq = sess.rows.len() as u64;
                sess.rows.extend(row_bodies(*s, first_seq, *rows));
                let published = !sess.retired.contains(&thread);
                if published {
                    sess.config
                        .insert(CODEX_THREAD_ID_KEY.into(), json!(thread));
                    sess.state = ModelState::Bound {
                        codex_home: Some(format!("/codex-home/{thread}")),
                        thread,
                    };
                }
                Seen::Commit {
                    first_seq,
                    row_count: sess.rows.len() as u64,
                    published,
                }
            }
            Op::Patch { s, entries } => {
                if entries.iter().any(|(k, _)| k == CODEX_THREAD_ID_KEY) {
                    return Seen::Refused("invalid");
                }
                let patch: Map<String, Value> = entries.iter().cloned().collect();
                let sess = self.sessions.entry(ids[*s].clone()).or_default();
                model_merge(&mut sess.config, &patch);
                Seen::Config(sess.config.clone())
            }
            Op::Retire { s, t, lost } => {
                let thread = names.threads[*t].clone();
                if let Err(refused) = self.claim(&ids[*s], &thread) {
                    return refused;
                }
                let sess = self.sessions.entry(ids[*s].clone()).or_default();
                if !sess.retired.contains(&thread) {
                    sess.retired.push(thread.clone());
                }
                if matches!(&sess.state, ModelState::Bound { thread: b, .. } if *b == thread) {
                    sess.config.remove(CODEX_THREAD_ID_KEY);
                    sess.state = if *lost {
                        ModelState::GivenUp {
                            thread,
                            delivered: false,
                        }
                    } else {
                        ModelState::Unbound
                    };
                }
                Seen::Unit
            }
            Op::Delivered { s, t } => {
                let thread = &names.threads[*t];
                match self.sessions.get_mut(&ids[*s]).map(|x| &mut x.state) {
                    Some(ModelState::GivenUp {
                        thread: g,
                        delivered,
                    }) if g == thread => {
                        *delivered = true;
                        Seen::Bool(true)
                    }
                    _ => Seen::Bool(false),
                }
            }
            Op::Delete { s } => {
                self.owners.retain(|_, owner| *owner != ids[*s]);
                Seen::Bool(self.sessions.remove(&ids[*s]).is_some())
            }
            // The export carries every thread of the session and the import claims them
            // all: ownership is as before.
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

async fn apply_to_store(store: &BindingStore, names: &Names, op: &Op) -> Seen {
    let ids = &names.sessions;
    match op {
        Op::Commit { s, t, rows } => {
            let sid = &ids[*s];
            let first = store.session(sid).await.unwrap().map_or(0, |r| r.row_count);
            let thread = &names.threads[*t];
            match store
                .commit_turn(turn(sid, thread, row_bodies(*s, first, *rows)))
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
        Op::Retire { s, t, lost } => {
            let retirement = if *lost {
                Retirement::Lost {
                    reason: "gone".to_string(),
                    message: format!("lost {t}"),
                }
            } else {
                Retirement::Ended
            };
            match store
                .retire_thread(&ids[*s], &names.threads[*t], retirement, None)
                .await
            {
                Ok(()) => Seen::Unit,
                Err(e) => refused(&e),
            }
        }
        Op::Delivered { s, t } => Seen::Bool(
            store
                .mark_notice_delivered(&ids[*s], &names.threads[*t], None)
                .await
                .unwrap(),
        ),
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

fn model_state(state: &BindingState) -> ModelState {
    match state {
        BindingState::Bound(b) => ModelState::Bound {
            thread: b.thread_id.clone(),
            codex_home: b.codex_home.clone(),
        },
        BindingState::GivenUp(g) => ModelState::GivenUp {
            thread: g.thread_id.clone(),
            delivered: g.notice_delivered,
        },
        _ => ModelState::Unbound,
    }
}

async fn compare_state(store: &BindingStore, model: &Model, names: &Names) -> Result<(), String> {
    for id in &names.sessions {
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
                    state: model_state(&rec.state),
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
    for thread in &names.threads {
        let got = store
            .thread_session(thread)
            .await
            .map_err(|e| e.to_string())?;
        if got.as_ref() != model.owners.get(thread) {
            return Err(format!(
                "thread {thread}: store says {got:?}, model {:?}",
                model.owners.get(thread)
            ));
        }
    }
    Ok(())
}

async fn run_case(store: &BindingStore, ops: &[Op]) -> Result<(), String> {
    // Ids share a prefix ending in a digit so `list_floor` sorts just below all three.
    let prefix = unique_id("model");
    let names = Names {
        sessions: (0..3).map(|i| format!("{prefix}-s{i}")).collect(),
        threads: (0..THREADS).map(|t| format!("{prefix}-th{t}")).collect(),
    };
    let mut model = Model::default();
    for (step, op) in ops.iter().enumerate() {
        let want = model.apply(&names, op);
        let got = apply_to_store(store, &names, op).await;
        if got != want {
            return Err(format!(
                "step {step} {op:?}: store returned {got:?}, model {want:?}"
            ));
        }
        compare_state(store, &model, &names)
            .await
            .map_err(|e| format!("after step {step} {op:?}: {e}"))?;
    }
    Ok(())
}

/// Applies random operation sequences to the store and to a plain in-memory model and compares
/// results and state after every step; a failure is shrunk to a minimal sequence.
///
/// Cases: `RETHREAD_PROPTEST_CASES` (default 24); seed: `RETHREAD_PROPTEST_SEED` (default fixed).
pub async fn random_ops_match_model(store: &BindingStore) {
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
