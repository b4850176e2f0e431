//! Sessions as a whole: listing, deletion, export and import, copying, refused input.

use serde_json::{json, Map};

use super::{lost, obj, th, turn, unique_id};
use crate::{
    BindingStore, CommitOutcome, ImportOutcome, MirrorOutcome, SessionExport, StoreError,
    CODEX_THREAD_ID_KEY,
};

/// `list_sessions` pages in session-id order without gaps or repeats.
pub async fn list_sessions_pages(store: &BindingStore) {
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
pub async fn delete_session(store: &BindingStore) {
    let s = unique_id("delete");
    store
        .commit_turn(turn(&s, &th(&s, "t1"), vec![json!(1), json!(2)]))
        .await
        .unwrap();
    assert!(store.delete_session(&s).await.unwrap());
    assert!(!store.delete_session(&s).await.unwrap());
    assert_eq!(store.session(&s).await.unwrap(), None);
    assert!(store.all_rows(&s).await.unwrap().is_empty());
    let out = store
        .commit_turn(turn(&s, &th(&s, "t2"), vec![json!(3)]))
        .await
        .unwrap();
    assert_eq!(
        out,
        CommitOutcome::Published {
            first_seq: 0,
            row_count: 1,
            mirror: MirrorOutcome::None,
        }
    );
    assert_eq!(store.all_rows(&s).await.unwrap()[0].body, json!(3));
}

/// Export then import reproduces the session exactly; re-import is a no-op; a differing
/// session is a conflict; an inconsistent export is refused.
pub async fn export_import_roundtrip(store: &BindingStore) {
    let s = unique_id("export");
    store
        .commit_turn(turn(&s, &th(&s, "t1"), vec![json!({"a": 1}), json!("two")]))
        .await
        .unwrap();
    store
        .retire_thread(&s, &th(&s, "t0"), lost("gone", "x"), None)
        .await
        .unwrap();
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
    retired_bound.record.retired_threads.push(th(&s, "t1"));
    let err = store.import_session(retired_bound).await;
    assert!(matches!(err, Err(StoreError::InvalidInput(_))), "{err:?}");
    let mut disagreeing = other.clone();
    disagreeing
        .record
        .model_config
        .insert(CODEX_THREAD_ID_KEY.into(), json!("zzz"));
    let err = store.import_session(disagreeing).await;
    assert!(matches!(err, Err(StoreError::InvalidInput(_))), "{err:?}");
    let mut viewless = other.clone();
    viewless.record.model_config.remove(CODEX_THREAD_ID_KEY);
    let disagreeing = viewless;
    let err = store.import_session(disagreeing).await;
    assert!(matches!(err, Err(StoreError::InvalidInput(_))), "{err:?}");
    assert_eq!(store.session(&other.record.session_id).await.unwrap(), None);
}

/// Empty ids are refused with `InvalidInput` and write nothing.
pub async fn invalid_input(store: &BindingStore) {
    let err = store
        .commit_turn(turn("", "t-of-nobody", vec![json!(1)]))
        .await;
    assert!(matches!(err, Err(StoreError::InvalidInput(_))), "{err:?}");
    let s = unique_id("invalid");
    let err = store.commit_turn(turn(&s, "", vec![json!(1)])).await;
    assert!(matches!(err, Err(StoreError::InvalidInput(_))), "{err:?}");
    assert_eq!(store.session(&s).await.unwrap(), None);
    let err = store.retire_thread(&s, "", lost("gone", "x"), None).await;
    assert!(matches!(err, Err(StoreError::InvalidInput(_))), "{err:?}");
    let err = store.patch_config("", Map::new(), None).await;
    assert!(matches!(err, Err(StoreError::InvalidInput(_))), "{err:?}");
}

/// [`copy_sessions`](crate::copy_sessions) into and out of the store: every session arrives
/// whole and verified, a rerun copies nothing twice, and a differing session in the target is
/// a conflict.
pub async fn copy_sessions_roundtrip(store: &BindingStore) {
    let source = crate::BindingStore::memory();
    let base = unique_id("copy");
    let ids: Vec<String> = (0..5).map(|i| format!("{base}/{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        source
            .commit_turn(turn(
                id,
                &th(id, "t1"),
                (0..i).map(|n| json!({"n": n})).collect(),
            ))
            .await
            .unwrap();
    }
    source
        .retire_thread(&ids[1], &th(&ids[1], "t1"), lost("gone", "x"), None)
        .await
        .unwrap();
    source
        .patch_config(&ids[2], obj(json!({"host": {"k": [1, 2]}})), None)
        .await
        .unwrap();
    let mut seen = Vec::new();
    let report = crate::copy_sessions(&source, store, &mut |p| {
        seen.push((p.session_id.to_string(), p.report.sessions));
    })
    .await
    .unwrap();
    assert_eq!(
        (report.sessions, report.copied, report.already_present),
        (5, 5, 0)
    );
    assert_eq!(report.rows_copied, 10);
    assert_eq!(
        seen.iter().map(|s| s.1).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );
    for id in &ids {
        assert_eq!(
            store.export_session(id).await.unwrap(),
            source.export_session(id).await.unwrap()
        );
    }
    // A rerun (as after an interruption) finds everything present.
    let report = crate::copy_sessions(&source, store, &mut |_| {})
        .await
        .unwrap();
    assert_eq!((report.copied, report.already_present), (0, 5));
    // And back: the store's sessions (these and any other) land in an empty store.
    let back = crate::BindingStore::memory();
    let report = crate::copy_sessions(store, &back, &mut |_| {})
        .await
        .unwrap();
    assert_eq!(report.sessions, store.count_sessions().await.unwrap());
    for id in &ids {
        assert_eq!(
            back.export_session(id).await.unwrap(),
            source.export_session(id).await.unwrap()
        );
    }
    // A session that differs in the target stops the copy with a conflict.
    source
        .commit_turn(turn(&ids[0], &th(&ids[0], "t2"), vec![json!("more")]))
        .await
        .unwrap();
    let err = crate::copy_sessions(&source, store, &mut |_| {}).await;
    assert!(
        matches!(&err, Err(StoreError::Conflict { session_id, .. }) if *session_id == ids[0]),
        "{err:?}"
    );
}

/// [`verify`](BindingStore::verify) on a healthy store: complete, no problem, every session
/// and row counted, progress reported.
pub async fn verify_finds_nothing_on_a_healthy_store(store: &BindingStore) {
    let s = unique_id("verify");
    store
        .commit_turn(turn(&s, &th(&s, "t1"), vec![json!(1), json!(2), json!(3)]))
        .await
        .unwrap();
    let mut last = None;
    let report = store.verify(&mut |p| last = Some(*p)).await.unwrap();
    assert!(report.is_ok(), "{report:?}");
    assert!(report.sessions >= 1 && report.rows >= 3, "{report:?}");
    assert_eq!(report.sessions, store.count_sessions().await.unwrap());
    let last = last.expect("progress was reported");
    assert_eq!((last.sessions, last.rows), (report.sessions, report.rows));
}
