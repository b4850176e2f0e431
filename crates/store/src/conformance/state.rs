//! The typed binding state ([`BindingState`]): the give-up (a compare-and-set to
//! `GivenUp`), the host's own end of a thread, the owed notice, and the published view in
//! `model_config`.

use serde_json::json;

use super::leases::{owner, LONG};
use super::{lost, obj, th, turn, unique_id};
use crate::{
    BindingState, BindingStore, GivenUp, LeaseLoss, Retirement, StoreError, CODEX_THREAD_ID_KEY,
};

fn given_up(store_state: &BindingState) -> &GivenUp {
    match store_state {
        BindingState::GivenUp(g) => g,
        other => panic!("expected GivenUp, got {other:?}"),
    }
}

/// Giving the bound thread up makes the session `GivenUp` (thread, reason, message, when, the
/// notice owed) and unbinds it in one write; retrying changes nothing; a late commit of the
/// lost thread is not published; a commit on a new thread binds it and settles the notice.
pub async fn give_up_then_a_new_thread_binds(store: &BindingStore) {
    let s = unique_id("give-up");
    store
        .commit_turn(turn(&s, &th(&s, "t1"), vec![json!(1)]))
        .await
        .unwrap();
    let record = store.require_session(&s).await.unwrap();
    assert_eq!(record.thread_id(), Some(th(&s, "t1").as_str()));
    assert_eq!(record.pending_notice(), None, "a commit owes no notice");

    store
        .retire_thread(&s, &th(&s, "t1"), lost("gone", "no rollout found"), None)
        .await
        .unwrap();
    // One read shows the whole give-up: the state, the view gone, the thread retired.
    let record = store.require_session(&s).await.unwrap();
    let g = given_up(&record.state).clone();
    assert_eq!(
        (g.thread_id.as_str(), g.reason.as_str(), g.message.as_str()),
        (th(&s, "t1").as_str(), "gone", "no rollout found")
    );
    assert!(g.at_ms > 0 && !g.notice_delivered, "{g:?}");
    assert_eq!(record.given_up(), Some(&g));
    assert_eq!(record.pending_notice(), Some(&g));
    assert_eq!(record.binding(), None);
    assert_eq!(record.model_config.get(CODEX_THREAD_ID_KEY), None);
    assert!(record.is_retired(&th(&s, "t1")));

    // Retrying the give-up (idempotent) keeps it exactly, its time included.
    store
        .retire_thread(&s, &th(&s, "t1"), lost("unreadable", "other"), None)
        .await
        .unwrap();
    assert_eq!(store.require_session(&s).await.unwrap(), record);

    // A late commit of the lost thread lands its rows, not its binding.
    let out = store
        .commit_turn(turn(&s, &th(&s, "t1"), vec![json!(2)]))
        .await
        .unwrap();
    assert!(!out.is_published());
    let late = store.require_session(&s).await.unwrap();
    assert_eq!(late.state, record.state);
    assert_eq!(late.row_count, 2);

    // A turn on a new thread binds it in the same write that settles the notice.
    let out = store
        .commit_turn(turn(&s, &th(&s, "t2"), vec![json!(3)]))
        .await
        .unwrap();
    assert!(out.is_published());
    let record = store.require_session(&s).await.unwrap();
    assert_eq!(record.thread_id(), Some(th(&s, "t2").as_str()));
    assert_eq!((record.given_up(), record.pending_notice()), (None, None));
    assert_eq!(
        record.model_config.get(CODEX_THREAD_ID_KEY),
        Some(&json!(th(&s, "t2")))
    );
    // The binding remembers the fallback it replaced, across its later turns, and a binding
    // that replaced none says so.
    let from = record
        .binding()
        .unwrap()
        .fell_back_from
        .clone()
        .expect("the fallback");
    assert_eq!(
        (from.thread_id.as_str(), from.reason.as_str(), from.at_ms),
        (th(&s, "t1").as_str(), "gone", g.at_ms)
    );
    store
        .commit_turn(turn(&s, &th(&s, "t2"), vec![json!(4)]))
        .await
        .unwrap();
    let later = store.require_session(&s).await.unwrap();
    assert_eq!(later.binding().unwrap().fell_back_from, Some(from));
    let fresh = unique_id("no-fallback");
    store
        .commit_turn(turn(&fresh, &th(&fresh, "t1"), vec![json!(1)]))
        .await
        .unwrap();
    let record = store.require_session(&fresh).await.unwrap();
    assert_eq!(record.binding().unwrap().fell_back_from, None);
}

/// The give-up is a compare-and-set: a binding to another thread survives (the lost thread is
/// still retired), and giving up a thread of a session that is not bound to it never makes a
/// `GivenUp`, also for a session that did not exist (it is created, with the thread retired).
pub async fn give_up_is_compare_and_set(store: &BindingStore) {
    let s = unique_id("give-up-cas");
    store
        .commit_turn(turn(&s, &th(&s, "t1"), vec![]))
        .await
        .unwrap();
    store
        .commit_turn(turn(&s, &th(&s, "t2"), vec![]))
        .await
        .unwrap();
    store
        .retire_thread(&s, &th(&s, "t1"), lost("gone", "x"), None)
        .await
        .unwrap();
    let record = store.require_session(&s).await.unwrap();
    assert_eq!(
        record.thread_id(),
        Some(th(&s, "t2").as_str()),
        "the newer binding survives"
    );
    assert!(record.is_retired(&th(&s, "t1")));
    assert_eq!(record.pending_notice(), None);

    let fresh = unique_id("give-up-fresh");
    store
        .retire_thread(&fresh, &th(&fresh, "t9"), lost("gone", "x"), None)
        .await
        .unwrap();
    let record = store.require_session(&fresh).await.unwrap();
    assert_eq!(record.state, BindingState::Unbound);
    assert!(record.is_retired(&th(&fresh, "t9")));
    let out = store
        .commit_turn(turn(&fresh, &th(&fresh, "t9"), vec![json!(0)]))
        .await
        .unwrap();
    assert!(!out.is_published(), "retired first, never published");
}

/// The host ending its thread (`Retirement::Ended`) unbinds and retires it in one write and
/// owes no notice; it leaves a give-up of that thread as it is.
pub async fn ended_unbinds_without_a_notice(store: &BindingStore) {
    let s = unique_id("ended");
    store
        .commit_turn(turn(&s, &th(&s, "t1"), vec![]))
        .await
        .unwrap();
    store
        .retire_thread(&s, &th(&s, "t1"), Retirement::Ended, None)
        .await
        .unwrap();
    let record = store.require_session(&s).await.unwrap();
    assert_eq!(record.state, BindingState::Unbound);
    assert_eq!(record.model_config.get(CODEX_THREAD_ID_KEY), None);
    assert!(record.is_retired(&th(&s, "t1")));
    let late = store
        .commit_turn(turn(&s, &th(&s, "t1"), vec![]))
        .await
        .unwrap();
    assert!(
        !late.is_published(),
        "an ended thread is never published again"
    );

    store
        .commit_turn(turn(&s, &th(&s, "t2"), vec![]))
        .await
        .unwrap();
    store
        .retire_thread(&s, &th(&s, "t2"), lost("incompatible", "paginated"), None)
        .await
        .unwrap();
    let before = store.require_session(&s).await.unwrap();
    store
        .retire_thread(&s, &th(&s, "t2"), Retirement::Ended, None)
        .await
        .unwrap();
    assert_eq!(store.require_session(&s).await.unwrap(), before);
    assert_eq!(given_up(&before.state).reason, "incompatible");
}

/// Marking the notice delivered settles it for that give-up only: `true` for the given-up
/// thread (also again), `false` changing nothing for anything else.
pub async fn notice_delivered_is_recorded(store: &BindingStore) {
    let s = unique_id("delivered");
    assert!(!store
        .mark_notice_delivered(&s, &th(&s, "t1"), None)
        .await
        .unwrap());
    assert_eq!(store.session(&s).await.unwrap(), None, "nothing created");
    store
        .commit_turn(turn(&s, &th(&s, "t1"), vec![]))
        .await
        .unwrap();
    assert!(!store
        .mark_notice_delivered(&s, &th(&s, "t1"), None)
        .await
        .unwrap());
    store
        .retire_thread(&s, &th(&s, "t1"), lost("gone", "x"), None)
        .await
        .unwrap();
    let before = store.export_session(&s).await.unwrap();
    assert!(!store
        .mark_notice_delivered(&s, &th(&s, "t0"), None)
        .await
        .unwrap());
    assert_eq!(store.export_session(&s).await.unwrap(), before);

    assert!(store
        .mark_notice_delivered(&s, &th(&s, "t1"), None)
        .await
        .unwrap());
    let record = store.require_session(&s).await.unwrap();
    assert_eq!(record.pending_notice(), None);
    let g = record.given_up().expect("still given up").clone();
    assert!(g.notice_delivered);
    assert!(store
        .mark_notice_delivered(&s, &th(&s, "t1"), None)
        .await
        .unwrap());
    assert_eq!(
        store.require_session(&s).await.unwrap().given_up(),
        Some(&g)
    );
}

/// A refused give-up (a lost lease, a thread of another session, invalid input) writes
/// nothing: the binding is kept and no notice is owed.
pub async fn refused_give_up_writes_nothing(store: &BindingStore) {
    let s = unique_id("give-up-refused");
    let (a, b) = (owner("a"), owner("b"));
    let first = store.acquire_lease(&s, &a, LONG).await.unwrap();
    let mut commit = turn(&s, &th(&s, "t1"), vec![json!(1)]);
    commit.fence = Some(first.fence());
    store.commit_turn(commit).await.unwrap();
    assert!(store.release_lease(&first).await.unwrap());
    let second = store.acquire_lease(&s, &b, LONG).await.unwrap();
    let other = unique_id("give-up-other");
    store
        .commit_turn(turn(&other, &th(&other, "t"), vec![]))
        .await
        .unwrap();
    let before = store.export_session(&s).await.unwrap();

    let stale = store
        .retire_thread(&s, &th(&s, "t1"), lost("gone", "x"), Some(&first.fence()))
        .await;
    assert!(
        matches!(&stale, Err(StoreError::LeaseLost { cause: LeaseLoss::TakenOver { holder }, .. }) if *holder == b),
        "{stale:?}"
    );
    let taken = store
        .retire_thread(
            &s,
            &th(&other, "t"),
            lost("gone", "x"),
            Some(&second.fence()),
        )
        .await;
    assert!(
        matches!(&taken, Err(StoreError::ThreadTaken { session_id, .. }) if *session_id == other),
        "{taken:?}"
    );
    let empty = store
        .retire_thread(&s, "", lost("gone", "x"), Some(&second.fence()))
        .await;
    assert!(
        matches!(empty, Err(StoreError::InvalidInput(_))),
        "{empty:?}"
    );
    assert_eq!(
        store.export_session(&s).await.unwrap(),
        before,
        "a refused give-up writes nothing"
    );
    assert!(store.release_lease(&second).await.unwrap());
}

/// `model_config[CODEX_THREAD_ID_KEY]` is the store's view of the state: present iff bound,
/// and a patch naming it is refused with nothing written.
pub async fn the_published_view_is_the_stores(store: &BindingStore) {
    let s = unique_id("view");
    store
        .commit_turn(turn(&s, &th(&s, "t1"), vec![json!(1)]))
        .await
        .unwrap();
    let before = store.export_session(&s).await.unwrap();
    for value in [json!("t9"), json!(null), json!(5)] {
        let refused = store
            .patch_config(&s, obj(json!({CODEX_THREAD_ID_KEY: value, "k": 1})), None)
            .await;
        assert!(
            matches!(refused, Err(StoreError::InvalidInput(_))),
            "{refused:?}"
        );
    }
    assert_eq!(store.export_session(&s).await.unwrap(), before);
    // A patch of the host's keys keeps the view.
    let config = store
        .patch_config(&s, obj(json!({"k": 1})), None)
        .await
        .unwrap();
    assert_eq!(config.get(CODEX_THREAD_ID_KEY), Some(&json!(th(&s, "t1"))));
    // Forgetting a given-up session removes it whole.
    store
        .retire_thread(&s, &th(&s, "t1"), lost("gone", "x"), None)
        .await
        .unwrap();
    assert!(store.delete_session(&s).await.unwrap());
    assert_eq!(store.session(&s).await.unwrap(), None);
}
