//! The conformance suite every [`BindingStore`] backend runs (feature `conformance`).
//!
//! Each scenario is a `pub async fn scenario(store: &dyn BindingStore)` that panics on a
//! violation. Scenarios pick fresh session ids on every call, so they can share one store and
//! run in any order, any number of times. A backend test runs [`run_all`] once on the store
//! directly and once through an `Arc<dyn BindingStore>`:
//!
//! ```no_run
//! # async fn demo() {
//! use std::sync::Arc;
//! use rethread_store::{conformance, BindingStore, MemoryStore};
//! let store = Arc::new(MemoryStore::new());
//! conformance::run_all(store.as_ref()).await;
//! let shared: Arc<dyn BindingStore> = store;
//! conformance::run_all(&shared).await;
//! # }
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::join_all;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRng, TestRunner};
use serde_json::{json, Map, Value};

use crate::{
    BindingStore, BindingStoreExt, CommitOutcome, Fence, ImportOutcome, Lease, LeaseOwner,
    SessionExport, StoreError, TurnCommit, CODEX_THREAD_ID_KEY,
};

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A session id no other scenario call uses: `{name}-{process id}-{counter}`.
pub fn unique_id(name: &str) -> String {
    format!(
        "{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn turn(session: &str, thread: &str, rows: Vec<Value>) -> TurnCommit {
    TurnCommit {
        session_id: session.to_string(),
        thread_id: thread.to_string(),
        codex_home: Some(format!("/codex-home/{thread}")),
        rows,
        fence: None,
    }
}

fn obj(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

/// Runs every scenario, in order, on `store`.
pub async fn run_all(store: &dyn BindingStore) {
    commit_publishes_binding(store).await;
    merge_patch_semantics(store).await;
    patch_codex_thread_id_keeps_binding_consistent(store).await;
    cas_drop(store).await;
    retired_thread_is_never_published(store).await;
    row_order(store).await;
    concurrent_patches_of_distinct_keys(store).await;
    many_sessions_commit_at_once(store).await;
    refused_write_does_not_fail_its_neighbours(store).await;
    list_sessions_pages(store).await;
    delete_session(store).await;
    export_import_roundtrip(store).await;
    invalid_input(store).await;
    random_ops_match_model(store).await;
    run_leases(store).await;
}

/// Runs every lease scenario, in order, on `store`.
pub async fn run_leases(store: &dyn BindingStore) {
    lease_is_exclusive(store).await;
    lease_release_frees(store).await;
    lease_renew_extends(store).await;
    lease_expiry_frees_a_crashed_holder(store).await;
    lease_owner_mismatch_cannot_renew_or_release(store).await;
    concurrent_acquires_grant_one(store).await;
    fenced_writes_need_the_live_grant(store).await;
    fenced_write_after_expiry_is_refused(store).await;
    dropped_local_holder_is_taken_over_at_once(store).await;
}

fn owner(name: &str) -> LeaseOwner {
    LeaseOwner {
        host: format!("host-{name}"),
        pid: 4242,
        started_at_ms: 1_700_000_000_000,
        instance: NEXT.fetch_add(1, Ordering::Relaxed),
        process: None,
    }
}

const LONG: Duration = Duration::from_secs(60);

/// A live lease excludes every other owner (typed `Busy` naming the holder); the holder asking
/// again renews it, keeping its fence.
pub async fn lease_is_exclusive(store: &dyn BindingStore) {
    let s = unique_id("lease-exclusive");
    let (a, b) = (owner("a"), owner("b"));
    let lease = store.acquire_lease(&s, &a, LONG).await.unwrap();
    assert_eq!(lease.session_id, s);
    assert_eq!(lease.owner, a);
    assert!(lease.expires_at_ms > lease.acquired_at_ms);
    match store.acquire_lease(&s, &b, LONG).await {
        Err(StoreError::Busy {
            session_id,
            holder,
            acquired_at_ms,
            expires_at_ms,
        }) => {
            assert_eq!(session_id, s);
            assert_eq!(holder, a);
            assert_eq!(acquired_at_ms, lease.acquired_at_ms);
            assert!(expires_at_ms >= lease.expires_at_ms);
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    // A re-acquire by the holder is a new grant: a new fence, and the earlier grant's late
    // renewal or release cannot touch it.
    let again = store.acquire_lease(&s, &a, LONG).await.unwrap();
    assert!(again.fence > lease.fence, "{lease:?} then {again:?}");
    assert!(matches!(
        store.renew_lease(&lease, LONG).await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert!(
        !store.release_lease(&lease).await.unwrap(),
        "a late release"
    );
    assert!(matches!(
        store.acquire_lease(&s, &b, LONG).await,
        Err(StoreError::Busy { holder, .. }) if holder == a
    ));
    // Leases are per session.
    let other = unique_id("lease-exclusive-other");
    store.acquire_lease(&other, &b, LONG).await.unwrap();
    assert!(store.release_lease(&again).await.unwrap());
}

/// Releasing frees the lease for the next owner (with a higher fence); a second release is a
/// no-op.
pub async fn lease_release_frees(store: &dyn BindingStore) {
    let s = unique_id("lease-release");
    let (a, b) = (owner("a"), owner("b"));
    let first = store.acquire_lease(&s, &a, LONG).await.unwrap();
    assert!(store.release_lease(&first).await.unwrap());
    assert!(!store.release_lease(&first).await.unwrap(), "already free");
    assert!(
        matches!(
            store.renew_lease(&first, LONG).await,
            Err(StoreError::LeaseLost { .. })
        ),
        "a released lease cannot be renewed"
    );
    let second = store.acquire_lease(&s, &b, LONG).await.unwrap();
    assert_eq!(second.owner, b);
    assert!(
        second.fence > first.fence,
        "fences grow: {first:?} {second:?}"
    );
    assert!(store.release_lease(&second).await.unwrap());
}

/// Renewing pushes the expiry out: the lease outlives its first TTL.
pub async fn lease_renew_extends(store: &dyn BindingStore) {
    let s = unique_id("lease-renew");
    let (a, b) = (owner("a"), owner("b"));
    let ttl = Duration::from_millis(600);
    let lease = store.acquire_lease(&s, &a, ttl).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let renewed = store.renew_lease(&lease, ttl).await.unwrap();
    assert!(renewed.expires_at_ms > lease.expires_at_ms);
    assert_eq!(renewed.fence, lease.fence);
    assert_eq!(renewed.acquired_at_ms, lease.acquired_at_ms);
    tokio::time::sleep(Duration::from_millis(400)).await;
    // 700 ms after the grant: past the first expiry, within the renewed one.
    assert!(
        matches!(
            store.acquire_lease(&s, &b, ttl).await,
            Err(StoreError::Busy { .. })
        ),
        "the renewed lease still holds"
    );
    assert!(store.release_lease(&renewed).await.unwrap());
}

/// A holder that stops renewing (crashed) loses the lease at expiry: another owner gets it, and
/// the old holder can neither renew nor release it.
pub async fn lease_expiry_frees_a_crashed_holder(store: &dyn BindingStore) {
    let s = unique_id("lease-expiry");
    let (a, b, c) = (owner("a"), owner("b"), owner("c"));
    let crashed = store
        .acquire_lease(&s, &a, Duration::from_millis(200))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        matches!(
            store.renew_lease(&crashed, LONG).await,
            Err(StoreError::LeaseLost { .. })
        ),
        "an expired lease cannot be renewed"
    );
    let next = store.acquire_lease(&s, &b, LONG).await.unwrap();
    assert_eq!(next.owner, b);
    assert_eq!(next.fence, crashed.fence + 1);
    assert!(!store.release_lease(&crashed).await.unwrap());
    assert!(matches!(
        store.acquire_lease(&s, &c, LONG).await,
        Err(StoreError::Busy { holder, .. }) if holder == b
    ));
    assert!(store.release_lease(&next).await.unwrap());
}

/// A lease naming another owner (or an older fence) can neither renew nor release the holder's.
pub async fn lease_owner_mismatch_cannot_renew_or_release(store: &dyn BindingStore) {
    let s = unique_id("lease-mismatch");
    let (a, b) = (owner("a"), owner("b"));
    let held = store.acquire_lease(&s, &a, LONG).await.unwrap();
    let forged = Lease {
        owner: b.clone(),
        ..held.clone()
    };
    assert!(matches!(
        store.renew_lease(&forged, LONG).await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert!(!store.release_lease(&forged).await.unwrap());
    let stale_fence = Lease {
        fence: held.fence + 7,
        ..held.clone()
    };
    assert!(!store.release_lease(&stale_fence).await.unwrap());
    assert!(matches!(
        store.acquire_lease(&s, &b, LONG).await,
        Err(StoreError::Busy { holder, .. }) if holder == a
    ));
    assert!(store.release_lease(&held).await.unwrap());
}

/// Many owners racing for one free lease: exactly one wins, the others are `Busy` naming it.
pub async fn concurrent_acquires_grant_one(store: &dyn BindingStore) {
    let s = unique_id("lease-race");
    let owners: Vec<LeaseOwner> = (0..16).map(|i| owner(&format!("racer{i}"))).collect();
    let results = join_all(owners.iter().map(|o| store.acquire_lease(&s, o, LONG))).await;
    let winners: Vec<&Lease> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    let winner = winners[0].owner.clone();
    for r in &results {
        match r {
            Ok(_) => {}
            Err(StoreError::Busy { holder, .. }) => assert_eq!(*holder, winner),
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert!(store.release_lease(winners[0]).await.unwrap());
}

/// Writes that publish or remove a binding, carrying a fence, are refused with `LeaseLost` and
/// write nothing once another owner took the session over; the new holder's fenced writes and
/// unfenced writes go through.
pub async fn fenced_writes_need_the_live_grant(store: &dyn BindingStore) {
    let s = unique_id("fenced");
    let (a, b) = (owner("a"), owner("b"));
    let ttl = Duration::from_millis(300);
    let first = store.acquire_lease(&s, &a, ttl).await.unwrap();
    let stale = first.fence();
    let mut commit = turn(&s, "t1", vec![json!({"n": 1})]);
    commit.fence = Some(stale.clone());
    store.commit_turn(commit).await.unwrap();
    // `a` stalls past its TTL; `b` takes over and commits.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let second = store.acquire_lease(&s, &b, LONG).await.unwrap();
    let mut commit = turn(&s, "t2", vec![json!({"n": 2})]);
    commit.fence = Some(second.fence());
    store.commit_turn(commit).await.unwrap();
    let before = store.export_session(&s).await.unwrap();

    let mut late = turn(&s, "t1", vec![json!({"n": 3})]);
    late.fence = Some(stale.clone());
    let lost = |r: &Result<_, StoreError>| matches!(r, Err(StoreError::LeaseLost { session_id }) if *session_id == s);
    assert!(lost(&store.commit_turn(late).await.map(drop)));
    assert!(lost(&store.retire_thread(&s, "t2", Some(&stale)).await));
    assert!(lost(
        &store
            .drop_binding_if(&s, "t2", Some(&stale))
            .await
            .map(drop)
    ));
    assert!(lost(
        &store
            .patch_config(&s, obj(json!({CODEX_THREAD_ID_KEY: "t1"})), Some(&stale))
            .await
            .map(drop)
    ));
    assert_eq!(
        store.export_session(&s).await.unwrap(),
        before,
        "a refused write writes nothing"
    );
    // A forged fence (right owner, wrong token) is refused too.
    let forged = Fence {
        token: second.fence + 1,
        ..second.fence()
    };
    assert!(lost(&store.retire_thread(&s, "t2", Some(&forged)).await));
    // The holder's fenced writes and unfenced writes go through.
    store
        .patch_config(&s, obj(json!({"k": 1})), Some(&second.fence()))
        .await
        .unwrap();
    store
        .retire_thread(&s, "t2", Some(&second.fence()))
        .await
        .unwrap();
    assert_eq!(store.thread_id(&s).await.unwrap(), None);
    store.drop_binding_if(&s, "t9", None).await.unwrap();
    assert!(store.release_lease(&second).await.unwrap());
    // A released grant fences nothing any more.
    assert!(lost(
        &store.retire_thread(&s, "t3", Some(&second.fence())).await
    ));
}

/// A holder whose lease expired is refused even when nobody took the session over: it failed
/// to renew in time and must not assume it still holds the session.
pub async fn fenced_write_after_expiry_is_refused(store: &dyn BindingStore) {
    let s = unique_id("fenced-expired");
    let lease = store
        .acquire_lease(&s, &owner("a"), Duration::from_millis(100))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let mut commit = turn(&s, "t1", vec![json!({"n": 1})]);
    commit.fence = Some(lease.fence());
    assert!(matches!(
        store.commit_turn(commit).await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert_eq!(store.session(&s).await.unwrap(), None);
}

/// A holder of this process whose [`LocalOwner`](crate::LocalOwner) was dropped is provably
/// gone: another holder takes its live lease at once, with a new fence (where the OS gives a
/// process identity; elsewhere the TTL decides and the lease stays busy).
pub async fn dropped_local_holder_is_taken_over_at_once(store: &dyn BindingStore) {
    let s = unique_id("dead-holder");
    let gone = crate::LocalOwner::new();
    let held = store.acquire_lease(&s, gone.owner(), LONG).await.unwrap();
    let next = crate::LocalOwner::new();
    assert!(
        matches!(
            store.acquire_lease(&s, next.owner(), LONG).await,
            Err(StoreError::Busy { .. })
        ),
        "a live holder is never taken over"
    );
    let identified = gone.owner().process.is_some();
    drop(gone);
    match store.acquire_lease(&s, next.owner(), LONG).await {
        Ok(lease) => {
            assert!(identified, "taken over without a process identity");
            assert!(lease.fence > held.fence);
            assert!(matches!(
                store.renew_lease(&held, LONG).await,
                Err(StoreError::LeaseLost { .. })
            ));
            assert!(store.release_lease(&lease).await.unwrap());
        }
        Err(StoreError::Busy { .. }) => assert!(!identified, "a dropped holder stays busy"),
        Err(other) => panic!("unexpected {other}"),
    }
}

/// `commit_turn` appends the rows and publishes the binding with its metadata; re-committing on
/// the same thread keeps `bound_at_ms`.
pub async fn commit_publishes_binding(store: &dyn BindingStore) {
    let s = unique_id("commit");
    assert_eq!(store.session(&s).await.unwrap(), None);
    let out = store
        .commit_turn(turn(&s, "t1", vec![json!("a"), json!("b")]))
        .await
        .unwrap();
    assert_eq!(
        out,
        CommitOutcome::Published {
            first_seq: 0,
            row_count: 2
        }
    );
    let rec = store
        .session(&s)
        .await
        .unwrap()
        .expect("session created by commit_turn");
    assert_eq!(rec.session_id, s);
    assert_eq!(rec.row_count, 2);
    let b = rec.binding.clone().expect("binding published");
    assert_eq!(b.thread_id, "t1");
    assert_eq!(b.codex_home.as_deref(), Some("/codex-home/t1"));
    assert_eq!(
        rec.model_config.get(CODEX_THREAD_ID_KEY),
        Some(&json!("t1"))
    );
    assert!(rec.created_at_ms > 0 && rec.updated_at_ms >= rec.created_at_ms);

    // Publish-only commit (the host keeps its own transcript): no rows, same thread.
    let out = store.commit_turn(turn(&s, "t1", vec![])).await.unwrap();
    assert_eq!(
        out,
        CommitOutcome::Published {
            first_seq: 2,
            row_count: 2
        }
    );
    let again = store.binding(&s).await.unwrap().unwrap();
    assert_eq!(
        again.bound_at_ms, b.bound_at_ms,
        "same thread keeps its bound_at_ms"
    );

    let out = store
        .commit_turn(turn(&s, "t2", vec![json!("c")]))
        .await
        .unwrap();
    assert_eq!(
        out,
        CommitOutcome::Published {
            first_seq: 2,
            row_count: 3
        }
    );
    assert_eq!(store.thread_id(&s).await.unwrap().as_deref(), Some("t2"));
    assert_eq!(store.all_rows(&s).await.unwrap().len(), 3);
}

/// RFC 7396 merge-patch: `null` removes, nested objects merge, other keys are kept, the returned
/// config is what is stored.
pub async fn merge_patch_semantics(store: &dyn BindingStore) {
    let s = unique_id("merge");
    let c = store
        .patch_config(
            &s,
            obj(json!({"model": "gpt", "opts": {"a": 1, "b": 2}, "x": [1, 2]})),
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        Value::Object(c),
        json!({"model": "gpt", "opts": {"a": 1, "b": 2}, "x": [1, 2]})
    );
    store
        .commit_turn(turn(&s, "t1", vec![json!(1)]))
        .await
        .unwrap();
    let c = store
        .patch_config(
            &s,
            obj(json!({"opts": {"a": null, "c": 3}, "x": [3], "model": null, "n": 7})),
            None,
        )
        .await
        .unwrap();
    let want = json!({"opts": {"b": 2, "c": 3}, "x": [3], "n": 7, CODEX_THREAD_ID_KEY: "t1"});
    assert_eq!(Value::Object(c.clone()), want);
    let rec = store.session(&s).await.unwrap().unwrap();
    assert_eq!(rec.model_config, c);
    assert_eq!(
        rec.thread_id(),
        Some("t1"),
        "a patch not naming the binding keeps it"
    );
    // A scalar replaced by an object, an object replaced by a scalar; empty patch is a no-op.
    let c = store
        .patch_config(&s, obj(json!({"n": {"deep": true}, "opts": 0})), None)
        .await
        .unwrap();
    assert_eq!(c.get("n"), Some(&json!({"deep": true})));
    assert_eq!(c.get("opts"), Some(&json!(0)));
    let unchanged = store.patch_config(&s, Map::new(), None).await.unwrap();
    assert_eq!(unchanged, c);
    // Committing a turn never touches the host's keys.
    store.commit_turn(turn(&s, "t2", vec![])).await.unwrap();
    let rec = store.session(&s).await.unwrap().unwrap();
    assert_eq!(rec.model_config.get("n"), Some(&json!({"deep": true})));
    assert_eq!(rec.model_config.get("x"), Some(&json!([3])));
}

/// Patching `codex_thread_id` directly keeps the binding metadata consistent and refuses
/// non-strings and retired threads without writing anything.
pub async fn patch_codex_thread_id_keeps_binding_consistent(store: &dyn BindingStore) {
    let s = unique_id("patch-binding");
    store
        .commit_turn(turn(&s, "t1", vec![json!(1)]))
        .await
        .unwrap();
    let before = store.session(&s).await.unwrap().unwrap();

    let err = store
        .patch_config(&s, obj(json!({CODEX_THREAD_ID_KEY: 5, "k": 1})), None)
        .await;
    assert!(matches!(err, Err(StoreError::InvalidInput(_))), "{err:?}");
    let err = store
        .patch_config(&s, obj(json!({CODEX_THREAD_ID_KEY: "", "k": 1})), None)
        .await;
    assert!(matches!(err, Err(StoreError::InvalidInput(_))), "{err:?}");
    assert_eq!(
        store.session(&s).await.unwrap().unwrap(),
        before,
        "refused patch wrote nothing"
    );

    let c = store
        .patch_config(&s, obj(json!({CODEX_THREAD_ID_KEY: "t9"})), None)
        .await
        .unwrap();
    assert_eq!(c.get(CODEX_THREAD_ID_KEY), Some(&json!("t9")));
    let b = store.binding(&s).await.unwrap().unwrap();
    assert_eq!(
        (b.thread_id.as_str(), b.codex_home.as_deref()),
        ("t9", None)
    );

    store
        .patch_config(&s, obj(json!({CODEX_THREAD_ID_KEY: null})), None)
        .await
        .unwrap();
    assert_eq!(store.binding(&s).await.unwrap(), None);

    store.retire_thread(&s, "t7", None).await.unwrap();
    let err = store
        .patch_config(&s, obj(json!({CODEX_THREAD_ID_KEY: "t7"})), None)
        .await;
    assert!(
        matches!(err, Err(StoreError::RetiredThread { .. })),
        "{err:?}"
    );
    assert_eq!(store.binding(&s).await.unwrap(), None);
}

/// Compare-and-delete removes the binding only while it names the failed thread.
pub async fn cas_drop(store: &dyn BindingStore) {
    let s = unique_id("cas");
    assert!(
        !store.drop_binding_if(&s, "t1", None).await.unwrap(),
        "absent session"
    );
    assert_eq!(
        store.session(&s).await.unwrap(),
        None,
        "a failed CAS creates nothing"
    );
    store
        .commit_turn(turn(&s, "t1", vec![json!(1)]))
        .await
        .unwrap();
    store
        .patch_config(&s, obj(json!({"keep": true})), None)
        .await
        .unwrap();
    // A newer binding was written meanwhile: the stale drop must not remove it.
    store
        .commit_turn(turn(&s, "t2", vec![json!(2)]))
        .await
        .unwrap();
    assert!(!store.drop_binding_if(&s, "t1", None).await.unwrap());
    assert_eq!(store.thread_id(&s).await.unwrap().as_deref(), Some("t2"));
    assert!(store.drop_binding_if(&s, "t2", None).await.unwrap());
    let rec = store.session(&s).await.unwrap().unwrap();
    assert_eq!(rec.binding, None);
    assert_eq!(rec.model_config.get(CODEX_THREAD_ID_KEY), None);
    assert_eq!(
        rec.model_config.get("keep"),
        Some(&json!(true)),
        "other keys survive"
    );
    assert_eq!(rec.row_count, 2, "rows survive");
    assert!(
        !store.drop_binding_if(&s, "t2", None).await.unwrap(),
        "already dropped"
    );
}

/// A retired thread's rows commit but it is never published; retirement is persistent,
/// idempotent, and created for a session that did not exist yet.
pub async fn retired_thread_is_never_published(store: &dyn BindingStore) {
    let s = unique_id("retired");
    store
        .commit_turn(turn(&s, "t1", vec![json!(1)]))
        .await
        .unwrap();
    store.retire_thread(&s, "t1", None).await.unwrap();
    assert_eq!(
        store.binding(&s).await.unwrap(),
        None,
        "retiring the bound thread unbinds it"
    );
    let out = store
        .commit_turn(turn(&s, "t1", vec![json!(2), json!(3)]))
        .await
        .unwrap();
    assert_eq!(
        out,
        CommitOutcome::RetiredNotPublished {
            first_seq: 1,
            row_count: 3
        }
    );
    assert!(!out.is_published());
    assert_eq!(store.binding(&s).await.unwrap(), None);
    assert_eq!(
        store.all_rows(&s).await.unwrap().len(),
        3,
        "a retired thread's rows commit"
    );

    store.commit_turn(turn(&s, "t2", vec![])).await.unwrap();
    store.retire_thread(&s, "t1", None).await.unwrap();
    store.retire_thread(&s, "t3", None).await.unwrap();
    let rec = store.session(&s).await.unwrap().unwrap();
    assert_eq!(
        rec.thread_id(),
        Some("t2"),
        "retiring another thread keeps the binding"
    );
    assert_eq!(
        rec.retired_threads,
        vec!["t1".to_string(), "t3".to_string()]
    );
    let out = store.commit_turn(turn(&s, "t3", vec![])).await.unwrap();
    assert!(!out.is_published());
    assert_eq!(store.thread_id(&s).await.unwrap().as_deref(), Some("t2"));

    // Retiring first (e.g. another process decided the thread is dead) also holds.
    let fresh = unique_id("retired-first");
    store.retire_thread(&fresh, "t1", None).await.unwrap();
    assert!(store
        .session(&fresh)
        .await
        .unwrap()
        .unwrap()
        .is_retired("t1"));
    let out = store
        .commit_turn(turn(&fresh, "t1", vec![json!(0)]))
        .await
        .unwrap();
    assert_eq!(
        out,
        CommitOutcome::RetiredNotPublished {
            first_seq: 0,
            row_count: 1
        }
    );
    assert_eq!(store.binding(&fresh).await.unwrap(), None);
}

/// Rows keep their order and sequence numbers across turns; range reads are clipped.
pub async fn row_order(store: &dyn BindingStore) {
    let s = unique_id("rows");
    let mut expected = Vec::new();
    for t in 0..5u64 {
        let rows: Vec<Value> = (0..t).map(|i| json!({"turn": t, "i": i})).collect();
        let out = store
            .commit_turn(turn(&s, &format!("t{t}"), rows.clone()))
            .await
            .unwrap();
        assert_eq!(out.first_seq(), expected.len() as u64);
        expected.extend(rows);
        assert_eq!(out.row_count(), expected.len() as u64);
    }
    let all = store.all_rows(&s).await.unwrap();
    assert_eq!(all.len(), expected.len());
    for (i, row) in all.iter().enumerate() {
        assert_eq!(row.seq, i as u64);
        assert_eq!(row.body, expected[i]);
    }
    let mid = store.rows(&s, 3..6).await.unwrap();
    assert_eq!(mid.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![3, 4, 5]);
    let tail = store.rows(&s, 8..100).await.unwrap();
    assert_eq!(tail.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![8, 9]);
    assert!(store.rows(&s, 4..4).await.unwrap().is_empty());
    assert!(store.rows(&s, 50..60).await.unwrap().is_empty());
    assert!(store
        .rows(&unique_id("no-such"), 0..10)
        .await
        .unwrap()
        .is_empty());
}

/// Concurrent merge-patches of distinct keys all survive, beside the binding.
pub async fn concurrent_patches_of_distinct_keys(store: &dyn BindingStore) {
    let s = unique_id("concurrent-patch");
    store
        .commit_turn(turn(&s, "t1", vec![json!(0)]))
        .await
        .unwrap();
    let n = 48;
    let results = join_all((0..n).map(|i| {
        let s = s.clone();
        async move {
            store
                .patch_config(
                    &s,
                    obj(json!({format!("k{i}"): i, "nested": {format!("n{i}"): i}})),
                    None,
                )
                .await
        }
    }))
    .await;
    for r in results {
        r.unwrap();
    }
    let rec = store.session(&s).await.unwrap().unwrap();
    for i in 0..n {
        assert_eq!(
            rec.model_config.get(&format!("k{i}")),
            Some(&json!(i)),
            "key k{i} lost"
        );
        assert_eq!(
            rec.model_config["nested"].get(format!("n{i}")),
            Some(&json!(i))
        );
    }
    assert_eq!(rec.thread_id(), Some("t1"));
}

/// Many sessions committing at once (group commit on durable backends): no loss, no
/// duplicates, every session's rows in order and its binding on its last thread.
pub async fn many_sessions_commit_at_once(store: &dyn BindingStore) {
    let base = unique_id("many");
    let sessions = 64;
    let turns = 4u64;
    join_all((0..sessions).map(|i| {
        let s = format!("{base}-{i:02}");
        async move {
            for t in 0..turns {
                let rows = vec![
                    json!({"s": i, "t": t, "r": 0}),
                    json!({"s": i, "t": t, "r": 1}),
                ];
                let out = store
                    .commit_turn(turn(&s, &format!("t{t}"), rows))
                    .await
                    .unwrap();
                assert_eq!(
                    out,
                    CommitOutcome::Published {
                        first_seq: 2 * t,
                        row_count: 2 * t + 2
                    }
                );
            }
        }
    }))
    .await;
    for i in 0..sessions {
        let s = format!("{base}-{i:02}");
        let rec = store.session(&s).await.unwrap().unwrap();
        assert_eq!(rec.row_count, 2 * turns);
        assert_eq!(rec.thread_id(), Some(format!("t{}", turns - 1).as_str()));
        let rows = store.all_rows(&s).await.unwrap();
        let want: Vec<Value> = (0..turns)
            .flat_map(|t| {
                [
                    json!({"s": i, "t": t, "r": 0}),
                    json!({"s": i, "t": t, "r": 1}),
                ]
            })
            .collect();
        assert_eq!(rows.into_iter().map(|r| r.body).collect::<Vec<_>>(), want);
    }
}

/// A refused write coalesced with others (same group commit) fails alone.
pub async fn refused_write_does_not_fail_its_neighbours(store: &dyn BindingStore) {
    let base = unique_id("neighbours");
    let good = join_all((0..16).map(|i| {
        let s = format!("{base}-{i}");
        async move { store.commit_turn(turn(&s, "t", vec![json!(i)])).await }
    }));
    let bad = join_all((0..16).map(|i| {
        let s = format!("{base}-{i}");
        async move {
            store
                .patch_config(&s, obj(json!({CODEX_THREAD_ID_KEY: i})), None)
                .await
        }
    }));
    let (good, bad) = futures::join!(good, bad);
    for r in good {
        assert!(r.unwrap().is_published());
    }
    for r in bad {
        assert!(matches!(r, Err(StoreError::InvalidInput(_))), "{r:?}");
    }
    for i in 0..16 {
        let rec = store
            .session(&format!("{base}-{i}"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((rec.row_count, rec.thread_id()), (1, Some("t")));
    }
}

/// `list_sessions` pages in session-id order without gaps or repeats.
pub async fn list_sessions_pages(store: &dyn BindingStore) {
    let base = unique_id("list");
    let ids: Vec<String> = (0..7).map(|i| format!("{base}/{i}")).collect();
    for id in ids.iter().rev() {
        store
            .patch_config(id, obj(json!({"id": id})), None)
            .await
            .unwrap();
    }
    // Start just before our prefix and stop when leaving it: other scenarios share the store.
    let mut after = Some(format!("{base}/"));
    let mut seen = Vec::new();
    'pages: loop {
        let page = store.list_sessions(after.as_deref(), 3).await.unwrap();
        assert!(page.sessions.len() <= 3);
        for rec in &page.sessions {
            if !rec.session_id.starts_with(&format!("{base}/")) {
                break 'pages;
            }
            assert_eq!(rec.model_config.get("id"), Some(&json!(rec.session_id)));
            seen.push(rec.session_id.clone());
        }
        match page.next_after {
            Some(next) => {
                assert_eq!(Some(&next), page.sessions.last().map(|r| &r.session_id));
                after = Some(next);
            }
            None => break,
        }
    }
    assert_eq!(seen, ids);
    let err = store.list_sessions(None, 0).await;
    assert!(matches!(err, Err(StoreError::InvalidInput(_))), "{err:?}");
}

/// Deleting a session removes its record and rows; a new session with that id starts empty.
pub async fn delete_session(store: &dyn BindingStore) {
    let s = unique_id("delete");
    store
        .commit_turn(turn(&s, "t1", vec![json!(1), json!(2)]))
        .await
        .unwrap();
    assert!(store.delete_session(&s).await.unwrap());
    assert!(!store.delete_session(&s).await.unwrap());
    assert_eq!(store.session(&s).await.unwrap(), None);
    assert!(store.all_rows(&s).await.unwrap().is_empty());
    let out = store
        .commit_turn(turn(&s, "t2", vec![json!(3)]))
        .await
        .unwrap();
    assert_eq!(
        out,
        CommitOutcome::Published {
            first_seq: 0,
            row_count: 1
        }
    );
    assert_eq!(store.all_rows(&s).await.unwrap()[0].body, json!(3));
}

/// Export then import reproduces the session exactly; re-import is a no-op; a differing
/// session is a conflict; an inconsistent export is refused.
pub async fn export_import_roundtrip(store: &dyn BindingStore) {
    let s = unique_id("export");
    store
        .commit_turn(turn(&s, "t1", vec![json!({"a": 1}), json!("two")]))
        .await
        .unwrap();
    store.retire_thread(&s, "t0", None).await.unwrap();
    store
        .patch_config(&s, obj(json!({"host": {"k": "v"}})), None)
        .await
        .unwrap();
    let export = store.export_session(&s).await.unwrap().unwrap();
    assert_eq!(export.rows.len(), 2);
    assert_eq!(
        store.export_session(&unique_id("absent")).await.unwrap(),
        None
    );

    // Serialisation round trip (migrate may go through a file).
    let text = serde_json::to_string(&export).unwrap();
    let parsed: SessionExport = serde_json::from_str(&text).unwrap();
    assert_eq!(parsed, export);

    assert_eq!(
        store.import_session(export.clone()).await.unwrap(),
        ImportOutcome::AlreadyPresent
    );
    assert!(store.delete_session(&s).await.unwrap());
    assert_eq!(
        store.import_session(export.clone()).await.unwrap(),
        ImportOutcome::Imported
    );
    assert_eq!(store.export_session(&s).await.unwrap().unwrap(), export);
    assert_eq!(
        store.import_session(export.clone()).await.unwrap(),
        ImportOutcome::AlreadyPresent
    );
    assert_eq!(
        store.all_rows(&s).await.unwrap().len(),
        2,
        "re-import duplicates nothing"
    );

    let mut differing = export.clone();
    differing.rows[1].body = json!("changed");
    let err = store.import_session(differing).await;
    assert!(matches!(err, Err(StoreError::Conflict { .. })), "{err:?}");
    assert_eq!(store.export_session(&s).await.unwrap().unwrap(), export);

    let mut other = export.clone();
    other.record.session_id = unique_id("export-bad");
    let mut gap = other.clone();
    gap.rows.remove(0);
    let err = store.import_session(gap).await;
    assert!(matches!(err, Err(StoreError::InvalidInput(_))), "{err:?}");
    let mut retired_bound = other.clone();
    retired_bound.record.retired_threads.push("t1".to_string());
    let err = store.import_session(retired_bound).await;
    assert!(matches!(err, Err(StoreError::InvalidInput(_))), "{err:?}");
    let mut disagreeing = other.clone();
    disagreeing
        .record
        .model_config
        .insert(CODEX_THREAD_ID_KEY.into(), json!("zzz"));
    let err = store.import_session(disagreeing).await;
    assert!(matches!(err, Err(StoreError::InvalidInput(_))), "{err:?}");
    assert_eq!(store.session(&other.record.session_id).await.unwrap(), None);
}

/// Empty ids are refused with `InvalidInput` and write nothing.
pub async fn invalid_input(store: &dyn BindingStore) {
    let err = store.commit_turn(turn("", "t", vec![json!(1)])).await;
    assert!(matches!(err, Err(StoreError::InvalidInput(_))), "{err:?}");
    let s = unique_id("invalid");
    let err = store.commit_turn(turn(&s, "", vec![json!(1)])).await;
    assert!(matches!(err, Err(StoreError::InvalidInput(_))), "{err:?}");
    assert_eq!(store.session(&s).await.unwrap(), None);
    let err = store.retire_thread(&s, "", None).await;
    assert!(matches!(err, Err(StoreError::InvalidInput(_))), "{err:?}");
    let err = store.patch_config("", Map::new(), None).await;
    assert!(matches!(err, Err(StoreError::InvalidInput(_))), "{err:?}");
}

// ---------------------------------------------------------------------------------------------
// Property test against a plain model.

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
