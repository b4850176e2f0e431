//! The redb backend: embedded, one process per file.
//!
//! Tables (`schema.rs`; codec in `tables.rs`): `sessions`, `rows`, `threads` and
//! `session_threads` (which session each thread belongs to, both ways), `mirror_chunks`,
//! `rethread_meta`. redb locks the file to one process: another waits up to
//! [`OpenOptions::wait`], then gets [`StoreError::Locked`] naming the holder (from the record
//! `<file>.holder` each holder writes beside the file). Leases live in this process
//! (`LocalLeases`). Every redb call runs under `catch_unwind` (`engine.rs`); after an I/O error
//! (a full disk) the writer reopens the file, so the store goes on once the cause is gone.

mod engine;
mod overlay;
mod tables;

use std::path::Path;
use std::sync::Arc;

use self::engine::{open_shared, MakeBackend, Opener, RedbEngine, RedbReaders};
use crate::durable::{Durable, Writer};
use crate::logic::LocalLeases;
use crate::Result;
use crate::{BoxError, OpenOptions, StoreError};

/// Opens the redb engine of [`BindingStore::redb`](crate::BindingStore::redb).
pub(crate) async fn open(path: &Path, options: OpenOptions) -> Result<Durable> {
    let make_backend: MakeBackend = Arc::new(|builder, file| {
        builder.create_with_backend(::redb::backends::FileBackend::new(file)?)
    });
    open_with(path, options, make_backend).await
}

/// Opens the redb engine on the storage `make_backend` makes of the file.
async fn open_with(
    path: &Path,
    options: OpenOptions,
    make_backend: MakeBackend,
) -> Result<Durable> {
    let path = path.to_path_buf();
    let read_only = options.read_only.then(|| crate::redact::path_label(&path));
    let clock = options.clock.clone();
    let opener = Opener {
        label: crate::redact::path_label(&path),
        path,
        options,
        make_backend,
    };
    // Shared by the lease calls and the writer thread, which checks fences against them.
    let leases = Arc::new(LocalLeases::new(clock.clone()));
    let engine_leases = Arc::clone(&leases);
    let (writer, readers) = Writer::spawn("redb", clock.clone(), move || {
        let (shared, file_id) = open_shared(&opener)?;
        let shared = Arc::new(shared);
        let readers = RedbReaders {
            shared: Arc::clone(&shared),
            leases: Arc::clone(&engine_leases),
        };
        let engine = RedbEngine {
            shared,
            opener,
            leases: engine_leases,
            file_id,
            reopen: false,
            not_durable_since: None,
        };
        Ok((engine, readers))
    })
    .await?;
    Ok(Durable::new(
        writer,
        Arc::new(readers),
        Some(leases),
        read_only,
        clock,
    ))
}

/// Maps every redb error to a [`StoreError`]. The one place redb errors are interpreted.
pub(crate) fn map_redb_error(path: &str, error: impl Into<::redb::Error>) -> StoreError {
    let error: ::redb::Error = error.into();
    let corrupt = |detail: &str, source: BoxError| StoreError::Corrupt {
        path: path.to_string(),
        detail: detail.to_string(),
        source: Some(source),
    };
    match error {
        ::redb::Error::DatabaseAlreadyOpen | ::redb::Error::LockProtocolMismatch => {
            StoreError::locked(path)
        }
        // redb refuses everything after an I/O error until the file is reopened.
        ::redb::Error::PreviousIo => {
            StoreError::io(path, std::io::Error::other("a previous I/O error occurred"))
        }
        ::redb::Error::Corrupted(detail) => StoreError::corrupt(path, detail),
        ::redb::Error::TableTypeMismatch { .. }
        | ::redb::Error::TableIsMultimap(_)
        | ::redb::Error::TableIsNotMultimap(_)
        | ::redb::Error::TypeDefinitionChanged { .. } => {
            corrupt("tables do not have rethread's layout", Box::new(error))
        }
        ::redb::Error::Io(source) if source.kind() == std::io::ErrorKind::InvalidData => {
            corrupt("not a redb file", Box::new(source))
        }
        ::redb::Error::Io(source) => StoreError::io(path, source),
        other => StoreError::Backend {
            backend: "redb",
            source: Box::new(other),
        },
    }
}

/// [`map_redb_error`] as a method of redb's results.
pub(crate) trait RedbResult<T> {
    fn redb(self, label: &str) -> Result<T>;
}

impl<T, E: Into<::redb::Error>> RedbResult<T> for std::result::Result<T, E> {
    fn redb(self, label: &str) -> Result<T> {
        self.map_err(|e| map_redb_error(label, e))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use ::redb::backends::FileBackend;
    use ::redb::StorageBackend;

    use super::*;
    use crate::{BindingStore, TurnCommit};

    /// The file, with writes that fail with "no space left on device" while `full` is set.
    #[derive(Debug)]
    struct FullDisk {
        file: FileBackend,
        full: Arc<AtomicBool>,
        /// While set, every sync takes 300 ms (a slow disk).
        slow: Arc<AtomicBool>,
    }

    impl FullDisk {
        fn check(&self) -> Result<(), std::io::Error> {
            if self.full.load(Ordering::SeqCst) {
                return Err(std::io::Error::from_raw_os_error(28));
            }
            Ok(())
        }
    }

    type Bound = std::ops::Bound<u64>;

    impl StorageBackend for FullDisk {
        fn len(&self) -> Result<u64, std::io::Error> {
            self.file.len()
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
            self.file.read(offset, out)
        }
        fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
            self.check()?;
            self.file.set_len(len)
        }
        fn sync_data(&self) -> Result<(), std::io::Error> {
            self.check()?;
            if self.slow.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(300));
            }
            self.file.sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
            self.check()?;
            self.file.write(offset, data)
        }
        fn close(&self) -> Result<(), std::io::Error> {
            self.file.close()
        }
        fn try_lock_range(&self, s: Bound, e: Bound) -> Result<bool, ::redb::BackendError> {
            self.file.try_lock_range(s, e)
        }
        fn try_lock_shared_range(&self, s: Bound, e: Bound) -> Result<bool, ::redb::BackendError> {
            self.file.try_lock_shared_range(s, e)
        }
        fn lock_range(&self, s: Bound, e: Bound) -> Result<(), ::redb::BackendError> {
            self.file.lock_range(s, e)
        }
        fn lock_shared_range(&self, s: Bound, e: Bound) -> Result<(), ::redb::BackendError> {
            self.file.lock_shared_range(s, e)
        }
        fn unlock_range(&self, s: Bound, e: Bound) -> Result<(), ::redb::BackendError> {
            self.file.unlock_range(s, e)
        }
        fn query_lock_range(&self, s: Bound, e: Bound) -> Result<bool, ::redb::BackendError> {
            self.file.query_lock_range(s, e)
        }
    }

    /// A store on a [`FullDisk`] in `dir`: its disk fills while `full` is set, its syncs are
    /// slow while `slow` is.
    async fn store_on_disk(
        dir: &Path,
        full: &Arc<AtomicBool>,
        slow: &Arc<AtomicBool>,
    ) -> BindingStore {
        let (full, slow) = (Arc::clone(full), Arc::clone(slow));
        let make_backend: MakeBackend = Arc::new(move |builder, file| {
            builder.create_with_backend(FullDisk {
                file: FileBackend::new(file)?,
                full: Arc::clone(&full),
                slow: Arc::clone(&slow),
            })
        });
        let path = dir.join("s.redb");
        let opened = open_with(&path, OpenOptions::new(), make_backend).await;
        BindingStore::new(opened.unwrap())
    }

    /// A lease holder on another machine.
    fn owner(name: &str) -> crate::LeaseOwner {
        crate::LeaseOwner {
            host: format!("host-{name}"),
            pid: 4242,
            started_at_ms: 1_700_000_000_000,
            instance: 1,
            process: None,
        }
    }

    fn commit(n: u64) -> TurnCommit {
        TurnCommit {
            session_id: "s".to_string(),
            thread_id: "t".to_string(),
            codex_home: None,
            rows: vec![serde_json::json!({ "n": n })],
            fence: None,
            mirror: None,
        }
    }

    /// Issue 19 item 12: redb fails every call after one I/O error ("Previous I/O error
    /// occurred") until the database is reopened; the store reopens it and goes on once space
    /// is back, with every acknowledged commit and none of the failed one.
    #[tokio::test]
    async fn a_full_disk_fails_its_commit_and_the_store_goes_on_once_space_is_back() {
        let dir = tempfile::tempdir().unwrap();
        let full = Arc::new(AtomicBool::new(false));
        let path = dir.path().join("s.redb");
        let store = store_on_disk(dir.path(), &full, &Arc::default()).await;
        store.commit_turn(commit(0)).await.unwrap();

        full.store(true, Ordering::SeqCst);
        for n in [1, 2] {
            let refused = store.commit_turn(commit(n)).await;
            assert!(matches!(refused, Err(StoreError::Io { .. })), "{refused:?}");
        }
        full.store(false, Ordering::SeqCst);
        let out = store.commit_turn(commit(3)).await.expect("space is back");
        assert_eq!((out.first_seq(), out.row_count()), (1, 2));
        let rows = store.all_rows("s").await.unwrap();
        let ns: Vec<_> = rows.iter().map(|r| r.body["n"].clone()).collect();
        assert_eq!(ns, [serde_json::json!(0), serde_json::json!(3)]);
        store.close().await;
        let reopened = BindingStore::redb(&path, OpenOptions::new().create(false))
            .await
            .unwrap();
        assert_eq!(reopened.all_rows("s").await.unwrap().len(), 2);
    }

    /// redb keeps leases in the process, and a lease request used to run at once, beside the
    /// writer thread: a fenced commit that had passed its fence check could still be
    /// committing (a slow sync) when another owner took the lease and read the session. The
    /// new holder then started from a state without that commit, which landed after: a fork.
    /// A lease request now waits for the write under way, and a write after it sees the new
    /// grant.
    #[tokio::test]
    async fn a_lease_taken_while_a_fenced_commit_is_syncing_sees_that_commit() {
        let dir = tempfile::tempdir().unwrap();
        let slow = Arc::new(AtomicBool::new(false));
        let store = store_on_disk(dir.path(), &Arc::default(), &slow).await;
        let ttl = std::time::Duration::from_millis(100);
        let a = store.acquire_lease("s", &owner("a"), ttl).await.unwrap();
        slow.store(true, Ordering::SeqCst);
        let writer = store.clone();
        let committed =
            tokio::spawn(async move { writer.commit_turn(commit(0).fence(Some(a.fence()))).await });
        // A's lease expires while its commit syncs; B takes it and reads the session.
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        store
            .acquire_lease("s", &owner("b"), std::time::Duration::from_secs(60))
            .await
            .unwrap();
        let seen = store.session("s").await.unwrap();
        slow.store(false, Ordering::SeqCst);
        match committed.await.unwrap() {
            Ok(_) => assert!(
                seen.is_some_and(|record| record.row_count == 1),
                "B took the lease and read the session without A's commit, which then landed"
            ),
            Err(StoreError::LeaseLost { .. }) => {}
            Err(other) => panic!("{other:?}"),
        }
        store.close().await;
    }

    /// Issue 36: a prune compacted the file after each batch's commit (10,000 sessions in
    /// batches of 64: about 150 compactions, 23 s, each holding every reader and writer). It
    /// compacts once, after its last batch; a forget compacts at once; a dry run never.
    #[tokio::test]
    async fn a_prune_compacts_once_after_its_last_batch_and_a_forget_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let clock = crate::Clock::manual();
        let options = OpenOptions::new().clock(clock.clone());
        let path = dir.path().join("s.redb");
        let store = BindingStore::redb(&path, options).await.unwrap();
        let label = crate::redact::path_label(&path);
        let compactions = || {
            let counts = engine::COMPACTIONS.lock().unwrap();
            counts.get(&label).copied().unwrap_or(0)
        };
        for n in 0..6 {
            let mut turn = commit(n);
            turn.session_id = format!("s{n}");
            turn.thread_id = format!("t{n}");
            store.commit_turn(turn).await.unwrap();
        }
        clock.advance(std::time::Duration::from_secs(3600));
        let prune = crate::Prune::idle(std::time::Duration::from_secs(60)).batch(2);
        let dry = store.prune_sessions(prune.clone().dry_run(true)).await;
        assert_eq!(dry.unwrap().sessions.len(), 6);
        assert_eq!(compactions(), 0, "a dry run removes nothing");
        store.delete_session("s0").await.unwrap();
        assert_eq!(compactions(), 1, "a forget compacts at once");
        let report = store.prune_sessions(prune).await.unwrap();
        assert_eq!(report.sessions.len(), 5);
        assert_eq!(compactions(), 2, "three batches, one compaction");
        store.close().await;
    }

    /// What a write changes of redb's in-process leases is kept only if the write commits: a
    /// delete that failed (a full disk) used to forget the lease all the same, and the holder,
    /// whose session was still there, was told it had been forgotten.
    #[tokio::test]
    async fn a_delete_that_failed_leaves_the_lease_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let full = Arc::new(AtomicBool::new(false));
        let store = store_on_disk(dir.path(), &full, &Arc::default()).await;
        store.commit_turn(commit(0)).await.unwrap();
        let ttl = std::time::Duration::from_millis(50);
        let lease = store.acquire_lease("s", &owner("a"), ttl).await.unwrap();
        // Expired: a delete may go ahead, and forgets the grant when it commits.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        full.store(true, Ordering::SeqCst);
        let deleted = store.delete_session("s").await;
        assert!(matches!(deleted, Err(StoreError::Io { .. })), "{deleted:?}");
        full.store(false, Ordering::SeqCst);
        // The next write reopens the file after the I/O error.
        let mut other = commit(0);
        other.session_id = "other".to_string();
        other.thread_id = "t-other".to_string();
        store.commit_turn(other).await.unwrap();
        assert!(store.session("s").await.unwrap().is_some());
        let renewed = store.renew_lease(&lease, ttl).await;
        assert!(
            renewed.is_ok(),
            "the session is there, its lease not forgotten: {renewed:?}"
        );
        store.close().await;
    }
}
