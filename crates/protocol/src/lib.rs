//! The JSON-RPC dialect spoken by `codex app-server`, typed for what rethread uses.
//!
//! - [`jsonrpc`]: the envelope ([`Message`]), [`RequestId`], [`RpcError`]. `"jsonrpc": "2.0"`
//!   is accepted on input but never required, and never sent (codex does not send it).
//! - [`messages`]: typed params and results of the v2 methods rethread calls, the
//!   notifications it reads and the server requests it must answer. Anything else decodes as a
//!   raw method plus value, never as an error; unknown fields are ignored.
//! - [`HistoryMode`]: codex's compatibility floor. Absent means legacy; an unknown value is
//!   kept verbatim and is never read as legacy.
//! - [`ErrorCode`] and [`classify_resume_error`]: what a failed `thread/resume` means, judged
//!   from code **and** message (codex uses -32600 for both "gone" and "busy").
//! - [`exec`]: `codex exec`'s command line read as codex reads it, and
//!   [`exec_resume_error`], its report of a failed resume (for a stand-in of `codex exec`).
//! - [`codec`]: newline-delimited framing with a bounded line length; a bad line is a typed
//!   error and the stream continues past it.
//!
//! ```
//! use rethread_protocol::{Message, messages::{ThreadResumeParams, Request, ThreadResume}};
//!
//! let params = ThreadResumeParams::new("thr_1").exclude_turns(true);
//! let msg = Message::request(7, ThreadResume::METHOD, &params).unwrap();
//! assert_eq!(
//!     msg.to_line(),
//!     r#"{"id":7,"method":"thread/resume","params":{"threadId":"thr_1","excludeTurns":true}}"#
//! );
//! ```
mod classify;
pub mod codec;
mod elide;
mod error_code;
pub mod exec;
mod history;
pub mod jsonrpc;
pub mod messages;
mod thread_id;

pub use classify::{classify_resume_error, classify_turn_error, exec_resume_error, ResumeFailure};
pub use codec::{FrameError, NdjsonCodec};
pub use error_code::ErrorCode;
pub use history::HistoryMode;
pub use jsonrpc::{Envelope, EnvelopeError, Message, MessageKind, RequestId, RpcError};
pub use thread_id::ThreadId;
