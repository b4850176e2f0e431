//! Leases: exclusion, renewal, expiry, fences, dead holders.

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::future::join_all;
use serde_json::json;

use super::{lost, obj, th, turn, unique_id, NEXT};
use crate::Result;
use crate::{BindingStore, Clock, Fence, ImportOutcome, Lease, LeaseLoss, LeaseOwner, StoreError};

/// Whether `result` is `LeaseLost` for `session` with `cause`.
fn lost_by<T>(result: &Result<T>, session: &str, cause: &LeaseLoss) -> bool {
    matches!(result, Err(StoreError::LeaseLost { session_id, cause: c }) if session_id == session && c == cause)
}

pub(crate) fn owner(name: &str) -> LeaseOwner {
    LeaseOwner {
        host: format!("host-{name}"),
        pid: 4242,
        started_at_ms: 1_700_000_000_000,
        instance: NEXT.fetch_add(1, Ordering::Relaxed),
        process: None,
    }
}

pub(crate) const LONG: Duration = Duration::from_secs(60);

/// A live lease excludes every other owner (typed `Busy` naming the holder); the holder asking
/// again renews it, keeping its fence.
pub async fn lease_is_exclusive(store: &BindingStore) {
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
pub async fn lease_release_frees(store: &BindingStore) {
    let s = unique_id("lease-release");
    let (a, b) = (owner("a"), owner("b"));
    let first = store.acquire_lease(&s, &a, LONG).await.unwrap();
    assert!(store.release_lease(&first).await.unwrap());
    assert!(!store.release_lease(&first).await.unwrap(), "already free");
    let renewed = store.renew_lease(&first, LONG).await;
    assert!(
        lost_by(&renewed, &s, &LeaseLoss::Released),
        "a released lease cannot be renewed: {renewed:?}"
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
pub async fn lease_renew_extends(store: &BindingStore, clock: &Clock) {
    let s = unique_id("lease-renew");
    let (a, b) = (owner("a"), owner("b"));
    let ttl = Duration::from_millis(2000);
    let lease = store.acquire_lease(&s, &a, ttl).await.unwrap();
    clock.advance(Duration::from_millis(1000));
    let renewed = store.renew_lease(&lease, ttl).await.unwrap();
    assert!(renewed.expires_at_ms > lease.expires_at_ms);
    assert_eq!(renewed.fence, lease.fence);
    assert_eq!(renewed.acquired_at_ms, lease.acquired_at_ms);
    clock.advance(Duration::from_millis(1200));
    // 2.2 s after the grant: past the first expiry, within the renewed one.
    assert!(
        matches!(
            store.acquire_lease(&s, &b, ttl).await,
            Err(StoreError::Busy { .. })
        ),
        "the renewed lease still holds"
    );
    assert!(store.release_lease(&renewed).await.unwrap());
}

/// A holder that stops renewing (crashed) loses the lease at expiry to the next owner, and
/// can then neither renew (taken over, naming the new holder) nor release it.
pub async fn lease_expiry_frees_a_crashed_holder(store: &BindingStore, clock: &Clock) {
    let s = unique_id("lease-expiry");
    let (a, b, c) = (owner("a"), owner("b"), owner("c"));
    let crashed = store
        .acquire_lease(&s, &a, Duration::from_millis(200))
        .await
        .unwrap();
    clock.advance(Duration::from_millis(400));
    let next = store.acquire_lease(&s, &b, LONG).await.unwrap();
    assert_eq!(next.owner, b);
    assert_eq!(next.fence, crashed.fence + 1);
    let late = store.renew_lease(&crashed, LONG).await;
    assert!(
        lost_by(&late, &s, &LeaseLoss::TakenOver { holder: b.clone() }),
        "{late:?}"
    );
    assert!(!store.release_lease(&crashed).await.unwrap());
    assert!(matches!(
        store.acquire_lease(&s, &c, LONG).await,
        Err(StoreError::Busy { holder, .. }) if holder == b
    ));
    assert!(store.release_lease(&next).await.unwrap());
}

/// A lease naming another owner (or an older fence) can neither renew nor release the holder's.
pub async fn lease_owner_mismatch_cannot_renew_or_release(store: &BindingStore) {
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
pub async fn concurrent_acquires_grant_one(store: &BindingStore) {
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

/// Fenced writes are refused with `LeaseLost` and write nothing once another owner took the
/// session over (naming it), or the grant was released; the new holder's fenced writes and
/// unfenced writes go through.
pub async fn fenced_writes_need_the_newest_grant(store: &BindingStore, clock: &Clock) {
    let s = unique_id("fenced");
    let (t1, t2, t3) = (th(&s, "t1"), th(&s, "t2"), th(&s, "t3"));
    let (a, b) = (owner("a"), owner("b"));
    let ttl = Duration::from_millis(300);
    let first = store.acquire_lease(&s, &a, ttl).await.unwrap();
    let stale = first.fence();
    let mut commit = turn(&s, &t1, vec![json!({"n": 1})]);
    commit.fence = Some(stale.clone());
    store.commit_turn(commit).await.unwrap();
    // `a` stalls past its TTL; `b` takes over and commits.
    clock.advance(Duration::from_millis(400));
    let second = store.acquire_lease(&s, &b, LONG).await.unwrap();
    let mut commit = turn(&s, &t2, vec![json!({"n": 2})]);
    commit.fence = Some(second.fence());
    store.commit_turn(commit).await.unwrap();
    let before = store.export_session(&s).await.unwrap();

    let taken = LeaseLoss::TakenOver { holder: b.clone() };
    let mut late = turn(&s, &t1, vec![json!({"n": 3})]);
    late.fence = Some(stale.clone());
    assert!(lost_by(&store.commit_turn(late).await, &s, &taken));
    let give_up = store
        .retire_thread(&s, &t2, lost("gone", "x"), Some(&stale))
        .await;
    assert!(lost_by(&give_up, &s, &taken), "{give_up:?}");
    let patch = store
        .patch_config(&s, obj(json!({"k": 0})), Some(&stale))
        .await;
    assert!(lost_by(&patch, &s, &taken), "{patch:?}");
    let mark = store.mark_notice_delivered(&s, &t2, Some(&stale)).await;
    assert!(lost_by(&mark, &s, &taken), "{mark:?}");
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
    let forged = store
        .retire_thread(&s, &t2, lost("gone", "x"), Some(&forged))
        .await;
    assert!(
        matches!(forged, Err(StoreError::LeaseLost { .. })),
        "{forged:?}"
    );
    // The holder's fenced writes and unfenced writes go through.
    store
        .patch_config(&s, obj(json!({"k": 1})), Some(&second.fence()))
        .await
        .unwrap();
    store
        .retire_thread(&s, &t2, lost("gone", "x"), Some(&second.fence()))
        .await
        .unwrap();
    assert_eq!(store.thread_id(&s).await.unwrap(), None);
    store
        .patch_config(&s, obj(json!({"k": 2})), None)
        .await
        .unwrap();
    assert!(store.release_lease(&second).await.unwrap());
    // A released grant fences nothing any more.
    let released = store
        .retire_thread(&s, &t3, lost("gone", "x"), Some(&second.fence()))
        .await;
    assert!(lost_by(&released, &s, &LeaseLoss::Released), "{released:?}");
}

/// A holder that stalled past its TTL with nobody competing (a suspended laptop, a paused
/// process) goes on: its fenced writes are accepted, and a renewal takes the lease back with
/// the same fence.
pub async fn stall_past_the_ttl_with_nobody_competing_goes_on(store: &BindingStore, clock: &Clock) {
    let s = unique_id("stalled");
    let (a, b) = (owner("a"), owner("b"));
    let lease = store
        .acquire_lease(&s, &a, Duration::from_millis(100))
        .await
        .unwrap();
    clock.advance(Duration::from_millis(250));
    let mut commit = turn(&s, &th(&s, "t1"), vec![json!({"n": 1})]);
    commit.fence = Some(lease.fence());
    assert!(store.commit_turn(commit).await.unwrap().is_published());
    let renewed = store.renew_lease(&lease, LONG).await.unwrap();
    assert_eq!(renewed.fence, lease.fence, "the same grant, taken back");
    assert!(renewed.expires_at_ms > lease.expires_at_ms);
    assert!(
        matches!(store.acquire_lease(&s, &b, LONG).await, Err(StoreError::Busy { holder, .. }) if holder == a),
        "held again"
    );
    let mut commit = turn(&s, &th(&s, "t1"), vec![json!({"n": 2})]);
    commit.fence = Some(renewed.fence());
    assert_eq!(store.commit_turn(commit).await.unwrap().row_count(), 2);
    assert!(store.release_lease(&renewed).await.unwrap());
}

/// `lease`'s grant was given to nobody (by a delete or an import): a fenced commit on
/// `thread` and a renewal are both refused as `Forgotten`.
async fn assert_forgotten(store: &BindingStore, s: &str, lease: &Lease, thread: &str) {
    let mut late = turn(s, &th(s, thread), vec![json!("late")]);
    late.fence = Some(lease.fence());
    let late = store.commit_turn(late).await;
    assert!(lost_by(&late, s, &LeaseLoss::Forgotten), "{late:?}");
    let renew = store.renew_lease(lease, LONG).await;
    assert!(lost_by(&renew, s, &LeaseLoss::Forgotten), "{renew:?}");
}

/// `delete_session` is refused (`Busy`, naming the holder) while the session's lease is live;
/// once it is free the delete goes through and grants the lease to nobody: the old grant can
/// neither renew nor write (`Forgotten`), so the delete is never undone, and a new acquire
/// continues the fence.
pub async fn delete_is_refused_while_the_lease_is_live(store: &BindingStore, clock: &Clock) {
    let s = unique_id("forget");
    let (a, b) = (owner("a"), owner("b"));
    let lease = store
        .acquire_lease(&s, &a, Duration::from_millis(300))
        .await
        .unwrap();
    let mut commit = turn(&s, &th(&s, "t1"), vec![json!(1)]);
    commit.fence = Some(lease.fence());
    store.commit_turn(commit).await.unwrap();
    let busy = store.delete_session(&s).await;
    assert!(
        matches!(&busy, Err(StoreError::Busy { holder, .. }) if *holder == a),
        "{busy:?}"
    );
    assert!(
        store.session(&s).await.unwrap().is_some(),
        "nothing deleted"
    );

    // The holder stalls past its TTL: the lease is no longer live, the delete goes through.
    clock.advance(Duration::from_millis(400));
    assert!(store.delete_session(&s).await.unwrap());
    assert_forgotten(store, &s, &lease, "t1").await;
    assert_eq!(store.session(&s).await.unwrap(), None, "the delete holds");

    let next = store.acquire_lease(&s, &b, LONG).await.unwrap();
    assert!(next.fence > lease.fence + 1, "{lease:?} then {next:?}");
    let mut commit = turn(&s, &th(&s, "t2"), vec![json!(3)]);
    commit.fence = Some(next.fence());
    assert_eq!(store.commit_turn(commit).await.unwrap().first_seq(), 0);
    assert!(store.release_lease(&next).await.unwrap());
    // A delete with the lease free and nothing stored is a no-op.
    assert!(store.delete_session(&s).await.unwrap());
    assert!(!store.delete_session(&s).await.unwrap());
}

/// An import of a session whose lease is live (its holder not known gone) is `Busy`, as a
/// delete is, and writes nothing: the holder's next fenced commit would append to a history
/// it never read. Once the lease is no longer live the import goes through and, as a delete
/// does, grants the lease to nobody: the stalled holder can neither write onto the imported
/// history nor renew, and a new acquire continues the fence.
pub async fn import_is_refused_while_the_lease_is_live(store: &BindingStore, clock: &Clock) {
    let s = unique_id("import-leased");
    store
        .commit_turn(turn(&s, &th(&s, "t1"), vec![json!(1), json!(2)]))
        .await
        .unwrap();
    let export = store.export_session(&s).await.unwrap().unwrap();
    assert!(store.delete_session(&s).await.unwrap());
    // A host starts the session here before the import arrives.
    let a = owner("a");
    let lease = store
        .acquire_lease(&s, &a, Duration::from_millis(300))
        .await
        .unwrap();
    let busy = store.import_session(export.clone()).await;
    assert!(
        matches!(&busy, Err(StoreError::Busy { holder, .. }) if *holder == a),
        "{busy:?}"
    );
    assert_eq!(store.session(&s).await.unwrap(), None, "nothing imported");
    assert_eq!(store.thread_session(&th(&s, "t1")).await.unwrap(), None);

    clock.advance(Duration::from_millis(400));
    assert_eq!(
        store.import_session(export.clone()).await.unwrap(),
        ImportOutcome::Imported
    );
    assert_forgotten(store, &s, &lease, "t9").await;
    assert_eq!(store.export_session(&s).await.unwrap().unwrap(), export);
    let next = store.acquire_lease(&s, &a, LONG).await.unwrap();
    assert!(next.fence > lease.fence + 1, "{lease:?} then {next:?}");
    assert!(store.release_lease(&next).await.unwrap());
}

/// A holder of this process whose [`LocalOwner`](crate::LocalOwner) was dropped is provably
/// gone: another holder takes its live lease at once, with a new fence (where the OS gives a
/// process identity; elsewhere the TTL decides and the lease stays busy).
pub async fn dropped_local_holder_is_taken_over_at_once(store: &BindingStore) {
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
            let late = store.renew_lease(&held, LONG).await;
            let taken = LeaseLoss::TakenOver {
                holder: next.owner().clone(),
            };
            assert!(lost_by(&late, &s, &taken), "{late:?}");
            // The holder's process is gone, so a delete goes through too.
            drop(next);
            assert!(!store.delete_session(&s).await.unwrap());
            assert!(
                !store.release_lease(&lease).await.unwrap(),
                "the delete granted the lease to nobody"
            );
        }
        Err(StoreError::Busy { .. }) => assert!(!identified, "a dropped holder stays busy"),
        Err(other) => panic!("unexpected {other}"),
    }
}
