//! libFuzzer entry point for the config loader harness (`sluice_fuzz::config_loader`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::config_loader(data));
