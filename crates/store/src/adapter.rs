//! [`BindingStore`] implemented once, for every backend, on top of the typed operations of
//! `logic`. A backend only says how it runs a read and a write ([`Backend`]); what each
//! method means is decided here and in `logic`, so backends cannot drift apart.

use std::future::Future;
use std::ops::Range;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value};

use crate::logic::{self, ttl_ms, Acquire, InStore, LeaseOp, ReadOp, Release, Renew, WriteOp};
use crate::Result;
use crate::{
    BindingStore, CommitOutcome, Fence, ImportOutcome, Lease, LeaseOwner, MirroredFile, Retirement,
    SessionExport, SessionPage, SessionRecord, TranscriptRow, TurnCommit, VerifyProgress,
    VerifyReport,
};

/// How a backend runs operations.
pub(crate) trait Backend: Send + Sync + std::fmt::Debug + 'static {
    /// Runs `op` on one consistent snapshot, never on an async runtime thread's time if it
    /// blocks.
    fn read<O: ReadOp>(&self, op: O) -> impl Future<Output = Result<O::Output>> + Send;

    /// Runs `op` in one write transaction and returns once it is committed (durably, unless
    /// the store is relaxed) or refused.
    fn write<O: WriteOp>(&self, op: O) -> impl Future<Output = Result<O::Output>> + Send;

    /// Runs a lease request; by default as a write, in the store.
    fn lease<L: LeaseOp>(&self, op: L) -> impl Future<Output = Result<L::Output>> + Send {
        self.write(InStore(op))
    }

    /// [`BindingStore::verify`]; by default through `store`'s public methods.
    fn verify<'a>(
        &'a self,
        store: &'a (dyn BindingStore + 'a),
        progress: &'a mut (dyn for<'p> FnMut(&'p VerifyProgress) + Send),
    ) -> impl Future<Output = Result<VerifyReport>> + Send + 'a {
        crate::verify::by_export(store, progress)
    }
}

/// A [`Backend`] seen as a [`BindingStore`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Adapter<B>(pub(crate) B);

#[async_trait]
impl<B: Backend> BindingStore for Adapter<B> {
    async fn session(&self, session_id: &str) -> Result<Option<SessionRecord>> {
        self.0.read(logic::GetSession(session_id.to_string())).await
    }

    async fn rows(&self, session_id: &str, range: Range<u64>) -> Result<Vec<TranscriptRow>> {
        if range.start >= range.end {
            return Ok(Vec::new());
        }
        let op = logic::GetRows {
            session_id: session_id.to_string(),
            range,
        };
        self.0.read(op).await
    }

    async fn commit_turn(&self, commit: TurnCommit) -> Result<CommitOutcome> {
        self.0.write(logic::Commit(commit)).await
    }

    async fn patch_config(
        &self,
        session_id: &str,
        patch: Map<String, Value>,
        fence: Option<&Fence>,
    ) -> Result<Map<String, Value>> {
        let op = logic::Patch {
            session_id: session_id.to_string(),
            patch,
            fence: fence.cloned(),
        };
        self.0.write(op).await
    }

    async fn retire_thread(
        &self,
        session_id: &str,
        thread_id: &str,
        retirement: Retirement,
        fence: Option<&Fence>,
    ) -> Result<()> {
        let op = logic::Retire {
            session_id: session_id.to_string(),
            thread_id: thread_id.to_string(),
            retirement,
            fence: fence.cloned(),
        };
        self.0.write(op).await
    }

    async fn mark_notice_delivered(
        &self,
        session_id: &str,
        thread_id: &str,
        fence: Option<&Fence>,
    ) -> Result<bool> {
        let op = logic::MarkDelivered {
            session_id: session_id.to_string(),
            thread_id: thread_id.to_string(),
            fence: fence.cloned(),
        };
        self.0.write(op).await
    }

    async fn thread_session(&self, thread_id: &str) -> Result<Option<String>> {
        self.0
            .read(logic::ThreadSession(thread_id.to_string()))
            .await
    }

    async fn write_mirror_file(
        &self,
        session_id: &str,
        thread_id: &str,
        path: &str,
        out: Box<dyn std::io::Write + Send>,
    ) -> Result<Option<MirroredFile>> {
        let file = logic::MirrorFileRef {
            session_id: session_id.to_string(),
            thread_id: thread_id.to_string(),
            path: path.to_string(),
        };
        let op = logic::WriteMirrorFile {
            file,
            out: std::sync::Mutex::new(out),
        };
        self.0.read(op).await
    }

    async fn list_sessions(&self, after: Option<&str>, limit: usize) -> Result<SessionPage> {
        let op = logic::ListPage {
            after: after.map(str::to_string),
            limit,
        };
        self.0.read(op).await
    }

    async fn delete_session(&self, session_id: &str) -> Result<bool> {
        self.0.write(logic::Delete(session_id.to_string())).await
    }

    async fn export_session(&self, session_id: &str) -> Result<Option<SessionExport>> {
        self.0
            .read(logic::ExportSession(session_id.to_string()))
            .await
    }

    async fn import_session(&self, export: SessionExport) -> Result<ImportOutcome> {
        self.0.write(logic::Import(export)).await
    }

    async fn acquire_lease(
        &self,
        session_id: &str,
        owner: &LeaseOwner,
        ttl: Duration,
    ) -> Result<Lease> {
        self.0
            .lease(Acquire {
                session_id: session_id.to_string(),
                owner: owner.clone(),
                ttl_ms: ttl_ms(ttl),
            })
            .await
    }

    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.0
            .lease(Renew {
                lease: lease.clone(),
                ttl_ms: ttl_ms(ttl),
            })
            .await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<bool> {
        self.0.lease(Release(lease.clone())).await
    }

    async fn verify(
        &self,
        progress: &mut (dyn for<'p> FnMut(&'p VerifyProgress) + Send),
    ) -> Result<VerifyReport> {
        self.0.verify(self, progress).await
    }
}
