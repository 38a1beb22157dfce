//! libFuzzer entry point for the decision-path harness (`sluice_fuzz::request`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::request(data));
