//! A host that keeps its own transcript: [`TranscriptSink`], and where a session's transcript
//! lives ([`Transcript`]).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use crate::error::BoxError;

/// Whether a host-kept transcript is durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkDurability {
    /// The rows are durable; the binding may be published.
    Durable,
    /// The rows were accepted but are not (yet) durable; the binding is not published.
    NotDurable,
}

/// A host that keeps its own transcript. The runtime publishes the binding only after
/// [`TranscriptSink::persist_turn`] reports [`SinkDurability::Durable`].
#[async_trait]
pub trait TranscriptSink: Send + Sync + fmt::Debug {
    /// Persists the projected rows of one turn.
    ///
    /// An error is reported as [`RuntimeError::Sink`](crate::RuntimeError::Sink) with it as
    /// the source; the binding is then not published.
    async fn persist_turn(
        &self,
        session_id: &str,
        rows: &[Value],
    ) -> Result<SinkDurability, BoxError>;

    /// The newest `limit` rows, oldest first, for seeding a replacement thread. An error only
    /// costs the seed (a warning on the rail).
    async fn recent_rows(&self, session_id: &str, limit: u64) -> Result<Vec<Value>, BoxError>;
}

/// Where a session's transcript lives.
#[derive(Debug, Clone, Default)]
pub enum Transcript {
    /// In the store, committed with the binding in one transaction (the default).
    #[default]
    Store,
    /// In the host's sink; the store only publishes the binding once the sink reported the
    /// turn durable.
    Sink(Arc<dyn TranscriptSink>),
}
