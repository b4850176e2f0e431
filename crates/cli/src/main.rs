//! The `rethread` binary (stub until the CLI issue).
fn main() {}
