//! Every tunable of rmemfs, once, with the reason for its value. Modules take them from here
//! (or from the structs built from them) and never write the number again.

use std::time::Duration;

/// How long an operation on a memory server may make no progress before it fails (EIO for
/// the program). Long enough for a loaded server or a congested link to catch up, short
/// enough that a dead server is noticed before users give up on a hung `cp`. `--op-timeout`.
pub const OP_TIMEOUT: Duration = Duration::from_secs(10);

/// The same in seconds, for command-line defaults.
pub const OP_TIMEOUT_SECS: u64 = OP_TIMEOUT.as_secs();

/// What a memory server allows a one-sided operation on its side (the TCP fabric's NIC) to
/// stall. Half the client's: the server gives up first and closes the connection, so the
/// client sees a clean transport error rather than a timeout racing a late answer.
pub fn server_op_timeout(client_op_timeout: Duration) -> Duration {
    client_op_timeout / 2
}

/// How long a memory server waits for a control step of a client (its `Hello`), and for
/// one-sided operations still running on an extent being freed (bounded by
/// [`server_op_timeout`]) before it drops the registration anyway, and for an evicted
/// member's connections to close. Shorter than the client's op timeout, so the client's
/// `Free` (or `Evict`) is answered before the client gives up.
pub fn server_control_timeout(client_op_timeout: Duration) -> Duration {
    client_op_timeout * 3 / 4
}

/// A file's data is cut into chunks of this size, each on one server (`--chunk-size`): large
/// enough that a 1 MiB FUSE request is one remote operation, small enough that files spread
/// over servers and a nearly full server still takes some.
pub const CHUNK_SIZE: u64 = 1 << 20;

/// Erasure coding (`--redundancy ec:K+M`, `data::coding`): a chunk is encoded once no write
/// has touched its file for this long. Data being written keeps copies (a write to a stripe
/// would have to update its parity in place, the write hole), and most files are written once
/// and then read: HDFS and Ceph encode cold data the same way.
pub const EC_COLD_AFTER: Duration = Duration::from_secs(5);

/// Chunks shorter than this keep copies even under an erasure code: a small file's fragments
/// would be a few pages each, and a read of it would touch several servers for the memory
/// of one page saved.
pub const EC_MIN_CHUNK: u64 = 64 << 10;

/// Fragments are a multiple of this many bytes: the coder works on 64-byte blocks (and
/// Reed-Solomon over GF(2^16) needs an even length).
pub const EC_FRAGMENT_ALIGN: u64 = 64;

/// Largest read or write FUSE hands the daemon in one request (the kernel's cap is 1 MiB with
/// `max_pages` 256), and so the size of the pooled I/O buffers and the readahead window.
pub const IO_SIZE: usize = 1 << 20;

/// Operations (and batches) of at most this many bytes are small: the TCP fabric sends them
/// on the poster's thread (saving a thread hand-off), and their waiter polls a verbs CQ
/// before sleeping. Above it, a payload's copy time dwarfs a wake-up.
pub const SMALL_OP_BYTES: u64 = 64 << 10;

/// Write-behind on private mounts (`data::behind`): writes of at most this many bytes may be
/// answered before they are remote. Most files a `tar xf` or a build writes are smaller; larger
/// writes are bandwidth-bound, not round-trip-bound, and go out from the request buffer as
/// they are, without a copy.
pub const WRITE_BEHIND_SLOT_BYTES: usize = 256 << 10;

/// Slots for writes answered before they are remote: 8 MiB of daemon memory in all. When all
/// are taken (the worker behind by this many files), writes go out before their answer.
pub const WRITE_BEHIND_SLOTS: usize = 32;

/// How long the write-behind worker waits for work before it looks whether the mount is
/// ending: how long an unmount waits for an idle worker (a busy one finishes its batch).
pub const WRITE_BEHIND_IDLE: std::time::Duration = std::time::Duration::from_millis(50);

/// FUSE worker threads (`--threads`): two cores here, and most time is spent waiting on the
/// network, so a few more threads than cores keep requests in flight.
pub const FUSE_THREADS: usize = 4;

/// Pooled read buffers per FUSE thread: one for the request being served and one being
/// filled by readahead.
pub const READ_BUFFERS_PER_THREAD: usize = 2;

/// The most the registration cache keeps pinned by default where pinning is not limited
/// (root, or an unlimited memlock): enough for every FUSE thread's working set many times over.
pub const REG_CACHE_MAX_BYTES: u64 = 1 << 30;

/// Memlock room the registration cache leaves for the read buffers and one-off
/// registrations when it sizes itself from the memlock limit.
pub const REG_CACHE_MEMLOCK_HEADROOM: u64 = 32 << 20;

/// The least locked-memory limit a non-root verbs mount starts with: the read buffers
/// (FUSE_THREADS x READ_BUFFERS_PER_THREAD x 1 MiB), the headroom above and a registration
/// cache of a few MiB. Below it, writes would fail later with ENOMEM instead.
pub const VERBS_MIN_MEMLOCK: u64 = 64 << 20;

/// The embedded memory server's arena by default: a quarter of available RAM, within these
/// bounds (pages cost RAM only once files use them).
pub const EMBEDDED_MIN_BYTES: u64 = 64 << 20;
pub const EMBEDDED_MAX_BYTES: u64 = 8 << 30;

/// Requests a TCP queue pair buffers ahead of its sender before `post` applies back-pressure
/// (a verbs send queue is of the same order).
pub const TCP_SEND_QUEUE_DEPTH: usize = 4096;

/// Requests a verbs queue pair keeps on the device; the rest wait in a FIFO backlog. rxe and
/// most NICs allow far more, but 128 already covers a 1 MiB batch of 4 KiB pieces twice over.
pub const VERBS_QP_DEPTH: usize = 128;

/// Most authenticated clients a memory server serves at once (`--max-clients`): each costs a
/// control thread and data connections; a rack's mounts number in the tens.
pub const MAX_CLIENTS: u32 = 256;

/// The percentage of the machine's dirty-page allowance one mount may hold (the FUSE bdi's
/// `max_ratio`; the kernel's default for FUSE is 1, which throttles writeback-cached writes
/// after a few MiB). 40: room for bursts of small writes, while several mounts and the rest
/// of the machine still get their share.
pub const WRITEBACK_MAX_RATIO: &str = "40";

/// The dirty limit (see [`crate::fs::dirty_limit`]) leaves this share of the pool's free room
/// (1/8) and [`DIRTY_LIMIT_MARGIN`] unused: the kernel's throttle lets writers overshoot the
/// limit by a few pages each, and other clients of the same servers take room meanwhile.
pub const DIRTY_LIMIT_MARGIN_PARTS: u64 = 8;
/// The fixed part of that margin: 32 MiB, a few full 1 MiB write-backs per writer thread.
pub const DIRTY_LIMIT_MARGIN: u64 = 32 << 20;
/// With the dirty limit kept, new writable handles write through (ENOSPC from `write()`)
/// once the pool's free room is below this: 64 MiB, where the limit (under 24 MiB) would
/// throttle cached writes more than writing through costs.
pub const WRITE_THROUGH_BELOW: u64 = 64 << 20;
/// The dirty limit once the pool has refused data for room: what a handle still cached
/// dirties is refused at write-back either way, so the limit only batches those write-backs
/// (1 MiB requests, not one per page); the margin's 32 MiB, the least memory that does.
pub const FULL_POOL_DIRTY_LIMIT: u64 = DIRTY_LIMIT_MARGIN;

/// Most control connections one peer address may hold open at once: a mount holds one per
/// server (plus a short-lived probe), so 16 leaves room for several mounts on one host while
/// a single misbehaving host cannot take every session slot.
pub const MAX_CONNECTIONS_PER_PEER: u32 = 16;

/// How long the kernel may cache attributes and names. All changes go through this mount
/// (metadata is local to the daemon), so the kernel's view only goes stale through our own
/// replies, which carry fresh attributes, and through the few changes the daemon makes on
/// its own (set-ID bits a write drops, an ACL a chmod moves, the ctime of a chattr), for
/// which it sends the kernel an invalidation. A minute bounds any surprise while sparing
/// most lookups (a tar extraction of 10,000 files: 24,058 lookups with 1 s, 13,968 with
/// 60 s).
pub const ATTR_TTL: Duration = Duration::from_secs(60);

/// [`ATTR_TTL`] on a shared volume (many writers): other clients' changes are pushed to the
/// kernel as they are applied (within [`FOLLOW_POLL`], at once when a lock is taken or a
/// file opened), and this bounds what a missed push could leave stale, as JuiceFS's 1 s
/// default entry and attribute caches do.
pub const SHARED_CACHE_TTL: Duration = Duration::from_secs(1);

/// A shared volume's client loads the whole namespace in the background (every lookup then
/// local) while the volume holds fewer inodes than this: a table of some
/// 64 MB at most (about 640 bytes an inode, measured: doc/VOLUMES.md). Past it, one client
/// (the volume's keeper, `volume::shared::keeper`) holds the whole table, for the
/// checkpoints and the rebuild, and every other client holds what it uses.
pub const SHARED_WHOLE_UNDER: u64 = 100_000;

/// [`SHARED_WHOLE_UNDER`], or in the mount tests' build `RMEMFS_TESTING_WHOLE_UNDER`, so that
/// a mount test's few hundred files make a large volume (a keeper, clients holding what they
/// use).
pub fn shared_whole_under() -> u64 {
    testing_override("RMEMFS_TESTING_WHOLE_UNDER", SHARED_WHOLE_UNDER)
}

/// `product`, or in a build with the `testing` feature the number environment variable
/// `var` gives (the mount tests' way to shrink a threshold to a test's size).
fn testing_override(var: &str, product: u64) -> u64 {
    #[cfg(feature = "testing")]
    if let Some(n) = std::env::var(var).ok().and_then(|v| v.parse().ok()) {
        return n;
    }
    #[cfg(not(feature = "testing"))]
    let _ = var;
    product
}

/// Largest file size rmemfs accepts (what `statfs` and `EFBIG` are measured against): the
/// kernel's own limit for a file offset, `i64::MAX`.
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// Copies of every chunk when a mount names two or more servers and no `--replicas`: one
/// server may die with no byte lost, at twice the memory (a third copy would cost a third
/// write on every write for a second simultaneous failure, rarer by far).
pub const DEFAULT_REPLICAS: usize = 2;

/// Bytes per second the background rebuild copies at most (`--rebuild-rate`; 0: no limit):
/// about half of a 10 Gb/s link, so programs keep the other half while a lost server's
/// copies are restored (1 GiB back at full strength in 2 s).
pub const REBUILD_RATE: u64 = 512 << 20;

/// How long a memory server keeps the extents of a client whose control connection dropped
/// without a goodbye (`serve --lease`): long enough for a client to notice, reconnect with
/// backoff and resume after a link flap or a paused VM, short enough that a client host
/// that is really gone gives its memory back soon.
pub const LEASE: Duration = Duration::from_secs(30);
pub const LEASE_SECS: u64 = LEASE.as_secs();

/// How often a backed memory server (`serve --backing`) writes its arena and tables back to
/// the medium on its own, beyond every `Persist` a volume commit asks for: what a power
/// loss can take from a mount without a volume (or between its commits) on a disk file.
/// Faster than the kernel's own writeback (`dirty_expire_centisecs`, 30 s), and rare enough
/// that a disk-backed server's writes stay sequential batches.
pub const BACKING_FLUSH_INTERVAL: Duration = Duration::from_secs(5);

/// How long a mount waits after the set of live servers changes before it re-replicates
/// (`mount --rebuild-delay`): a server back within it (a short link loss, a paused VM)
/// resumes its session with its copies intact and only chunks written meanwhile are copied;
/// a server still gone is rebuilt around. Short next to the lease and to the odds of a
/// second failure in the window.
pub const REBUILD_DELAY: Duration = Duration::from_secs(5);

/// How often a long rebuild pass logs its progress (its end is always logged): often enough
/// that an admin watching the log sees it move, rare enough for a rebuild of hours.
pub const REBUILD_PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// First and longest pause between a mount's attempts to reconnect to a failed memory
/// server: the first retry is quick (a restarted server is back in a second), later ones
/// back off so a host that is down for good costs a connect attempt every few seconds.
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(250);
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(4);

/// First and longest pause before an upkeep thread (heartbeat, reconnect, rebuild) runs its
/// next round after a round panicked (a bug; logged and counted in `stats`). The first is
/// short next to the detection time, so one stray panic delays failure detection by little;
/// the pause doubles while rounds keep panicking one after another, so a round that panics
/// at once every time costs a log line every half minute instead of a spinning core.
pub const UPKEEP_PANIC_BACKOFF_MIN: Duration = Duration::from_millis(100);
pub const UPKEEP_PANIC_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Frees a client keeps unanswered per server (they do not wait for their answer: see
/// `Pool::free`). A server serves one connection's requests in order, and each free
/// deregisters and zeroes its extent (about 0.1 ms per 1 MiB chunk here), so every free queued
/// delays the allocations and heartbeats behind it: 64 keep that queue near 6 ms while an
/// `rm -rf` still never waits for a round trip.
pub const FREES_IN_FLIGHT_MAX: u64 = 64;

/// How long an allocation that found the pool full waits for the frees already made and not
/// yet back at their servers (held until the journal commits the record that dropped them,
/// every 5 ms; or sent and unanswered) before it answers ENOSPC: so a write right after an
/// `rm` on a full volume finds the room the `rm` made. Bounded: frees held for a lagging
/// follower may take longer, and the writer then gets ENOSPC as it would have.
pub const FULL_POOL_FREES_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Largest extent a client keeps in stock (granted ahead of demand, see `client::stock`): a
/// small file's first write then costs one round trip instead of two. Above it the payload's
/// copy time dwarfs the saved round trip, and most files of a source tree are smaller.
pub const STOCK_MAX_LEN: u64 = 64 << 10;

/// Stocked extents of one length kept per server: one being taken while refills are in
/// flight for a few writers at once. Bounds the memory held ahead to 4 x (4 KiB + 8 KiB + ...
/// + 64 KiB) = 2.1 MiB per server, for lengths actually asked for.
pub const STOCK_DEPTH: usize = 4;

/// The longest `statfs` waits for frees still unanswered before counting what the servers
/// last said: `df` must not hang on a frozen server that the heartbeat has not caught yet.
pub const STATFS_FREES_WAIT: Duration = Duration::from_secs(1);

/// How long a volume's committed metadata change may wait in memory before the committer
/// writes it to the journal: the most un-fsynced metadata a crash can lose. A few ms gathers
/// many operations into one replicated WRITE (group commit) at a cost no user notices.
pub const JOURNAL_COMMIT_INTERVAL: Duration = Duration::from_millis(5);

/// Pending journal bytes that start a commit at once: a burst of creates need not wait for
/// the interval, and one group stays a few WRITEs of [`IO_SIZE`].
pub const JOURNAL_COMMIT_BATCH: usize = 1 << 20;

/// After a failed attempt to restore the journal's copies (a fresh ring and checkpoint, when
/// a copy was lost and another server is up), how long the journal goes on with the copies it
/// has before it tries again: a full pool fails every attempt, and each costs a checkpoint.
pub const JOURNAL_HEAL_RETRY: Duration = Duration::from_secs(1);

/// Threads an export reads, hashes and stores chunks with, each its own chunk: one waits on
/// the servers or the store while another hashes (SHA-256), so the copy is not one chunk's
/// round trips laid end to end. Two: the machine kind has two cores.
pub const EXPORT_THREADS: usize = 2;

/// How often a holder asks the servers how far the volume's followers have read, at most,
/// while a committed free waits for them: a free goes that much later than its commit at
/// worst, and each ask costs one control round trip per server.
pub const FOLLOWER_FLOOR_POLL: Duration = Duration::from_millis(20);

/// How often a follower (`mount --read-only` of a volume) reads the journal's tail and
/// reports how far it has applied it: with the holder's 5 ms commit interval, what the holder
/// commits is seen within about this (the bound is 1 s), for one READ of the tail and
/// one control round trip per server each time.
pub const FOLLOW_POLL: Duration = Duration::from_millis(100);

/// A shared volume's client writes a checkpoint of its table to the metadata engine (which
/// then trims its log and versions up to what every member has applied) once this many
/// changes were made since the last one: a record is a few hundred bytes, so the log stays
/// within some megabytes in Redis and a client that joins replays about this many changes
/// after the image; the image (the whole table) is written once per this many changes.
pub const SHARED_CHECKPOINT_EVERY: u64 = 20_000;

/// [`SHARED_CHECKPOINT_EVERY`], or in the mount tests' build `RMEMFS_TESTING_CHECKPOINT_EVERY`,
/// so that a mount test's few thousand changes meet checkpoints, the trims of the log and
/// versions after them, and clients sent back by those.
pub fn shared_checkpoint_every() -> u64 {
    testing_override("RMEMFS_TESTING_CHECKPOINT_EVERY", SHARED_CHECKPOINT_EVERY)
}

/// How often a blocked lock request on a shared volume (`F_SETLKW`, `flock` without
/// `LOCK_NB`) asks the metadata engine again, at most: tries start at 1 ms and double up to
/// this, so a lock handed over between two processes is taken within about it, while a long
/// wait costs one small engine request per period.
pub const LOCK_WAIT_POLL: Duration = Duration::from_millis(50);

/// Bytes of the ring a follower reads at its tail when it last found nothing there: an idle
/// follower reads this much per poll (160 KB/s), enough for the few records a quiet holder
/// commits between polls.
pub const FOLLOW_WINDOW_MIN: u64 = 16 << 10;

/// The most a follower reads at its tail in one go, while the window it read keeps coming
/// back full (it grows fourfold each time): a full group commit ([`JOURNAL_COMMIT_BATCH`])
/// fits; a longer run is read in several (at once, not a poll apart). A record longer than
/// the window doubles it until it fits.
pub const FOLLOW_WINDOW_MAX: u64 = 1 << 20;

/// Bytes of each copy of a volume's journal ring: at ~150 bytes a record, some 200,000
/// operations between checkpoints (which bound the replay), for 96 MiB over three servers.
pub const JOURNAL_RING_BYTES: u64 = 32 << 20;

/// A journal ring copy takes at most this fraction of its server's memory (1/16): a small
/// server keeps most of its room for files, and checkpoints more often instead.
pub const JOURNAL_RING_SHARE: u64 = 16;

/// Inodes a volume checkpoint copies per hold of the namespace's lock: a few ms of copying,
/// so no operation waits long behind a checkpoint of a million files.
pub const CHECKPOINT_SLICE: usize = 10_000;

/// Most volumes one memory server keeps: an authenticated client cannot grow the server's
/// table without bound (each costs a root of at most 4 KiB and a little state), and no rack
/// needs more names than this per server.
pub const MAX_VOLUMES_PER_SERVER: usize = 1024;

/// Copies of a volume's journal and checkpoint, each on another server: three survive any
/// two lost servers, what `--replicas 3` and `ec:K+2` promise of the files (a volume refuses
/// an erasure code with more parity; `--replicas 4` is for private mounts' sake).
pub const JOURNAL_COPIES: usize = 3;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_gives_up_before_the_client() {
        for secs in [1, 2, 10, 60] {
            let op = Duration::from_secs(secs);
            assert!(server_op_timeout(op) < server_control_timeout(op));
            assert!(server_control_timeout(op) < op);
        }
    }
}
