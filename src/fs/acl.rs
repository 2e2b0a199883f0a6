//! POSIX ACLs in their extended-attribute form (`system.posix_acl_access` and
//! `system.posix_acl_default`).
//!
//! With FUSE_POSIX_ACL the kernel enforces ACLs itself (it reads them through `getxattr`
//! and caches them), but leaves three duties to the file system, which live here: keeping
//! the mode and the access ACL in step both ways (`setfacl` changes the mode, `chmod` the
//! ACL), and giving a new inode the ACL its directory's default ACL says (the umask then
//! does not apply). The rules are the kernel's `posix_acl_equiv_mode`, `posix_acl_chmod`
//! and `posix_acl_create`.

use crate::error::{Error, Result};

pub const ACCESS_XATTR: &[u8] = b"system.posix_acl_access";
pub const DEFAULT_XATTR: &[u8] = b"system.posix_acl_default";

/// `POSIX_ACL_XATTR_VERSION`: the header of the xattr form.
const VERSION: u32 = 2;
/// Header and entry sizes of the xattr form (`u32` version; `u16` tag, `u16` perm, `u32` id).
const HEADER_LEN: usize = 4;
const ENTRY_LEN: usize = 8;
/// More entries than any real ACL has; bounds what a value may make us parse.
const MAX_ENTRIES: usize = 8191;

const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub tag: u16,
    pub perm: u16,
    pub id: u32,
}

/// A parsed ACL, entries in the order the xattr form keeps (by tag, then id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl(pub Vec<Entry>);

fn invalid(why: &str) -> Error {
    Error::new(libc::EINVAL, format!("invalid POSIX ACL: {why}"))
}

impl Acl {
    /// Parses and checks an ACL's xattr form: one owner, owning-group and other entry, a
    /// mask whenever named users or groups appear, no id twice, permissions within rwx.
    pub fn parse(value: &[u8]) -> Result<Acl> {
        if value.len() < HEADER_LEN || !(value.len() - HEADER_LEN).is_multiple_of(ENTRY_LEN) {
            return Err(invalid("bad length"));
        }
        let version = u32::from_le_bytes(value[..4].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(invalid("unknown version"));
        }
        let entries: Vec<Entry> = value[HEADER_LEN..]
            .chunks_exact(ENTRY_LEN)
            .map(|e| Entry {
                tag: u16::from_le_bytes([e[0], e[1]]),
                perm: u16::from_le_bytes([e[2], e[3]]),
                id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            })
            .collect();
        if entries.len() > MAX_ENTRIES {
            return Err(invalid("too many entries"));
        }
        let count = |tag| entries.iter().filter(|e| e.tag == tag).count();
        if count(USER_OBJ) != 1 || count(GROUP_OBJ) != 1 || count(OTHER) != 1 {
            return Err(invalid("needs one owner, owning-group and other entry"));
        }
        let named = count(USER) + count(GROUP);
        if count(MASK) > 1 || (named > 0 && count(MASK) != 1) {
            return Err(invalid("a mask is needed with named entries, and only one"));
        }
        for e in &entries {
            if e.perm & !7 != 0 {
                return Err(invalid("permissions beyond rwx"));
            }
            if !matches!(e.tag, USER_OBJ | USER | GROUP_OBJ | GROUP | MASK | OTHER) {
                return Err(invalid("unknown tag"));
            }
        }
        let mut ids: Vec<(u16, u32)> = entries
            .iter()
            .filter(|e| matches!(e.tag, USER | GROUP))
            .map(|e| (e.tag, e.id))
            .collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(invalid("an id appears twice"));
        }
        Ok(Acl(entries))
    }

    /// The xattr form, entries sorted by tag and id as the kernel expects them.
    pub fn to_xattr(&self) -> Vec<u8> {
        let mut entries = self.0.clone();
        entries.sort_by_key(|e| (e.tag, e.id));
        let mut out = Vec::with_capacity(HEADER_LEN + ENTRY_LEN * entries.len());
        out.extend_from_slice(&VERSION.to_le_bytes());
        for e in entries {
            out.extend_from_slice(&e.tag.to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            // Owner, owning group, mask and other carry no id: ACL_UNDEFINED_ID.
            let id = if matches!(e.tag, USER | GROUP) {
                e.id
            } else {
                u32::MAX
            };
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    fn perm_of(&self, tag: u16) -> Option<u16> {
        self.0.iter().find(|e| e.tag == tag).map(|e| e.perm)
    }

    fn set(&mut self, tag: u16, perm: u16) {
        if let Some(e) = self.0.iter_mut().find(|e| e.tag == tag) {
            e.perm = perm;
        }
    }

    /// The permission bits (`0o777`) this ACL stands for: owner, mask (or owning group
    /// without one), other.
    pub fn mode_bits(&self) -> u16 {
        let group = self.perm_of(MASK).or(self.perm_of(GROUP_OBJ)).unwrap_or(0);
        (self.perm_of(USER_OBJ).unwrap_or(0) << 6) | (group << 3) | self.perm_of(OTHER).unwrap_or(0)
    }

    /// Whether the mode says all this ACL says (only owner, owning group and other), so no
    /// ACL needs keeping.
    pub fn is_minimal(&self) -> bool {
        self.0
            .iter()
            .all(|e| matches!(e.tag, USER_OBJ | GROUP_OBJ | OTHER))
    }

    /// `chmod`: the ACL's owner, mask (or owning group) and other entries follow `perm`.
    pub fn chmod(&mut self, perm: u16) {
        self.set(USER_OBJ, (perm >> 6) & 7);
        if self.perm_of(MASK).is_some() {
            self.set(MASK, (perm >> 3) & 7);
        } else {
            self.set(GROUP_OBJ, (perm >> 3) & 7);
        }
        self.set(OTHER, perm & 7);
    }

    /// The access ACL a new inode gets from its directory's default ACL (this), masked by
    /// the mode `perm` its creator asked for; also returns the inode's permission bits (the
    /// set-ID and sticky bits of `perm` kept). `None` ACL when the result says no more than
    /// the mode.
    pub fn inherit(&self, perm: u16) -> (Option<Acl>, u16) {
        let mut acl = self.clone();
        let rwx = perm & 0o777;
        let (mut owner, mut group, mut other) = ((rwx >> 6) & 7, (rwx >> 3) & 7, rwx & 7);
        for e in acl.0.iter_mut() {
            match e.tag {
                USER_OBJ => {
                    e.perm &= owner;
                    owner = e.perm;
                }
                OTHER => {
                    e.perm &= other;
                    other = e.perm;
                }
                _ => {}
            }
        }
        let group_tag = if acl.perm_of(MASK).is_some() {
            MASK
        } else {
            GROUP_OBJ
        };
        if let Some(e) = acl.0.iter_mut().find(|e| e.tag == group_tag) {
            e.perm &= group;
            group = e.perm;
        }
        let bits = (perm & !0o777) | (owner << 6) | (group << 3) | other;
        ((!acl.is_minimal()).then_some(acl), bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Acl {
        Acl(entries
            .iter()
            .map(|&(tag, perm, id)| Entry { tag, perm, id })
            .collect())
    }

    #[test]
    fn round_trip_and_validation() {
        let a = acl(&[
            (USER_OBJ, 7, 0),
            (USER, 5, 1000),
            (GROUP_OBJ, 5, 0),
            (MASK, 7, 0),
            (OTHER, 0, 0),
        ]);
        let parsed = Acl::parse(&a.to_xattr()).unwrap();
        assert_eq!(parsed.mode_bits(), 0o770);
        assert!(!parsed.is_minimal());
        assert!(Acl::parse(&[2, 0, 0]).is_err());
        assert!(Acl::parse(&3u32.to_le_bytes()).is_err());
        // A named user without a mask, an id twice, no other entry.
        let bad = [
            acl(&[
                (USER_OBJ, 7, 0),
                (USER, 5, 1),
                (GROUP_OBJ, 5, 0),
                (OTHER, 0, 0),
            ]),
            acl(&[
                (USER_OBJ, 7, 0),
                (USER, 5, 1),
                (USER, 4, 1),
                (GROUP_OBJ, 5, 0),
                (MASK, 7, 0),
                (OTHER, 0, 0),
            ]),
            acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 5, 0)]),
            acl(&[(USER_OBJ, 9, 0), (GROUP_OBJ, 5, 0), (OTHER, 0, 0)]),
        ];
        for b in bad {
            assert!(Acl::parse(&b.to_xattr()).is_err(), "{b:?}");
        }
    }

    #[test]
    fn chmod_moves_the_mask_not_the_owning_group() {
        let mut a = acl(&[
            (USER_OBJ, 7, 0),
            (USER, 7, 1000),
            (GROUP_OBJ, 7, 0),
            (MASK, 7, 0),
            (OTHER, 7, 0),
        ]);
        a.chmod(0o640);
        assert_eq!(a.mode_bits(), 0o640);
        assert_eq!(a.perm_of(GROUP_OBJ), Some(7));
        let mut minimal = acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 7, 0), (OTHER, 7, 0)]);
        minimal.chmod(0o751);
        assert_eq!(minimal.mode_bits(), 0o751);
    }

    #[test]
    fn inheritance_masks_the_default_with_the_requested_mode() {
        let default = acl(&[
            (USER_OBJ, 7, 0),
            (USER, 7, 1000),
            (GROUP_OBJ, 5, 0),
            (MASK, 7, 0),
            (OTHER, 5, 0),
        ]);
        // A file asked for 0666: execute goes everywhere; the mask carries the group bits.
        let (got, bits) = default.inherit(0o666);
        let got = got.expect("named user: an ACL is kept");
        assert_eq!(bits, 0o664);
        assert_eq!(got.mode_bits(), 0o664);
        assert_eq!(got.perm_of(USER), Some(7), "named entries are not masked");
        assert_eq!(got.perm_of(MASK), Some(6));
        // A minimal default gives only bits.
        let plain = acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 0, 0), (OTHER, 0, 0)]);
        assert_eq!(plain.inherit(0o2777), (None, 0o2700));
    }
}
