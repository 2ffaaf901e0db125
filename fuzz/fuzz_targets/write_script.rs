//! Open a damaged image read-write and run a fixed script of changes on it: see
//! `uext4_fuzz::run_write` for the input format and what counts as a finding.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uext4_fuzz::run_write(data));
