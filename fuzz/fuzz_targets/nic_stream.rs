//! A server's TCP-fabric NIC fed an arbitrary data-connection byte stream
//! (rmemfs::fuzz_checks): no crash, no hang, still serving afterwards.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rmemfs::fuzz_checks::nic_stream(data));
