//! The pending fallback notice ([`SessionRecord::pending_notice`](crate::SessionRecord::pending_notice)):
//! set by the give-up in its own transaction, cleared by the next published commit, set by
//! nothing else.

use serde_json::json;

use super::leases::{owner, LONG};
use super::{obj, turn, unique_id};
use crate::{
    BindingStore, BindingStoreExt, PendingNotice, StoreError, CODEX_THREAD_ID_KEY,
    PENDING_NOTICE_KEY,
};

fn notice(thread: &str) -> Option<PendingNotice> {
    Some(PendingNotice {
        thread_id: thread.to_string(),
    })
}

/// `retire_thread` of the bound thread unbinds it and records the notice in one write; a
/// commit that is not published keeps it; the next published commit clears it.
pub async fn give_up_sets_the_pending_notice_and_publish_clears_it(store: &dyn BindingStore) {
    let s = unique_id("notice");
    store
        .commit_turn(turn(&s, "t1", vec![json!(1)]))
        .await
        .unwrap();
    let record = store.require_session(&s).await.unwrap();
    assert_eq!(record.pending_notice(), None, "a commit sets no notice");

    store.retire_thread(&s, "t1", None).await.unwrap();
    // One read shows both halves of the give-up: the binding gone and the notice pending.
    let record = store.require_session(&s).await.unwrap();
    assert_eq!(record.binding, None);
    assert_eq!(record.pending_notice(), notice("t1"));
    assert_eq!(
        record.model_config.get(PENDING_NOTICE_KEY),
        Some(&json!({"thread_id": "t1"}))
    );
    // Retrying the give-up (idempotent) keeps the same notice.
    store.retire_thread(&s, "t1", None).await.unwrap();
    assert_eq!(
        store.require_session(&s).await.unwrap().pending_notice(),
        notice("t1")
    );

    // A late commit of the retired thread is not published and keeps the notice.
    let out = store
        .commit_turn(turn(&s, "t1", vec![json!(2)]))
        .await
        .unwrap();
    assert!(!out.is_published());
    assert_eq!(
        store.require_session(&s).await.unwrap().pending_notice(),
        notice("t1")
    );

    // Publishing the new thread clears it, in the same write.
    let out = store
        .commit_turn(turn(&s, "t2", vec![json!(3)]))
        .await
        .unwrap();
    assert!(out.is_published());
    let record = store.require_session(&s).await.unwrap();
    assert_eq!(record.thread_id(), Some("t2"));
    assert_eq!(record.pending_notice(), None);
    assert!(!record.model_config.contains_key(PENDING_NOTICE_KEY));

    // Giving up a session that has no record yet also records it (the session is created).
    let fresh = unique_id("notice-fresh");
    store.retire_thread(&fresh, "t9", None).await.unwrap();
    assert_eq!(
        store
            .require_session(&fresh)
            .await
            .unwrap()
            .pending_notice(),
        notice("t9")
    );
}

/// A give-up that is refused (a lost lease, invalid input) writes nothing: no notice, the
/// binding kept.
pub async fn failed_give_up_writes_no_notice(store: &dyn BindingStore) {
    let s = unique_id("notice-fail");
    let (a, b) = (owner("a"), owner("b"));
    let first = store.acquire_lease(&s, &a, LONG).await.unwrap();
    let mut commit = turn(&s, "t1", vec![json!(1)]);
    commit.fence = Some(first.fence());
    store.commit_turn(commit).await.unwrap();
    assert!(store.release_lease(&first).await.unwrap());
    let second = store.acquire_lease(&s, &b, LONG).await.unwrap();
    let before = store.export_session(&s).await.unwrap();

    let stale = store.retire_thread(&s, "t1", Some(&first.fence())).await;
    assert!(
        matches!(stale, Err(StoreError::LeaseLost { .. })),
        "{stale:?}"
    );
    let empty = store.retire_thread(&s, "", Some(&second.fence())).await;
    assert!(
        matches!(empty, Err(StoreError::InvalidInput(_))),
        "{empty:?}"
    );
    assert_eq!(
        store.export_session(&s).await.unwrap(),
        before,
        "a refused give-up writes nothing"
    );
    let record = store.require_session(&s).await.unwrap();
    assert_eq!(record.pending_notice(), None);
    assert_eq!(record.thread_id(), Some("t1"));
    assert!(store.release_lease(&second).await.unwrap());
}

/// Only the give-up records a notice: not an explicit drop, not a patch that unbinds, not the
/// host ending its thread (`end_thread`), not retiring a thread the session is no longer
/// bound to; forgetting removes it with the
/// session; hosts cannot write it.
pub async fn only_the_give_up_sets_the_pending_notice(store: &dyn BindingStore) {
    let s = unique_id("notice-drop");
    store.commit_turn(turn(&s, "t1", vec![])).await.unwrap();
    assert!(store.drop_binding_if(&s, "t1", None).await.unwrap());
    let record = store.require_session(&s).await.unwrap();
    assert_eq!((&record.binding, record.pending_notice()), (&None, None));

    store.commit_turn(turn(&s, "t2", vec![])).await.unwrap();
    store
        .patch_config(&s, obj(json!({CODEX_THREAD_ID_KEY: null})), None)
        .await
        .unwrap();
    let record = store.require_session(&s).await.unwrap();
    assert_eq!((&record.binding, record.pending_notice()), (&None, None));

    // The host ending its bound thread (`end_thread`) retires and unbinds it in one write,
    // and leaves no notice: nothing was lost.
    store.commit_turn(turn(&s, "t2b", vec![])).await.unwrap();
    store.end_thread(&s, "t2b", None).await.unwrap();
    let record = store.require_session(&s).await.unwrap();
    assert_eq!((&record.binding, record.pending_notice()), (&None, None));
    assert!(record.is_retired("t2b"));
    let late = store.commit_turn(turn(&s, "t2b", vec![])).await.unwrap();
    assert!(
        !late.is_published(),
        "an ended thread is never published again"
    );

    // Bound to t3, retiring t2 (an old thread) leaves t3 bound and no notice.
    store.commit_turn(turn(&s, "t3", vec![])).await.unwrap();
    store.retire_thread(&s, "t2", None).await.unwrap();
    let record = store.require_session(&s).await.unwrap();
    assert_eq!(record.thread_id(), Some("t3"));
    assert_eq!(record.pending_notice(), None);

    // The key is the store's: a patch naming it is refused with nothing written.
    let before = store.export_session(&s).await.unwrap();
    for value in [json!({"thread_id": "t3"}), json!(null)] {
        let refused = store
            .patch_config(&s, obj(json!({PENDING_NOTICE_KEY: value})), None)
            .await;
        assert!(
            matches!(refused, Err(StoreError::InvalidInput(_))),
            "{refused:?}"
        );
    }
    assert_eq!(store.export_session(&s).await.unwrap(), before);

    // Forgetting a session with a pending notice removes both.
    store.retire_thread(&s, "t3", None).await.unwrap();
    assert_eq!(
        store.require_session(&s).await.unwrap().pending_notice(),
        notice("t3")
    );
    assert!(store.delete_session(&s).await.unwrap());
    assert_eq!(store.session(&s).await.unwrap(), None);
}
