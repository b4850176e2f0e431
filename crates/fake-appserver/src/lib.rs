//! A scripted stand-in for `codex app-server`, with codex's thread-store semantics, plus the
//! pieces needed to drive the **real** codex offline.
//!
//! - [`responses`]: a Responses-API stand-in (HTTP/1.1 + server-sent events on 127.0.0.1) the
//!   real codex talks to as its model; records what the model saw.
//! - [`real`]: a harness that finds the pinned codex binaries, makes an offline `CODEX_HOME`
//!   and drives `codex app-server` over newline-delimited JSON.
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]

pub mod real;
pub mod responses;
