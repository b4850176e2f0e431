//! Property harnesses behind the cargo-fuzz targets of rethread (see `docs/fuzzing.md`).
//!
//! Each module has one `run(&[u8])` that decodes its input with [`input::Input`] and panics
//! when a property is violated. The same files are compiled into the main workspace's
//! `fuzz_regressions.rs` tests (with `#[path]`), which replay every saved crash input under
//! `fuzz/regressions/<target>/`.
#![forbid(unsafe_code)]

pub mod input;

pub mod fake_appserver;
pub mod framing;
pub mod merge_patch;
pub mod proxy_routing;
pub mod runtime_hostile;
pub mod store_files;
