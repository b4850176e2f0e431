//! Property harnesses behind the cargo-fuzz targets of rethread (`fuzz/`, see
//! `docs/fuzzing.md`): each module has one `run(&[u8])` that decodes its input with
//! [`input::Input`] and panics when a property is violated. The fuzz targets call them, and
//! each crate's `tests/fuzz_regressions.rs` replays every saved input under
//! `fuzz/regressions/<target>/` through them ([`replay::replay`]).
#![allow(missing_docs, unreachable_pub, dead_code)]

pub mod fake_appserver;
pub mod framing;
pub mod input;
pub mod merge_patch;
pub mod proxy_routing;
pub mod replay;
pub mod runtime_hostile;
pub mod store_files;
