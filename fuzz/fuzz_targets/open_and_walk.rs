//! Open a damaged image and walk all of it: see `uext4_fuzz::run` for the input format.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uext4_fuzz::run(data));
