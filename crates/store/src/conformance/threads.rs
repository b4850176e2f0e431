//! One thread, one session: every thread the store bound, gave up or retired belongs to its
//! session until the session is deleted.

use serde_json::json;

use super::{lost, turn, unique_id};
use crate::Result;
use crate::{BindingStore, ImportOutcome, Retirement, SessionExport, StoreError};

fn taken_by<T: std::fmt::Debug>(result: &Result<T>, owner: &str) -> bool {
    matches!(result, Err(StoreError::ThreadTaken { session_id, .. }) if session_id == owner)
}

/// A commit or a retire of another session's thread is `ThreadTaken` naming the owner and
/// writes nothing; `thread_session` names the owner; deleting the owner frees the thread.
pub async fn a_thread_belongs_to_one_session(store: &BindingStore) {
    let (a, b) = (unique_id("owner-a"), unique_id("owner-b"));
    let (t1, t2, t3) = (unique_id("t1"), unique_id("t2"), unique_id("t3"));
    assert_eq!(store.thread_session(&t1).await.unwrap(), None);
    store
        .commit_turn(turn(&a, &t1, vec![json!(1)]))
        .await
        .unwrap();
    assert_eq!(
        store.thread_session(&t1).await.unwrap().as_deref(),
        Some(a.as_str())
    );

    let refused = store.commit_turn(turn(&b, &t1, vec![json!(2)])).await;
    assert!(taken_by(&refused, &a), "{refused:?}");
    assert_eq!(store.session(&b).await.unwrap(), None, "nothing written");
    for retirement in [lost("gone", "x"), Retirement::Ended] {
        let refused = store.retire_thread(&b, &t1, retirement, None).await;
        assert!(taken_by(&refused, &a), "{refused:?}");
    }
    assert_eq!(store.session(&b).await.unwrap(), None);

    // A thread stays its session's after the binding moved on, and after it was retired.
    store.commit_turn(turn(&a, &t2, vec![])).await.unwrap();
    store
        .retire_thread(&a, &t3, Retirement::Ended, None)
        .await
        .unwrap();
    for thread in [&t1, &t2, &t3] {
        assert_eq!(
            store.thread_session(thread).await.unwrap().as_deref(),
            Some(a.as_str()),
            "{thread}"
        );
        let refused = store.commit_turn(turn(&b, thread, vec![])).await;
        assert!(taken_by(&refused, &a), "{thread}: {refused:?}");
    }
    // The owner itself goes on with any of them.
    assert!(store
        .commit_turn(turn(&a, &t1, vec![]))
        .await
        .unwrap()
        .is_published());

    // Deleting the owner frees its threads.
    assert!(store.delete_session(&a).await.unwrap());
    for thread in [&t1, &t2, &t3] {
        assert_eq!(
            store.thread_session(thread).await.unwrap(),
            None,
            "{thread}"
        );
    }
    assert!(store
        .commit_turn(turn(&b, &t1, vec![]))
        .await
        .unwrap()
        .is_published());
    assert_eq!(
        store.thread_session(&t1).await.unwrap().as_deref(),
        Some(b.as_str())
    );
}

/// An import that names another session's thread is `ThreadTaken` and writes nothing; an
/// imported session owns the threads it names.
pub async fn imports_claim_their_threads(store: &BindingStore) {
    let (a, b) = (unique_id("import-a"), unique_id("import-b"));
    let (t1, t2) = (unique_id("t1"), unique_id("t2"));
    store
        .commit_turn(turn(&a, &t1, vec![json!(1)]))
        .await
        .unwrap();
    store
        .retire_thread(&a, &t2, lost("gone", "x"), None)
        .await
        .unwrap();
    let export = store.export_session(&a).await.unwrap().unwrap();
    let mut copy = export.clone();
    copy.record.session_id = b.clone();
    let refused = store.import_session(copy).await;
    assert!(taken_by(&refused, &a), "{refused:?}");
    assert_eq!(store.session(&b).await.unwrap(), None);

    assert!(store.delete_session(&a).await.unwrap());
    store.import_session(export).await.unwrap();
    for thread in [&t1, &t2] {
        assert_eq!(
            store.thread_session(thread).await.unwrap().as_deref(),
            Some(a.as_str())
        );
    }
}

/// An export carries every thread of its session, those it used before its current one
/// included, and an import claims them all: after a migrate no other session can take a
/// thread the session used earlier, as it could not in the source. An export without them
/// (an older rethread's) claims the threads its record names; importing the full export
/// over that claims the rest.
pub async fn exports_carry_the_threads_used_before(store: &BindingStore) {
    let (a, b) = (unique_id("earlier-a"), unique_id("earlier-b"));
    let (t1, t2) = (unique_id("t1"), unique_id("t2"));
    for thread in [&t1, &t2] {
        store
            .commit_turn(turn(&a, thread, vec![json!(1)]))
            .await
            .unwrap();
    }
    let export = store.export_session(&a).await.unwrap().unwrap();
    assert!(store.delete_session(&a).await.unwrap());
    assert_eq!(
        store.import_session(export.clone()).await.unwrap(),
        ImportOutcome::Imported
    );
    for thread in [&t1, &t2] {
        assert_eq!(
            store.thread_session(thread).await.unwrap().as_deref(),
            Some(a.as_str()),
            "{thread}"
        );
    }
    let refused = store.commit_turn(turn(&b, &t1, vec![])).await;
    assert!(taken_by(&refused, &a), "{refused:?}");
    assert_eq!(store.export_session(&a).await.unwrap().unwrap(), export);

    let mut older = serde_json::to_value(&export).unwrap();
    older.as_object_mut().unwrap().remove("threads");
    let older: SessionExport = serde_json::from_value(older).unwrap();
    assert!(store.delete_session(&a).await.unwrap());
    store.import_session(older).await.unwrap();
    assert_eq!(store.thread_session(&t1).await.unwrap(), None);
    assert_eq!(
        store.thread_session(&t2).await.unwrap().as_deref(),
        Some(a.as_str())
    );
    assert_eq!(
        store.import_session(export.clone()).await.unwrap(),
        ImportOutcome::AlreadyPresent
    );
    assert_eq!(
        store.thread_session(&t1).await.unwrap().as_deref(),
        Some(a.as_str())
    );
    assert_eq!(store.export_session(&a).await.unwrap().unwrap(), export);
}
