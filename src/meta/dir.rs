//! A directory's entries, with the cookies that serve as `readdir` offsets. Only the
//! namespace's batches change them (see [`super::batch`]).

use super::{Ino, Name};
use std::collections::{BTreeMap, HashMap};

/// A directory's entries. Each entry gets a cookie, increasing and never reused within the
/// directory, which serves as its `readdir` offset: offsets stay valid while entries come and
/// go (cookies 1 and 2 are "." and "..").
#[derive(Debug)]
pub struct Dir {
    parent: Ino,
    by_cookie: BTreeMap<u64, (Name, Ino)>,
    by_name: HashMap<Name, u64>,
    next_cookie: u64,
}

/// The first cookie given to a real entry.
pub const FIRST_ENTRY_COOKIE: u64 = 3;

impl Dir {
    pub fn new(parent: Ino) -> Dir {
        Dir {
            parent,
            by_cookie: BTreeMap::new(),
            by_name: HashMap::new(),
            next_cookie: FIRST_ENTRY_COOKIE,
        }
    }
    /// The directory holding this one (the root's is itself).
    pub fn parent(&self) -> Ino {
        self.parent
    }
    pub(super) fn set_parent(&mut self, parent: Ino) {
        self.parent = parent;
    }
    pub fn get(&self, name: &[u8]) -> Option<Ino> {
        self.by_name.get(name).map(|c| self.by_cookie[c].1)
    }
    pub(super) fn insert(&mut self, name: &[u8], ino: Ino) {
        debug_assert!(!self.by_name.contains_key(name));
        let c = self.next_cookie;
        self.next_cookie += 1;
        let name: Name = name.into();
        self.by_cookie.insert(c, (name.clone(), ino));
        self.by_name.insert(name, c);
    }
    /// Points an existing name at another inode, keeping its cookie.
    pub(super) fn replace(&mut self, name: &[u8], ino: Ino) {
        let c = self.by_name[name];
        self.by_cookie.get_mut(&c).expect("consistent").1 = ino;
    }
    /// The cookie of entry `name`.
    pub(super) fn cookie(&self, name: &[u8]) -> Option<u64> {
        self.by_name.get(name).copied()
    }
    /// Puts back an entry that was removed, at its old cookie (undoing a removal).
    pub(super) fn restore(&mut self, name: &[u8], ino: Ino, cookie: u64) {
        debug_assert!(!self.by_name.contains_key(name) && !self.by_cookie.contains_key(&cookie));
        let name: Name = name.into();
        self.by_cookie.insert(cookie, (name.clone(), ino));
        self.by_name.insert(name, cookie);
    }
    /// Puts entry `name` at `cookie` (a replayed checkpoint), wherever the cookie counter is.
    pub(super) fn place(&mut self, name: &[u8], ino: Ino, cookie: u64) {
        if let Some((old, _)) = self.by_cookie.remove(&cookie) {
            self.by_name.remove(&old);
        }
        let name: Name = name.into();
        self.by_cookie.insert(cookie, (name.clone(), ino));
        self.by_name.insert(name, cookie);
        self.next_cookie = self.next_cookie.max(cookie + 1);
    }
    /// New entries take cookies from `next` on at least.
    pub(super) fn keep_cookies_from(&mut self, next: u64) {
        self.next_cookie = self.next_cookie.max(next);
    }
    /// The cookie the next new entry takes.
    pub fn next_cookie(&self) -> u64 {
        self.next_cookie
    }
    pub(super) fn remove(&mut self, name: &[u8]) -> Option<Ino> {
        let c = self.by_name.remove(name)?;
        self.by_cookie.remove(&c).map(|(_, ino)| ino)
    }
    /// Lets go of every name (a directory a partial table forgets), their room too; the
    /// parent and the next cookie stay (cookies are never reused).
    pub(super) fn drop_names(&mut self) {
        self.by_cookie = BTreeMap::new();
        self.by_name = HashMap::new();
    }
    pub fn len(&self) -> usize {
        self.by_name.len()
    }
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
    /// Entries with a cookie greater than `after`, in cookie order.
    pub fn entries_after(&self, after: u64) -> impl Iterator<Item = (u64, &[u8], Ino)> {
        self.by_cookie
            .range(after.saturating_add(1)..)
            .map(|(c, (n, i))| (*c, &n[..], *i))
    }
    /// The names in cookie order, with their cookies: what one directory read lists (see
    /// `Fs::readdir`). Names are shared, not copied.
    pub fn listing(&self) -> Vec<(u64, Name)> {
        self.by_cookie
            .iter()
            .map(|(c, (n, _))| (*c, n.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::ROOT_INO;

    #[test]
    fn dir_cookies_are_stable_and_never_reused() {
        let mut d = Dir::new(ROOT_INO);
        d.insert(b"a", 10);
        d.insert(b"b", 11);
        d.insert(b"c", 12);
        let first: Vec<_> = d
            .entries_after(0)
            .map(|(c, n, _)| (c, n.to_vec()))
            .collect();
        assert_eq!(first[0], (3, b"a".to_vec()));
        // Resume after "a" while "b" is removed and "d" added: "c" keeps its offset.
        d.remove(b"b");
        d.insert(b"d", 13);
        let rest: Vec<_> = d
            .entries_after(3)
            .map(|(c, n, _)| (c, n.to_vec()))
            .collect();
        assert_eq!(rest, vec![(5, b"c".to_vec()), (6, b"d".to_vec())]);
        d.replace(b"c", 99);
        assert_eq!(d.get(b"c"), Some(99));
        assert_eq!(d.len(), 3);
    }
}
