//! Runs the conformance suite on every backend, on its engine and through an engine that wraps
//! it (testkit's fault injection, no fault planned).

use rethread_store::{conformance, BindingStore, Clock, OpenOptions};
use rethread_testkit::faulty_store::{self, Faults};

/// The whole suite on `store` (opened on `clock`), then on a store whose engine wraps its
/// engine.
async fn conforms(store: BindingStore, clock: &Clock) {
    conformance::run_all(&store, clock).await;
    let wrapped = faulty_store::over(store, Faults::default());
    conformance::run_all(&wrapped, clock).await;
}

/// A manual clock and the options that open a store on it.
fn on_manual_clock() -> (Clock, OpenOptions) {
    let clock = Clock::manual();
    (clock.clone(), OpenOptions::new().clock(clock))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_conforms() {
    let clock = Clock::manual();
    conforms(BindingStore::memory_with_clock(clock.clone()), &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (clock, options) = on_manual_clock();
    conforms(BindingStore::redb(path, options).await.unwrap(), &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite");
    let (clock, options) = on_manual_clock();
    conforms(BindingStore::sqlite(path, options).await.unwrap(), &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_opened_stores_conform() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("url.sqlite").display());
    let store = rethread_store::open_url(&url, OpenOptions::new())
        .await
        .unwrap();
    conformance::commit_publishes_binding(&store).await;
    conformance::many_sessions_commit_at_once(&store).await;
}
