//! Retention: idle sessions pruned in batches (never a leased one, a dry run removing nothing),
//! and what each session holds.

use std::time::Duration;

use serde_json::json;

use super::leases::{owner, LONG};
use super::{th, turn, unique_id};
use crate::{BindingStore, Clock, LeaseLoss, MirrorAppend, MirrorUpdate, Prune, StoreError};

const ROLLOUT: &str = "sessions/2026/12/01/rollout-2026-12-01T10-00-00-t.jsonl";
const HOUR: Duration = Duration::from_secs(3600);

/// A prune removes every session last written longer ago than its idle span (record, rows,
/// mirror, threads, lease record), batch by batch, and none written since or whose lease is
/// live; a dry run removes nothing and says the same. A stale grant of a pruned session is
/// `Forgotten`, and the session can be started anew.
pub async fn prune_removes_idle_sessions_only(store: &BindingStore, clock: &Clock) {
    let (old, leased, fresh) = (
        unique_id("prune-old"),
        unique_id("prune-leased"),
        unique_id("prune-fresh"),
    );
    let rollout = b"{\"type\":\"session_meta\"}\n".to_vec();
    let mirror = MirrorUpdate::new(vec![MirrorAppend::whole(ROLLOUT, rollout.clone())]);
    let rows = vec![json!({"text": "hello"}), json!({"text": "world"})];
    let commit = turn(&old, &th(&old, "t1"), rows).mirror(Some(mirror));
    store.commit_turn(commit).await.unwrap();
    // A holder that crashed long ago: its lease expired.
    let (a, b) = (owner("a"), owner("b"));
    let stale = store
        .acquire_lease(&old, &a, Duration::from_secs(1))
        .await
        .unwrap();
    let commit = turn(&leased, &th(&leased, "t1"), vec![json!(1)]);
    store.commit_turn(commit).await.unwrap();
    clock.advance(2 * HOUR);
    let commit = turn(&fresh, &th(&fresh, "t1"), vec![json!(1)]);
    store.commit_turn(commit).await.unwrap();
    let held = store.acquire_lease(&leased, &b, LONG).await.unwrap();

    let ours = |report: &crate::PruneReport| -> Vec<String> {
        let mine = [&old, &leased, &fresh];
        let ids = report.sessions.iter().map(|p| &p.session_id);
        ids.filter(|id| mine.contains(id)).cloned().collect()
    };
    let dry = store
        .prune_sessions(Prune::idle(HOUR).dry_run(true))
        .await
        .unwrap();
    assert_eq!(ours(&dry), vec![old.clone()], "{dry:?}");
    assert!(dry.kept_leased.contains(&leased), "{dry:?}");
    let listed = dry.sessions.iter().find(|p| p.session_id == old).unwrap();
    assert_eq!(listed.row_count, 2);
    assert_eq!(listed.bytes.mirror, rollout.len() as u64);
    assert!(listed.bytes.rows >= 30, "{listed:?}");
    assert!(
        store.session(&old).await.unwrap().is_some(),
        "a dry run removes nothing"
    );
    assert_eq!(
        store
            .session_bytes(std::slice::from_ref(&old))
            .await
            .unwrap(),
        vec![listed.bytes]
    );

    let pruned = store
        .prune_sessions(Prune::idle(HOUR).batch(1))
        .await
        .unwrap();
    assert_eq!(ours(&pruned), vec![old.clone()], "{pruned:?}");
    assert!(pruned.kept_leased.contains(&leased));
    assert_eq!(store.session(&old).await.unwrap(), None);
    assert!(store.all_rows(&old).await.unwrap().is_empty());
    assert_eq!(store.thread_session(&th(&old, "t1")).await.unwrap(), None);
    assert_eq!(
        store
            .mirror_file(&old, &th(&old, "t1"), ROLLOUT)
            .await
            .unwrap(),
        None
    );
    let renew = store.renew_lease(&stale, LONG).await;
    assert!(
        matches!(
            &renew,
            Err(StoreError::LeaseLost {
                cause: LeaseLoss::Forgotten,
                ..
            })
        ),
        "{renew:?}"
    );
    let mut late = turn(&old, &th(&old, "t1"), vec![json!("late")]);
    late.fence = Some(stale.fence());
    let late = store.commit_turn(late).await;
    assert!(
        matches!(&late, Err(StoreError::LeaseLost { .. })),
        "{late:?}"
    );
    for kept in [&leased, &fresh] {
        assert!(store.session(kept).await.unwrap().is_some(), "{kept} kept");
    }
    let missing = unique_id("prune-missing");
    let bytes = store
        .session_bytes(&[fresh.clone(), missing])
        .await
        .unwrap();
    assert!(bytes[0].rows > 0 && bytes[0].mirror == 0, "{bytes:?}");
    assert_eq!(bytes[1].total(), 0);
    // Started anew.
    let lease = store.acquire_lease(&old, &a, LONG).await.unwrap();
    assert!(store.release_lease(&lease).await.unwrap());
    assert!(store.release_lease(&held).await.unwrap());
    // Nothing idle for a day: nothing of these goes.
    let none = store.prune_sessions(Prune::idle(24 * HOUR)).await.unwrap();
    assert!(ours(&none).is_empty(), "{none:?}");
}

/// A lease record can outlive its session: a forget leaves a grant to nobody, and a session
/// leased but never committed (a host that started and left before its first turn) has a
/// lease record and no session record. A prune removes every such record last live before
/// its idle span, and keeps one live or live since; a dry run lists them and removes nothing.
/// A session whose record went starts anew (fence 1), and a stale grant of it is `Forgotten`.
pub async fn prune_removes_stale_lease_records_without_a_session(
    store: &BindingStore,
    clock: &Clock,
) {
    let [forgotten, released, crashed, live, recent] =
        ["forgotten", "released", "crashed", "live", "recent"]
            .map(|name| unique_id(&format!("orphan-{name}")));
    let (a, b) = (owner("a"), owner("b"));
    let commit = turn(&forgotten, &th(&forgotten, "t1"), vec![json!(1)]);
    store.commit_turn(commit).await.unwrap();
    let lease = store.acquire_lease(&forgotten, &a, LONG).await.unwrap();
    assert!(store.release_lease(&lease).await.unwrap());
    assert!(store.delete_session(&forgotten).await.unwrap());
    let lease = store.acquire_lease(&released, &a, LONG).await.unwrap();
    assert!(store.release_lease(&lease).await.unwrap());
    let short = Duration::from_secs(1);
    let stale = store.acquire_lease(&crashed, &a, short).await.unwrap();
    let held = store.acquire_lease(&live, &a, 3 * HOUR).await.unwrap();
    clock.advance(2 * HOUR);
    let lease = store.acquire_lease(&recent, &a, LONG).await.unwrap();
    assert!(store.release_lease(&lease).await.unwrap());

    let mine = [&forgotten, &released, &crashed, &live, &recent];
    let ours = |report: &crate::PruneReport| -> Vec<String> {
        let ids = report.leases.iter().filter(|id| mine.contains(id));
        ids.cloned().collect()
    };
    let gone = vec![crashed.clone(), forgotten.clone(), released.clone()];
    let mut gone_sorted = gone.clone();
    gone_sorted.sort();
    let dry = store
        .prune_sessions(Prune::idle(HOUR).dry_run(true))
        .await
        .unwrap();
    assert_eq!(ours(&dry), gone_sorted, "{dry:?}");
    let pruned = store
        .prune_sessions(Prune::idle(HOUR).batch(1))
        .await
        .unwrap();
    assert_eq!(ours(&pruned), gone_sorted, "{pruned:?}");
    let again = store.prune_sessions(Prune::idle(HOUR)).await.unwrap();
    assert!(ours(&again).is_empty(), "{again:?}");
    let renew = store.renew_lease(&stale, LONG).await;
    assert!(
        matches!(
            &renew,
            Err(StoreError::LeaseLost {
                cause: LeaseLoss::Forgotten,
                ..
            })
        ),
        "{renew:?}"
    );
    for id in &gone {
        let lease = store.acquire_lease(id, &b, LONG).await.unwrap();
        assert_eq!(lease.fence, 1, "{id} starts anew");
        assert!(store.release_lease(&lease).await.unwrap());
    }
    // Kept: the live grant (another owner waits), and one released within the span.
    let busy = store.acquire_lease(&live, &b, LONG).await;
    assert!(matches!(&busy, Err(StoreError::Busy { .. })), "{busy:?}");
    assert!(store.release_lease(&held).await.unwrap());
    let lease = store.acquire_lease(&recent, &b, LONG).await.unwrap();
    assert_eq!(lease.fence, 2, "the recent record was kept");
    assert!(store.release_lease(&lease).await.unwrap());
}
