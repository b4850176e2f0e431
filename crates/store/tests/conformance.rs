//! Runs the conformance suite on every backend, directly and through `Arc<dyn BindingStore>`.

use std::sync::Arc;

use rethread_store::{conformance, BindingStore, MemoryStore, OpenOptions, RedbStore, SqliteStore};

/// The whole suite on `store` directly, then through `Arc<dyn BindingStore>`.
async fn conforms<S: BindingStore + 'static>(store: S) {
    let store = Arc::new(store);
    conformance::run_all(store.as_ref()).await;
    let shared: Arc<dyn BindingStore> = store;
    conformance::run_all(&shared).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_conforms() {
    conforms(MemoryStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    conforms(RedbStore::open(path, OpenOptions::new()).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite");
    conforms(SqliteStore::open(path, OpenOptions::new()).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boxed_and_url_opened_stores_conform() {
    let boxed: Box<dyn BindingStore> = Box::new(MemoryStore::new());
    conformance::run_all(&boxed).await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("url.sqlite").display());
    let store = rethread_store::open_url(&url, OpenOptions::new())
        .await
        .unwrap();
    conformance::commit_publishes_binding(&store).await;
    conformance::many_sessions_commit_at_once(&store).await;
}
