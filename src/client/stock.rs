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
//! it resumes this pool's session, forgotten if it comes back without it). Each time the
//! stock is emptied, down or reset, its epoch is bumped, and an extent granted or taken in an
//! earlier epoch (a late refill, a put-back racing the drain) is never stocked again: a server
//! that restarted from its backing file comes back with new keys (verbs), which the stock's
//! old entries would not carry. Such an extent is a parked free of the session it was granted
//! in ([`super::parked::Parked::keep`]): freed if that session resumes (under its new key),
//! forgotten with it. A reset (the server came back without the session) is the same bump.

use super::{Pool, Server};
use crate::config::{STOCK_DEPTH, STOCK_MAX_LEN};
use crate::fabric::{RemoteRegion, ServerId};
use crate::proto::Message;
use std::collections::BTreeMap;

/// One server's stock: ready extents (address, key) by length, and refills not yet answered,
/// for the server session of `epoch`.
#[derive(Default)]
pub(super) struct Stock {
    classes: BTreeMap<u64, Class>,
    epoch: u64,
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

    /// Stocks an extent granted (or taken) in `epoch`; false for one of an earlier epoch,
    /// which the caller parks as a free of its session (see the module doc).
    #[must_use]
    fn put(&mut self, epoch: u64, len: u64, addr: u64, rkey: u64) -> bool {
        if epoch != self.epoch {
            return false;
        }
        self.classes
            .entry(len)
            .or_default()
            .ready
            .push((addr, rkey));
        true
    }

    /// Forgets everything for a new session of the server.
    pub(super) fn reset(&mut self) {
        self.classes.clear();
        self.epoch += 1;
    }

    /// How many refills of `len` to ask for now (counted as asked), and the epoch they are
    /// asked in.
    fn refills_due(&mut self, len: u64) -> (usize, u64) {
        let c = self.classes.entry(len).or_default();
        let n = STOCK_DEPTH.saturating_sub(c.ready.len() + c.asked);
        c.asked += n;
        (n, self.epoch)
    }

    fn answered(&mut self, len: u64) {
        if let Some(c) = self.classes.get_mut(&len) {
            c.asked = c.asked.saturating_sub(1);
        }
    }

    /// Every ready extent, taken out (address, key); from now on nothing granted or taken
    /// before is stocked again.
    pub(super) fn drain(&mut self) -> Vec<(u64, u64)> {
        self.epoch += 1;
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
    /// fewer than `min` servers are live or one of those chosen has none in stock (nothing is
    /// taken then: the caller allocates as usual). Either way the stock of the chosen servers
    /// is refilled for `len`, before the write that uses the extents: sent after it, the
    /// refill's allocation ran beside the next file's write and slowed it more (a 10,000-file
    /// `tar xf` through the ring: write batches of 87 to 96 µs against 69 to 76).
    pub fn take_stocked(&self, len: u64, n: usize, min: usize) -> Option<Vec<RemoteRegion>> {
        if len > STOCK_MAX_LEN || len == 0 || STOCK_DEPTH == 0 || self.follows() {
            return None;
        }
        let candidates = self.placement(len);
        let chosen = &candidates[..n.min(candidates.len())];
        if chosen.is_empty() || chosen.len() < min {
            return None;
        }
        let mut got = Vec::with_capacity(chosen.len());
        for &i in chosen {
            let s = &self.servers[i];
            // The session before the epoch: a reset between the two shows as a newer session.
            let session = s.unfreed.lock().session;
            let mut stock = s.stock.lock();
            if let Some((addr, rkey)) = stock.take(len) {
                let region = RemoteRegion {
                    server: ServerId(i as u32),
                    addr,
                    len,
                    rkey,
                };
                got.push((region, stock.epoch, session));
            }
        }
        let taken = got.len() == chosen.len();
        if !taken {
            // Put back before the refill counts what is ready.
            for (r, epoch, session) in &got {
                let s = &self.servers[r.server.0 as usize];
                let stocked = s.stock.lock().put(*epoch, len, r.addr, r.rkey);
                if !stocked {
                    s.unfreed.lock().keep(*session, r.addr, r.rkey);
                }
            }
        }
        for &i in chosen {
            self.refill(&self.servers[i], len);
        }
        taken.then(|| got.into_iter().map(|(r, ..)| r).collect())
    }

    /// Asks `s` for extents of `len` until its stock of them (ready and asked) is full; the
    /// answers land in the stock on the reply thread.
    /// The epoch and the link are read under the stock's lock: a server that came back
    /// without the session has its stock reset before its new link is published, so a refill
    /// sent on the new link always carries the new epoch.
    fn refill(&self, s: &Server, len: u64) {
        let session = s.unfreed.lock().session;
        let (n, epoch, link) = {
            let mut st = s.stock.lock();
            let (n, epoch) = st.refills_due(len);
            (n, epoch, s.link())
        };
        if n == 0 {
            return;
        }
        for sent in 0..n {
            let (stock, unfreed) = (s.stock.clone(), s.unfreed.clone());
            let asked = link.control.send_with_handler(
                |tag| Message::Alloc { tag, len },
                Box::new(move |reply| {
                    let late = {
                        let mut st = stock.lock();
                        st.answered(len);
                        match reply {
                            Some(Message::Allocated {
                                addr,
                                rkey,
                                len: granted,
                                ..
                            }) if granted == len => {
                                (!st.put(epoch, len, addr, rkey)).then_some((addr, rkey))
                            }
                            _ => None,
                        }
                    };
                    // Granted after the stock was drained: freed with the session's frees.
                    if let Some((addr, rkey)) = late {
                        unfreed.lock().keep(session, addr, rkey);
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
        for (i, &(addr, rkey)) in ready.iter().enumerate() {
            if self.send_free(s, addr, rkey).is_err() {
                // That one was parked by send_free; the rest are parked here, for a resumed
                // session.
                s.unfreed
                    .lock()
                    .keep_current(ready[i + 1..].iter().copied());
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
        assert_eq!(s.refills_due(4096), (STOCK_DEPTH, 0));
        assert_eq!(s.refills_due(4096).0, 0, "all asked already");
        s.answered(4096);
        assert!(s.put(0, 4096, 0x1000, 1));
        assert_eq!(s.refills_due(4096).0, 0, "one ready, the rest asked");
        s.answered(4096);
        assert_eq!(s.refills_due(4096).0, 1, "one answered without an extent");
        assert_eq!(s.take(8192), None, "another length has its own class");
        assert_eq!(s.take(4096), Some((0x1000, 1)));
        assert_eq!(s.bytes(), 0);
    }

    #[test]
    fn draining_takes_every_ready_extent_of_every_length() {
        let mut s = Stock::default();
        assert!(s.put(0, 4096, 0x1000, 1));
        assert!(s.put(0, 8192, 0x2000, 2));
        assert_eq!(s.bytes(), 4096 + 8192);
        let mut d = s.drain();
        d.sort();
        assert_eq!(d, [(0x1000, 1), (0x2000, 2)]);
        assert_eq!(s.bytes(), 0);
        assert_eq!(s.take(4096), None);
    }

    #[test]
    fn after_a_reset_an_extent_of_the_earlier_session_is_not_stocked() {
        let mut s = Stock::default();
        let (_, asked_in) = s.refills_due(4096);
        assert!(s.put(asked_in, 4096, 0x1000, 1));
        let taken = s.take(4096).unwrap();
        s.reset();
        // A late refill answer, and a put-back of what was taken before the reset.
        assert!(!s.put(asked_in, 4096, 0x2000, 2));
        assert!(!s.put(asked_in, 4096, taken.0, taken.1));
        assert_eq!(s.bytes(), 0);
        let (n, epoch) = s.refills_due(4096);
        assert_eq!(
            (n, epoch),
            (STOCK_DEPTH, asked_in + 1),
            "asked afresh in the new session"
        );
        assert!(s.put(epoch, 4096, 0x3000, 3));
        assert_eq!(s.take(4096), Some((0x3000, 3)));
    }

    /// A refill answered after the server went down (its stock drained) carries the key of a
    /// server process that may be gone by the time it is taken: it is handed back to be
    /// parked, never stocked; a put-back of an extent taken before the drain likewise.
    #[test]
    fn nothing_granted_or_taken_before_a_drain_is_stocked_after_it() {
        let mut st = Stock::default();
        let (_, epoch) = st.refills_due(4096);
        assert!(st.put(epoch, 4096, 0x1000, 7));
        assert!(st.put(epoch, 4096, 0x2000, 8));
        let taken = st.take(4096).expect("stocked");
        assert_eq!(st.drain(), vec![(0x1000, 7)]);
        assert!(!st.put(epoch, 4096, 0x3000, 9), "a refill answered late");
        assert!(
            !st.put(epoch, 4096, taken.0, taken.1),
            "a put-back after the drain"
        );
        assert_eq!(st.take(4096), None);
        let (_, fresh) = st.refills_due(4096);
        assert!(st.put(fresh, 4096, 0x4000, 10), "granted after the drain");
    }
}
