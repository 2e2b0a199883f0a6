//! The mount's report: one typed struct, [`MountReport`], gathered here (outside the core)
//! from the file system, its data store and pool, the upkeep's figures and the FUSE
//! adapter's, and rendered by `rmemfs stats` (text, [`text`]), `--json` (serde), the stats
//! attributes and Prometheus ([`metrics`]). Keys are the serialized field names, so a
//! misspelt one does not compile.
//!
//! Sections declared with [`figures!`] are rendered generically: adding a field there adds
//! it to the text, the JSON and the metrics at once (the `namespace` section shows it). Every
//! other metric is one line of [`families`], the one list the Prometheus encoder walks.

pub mod families;
pub mod metrics;
#[cfg(test)]
pub(crate) mod pinned;
pub mod text;

use crate::fabric::OpCounters;
use crate::fs::Fs;
use crate::fuse::AdapterFigures;
use crate::regcache::CacheStats;
use crate::sync::atomic::Ordering;
use crate::upkeep::figures::UpkeepFigures;
use crate::volume::follow::FollowCounters;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

/// How a generic figure is exported to Prometheus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
}

/// One figure of a generic section, as the renderers see it.
#[derive(Debug, Clone, Copy)]
pub struct Figure {
    /// The JSON key and the metric's suffix (`rmemfs_{section}_{key}`).
    pub key: &'static str,
    /// The metric's help (its doc comment).
    pub help: &'static str,
    pub kind: MetricKind,
    pub value: u64,
}

/// A section of figures the renderers walk (see [`figures!`]).
pub trait Figures {
    /// The section's name (its key in the report, and its metrics' infix).
    const SECTION: &'static str;
    fn figures(&self) -> Vec<Figure>;
}

/// Declares a generic section: the struct (serialized under the fields' names) and its
/// [`Figures`] walk, from one list of `/// help` `name: Counter|Gauge` fields.
macro_rules! figures {
    ($(#[doc = $doc:literal])* pub struct $name:ident ($section:literal) {
        $( #[doc = $help:literal] $field:ident : $kind:ident ),* $(,)?
    }) => {
        $(#[doc = $doc])*
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
        pub struct $name {
            $( #[doc = $help] pub $field: u64, )*
        }

        impl Figures for $name {
            const SECTION: &'static str = $section;
            fn figures(&self) -> Vec<Figure> {
                vec![$( Figure {
                    key: stringify!($field),
                    help: $help.trim(),
                    kind: MetricKind::$kind,
                    value: self.$field,
                } ),*]
            }
        }
    };
}

figures! {
    /// What the namespace committed: each operation's changes in one batch (the unit a
    /// volume's journal records).
    pub struct NamespaceFigures ("namespace") {
        /// Batches of namespace changes committed (one per changing operation)
        commits: Counter,
        /// Changes in those batches (inodes, entries, attributes, chunks)
        changes: Counter,
    }
}

figures! {
    /// Redundancy by kind: what copies and erasure-coded stripes hold, and the encoder of
    /// cold chunks (`--redundancy ec:K+M`; its figures stay 0 without it).
    pub struct EncodingFigures ("encoding") {
        /// Data fragments (K) of the mount's erasure code (0: copies only)
        data_fragments: Gauge,
        /// Parity fragments (M) of the mount's erasure code
        parity_fragments: Gauge,
        /// Bytes the servers hold for chunk copies (every copy counted)
        copy_bytes: Gauge,
        /// Bytes the servers hold for stripes' fragments
        stripe_bytes: Gauge,
        /// Chunks held as stripes
        stripes: Gauge,
        /// Stripes with a fragment lost or on a server down (read by decoding)
        stripes_degraded: Gauge,
        /// Chunks the encoder left as copies in its last pass (0: encoding finished)
        pending: Gauge,
        /// Chunks the encoder made stripes since the mount
        stripes_made: Counter,
        /// Bytes of fragments the encoder wrote
        bytes_encoded: Counter,
        /// Passes of the encoder
        passes: Counter,
    }
}

figures! {
    /// A volume's journal (only on a mount with `--volume`).
    pub struct JournalFigures ("journal") {
        /// The epoch this daemon holds the volume at
        epoch: Gauge,
        /// The last record committed on every live journal copy
        committed: Gauge,
        /// Groups of records written, one replicated WRITE each
        groups: Counter,
        /// Bytes of records written
        bytes: Counter,
        /// Checkpoints written
        checkpoints: Counter,
        /// Frees waiting for the commit of the record that let go of their extents
        frees_held: Gauge,
    }
}

figures! {
    /// A volume's follower (only on a mount with `--read-only`).
    pub struct FollowerFigures ("follower") {
        /// The last record of the holder's journal applied here
        applied: Gauge,
        /// Records applied since the mount
        records: Counter,
        /// Looks at the journal's tail (one READ, one report to every server)
        polls: Counter,
        /// Checkpoints loaded whole (it fell behind the ring)
        reloads: Counter,
        /// Invalidations sent to the kernel
        invalidations: Counter,
        /// Polls that failed
        errors: Counter,
    }
}

figures! {
    /// A shared volume's client: whether it holds the whole namespace (see
    /// `volume::shared::keeper`).
    pub struct SharedFigures ("shared") {
        /// 1 if this client keeps the whole table of a large volume (its checkpoints, its rebuild)
        keeper: Gauge,
        /// 1 if its table holds the whole namespace (else what it uses)
        whole: Gauge,
        /// 1 if the volume holds more inodes than every client loads whole
        large: Gauge,
        /// The namespace's inodes as the clients holding it whole last noted (0: none yet)
        noted_inodes: Gauge,
        /// The last change of the engine's log this table holds
        applied: Gauge,
    }
}

/// The registration cache (MRRC) of the mount's local buffers: its counters as the cache
/// keeps them, with its policy and the lookups they add up to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CacheFigures {
    pub policy: String,
    pub lookups: u64,
    #[serde(flatten)]
    pub counters: CacheStats,
}

/// The fabric's one-sided operations and registrations, as the fabric counts them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FabricFigures {
    pub name: String,
    #[serde(flatten)]
    pub ops: OpCounters,
    pub pinned_bytes: u64,
    /// Registered unpinned because the memlock limit refused more.
    pub unpinned_bytes: u64,
}

/// How the kernel's requests reach the adapter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FuseFigures {
    /// "io_uring" or "/dev/fuse" ("" before INIT).
    pub transport: String,
    /// Requests being handled (this report's own among them).
    pub in_flight: u64,
    /// Requests answered that an earlier daemon of a kept connection had left unanswered.
    pub resent: u64,
    /// The access-time rule in force, as the mount's flags name it ("relatime",
    /// "strictatime", "noatime", with ",nodiratime"); it follows a remount.
    pub access_times: String,
}

/// The kernel's writeback cache and the dirty limit kept for it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WritebackFigures {
    pub cache: bool,
    /// New writable handles: "cached", "direct" (written through) or "uncached".
    pub new_handles: String,
    pub dirty_limit_bytes: u64,
    pub free_room_bytes: u64,
    /// Writes answered before their bytes were remote (private mounts; `data::behind`).
    pub behind: crate::data::WriteBehindStats,
}

/// Count and latency of one kind of request or fabric batch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OpFigures {
    pub count: u64,
    pub mean_us: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    /// The longest one (a stall shows here).
    pub max_us: u64,
    /// Time of all of them (for exact means between two snapshots).
    pub total_ns: u64,
}

/// One memory server as the pool knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ServerFigures {
    pub id: u32,
    pub addr: String,
    /// "up", "down" or "rejoining".
    pub state: String,
    /// Seconds since the epoch when it entered that state.
    pub since: u64,
    pub free_bytes: u64,
    pub total_bytes: u64,
    /// Granted ahead for new small files (counted as used, not free).
    pub stocked_bytes: u64,
    pub downs: u64,
}

/// Chunks by how many of their copies are on live servers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ChunkFigures {
    pub copies: u64,
    pub healthy: u64,
    pub degraded: u64,
    pub lost: u64,
    /// Healthy chunks with more copies than `copies` (lowered live; the rebuild trims them).
    pub surplus: u64,
    /// Chunks with a copy on a draining server, and those copies' bytes (left to move).
    pub moving: u64,
    pub moving_bytes: u64,
}

/// A drain under way (`rmemfs admin drain`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DrainFigures {
    pub server: String,
    pub seconds: u64,
    pub bytes_moved: u64,
    pub bytes_left: u64,
    pub rate_bytes_per_s: u64,
    /// Seconds to go at the rate so far (none before anything moved).
    pub eta_seconds: Option<u64>,
}

/// What the background rebuild has done.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RebuildFigures {
    pub running: bool,
    pub passes: u64,
    pub chunks_rebuilt: u64,
    pub bytes_copied: u64,
    pub last_rate_bytes_per_s: u64,
    pub chunks_left_degraded: u64,
    /// Chunks given a new copy by a write (their copy on a down server missed it).
    pub chunks_copied_on_write: u64,
}

/// A mount's figures: what every rendering of `stats` shows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MountReport {
    pub registration_cache: CacheFigures,
    pub fabric: FabricFigures,
    pub fuse: FuseFigures,
    pub writeback: WritebackFigures,
    pub fabric_batches: BTreeMap<String, OpFigures>,
    pub servers: Vec<ServerFigures>,
    pub chunks: ChunkFigures,
    pub rebuild: RebuildFigures,
    /// None unless a drain is running.
    pub drain: Option<DrainFigures>,
    pub namespace: NamespaceFigures,
    pub encoding: EncodingFigures,
    /// None without a volume.
    pub journal: Option<JournalFigures>,
    /// None unless following a volume.
    pub follower: Option<FollowerFigures>,
    /// None unless a shared volume's client.
    pub shared: Option<SharedFigures>,
    /// Where `rmemfs admin` reaches the daemon ("" before it listens).
    pub admin_socket: String,
    pub inodes: u64,
    pub contained_panics: u64,
    pub upkeep_panics: BTreeMap<String, u64>,
    pub requests: BTreeMap<String, OpFigures>,
}

fn by_op(summaries: Vec<crate::requests::OpSummary>) -> BTreeMap<String, OpFigures> {
    summaries
        .into_iter()
        .map(|o| {
            let f = OpFigures {
                count: o.count,
                mean_us: o.mean_us,
                p50_us: o.p50_us,
                p99_us: o.p99_us,
                max_us: o.max_us,
                total_ns: o.total_nanos,
            };
            (o.op.to_string(), f)
        })
        .collect()
}

fn epoch(t: SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl MountReport {
    /// The figures of the mount of `parts` now.
    pub fn gather(parts: &Parts) -> MountReport {
        let fs = &*parts.fs;
        let data = fs.data();
        let pool = data.pool();
        let c = data.cache_stats();
        let servers = pool
            .status()
            .iter()
            .map(|s| ServerFigures {
                id: s.id.0,
                addr: s.addr.to_string(),
                state: match s.state {
                    crate::client::ServerState::Up if s.draining => "draining",
                    crate::client::ServerState::Up => "up",
                    crate::client::ServerState::Removed => "removed",
                    crate::client::ServerState::Down => "down",
                    crate::client::ServerState::Rejoining => "rejoining",
                }
                .into(),
                since: epoch(s.since),
                free_bytes: s.capacity.free,
                total_bytes: s.capacity.total,
                stocked_bytes: pool.stocked_bytes(s.id),
                downs: s.downs,
            })
            .collect();
        let h = fs.replica_health();
        let (adapter, upkeep) = (&*parts.adapter, &*parts.upkeep);
        let r = &upkeep.rebuild;
        let (commits, changes) = fs.commits();
        MountReport {
            registration_cache: CacheFigures {
                policy: format!("{:?}", data.cache_policy()).to_lowercase(),
                lookups: c.lookups(),
                counters: c,
            },
            fabric: FabricFigures {
                name: pool.fabric().name().into(),
                ops: pool.fabric().counters(),
                pinned_bytes: pool.fabric().pinned_bytes(),
                unpinned_bytes: pool.fabric().unpinned_bytes(),
            },
            fuse: FuseFigures {
                transport: adapter.transport.get().copied().unwrap_or("").into(),
                in_flight: adapter.in_flight.load(Ordering::Relaxed),
                resent: adapter.resent.load(Ordering::Relaxed),
                access_times: {
                    let (atime, dirs) = fs.access_times();
                    crate::fs::access_flags_name(atime, dirs)
                },
            },
            writeback: WritebackFigures {
                cache: fs.writeback_enabled(),
                new_handles: match (fs.writeback_enabled(), fs.direct_writes()) {
                    (false, _) => "uncached",
                    (true, true) => "direct",
                    (true, false) => "cached",
                }
                .into(),
                dirty_limit_bytes: fs.dirty_limit_bytes(),
                free_room_bytes: fs.free_room(),
                behind: fs.data().write_behind_stats(),
            },
            fabric_batches: by_op(pool.batch_latency()),
            servers,
            chunks: ChunkFigures {
                copies: data.replicas() as u64,
                healthy: h.healthy,
                degraded: h.degraded,
                lost: h.lost,
                surplus: h.surplus,
                moving: h.moving,
                moving_bytes: h.moving_bytes,
            },
            drain: upkeep.drain.lock().as_ref().map(|d| {
                let seconds = d.started.elapsed().as_secs_f64();
                let bytes_moved = d.bytes_at_start.saturating_sub(h.moving_bytes);
                let rate = (bytes_moved as f64 / seconds.max(1e-3)) as u64;
                DrainFigures {
                    server: d.server.clone(),
                    seconds: seconds as u64,
                    bytes_moved,
                    bytes_left: h.moving_bytes,
                    rate_bytes_per_s: rate,
                    eta_seconds: (rate > 0).then(|| h.moving_bytes / rate),
                }
            }),
            rebuild: RebuildFigures {
                running: r.running.load(Ordering::Relaxed),
                passes: r.passes.load(Ordering::Relaxed),
                chunks_rebuilt: r.chunks_rebuilt.load(Ordering::Relaxed),
                bytes_copied: r.bytes_copied.load(Ordering::Relaxed),
                last_rate_bytes_per_s: r.last_rate.load(Ordering::Relaxed),
                chunks_left_degraded: r.left_degraded.load(Ordering::Relaxed),
                chunks_copied_on_write: fs.data().copied_on_write(),
            },
            namespace: NamespaceFigures { commits, changes },
            encoding: {
                let e = &upkeep.encode;
                let code = data.coding();
                EncodingFigures {
                    data_fragments: code.map_or(0, |c| c.k as u64),
                    parity_fragments: code.map_or(0, |c| c.m as u64),
                    copy_bytes: h.copy_bytes,
                    stripe_bytes: h.stripe_bytes,
                    stripes: h.encoded,
                    stripes_degraded: h.stripes_degraded,
                    pending: e.pending.load(Ordering::Relaxed),
                    stripes_made: e.stripes_made.load(Ordering::Relaxed),
                    bytes_encoded: e.bytes_written.load(Ordering::Relaxed),
                    passes: e.passes.load(Ordering::Relaxed),
                }
            },
            journal: fs.journal_stats().map(|j| JournalFigures {
                epoch: j.epoch,
                committed: j.committed,
                groups: j.groups,
                bytes: j.bytes,
                checkpoints: j.checkpoints,
                frees_held: j.frees_held,
            }),
            follower: parts.follower.as_ref().map(|f| FollowerFigures {
                applied: f.applied.load(Ordering::Relaxed),
                records: f.records.load(Ordering::Relaxed),
                polls: f.polls.load(Ordering::Relaxed),
                reloads: f.reloads.load(Ordering::Relaxed),
                invalidations: f.invalidations.load(Ordering::Relaxed),
                errors: f.errors.load(Ordering::Relaxed),
            }),
            shared: parts.shared.as_ref().map(|standing| {
                let s = standing();
                SharedFigures {
                    keeper: s.keeper as u64,
                    whole: s.whole as u64,
                    large: s.large as u64,
                    noted_inodes: s.noted_inodes,
                    applied: s.applied,
                }
            }),
            inodes: fs.inode_count() as u64,
            admin_socket: parts.admin_socket.clone(),
            contained_panics: adapter.contained_panics.load(Ordering::Relaxed),
            upkeep_panics: crate::upkeep::figures::UPKEEP_THREADS
                .iter()
                .map(|t| (t.to_string(), upkeep.panics.of(t)))
                .collect(),
            requests: by_op(adapter.requests.summary()),
        }
    }

    /// `stats --json`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("the report serializes")
    }

    /// The generic sections, for the text and the metrics.
    pub fn sections(&self) -> Vec<(&'static str, Vec<Figure>)> {
        let mut sections = vec![section(&self.namespace), section(&self.encoding)];
        sections.extend(self.journal.as_ref().map(section));
        sections.extend(self.follower.as_ref().map(section));
        sections.extend(self.shared.as_ref().map(section));
        sections
    }
}

fn section<F: Figures>(f: &F) -> (&'static str, Vec<Figure>) {
    (F::SECTION, f.figures())
}

/// What a mount's report reads: its file system, and the figures each other part of the
/// mount owns (the FUSE adapter, upkeep, a follower, the admin socket). The mount puts it
/// together once; every rendering (the stats attributes, the metrics, the log at unmount)
/// gathers from it.
#[derive(Clone)]
pub struct Parts {
    pub fs: Arc<Fs>,
    pub adapter: Arc<AdapterFigures>,
    pub upkeep: Arc<UpkeepFigures>,
    /// A follower's counters (none: not a follower).
    pub follower: Option<Arc<FollowCounters>>,
    /// A shared volume's client's standing (none: not one).
    pub shared: Option<crate::volume::shared::StandingSource>,
    /// Where the admin socket listens (empty: it does not).
    pub admin_socket: String,
}

impl Parts {
    /// `fs` with parts that have done nothing yet (a file system without a mount: tests and
    /// tools).
    pub fn of(fs: Arc<Fs>) -> Parts {
        Parts {
            fs,
            adapter: Default::default(),
            upkeep: Default::default(),
            follower: None,
            shared: None,
            admin_socket: String::new(),
        }
    }

    /// The report as the stats attributes read it: text, or JSON (`json`).
    pub fn render(&self, json: bool) -> Vec<u8> {
        let report = MountReport::gather(self);
        if json {
            report.to_json().to_string().into_bytes()
        } else {
            text::render(&report).into_bytes()
        }
    }

    /// `stats --json`.
    pub fn stats_json(&self) -> serde_json::Value {
        MountReport::gather(self).to_json()
    }

    /// What `rmemfs stats` prints.
    pub fn stats_text(&self) -> String {
        text::render(&MountReport::gather(self))
    }

    /// The report as the FUSE adapter serves it (see [`crate::fuse::StatsSource`]).
    pub fn source(&self) -> crate::fuse::StatsSource {
        let parts = self.clone();
        Box::new(move |json| parts.render(json))
    }
}
