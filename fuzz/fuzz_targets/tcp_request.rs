//! The TCP fabric's request and response headers on arbitrary bytes (rmemfs::fuzz_checks).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rmemfs::fuzz_checks::tcp_request(data));
