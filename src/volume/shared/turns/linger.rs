//! Turns going back: a give-back at the engine recorded as running until its answer (so no
//! take or claim answered meanwhile vouches for the turn), and the lingering thread, which
//! gives back in one request the turns idle, about to run out, or asked for by another
//! client (the engine tells it at once), and sends the writes held back too long.

use super::*;
use crate::volume::shared::keeper;

impl State {
    /// Gives the turns of `inos` (marked `giving`) back, and forgets them; the writes held
    /// back go first (kept, with the turns, if the engine does not take them).
    pub(super) fn give_back(&self, inos: &[Ino]) {
        if let Err(e) = self.send_behind() {
            log::warn!("shared volume: turns kept: writes held back: {}", e.message);
            let mut t = self.turns.lock();
            for ino in inos {
                if let Some(h) = t.map.get_mut(ino) {
                    h.giving = false;
                }
            }
            drop(t);
            self.given.notify_all();
            return;
        }
        let mut t = self.give_at_engine(self.turns.lock(), inos);
        for ino in inos {
            if t.map.remove(ino).is_some_and(|h| h.wanted) {
                t.contest(*ino);
            }
        }
        drop(t);
        self.given.notify_all();
    }

    /// Gives back turns another client asked for that this client does not record as held:
    /// the engine gave them with an append or a take whose answer is not recorded yet (or
    /// never will be: it was given back meanwhile). The engine gives back only its holder's,
    /// so one another client holds by now stays its; the answer, when recorded, finds the
    /// give-back and does not vouch for the turn. Before, the asker waited for the turn to
    /// run out (its lease).
    fn give_back_unrecorded(&self, inos: &[Ino]) {
        let t = self.turns.lock();
        let inos: Vec<Ino> = inos
            .iter()
            .copied()
            .filter(|i| !t.map.contains_key(i))
            .collect();
        let mut t = self.give_at_engine(t, &inos);
        for ino in &inos {
            t.contest(*ino);
        }
        drop(t);
        self.given.notify_all();
    }

    /// Gives the turns of `inos` back at the engine, the give-back recorded as running from
    /// under `t` (so no take recorded after that lock vouches for them) until the engine's
    /// answer; returns the turns' lock, taken again after it.
    fn give_at_engine<'a>(
        &'a self,
        mut t: MutexGuard<'a, HeldTurns>,
        inos: &[Ino],
    ) -> MutexGuard<'a, HeldTurns> {
        t.giving_back(inos);
        drop(t);
        let answered = self.engine.give_turns(&self.who, inos);
        if let Err(e) = &answered {
            log::warn!("giving turns back: {e} (they run out by themselves)");
        }
        let mut t = self.turns.lock();
        t.given_back(inos, answered.is_ok());
        t
    }

    /// Gives every turn back (leaving the volume).
    pub(crate) fn give_all(&self) {
        let all: Vec<Ino> = self.turns.lock().map.keys().copied().collect();
        if !all.is_empty() {
            self.give_back(&all);
        }
    }
}

/// The lingering thread: gives back, in one request, the turns idle for [`TURN_LINGER`], about
/// to run out, or asked for by another client, which the engine tells it at once (it waits
/// on [`MetaEngine::wanted`] between rounds).
pub(crate) fn linger_loop(s: &State) {
    while !s.stop.load(Ordering::SeqCst) {
        // Woken by a turn asked for; else in time to give back wanted turns once kept
        // long enough, and idle ones.
        let wait = {
            let t = s.turns.lock();
            t.map
                .values()
                .filter(|h| h.wanted && !h.giving)
                .map(|h| (h.taken + TURN_MIN_HOLD).saturating_duration_since(Instant::now()))
                .min()
                .unwrap_or(TURN_LINGER / 2)
                .clamp(Duration::from_micros(100), TURN_LINGER / 2)
        };
        let asked = match s.engine.wanted(&s.who, wait) {
            Ok(asked) => asked,
            Err(e) => {
                log::warn!("shared volume: hearing which turns are wanted: {e}");
                std::thread::sleep(TURN_LINGER);
                Vec::new()
            }
        };
        give_due(s, asked);
    }
}

/// Gives back, in one request, the turns `asked` for by other clients (once kept long
/// enough) and those idle or about to run out; and the writes held back too long.
pub(super) fn give_due(s: &State, asked: Vec<Ino>) {
    let now = Instant::now();
    let paused = s.linger_paused.load(Ordering::SeqCst);
    let mut unrecorded = Vec::new();
    let give: Vec<Ino> = {
        let mut t = s.turns.lock();
        for ino in asked {
            match t.map.get_mut(&ino) {
                Some(h) => h.wanted = true,
                // A role is no inode's turn: asked for by a member refused it, it stays
                // this member's until its work is done or its lease runs out (given away
                // here, two members would rebuild, or write a checkpoint, at once).
                None if keeper::is_role(ino) => {}
                None => unrecorded.push(ino),
            }
        }
        if paused {
            unrecorded.clear();
            Vec::new()
        } else {
            t.map
                .iter_mut()
                .filter(|(_, h)| {
                    h.users == 0
                        && !h.giving
                        && (h.wanted
                            || h.until <= now + TURN_LINGER
                            || now >= h.idle_since + TURN_LINGER)
                })
                .map(|(ino, h)| {
                    h.giving = true;
                    *ino
                })
                .collect()
        }
    };
    if !give.is_empty() {
        s.give_back(&give);
    }
    if !unrecorded.is_empty() {
        s.give_back_unrecorded(&unrecorded);
    }
    if !paused {
        s.send_behind_if_old();
    }
    s.linger_rounds.fetch_add(1, Ordering::SeqCst);
}
