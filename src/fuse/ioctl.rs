//! The inode-flag ioctls (`chattr`, `lsattr`, `xfs_io -c chattr`), which the kernel passes to
//! a FUSE file system as FUSE_IOCTL.

use super::*;

/// `FS_IOC_GETFLAGS` (`_IOR('f', 1, long)`): the kernel's fileattr code asks for a 32-bit
/// value whatever the size the command names.
pub(super) const FS_IOC_GETFLAGS: u32 = 0x8008_6601;

/// `FS_IOC_SETFLAGS` (`_IOW('f', 2, long)`).
pub(super) const FS_IOC_SETFLAGS: u32 = 0x4008_6602;

/// `FS_IOC_FSGETXATTR` (`_IOR('X', 31, struct fsxattr)`, 28 bytes).
pub(super) const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;

/// `FS_IOC_FSSETXATTR` (`_IOW('X', 32, struct fsxattr)`).
pub(super) const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;

/// `struct fsxattr`'s size.
pub(super) const FSXATTR_LEN: usize = 28;

/// The `fsx_xflags` bits matching the inode flags kept (`FS_XFLAG_*`), in pairs.
pub(super) const XFLAGS: [(u32, u32); 4] = [
    (0x8, crate::fs::FS_IMMUTABLE_FL),
    (0x10, crate::fs::FS_APPEND_FL),
    (0x40, crate::fs::FS_NOATIME_FL),
    (0x80, crate::fs::FS_NODUMP_FL),
];

/// The inode-flag ioctls (`chattr`, `lsattr`, `xfs_io -c chattr`), which the kernel passes to
/// a FUSE file system as FUSE_IOCTL; any other command is ENOTTY.
pub(super) fn inode_flags_ioctl(
    fs: &Fs,
    ino: u64,
    cmd: u32,
    input: &[u8],
) -> crate::error::Result<Vec<u8>> {
    let too_short = || Error::new(libc::EINVAL, "ioctl argument too short");
    let u32_at = |b: &[u8], at: usize| -> crate::error::Result<u32> {
        let bytes = b.get(at..at + 4).ok_or_else(too_short)?;
        Ok(u32::from_ne_bytes(bytes.try_into().expect("4 bytes")))
    };
    match cmd {
        FS_IOC_GETFLAGS => Ok(fs.get_flags(ino)?.to_ne_bytes().to_vec()),
        FS_IOC_SETFLAGS => fs.set_flags(ino, u32_at(input, 0)?).map(|()| Vec::new()),
        FS_IOC_FSGETXATTR => {
            let flags = fs.get_flags(ino)?;
            let xflags = XFLAGS
                .iter()
                .filter(|(_, f)| flags & f != 0)
                .fold(0, |x, (xf, _)| x | xf);
            let mut out = vec![0u8; FSXATTR_LEN];
            out[..4].copy_from_slice(&xflags.to_ne_bytes());
            Ok(out)
        }
        FS_IOC_FSSETXATTR => {
            let xflags = u32_at(input, 0)?;
            let known = XFLAGS.iter().fold(0, |x, (xf, _)| x | xf);
            if xflags & !known != 0 {
                return Err(Error::new(libc::EOPNOTSUPP, "unsupported fsxattr flags"));
            }
            let flags = XFLAGS
                .iter()
                .filter(|(xf, _)| xflags & xf != 0)
                .fold(0, |x, (_, f)| x | f);
            fs.set_flags(ino, flags).map(|()| Vec::new())
        }
        _ => Err(Error::new(
            libc::ENOTTY,
            format!("ioctl {cmd:#x} is not supported"),
        )),
    }
}
