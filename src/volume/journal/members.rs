//! Membership (`rmemfs admin add-server`, `drain`, `remove`) as the journal sees it: the
//! root names every server the volume's records may name, by the pool's index.

use super::*;

impl VolumeJournal {
    /// Names the server that joined the pool as `id` at `addr` in the root, before anything
    /// of the volume is placed there.
    pub fn add_member(&self, id: u32, addr: &str) -> Result<()> {
        let mut w = self.shared.writer.lock();
        let mut root = w.root.clone();
        match root.servers.get(id as usize) {
            Some(name) if !name.is_empty() => {
                return Err(eio(format!(
                    "the volume's root names a server#{id} already ({name})"
                )))
            }
            // A removed server's place (an empty name), taken again.
            Some(_) => root.servers[id as usize] = addr.to_string(),
            None => {
                // Removed servers keep their place, so indexes never move.
                root.servers.resize(id as usize, String::new());
                root.servers.push(addr.to_string());
            }
        }
        w.publish(root).map_err(eio)
    }

    /// Moves the journal ring and checkpoint off draining servers (a checkpoint to the
    /// others); false if none was there.
    pub fn move_off_draining(&self) -> Result<bool> {
        let mut w = self.shared.writer.lock();
        let on_draining = w
            .root
            .ring
            .iter()
            .chain(&w.root.checkpoint)
            .any(|p| w.pool.is_draining(ServerId(p.server)));
        if !on_draining {
            return Ok(false);
        }
        self.shared.checkpoint_now(&mut w)?;
        Ok(true)
    }

    /// Forgets drained server `id`: a checkpoint first (so no record left in the ring names
    /// it), then its name leaves the root; a later attach does not look for it.
    pub fn forget_member(&self, id: u32) -> Result<()> {
        let mut w = self.shared.writer.lock();
        self.shared.checkpoint_now(&mut w)?;
        let mut root = w.root.clone();
        if let Some(name) = root.servers.get_mut(id as usize) {
            name.clear();
        }
        w.publish(root).map_err(eio)
    }
}
