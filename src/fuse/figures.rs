//! What the adapter counts (requests by operation, those in flight, those the kernel sent
//! again, panics contained) and the report it serves through the root's stats attributes:
//! `getfattr -n user.rmemfs.stats MOUNTPOINT` (what `rmemfs stats MOUNTPOINT` reads). The
//! adapter owns these figures; the mount hands them to the report (`crate::report::Parts`),
//! and hands the adapter the report to serve.

use crate::requests::RequestStats;
use crate::sync::atomic::AtomicU64;

/// The mount's report, rendered as text (`false`) or JSON (`true`).
pub type StatsSource = Box<dyn Fn(bool) -> Vec<u8> + Send + Sync>;

/// The root's attribute that reads as the mount's report (text). Not listed by `listxattr`.
pub const STATS_XATTR: &[u8] = b"user.rmemfs.stats";
/// The same report as JSON (`rmemfs stats --json`).
pub const STATS_JSON_XATTR: &[u8] = b"user.rmemfs.stats.json";

/// The adapter's figures for one mount.
#[derive(Default)]
pub struct AdapterFigures {
    /// Requests answered, per operation.
    pub requests: RequestStats,
    /// Requests whose handler panicked (answered EIO).
    pub contained_panics: AtomicU64,
    /// How the kernel's requests reach the adapter, as INIT settled it.
    pub transport: std::sync::OnceLock<&'static str>,
    /// Requests being handled now.
    pub in_flight: AtomicU64,
    /// Requests the kernel sent again (FUSE_NOTIFY_RESEND) because an earlier daemon of a
    /// kept connection read them but never answered.
    pub resent: AtomicU64,
}

/// Whether a getxattr of `name` on `ino` reads the report.
pub(super) fn reads_report(ino: u64, name: &[u8]) -> bool {
    ino == crate::meta::ROOT_INO && (name == STATS_XATTR || name == STATS_JSON_XATTR)
}
