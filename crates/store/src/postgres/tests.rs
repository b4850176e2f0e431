//! The PostgreSQL backend's guards that need a write stopped inside its transaction, against
//! the test server (skipped without one, as `tests/postgres.rs` is).

use std::sync::mpsc;
use std::time::Duration;

use serde_json::json;

use super::PostgresStore;
use crate::adapter::Backend;
use crate::logic::WriteTxn;
use crate::{BindingStore, BindingStoreExt, OpenOptions, SessionRecord, TurnCommit};

/// A write stalled under its session's lock loses its transaction once it sat idle past the
/// timeout, and the lock with it: another host's write of the session goes through instead of
/// waiting for ever. The stalled write then fails, writes nothing, and its store goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_stalled_under_its_lock_frees_the_lock_after_the_timeout() {
    let Some(url) = rethread_testkit::postgres::fresh_url("stalled_write") else {
        return;
    };
    let stalled = PostgresStore::open_with(&url, OpenOptions::new(), Duration::from_millis(300))
        .await
        .unwrap();
    let other = PostgresStore::open(&url, OpenOptions::new()).await.unwrap();
    let (locked, is_locked) = mpsc::channel();
    let (go_on, gone_on) = mpsc::channel();
    let write = {
        let pg = stalled.pg.clone();
        // Holding its session's lock, it stops until told to go on: a host stopped (or cut
        // off) between its lock and its commit.
        let op = move |txn: &mut dyn WriteTxn, now| {
            let _ = locked.send(());
            let _ = gone_on.recv();
            txn.put(&SessionRecord::new("s", now))
        };
        tokio::spawn(async move { pg.write("s", op).await })
    };
    tokio::task::spawn_blocking(move || is_locked.recv())
        .await
        .unwrap()
        .unwrap();
    let commit = TurnCommit::new("s", "t", vec![json!(1)]);
    let waited = tokio::time::timeout(Duration::from_secs(20), other.commit_turn(commit)).await;
    go_on.send(()).unwrap();
    let committed = waited.expect("the other host's write still waits for the stalled lock");
    assert_eq!(committed.unwrap().row_count(), 1);
    let stalled_write = write.await.unwrap();
    assert!(stalled_write.is_err(), "{stalled_write:?}");
    assert_eq!(other.require_session("s").await.unwrap().row_count, 1);
    let again = stalled.commit_turn(TurnCommit::new("s", "t", vec![json!(2)]));
    assert_eq!(again.await.unwrap().row_count(), 2);
}
