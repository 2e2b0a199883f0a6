//! MRRC's own part (Ou/He/Han, JNCA 2009, §5): lookups that reuse a covering or overlapping
//! region, and the MRE replacement that deregisters the whole eviction segment in one batch.

use super::*;

impl<G: Registrar> RegCache<G> {
    /// MRRC lookup: exact, subset, overlap (cached parts reused, gaps to register) or miss.
    pub(super) fn find_mrrc(
        &self,
        st: &mut State<G::Reg>,
        start: u64,
        end: u64,
    ) -> (Lookup, Vec<Piece>, Vec<(u64, u64)>) {
        // Cached regions intersecting [start, end): disjoint, so walk from the last one that
        // starts before `end`.
        let mut hits: Vec<u64> = Vec::new();
        for (_, &id) in st.by_start.range(..end).rev() {
            let e = &st.entries[&id];
            if e.end <= start {
                break;
            }
            hits.push(id);
        }
        hits.reverse();
        if hits.is_empty() {
            return (Lookup::Miss, Vec::new(), vec![(start, end)]);
        }
        let mut pieces = Vec::new();
        let mut gaps = Vec::new();
        let mut at = start;
        for &id in &hits {
            let e = st.entries.get_mut(&id).expect("indexed");
            if e.start > at {
                gaps.push((at, e.start));
            }
            at = at.max(e.end);
            e.in_use += 1;
            pieces.push(Self::piece(e, id, true));
        }
        if at < end {
            gaps.push((at, end));
        }
        // Covered without a gap needs no registration: a hit (exact when one region matches
        // the request exactly, a subset otherwise, adjacent regions included).
        let lookup = if !gaps.is_empty() {
            Lookup::Overlap
        } else if hits.len() == 1
            && st.entries[&hits[0]].start == start
            && st.entries[&hits[0]].end == end
        {
            Lookup::Hit
        } else {
            Lookup::Subset
        };
        for &id in &hits {
            Self::to_top(st, id);
        }
        (lookup, pieces, gaps)
    }

    /// MRE replacement (Fig. 4): resort the resorting section by eviction factor and
    /// deregister the eviction segment in one batch. Returns the number of regions evicted.
    pub(super) fn mre(&self, st: &mut State<G::Reg>, out: &mut Vec<Vec<G::Reg>>) -> usize {
        st.stats.full_events += 1;
        let n = st.stack.len();
        if n == 0 {
            return 0;
        }
        let frequent = ((n as f64 * self.config.frequent_share).floor() as usize).min(n - 1);
        let resort_len = n - frequent;
        let bottom = *st.stack.last().expect("non-empty");
        st.r = st.entries[&bottom].evictfact;
        let r = st.r;
        let page = self.page;
        for &id in &st.stack[frequent..] {
            let e = st.entries.get_mut(&id).expect("stacked");
            if e.evictfact == 0.0 {
                e.evictfact = r + 1.0 / e.pages(page) as f64;
            }
        }
        // Largest factor nearest the top, smallest at the bottom; ties keep stack order.
        let mut section: Vec<u64> = st.stack[frequent..].to_vec();
        section.sort_by(|a, b| {
            let (fa, fb) = (st.entries[a].evictfact, st.entries[b].evictfact);
            fb.total_cmp(&fa)
        });
        st.stack.truncate(frequent);
        st.stack.extend_from_slice(&section);
        let segment =
            ((resort_len as f64 * self.config.eviction_share).ceil() as usize).clamp(1, resort_len);
        let mut victims: Vec<u64> = st.stack[n - segment..]
            .iter()
            .copied()
            .filter(|id| st.entries[id].in_use == 0)
            .collect();
        if victims.is_empty() {
            // Every region of the eviction segment is in use: take the lowest idle ones of
            // the resorting section instead, as many as the segment holds.
            victims = st.stack[frequent..]
                .iter()
                .rev()
                .copied()
                .filter(|id| st.entries[id].in_use == 0)
                .take(segment)
                .collect();
        }
        let mut regs = Vec::with_capacity(victims.len());
        let mut pages = 0;
        for id in &victims {
            pages += st.entries[id].pages(page);
            if let Some(reg) = self.remove(st, *id) {
                regs.push(reg);
            }
        }
        if !regs.is_empty() {
            st.stats.deregistrations += regs.len() as u64;
            st.stats.deregistration_batches += 1;
            st.stats.deregistered_pages += pages;
            out.push(regs);
        }
        victims.len()
    }
}
