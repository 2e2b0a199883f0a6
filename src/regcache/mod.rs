//! Registration caches: MRRC (Memory Registration Region Cache, Ou/He/Han, JNCA 2009, §5),
//! and the baselines it is measured against: an LRU pin-down cache and no cache at all.
//!
//! Registering memory is expensive (pinning plus a trip to the device), so rmemfs keeps
//! registrations of the buffers it hands to the fabric and reuses them. MRRC caches *regions*
//! (page ranges), not pages. A lookup is an exact hit, a subset of a cached region (also a hit),
//! an overlap (the cached part is reused at once, only the uncovered part is registered), or a
//! miss. Regions sit in an LRU stack: a *frequent-reference* section on top and a *resorting*
//! section below, whose bottom part is the *eviction segment*. When the cache is full, the MRE
//! replacement runs: the global recency `r` becomes the eviction factor of the bottom region;
//! each resorting region whose factor is zero gets `r + 1/s` (s = size in pages); the section
//! is sorted by factor (smallest at the bottom, so large and old regions go first); and the
//! whole eviction segment is deregistered in **one batch**. A region referenced again goes to
//! the top with its factor reset to zero. Regions in use by an operation are never evicted.
//!
//! The pin-down baseline keeps its recency order in an `lru::LruCache`, looks a request up as a
//! region that covers it entirely, and deregisters one least-recently-used idle region per
//! eviction.
//!
//! The caches are generic over a [`Registrar`], so the same code runs against a fabric and
//! against the cost model of the trace simulator (`rmemfs-mrrc-sim`, in the lab crate).

use crate::fabric::mem::page_size;
use crate::fabric::{Access, Fabric, FabricError, LocalMr};
use crate::sync::{Arc, Mutex};
use std::collections::BTreeMap;

mod mrrc;
mod pindown;

/// Registers and deregisters page-aligned ranges.
pub trait Registrar: Send + Sync {
    type Reg: Send + Sync;
    /// Registers `[addr, addr+len)`; returns the registration and its lkey.
    fn register(&self, addr: u64, len: u64) -> Result<(Self::Reg, u32), FabricError>;
    /// Deregisters a batch in one operation.
    fn deregister(&self, regs: Vec<Self::Reg>);
}

/// Registers through a fabric.
///
/// Only memory rmemfs owns for as long as the cache lives is ever given to the cache (its
/// bounce and read buffers, and FUSE's per-thread request buffers, which live for the whole
/// session): so a cached registration can never point at memory that was freed and reused,
/// and no malloc/munmap hooks are needed.
pub struct FabricRegistrar(pub Arc<dyn Fabric>);

impl Registrar for FabricRegistrar {
    type Reg = LocalMr;
    fn register(&self, addr: u64, len: u64) -> Result<(LocalMr, u32), FabricError> {
        // SAFETY: see the type's documentation: callers only hand the cache memory that stays
        // mapped until the cache (and with it every registration) is dropped, and the cache
        // never drops a registration while an operation uses it (in-use counts).
        let mr = unsafe {
            self.0
                .register(addr as *mut u8, len as usize, Access::LOCAL)
        }?;
        let lkey = mr.lkey();
        Ok((mr, lkey))
    }
    fn deregister(&self, regs: Vec<LocalMr>) {
        if let Err(crate::fabric::DeregisterError::Busy(busy)) = self.0.deregister(regs) {
            // The cache only evicts regions it counts idle; a busy one means an operation
            // outlived its release. Dropping it still removes the key; the fabric keeps the
            // pin until that operation is reaped.
            log::warn!("{} evicted registrations were still in flight", busy.len());
        }
    }
}

/// Which cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Mrrc,
    Lru,
    None,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Policy, String> {
        match s {
            "mrrc" => Ok(Policy::Mrrc),
            "lru" => Ok(Policy::Lru),
            "none" => Ok(Policy::None),
            other => Err(format!(
                "unknown registration cache '{other}' (mrrc, lru, none)"
            )),
        }
    }
}

/// Sizes and section proportions.
#[derive(Debug, Clone, Copy)]
pub struct CacheConfig {
    /// Most pages pinned by cached registrations (the memlock limit or the device's).
    pub capacity_pages: u64,
    /// Most regions (the device's `max_mr`).
    pub max_regions: usize,
    /// Share of the stack (in regions) that is the frequent-reference section. Half: regions
    /// touched recently are protected, while half the stack still competes on size.
    pub frequent_share: f64,
    /// Share of the resorting section that is the eviction segment. A quarter: large enough
    /// that one batched deregistration frees room for several misses, small enough not to
    /// throw away registrations still worth keeping.
    pub eviction_share: f64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            capacity_pages: 65536, // 256 MiB of 4 KiB pages
            max_regions: 2048,     // rxe's max_mr on older kernels; libfabric's default is 1024
            frequent_share: 0.5,
            eviction_share: 0.25,
        }
    }
}

/// Cache counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    pub hits: u64,
    pub subset_hits: u64,
    pub overlaps: u64,
    pub misses: u64,
    pub registrations: u64,
    pub registered_pages: u64,
    pub deregistrations: u64,
    pub deregistration_batches: u64,
    pub deregistered_pages: u64,
    pub full_events: u64,
    pub pinned_pages: u64,
    pub regions: u64,
}

impl CacheStats {
    pub fn lookups(&self) -> u64 {
        self.hits + self.subset_hits + self.overlaps + self.misses
    }
    /// Hits (exact and subset) over lookups.
    pub fn hit_ratio(&self) -> f64 {
        let n = self.lookups();
        if n == 0 {
            0.0
        } else {
            (self.hits + self.subset_hits) as f64 / n as f64
        }
    }
}

/// How a lookup was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    Hit,
    Subset,
    Overlap,
    Miss,
}

/// A piece of a requested range and the registration that covers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub addr: u64,
    pub len: u64,
    pub lkey: u32,
    /// The piece was already registered (it can be used before the rest is registered).
    pub cached: bool,
    entry: u64,
}

struct Entry<R> {
    start: u64,
    end: u64,
    reg: Option<R>,
    evictfact: f64,
    in_use: u32,
    lkey: u32,
}

impl<R> Entry<R> {
    fn pages(&self, page: u64) -> u64 {
        (self.end - self.start) / page
    }
}

struct State<R> {
    entries: BTreeMap<u64, Entry<R>>, // by id
    by_start: BTreeMap<u64, u64>,     // start -> id (regions are disjoint)
    /// The LRU stack, top first.
    stack: Vec<u64>,
    /// Recency order of the pin-down baseline (the `lru` crate: most recent first).
    recency: lru::LruCache<u64, ()>,
    /// Global recency value of MRE.
    r: f64,
    next_id: u64,
    pinned_pages: u64,
    stats: CacheStats,
}

/// A registration cache over a [`Registrar`].
pub struct RegCache<G: Registrar> {
    registrar: G,
    policy: Policy,
    config: CacheConfig,
    page: u64,
    state: Mutex<State<G::Reg>>,
}

/// Registrations lent for one operation; give them back with [`RegCache::release`].
#[derive(Debug)]
#[must_use = "release the pieces when the operation has completed"]
pub struct Pinned {
    pub pieces: Vec<Piece>,
    pub lookup: Lookup,
}

impl<G: Registrar> RegCache<G> {
    pub fn new(registrar: G, policy: Policy, config: CacheConfig) -> RegCache<G> {
        RegCache {
            registrar,
            policy,
            config,
            page: page_size() as u64,
            state: Mutex::new(State {
                entries: BTreeMap::new(),
                by_start: BTreeMap::new(),
                stack: Vec::new(),
                recency: lru::LruCache::unbounded(),
                r: 0.0,
                next_id: 1,
                pinned_pages: 0,
                stats: CacheStats::default(),
            }),
        }
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn stats(&self) -> CacheStats {
        let st = self.state.lock();
        let mut s = st.stats;
        s.pinned_pages = st.pinned_pages;
        s.regions = st.entries.len() as u64;
        s
    }

    /// The regions from most to least recently placed first, as `(start, end)`: MRRC's
    /// stack, or the pin-down cache's LRU order (for tests and inspection).
    pub fn stack(&self) -> Vec<(u64, u64)> {
        let st = self.state.lock();
        let ids: Vec<u64> = match self.policy {
            Policy::Lru => st.recency.iter().map(|(id, _)| *id).collect(),
            _ => st.stack.clone(),
        };
        ids.iter()
            .map(|id| (st.entries[id].start, st.entries[id].end))
            .collect()
    }

    /// Lends registrations covering `[addr, addr+len)` (rounded out to pages); they stay
    /// registered, and are never evicted, until released.
    ///
    /// The fabric is called (to register the gaps, to deregister evicted regions) with the
    /// cache's lock released, so one thread's registration never stalls another's lookup.
    /// If another thread cached part of a gap meanwhile (MRRC keeps its regions disjoint), the
    /// fresh registration is given back and the lookup runs again: that part is now a hit.
    pub fn acquire(&self, addr: u64, len: u64) -> Result<Pinned, FabricError> {
        let start = addr & !(self.page - 1);
        let end = (addr + len.max(1)).div_ceil(self.page) * self.page;
        loop {
            let mut evicted = Vec::new();
            let (lookup, mut pieces, gaps) = {
                let mut st = self.state.lock();
                let found = match self.policy {
                    Policy::Mrrc => self.find_mrrc(&mut st, start, end),
                    Policy::Lru => self.find_lru(&mut st, start, end),
                    Policy::None => (Lookup::Miss, Vec::new(), vec![(start, end)]),
                };
                if found.2.is_empty() {
                    // All cached: nothing to register, done under this one lock.
                    Self::count(&mut st, found.0);
                    drop(st);
                    return Ok(Self::clipped(found.0, found.1, addr, len));
                }
                if self.policy != Policy::None {
                    let pages = found.2.iter().map(|(s, e)| (e - s) / self.page).sum();
                    self.make_room(&mut st, pages, &mut evicted);
                }
                found
            };
            for batch in evicted {
                self.registrar.deregister(batch);
            }
            let mut fresh = Vec::with_capacity(gaps.len());
            let mut failure = None;
            for &(gs, ge) in &gaps {
                match self.registrar.register(gs, ge - gs) {
                    Ok((reg, lkey)) => fresh.push((gs, ge, reg, lkey)),
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
            let mut st = self.state.lock();
            let raced = self.policy == Policy::Mrrc
                && fresh
                    .iter()
                    .any(|(gs, ge, _, _)| Self::overlaps(&st, *gs, *ge));
            if failure.is_some() || raced {
                for p in &pieces {
                    Self::unuse(&mut st, p.entry);
                }
                drop(st);
                let regs: Vec<G::Reg> = fresh.into_iter().map(|(_, _, reg, _)| reg).collect();
                if !regs.is_empty() {
                    self.registrar.deregister(regs);
                }
                match failure {
                    Some(e) => return Err(e),
                    None => continue,
                }
            }
            Self::count(&mut st, lookup);
            for (gs, ge, reg, lkey) in fresh {
                pieces.push(self.insert(&mut st, gs, ge, reg, lkey));
            }
            drop(st);
            return Ok(Self::clipped(lookup, pieces, addr, len));
        }
    }

    fn count(st: &mut State<G::Reg>, lookup: Lookup) {
        match lookup {
            Lookup::Hit => st.stats.hits += 1,
            Lookup::Subset => st.stats.subset_hits += 1,
            Lookup::Overlap => st.stats.overlaps += 1,
            Lookup::Miss => st.stats.misses += 1,
        }
    }

    /// The pieces in address order, clipped to the bytes asked for.
    fn clipped(lookup: Lookup, mut pieces: Vec<Piece>, addr: u64, len: u64) -> Pinned {
        pieces.sort_by_key(|p| p.addr);
        let want_end = addr + len;
        let pieces = pieces
            .into_iter()
            .filter_map(|mut p| {
                let s = p.addr.max(addr);
                let e = (p.addr + p.len).min(want_end);
                (s < e || len == 0).then(|| {
                    p.addr = s;
                    p.len = e.saturating_sub(s);
                    p
                })
            })
            .collect();
        Pinned { pieces, lookup }
    }

    /// True if a cached MRRC region intersects `[start, end)`. Regions are disjoint, so the
    /// last one starting before `end` has the largest end of those and is the only candidate.
    fn overlaps(st: &State<G::Reg>, start: u64, end: u64) -> bool {
        st.by_start
            .range(..end)
            .next_back()
            .is_some_and(|(_, id)| st.entries[id].end > start)
    }

    /// Gives back what [`RegCache::acquire`] lent. Without a cache, deregisters at once.
    pub fn release(&self, pinned: Pinned) {
        let mut st = self.state.lock();
        let mut gone = Vec::new();
        for p in pinned.pieces {
            Self::unuse(&mut st, p.entry);
            if self.policy == Policy::None {
                let pages = st.entries.get(&p.entry).map_or(0, |e| e.pages(self.page));
                if let Some(reg) = self.remove(&mut st, p.entry) {
                    st.stats.deregistered_pages += pages;
                    gone.push(reg);
                }
            }
        }
        if !gone.is_empty() {
            st.stats.deregistrations += gone.len() as u64;
            st.stats.deregistration_batches += gone.len() as u64; // one call each
            drop(st);
            for reg in gone {
                self.registrar.deregister(vec![reg]);
            }
        }
    }

    fn unuse(st: &mut State<G::Reg>, id: u64) {
        if let Some(e) = st.entries.get_mut(&id) {
            e.in_use = e.in_use.saturating_sub(1);
        }
    }

    fn piece(e: &Entry<G::Reg>, id: u64, cached: bool) -> Piece {
        Piece {
            addr: e.start,
            len: e.end - e.start,
            lkey: e.lkey,
            cached,
            entry: id,
        }
    }

    fn to_top(st: &mut State<G::Reg>, id: u64) {
        if let Some(pos) = st.stack.iter().position(|&x| x == id) {
            st.stack.remove(pos);
        }
        st.stack.insert(0, id);
        if let Some(e) = st.entries.get_mut(&id) {
            e.evictfact = 0.0;
        }
    }

    /// Adds a fresh registration of `[start, end)` as a new region on top of the stack, in use
    /// once (room was made before it was registered).
    fn insert(
        &self,
        st: &mut State<G::Reg>,
        start: u64,
        end: u64,
        reg: G::Reg,
        lkey: u32,
    ) -> Piece {
        let pages = (end - start) / self.page;
        st.stats.registrations += 1;
        st.stats.registered_pages += pages;
        let id = st.next_id;
        st.next_id += 1;
        let e = Entry {
            start,
            end,
            reg: Some(reg),
            evictfact: 0.0,
            in_use: 1,
            lkey,
        };
        let p = Self::piece(&e, id, false);
        st.entries.insert(id, e);
        if self.policy == Policy::Mrrc {
            st.by_start.insert(start, id);
        }
        match self.policy {
            Policy::Lru => {
                st.recency.put(id, ());
            }
            _ => st.stack.insert(0, id),
        }
        st.pinned_pages += pages;
        p
    }

    fn full(&self, st: &State<G::Reg>, extra_pages: u64) -> bool {
        st.pinned_pages + extra_pages > self.config.capacity_pages
            || st.entries.len() + 1 > self.config.max_regions
    }

    /// Evicts idle regions until `pages` more fit; the evicted registrations go to `out`, one
    /// batch per deregistration call, for the caller to hand back once the lock is released.
    fn make_room(&self, st: &mut State<G::Reg>, pages: u64, out: &mut Vec<Vec<G::Reg>>) {
        // Each pass is one full-cache event; stop when nothing idle is left to evict.
        while self.full(st, pages) {
            let freed = match self.policy {
                Policy::Mrrc => self.mre(st, out),
                Policy::Lru => self.evict_lru(st, out),
                Policy::None => 0,
            };
            if freed == 0 {
                log::debug!("registration cache over capacity: every region is in use");
                break;
            }
        }
    }

    fn remove(&self, st: &mut State<G::Reg>, id: u64) -> Option<G::Reg> {
        let mut e = st.entries.remove(&id)?;
        if st.by_start.get(&e.start) == Some(&id) {
            st.by_start.remove(&e.start);
        }
        if let Some(pos) = st.stack.iter().position(|&x| x == id) {
            st.stack.remove(pos);
        }
        st.recency.pop(&id);
        st.pinned_pages -= e.pages(self.page);
        e.reg.take()
    }
}

impl<G: Registrar> Drop for RegCache<G> {
    fn drop(&mut self) {
        let st = self.state.get_mut();
        let regs: Vec<G::Reg> = std::mem::take(&mut st.entries)
            .into_values()
            .filter_map(|mut e| e.reg.take())
            .collect();
        if !regs.is_empty() {
            self.registrar.deregister(regs);
        }
    }
}

#[cfg(test)]
mod tests;
