//! The [`BindingStore`] trait, its forwarding impl and the [`BindingStoreExt`] conveniences.

use crate::Unpoisoned;
use std::ops::{Deref, Range};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value};

use crate::{
    Binding, CommitOutcome, Fence, ImportOutcome, Lease, LeaseOwner, MirroredFile, Prune,
    PruneReport, Result, Retirement, SessionExport, SessionPage, SessionRecord, StoreError,
    StoredBytes, TranscriptRow, TurnCommit, VerifyProgress, VerifyReport,
};

/// Durable `session id -> codex thread id` bindings and the sessions' transcripts; the
/// conveniences are in [`BindingStoreExt`].
///
/// # Contract (all methods)
/// - A write either happens whole or not at all; readers never see it half-applied.
/// - A write returns only once it is durable (unless the store was opened with
///   [`Durability::Relaxed`](crate::Durability::Relaxed)).
/// - A failure of the store is an error, never an empty answer: a corrupt or unreadable store
///   is never read as "no sessions".
/// - Methods never block the async runtime's threads.
#[async_trait]
pub trait BindingStore: Send + Sync + std::fmt::Debug {
    /// Reads a session; `Ok(None)` only when it does not exist.
    async fn session(&self, session_id: &str) -> Result<Option<SessionRecord>>;

    /// Reads the rows of `session_id` whose `seq` is in `range` (clipped to `0..row_count`), in
    /// order; none for a missing session.
    async fn rows(&self, session_id: &str, range: Range<u64>) -> Result<Vec<TranscriptRow>>;

    /// Appends the turn's rows and binds the session to its thread, in **one** transaction,
    /// with what the thread's rollout files grew by ([`TurnCommit::mirror`]).
    ///
    /// # Contract
    /// - Creates the session if absent. `rows` may be empty: the call then only publishes
    ///   (a host that keeps its own transcript and has reported it durable).
    /// - Each append of the mirror ([`MirrorUpdate`](crate::MirrorUpdate)) extends the stored
    ///   file it names (same length and CRC-32) or, with base length 0, replaces it; one that
    ///   does not extend is [`StoreError::MirrorMismatch`], nothing written. Past the update's
    ///   cap the session's mirror is dropped and mirroring stops for the session's thread
    ///   ([`MirrorOutcome::StoppedNow`](crate::MirrorOutcome::StoppedNow) once, then
    ///   `Stopped`); the turn still commits. A commit that binds another thread, or the
    ///   retirement of the bound one, starts it again. A commit without a mirror, or of a retired
    ///   thread, drops the thread's mirror.
    /// - The rows get `seq` `first_seq..row_count` of the returned outcome.
    /// - The state becomes [`BindingState::Bound`](crate::BindingState::Bound) to the thread
    ///   (from `GivenUp` too: the new thread settles the owed notice). A binding that already
    ///   names the thread keeps its `bound_at_ms`; `codex_home` is taken from the commit.
    /// - A thread retired for this session: the rows still commit, the state is untouched
    ///   ([`CommitOutcome::RetiredNotPublished`]).
    /// - A thread of another session is [`StoreError::ThreadTaken`], a stale `fence`
    ///   [`StoreError::LeaseLost`]; either way nothing is written.
    async fn commit_turn(&self, commit: TurnCommit) -> Result<CommitOutcome>;

    /// Applies an RFC 7396 JSON merge-patch to the session's `model_config` atomically (created
    /// if absent), and returns the new config.
    ///
    /// # Contract
    /// - Keys the patch does not name are never lost, also under concurrent patches.
    /// - A patch naming [`CODEX_THREAD_ID_KEY`](crate::CODEX_THREAD_ID_KEY) is
    ///   [`StoreError::InvalidInput`], a stale `fence` [`StoreError::LeaseLost`]; either way
    ///   nothing is written.
    async fn patch_config(
        &self,
        session_id: &str,
        patch: Map<String, Value>,
        fence: Option<&Fence>,
    ) -> Result<Map<String, Value>>;

    /// Retires `thread_id` for the session, in one write, as `retirement` says: a lost thread
    /// given up ([`Retirement::Lost`]) or the host's own end of it ([`Retirement::Ended`]).
    ///
    /// # Contract
    /// - The thread is retired for good, whoever commits it later; idempotent; creates the
    ///   session if absent, so that a late commit cannot resurrect it.
    /// - Compare-and-set: only a binding to this thread changes. `Lost` makes it
    ///   [`BindingState::GivenUp`](crate::BindingState::GivenUp) (now, notice owed), `Ended`
    ///   unbound; a given-up state is kept as it is.
    /// - A thread of another session is [`StoreError::ThreadTaken`], a stale `fence`
    ///   [`StoreError::LeaseLost`]; either way nothing is written.
    async fn retire_thread(
        &self,
        session_id: &str,
        thread_id: &str,
        retirement: Retirement,
        fence: Option<&Fence>,
    ) -> Result<()>;

    /// Records that the fallback notice of the give-up of `thread_id` reached the user.
    ///
    /// # Contract
    /// `true` when the session is given up from `thread_id` (its notice now delivered); else
    /// `false`, nothing changed. A stale `fence` is [`StoreError::LeaseLost`].
    async fn mark_notice_delivered(
        &self,
        session_id: &str,
        thread_id: &str,
        fence: Option<&Fence>,
    ) -> Result<bool>;

    /// The session `thread_id` belongs to, if any: every thread the store bound, gave up or
    /// retired for a session belongs to it until the session is deleted.
    async fn thread_session(&self, thread_id: &str) -> Result<Option<String>>;

    /// Writes the mirrored file `path` of `thread_id` in `session_id` into `out` chunk by
    /// chunk as it is read (one snapshot, never the whole file in memory), checked against
    /// its length and CRC-32 in [`SessionRecord::mirror`], and returns that entry.
    /// [`BindingStoreExt::mirror_file`] reads it into memory.
    ///
    /// # Contract
    /// `Ok(None)`, nothing written, when the session or the file is not mirrored. On `Err`
    /// (damage found part way through, [`StoreError::Corrupt`], or `out` failing,
    /// [`StoreError::Io`]) `out` may hold part of the file: write into a temp file and keep it
    /// only on `Ok`. `out` is flushed before `Ok`, and runs on the store's own threads.
    async fn write_mirror_file(
        &self,
        session_id: &str,
        thread_id: &str,
        path: &str,
        out: Box<dyn std::io::Write + Send>,
    ) -> Result<Option<MirroredFile>>;

    /// Lists at most `limit` (at least 1) sessions in ascending session-id order, starting after
    /// `after`; `next_after` is `Some` when more may follow.
    async fn list_sessions(&self, after: Option<&str>, limit: usize) -> Result<SessionPage>;

    /// Deletes a session (record, rows, mirror, retirements) and frees its threads; `true` if
    /// it existed.
    ///
    /// # Contract
    /// - While its lease is live and its holder not known gone
    ///   ([`LeaseOwner::is_known_gone`]): [`StoreError::Busy`] naming the holder, nothing
    ///   deleted.
    /// - The lease is then granted to nobody (the fence grows): a stalled holder can never take
    ///   it back or write ([`LeaseLoss::Forgotten`](crate::LeaseLoss::Forgotten)), so a delete
    ///   is never silently undone. A later acquire continues the fence.
    async fn delete_session(&self, session_id: &str) -> Result<bool>;

    /// Removes every session idle for [`Prune::idle`] (last written that long ago by the
    /// store's clock), as a delete does: record, rows, mirror, threads, and its lease record.
    ///
    /// # Contract
    /// - Never a session whose lease is live (its holder not known gone): those are listed in
    ///   [`PruneReport::kept_leased`]. Idleness and the lease are judged inside the write that
    ///   removes the session, so one written or leased meanwhile stays.
    /// - At most [`Prune::batch`] sessions per write transaction: the store's other writers
    ///   wait for one batch at most. A failure stops the prune; the batches before it stay
    ///   removed.
    /// - [`Prune::dry_run`]: nothing is removed, and the report says what would go.
    /// - A stale grant of a pruned session is refused ([`LeaseLoss::Forgotten`](crate::LeaseLoss::Forgotten));
    ///   a later acquire starts the session's fences anew.
    async fn prune_sessions(&self, prune: Prune) -> Result<PruneReport>;

    /// What each of `session_ids` holds in the store (rows and mirror), in order, from one
    /// snapshot; zero for a session not stored.
    async fn session_bytes(&self, session_ids: &[String]) -> Result<Vec<StoredBytes>>;

    /// Reads a whole session (record, all rows, mirror, and every thread that belongs to it)
    /// from one consistent snapshot.
    async fn export_session(&self, session_id: &str) -> Result<Option<SessionExport>>;

    /// Writes a whole session exported from another store.
    ///
    /// # Contract
    /// - Idempotent: an export identical to what is stored is
    ///   [`ImportOutcome::AlreadyPresent`], so a rerun `migrate` never duplicates rows; a
    ///   differing existing session is [`StoreError::Conflict`].
    /// - An inconsistent export (rows not `0..row_count`, `model_config[CODEX_THREAD_ID_KEY]`
    ///   disagreeing with the state, a retired thread bound) is [`StoreError::InvalidInput`];
    ///   a thread of another session is [`StoreError::ThreadTaken`].
    /// - A session not present yet is refused while its lease is live, as a delete is (that
    ///   holder's fenced writes would build on a history it never read), and once imported its
    ///   lease is granted to nobody, as after a delete.
    /// - The session owns every thread of the export ([`SessionExport::threads`]), also when
    ///   it was present already.
    /// - Refused imports write nothing.
    async fn import_session(&self, export: SessionExport) -> Result<ImportOutcome>;

    /// Takes the session's lease for `owner` for `ttl`: the right to drive the session's codex
    /// thread, held (renewed) through the turn's commit so that two hosts never drive it at
    /// once.
    ///
    /// # Contract
    /// - Granted (a new `fence`, `acquired_at_ms` now) when the session has no live lease (none,
    ///   expired, released or forgotten), when `owner` holds it already (a new grant: the
    ///   earlier one's renewals, releases and fenced writes are refused from then on), or when
    ///   its holder is provably gone ([`LeaseOwner::is_known_gone`]).
    /// - Another owner's live lease is [`StoreError::Busy`] naming the holder; nothing changes.
    /// - Expiry is judged by one clock per store (PostgreSQL's server, else the machine's).
    async fn acquire_lease(
        &self,
        session_id: &str,
        owner: &LeaseOwner,
        ttl: Duration,
    ) -> Result<Lease>;

    /// Extends a lease to `ttl` from now.
    ///
    /// # Contract
    /// Only the session's newest grant renews (same owner and `fence`, not released), also
    /// after its expiry (nobody took it meanwhile); else [`StoreError::LeaseLost`] saying why,
    /// nothing changed.
    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease>;

    /// Frees a lease: `true` if it (same owner and `fence`) was the session's newest grant and
    /// is now released; else `false`, nothing changed (another grant is never freed).
    async fn release_lease(&self, lease: &Lease) -> Result<bool>;

    /// Reads the whole store and checks every record of it (`rethread verify`); reports each
    /// problem found.
    ///
    /// # Contract
    /// - Damage is reported in [`VerifyReport::problems`], not returned; damage that stops the
    ///   scan leaves [`VerifyReport::complete`] `false`. `Err` only when the store cannot be
    ///   read for another reason (I/O, locked, closed).
    /// - It reads one snapshot where the backend has them (redb, SQLite), never blocks writers
    ///   for long, and writes nothing. `progress` is called at most every 50 ms, and at the end.
    /// - The file backends scan their tables (SQLite after `PRAGMA quick_check`) and also find
    ///   rows of no session; the default (memory, PostgreSQL, others) exports every session.
    async fn verify(
        &self,
        progress: &mut (dyn for<'p> FnMut(&'p VerifyProgress) + Send),
    ) -> Result<VerifyReport> {
        crate::verify::by_export(self, progress).await
    }
}

/// A pointer to a store is a store (`Arc<S>`, `Box<S>`, `&S`, ...): every method forwarded.
#[async_trait]
impl<P> BindingStore for P
where
    P: Deref + Send + Sync + std::fmt::Debug,
    P::Target: BindingStore,
{
    async fn session(&self, session_id: &str) -> Result<Option<SessionRecord>> {
        (**self).session(session_id).await
    }
    async fn rows(&self, session_id: &str, range: Range<u64>) -> Result<Vec<TranscriptRow>> {
        (**self).rows(session_id, range).await
    }
    async fn commit_turn(&self, commit: TurnCommit) -> Result<CommitOutcome> {
        (**self).commit_turn(commit).await
    }
    async fn patch_config(
        &self,
        session_id: &str,
        patch: Map<String, Value>,
        fence: Option<&Fence>,
    ) -> Result<Map<String, Value>> {
        (**self).patch_config(session_id, patch, fence).await
    }
    async fn retire_thread(
        &self,
        session_id: &str,
        thread_id: &str,
        retirement: Retirement,
        fence: Option<&Fence>,
    ) -> Result<()> {
        (**self)
            .retire_thread(session_id, thread_id, retirement, fence)
            .await
    }
    async fn mark_notice_delivered(
        &self,
        session_id: &str,
        thread_id: &str,
        fence: Option<&Fence>,
    ) -> Result<bool> {
        (**self)
            .mark_notice_delivered(session_id, thread_id, fence)
            .await
    }
    async fn thread_session(&self, thread_id: &str) -> Result<Option<String>> {
        (**self).thread_session(thread_id).await
    }
    async fn write_mirror_file(
        &self,
        session_id: &str,
        thread_id: &str,
        path: &str,
        out: Box<dyn std::io::Write + Send>,
    ) -> Result<Option<MirroredFile>> {
        (**self)
            .write_mirror_file(session_id, thread_id, path, out)
            .await
    }
    async fn list_sessions(&self, after: Option<&str>, limit: usize) -> Result<SessionPage> {
        (**self).list_sessions(after, limit).await
    }
    async fn delete_session(&self, session_id: &str) -> Result<bool> {
        (**self).delete_session(session_id).await
    }
    async fn prune_sessions(&self, prune: Prune) -> Result<PruneReport> {
        (**self).prune_sessions(prune).await
    }
    async fn session_bytes(&self, session_ids: &[String]) -> Result<Vec<StoredBytes>> {
        (**self).session_bytes(session_ids).await
    }
    async fn export_session(&self, session_id: &str) -> Result<Option<SessionExport>> {
        (**self).export_session(session_id).await
    }
    async fn import_session(&self, export: SessionExport) -> Result<ImportOutcome> {
        (**self).import_session(export).await
    }
    async fn acquire_lease(
        &self,
        session_id: &str,
        owner: &LeaseOwner,
        ttl: Duration,
    ) -> Result<Lease> {
        (**self).acquire_lease(session_id, owner, ttl).await
    }
    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        (**self).renew_lease(lease, ttl).await
    }
    async fn release_lease(&self, lease: &Lease) -> Result<bool> {
        (**self).release_lease(lease).await
    }
    async fn verify(
        &self,
        progress: &mut (dyn for<'p> FnMut(&'p VerifyProgress) + Send),
    ) -> Result<VerifyReport> {
        (**self).verify(progress).await
    }
}

/// Conveniences over [`BindingStore`], implemented for every store.
#[async_trait]
pub trait BindingStoreExt: BindingStore {
    /// The session's binding, if the session exists and is bound.
    async fn binding(&self, session_id: &str) -> Result<Option<Binding>> {
        Ok(self
            .session(session_id)
            .await?
            .and_then(|s| s.binding().cloned()))
    }

    /// The session's bound thread id, if any.
    async fn thread_id(&self, session_id: &str) -> Result<Option<String>> {
        Ok(self.binding(session_id).await?.map(|b| b.thread_id))
    }

    /// The session, or [`StoreError::NotFound`].
    async fn require_session(&self, session_id: &str) -> Result<SessionRecord> {
        self.session(session_id)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                what: format!("session {session_id}"),
            })
    }

    /// [`BindingStore::write_mirror_file`] into memory.
    async fn mirror_file(
        &self,
        session_id: &str,
        thread_id: &str,
        path: &str,
    ) -> Result<Option<Vec<u8>>> {
        let bytes = MemoryFile::default();
        let out = Box::new(bytes.clone());
        let written = self
            .write_mirror_file(session_id, thread_id, path, out)
            .await?;
        Ok(written.map(|_| std::mem::take(&mut *bytes.lock())))
    }

    /// All rows of the session, in order (empty if the session does not exist).
    async fn all_rows(&self, session_id: &str) -> Result<Vec<TranscriptRow>> {
        self.rows(session_id, 0..u64::MAX).await
    }

    /// How many sessions the store holds, counted page by page.
    async fn count_sessions(&self) -> Result<u64> {
        let mut count = 0u64;
        for_each_page(self, |page| count += page.sessions.len() as u64).await?;
        Ok(count)
    }

    /// Every session, in memory: to walk a large store, page through
    /// [`BindingStore::list_sessions`] instead.
    async fn all_sessions(&self) -> Result<Vec<SessionRecord>> {
        let mut out = Vec::new();
        for_each_page(self, |page| out.extend(page.sessions)).await?;
        Ok(out)
    }

    /// Sets (or, with `None`, removes) one `model_config` key through an unfenced merge-patch.
    async fn set_config_key(
        &self,
        session_id: &str,
        key: &str,
        value: Option<Value>,
    ) -> Result<Map<String, Value>> {
        let mut patch = Map::new();
        patch.insert(key.to_string(), value.unwrap_or(Value::Null));
        self.patch_config(session_id, patch, None).await
    }
}

impl<S: BindingStore + ?Sized> BindingStoreExt for S {}

/// Hands every page of [`BindingStore::list_sessions`] to `each`, in order.
async fn for_each_page<S: BindingStore + ?Sized>(
    store: &S,
    mut each: impl FnMut(SessionPage) + Send,
) -> Result<()> {
    let mut after: Option<String> = None;
    loop {
        let mut page = store.list_sessions(after.as_deref(), 256).await?;
        after = page.next_after.take();
        each(page);
        if after.is_none() {
            return Ok(());
        }
    }
}

/// A buffer to stream a mirrored file into, the caller keeping a handle to it.
#[derive(Clone, Default)]
pub(crate) struct MemoryFile(Arc<std::sync::Mutex<Vec<u8>>>);

impl MemoryFile {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.0.lock().unpoisoned()
    }
}

impl std::io::Write for MemoryFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
