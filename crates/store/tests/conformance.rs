//! Runs the conformance suite on every backend, directly and through `Arc<dyn BindingStore>`.

use std::sync::Arc;

use rethread_store::{conformance, BindingStore, MemoryStore, OpenOptions, RedbStore, SqliteStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_conforms() {
    let store = Arc::new(MemoryStore::new());
    conformance::run_all(store.as_ref()).await;
    let shared: Arc<dyn BindingStore> = store;
    conformance::run_all(&shared).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        RedbStore::open(dir.path().join("store.redb"), OpenOptions::new())
            .await
            .unwrap(),
    );
    conformance::run_all(store.as_ref()).await;
    let shared: Arc<dyn BindingStore> = store;
    conformance::run_all(&shared).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        SqliteStore::open(dir.path().join("store.sqlite"), OpenOptions::new())
            .await
            .unwrap(),
    );
    conformance::run_all(store.as_ref()).await;
    let shared: Arc<dyn BindingStore> = store;
    conformance::run_all(&shared).await;
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
