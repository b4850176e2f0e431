//! Stub: filled in by its own issue (see docs/architecture.md).
