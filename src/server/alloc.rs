//! Extent allocation inside a server's arena: best fit over a free list kept twice, by offset
//! (to coalesce neighbours on free) and by size (to find the best fit and the largest free
//! extent in O(log n)). Offsets and lengths are multiples of the page size, because each extent
//! is registered (pinned) on its own and pinning works on pages.

use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug)]
pub struct ExtentAllocator {
    total: u64,
    align: u64,
    free_bytes: u64,
    by_offset: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
}

impl ExtentAllocator {
    /// An allocator over `[0, total)` handing out multiples of `align` (a power of two).
    pub fn new(total: u64, align: u64) -> Self {
        assert!(align.is_power_of_two());
        let total = total & !(align - 1);
        let mut a = ExtentAllocator {
            total,
            align,
            free_bytes: 0,
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
        };
        if total > 0 {
            a.insert_free(0, total);
        }
        a
    }

    /// The length actually reserved for a request of `len` bytes.
    pub fn rounded(&self, len: u64) -> Option<u64> {
        len.checked_add(self.align - 1)
            .map(|v| v & !(self.align - 1))
    }

    fn insert_free(&mut self, off: u64, len: u64) {
        self.by_offset.insert(off, len);
        self.by_size.insert((len, off));
        self.free_bytes += len;
    }

    fn remove_free(&mut self, off: u64, len: u64) {
        self.by_offset.remove(&off);
        self.by_size.remove(&(len, off));
        self.free_bytes -= len;
    }

    /// Reserves `len` bytes (rounded up); returns `(offset, reserved_len)`.
    pub fn alloc(&mut self, len: u64) -> Option<(u64, u64)> {
        let len = self.rounded(len.max(1))?;
        let &(flen, off) = self.by_size.range((len, 0)..).next()?;
        self.remove_free(off, flen);
        if flen > len {
            self.insert_free(off + len, flen - len);
        }
        Some((off, len))
    }

    /// Takes exactly `[off, off+len)` out of the free list (a backed server's restart takes
    /// back the extents its table lists). False if any of it is not free.
    pub fn take(&mut self, off: u64, len: u64) -> bool {
        if len == 0 || !off.is_multiple_of(self.align) || !len.is_multiple_of(self.align) {
            return false;
        }
        let Some((&foff, &flen)) = self.by_offset.range(..=off).next_back() else {
            return false;
        };
        if foff + flen < off + len {
            return false;
        }
        self.remove_free(foff, flen);
        if foff < off {
            self.insert_free(foff, off - foff);
        }
        if off + len < foff + flen {
            self.insert_free(off + len, foff + flen - off - len);
        }
        true
    }

    /// The free ranges, as `(offset, len)` in offset order.
    pub fn free_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_offset.iter().map(|(&o, &l)| (o, l))
    }

    /// Returns `[off, off+len)` to the free list, merging with free neighbours.
    pub fn free(&mut self, off: u64, len: u64) {
        debug_assert!(
            off.is_multiple_of(self.align)
                && len.is_multiple_of(self.align)
                && off + len <= self.total
        );
        let (mut start, mut end) = (off, off + len);
        if let Some((&poff, &plen)) = self.by_offset.range(..off).next_back() {
            debug_assert!(poff + plen <= off, "double free at {off:#x}");
            if poff + plen == off {
                self.remove_free(poff, plen);
                start = poff;
            }
        }
        if let Some(&nlen) = self.by_offset.get(&end) {
            self.remove_free(end, nlen);
            end += nlen;
        }
        self.insert_free(start, end - start);
    }

    pub fn total(&self) -> u64 {
        self.total
    }
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }
    pub fn largest_free(&self) -> u64 {
        self.by_size.last().map(|&(l, _)| l).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn best_fit_and_coalescing() {
        let mut a = ExtentAllocator::new(16 * 4096, 4096);
        let (x, _) = a.alloc(4096).unwrap();
        let (y, ylen) = a.alloc(3 * 4096).unwrap();
        let (z, _) = a.alloc(1).unwrap();
        assert_eq!((x, y, ylen, z), (0, 4096, 3 * 4096, 4 * 4096));
        a.free(y, ylen);
        // A 2-page request fits best into the 3-page hole, not the 11-page tail.
        assert_eq!(a.alloc(2 * 4096).unwrap().0, 4096);
        a.free(4096, 2 * 4096);
        a.free(x, 4096);
        a.free(z, 4096);
        assert_eq!(a.free_bytes(), 16 * 4096);
        assert_eq!(a.largest_free(), 16 * 4096);
        assert!(a.alloc(17 * 4096).is_none());
    }

    #[test]
    fn take_carves_exact_ranges() {
        let mut a = ExtentAllocator::new(16 * 4096, 4096);
        assert!(a.take(4 * 4096, 2 * 4096));
        assert!(!a.take(5 * 4096, 4096), "taken twice");
        assert!(!a.take(15 * 4096, 2 * 4096), "past the end");
        assert!(a.take(0, 4096));
        assert_eq!(a.free_bytes(), 13 * 4096);
        let ranges: Vec<_> = a.free_ranges().collect();
        assert_eq!(ranges, vec![(4096, 3 * 4096), (6 * 4096, 10 * 4096)]);
        a.free(4 * 4096, 2 * 4096);
        a.free(0, 4096);
        assert_eq!(a.largest_free(), 16 * 4096);
    }

    proptest! {
        /// Random alloc/free: extents never overlap, accounting adds up, and freeing
        /// everything restores one extent.
        #[test]
        fn never_overlaps(ops in proptest::collection::vec((any::<bool>(), 1u64..20_000), 1..200)) {
            let mut a = ExtentAllocator::new(64 * 4096, 4096);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (is_alloc, n) in ops {
                if is_alloc || live.is_empty() {
                    if let Some((off, len)) = a.alloc(n) {
                        prop_assert!(len >= n && off + len <= a.total());
                        for &(o, l) in &live {
                            prop_assert!(off + len <= o || o + l <= off);
                        }
                        live.push((off, len));
                    } else {
                        prop_assert!(a.largest_free() < a.rounded(n).unwrap());
                    }
                } else {
                    let (off, len) = live.swap_remove(n as usize % live.len());
                    a.free(off, len);
                }
                let used: u64 = live.iter().map(|e| e.1).sum();
                prop_assert_eq!(a.free_bytes() + used, a.total());
            }
            for (off, len) in live { a.free(off, len); }
            prop_assert_eq!(a.largest_free(), a.total());
        }
    }
}
