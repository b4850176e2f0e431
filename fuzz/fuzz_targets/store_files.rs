#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rethread_fuzz::store_files::run(data);
});
