//! Bindings: commit, merge-patch, retirement, row order, concurrency.

use futures::future::join_all;
use serde_json::{json, Map, Value};

use super::{lost, obj, th, turn, unique_id};
use crate::{BindingStore, CommitOutcome, MirrorOutcome, StoreError, CODEX_THREAD_ID_KEY};

/// `commit_turn` appends the rows and publishes the binding with its metadata; re-committing on
/// the same thread keeps `bound_at_ms`.
pub async fn commit_publishes_binding(store: &BindingStore) {
    let s = unique_id("commit");
    assert_eq!(store.session(&s).await.unwrap(), None);
    let out = store
        .commit_turn(turn(&s, &th(&s, "t1"), vec![json!("a"), json!("b")]))
        .await
        .unwrap();
    assert_eq!(
        out,
        CommitOutcome::Published {
            first_seq: 0,
            row_count: 2,
            mirror: MirrorOutcome::None,
        }
    );
    let rec = store
        .session(&s)
        .await
        .unwrap()
        .expect("session created by commit_turn");
    assert_eq!(rec.session_id, s);
    assert_eq!(rec.row_count, 2);
    let b = rec.binding().cloned().expect("binding published");
    assert_eq!(b.thread_id, th(&s, "t1"));
    assert_eq!(b.codex_home, Some(format!("/codex-home/{}", th(&s, "t1"))));
    assert_eq!(
        rec.model_config.get(CODEX_THREAD_ID_KEY),
        Some(&json!(th(&s, "t1")))
    );
    assert!(rec.created_at_ms > 0 && rec.updated_at_ms >= rec.created_at_ms);

    // Publish-only commit (the host keeps its own transcript): no rows, same thread.
    let out = store
        .commit_turn(turn(&s, &th(&s, "t1"), vec![]))
        .await
        .unwrap();
    assert_eq!(
        out,
        CommitOutcome::Published {
            first_seq: 2,
            row_count: 2,
            mirror: MirrorOutcome::None,
        }
    );
    let again = store.binding(&s).await.unwrap().unwrap();
    assert_eq!(
        again.bound_at_ms, b.bound_at_ms,
        "same thread keeps its bound_at_ms"
    );

    let out = store
        .commit_turn(turn(&s, &th(&s, "t2"), vec![json!("c")]))
        .await
        .unwrap();
    assert_eq!(
        out,
        CommitOutcome::Published {
            first_seq: 2,
            row_count: 3,
            mirror: MirrorOutcome::None,
        }
    );
    assert_eq!(store.thread_id(&s).await.unwrap(), Some(th(&s, "t2")));
    assert_eq!(store.all_rows(&s).await.unwrap().len(), 3);
}

/// RFC 7396 merge-patch: `null` removes, nested objects merge, other keys are kept, the returned
/// config is what is stored.
pub async fn merge_patch_semantics(store: &BindingStore) {
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
        .commit_turn(turn(&s, &th(&s, "t1"), vec![json!(1)]))
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
    let want =
        json!({"opts": {"b": 2, "c": 3}, "x": [3], "n": 7, CODEX_THREAD_ID_KEY: th(&s, "t1")});
    assert_eq!(Value::Object(c.clone()), want);
    let rec = store.session(&s).await.unwrap().unwrap();
    assert_eq!(rec.model_config, c);
    assert_eq!(
        rec.thread_id(),
        Some(th(&s, "t1").as_str()),
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
    store
        .commit_turn(turn(&s, &th(&s, "t2"), vec![]))
        .await
        .unwrap();
    let rec = store.session(&s).await.unwrap().unwrap();
    assert_eq!(rec.model_config.get("n"), Some(&json!({"deep": true})));
    assert_eq!(rec.model_config.get("x"), Some(&json!([3])));
}

/// A retired thread's rows commit but it is never published; retirement is persistent,
/// idempotent, and created for a session that did not exist yet.
pub async fn retired_thread_is_never_published(store: &BindingStore) {
    let s = unique_id("retired");
    store
        .commit_turn(turn(&s, &th(&s, "t1"), vec![json!(1)]))
        .await
        .unwrap();
    store
        .retire_thread(&s, &th(&s, "t1"), lost("gone", "x"), None)
        .await
        .unwrap();
    assert_eq!(
        store.binding(&s).await.unwrap(),
        None,
        "retiring the bound thread unbinds it"
    );
    let out = store
        .commit_turn(turn(&s, &th(&s, "t1"), vec![json!(2), json!(3)]))
        .await
        .unwrap();
    assert_eq!(
        out,
        CommitOutcome::RetiredNotPublished {
            first_seq: 1,
            row_count: 3,
            mirror: MirrorOutcome::None,
        }
    );
    assert!(!out.is_published());
    assert_eq!(store.binding(&s).await.unwrap(), None);
    assert_eq!(
        store.all_rows(&s).await.unwrap().len(),
        3,
        "a retired thread's rows commit"
    );

    store
        .commit_turn(turn(&s, &th(&s, "t2"), vec![]))
        .await
        .unwrap();
    store
        .retire_thread(&s, &th(&s, "t1"), lost("gone", "x"), None)
        .await
        .unwrap();
    store
        .retire_thread(&s, &th(&s, "t3"), lost("gone", "x"), None)
        .await
        .unwrap();
    let rec = store.session(&s).await.unwrap().unwrap();
    assert_eq!(
        rec.thread_id(),
        Some(th(&s, "t2").as_str()),
        "retiring another thread keeps the binding"
    );
    assert_eq!(rec.retired_threads, vec![th(&s, "t1"), th(&s, "t3")]);
    let out = store
        .commit_turn(turn(&s, &th(&s, "t3"), vec![]))
        .await
        .unwrap();
    assert!(!out.is_published());
    assert_eq!(store.thread_id(&s).await.unwrap(), Some(th(&s, "t2")));

    // Retiring first (e.g. another process decided the thread is dead) also holds.
    let fresh = unique_id("retired-first");
    store
        .retire_thread(&fresh, &th(&fresh, "t1"), lost("gone", "x"), None)
        .await
        .unwrap();
    assert!(store
        .session(&fresh)
        .await
        .unwrap()
        .unwrap()
        .is_retired(&th(&fresh, "t1")));
    let out = store
        .commit_turn(turn(&fresh, &th(&fresh, "t1"), vec![json!(0)]))
        .await
        .unwrap();
    assert_eq!(
        out,
        CommitOutcome::RetiredNotPublished {
            first_seq: 0,
            row_count: 1,
            mirror: MirrorOutcome::None,
        }
    );
    assert_eq!(store.binding(&fresh).await.unwrap(), None);
}

/// Rows keep their order and sequence numbers across turns; range reads are clipped.
pub async fn row_order(store: &BindingStore) {
    let s = unique_id("rows");
    let mut expected = Vec::new();
    for t in 0..5u64 {
        let rows: Vec<Value> = (0..t).map(|i| json!({"turn": t, "i": i})).collect();
        let out = store
            .commit_turn(turn(&s, &th(&s, &format!("t{t}")), rows.clone()))
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
pub async fn concurrent_patches_of_distinct_keys(store: &BindingStore) {
    let s = unique_id("concurrent-patch");
    store
        .commit_turn(turn(&s, &th(&s, "t1"), vec![json!(0)]))
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
    assert_eq!(rec.thread_id(), Some(th(&s, "t1").as_str()));
}

/// Many sessions committing at once (group commit on durable backends): no loss, no
/// duplicates, every session's rows in order and its binding on its last thread.
pub async fn many_sessions_commit_at_once(store: &BindingStore) {
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
                    .commit_turn(turn(&s, &th(&s, &format!("t{t}")), rows))
                    .await
                    .unwrap();
                assert_eq!(
                    out,
                    CommitOutcome::Published {
                        first_seq: 2 * t,
                        row_count: 2 * t + 2,
                        mirror: MirrorOutcome::None,
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
        assert_eq!(
            rec.thread_id(),
            Some(th(&s, &format!("t{}", turns - 1)).as_str())
        );
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
pub async fn refused_write_does_not_fail_its_neighbours(store: &BindingStore) {
    let base = unique_id("neighbours");
    let good = join_all((0..16).map(|i| {
        let s = format!("{base}-{i}");
        async move {
            store
                .commit_turn(turn(&s, &th(&s, "t"), vec![json!(i)]))
                .await
        }
    }));
    let bad = join_all((0..16).map(|i| {
        let s = format!("{base}-{i}");
        async move {
            store
                .patch_config(&s, obj(json!({CODEX_THREAD_ID_KEY: i, "k": i})), None)
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
        let t = th(&rec.session_id, "t");
        assert_eq!((rec.row_count, rec.thread_id()), (1, Some(t.as_str())));
    }
}
