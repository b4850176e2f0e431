#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rethread_fuzz::proxy_routing::run(data);
});
