//! The control protocol's decoder and frame reader on arbitrary bytes (rmemfs::fuzz_checks).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rmemfs::fuzz_checks::control_message(data));
