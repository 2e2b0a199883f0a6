//! The pin-down baseline: a region that covers the request entirely, or a new one; one
//! least-recently-used idle region deregistered per eviction.

use super::*;

impl<G: Registrar> RegCache<G> {
    /// Pin-down cache lookup: a cached region that covers the whole request is a hit;
    /// anything else registers the whole request as a new region.
    pub(super) fn find_lru(
        &self,
        st: &mut State<G::Reg>,
        start: u64,
        end: u64,
    ) -> (Lookup, Vec<Piece>, Vec<(u64, u64)>) {
        // Regions may overlap here, so look at every region starting at or before `start`
        // that reaches `end` (few in practice; a linear scan keeps the baseline simple).
        let found = st
            .entries
            .iter()
            .find(|(_, e)| e.start <= start && e.end >= end)
            .map(|(&id, e)| (id, e.start == start && e.end == end));
        match found {
            Some((id, exact)) => {
                let e = st.entries.get_mut(&id).expect("found");
                e.in_use += 1;
                let p = Self::piece(e, id, true);
                st.recency.promote(&id);
                let how = if exact { Lookup::Hit } else { Lookup::Subset };
                (how, vec![p], Vec::new())
            }
            None => (Lookup::Miss, Vec::new(), vec![(start, end)]),
        }
    }

    /// Pin-down cache eviction: the least recently used idle region, deregistered alone.
    pub(super) fn evict_lru(&self, st: &mut State<G::Reg>, out: &mut Vec<Vec<G::Reg>>) -> usize {
        st.stats.full_events += 1;
        let victim = st
            .recency
            .iter()
            .rev() // least recently used first
            .map(|(id, _)| *id)
            .find(|id| st.entries[id].in_use == 0);
        let Some(id) = victim else { return 0 };
        let pages = st.entries[&id].pages(self.page);
        if let Some(reg) = self.remove(st, id) {
            st.stats.deregistrations += 1;
            st.stats.deregistration_batches += 1;
            st.stats.deregistered_pages += pages;
            out.push(vec![reg]);
        }
        1
    }
}
