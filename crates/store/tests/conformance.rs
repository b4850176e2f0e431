//! Runs the conformance suite on every backend, directly and through `Arc<dyn BindingStore>`.

use std::sync::Arc;

use rethread_store::{
    conformance, BindingStore, Clock, MemoryStore, OpenOptions, RedbStore, SqliteStore,
};

/// The whole suite on `store` (opened on `clock`) directly, then through
/// `Arc<dyn BindingStore>`.
async fn conforms<S: BindingStore + 'static>(store: S, clock: &Clock) {
    let store = Arc::new(store);
    conformance::run_all(store.as_ref(), clock).await;
    let shared: Arc<dyn BindingStore> = store;
    conformance::run_all(&shared, clock).await;
}

/// A manual clock and the options that open a store on it.
fn on_manual_clock() -> (Clock, OpenOptions) {
    let clock = Clock::manual();
    (clock.clone(), OpenOptions::new().clock(clock))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_conforms() {
    let clock = Clock::manual();
    conforms(MemoryStore::with_clock(clock.clone()), &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (clock, options) = on_manual_clock();
    conforms(RedbStore::open(path, options).await.unwrap(), &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite");
    let (clock, options) = on_manual_clock();
    conforms(SqliteStore::open(path, options).await.unwrap(), &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boxed_and_url_opened_stores_conform() {
    let clock = Clock::manual();
    let boxed: Box<dyn BindingStore> = Box::new(MemoryStore::with_clock(clock.clone()));
    conformance::run_all(&boxed, &clock).await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("url.sqlite").display());
    let store = rethread_store::open_url(&url, OpenOptions::new())
        .await
        .unwrap();
    conformance::commit_publishes_binding(&store).await;
    conformance::many_sessions_commit_at_once(&store).await;
}
