//! What reads every file the table holds: the rebuild's, the drain's and the encoder's
//! lists, the copies in use (what an evicted client left is what no file names), the
//! replica health `stats` shows. A shared client holding part of the namespace holds part
//! of these too: their callers wait for the whole table (`volume::shared`'s loads).

use super::Fs;
use crate::meta::{FileData, Ino};
use crate::sync::Arc;

impl Fs {
    /// Every regular file's data, taken under the table's lock (released on return).
    pub fn files(&self) -> Vec<Arc<FileData>> {
        self.files_by_ino().into_iter().map(|(_, f)| f).collect()
    }

    /// Every regular file's data with its inode number (for [`Fs::commit_extents`]).
    pub fn files_by_ino(&self) -> Vec<(Ino, Arc<FileData>)> {
        self.meta
            .lock()
            .files()
            .map(|(i, f)| (i, f.clone()))
            .collect()
    }

    /// Every copy the table's files name, as (server, address): memory in use.
    pub fn named_extents(&self) -> std::collections::HashSet<(u32, u64)> {
        let mut named = std::collections::HashSet::new();
        for (_, f) in self.files_by_ino() {
            let view = self.data.view(&f);
            for c in view.values() {
                named.extend(c.extents().iter().map(|r| (r.server, r.addr)));
            }
        }
        named
    }

    /// Chunks by how many of their copies are on live servers. Taken file by file (the
    /// table's lock is not held while a file's chunk map is read).
    pub fn replica_health(&self) -> crate::data::ReplicaHealth {
        let mut health = crate::data::ReplicaHealth::default();
        for f in self.files() {
            self.data.view(&f).health(&mut health);
        }
        health
    }
}
