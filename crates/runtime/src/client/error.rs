//! [`ClientError`]: what the client's requests and subscriptions fail with.

use std::time::Duration;

use rethread_protocol::RpcError;

#[cfg(doc)]
use super::ClientOptions;

/// Errors of the client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The codex binary could not be started.
    #[error("could not start `{program}`: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The server answered with an error.
    #[error("{method} failed: {error}")]
    Rpc {
        /// The method called.
        method: String,
        /// The server's error.
        error: RpcError,
    },
    /// No response in time.
    #[error("{method} got no response within {after:?}")]
    Timeout {
        /// The method called.
        method: String,
        /// The timeout.
        after: Duration,
    },
    /// The connection is gone: the process died, the stream ended or turned to garbage.
    #[error("codex app-server connection closed: {reason}{}", stderr_suffix(.stderr))]
    Closed {
        /// Why.
        reason: String,
        /// The tail of the server's stderr, if any.
        stderr: String,
    },
    /// Too many requests in flight.
    #[error("too many pending requests (limit {limit})")]
    TooManyPending {
        /// The limit.
        limit: usize,
    },
    /// A subscription fell a whole buffer ([`ClientOptions::notification_buffer`]) behind and
    /// was cut off, so that it neither stalls the connection nor grows memory. Its events up to
    /// the cut were delivered; later ones were not. Subscribe again to go on.
    #[error("the subscription to thread {thread_id} fell {buffer} events behind and was cut off")]
    Lagged {
        /// The thread.
        thread_id: String,
        /// The buffer it filled.
        buffer: usize,
    },
    /// A response did not decode as the method's result type.
    #[error("{method} returned an unexpected result: {source}")]
    Decode {
        /// The method called.
        method: String,
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.trim().is_empty() {
        String::new()
    } else {
        format!("; server stderr: {}", stderr.trim())
    }
}

impl ClientError {
    /// The server's error, when the server answered with one.
    pub fn rpc_error(&self) -> Option<&RpcError> {
        match self {
            ClientError::Rpc { error, .. } => Some(error),
            _ => None,
        }
    }
}
