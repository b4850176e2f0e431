//! The PostgreSQL backend against a real server: the whole conformance suite, migrations on
//! open, and concurrent writers through separate pools (as from separate processes).
//!
//! Keyed on `RETHREAD_TEST_POSTGRES_URL` (`.ci/run` starts a server and sets it). Unset, the
//! tests skip with a message, except under `CI=true` or `RETHREAD_REQUIRE_POSTGRES=1`, where
//! they fail. Each test works in its own schema, so they run in parallel.
#![cfg(feature = "postgres")]

use futures::future::join_all;
use rethread_store::{
    conformance, open_url, BindingStore, Clock, MirrorAppend, MirrorUpdate, OpenOptions,
    ProblemKind, StoreError, TurnCommit, SCHEMA_VERSION,
};
use serde_json::json;

use rethread_testkit::postgres::fresh_url;

fn commit(session: &str, thread: &str, rows: usize) -> TurnCommit {
    TurnCommit::new(
        session,
        thread,
        (0..rows)
            .map(|i| json!({"i": i, "thread": thread}))
            .collect(),
    )
}

/// A plain client on the server of the store at `url`, and the store's schema: to change its
/// tables by hand.
async fn connect_beside(url: &str) -> (tokio_postgres::Client, String) {
    let (base, schema) = url.rsplit_once("schema=").unwrap();
    let base = base.trim_end_matches(['?', '&']);
    let (client, conn) = tokio_postgres::connect(base, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    (client, schema.to_string())
}

/// `url` with the store's connections named `name` (`application_name`), so that
/// [`wait_until_blocked`] finds them among the other tests' connections.
fn named(url: &str, name: &str) -> String {
    format!("{url}&application_name={name}")
}

/// Waits until a connection named `name` waits for a lock of kind `wait_event`
/// (`pg_stat_activity`): the store's transaction is then blocked where the test wants it.
async fn wait_until_blocked(watcher: &tokio_postgres::Client, name: &str, wait_event: &str) {
    for _ in 0..2000 {
        let waiting: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
                 AND wait_event_type = 'Lock' AND wait_event = $2",
                &[&name, &wait_event],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("no connection named {name} ever waited for a {wait_event} lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_conforms() {
    let Some(url) = fresh_url("conforms") else {
        return;
    };
    let clock = Clock::manual();
    let options = OpenOptions::new().clock(clock.clone());
    let store = BindingStore::postgres(&url, options).await.unwrap();
    conformance::run_all(&store, &clock).await;
    let shared: BindingStore = store;
    conformance::run_all(&shared, &clock).await;
}

/// Issue 43: the suite on a sealed PostgreSQL store, and a marker written in a turn found in no
/// column of any of its tables (read as text, as a dump or a stolen backup would show them),
/// where the same turn in an unsealed store is found (the check can fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_postgres_store_conforms_and_keeps_no_text() {
    let Some(url) = fresh_url("sealed") else {
        return;
    };
    let key = rethread_store::StoreKey::generate().unwrap();
    let clock = Clock::manual();
    let options = OpenOptions::new().clock(clock.clone()).key(Some(key));
    let store = BindingStore::postgres(&url, options).await.unwrap();
    conformance::run_all(&store, &clock).await;
    const MARKER: &str = "marker-5e1d-plum-sealed";
    let rows = vec![serde_json::json!({"role": "user", "text": MARKER})];
    store
        .commit_turn(TurnCommit::new("marked", "t-marked", rows))
        .await
        .unwrap();
    let (client, schema) = connect_beside(&url).await;
    let mut found = Vec::new();
    for table in [
        "sessions",
        "transcript_rows",
        "threads",
        "mirror_chunks",
        "leases",
        "rethread_meta",
    ] {
        let sql = format!("SELECT t::text FROM {schema}.{table} t");
        for row in client.query(&sql, &[]).await.unwrap() {
            found.extend(row.get::<_, String>(0).contains(MARKER).then_some(table));
        }
    }
    assert!(found.is_empty(), "the marker is readable in {found:?}");
    // Unsealed, the same turn is readable: the check above can fail.
    let Some(plain_url) = fresh_url("unsealed") else {
        return;
    };
    let plain = BindingStore::postgres(&plain_url, OpenOptions::new())
        .await
        .unwrap();
    let rows = vec![serde_json::json!({"role": "user", "text": MARKER})];
    plain
        .commit_turn(TurnCommit::new("marked", "t-marked", rows))
        .await
        .unwrap();
    let (client, schema) = connect_beside(&plain_url).await;
    let sql = format!("SELECT t::text FROM {schema}.transcript_rows t");
    let rows = client.query(&sql, &[]).await.unwrap();
    assert!(rows.iter().any(|r| r.get::<_, String>(0).contains(MARKER)));
}

/// Mirror chunks are stored compressed on PostgreSQL too: a realistic codex rollout (testkit's
/// generator, about 3 MiB in turns of 5 to 60 KB) costs at most 35% of its bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_store_keeps_a_realistic_rollout_compressed() {
    let Some(url) = fresh_url("mirror_share") else {
        return;
    };
    let store = BindingStore::postgres(&url, OpenOptions::new())
        .await
        .unwrap();
    let turns = rethread_testkit::rollout::turns(39, 3 << 20);
    conformance::mirror_keeps_a_share_of_a_realistic_rollout(&store, &turns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_url_takes_postgres_urls_and_migrates_once() {
    let Some(url) = fresh_url("open_url") else {
        return;
    };
    let store = open_url(&url, OpenOptions::new()).await.unwrap();
    conformance::commit_publishes_binding(&store).await;
    store.commit_turn(commit("kept", "t1", 2)).await.unwrap();
    // Two processes opening at once: the migration runs once, both stores work, data kept.
    let (a, b) = futures::join!(
        BindingStore::postgres(&url, OpenOptions::new()),
        BindingStore::postgres(&url, OpenOptions::new())
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.require_session("kept").await.unwrap().row_count, 2);
    assert_eq!(b.thread_id("kept").await.unwrap().as_deref(), Some("t1"));
    assert!(!format!("{a:?}").contains("password"));
}

/// A store opened read-only reads, never creates its tables, and refuses every write and
/// lease request before it reaches the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_store_reads_and_refuses_writes() {
    let Some(url) = fresh_url("read_only") else {
        return;
    };
    let read_only = OpenOptions::new().read_only(true);
    let missing = BindingStore::postgres(&url, read_only.clone()).await;
    assert!(
        matches!(missing, Err(StoreError::NoStore { .. })),
        "{missing:?}"
    );
    let writer = BindingStore::postgres(&url, OpenOptions::new())
        .await
        .unwrap();
    writer.commit_turn(commit("s", "t1", 2)).await.unwrap();
    let reader = BindingStore::postgres(&url, read_only).await.unwrap();
    assert_eq!(reader.require_session("s").await.unwrap().row_count, 2);
    let refused = reader.commit_turn(commit("s", "t1", 1)).await;
    assert!(
        matches!(refused, Err(StoreError::NotWritable { .. })),
        "{refused:?}"
    );
    let owner = rethread_store::LocalOwner::new();
    let lease = reader
        .acquire_lease("s", owner.owner(), std::time::Duration::from_secs(5))
        .await;
    assert!(
        matches!(lease, Err(StoreError::NotWritable { .. })),
        "{lease:?}"
    );
    assert_eq!(writer.require_session("s").await.unwrap().row_count, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused() {
    let Some(url) = fresh_url("newer") else {
        return;
    };
    BindingStore::postgres(&url, OpenOptions::new())
        .await
        .unwrap();
    let (client, schema) = connect_beside(&url).await;
    client
        .execute(
            &format!(
                "UPDATE \"{schema}\".rethread_meta SET value = $1 WHERE key = 'schema_version'"
            ),
            &[&(SCHEMA_VERSION as i64 + 1)],
        )
        .await
        .unwrap();
    let r = BindingStore::postgres(&url, OpenOptions::new()).await;
    assert!(
        matches!(r, Err(StoreError::NewerSchema { found, .. }) if found == SCHEMA_VERSION + 1),
        "{r:?}"
    );
}

/// Damage in a column never reads as data: a negative row count (SQLite's reading refused
/// it; PostgreSQL's read it as 2^64 - 1) and an unknown lease state are `Corrupt`, on reads
/// and on writes that would build on them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_column_is_corrupt_not_data() {
    let Some(url) = fresh_url("damaged_column") else {
        return;
    };
    let store = BindingStore::postgres(&url, OpenOptions::new())
        .await
        .unwrap();
    store.commit_turn(commit("s", "t1", 2)).await.unwrap();
    let owner = rethread_store::LeaseOwner {
        host: "h".to_string(),
        pid: 1,
        started_at_ms: 0,
        instance: 1,
        process: None,
    };
    store
        .acquire_lease("l", &owner, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    let (client, schema) = connect_beside(&url).await;
    client
        .batch_execute(&format!(
            "UPDATE \"{schema}\".sessions SET row_count = -1 WHERE session_id = 's'; \
             UPDATE \"{schema}\".leases SET state = 7 WHERE session_id = 'l';"
        ))
        .await
        .unwrap();
    let read = store.session("s").await;
    assert!(matches!(read, Err(StoreError::Corrupt { .. })), "{read:?}");
    let written = store.commit_turn(commit("s", "t1", 1)).await;
    assert!(
        matches!(written, Err(StoreError::Corrupt { .. })),
        "{written:?}"
    );
    let lease = store
        .acquire_lease("l", &owner, std::time::Duration::from_secs(60))
        .await;
    assert!(
        matches!(lease, Err(StoreError::Corrupt { .. })),
        "{lease:?}"
    );
}

/// A mirrored path a restore must not write (written by another program: the store itself
/// refuses it) is damage `verify` reports, not a file it counts as checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reports_a_mirrored_path_that_is_not_a_rollout() {
    let Some(url) = fresh_url("mirror_path") else {
        return;
    };
    let store = BindingStore::postgres(&url, OpenOptions::new())
        .await
        .unwrap();
    let rollout = "sessions/2026/12/01/rollout-2026-12-01T10-00-00-t1.jsonl";
    let update = MirrorUpdate::new(vec![MirrorAppend::whole(rollout, b"{}\n".to_vec())]);
    store
        .commit_turn(commit("s", "t1", 1).mirror(Some(update)))
        .await
        .unwrap();
    assert_eq!(store.verify(&mut |_| {}).await.unwrap().problem_count(), 0);
    let (client, schema) = connect_beside(&url).await;
    client
        .batch_execute(&format!(
            "UPDATE \"{schema}\".sessions SET mirror = replace(mirror, '{rollout}', 'config.toml'); \
             UPDATE \"{schema}\".mirror_chunks SET path = 'config.toml';"
        ))
        .await
        .unwrap();
    let report = store.verify(&mut |_| {}).await.unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.kind == ProblemKind::Mirror && p.detail.contains("config.toml")),
        "{report:?}"
    );
}

/// Two stores (two pools, as two processes would have) writing one session at once: every
/// row lands exactly once in order, every merge-patch key survives, and the binding is valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_through_separate_pools_lose_nothing() {
    let Some(url) = fresh_url("concurrent") else {
        return;
    };
    let stores = [
        BindingStore::postgres(&url, OpenOptions::new())
            .await
            .unwrap(),
        BindingStore::postgres(&url, OpenOptions::new())
            .await
            .unwrap(),
    ];
    let writes = (0..40).map(|i| {
        let store = &stores[i % 2];
        async move {
            if i % 3 == 0 {
                store
                    .patch_config(
                        "shared",
                        serde_json::from_value(json!({format!("k{i}"): i})).unwrap(),
                        None,
                    )
                    .await
                    .map(|_| ())
            } else {
                store
                    .commit_turn(commit("shared", &format!("t{i}"), 3))
                    .await
                    .map(|_| ())
            }
        }
    });
    for r in join_all(writes).await {
        r.unwrap();
    }
    let record = stores[0].require_session("shared").await.unwrap();
    let commits = (0..40).filter(|i| i % 3 != 0).count() as u64;
    assert_eq!(record.row_count, 3 * commits);
    let rows = stores[1].all_rows("shared").await.unwrap();
    assert_eq!(rows.len() as u64, record.row_count);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row.seq, i as u64);
        // Each turn's rows are contiguous: 0, 1, 2 of one thread.
        assert_eq!(row.body["i"], json!(i % 3));
        assert_eq!(row.body["thread"], rows[i - i % 3].body["thread"]);
    }
    for i in (0..40).filter(|i| i % 3 == 0) {
        assert_eq!(record.model_config.get(&format!("k{i}")), Some(&json!(i)));
    }
    let bound = record.thread_id().unwrap();
    assert_eq!(rows.last().unwrap().body["thread"], json!(bound), "I1");
}

/// Two sessions claiming one thread at once (their advisory locks are per session): the one
/// whose claim meets the other's, committed meanwhile, is `ThreadTaken` and writes nothing.
/// The other's claim is played by a transaction beside the store that inserted the thread's
/// owner and commits only once the store's claim waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_claimed_meanwhile_by_another_session_is_taken_not_stolen() {
    let Some(url) = fresh_url("thread_race") else {
        return;
    };
    let name = format!("thread_race_{}", std::process::id());
    let store = BindingStore::postgres(&named(&url, &name), OpenOptions::new())
        .await
        .unwrap();
    let (side, schema) = connect_beside(&url).await;
    let (watcher, _) = connect_beside(&url).await;
    for (session, thread) in [("s2", "t"), ("s3", "u")] {
        side.batch_execute(&format!(
            "BEGIN; INSERT INTO \"{schema}\".threads (thread_id, session_id) \
             VALUES ('{thread}', 's1')"
        ))
        .await
        .unwrap();
        let racing = {
            let store = store.clone();
            tokio::spawn(async move {
                if session == "s2" {
                    store
                        .commit_turn(commit(session, thread, 2))
                        .await
                        .map(drop)
                } else {
                    store
                        .retire_thread(session, thread, rethread_store::Retirement::Ended, None)
                        .await
                }
            })
        };
        wait_until_blocked(&watcher, &name, "transactionid").await;
        side.batch_execute("COMMIT").await.unwrap();
        let result = racing.await.unwrap();
        assert!(
            matches!(&result, Err(StoreError::ThreadTaken { session_id, .. }) if session_id == "s1"),
            "{session}: {result:?}"
        );
        assert_eq!(
            store.session(session).await.unwrap(),
            None,
            "nothing written"
        );
        assert_eq!(
            store.thread_session(thread).await.unwrap().as_deref(),
            Some("s1")
        );
    }
}

/// A fenced write that waits for its session's lock while another host takes the session
/// over sees the takeover and is refused, also where the server's default isolation is
/// `repeatable read` (a snapshot taken before the wait would still show the old grant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_that_waited_for_the_lock_sees_the_takeover_whatever_the_isolation() {
    let Some(url) = fresh_url("isolation") else {
        return;
    };
    let name = format!("isolation_{}", std::process::id());
    let repeatable =
        format!("{url}&options=-c%20default_transaction_isolation%3Drepeatable%5C%20read");
    let store = BindingStore::postgres(&named(&repeatable, &name), OpenOptions::new())
        .await
        .unwrap();
    let owner = rethread_store::LocalOwner::new().owner().clone();
    let lease = store
        .acquire_lease("s", &owner, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    store
        .commit_turn(commit("s", "t1", 1).fence(Some(lease.fence())))
        .await
        .unwrap();
    // Another host holds the session's lock, and takes the lease over under it.
    let (side, schema) = connect_beside(&url).await;
    let (watcher, _) = connect_beside(&url).await;
    side.batch_execute(&format!(
        "BEGIN; SELECT pg_advisory_xact_lock(hashtextextended('{schema}/s', 0))"
    ))
    .await
    .unwrap();
    let stale = {
        let store = store.clone();
        let fence = lease.fence();
        tokio::spawn(async move {
            store
                .commit_turn(commit("s", "t1", 1).fence(Some(fence)))
                .await
        })
    };
    wait_until_blocked(&watcher, &name, "advisory").await;
    side.batch_execute(&format!(
        "UPDATE \"{schema}\".leases SET host = 'thief', fence = fence + 1 \
         WHERE session_id = 's'; COMMIT"
    ))
    .await
    .unwrap();
    let result = stale.await.unwrap();
    assert!(
        matches!(result, Err(StoreError::LeaseLost { .. })),
        "{result:?}"
    );
    assert_eq!(store.require_session("s").await.unwrap().row_count, 1);
}
