//! The session lease: a session held by another host is `SessionBusy` (no thread is resumed or
//! started), a crashed holder frees it after its TTL, and a lost lease commits nothing.

mod support;

use std::time::Duration;

use rethread_runtime::{
    BinderOptions, ClientOptions, OpenOutcome, RuntimeError, SessionBinder, StatusRail,
};
use rethread_store::{BindingStore, Clock};
use rethread_testkit::faulty_store::{self, Faults};
use support::remote_owner;

fn options(ttl: Duration) -> BinderOptions {
    BinderOptions::default()
        .codex_home(Some("/home/codex".into()))
        .retry_backoff(Duration::from_millis(1))
        .lease_ttl(Some(ttl))
}

#[tokio::test]
async fn a_held_session_is_busy_and_starts_no_thread() {
    let store = BindingStore::memory();
    let (client_a, mut peer_a, _) = support::connect(ClientOptions::default()).await;
    let (client_b, peer_b, _) = support::connect(ClientOptions::default()).await;
    let mut agent_a = SessionBinder::new("s", store.clone(), StatusRail::default())
        .with_options(options(Duration::from_secs(30)));
    let owner_a = agent_a.lease_owner().clone();
    let open_a = tokio::spawn(async move {
        let session = agent_a.open(&client_a).await.unwrap();
        (agent_a, session)
    });
    peer_a.start_thread("t1").await;
    let (agent_a, session_a) = open_a.await.unwrap();
    let lease = session_a.lease().expect("leased");
    assert_eq!(lease.owner, owner_a);

    let mut agent_b = SessionBinder::new("s", store.clone(), StatusRail::default())
        .with_options(options(Duration::from_secs(30)));
    match agent_b.open(&client_b).await {
        Err(RuntimeError::SessionBusy {
            session_id, holder, ..
        }) => {
            assert_eq!(session_id, "s");
            assert_eq!(holder, owner_a);
        }
        other => panic!("expected SessionBusy, got {other:?}"),
    }
    let message = agent_b.open(&client_b).await.unwrap_err().to_string();
    assert!(
        message.contains(&format!("pid {}", std::process::id())),
        "{message}"
    );

    // Released: B may take the session (and starts its thread: A never committed).
    drop(session_a);
    agent_a.close().await.unwrap();
    let open_b =
        tokio::spawn(async move { agent_b.open(&client_b).await.map(|s| s.outcome().clone()) });
    let mut peer_b = peer_b;
    peer_b.start_thread("t2").await;
    assert_eq!(
        open_b.await.unwrap().unwrap(),
        OpenOutcome::Started {
            thread_id: "t2".into()
        }
    );
}

#[tokio::test]
async fn a_dropped_session_frees_the_lease_for_the_next_agent() {
    let store = BindingStore::memory();
    for thread in ["t1", "t2", "t3"] {
        let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
        let mut agent = SessionBinder::new("s", store.clone(), StatusRail::default())
            .with_options(options(Duration::from_secs(30)));
        let open = tokio::spawn(async move {
            let session = agent.open(&client).await?;
            drop(session);
            Ok::<_, RuntimeError>(())
        });
        peer.start_thread(thread).await;
        open.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn a_crashed_holder_frees_the_session_after_its_ttl() {
    // The store's clock is moved past the TTL instead of waiting it out.
    let clock = Clock::manual();
    let store = BindingStore::memory_with_clock(clock.clone());
    // A holder on another machine that crashed: it took the lease and never renews it, and
    // nothing here can ask its OS whether it still runs.
    let crashed = remote_owner("crashed");
    store
        .acquire_lease("s", &crashed, Duration::from_millis(300))
        .await
        .unwrap();
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut agent = SessionBinder::new("s", store.clone(), StatusRail::default())
        .with_options(options(Duration::from_secs(30)));
    assert!(matches!(
        agent.open(&client).await,
        Err(RuntimeError::SessionBusy { holder, .. }) if holder == crashed
    ));
    clock.advance(Duration::from_millis(400));
    let open = tokio::spawn(async move { agent.open(&client).await.map(|s| s.outcome().clone()) });
    peer.start_thread("t1").await;
    assert!(matches!(
        open.await.unwrap().unwrap(),
        OpenOutcome::Started { .. }
    ));
}

// On a paused clock: see the wait below.
#[tokio::test(start_paused = true)]
async fn a_lost_lease_commits_nothing() {
    let store = BindingStore::memory();
    // The binder's store counts its calls: the test waits for the renewal below.
    let faults = Faults::default();
    let counted = faulty_store::over(store.clone(), faults.clone());
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut agent = SessionBinder::new("s", counted, StatusRail::default())
        .with_options(options(Duration::from_millis(150)));
    let open = tokio::spawn(async move {
        let session = agent.open(&client).await.unwrap();
        (agent, session)
    });
    peer.start_thread("t1").await;
    let (_agent, mut session) = open.await.unwrap();
    // Another host takes the session over (as if this one had stalled past its TTL).
    let lease = session.lease().unwrap();
    assert!(store.release_lease(&lease).await.unwrap());
    let thief = remote_owner("thief");
    store
        .acquire_lease("s", &thief, Duration::from_secs(30))
        .await
        .unwrap();
    // The renewal finds the lease lost: the turn is refused before codex runs it. Waits for
    // the first renewal sent after the takeover, then until no task can go on (tokio moves
    // the paused clock on, ending that last pause, only then): the renewal has taken the
    // store's refusal in, whether or not the store's answer made it wait.
    let renewals = faults.calls("renew_lease");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while faults.calls("renew_lease") == renewals {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease was never renewed after the takeover"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
    let turn = tokio::spawn(async move { session.run_turn("hello").await.map(|_| ()) });
    assert!(matches!(
        turn.await.unwrap(),
        Err(RuntimeError::LeaseLost { session_id, .. }) if session_id == "s"
    ));
    assert_eq!(store.session("s").await.unwrap(), None, "nothing committed");
}

/// A write the store refused for a stale fence marks the lease lost at once, even when the
/// renewal has not noticed yet (a long TTL): the binder's next open takes the lease again
/// (here: busy, another host holds it) instead of opening the thread with the lost one, and
/// the session runs no further turn.
#[tokio::test]
async fn a_refused_write_marks_the_lease_lost_for_the_next_open() {
    let store = BindingStore::memory();
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut agent = SessionBinder::new("s", store.clone(), StatusRail::default())
        .with_options(options(Duration::from_secs(30)));
    let (taken_tx, taken_rx) = tokio::sync::oneshot::channel::<()>();
    let (lease_tx, lease_rx) = tokio::sync::oneshot::channel();
    let run = tokio::spawn(async move {
        let mut session = agent.open(&client).await.unwrap();
        lease_tx.send(session.lease().unwrap()).unwrap();
        taken_rx.await.unwrap();
        let turn = session.run_turn("hello").await.map(|_| ());
        // No turn that could never commit is run: refused before codex sees it.
        let next_turn = session.run_turn("again").await.map(|_| ());
        drop(session);
        let again = agent.open(&client).await.map(|s| s.outcome().clone());
        (turn, next_turn, again)
    });
    peer.start_thread("t1").await;
    let lease = lease_rx.await.unwrap();
    assert!(store.release_lease(&lease).await.unwrap());
    store
        .acquire_lease("s", &remote_owner("thief"), Duration::from_secs(30))
        .await
        .unwrap();
    taken_tx.send(()).unwrap();
    peer.run_turn("t1", "u1", "hi").await;
    let (turn, next_turn, again) = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("a request reached codex after the lease was lost")
        .unwrap();
    assert!(
        matches!(turn, Err(RuntimeError::LeaseLost { .. })),
        "{turn:?}"
    );
    assert!(
        matches!(next_turn, Err(RuntimeError::LeaseLost { .. })),
        "{next_turn:?}"
    );
    assert!(
        matches!(again, Err(RuntimeError::SessionBusy { .. })),
        "{again:?}"
    );
    assert_eq!(store.session("s").await.unwrap(), None, "nothing committed");
}

/// The lease belongs to the binder (issue 12): `close().await` frees the session for another
/// host at once; no process-wide list, no flush call.
#[tokio::test]
async fn closing_the_binder_frees_the_session_for_another_host_at_once() {
    let store = BindingStore::memory();
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut agent = SessionBinder::new("s", store.clone(), StatusRail::default())
        .with_options(options(Duration::from_secs(30)));
    let open = tokio::spawn(async move {
        let session = agent.open(&client).await.unwrap();
        (agent, session)
    });
    peer.start_thread("t1").await;
    let (agent, session) = open.await.unwrap();
    let other = remote_owner("other");
    assert!(store
        .acquire_lease("s", &other, Duration::from_secs(30))
        .await
        .is_err());
    // The session still lives: closing the binder releases the lease all the same.
    agent.close().await.unwrap();
    store
        .acquire_lease("s", &other, Duration::from_secs(30))
        .await
        .expect("free at once");
    drop(session);
}

/// A dropped binder releases its lease in the background (for a holder elsewhere, which
/// cannot tell this process's holders apart, only the release frees it before the TTL).
#[tokio::test]
async fn a_dropped_binder_releases_its_lease_in_the_background() {
    let store = BindingStore::memory();
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut agent = SessionBinder::new("s", store.clone(), StatusRail::default())
        .with_options(options(Duration::from_secs(30)));
    let open = tokio::spawn(async move {
        let session = agent.open(&client).await.unwrap();
        drop(session);
        drop(agent);
    });
    peer.start_thread("t1").await;
    open.await.unwrap();
    let other = remote_owner("other");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match store
            .acquire_lease("s", &other, Duration::from_secs(30))
            .await
        {
            Ok(_) => break,
            Err(error) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "never released: {error}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// `lease_wait`: a busy session is waited for up to the bound, then `SessionBusy`.
#[tokio::test]
async fn open_waits_for_a_busy_session_up_to_its_bound() {
    let store = BindingStore::memory();
    let holder = remote_owner("holder");
    store
        .acquire_lease("s", &holder, Duration::from_millis(300))
        .await
        .unwrap();
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    // A bound shorter than the holder's TTL: busy, after about the bound.
    let mut impatient = SessionBinder::new("s", store.clone(), StatusRail::default())
        .with_options(options(Duration::from_secs(30)).lease_wait(Duration::from_millis(100)));
    let started = tokio::time::Instant::now();
    assert!(matches!(
        impatient.open(&client).await,
        Err(RuntimeError::SessionBusy { .. })
    ));
    assert!(started.elapsed() >= Duration::from_millis(100));
    // A longer bound: the lease expires meanwhile and the open goes ahead.
    let mut patient = SessionBinder::new("s", store.clone(), StatusRail::default())
        .with_options(options(Duration::from_secs(30)).lease_wait(Duration::from_secs(10)));
    let open =
        tokio::spawn(async move { patient.open(&client).await.map(|s| s.outcome().clone()) });
    peer.start_thread("t1").await;
    assert!(matches!(
        open.await.unwrap().unwrap(),
        OpenOutcome::Started { .. }
    ));
}
