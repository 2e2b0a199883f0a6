//! What the core's operations take and return: attributes as `stat` shows them, `setattr`'s
//! changes, directory entries, `statfs`'s capacity, open flags.

use crate::meta::{Ino, Kind};
use std::time::SystemTime;

/// Attributes of an inode, as `stat` shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: Kind,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub size: u64,
    /// 512-byte blocks (from the size: holes are not told apart).
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    /// Birth time: when the inode was made.
    pub btime: SystemTime,
}

/// A time to set with `setattr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(SystemTime),
}

/// The changes of a `setattr` call.
#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    /// The change time the kernel gives (it keeps a regular file's mtime and ctime itself
    /// under the writeback cache, and sends both when it sets or writes back times); none:
    /// the time of this call.
    pub ctime: Option<SystemTime>,
}

/// One `readdir` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: Ino,
    /// The offset to resume after this entry.
    pub offset: u64,
    pub kind: Kind,
    pub name: Vec<u8>,
}

/// File system capacity for `statfs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatFs {
    pub block_size: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
}

/// Open flags that matter here.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenMode {
    pub read: bool,
    pub write: bool,
    pub append: bool,
    pub truncate: bool,
    /// `O_NOATIME`: reads through this handle leave the access time alone (the kernel
    /// allows it to the owner or CAP_FOWNER only).
    pub noatime: bool,
}

impl OpenMode {
    /// From `open(2)` flags.
    pub fn from_flags(flags: i32) -> OpenMode {
        let acc = flags & libc::O_ACCMODE;
        OpenMode {
            read: acc == libc::O_RDONLY || acc == libc::O_RDWR,
            write: acc == libc::O_WRONLY || acc == libc::O_RDWR,
            append: flags & libc::O_APPEND != 0,
            truncate: flags & libc::O_TRUNC != 0,
            noatime: flags & libc::O_NOATIME != 0,
        }
    }
}
