//! The SQLite damage that used to open as an empty store (`store_files` finding
//! `sqlite-damage-reads-empty`) is now refused as `Corrupt` by the structure check on open.
//! Replayed under the strict property ("a store that opens is never empty, and is its last
//! committed state or an error"), in its own test binary because the harness reads the strict
//! switch once per process.

#[path = "../../../fuzz/src/input.rs"]
mod input;
#[path = "../../../fuzz/src/store_files.rs"]
mod store_files;

#[test]
fn sqlite_damage_that_read_as_empty_is_refused() {
    std::env::set_var("RETHREAD_FUZZ_STORE_STRICT", "1");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/regressions/store_files/sqlite-damage-reads-empty");
    store_files::run(&std::fs::read(path).expect("the saved input"));
}
