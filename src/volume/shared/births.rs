//! Memory servers' births in the shared history ([`Change::Born`]).
//!
//! Why: a memory server that restarted empty makes the volume again, and its memory at the
//! addresses the chunk maps list now holds other extents (or nothing). A held volume's one
//! daemon sees every restart and forgets the copies there; a shared volume's clients each
//! see some, at their own times, and one that joins later sees none. So a client that finds
//! a server's birth (its claim's root, made by the server with the volume) other than the one
//! its caught-up table holds appends the birth, and every client forgets the copies listed
//! there at that one place in the log, as it applies it. A client reads or writes a server
//! only once its table holds the birth its own session there has: at join, before anything
//! is served, and after a reconnect to a server that came back empty, before it is admitted.

use super::*;
use crate::fabric::ServerId;

/// Appends of one birth that may lose to other clients' before it gives up (each loss means
/// another client appended a birth of that server: the next round usually finds it there).
const BIRTH_TRIES: usize = 8;

impl State {
    /// Every server's birth as this client's sessions have them, in the table (at join).
    pub(super) fn record_births(&self, fs: &Fs) -> Result<()> {
        let pool = fs.data().pool();
        for id in 0..pool.claims().len() as u32 {
            // A server down now is reconciled when it is back (`Fs::server_reborn`).
            if pool.is_live(ServerId(id)) {
                self.record_birth(fs, id)?;
            }
        }
        Ok(())
    }

    /// Server `server`'s birth as this client's session there has it (its claim's root), in
    /// the table: appended unless the caught-up table holds it, then applied.
    pub(super) fn record_birth(&self, fs: &Fs, server: u32) -> Result<()> {
        let Some(claim) = fs.data().pool().claim(ServerId(server)) else {
            return Ok(());
        };
        for _ in 0..BIRTH_TRIES {
            self.catch_up(fs, false)?;
            let (known, had) = fs.inspect_meta(|m| {
                let had = m.birth(server);
                (had == Some(&claim.root[..]), had.is_some())
            });
            if known {
                return Ok(());
            }
            // A volume whose history names no birth of this server yet (made by an older
            // rmemfs): its copies there are stale only if this client's claim had to make
            // the volume again.
            match self.append_birth(server, &claim.root, claim.created) {
                Ok(lsn) if had || claim.created => log::warn!(
                    "memory server {server} made the shared volume again (restarted empty): \
                     its new birth is change {lsn}, and the copies listed there before it are \
                     forgotten"
                ),
                Ok(lsn) => {
                    log::info!("memory server {server}: its birth is change {lsn} of the volume")
                }
                Err(EngineError::Conflict { .. }) => {}
                Err(e) => return Err(engine_err(e)),
            }
        }
        Err(Error::new(
            libc::EIO,
            format!("memory server {server}'s birth lost to other clients' {BIRTH_TRIES} times"),
        ))
    }

    /// Appends server `server`'s birth `birth` (a change not in the table: a catch-up applies
    /// it); its place in the log.
    pub(super) fn append_birth(
        &self,
        server: u32,
        birth: &[u8],
        stale: bool,
    ) -> std::result::Result<u64, EngineError> {
        let change = Change::Born {
            server,
            birth: birth.into(),
            stale,
        };
        let record = record::encode(0, std::slice::from_ref(&change));
        let ops = state::ops_of(&[change], false);
        let sent = self
            .appender()
            .append_unapplied(&record, &[touch::server_key(server)], &ops);
        let done = sent.answer?;
        self.check_place(done.lsn, sent.applied)
            .map_err(|e| EngineError::Unavailable(e.message))?;
        Ok(done.lsn)
    }
}
