//! rmemfs: a POSIX file system over the spare DRAM of a rack's memory servers.
//!
//! Layers, bottom up: [`fabric`] (one-sided RDMA READ/WRITE behind a trait: TCP software RDMA,
//! in-process, and verbs), [`proto`] (the control protocol), [`server`] (the memory server),
//! [`client`] (the pool of servers as a client sees it), [`data`] (file bytes as remote
//! chunks), [`meta`] (the namespace: inodes, directories, extent maps, changed through one
//! batch per operation), [`fs`] (POSIX semantics, no FUSE), [`volume`] (namespaces that
//! outlive the daemon: a holder's journal, followers, shared volumes) over [`engine`] (the
//! metadata engines of shared volumes), [`fuse`] (the fuser adapter), [`upkeep`]
//! (heartbeats, reconnects, the rebuild, server changes), [`report`] (the mount's typed
//! figures, its text and metrics) and [`mount`] (putting it together), with [`regcache`]
//! (the registration caches); [`library`] opens a volume inside a program instead of a
//! mount.
//!
//! The shared ground every layer may use: [`config`] (every tunable once), [`sync`] (the one
//! source of locks, for the model checker), [`error`] (the errno-carrying error), [`auth`]
//! (the shared secret and its handshake), [`size`] (sizes on the command line),
//! [`requests`] (per-operation counts and latency buckets, kept by the adapter and the
//! pool) and [`notify`] (systemd readiness); [`fuzz_checks`] holds what the fuzz targets
//! check (feature `testing`).
//!
//! The benchmarks and the cache simulator are in the `rmemfs-lab` crate (lab/), so neither
//! this API nor the `rmemfs` binary carries them.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod auth;
pub mod client;
pub mod config;
pub mod data;
pub mod engine;
pub mod error;
pub mod fabric;
pub mod fs;
pub mod fuse;
#[cfg(feature = "testing")]
pub mod fuzz_checks;
pub mod library;
pub mod meta;
pub mod mount;
pub mod notify;
pub mod proto;
pub mod regcache;
pub mod report;
pub mod requests;
pub mod server;
pub mod size;
pub mod sync;
pub mod upkeep;
pub mod volume;
