//! A client that joins on the root's names alone and loads what it uses (shared format 7),
//! while another changes the volume: the race #44 names "a new client joining while changes
//! land", for the partial join. The load is the product's protocol ([`State::load`]): the
//! engine's state and its log's head read in one step, the table brought to that head
//! (of other clients' changes, those of what it holds: the real [`Meta::held_changes`]),
//! then what was read installed (the real [`Meta::install`]). Mutants: the head and the
//! state read in two steps; what was read installed before the table reached its head.

use super::*;

impl Client {
    /// Joins as the product does where the engine's state is whole: the root and its names
    /// as of the log's head, the table at that head.
    pub(super) fn join_partial(
        engine: &Arc<MemEngine>,
        who: &str,
        protocol: Protocol,
        inos: u64,
    ) -> Client {
        let c = Client::new(engine, who, protocol, inos);
        let load = engine
            .load_state(&[ROOT_INO], &[ROOT_INO], u64::MAX)
            .unwrap();
        let (head, loaded) = (
            load.head,
            super::super::state::changes_of(&load.dump).unwrap(),
        );
        {
            let mut meta = c.meta.lock();
            meta.start_partial();
            meta.install(&[ROOT_INO], &[ROOT_INO], loaded).unwrap();
        }
        c.shared.applied.store(head, Ordering::SeqCst);
        c.shared.ahead.lock().applied(head);
        c
    }

    /// Writes this (whole, caught-up) table into the engine's state, as the volume's first
    /// client does ([`State::make_state_whole`]): the state is whole from then on.
    pub(super) fn write_state_image(&self) {
        let (inos, at) = {
            let meta = self.meta.lock();
            (
                meta.inode_numbers(),
                self.shared.applied.load(Ordering::SeqCst),
            )
        };
        let image = self.meta.lock().image_of(&inos);
        let ops = super::super::state::ops_of(&image.changes, true);
        assert!(self.shared.engine.put_state(at, &ops, true).unwrap());
    }

    /// Loads `dirs` (their names, and the inodes they name) and `inodes` into a partial
    /// table, as [`State::load`] does (or as its mutant does).
    pub(super) fn load(&self, dirs: &[Ino], inodes: &[Ino]) {
        let s = &self.shared;
        let (dirs, inodes): (Vec<Ino>, Vec<Ino>) = {
            let m = self.meta.lock();
            if !m.is_partial() {
                return;
            }
            (
                dirs.iter()
                    .copied()
                    .filter(|d| !m.holds_whole(*d))
                    .collect(),
                inodes
                    .iter()
                    .copied()
                    .filter(|i| m.get(*i).is_none())
                    .collect(),
            )
        };
        if dirs.is_empty() && inodes.is_empty() {
            return;
        }
        let load = |dirs: &[Ino], inodes: &[Ino]| {
            let load = s.engine.load_state(dirs, inodes, u64::MAX).unwrap();
            (load.head, load.dump)
        };
        let (head, dump) = match s.protocol {
            Protocol::LoadHeadApart => {
                let head = s.engine.head().unwrap();
                (head, load(&dirs, &inodes).1)
            }
            _ => load(&dirs, &inodes),
        };
        let install_first = matches!(s.protocol, Protocol::LoadInstallFirst);
        if !install_first {
            self.catch_up_through(head);
        }
        let loaded = super::super::state::changes_of(&dump).unwrap();
        {
            let mut meta = self.meta.lock();
            if let Err(e) = meta.install(&dirs, &[], loaded) {
                panic!("{}'s table cannot take what it loaded: {e}", s.who);
            }
            self.check_held(&meta);
        }
        if install_first {
            self.catch_up_through(head);
        }
    }

    /// Loads the rest of the namespace, as the product's poller does over its rounds: every
    /// directory's names, then the inodes no name leads to; the table is whole then.
    pub(super) fn load_whole(&self) {
        loop {
            let dirs = self.meta.lock().unloaded_dirs(4);
            if dirs.is_empty() {
                break;
            }
            self.load(&dirs, &[]);
        }
        let listed = self.shared.engine.state_inodes().unwrap();
        let unnamed: Vec<Ino> = {
            let meta = self.meta.lock();
            listed
                .into_iter()
                .filter(|i| meta.get(*i).is_none())
                .collect()
        };
        self.load(&[], &unnamed);
        assert!(
            self.meta.lock().finish_partial(),
            "{}: a directory's names still not held",
            self.shared.who
        );
    }

    /// The kernel lets every directory go but `kernel_holds` (which it holds from now on):
    /// the table forgets all it loaded but the root's names and what those directories
    /// lead to, as a large volume's client other than its keeper does between its requests
    /// ([`Meta::forget_let_go`], under the catch-up's lock there: one step of this client's
    /// here).
    pub(super) fn forget_all(&self, kernel_holds: &[Ino]) {
        let mut meta = self.meta.lock();
        let dirs: Vec<Ino> = meta
            .inos()
            .filter(|i| meta.get(*i).is_some_and(|n| n.dir().is_some()))
            .collect();
        for d in dirs {
            match kernel_holds.contains(&d) {
                true => meta.hold(d, 1),
                false => meta.release_refs(d, u64::MAX),
            }
        }
        meta.forget_let_go(&|_| false);
        self.check_held(&meta);
    }

    /// What a partial table promises: each directory whose names it holds has them all,
    /// and each leads to an inode it holds.
    pub(super) fn check_held(&self, meta: &Meta) {
        if !meta.is_partial() {
            return;
        }
        for ino in meta.inos() {
            let Some(d) = meta.get(ino).and_then(Inode::dir) else {
                continue;
            };
            if meta.names_unloaded(ino) {
                continue;
            }
            for (_, name, target) in d.entries_after(0) {
                if meta.get(target).is_none() {
                    panic!(
                        "{}'s partial table: {ino}/{name:?} leads to a missing inode {target}",
                        self.shared.who
                    );
                }
            }
        }
    }
}

/// A client joins on the root alone while another changes the volume, and races it where
/// it has loaded nothing yet: two moves that together would make a cycle (`/p/a/f/e` and
/// `/q/b/c/d`; the joiner moves `b` into `e`, and must load `q`, `e` and every directory
/// above `e` to check it) while the other also makes names in `e` and `f` and moves `/p/g`
/// (which the joiner does not hold) into `q` (whose names it may hold), a removal of `/box`
/// (its emptiness loaded) racing a name made in it, and two creates of one name. Then the
/// joiner loads the rest, and every table equals the log's history. With `forgets`, the
/// joiner forgets all it loaded between its changes (its next change loads it again, the
/// other client's changes landing meanwhile).
pub(super) fn lazy_join(protocol: Protocol, forgets: bool) {
    let engine = engine_for(protocol);
    let setup = Client::join(&engine, "setup", REAL, 1000);
    setup.write_state_image();
    setup.cycle_tree(&[b"box"]);
    setup.mkdir(setup.resolve(&[b"p"]).unwrap(), b"g").unwrap();
    let at = |path: &[&[u8]]| setup.resolve(path).unwrap();
    let (p, q, boxed) = (at(&[b"p"]), at(&[b"q"]), at(&[b"box"]));
    let d = at(&[b"q", b"b", b"c", b"d"]);
    let f = at(&[b"p", b"a", b"f"]);
    let e = at(&[b"p", b"a", b"f", b"e"]);
    let one = Arc::new(Client::join(&engine, "one", protocol, 2000));
    let t1 = {
        let c = one.clone();
        thread::spawn(move || {
            c.mkdir(e, b"x").unwrap();
            let moved = c.rename(p, b"a", d, b"a").is_ok();
            c.mkdir(f, b"y").unwrap();
            c.rename(p, b"g", q, b"g").unwrap();
            let boxed = c.mkdir(boxed, b"in").is_ok();
            let made = c.mkdir(ROOT_INO, b"same").is_ok();
            (moved, boxed, made)
        })
    };
    let t2 = {
        let engine = engine.clone();
        thread::spawn(move || {
            let c = Client::join_partial(&engine, "lazy", protocol, 3000);
            // The kernel holds `e` (a directory below those it lets go): kept, with what
            // its names lead to.
            let forget = || {
                if forgets {
                    c.forget_all(&[e]);
                }
            };
            let moved = c.rename(q, b"b", e, b"b").is_ok();
            forget();
            let unboxed = c.rmdir(ROOT_INO, b"box").is_ok();
            forget();
            let made = c.mkdir(ROOT_INO, b"same").is_ok();
            (c, moved, unboxed, made)
        })
    };
    let trim = trimmer(&engine);
    let (moved1, boxed, made1) = t1.join().unwrap();
    let (lazy, moved2, unboxed, made2) = t2.join().unwrap();
    trim.join().unwrap();
    let truth = replayed(&engine);
    assert!(!(moved1 && moved2), "both moves were taken: a cycle");
    assert!(moved1 || moved2, "neither move was taken");
    assert!(
        made1 != made2,
        "one name made {} times",
        made1 as u8 + made2 as u8
    );
    assert!(
        boxed != unboxed,
        "made in the box {boxed}, the box removed {unboxed}"
    );
    {
        // The joiner decided on what it loaded, not on a whole table (and, if it forgets,
        // kept what its kernel holds).
        let meta = lazy.meta.lock();
        assert!(meta.is_partial());
        assert!(meta.holds_whole(e));
    }
    lazy.catch_up();
    lazy.load_whole();
    agree(&[&*one, &lazy, &setup], &truth);
}
