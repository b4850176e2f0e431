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

/// Mirror chunks are stored compressed on every backend: a realistic rollout costs at most
/// 35% of its bytes in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_backend_stores_a_realistic_rollout_compressed() {
    // testkit's codex-shaped JSONL (tool output, prose, reasoning with incompressible
    // `encrypted_content`), about 3 MiB in turns of 5 to 60 KB.
    let turns = rethread_testkit::rollout::turns(39, 3 << 20);
    let dir = tempfile::tempdir().unwrap();
    let relaxed = || OpenOptions::new().durability(rethread_store::Durability::Relaxed);
    let stores = [
        BindingStore::memory(),
        BindingStore::redb(dir.path().join("share.redb"), relaxed())
            .await
            .unwrap(),
        BindingStore::sqlite(dir.path().join("share.sqlite"), relaxed())
            .await
            .unwrap(),
    ];
    for store in &stores {
        conformance::mirror_keeps_a_share_of_a_realistic_rollout(store, &turns).await;
    }
}

/// Issue 43: the whole suite on sealed stores, on every backend (PostgreSQL's in
/// `tests/postgres.rs`): sealing changes what is stored, never what the store does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_stores_conform() {
    let key = rethread_store::StoreKey::generate().unwrap();
    let clock = Clock::manual();
    let memory = BindingStore::memory_with_clock(clock.clone());
    conforms(memory.sealed(&key, false).await.unwrap(), &clock).await;
    let dir = tempfile::tempdir().unwrap();
    let (clock, options) = on_manual_clock();
    let redb = BindingStore::redb(
        dir.path().join("sealed.redb"),
        options.key(Some(key.clone())),
    );
    conforms(redb.await.unwrap(), &clock).await;
    let (clock, options) = on_manual_clock();
    let sqlite = BindingStore::sqlite(dir.path().join("sealed.sqlite"), options.key(Some(key)));
    conforms(sqlite.await.unwrap(), &clock).await;
}
