//! INIT: what the mount asks of the kernel (the capabilities each feature needs, and what
//! a kernel without one loses), and how the answer picks the FUSE transport.

use super::*;

impl FuseFs {
    /// Asks the kernel for what this mount uses; logs what it lacks.
    pub(super) fn negotiate(&self, config: &mut KernelConfig) {
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_WRITE);
        // POSIX ACLs: the kernel enforces them and asks for them by getxattr; creations
        // arrive unmasked (the umask apart), as a default ACL may overrule the umask.
        if self.fs.acl_enabled() {
            let acl = InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK;
            if let Err(missing) = config.add_capabilities(acl) {
                log::warn!("the kernel lacks {missing:?}: POSIX ACLs are off");
            }
        }
        // The writeback cache: the kernel gathers small writes in its page cache and sends
        // them back in large requests; `fsync` and `close` wait for them (and a write
        // returns only when every copy holds it).
        if self.fs.writeback_enabled() {
            if let Err(missing) = config.add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE) {
                log::warn!("the kernel lacks {missing:?}: writes go through one by one");
            }
            // Handles opened while the pool is short of room bypass the cache; shared
            // mmap of them must still work (SQLite's -shm files).
            if let Err(missing) = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP) {
                log::info!("the kernel lacks {missing:?}");
            }
        }
        // Set-ID bits are cleared here on write, truncate and chown (`fs`): the kernel
        // then stops asking for security.capability before every write (its inodes may be
        // marked S_NOSEC), and flags writers without CAP_FSETID.
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2) {
            log::warn!("the kernel lacks {missing:?}: every write costs a getxattr");
        }
        // Lookups and creations in one directory may run in parallel (the metadata lock
        // orders them here), and symlink targets, which never change, may be cached.
        let more = InitFlags::FUSE_PARALLEL_DIROPS | InitFlags::FUSE_CACHE_SYMLINKS;
        if let Err(missing) = config.add_capabilities(more) {
            log::info!("the kernel lacks {missing:?}");
        }
        // READDIRPLUS: a directory read carries each entry's attributes, so `ls -l` and
        // `find -ls` need no LOOKUP per entry. AUTO lets the kernel use it where lookups
        // follow directory reads (the first read of a directory, then as advised), so a
        // plain `ls` of a huge directory does not instantiate an inode per entry.
        if self.offers.readdirplus {
            let plus = InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO;
            if let Err(missing) = config.add_capabilities(plus) {
                log::info!("the kernel lacks {missing:?}");
            }
        }
        // FUSE over io_uring: requests come through per-CPU rings instead of /dev/fuse reads
        // and writes, a third of the round trip here (fuser's ring threads serve them).
        let ring = self.offers.io_uring
            && match config.add_capabilities(InitFlags::FUSE_OVER_IO_URING) {
                Ok(()) => true,
                Err(missing) => {
                    log::warn!("the kernel lacks {missing:?}: requests come through /dev/fuse");
                    false
                }
            };
        let _ = self
            .figures
            .transport
            .set(if ring { "io_uring" } else { "/dev/fuse" });
        // A shared volume's file locks must hold across clients: the kernel asks for them
        // (elsewhere it keeps them itself, exact for one client and free).
        if self.fs.keeps_locks() {
            let locks = InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS;
            if let Err(missing) = config.add_capabilities(locks) {
                log::warn!("the kernel lacks {missing:?}: file locks hold on this client only");
            }
        }
        // File handles (NFS export, name_to_handle_at) decode through LOOKUP of "." and "..".
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_EXPORT_SUPPORT) {
            log::warn!("the kernel lacks {missing:?}: file handles go stale");
        }
    }
}
