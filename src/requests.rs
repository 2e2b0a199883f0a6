//! Per-operation request counts and latencies of the FUSE adapter, for `rmemfs stats`: where
//! the kernel's requests go (how many lookups, getattrs, getxattrs per file a workload costs)
//! and how long the daemon takes for each kind, so a benchmark's gap has a visible cause.
//!
//! Lock-free: one set of atomics per operation, latencies in power-of-two microsecond
//! buckets (a percentile is reported as its bucket's upper bound).

use crate::sync::atomic::{AtomicU64, Ordering};

/// Every operation the adapter answers, in `stats` order.
pub const OPS: [&str; 38] = [
    "lookup",
    "forget",
    "getattr",
    "setattr",
    "readlink",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "symlink",
    "rename",
    "link",
    "open",
    "read",
    "write",
    "flush",
    "release",
    "fsync",
    "opendir",
    "readdir",
    "readdirplus",
    "releasedir",
    "fsyncdir",
    "statfs",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "access",
    "create",
    "lseek",
    "copy_file_range",
    "poll",
    "ioctl",
    "fallocate",
    "tmpfile",
    "statx",
    "other",
];

/// Buckets: `[0, 1) µs`, `[1, 2)`, `[2, 4)`, ... the last one open-ended (over 1 s).
const BUCKETS: usize = 22;

struct OpCounters {
    count: AtomicU64,
    nanos: AtomicU64,
    /// The longest one: a stall (a volume's checkpoint, a slow server) shows here first.
    max_nanos: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

impl OpCounters {
    fn new() -> OpCounters {
        OpCounters {
            count: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
            max_nanos: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// One operation's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpSummary {
    pub op: &'static str,
    pub count: u64,
    pub mean_us: u64,
    /// Upper bounds of the buckets holding the median and the 99th percentile.
    pub p50_us: u64,
    pub p99_us: u64,
    /// The longest one, in µs (exact, not a bucket's bound).
    pub max_us: u64,
    /// Time spent on all of them, in nanoseconds.
    pub total_nanos: u64,
    /// Requests per bucket, with the bucket's upper bound in µs (the last: unbounded,
    /// `u64::MAX`).
    pub buckets: Vec<(u64, u64)>,
}

/// Counts and latencies per operation name: the FUSE adapter's ([`OPS`], the default) or
/// another fixed list ([`RequestStats::with_ops`], e.g. the pool's fabric batches).
pub struct RequestStats {
    names: &'static [&'static str],
    ops: Vec<OpCounters>,
}

impl Default for RequestStats {
    fn default() -> Self {
        RequestStats::with_ops(&OPS)
    }
}

fn bucket_of(nanos: u64) -> usize {
    let us = nanos / 1000;
    ((u64::BITS - us.leading_zeros()) as usize).min(BUCKETS - 1)
}

/// The upper bound, in µs, of bucket `b`.
fn bucket_bound(b: usize) -> u64 {
    1u64 << b
}

impl RequestStats {
    /// Stats over `names`; the last one also takes any name not in the list.
    pub fn with_ops(names: &'static [&'static str]) -> RequestStats {
        assert!(!names.is_empty());
        RequestStats {
            names,
            ops: names.iter().map(|_| OpCounters::new()).collect(),
        }
    }

    /// Counts one `op` request that took `nanos`.
    pub fn record(&self, op: &str, nanos: u64) {
        let i = self
            .names
            .iter()
            .position(|o| *o == op)
            .unwrap_or(self.names.len() - 1);
        let c = &self.ops[i];
        c.count.fetch_add(1, Ordering::Relaxed);
        c.nanos.fetch_add(nanos, Ordering::Relaxed);
        c.max_nanos.fetch_max(nanos, Ordering::Relaxed);
        c.buckets[bucket_of(nanos)].fetch_add(1, Ordering::Relaxed);
    }

    /// The operations seen so far, in the order of their names.
    pub fn summary(&self) -> Vec<OpSummary> {
        self.names
            .iter()
            .zip(&self.ops)
            .filter_map(|(op, c)| {
                let count = c.count.load(Ordering::Relaxed);
                if count == 0 {
                    return None;
                }
                let buckets: Vec<u64> = c
                    .buckets
                    .iter()
                    .map(|b| b.load(Ordering::Relaxed))
                    .collect();
                let pct = |p: u64| {
                    let want = (count * p).div_ceil(100).max(1);
                    let mut seen = 0;
                    for (b, n) in buckets.iter().enumerate() {
                        seen += n;
                        if seen >= want {
                            return bucket_bound(b);
                        }
                    }
                    bucket_bound(BUCKETS - 1)
                };
                let total_nanos = c.nanos.load(Ordering::Relaxed);
                Some(OpSummary {
                    op,
                    count,
                    mean_us: total_nanos / count / 1000,
                    p50_us: pct(50),
                    p99_us: pct(99),
                    max_us: c.max_nanos.load(Ordering::Relaxed) / 1000,
                    total_nanos,
                    buckets: buckets
                        .iter()
                        .enumerate()
                        .map(|(b, &n)| {
                            let bound = if b == BUCKETS - 1 {
                                u64::MAX
                            } else {
                                bucket_bound(b)
                            };
                            (bound, n)
                        })
                        .collect(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_percentiles() {
        let s = RequestStats::default();
        for _ in 0..98 {
            s.record("write", 3_000); // 3 µs: bucket [2, 4)
        }
        s.record("write", 900_000);
        s.record("write", 900_000); // 900 µs: bucket [512, 1024)
        s.record("no such op", 1);
        let sum = s.summary();
        let w = sum.iter().find(|o| o.op == "write").unwrap();
        assert_eq!((w.count, w.p50_us, w.p99_us, w.max_us), (100, 4, 1024, 900));
        assert_eq!(w.mean_us, (98 * 3_000 + 2 * 900_000) / 100 / 1000);
        assert_eq!(sum.iter().find(|o| o.op == "other").unwrap().count, 1);
        assert!(
            sum.iter().all(|o| o.op != "read"),
            "unseen ops are left out"
        );
    }

    #[test]
    fn other_name_lists_count_unknown_names_under_their_last() {
        static KINDS: [&str; 2] = ["read", "mixed"];
        let s = RequestStats::with_ops(&KINDS);
        s.record("read", 5_000);
        s.record("elsewhere", 5_000);
        let sum = s.summary();
        assert_eq!(
            sum.iter().map(|o| (o.op, o.count)).collect::<Vec<_>>(),
            vec![("read", 1), ("mixed", 1)]
        );
        let read = &sum[0];
        assert_eq!(read.total_nanos, 5_000);
        assert_eq!(read.buckets.iter().map(|b| b.1).sum::<u64>(), 1);
        assert_eq!(
            read.buckets.last().unwrap().0,
            u64::MAX,
            "the last bucket is open"
        );
    }
}
