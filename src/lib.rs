//! rmemfs: a POSIX file system over the spare DRAM of a rack's memory servers.
//!
//! Layers, bottom up: [`fabric`] (one-sided RDMA READ/WRITE behind a trait: TCP software RDMA,
//! in-process, and verbs), [`proto`] (the control protocol), [`server`] (the memory server),
//! [`client`] (the pool of servers as a client sees it), [`data`] (file bytes as remote
//! chunks), [`meta`] (the namespace: inodes, directories, extent maps, changed through one
//! batch per operation), [`fs`] (POSIX semantics, no FUSE), [`fuse`] (the fuser adapter),
//! [`report`] (the mount's typed figures) and [`mount`] (putting it together), with
//! [`regcache`] (the registration caches) and [`rebuild`] (copies restored after a server
//! dies). The benchmarks and the cache simulator are in the `rmemfs-lab` crate (lab/), so
//! neither this API nor the `rmemfs` binary carries them.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod acl;
pub mod auth;
pub mod client;
pub mod config;
pub mod data;
pub mod dirty_limit;
pub mod engine;
pub mod error;
pub mod fabric;
pub mod figures;
pub mod fs;
pub mod fuse;
#[cfg(feature = "testing")]
pub mod fuzz_checks;
pub mod membership;
pub mod meta;
pub mod metrics;
pub mod mount;
pub mod notify;
pub mod proto;
pub mod rebuild;
pub mod regcache;
pub mod report;
pub mod requests;
pub mod server;
pub mod size;
pub mod sync;
pub mod volume;
