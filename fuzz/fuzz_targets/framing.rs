#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rethread_fuzz::framing::run(data);
});
