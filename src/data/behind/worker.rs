//! The write-behind worker's round ([`DataStore::flush_queued`]): the files with a waiting
//! write sent in batches of remote writes, one per set of servers they go to; also how
//! `send_all_behind` sends what waits without waiting for a lock.

use super::*;

impl DataStore {
    /// The worker's round: waits up to `wait` for files with a waiting write and sends
    /// theirs, in batches of remote writes, one per set of servers they go to; how many were
    /// sent. A batch holds its files' locks until its slowest write is done, so grouping by
    /// servers keeps a server that does not answer from holding up files with no copy on it.
    pub fn flush_queued(&self, wait: Duration) -> usize {
        let Some(wb) = &self.behind else {
            std::thread::sleep(wait);
            return 0;
        };
        let mut batch: Vec<Arc<FileData>> = {
            let mut queue = wb.queue.lock();
            if queue.is_empty() {
                queue = wb.queued.wait_timeout(queue, wait).0;
            }
            queue.drain(..).collect()
        };
        for f in &batch {
            wb.unqueue(f);
        }
        batch.retain(|f| wb.has_waiting(f));
        let (sent, busy) = self.send_batches(wb, batch, true);
        // A file whose lock is held goes back in the queue (its holder may also have sent
        // its write).
        for file in busy {
            wb.enqueue(&file);
        }
        sent
    }

    /// Sends the waiting writes of `files`, in batches of remote writes, one per set of
    /// servers they go to; returns how many it sent and the files whose lock another thread
    /// held. The first file of a batch's lock is waited for if `wait_first`, the others'
    /// only taken if free (and kept if their writes go to the same servers): so this never
    /// waits on a lock while it holds another.
    pub(super) fn send_batches(
        &self,
        wb: &WriteBehind,
        mut files: Vec<Arc<FileData>>,
        wait_first: bool,
    ) -> (usize, Vec<Arc<FileData>>) {
        files.sort_by_key(|f| key(f));
        files.dedup_by_key(|f| key(f));
        let mut left: Vec<usize> = (0..files.len()).collect();
        let (mut sent, mut busy) = (0, Vec::new());
        while let Some((&first, others)) = left.split_first() {
            let guard = match wait_first {
                true => files[first].chunks.write(),
                false => match files[first].chunks.try_write() {
                    Some(g) => g,
                    None => {
                        busy.push(files[first].clone());
                        left = others.to_vec();
                        continue;
                    }
                },
            };
            let servers = self.waiting_servers(wb, &files[first], &guard);
            let mut group = vec![(&*files[first], guard)];
            let mut next = Vec::new();
            for &i in others {
                match files[i].chunks.try_write() {
                    Some(g) if self.waiting_servers(wb, &files[i], &g) == servers => {
                        group.push((&*files[i], g))
                    }
                    Some(_) => next.push(i),
                    None => busy.push(files[i].clone()),
                }
            }
            sent += self.send_batch(wb, &mut group);
            drop(group);
            self.free_retired();
            left = next;
        }
        (sent, busy)
    }

    /// The servers `file`'s waiting write goes to (its chunks' copies), sorted.
    fn waiting_servers(&self, wb: &WriteBehind, file: &FileData, chunks: &ChunkMap) -> Vec<u32> {
        let Some(w) = wb.peek_waiting(file) else {
            return Vec::new();
        };
        let mut servers: Vec<u32> = self
            .pieces(w.offset, w.len)
            .filter_map(|(idx, ..)| chunks.get(&idx))
            .flat_map(|c| c.replicas().iter().map(|r| r.server).collect::<Vec<_>>())
            .collect();
        servers.sort_unstable();
        servers.dedup();
        servers
    }

    /// Sends the waiting writes of the locked files `held` in one batch of remote writes;
    /// if it fails, file by file through [`Self::write_window`] (which takes failed copies
    /// out and writes again), so each file gets its own outcome.
    fn send_batch<'f>(
        &self,
        wb: &WriteBehind,
        held: &mut [(&'f FileData, crate::sync::RwLockWriteGuard<'_, ChunkMap>)],
    ) -> usize {
        let mut todo = Vec::new();
        for (i, (file, chunks)) in held.iter_mut().enumerate() {
            let file: &'f FileData = file;
            let Some(sending) = wb.take_waiting(file) else {
                continue;
            };
            wb.counts.by_worker.fetch_add(1, Ordering::Relaxed);
            // Chunks on servers that went down lose those copies first (as every write does).
            let w = sending.w;
            let healed = self
                .pieces(w.offset, w.len)
                .try_for_each(|(idx, ..)| self.heal(chunks, idx));
            match healed {
                Ok(()) => todo.push((i, sending)),
                Err(e) => sending.settle(Err(e)),
            }
        }
        let mut ops = Vec::new();
        for (i, sending) in &todo {
            let w = sending.w;
            ops.extend(self.window_ops(&held[*i].1, w.offset, wb.slot_addr(w.slot), w.len));
        }
        let arena = (wb.arena.addr(), wb.arena.len() as u64);
        let together = !ops.is_empty()
            && self
                .pin(arena.0, arena.1)
                .is_ok_and(|pinned| self.run_ops(pinned, &ops).is_ok());
        let n = todo.len();
        for (i, sending) in todo {
            let w = sending.w;
            let res = if together {
                Ok(())
            } else {
                self.write_window(&mut held[i].1, w.offset, wb.slot_addr(w.slot), w.len)
            };
            sending.settle(res);
        }
        n
    }
}
