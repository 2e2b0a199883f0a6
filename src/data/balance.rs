//! Rebalancing (`rmemfs admin add-server --rebalance`): copies moved from the fullest servers
//! to the emptiest until every server in placement is within a tolerance of the mean used
//! fraction. A move writes the new copy before the old one goes, as a drain does, so a chunk
//! never has fewer copies than before.

use super::*;

/// What a rebalance knows of each server as it moves copies: bytes used and total, and
/// whether copies may go there (live and in placement). Kept by the caller, updated by each
/// move, so a pass does not ask the servers after every chunk.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    pub used: Vec<u64>,
    pub total: Vec<u64>,
    pub placeable: Vec<bool>,
}

impl Ledger {
    /// The pool's servers as last heard (ask with [`Pool::refresh`] first).
    pub fn of(pool: &Pool) -> Ledger {
        let mut l = Ledger::default();
        for s in pool.status() {
            l.used.push(s.capacity.total - s.capacity.free);
            l.total.push(s.capacity.total);
            l.placeable.push(!s.failed && !s.draining);
        }
        l
    }

    fn fraction(&self, i: usize) -> f64 {
        self.used[i] as f64 / self.total[i].max(1) as f64
    }

    /// The used fraction of the servers in placement together.
    pub fn mean(&self) -> f64 {
        let (mut used, mut total) = (0u64, 0u64);
        for i in self.indexes() {
            used += self.used[i];
            total += self.total[i];
        }
        used as f64 / total.max(1) as f64
    }

    fn indexes(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.used.len()).filter(|&i| self.placeable[i])
    }

    /// Every server in placement within `tolerance` (relative) of the mean fraction.
    pub fn balanced(&self, tolerance: f64) -> bool {
        let mean = self.mean();
        self.indexes()
            .all(|i| (self.fraction(i) - mean).abs() <= tolerance * mean)
    }

    /// Each server's used fraction (placeable ones; others `None`).
    pub fn fractions(&self) -> Vec<Option<f64>> {
        (0..self.used.len())
            .map(|i| self.placeable[i].then(|| self.fraction(i)))
            .collect()
    }

    /// The move of a `len`-byte copy that most evens the servers out, among those of a chunk
    /// held on `holders`: from the fullest holder above the mean to the emptiest server
    /// below it that holds none, if the move narrows their gap (so moves never go back and
    /// forth).
    fn best_move(&self, holders: &[u32], len: u64) -> Option<(u32, usize)> {
        let mean = self.mean();
        let from = holders
            .iter()
            .map(|&h| h as usize)
            .filter(|&h| h < self.used.len() && self.placeable[h] && self.fraction(h) > mean)
            .max_by(|&a, &b| self.fraction(a).total_cmp(&self.fraction(b)))?;
        let to = self
            .indexes()
            .filter(|&i| !holders.contains(&(i as u32)) && self.fraction(i) < mean)
            .min_by(|&a, &b| self.fraction(a).total_cmp(&self.fraction(b)))?;
        let after_from =
            (self.used[from] - len.min(self.used[from])) as f64 / self.total[from].max(1) as f64;
        let after_to = (self.used[to] + len) as f64 / self.total[to].max(1) as f64;
        // The gap after the move must be narrower than before.
        let gap = self.fraction(from) - self.fraction(to);
        ((after_from - after_to).abs() < gap).then_some((from as u32, to))
    }
}

impl DataStore {
    /// Moves one copy of chunk `idx` toward balance (see [`Ledger::best_move`]), updating
    /// `ledger`; the bytes copied (0: no move helps, or the copy failed).
    pub(super) fn balance_chunk(
        &self,
        chunks: &mut ChunkMap,
        idx: u64,
        ledger: &mut Ledger,
    ) -> u64 {
        chunks
            .update(idx, |c| {
                if c.stripe().is_some() {
                    return 0; // a stripe's fragments stay where the encoder put them
                }
                let holders: Vec<u32> = c.replicas().iter().map(|r| r.server).collect();
                if holders.iter().any(|&h| !self.pool.is_live(ServerId(h))) {
                    return 0; // the rebuild's to mend first
                }
                let Some((from, to)) = ledger.best_move(&holders, c.len) else {
                    return 0;
                };
                let mut new = match self.pool.alloc_on(ServerId(to as u32), c.len) {
                    Ok(r) => vec![r],
                    Err(e) => {
                        log::debug!("chunk {idx} stays: no room on server#{to}: {e}");
                        ledger.placeable[to] = false;
                        return 0;
                    }
                };
                let buf = self.repair_buf.lock();
                if let Err(e) = self.copy_chunk(c, &mut new, &buf) {
                    self.pool.free_all(&new);
                    log::warn!("chunk {idx} stays: copying it failed: {e}");
                    return 0;
                }
                // The leaving copy goes first, so the new one has a slot (a chunk with four
                // copies has none free); both in this one change of the map. `to` holds
                // none of the chunk (`best_move`), so the new copy is listed.
                self.let_go(c, from);
                let listed = c.add(replica(&new[0]));
                debug_assert!(listed, "chunk {idx}: a moved copy onto a holder");
                ledger.used[to] += c.len;
                ledger.used[from as usize] -= c.len.min(ledger.used[from as usize]);
                c.len
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::Ledger;

    fn ledger(used: &[u64]) -> Ledger {
        Ledger {
            used: used.to_vec(),
            total: vec![100; used.len()],
            placeable: vec![true; used.len()],
        }
    }

    #[test]
    fn a_copy_moves_from_the_fullest_holder_to_the_emptiest_other_server() {
        let l = ledger(&[60, 50, 0]);
        assert_eq!(l.best_move(&[0, 1], 10), Some((0, 2)));
        // The emptiest holds it already, and the other is above the mean: no move.
        assert_eq!(l.best_move(&[0, 2], 10), None);
        assert!(!l.balanced(0.1));
        let even = ledger(&[40, 40, 38]);
        assert!(even.balanced(0.1));
        assert_eq!(
            even.best_move(&[0, 1], 10),
            None,
            "a move would widen the gap"
        );
    }
}
