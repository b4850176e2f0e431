//! [`BindingStore`]: the one store, its rules run over the [`Engine`] of a backend.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::engine::{Answer, Engine, Progress, ReadFn, Request, WriteFn};
use crate::logic::{self, LeaseTxn, ReadTxn, WriteTxn};
use crate::seal::{Sealed, Sealer};
use crate::{
    Binding, CommitOutcome, Fence, ImportOutcome, Lease, LeaseOwner, MirroredFile, Prune,
    PruneReport, Result, Retirement, SessionExport, SessionPage, SessionRecord, StoreError,
    StoreKey, StoredBytes, TranscriptRow, TurnCommit, Unpoisoned, VerifyReport,
};

/// Durable `session id -> codex thread id` bindings and the sessions' transcripts, over a
/// backend's [`Engine`]. Cloning is cheap: clones share the engine.
///
/// Open one with [`open_url`](crate::open_url), [`BindingStore::memory`], or (per backend
/// feature) [`BindingStore::redb`], [`BindingStore::sqlite`], [`BindingStore::postgres`]; a
/// backend of your own with [`BindingStore::new`].
///
/// # Contract (all methods)
/// - A write either happens whole or not at all; readers never see it half-applied.
/// - A write returns only once it is durable (unless the store was opened with
///   [`Durability::Relaxed`](crate::Durability::Relaxed)).
/// - A failure of the store is an error, never an empty answer: a corrupt or unreadable store
///   is never read as "no sessions".
/// - Methods never block the async runtime's threads.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use rethread_store::{BindingStore, TurnCommit};
/// let store = BindingStore::memory();
/// let turn = TurnCommit::new("session-1", "thread-1", vec![serde_json::json!({"role": "user"})]);
/// store.commit_turn(turn).await.unwrap();
/// assert_eq!(store.thread_id("session-1").await.unwrap().as_deref(), Some("thread-1"));
/// # });
/// ```
#[derive(Debug, Clone)]
pub struct BindingStore {
    engine: Arc<dyn Engine>,
    /// A sealed store's key (`seal.rs`): every read and write goes through it.
    sealer: Option<Arc<Sealer>>,
}

impl BindingStore {
    /// The store over `engine`: every rule of the store, run by that backend.
    pub fn new(engine: impl Engine) -> Self {
        Self::shared(Arc::new(engine))
    }

    /// The store over an engine shared with others (a wrapper that injects faults, say).
    pub fn shared(engine: Arc<dyn Engine>) -> Self {
        BindingStore {
            engine,
            sealer: None,
        }
    }

    /// This store sealed with `key` (`docs/design.md`, "Sealed stores"): every transcript row
    /// and mirror chunk written from now on is compressed, then encrypted and bound to its
    /// place; what is read is checked and opened. A store sealed before must have been sealed
    /// with this key; an empty store is sealed now (unless `read_only`: then nothing is
    /// written and it is only read as sealed).
    ///
    /// Errors: [`StoreError::WrongKey`] for a store sealed with another key,
    /// [`StoreError::NotSealed`] for a store that holds sessions written without a key (seal
    /// it with a copy: `rethread migrate --to-key-file`). Nothing is changed by a refusal.
    pub async fn sealed(self, key: &StoreKey, read_only: bool) -> Result<Self> {
        let sealer = Arc::new(Sealer::new(key));
        let check = sealer.check();
        let (found, label) = self.seal_check().await?;
        match found {
            Some(found) if found == check => {}
            Some(_) => return Err(StoreError::WrongKey { store: label }),
            None if !self.is_empty().await? => return Err(StoreError::NotSealed { store: label }),
            None if read_only => {}
            None => {
                let request = Request::new("seal");
                self.write(request, move |txn, _| match txn.seal_check()? {
                    None => txn.put_seal_check(check),
                    Some(found) if found == check => Ok(()),
                    Some(_) => Err(StoreError::WrongKey {
                        store: txn.label().to_string(),
                    }),
                })
                .await?;
            }
        }
        Ok(BindingStore {
            sealer: Some(sealer),
            ..self
        })
    }

    /// Whether the store is sealed ([`BindingStore::sealed`]).
    pub fn is_sealed(&self) -> bool {
        self.sealer.is_some()
    }

    /// The store as opened with `key`, if any ([`BindingStore::sealed`]); without one, a
    /// sealed store is refused ([`StoreError::KeyRequired`]).
    pub(crate) async fn with_key(self, key: Option<&StoreKey>, read_only: bool) -> Result<Self> {
        match key {
            Some(key) => self.sealed(key, read_only).await,
            None => match self.seal_check().await? {
                (Some(_), store) => Err(StoreError::KeyRequired { store }),
                (None, _) => Ok(self),
            },
        }
    }

    /// The store's key check, if sealed, and its label.
    async fn seal_check(&self) -> Result<(Option<u64>, String)> {
        self.read("seal", |txn| {
            Ok((txn.seal_check()?, txn.label().to_string()))
        })
        .await
    }

    /// Whether the store holds no session and no row.
    async fn is_empty(&self) -> Result<bool> {
        self.read("seal", |txn| {
            Ok(txn.list(None, 1)?.is_empty() && txn.row_ends()?.is_empty())
        })
        .await
    }

    /// The engine this store runs on (to wrap it in another, say).
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    /// Finishes queued writes and closes the store's files and connections, so that a file
    /// store can be opened again (by this or another process) as soon as this returns. The
    /// engine is shared: later calls through any clone of a file or PostgreSQL store are
    /// [`StoreError::Closed`].
    pub async fn close(self) {
        self.engine.close().await;
    }

    /// Reads a session; `Ok(None)` only when it does not exist.
    pub async fn session(&self, session_id: &str) -> Result<Option<SessionRecord>> {
        let id = session_id.to_string();
        self.read("session", move |txn| logic::load_session(txn, &id))
            .await
    }

    /// Reads the rows of `session_id` whose `seq` is in `range` (clipped to `0..row_count`), in
    /// order; none for a missing session.
    pub async fn rows(&self, session_id: &str, range: Range<u64>) -> Result<Vec<TranscriptRow>> {
        if range.start >= range.end {
            return Ok(Vec::new());
        }
        let id = session_id.to_string();
        self.read("rows", move |txn| logic::rows(txn, &id, range.clone()))
            .await
    }

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
    pub async fn commit_turn(&self, commit: TurnCommit) -> Result<CommitOutcome> {
        let (id, fence) = (commit.session_id.clone(), commit.fence.clone());
        let request = Request::of("commit_turn", std::slice::from_ref(&id)).fenced(fence.as_ref());
        self.write(request, move |txn, now| logic::commit(txn, now, &commit))
            .await
    }

    /// Applies an RFC 7396 JSON merge-patch to the session's `model_config` atomically (created
    /// if absent), and returns the new config.
    ///
    /// # Contract
    /// - Keys the patch does not name are never lost, also under concurrent patches.
    /// - A patch naming [`CODEX_THREAD_ID_KEY`](crate::CODEX_THREAD_ID_KEY) is
    ///   [`StoreError::InvalidInput`], a stale `fence` [`StoreError::LeaseLost`]; either way
    ///   nothing is written.
    pub async fn patch_config(
        &self,
        session_id: &str,
        patch: Map<String, Value>,
        fence: Option<&Fence>,
    ) -> Result<Map<String, Value>> {
        let ids = [session_id.to_string()];
        let (id, owned) = (ids[0].clone(), fence.cloned());
        let request = Request::of("patch_config", &ids).fenced(fence);
        let op =
            move |txn: &mut dyn WriteTxn, now| logic::patch(txn, now, &id, &patch, owned.as_ref());
        self.write(request, op).await
    }

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
    pub async fn retire_thread(
        &self,
        session_id: &str,
        thread_id: &str,
        retirement: Retirement,
        fence: Option<&Fence>,
    ) -> Result<()> {
        let ids = [session_id.to_string()];
        let (id, thread, owned) = (ids[0].clone(), thread_id.to_string(), fence.cloned());
        let request = Request::of("retire_thread", &ids).fenced(fence);
        let op = move |txn: &mut dyn WriteTxn, now| {
            logic::retire(txn, now, &id, &thread, &retirement, owned.as_ref())
        };
        self.write(request, op).await
    }

    /// Records that the fallback notice of the give-up of `thread_id` reached the user.
    ///
    /// # Contract
    /// `true` when the session is given up from `thread_id` (its notice now delivered); else
    /// `false`, nothing changed. A stale `fence` is [`StoreError::LeaseLost`].
    pub async fn mark_notice_delivered(
        &self,
        session_id: &str,
        thread_id: &str,
        fence: Option<&Fence>,
    ) -> Result<bool> {
        let ids = [session_id.to_string()];
        let (id, thread, owned) = (ids[0].clone(), thread_id.to_string(), fence.cloned());
        let request = Request::of("mark_notice_delivered", &ids).fenced(fence);
        let op = move |txn: &mut dyn WriteTxn, now| {
            logic::mark_delivered(txn, now, &id, &thread, owned.as_ref())
        };
        self.write(request, op).await
    }

    /// The session `thread_id` belongs to, if any: every thread the store bound, gave up or
    /// retired for a session belongs to it until the session is deleted.
    pub async fn thread_session(&self, thread_id: &str) -> Result<Option<String>> {
        let thread = thread_id.to_string();
        self.read("thread_session", move |txn| txn.thread_owner(&thread))
            .await
    }

    /// Writes the mirrored file `path` of `thread_id` in `session_id` into `out` chunk by
    /// chunk as it is read (one snapshot, never the whole file in memory), checked against
    /// its length and CRC-32 in [`SessionRecord::mirror`], and returns that entry.
    /// [`BindingStore::mirror_file`] reads it into memory.
    ///
    /// # Contract
    /// `Ok(None)`, nothing written, when the session or the file is not mirrored. On `Err`
    /// (damage found part way through, [`StoreError::Corrupt`], or `out` failing,
    /// [`StoreError::Io`]) `out` may hold part of the file: write into a temp file and keep it
    /// only on `Ok`. `out` is flushed before `Ok`, and runs on the store's own threads.
    pub async fn write_mirror_file(
        &self,
        session_id: &str,
        thread_id: &str,
        path: &str,
        mut out: Box<dyn std::io::Write + Send>,
    ) -> Result<Option<MirroredFile>> {
        let (id, thread, path) = (
            session_id.to_string(),
            thread_id.to_string(),
            path.to_string(),
        );
        let op = move |txn: &mut dyn ReadTxn| {
            logic::write_mirror_file(txn, logic::FileKey::new(&id, &thread, &path), &mut out)
        };
        self.read("write_mirror_file", op).await
    }

    /// Lists at most `limit` (at least 1) sessions in ascending session-id order, starting after
    /// `after`; `next_after` is `Some` when more may follow.
    pub async fn list_sessions(&self, after: Option<&str>, limit: usize) -> Result<SessionPage> {
        let after = after.map(str::to_string);
        let op = move |txn: &mut dyn ReadTxn| logic::list_page(txn, after.as_deref(), limit);
        self.read("list_sessions", op).await
    }

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
    pub async fn delete_session(&self, session_id: &str) -> Result<bool> {
        let id = session_id.to_string();
        let request = Request::of("delete_session", std::slice::from_ref(&id));
        let op = {
            let id = id.clone();
            move |txn: &mut dyn WriteTxn, now| logic::delete(txn, now, &id)
        };
        self.write(request, op).await
    }

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
    pub async fn prune_sessions(&self, prune: Prune) -> Result<PruneReport> {
        prune_in_batches(self, &prune).await
    }

    /// What each of `session_ids` holds in the store (rows and mirror), in order, from one
    /// snapshot; zero for a session not stored.
    pub async fn session_bytes(&self, session_ids: &[String]) -> Result<Vec<StoredBytes>> {
        let ids = session_ids.to_vec();
        let op = move |txn: &mut dyn ReadTxn| logic::prune::session_bytes(txn, &ids);
        self.read("session_bytes", op).await
    }

    /// Reads a whole session (record, all rows, mirror, and every thread that belongs to it)
    /// from one consistent snapshot.
    pub async fn export_session(&self, session_id: &str) -> Result<Option<SessionExport>> {
        let id = session_id.to_string();
        self.read("export_session", move |txn| logic::export(txn, &id))
            .await
    }

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
    pub async fn import_session(&self, export: SessionExport) -> Result<ImportOutcome> {
        let id = export.record.session_id.clone();
        let request = Request::of("import_session", std::slice::from_ref(&id));
        self.write(request, move |txn, now| logic::import(txn, now, &export))
            .await
    }

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
    pub async fn acquire_lease(
        &self,
        session_id: &str,
        owner: &LeaseOwner,
        ttl: Duration,
    ) -> Result<Lease> {
        let ids = [session_id.to_string()];
        let (id, owner, ttl) = (ids[0].clone(), owner.clone(), logic::ttl_ms(ttl));
        let op =
            move |leases: &mut dyn LeaseTxn, now| logic::acquire(leases, now, &id, &owner, ttl);
        self.lease(Request::of("acquire_lease", &ids), op).await
    }

    /// Extends a lease to `ttl` from now.
    ///
    /// # Contract
    /// Only the session's newest grant renews (same owner and `fence`, not released), also
    /// after its expiry (nobody took it meanwhile); else [`StoreError::LeaseLost`] saying why,
    /// nothing changed.
    pub async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let (held, ttl) = (lease.clone(), logic::ttl_ms(ttl));
        let ids = [lease.session_id.clone()];
        let op = move |leases: &mut dyn LeaseTxn, now| logic::renew(leases, now, &held, ttl);
        self.lease(Request::of("renew_lease", &ids), op).await
    }

    /// Frees a lease: `true` if it (same owner and `fence`) was the session's newest grant and
    /// is now released; else `false`, nothing changed (another grant is never freed).
    pub async fn release_lease(&self, lease: &Lease) -> Result<bool> {
        let held = lease.clone();
        let ids = [lease.session_id.clone()];
        let op = move |leases: &mut dyn LeaseTxn, now| logic::release(leases, now, &held);
        self.lease(Request::of("release_lease", &ids), op).await
    }

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
    ///   rows of no session; other engines ([`Engine::verify`] `None`: memory, PostgreSQL)
    ///   are checked by an export of every session.
    pub async fn verify(&self, progress: Progress<'_>) -> Result<VerifyReport> {
        // Reborrowed: the engine's scan and the export fallback report to the same callback.
        let scanned = match self.engine.verify(&mut *progress).await {
            Some(report) => report?,
            None => return crate::verify::by_export(self, progress).await,
        };
        if self.sealer.is_none() {
            return Ok(scanned);
        }
        // The engine's scan reads below the seal: its structure and checksums stand, and
        // every row and chunk is then read through the key (each seal checked, and what it
        // opens to checked as the scan checks an unsealed mirror), naming each session that
        // fails.
        let opened = crate::verify::by_export(self, progress).await?;
        let mut report = scanned;
        report
            .problems
            .retain(|p| p.kind != crate::verify::ProblemKind::Mirror);
        report.problems.extend(opened.problems);
        report.unlisted_problems += opened.unlisted_problems;
        report.complete &= opened.complete;
        (report.mirror_files, report.mirror_bytes) = (opened.mirror_files, opened.mirror_bytes);
        Ok(report)
    }

    /// The session's binding, if the session exists and is bound.
    pub async fn binding(&self, session_id: &str) -> Result<Option<Binding>> {
        let session = self.session(session_id).await?;
        Ok(session.and_then(|s| s.binding().cloned()))
    }

    /// The session's bound thread id, if any.
    pub async fn thread_id(&self, session_id: &str) -> Result<Option<String>> {
        Ok(self.binding(session_id).await?.map(|b| b.thread_id))
    }

    /// The session, or [`StoreError::NotFound`].
    pub async fn require_session(&self, session_id: &str) -> Result<SessionRecord> {
        let session = self.session(session_id).await?;
        session.ok_or_else(|| StoreError::NotFound {
            what: format!("session {session_id}"),
        })
    }

    /// [`BindingStore::write_mirror_file`] into memory.
    pub async fn mirror_file(
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
    pub async fn all_rows(&self, session_id: &str) -> Result<Vec<TranscriptRow>> {
        self.rows(session_id, 0..u64::MAX).await
    }

    /// How many sessions the store holds, counted page by page.
    pub async fn count_sessions(&self) -> Result<u64> {
        let mut count = 0u64;
        self.for_each_page(|page| count += page.sessions.len() as u64)
            .await?;
        Ok(count)
    }

    /// Every session, in memory: to walk a large store, page through
    /// [`BindingStore::list_sessions`] instead.
    pub async fn all_sessions(&self) -> Result<Vec<SessionRecord>> {
        let mut out = Vec::new();
        self.for_each_page(|page| out.extend(page.sessions)).await?;
        Ok(out)
    }

    /// Sets (or, with `None`, removes) one `model_config` key through an unfenced merge-patch.
    pub async fn set_config_key(
        &self,
        session_id: &str,
        key: &str,
        value: Option<Value>,
    ) -> Result<Map<String, Value>> {
        let mut patch = Map::new();
        patch.insert(key.to_string(), value.unwrap_or(Value::Null));
        self.patch_config(session_id, patch, None).await
    }

    /// Hands every page of [`BindingStore::list_sessions`] to `each`, in order.
    async fn for_each_page(&self, mut each: impl FnMut(SessionPage) + Send) -> Result<()> {
        let mut after: Option<String> = None;
        loop {
            let mut page = self.list_sessions(after.as_deref(), 256).await?;
            after = page.next_after.take();
            each(page);
            if after.is_none() {
                return Ok(());
            }
        }
    }

    /// The store's clock on this host.
    fn clock(&self) -> crate::Clock {
        self.engine.clock()
    }

    /// Runs a read on the engine; `method` names the store call it serves.
    async fn read<T: Send + 'static>(
        &self,
        method: &'static str,
        mut op: impl FnMut(&mut dyn ReadTxn) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let sealer = self.sealer.clone();
        let op: ReadFn = Box::new(move |txn| {
            let answer = match &sealer {
                Some(sealer) => op(&mut Sealed { txn, sealer }),
                None => op(txn),
            };
            Ok(Box::new(answer?) as Answer)
        });
        downcast(self.engine.read(Request::new(method), op).await?)
    }

    /// Runs a write on the engine.
    async fn write<T: Send + 'static>(
        &self,
        request: Request<'_>,
        mut op: impl FnMut(&mut dyn WriteTxn, i64) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let sealer = self.sealer.clone();
        let op: WriteFn = Box::new(move |txn, now| {
            let answer = match &sealer {
                Some(sealer) => op(&mut Sealed { txn, sealer }, now),
                None => op(txn, now),
            };
            Ok(Box::new(answer?) as Answer)
        });
        downcast(self.engine.write(request, op).await?)
    }

    async fn lease<T: Send + 'static>(
        &self,
        request: Request<'_>,
        mut op: impl FnMut(&mut dyn LeaseTxn, i64) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let op = Box::new(move |txn: &mut dyn LeaseTxn, now| Ok(Box::new(op(txn, now)?) as Answer));
        downcast(self.engine.lease(request, op).await?)
    }

    /// [`Engine::reclaim`].
    async fn reclaim(&self) -> Result<u64> {
        self.engine.reclaim().await
    }
}

/// [`BindingStore::prune_sessions`] : a read lists a page of candidates, a write
/// per batch removes those still idle (`logic::prune`); then the backend reclaims what the
/// batches removed ([`Engine::reclaim`](crate::engine::Engine::reclaim)), also after a batch failed.
async fn prune_in_batches(store: &BindingStore, prune: &Prune) -> Result<PruneReport> {
    let mut report = PruneReport::default();
    let pruned = prune_batches(store, prune, &mut report).await;
    let reclaimed = match report.sessions.is_empty() || prune.dry_run {
        true => Ok(()),
        false => reclaim_all(store).await,
    };
    pruned.and(reclaimed).map(|()| report)
}

/// Reclaims step by step until nothing is left to give back, or a step gave nothing back
/// (readers holding the checkpoint, a failed step: the backend's own upkeep goes on later).
/// Each step is a write of its own, bounded ([`Engine::reclaim`](crate::engine::Engine::reclaim)): other writers wait for
/// one step at most, never for the whole.
async fn reclaim_all(store: &BindingStore) -> Result<()> {
    let mut before = u64::MAX;
    loop {
        let left = store.reclaim().await?;
        if left == 0 || left >= before {
            return Ok(());
        }
        before = left;
    }
}

async fn prune_batches(
    store: &BindingStore,
    prune: &Prune,
    report: &mut PruneReport,
) -> Result<()> {
    type Page = fn(&mut dyn ReadTxn, Option<&str>, i64, usize) -> PageResult;
    type PageResult = Result<(Vec<String>, Option<String>)>;
    type Apply = fn(&mut dyn WriteTxn, i64, &[String], i64, bool) -> Result<logic::prune::Batch>;
    let idle_ms = prune.idle.as_millis().min(i64::MAX as u128) as i64;
    let (batch, dry_run) = (prune.batch.max(1), prune.dry_run);
    // Sessions first; then the lease records left without a session (a pruned session's
    // went with it).
    let kinds: [(Page, Apply); 2] = [
        (logic::prune::idle_page, logic::prune::prune_batch),
        (logic::prune::stale_lease_page, logic::prune::prune_leases),
    ];
    for (page, apply) in kinds {
        let mut after: Option<String> = None;
        loop {
            // Candidates by this host's clock; each write checks again by the store's.
            let cutoff = store.clock().now_ms().saturating_sub(idle_ms);
            let from = after.take();
            let read = move |txn: &mut dyn ReadTxn| page(txn, from.as_deref(), cutoff, batch);
            let (ids, next) = store.read("prune_sessions", read).await?;
            if !ids.is_empty() {
                let locked = ids.clone();
                let request = Request::of("prune_sessions", &locked);
                let write =
                    move |txn: &mut dyn WriteTxn, now| apply(txn, now, &ids, idle_ms, dry_run);
                let done = store.write(request, write).await?;
                report.sessions.extend(done.removed);
                report.kept_leased.extend(done.leased);
                report.leases.extend(done.leases);
            }
            match next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
    }
    Ok(())
}

/// The answer an operation returned: an engine that hands back another is a bug of that
/// engine, reported, never a panic of the host.
fn downcast<T: 'static>(answer: Answer) -> Result<T> {
    match answer.downcast::<T>() {
        Ok(answer) => Ok(*answer),
        Err(_) => Err(StoreError::Internal(
            "the engine answered an operation with another operation's answer".to_string(),
        )),
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
