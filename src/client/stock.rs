//! Extents granted ahead of demand: the stock.
//!
//! A small file's first write needs a fresh extent, and asking a server for one costs a
//! control round trip before the write's own (FRRWP overlaps the registrations, not the
//! allocation's answer). So each server keeps, per extent length asked for recently (up to
//! [`STOCK_MAX_LEN`]), up to [`STOCK_DEPTH`] extents granted in advance: taking one is a
//! bookkeeping step, and a refill goes out at once, answered while the write runs.
//!
//! The stock is this pool's memory on the server (statfs counts it as used; `stats` shows it
//! per server). A server that refuses an allocation for lack of room first gets its stock back
//! (see [`Pool::alloc_on`]). A server that goes down keeps its stock as parked frees (freed if
//! it resumes this pool's session, forgotten if it comes back without it), and a refill
//! answered for a session that is gone is dropped.

use super::{Pool, Server};
use crate::config::{STOCK_DEPTH, STOCK_MAX_LEN};
use crate::fabric::{RemoteRegion, ServerId};
use crate::proto::Message;
use std::collections::BTreeMap;

/// One server's stock: ready extents (address, key) by length, and refills not yet answered.
#[derive(Default)]
pub(super) struct Stock {
    classes: BTreeMap<u64, Class>,
}

#[derive(Default)]
struct Class {
    ready: Vec<(u64, u64)>,
    asked: usize,
}

impl Stock {
    fn take(&mut self, len: u64) -> Option<(u64, u64)> {
        self.classes.get_mut(&len)?.ready.pop()
    }

    fn put(&mut self, len: u64, addr: u64, rkey: u64) {
        self.classes
            .entry(len)
            .or_default()
            .ready
            .push((addr, rkey));
    }

    /// How many refills of `len` to ask for now (counted as asked).
    fn refills_due(&mut self, len: u64) -> usize {
        let c = self.classes.entry(len).or_default();
        let n = STOCK_DEPTH.saturating_sub(c.ready.len() + c.asked);
        c.asked += n;
        n
    }

    fn answered(&mut self, len: u64) {
        if let Some(c) = self.classes.get_mut(&len) {
            c.asked = c.asked.saturating_sub(1);
        }
    }

    /// Every ready extent, taken out (address, key).
    pub(super) fn drain(&mut self) -> Vec<(u64, u64)> {
        self.classes
            .values_mut()
            .flat_map(|c| std::mem::take(&mut c.ready))
            .collect()
    }

    pub(super) fn bytes(&self) -> u64 {
        self.classes
            .iter()
            .map(|(len, c)| len * c.ready.len() as u64)
            .sum()
    }
}

impl Pool {
    /// Fresh extents of `len` bytes from the stock, one on each of up to `n` distinct live
    /// servers in placement order (as [`Pool::alloc_replicas`] would choose), or `None` when
    /// one of them has none in stock (the caller allocates as usual). Either way the stock of
    /// those servers is refilled for `len`.
    pub fn take_stocked(&self, len: u64, n: usize) -> Option<Vec<RemoteRegion>> {
        if len > STOCK_MAX_LEN || len == 0 || STOCK_DEPTH == 0 {
            return None;
        }
        let candidates = self.placement(len);
        let chosen = &candidates[..n.min(candidates.len())];
        if chosen.is_empty() {
            return None;
        }
        let mut got = Vec::with_capacity(chosen.len());
        for &i in chosen {
            if let Some((addr, rkey)) = self.servers[i].stock.lock().take(len) {
                got.push(RemoteRegion {
                    server: ServerId(i as u32),
                    addr,
                    len,
                    rkey,
                });
            }
        }
        for &i in chosen {
            self.refill(&self.servers[i], len);
        }
        if got.len() < chosen.len() {
            for r in &got {
                self.servers[r.server.0 as usize]
                    .stock
                    .lock()
                    .put(len, r.addr, r.rkey);
            }
            return None;
        }
        Some(got)
    }

    /// Asks `s` for extents of `len` until its stock of them (ready and asked) is full; the
    /// answers land in the stock on the reply thread.
    fn refill(&self, s: &Server, len: u64) {
        let n = s.stock.lock().refills_due(len);
        if n == 0 {
            return;
        }
        let session = s.unfreed.lock().session;
        let link = s.link();
        for sent in 0..n {
            let (stock, unfreed) = (s.stock.clone(), s.unfreed.clone());
            let asked = link.control.send_with_handler(
                |tag| Message::Alloc { tag, len },
                Box::new(move |reply| {
                    let mut st = stock.lock();
                    st.answered(len);
                    if let Some(Message::Allocated { addr, rkey, .. }) = reply {
                        // Granted in a session the server no longer holds: not ours to use.
                        if unfreed.lock().session == session {
                            st.put(len, addr, rkey);
                        }
                    }
                }),
            );
            if asked.is_err() {
                let mut st = s.stock.lock();
                for _ in sent..n {
                    st.answered(len);
                }
                drop(st);
                s.mark_failed();
                return;
            }
        }
    }

    /// Gives `s` its stocked extents back (it refused an allocation for lack of room, and
    /// they may make room); whether there were any. The frees go out before anything asked
    /// of `s` after this returns (one connection, served in order).
    pub(super) fn drain_stock(&self, s: &Server) -> bool {
        let ready = s.stock.lock().drain();
        for &(addr, rkey) in &ready {
            if self.send_free(s, addr, rkey).is_err() {
                break;
            }
        }
        !ready.is_empty()
    }

    /// Bytes this pool holds in stock on server `id` (`stats`, tests).
    pub fn stocked_bytes(&self, id: ServerId) -> u64 {
        self.server(id).map_or(0, |s| s.stock.lock().bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::Stock;
    use crate::config::STOCK_DEPTH;

    #[test]
    fn a_class_is_asked_for_up_to_its_depth_counting_what_is_ready_and_asked() {
        let mut s = Stock::default();
        assert_eq!(s.refills_due(4096), STOCK_DEPTH);
        assert_eq!(s.refills_due(4096), 0, "all asked already");
        s.answered(4096);
        s.put(4096, 0x1000, 1);
        assert_eq!(s.refills_due(4096), 0, "one ready, the rest asked");
        s.answered(4096);
        assert_eq!(s.refills_due(4096), 1, "one answered without an extent");
        assert_eq!(s.take(8192), None, "another length has its own class");
        assert_eq!(s.take(4096), Some((0x1000, 1)));
        assert_eq!(s.bytes(), 0);
    }

    #[test]
    fn draining_takes_every_ready_extent_of_every_length() {
        let mut s = Stock::default();
        s.put(4096, 0x1000, 1);
        s.put(8192, 0x2000, 2);
        assert_eq!(s.bytes(), 4096 + 8192);
        let mut d = s.drain();
        d.sort();
        assert_eq!(d, [(0x1000, 1), (0x2000, 2)]);
        assert_eq!(s.bytes(), 0);
        assert_eq!(s.take(4096), None);
    }
}
