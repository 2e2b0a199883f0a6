//! A batch: its changes made and counted once committed, undone whole when dropped or refused.

use super::*;
use crate::meta::{Body, Dir, Journal, ROOT_INO};

fn file() -> Inode {
    Inode::new(Kind::File, 0o644, 0, 0, Body::File(Default::default()))
}

struct Refusing;
impl Journal for Refusing {
    fn record(&mut self, _: &[Change], _: &crate::meta::TableView<'_>) -> Result<()> {
        Err(Error::new(libc::EIO, "journal unreachable"))
    }
}

#[test]
fn a_committed_batch_keeps_its_changes_and_counts_once() {
    let mut meta = Meta::new(0o755, 0, 0);
    let mut b = meta.batch();
    let f = file();
    let ino = b.make(f);
    b.insert_entry(ROOT_INO, b"a", ino).unwrap();
    b.set_xattr(ino, b"user.k", b"v").unwrap();
    b.update(ino, |a| a.size = 10).unwrap();
    let kinds: Vec<&str> = b
        .changes()
        .iter()
        .map(|c| match c {
            Change::Make { .. } => "make",
            Change::Entry { .. } => "entry",
            Change::EntryAt { cookie, .. } => {
                assert_eq!(
                    *cookie,
                    crate::meta::FIRST_ENTRY_COOKIE,
                    "a new entry's place"
                );
                "entry"
            }
            Change::Xattr { .. } => "xattr",
            Change::Attrs { .. } => "attrs",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["make", "entry", "xattr", "attrs"]);
    b.commit().unwrap();
    assert_eq!(
        meta.get(ROOT_INO).unwrap().dir().unwrap().get(b"a"),
        Some(ino)
    );
    assert_eq!(meta.get(ino).unwrap().size, 10);
    assert_eq!(meta.commits(), 1);
}

#[test]
fn a_refused_or_dropped_batch_undoes_every_change() {
    let mut meta = Meta::new(0o755, 0, 0);
    let sub = {
        let mut b = meta.batch();
        let mut d = file();
        d.kind = Kind::Dir;
        d.body = Body::Dir(Box::new(Dir::new(ROOT_INO)));
        let sub = b.make(d);
        b.insert_entry(ROOT_INO, b"d", sub).unwrap();
        b.commit().unwrap();
        sub
    };
    let entries = |meta: &Meta| -> Vec<(u64, Vec<u8>, Ino)> {
        let d = meta.get(ROOT_INO).unwrap().dir().unwrap();
        d.entries_after(0)
            .map(|(c, n, i)| (c, n.to_vec(), i))
            .collect()
    };
    let before = entries(&meta);
    // Dropped part way (an error in the middle of an operation).
    {
        let mut b = meta.batch();
        let f = file();
        let ino = b.make(f);
        b.insert_entry(sub, b"x", ino).unwrap();
        b.remove_entry(ROOT_INO, b"d").unwrap();
        b.update(ROOT_INO, |a| a.nlink = 7).unwrap();
        assert!(b.insert_entry(ROOT_INO, b"x", ino).is_ok());
        assert_eq!(
            b.insert_entry(ROOT_INO, b"x", ino).unwrap_err().errno,
            libc::EEXIST
        );
    }
    // The entry removed and put back keeps its cookie (a directory stream's offset).
    assert_eq!(entries(&meta), before);
    assert_eq!(meta.get(ROOT_INO).unwrap().nlink, 2);
    assert!(meta.get(sub).unwrap().dir().unwrap().is_empty());
    assert_eq!(meta.len(), 2);
    // Refused by the journal.
    meta.set_journal(Box::new(Refusing));
    let mut b = meta.batch();
    b.set_xattr(sub, b"user.k", b"v").unwrap();
    b.replace_entry(ROOT_INO, b"d", ROOT_INO).unwrap();
    assert_eq!(b.commit().unwrap_err().errno, libc::EIO);
    assert!(meta.get(sub).unwrap().xattrs.is_none());
    assert_eq!(
        meta.get(ROOT_INO).unwrap().dir().unwrap().get(b"d"),
        Some(sub)
    );
    assert_eq!(meta.commits(), 1);
}
