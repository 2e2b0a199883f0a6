//! A memory server's control port fed an arbitrary byte stream before, during and after the
//! mutual authentication (rmemfs::fuzz_checks): no crash, no hang, still serving afterwards.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rmemfs::fuzz_checks::control_session(data));
