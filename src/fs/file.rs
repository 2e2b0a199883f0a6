//! Regular files: handles (open, create, `O_TMPFILE`, release), read, write, `SEEK_DATA` and
//! `SEEK_HOLE`, and `copy_file_range`.

use super::rules::{check_not_immutable, FS_APPEND_FL, S_ISGID, S_ISUID};
use super::{err, inode, new_inode, Attr, Caller, Fs, OpenMode};
use crate::data::{Payload, ReadBuf, RequestBuffer};
use crate::error::{Error, Result};
use crate::meta::{Body, Ino, Kind};
use crate::sync::Arc;

impl Fs {
    /// Opens `ino`; returns a file handle.
    pub fn open(&self, ino: Ino, flags: i32) -> Result<u64> {
        let Some(turns) = self.turns.as_deref() else {
            return self.open_here(ino, flags);
        };
        // On a shared volume an open sees every change closed before it on any client
        // (close-to-open): the table catches up first. A file is marked open here before
        // that, so no client drops it under this handle; one that, caught up, has no name
        // and no handle here lost the race with an unlink elsewhere.
        let file = self
            .meta
            .lock()
            .get(ino)
            .is_some_and(|i| i.kind == Kind::File);
        if file {
            turns.opening(ino)?;
        }
        turns.refresh(self);
        if file && self.meta.lock().get(ino).is_some_and(|i| i.is_orphan()) {
            return Err(Error::new(
                libc::ENOENT,
                "the file was removed by another client",
            ));
        }
        self.open_here(ino, flags)
    }

    /// [`Fs::open`] on the table as it is (a file just made on it).
    fn open_here(&self, ino: Ino, flags: i32) -> Result<u64> {
        let mode = OpenMode::from_flags(flags);
        if mode.write || mode.truncate {
            self.writable()?;
        }
        {
            let mut meta = self.meta.lock();
            let i = inode(&meta, ino)?;
            if i.kind == Kind::Dir && mode.write {
                return Err(err(libc::EISDIR));
            }
            if mode.write || mode.truncate {
                check_not_immutable(i)?;
                if i.flags & FS_APPEND_FL != 0 && (!mode.append || mode.truncate) {
                    return Err(Error::new(
                        libc::EPERM,
                        "an append-only file opens for writing only with O_APPEND",
                    ));
                }
            }
            // Unlinked and closed: its data is gone (the kernel may still know the inode
            // from a lookup that raced with the unlink).
            if i.is_orphan() {
                return Err(err(libc::ENOENT));
            }
            meta.opened(ino);
        }
        let fh = self.new_handle(ino, mode);
        if mode.truncate && mode.write {
            if let Err(e) = self.file_turn(ino).and_then(|_turn| self.resize(ino, 0)) {
                self.release(fh);
                return Err(e);
            }
        }
        Ok(fh)
    }

    /// Creates and opens a regular file (`O_CREAT`); with `O_EXCL` an existing name fails.
    pub fn create(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> Result<(Attr, u64)> {
        let made = self.mknod(parent, name, libc::S_IFREG | (mode & 0o7777), 0, caller);
        let (attr, fresh) = match made {
            Ok(a) => (a, true),
            Err(e) if e.errno == libc::EEXIST && flags & libc::O_EXCL == 0 => {
                (self.lookup(parent, name)?, false)
            }
            Err(e) => return Err(e),
        };
        // A file this create made is as fresh as the table (no other client knew it).
        let opened = match fresh {
            true => self.open_here(attr.ino, flags),
            false => self.open(attr.ino, flags),
        };
        match opened {
            Ok(fh) => Ok((self.getattr(attr.ino)?, fh)),
            Err(e) => {
                self.forget(attr.ino, 1);
                Err(e)
            }
        }
    }

    /// `open(O_TMPFILE)` in directory `parent`: a regular file with no name, open for
    /// writing, gone at its last close unless `link` names it first (which `O_EXCL` forbids).
    /// It takes from `parent` what a created file would (group, default ACL, else umask).
    pub fn tmpfile(
        &self,
        parent: Ino,
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> Result<(Attr, u64)> {
        self.writable()?;
        let open = OpenMode::from_flags(flags);
        if !open.write {
            return Err(Error::new(
                libc::EINVAL,
                "O_TMPFILE needs O_WRONLY or O_RDWR",
            ));
        }
        let ino = self.changing(|| {
            let mut meta = self.meta.lock();
            let p = inode(&meta, parent)?;
            p.dir().ok_or_else(|| err(libc::ENOTDIR))?;
            check_not_immutable(p)?;
            let mut inode = new_inode(
                Kind::File,
                (mode & 0o7777) as u16,
                caller,
                Body::File(Arc::default()),
            );
            self.inherit_from_parent(p, &mut inode, caller);
            inode.nlink = 0;
            inode.tmpfile = flags & libc::O_EXCL == 0;
            let mut b = meta.batch();
            let ino = b.make(inode);
            b.commit()?;
            meta.hold(ino, 1); // the kernel's reference, as for a created file
            meta.opened(ino); // the handle below: it never exists unopened
            Ok(ino)
        })?;
        let fh = self.new_handle(ino, open);
        Ok((self.getattr(ino)?, fh))
    }

    pub fn release(&self, fh: u64) {
        let Some(h) = self.handles.lock().remove(&fh) else {
            return;
        };
        // A written file's last changes (and maybe its drop) in its turn. Without the turn
        // (the engine unreachable) they are tried anyway: refused, they are logged.
        let _turn = match h.mode.write {
            true => self.file_turn(h.ino).unwrap_or_else(|e| {
                log::warn!("closing inode {}: {e}", h.ino);
                None
            }),
            false => None,
        };
        if h.mode.write {
            self.settle_overwrite_at_close(h.ino);
            // A shared volume's writes held back go with the last close too (the FUSE
            // adapter's flush sends them before `close(2)` returns; a library's close is
            // this).
            if let Err(e) = self.send_shared_writes() {
                log::warn!("closing inode {}: {e}", h.ino);
            }
        }
        let mut meta = self.meta.lock();
        meta.closed(h.ino);
        self.settle(meta, h.ino);
    }

    /// Reads up to `size` bytes at `offset` (short at end of file), left where the fabric put
    /// them for the reply to send.
    pub fn read_buf(&self, ino: Ino, fh: u64, offset: u64, size: u32) -> Result<ReadBuf<'_>> {
        let mode = self.handle(fh, ino)?;
        if !mode.read && !self.config.writeback {
            return Err(err(libc::EBADF));
        }
        let file = self.file_data(ino)?;
        let view = self.data.view(&file);
        let file_size = {
            let mut meta = self.meta.lock();
            if !mode.noatime {
                let mut b = meta.batch();
                self.accessed(&mut b, ino)?;
                b.commit()?;
            }
            inode(&meta, ino)?.size
        };
        if offset >= file_size {
            return Ok(ReadBuf::empty());
        }
        let len = (size as u64).min(file_size - offset) as usize;
        self.fault_point("read");
        view.read_buf(offset, len)
    }

    /// Reads many ranges of open files at once (the library's `read_many`): `(ino, fh,
    /// offset, out)` each; the bytes read into each (short at the end of its file). Every
    /// range's reads go out together (see `data::read`). Access times are not changed: a
    /// batch of reads is a program's, not a path's.
    pub fn read_many(&self, reads: &mut [(Ino, u64, u64, &mut [u8])]) -> Result<Vec<usize>> {
        for (ino, fh, _, _) in reads.iter() {
            if !self.handle(*fh, *ino)?.read {
                return Err(err(libc::EBADF));
            }
        }
        // Every file and size from one look at the table.
        let mut files = Vec::with_capacity(reads.len());
        let mut lens = Vec::with_capacity(reads.len());
        {
            let meta = self.meta.lock();
            for (ino, _, offset, out) in reads.iter() {
                let size = inode(&meta, *ino)?.size;
                lens.push((out.len() as u64).min(size.saturating_sub(*offset)) as usize);
                files.push(super::file_in(&meta, *ino)?);
            }
        }
        let mut plan: Vec<(&crate::meta::FileData, u64, &mut [u8])> = reads
            .iter_mut()
            .zip(&files)
            .zip(&lens)
            .map(|(((_, _, offset, out), f), &len)| (&**f, *offset, &mut out[..len]))
            .collect();
        self.fault_point("read");
        self.data.read_many(&mut plan)?;
        Ok(lens)
    }

    /// As [`Fs::read_buf`], copied out.
    pub fn read(&self, ino: Ino, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        Ok(self.read_buf(ino, fh, offset, size)?.into_vec())
    }

    /// Writes `data` at `offset` (at the end with `O_APPEND`); returns once the bytes are in
    /// remote memory, or, writing behind, once their chunks exist (`data::behind`).
    pub fn write(
        &self,
        ino: Ino,
        fh: u64,
        offset: u64,
        data: &[u8],
        caller: Caller,
    ) -> Result<u32> {
        self.write_impl(ino, fh, offset, Payload::Copy(data), caller)
    }

    /// As [`Fs::write`], for data inside a request buffer that outlives the write (see
    /// [`RequestBuffer`]): the payload is registered (through the cache) and sent without a
    /// copy.
    pub fn write_in_place(
        &self,
        ino: Ino,
        fh: u64,
        offset: u64,
        data: RequestBuffer<'_>,
        caller: Caller,
    ) -> Result<u32> {
        self.write_impl(ino, fh, offset, Payload::InPlace(data), caller)
    }

    fn write_impl(
        &self,
        ino: Ino,
        fh: u64,
        offset: u64,
        payload: Payload<'_>,
        caller: Caller,
    ) -> Result<u32> {
        let _turn = self.file_turn(ino)?;
        let data = payload.bytes();
        let mode = self.handle(fh, ino)?;
        if !mode.write {
            return Err(err(libc::EBADF));
        }
        let file = self.file_data(ino)?;
        // Under the writeback cache the kernel placed appends itself (its size may be ahead
        // of this one while pages wait). A file made append-only after it was opened takes
        // appends only.
        let place = |i: &crate::meta::Inode| {
            if (mode.append || i.flags & FS_APPEND_FL != 0) && !self.config.writeback {
                i.size
            } else {
                offset
            }
        };
        let len = data.len() as u64;
        let mut io = self.lock_for_overwrite(ino, &file, |i| (place(i), place(i) + len))?;
        // Under the file's lock, so appends from several handles do not interleave.
        let (offset, size) = {
            let meta = self.meta.lock();
            let i = inode(&meta, ino)?;
            check_not_immutable(i)?;
            (place(i), i.size)
        };
        let end = self.data.check_end(offset, data.len() as u64)?;
        self.fault_point("write");
        // A failed zeroing still goes through the commit below: it may have let copies go.
        let written = io
            .zero_past_end(size, offset)
            .and_then(|()| io.write_or_defer(&file, offset, payload));
        if written.is_err() && end > size {
            io.past_end_failed();
        }
        if written.as_ref().is_err_and(|e| e.errno == libc::ENOSPC) {
            self.pool_refused_room();
        }
        let set_id = {
            let mut meta = self.meta.lock();
            let mut b = meta.batch();
            if written.is_ok() {
                let now = crate::meta::now();
                b.update(ino, |a| {
                    a.size = a.size.max(end);
                    a.mtime = now;
                    a.ctime = now;
                })?;
            }
            let set_id = inode(&b, ino)?.perm & (S_ISUID | S_ISGID) != 0;
            match written.is_ok() {
                true => self.commit_write_with(b, ino, &file, &mut io)?,
                false => Self::commit_with(b, ino, &mut io)?,
            }
            written?;
            set_id
        };
        drop(io);
        if set_id {
            self.drop_set_id_bits(ino, &caller)?;
        }
        Ok(data.len() as u32)
    }

    /// `lseek` with `SEEK_DATA` (`data` true) or `SEEK_HOLE`: the first offset at or after
    /// `offset` in data (bytes a chunk holds) or in a hole (the end of the file counts as
    /// one). ENXIO at or past the end, or when no data follows. Chunks are the unit: a
    /// written chunk's unwritten bytes count as data, as a file system's blocks do.
    pub fn seek_data_hole(&self, ino: Ino, fh: u64, offset: u64, data: bool) -> Result<u64> {
        self.handle(fh, ino)?;
        let file = self.file_data(ino)?;
        let chunks = self.data.view(&file);
        let size = inode(&self.meta.lock(), ino)?.size;
        if offset >= size {
            return Err(err(libc::ENXIO));
        }
        let cs = self.data.chunk_size();
        // The data extents from the chunk holding `offset` on, in order.
        let extents = chunks
            .range(offset / cs..)
            .map(|(idx, c)| (idx * cs, idx * cs + c.len))
            .filter(|&(_, end)| end > offset);
        if data {
            return extents
                .map(|(start, _)| start.max(offset))
                .find(|&at| at < size)
                .ok_or_else(|| err(libc::ENXIO));
        }
        let mut at = offset;
        for (start, end) in extents {
            if start > at {
                break; // a hole before this extent
            }
            at = end;
        }
        Ok(at.min(size))
    }

    /// `copy_file_range`: copies up to `len` bytes from `ino_in` at `off_in` to `ino_out` at
    /// `off_out` (stopping at the source's end), through the daemon in windows of
    /// [`crate::config::IO_SIZE`] (one request from the kernel instead of a read and a write
    /// per page); returns the bytes copied. The destination is written as by `write`.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range(
        &self,
        ino_in: Ino,
        fh_in: u64,
        off_in: u64,
        ino_out: Ino,
        fh_out: u64,
        off_out: u64,
        len: u64,
        caller: Caller,
    ) -> Result<u64> {
        if ino_in == ino_out
            && off_in < off_out.saturating_add(len)
            && off_out < off_in.saturating_add(len)
        {
            return Err(Error::new(libc::EINVAL, "overlapping ranges of one file"));
        }
        if self.handle(fh_out, ino_out)?.append {
            return Err(Error::new(
                libc::EBADF,
                "the destination is open for appending",
            ));
        }
        let _turn = self.file_turn(ino_out)?;
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(crate::config::IO_SIZE as u64) as u32;
            // Copied out of the pooled read buffer: the write below takes a pooled buffer of
            // its own, and no handler holds two (the pool is sized on that).
            let bytes = self.read(ino_in, fh_in, off_in + done, n)?;
            if bytes.is_empty() {
                break;
            }
            let written = self.write(ino_out, fh_out, off_out + done, &bytes, caller)?;
            done += written as u64;
            if (written as usize) < bytes.len() {
                break;
            }
        }
        Ok(done)
    }
}
