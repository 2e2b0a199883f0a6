//! The caches against a counting registrar: the lookup cases, MRE's batches, the baselines,
//! threads and the model checker.

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

const P: u64 = 4096;

/// Records registrations; panics on a double or unknown deregistration.
#[derive(Default)]
struct Mock {
    /// Live registrations (a range may be registered twice when two threads race for
    /// it; each registration must be deregistered exactly once).
    live: Mutex<HashMap<(u64, u64), u32>>,
    batches: Mutex<Vec<Vec<(u64, u64)>>>,
}

impl Registrar for Arc<Mock> {
    type Reg = (u64, u64);
    fn register(&self, addr: u64, len: u64) -> Result<((u64, u64), u32), FabricError> {
        *self.live.lock().entry((addr, len)).or_default() += 1;
        Ok(((addr, len), (addr / P) as u32))
    }
    fn deregister(&self, regs: Vec<(u64, u64)>) {
        let mut live = self.live.lock();
        for r in &regs {
            let n = live
                .get_mut(r)
                .unwrap_or_else(|| panic!("deregistered {r:?} twice or never registered"));
            *n -= 1;
            if *n == 0 {
                live.remove(r);
            }
        }
        self.batches.lock().push(regs);
    }
}

fn cache(
    policy: Policy,
    capacity_pages: u64,
    eviction_share: f64,
) -> (RegCache<Arc<Mock>>, Arc<Mock>) {
    let mock = Arc::new(Mock::default());
    let config = CacheConfig {
        capacity_pages,
        max_regions: 1000,
        frequent_share: 0.5,
        eviction_share,
    };
    (RegCache::new(mock.clone(), policy, config), mock)
}

fn use_once<G: Registrar>(c: &RegCache<G>, addr: u64, len: u64) -> Lookup {
    let p = c.acquire(addr, len).unwrap();
    let how = p.lookup;
    c.release(p);
    how
}

#[test]
fn the_four_lookup_cases() {
    let (c, mock) = cache(Policy::Mrrc, 1000, 0.25);
    assert_eq!(use_once(&c, 0x10000, 4 * P), Lookup::Miss);
    assert_eq!(use_once(&c, 0x10000, 4 * P), Lookup::Hit);
    let p = c.acquire(0x10000 + P + 10, 100).unwrap();
    assert_eq!(p.lookup, Lookup::Subset);
    assert_eq!(p.pieces.len(), 1);
    assert_eq!((p.pieces[0].addr, p.pieces[0].len), (0x10000 + P + 10, 100));
    c.release(p);
    // Overlap: the cached part is reused, only the rest is registered.
    let p = c.acquire(0x10000 + 2 * P, 6 * P).unwrap();
    assert_eq!(p.lookup, Lookup::Overlap);
    let parts: Vec<_> = p.pieces.iter().map(|x| (x.addr, x.len, x.cached)).collect();
    assert_eq!(
        parts,
        [
            (0x10000 + 2 * P, 2 * P, true),
            (0x10000 + 4 * P, 4 * P, false)
        ]
    );
    c.release(p);
    assert!(mock.live.lock().contains_key(&(0x10000 + 4 * P, 4 * P)));
    // A request covered by the two adjacent cached regions needs no registration: a hit.
    let p = c.acquire(0x10000, 8 * P).unwrap();
    assert_eq!(p.lookup, Lookup::Subset);
    assert!(p.pieces.iter().all(|x| x.cached));
    c.release(p);
    let s = c.stats();
    assert_eq!((s.misses, s.hits, s.subset_hits, s.overlaps), (1, 1, 2, 1));
    assert_eq!(s.lookups(), 5);
    assert_eq!(s.registrations, 2);
    assert_eq!(s.pinned_pages, 8);
}

#[test]
fn mre_evicts_large_then_old_regions_in_one_batch() {
    let (c, mock) = cache(Policy::Mrrc, 10, 0.5);
    let (a, b, cc, d) = (0x0, 0x10000, 0x20000, 0x30000);
    use_once(&c, a, P);
    use_once(&c, b, 4 * P);
    use_once(&c, cc, 2 * P);
    use_once(&c, d, 3 * P);
    assert_eq!(
        c.stack(),
        [(d, d + 3 * P), (cc, cc + 2 * P), (b, b + 4 * P), (a, a + P)]
    );
    // Full: r = 0 (A's factor); B gets 1/4, A gets 1: B, the large one, goes.
    use_once(&c, 0x40000, P);
    assert_eq!(mock.batches.lock().as_slice(), [vec![(b, 4 * P)]]);
    // Full again: r = A's factor, 1; C gets 1 + 1/2, A keeps 1: A, the older, goes.
    use_once(&c, 0x50000, 4 * P);
    assert_eq!(
        mock.batches.lock().as_slice(),
        [vec![(b, 4 * P)], vec![(a, P)]]
    );
    let s = c.stats();
    assert_eq!(s.full_events, 2);
    assert_eq!(s.deregistration_batches, 2);
    assert_eq!(s.pinned_pages, 10);
}

#[test]
fn a_referenced_region_goes_to_the_top_and_survives() {
    let (c, mock) = cache(Policy::Mrrc, 10, 0.5);
    use_once(&c, 0x0, P);
    use_once(&c, 0x10000, 4 * P);
    use_once(&c, 0x20000, 2 * P);
    use_once(&c, 0x30000, 3 * P);
    assert_eq!(use_once(&c, 0x10000, 4 * P), Lookup::Hit); // B to the top
    use_once(&c, 0x40000, P);
    // Resorting section is now C, A (bottom): A (1/1) stays above C (1/2): C goes.
    assert_eq!(mock.batches.lock()[0], vec![(0x20000, 2 * P)]);
}

#[test]
fn regions_in_use_are_never_evicted() {
    let (c, mock) = cache(Policy::Mrrc, 4, 1.0);
    let held = c.acquire(0x0, 4 * P).unwrap();
    // The cache is full of a region in use: a new one is registered over capacity, and
    // nothing is deregistered.
    let other = c.acquire(0x10000, 2 * P).unwrap();
    assert!(mock.batches.lock().iter().all(|b| b.is_empty()));
    assert!(mock.live.lock().contains_key(&(0x0, 4 * P)));
    c.release(other);
    c.release(held);
    use_once(&c, 0x20000, P);
    assert!(c.stats().pinned_pages <= 4);
}

#[test]
fn a_busy_eviction_segment_falls_back_to_idle_regions_above_it() {
    let (c, mock) = cache(Policy::Mrrc, 4, 0.25);
    let a = c.acquire(0x0, P).unwrap(); // held: the bottom region stays in use
    for addr in [0x10000, 0x20000, 0x30000] {
        use_once(&c, addr, P);
    }
    use_once(&c, 0x40000, P);
    assert_eq!(mock.batches.lock().as_slice(), [vec![(0x10000, P)]]);
    assert!(mock.live.lock().contains_key(&(0x0, P)));
    c.release(a);
    assert_eq!(c.stats().pinned_pages, 4);
}

#[test]
fn lru_baseline_deregisters_one_at_a_time_and_none_every_time() {
    let (c, mock) = cache(Policy::Lru, 4, 0.25);
    for i in 0..6 {
        use_once(&c, i * 0x10000, 2 * P);
    }
    let batches = mock.batches.lock().clone();
    assert_eq!(batches.len(), 4);
    assert!(batches.iter().all(|b| b.len() == 1));
    assert_eq!(batches[0], vec![(0, 2 * P)], "least recently used first");
    // A partial overlap is a miss that registers the whole request (pages twice).
    assert_eq!(use_once(&c, 5 * 0x10000 + P, 2 * P), Lookup::Miss);

    // A hit makes a region the most recent: the next eviction takes the other one.
    let (c, mock) = cache(Policy::Lru, 4, 0.25);
    use_once(&c, 0, 2 * P);
    use_once(&c, 0x10000, 2 * P);
    assert_eq!(use_once(&c, 0, 2 * P), Lookup::Hit);
    use_once(&c, 0x20000, 2 * P);
    assert_eq!(mock.batches.lock().as_slice(), [vec![(0x10000, 2 * P)]]);
    assert_eq!(c.stack(), [(0x20000, 0x20000 + 2 * P), (0, 2 * P)]);

    let (n, mock) = cache(Policy::None, 4, 0.25);
    for _ in 0..3 {
        assert_eq!(use_once(&n, 0, P), Lookup::Miss);
    }
    assert_eq!(n.stats().registrations, 3);
    assert_eq!(mock.batches.lock().len(), 3);
    assert!(mock.live.lock().is_empty());
}

#[test]
fn many_threads_no_lost_or_double_deregistration() {
    let (c, mock) = cache(Policy::Mrrc, 64, 0.25);
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let c = &c;
            s.spawn(move || {
                let mut x = t + 1;
                for _ in 0..500 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let addr = (x % 64) * P + (x >> 40) % P;
                    let len = 1 + (x >> 20) % (6 * P);
                    let p = c.acquire(addr, len).unwrap();
                    let covered: u64 = p.pieces.iter().map(|p| p.len).sum();
                    assert_eq!(covered, len);
                    c.release(p);
                }
            });
        }
    });
    let s = c.stats();
    assert_eq!(s.lookups(), 4000);
    assert_eq!(s.registrations - s.deregistrations, s.regions);
    assert_eq!(
        mock.live
            .lock()
            .values()
            .map(|&n| u64::from(n))
            .sum::<u64>(),
        s.regions
    );
    drop(c);
    assert!(mock.live.lock().is_empty(), "drop deregisters everything");
}

proptest! {
    /// Pieces tile the request exactly; MRRC regions stay disjoint; capacity holds
    /// whenever nothing is in use; counters add up.
    #[test]
    fn invariants(reqs in proptest::collection::vec((0u64..40, 1u64..5 * P), 1..200),
                  policy in prop_oneof![Just(Policy::Mrrc), Just(Policy::Lru), Just(Policy::None)]) {
        let (c, mock) = cache(policy, 24, 0.25);
        for (page, len) in reqs {
            let addr = page * P + len % 97;
            let p = c.acquire(addr, len).unwrap();
            let mut at = addr;
            for piece in &p.pieces {
                prop_assert_eq!(piece.addr, at);
                at += piece.len;
            }
            prop_assert_eq!(at, addr + len);
            c.release(p);
            let s = c.stats();
            if policy != Policy::None {
                // Over capacity only by what one request pinned while its cached pieces
                // were in use (at most 6 pages here).
                prop_assert!(s.pinned_pages <= 24 + 6, "{} pages pinned", s.pinned_pages);
            }
            prop_assert_eq!(mock.live.lock().values().map(|&n| u64::from(n)).sum::<u64>(), s.regions);
            if policy == Policy::Mrrc {
                let mut stack = c.stack();
                stack.sort();
                for w in stack.windows(2) {
                    prop_assert!(w[0].1 <= w[1].0, "overlapping regions {:?}", w);
                }
            }
        }
    }
}

/// Two threads look up overlapping ranges in a cache of 6 pages, so lookups race
/// registrations (made outside the lock) and evictions. In every interleaving: each
/// lookup's pieces tile its range, a region in use is never deregistered (the mock panics
/// on a double or unknown deregistration, and an evicted piece would be one), MRRC's
/// regions stay disjoint, and what the cache holds is exactly what is registered.
#[cfg(feature = "shuttle")]
#[test]
fn model_cache_lookups_race_evictions() {
    shuttle::check_random(
        || {
            let (c, mock) = cache(Policy::Mrrc, 6, 0.5);
            let c = Arc::new(c);
            let threads: Vec<_> = [(0u64, 3u64), (2, 4)]
                .into_iter()
                .map(|(page, pages)| {
                    let c = c.clone();
                    crate::sync::thread::spawn(move || {
                        for round in 0..2 {
                            let addr = (page + round * 3) * P;
                            let p = c.acquire(addr, pages * P).unwrap();
                            let mut at = addr;
                            for piece in &p.pieces {
                                assert_eq!(piece.addr, at, "pieces do not tile the range");
                                at += piece.len;
                            }
                            assert_eq!(at, addr + pages * P);
                            c.release(p);
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            let mut stack = c.stack();
            stack.sort();
            for w in stack.windows(2) {
                assert!(w[0].1 <= w[1].0, "overlapping regions {w:?}");
            }
            let s = c.stats();
            assert_eq!(s.lookups(), 4);
            let live: u64 = mock.live.lock().values().map(|&n| u64::from(n)).sum();
            assert_eq!(live, s.regions);
        },
        3000,
    );
}
