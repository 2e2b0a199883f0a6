//! The rmemfs lab: measurements and simulations that are not part of the file system.
//!
//! They live in their own crate so that the `rmemfs` binary ships only the product commands
//! (serve, mount, stats) and the library's public API is not shaped by experiments. Two
//! binaries use these modules: `rmemfs-bench` ([`bench`]: the TCP fabric against plain TCP, and
//! serial writes against FRRWP), `rmemfs-mrrc-sim` ([`mrrc_sim`]: trace-driven simulation of
//! the registration caches) and `rmemfs-shared-sim` ([`shared_sim`]: many clients of one
//! shared volume, on paper).
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod bars;
pub mod bench;
mod chart;
pub mod fio_chart;
pub mod fuse_floor;
pub mod memfs;
pub mod mrrc_sim;
pub mod shared_sim;
