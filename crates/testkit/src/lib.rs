//! Test support for rethread, kept out of the shipped crates: the `rethread` binary links
//! `rethread-fake-appserver` for its `demo`, and none of this.
//!
//! - [`releases`]: the supported codex releases ([`CURRENT`], [`PREVIOUS`], [`FLOOR`],
//!   [`SUPPORTED`]), read from `codex-releases.txt` at the workspace root, and the releases a
//!   run tests against ([`recent_releases`], [`supported_releases`]).
//! - [`real`]: finds a codex binary per release, makes an offline `CODEX_HOME` and drives
//!   `codex app-server` (or `fake-codex`) over newline-delimited JSON ([`real::WirePeer`]).
//! - [`responses`]: a Responses-API stand-in (HTTP/1.1 + server-sent events on 127.0.0.1)
//!   the real codex talks to as its model; records what the model saw.
//! - [`strategies`]: proptest strategies for fault scripts and operation sequences.
//! - [`postgres`]: the test PostgreSQL server's URL, a fresh schema per test ([`postgres::fresh_url`]).
//! - [`fuzz`]: the property harnesses of the fuzz targets, replayed by each crate's tests.
//! - [`compat`]: the compatibility probe behind `cargo xtask codex-check` and the README's
//!   compatibility table (binary `codex-probe`).
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]

pub mod compat;
pub mod faulty_store;
pub mod fuzz;
pub mod postgres;
pub mod real;
pub mod releases;
pub mod responses;
pub mod rollout;
pub mod strategies;

pub use releases::{recent_releases, supported_releases, CURRENT, FLOOR, PREVIOUS, SUPPORTED};
