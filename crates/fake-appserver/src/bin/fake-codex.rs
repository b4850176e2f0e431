//! `fake-codex`: a stand-in for `codex app-server` (work in progress).

fn main() {}
