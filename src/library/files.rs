//! The library's calls on files: open, read and write at a position or an offset, fsync,
//! close, and `read_many`.

use super::{Looked, Volume};
use crate::error::{Error, Result};
use crate::meta::{Ino, Kind};

/// An open file: its inode, the lookups that keep it known, the position of `read` and
/// `write`.
pub(super) struct Handle {
    ino: Ino,
    /// Forgotten at close (the inode stays known while open, as the kernel keeps it).
    looked: Vec<Ino>,
    pos: u64,
}

/// One read of [`Volume::read_many`]: `buf.len()` bytes of handle `fh` at `offset`.
pub struct ReadRequest<'b> {
    pub fh: u64,
    pub offset: u64,
    pub buf: &'b mut [u8],
}

/// The most a single call hands the file system at once (a FUSE request's largest): longer
/// reads and writes are cut into these.
const PIECE: usize = crate::config::IO_SIZE;

impl Volume {
    /// Opens `path` with open(2)'s `flags` (`O_RDONLY`, `O_WRONLY` or `O_RDWR`, with
    /// `O_CREAT`, `O_EXCL`, `O_TRUNC`, `O_APPEND`); `mode` for a file made. A handle.
    pub fn open(&self, path: &str, flags: i32, mode: u32) -> Result<u64> {
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let (ino, fh, looked) = if flags & libc::O_CREAT != 0 {
            let (dir, name) = self.parent(path)?;
            let (attr, fh) = self.fs.create(dir.ino(), name, mode, flags, self.caller)?;
            // The new entry's lookup is the handle's; the directories' are let go of now.
            (attr.ino, fh, vec![attr.ino])
        } else {
            let mut looked = self.resolve(path)?;
            let ino = looked.ino();
            match self.fs.getattr(ino)?.kind {
                Kind::Dir => return Err(Error::new(libc::EISDIR, format!("{path}: a directory"))),
                Kind::Symlink => {
                    return Err(Error::new(
                        libc::ELOOP,
                        format!("{path}: a symlink (the library does not follow them)"),
                    ))
                }
                _ => {}
            }
            let fh = self.fs.open(ino, flags)?;
            (ino, fh, std::mem::take(&mut looked.inos))
        };
        if writes && flags & libc::O_TRUNC != 0 {
            let size = crate::fs::SetAttr {
                size: Some(0),
                ..Default::default()
            };
            if let Err(e) = self.fs.setattr(ino, &size, self.caller) {
                self.fs.release(fh);
                drop(Looked {
                    fs: &self.fs,
                    inos: looked,
                });
                return Err(e);
            }
        }
        self.handles.lock().insert(
            fh,
            Handle {
                ino,
                looked,
                pos: 0,
            },
        );
        Ok(fh)
    }

    /// The inode handle `fh` names.
    fn handle_ino(&self, fh: u64) -> Result<Ino> {
        self.here()?;
        self.handles
            .lock()
            .get(&fh)
            .map(|h| h.ino)
            .ok_or_else(|| Error::new(libc::EBADF, format!("handle {fh} is not open")))
    }

    /// Reads into `buf` at `offset`: the bytes read (fewer only at the end of the file).
    pub fn pread(&self, fh: u64, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let ino = self.handle_ino(fh)?;
        let mut done = 0;
        while done < buf.len() {
            let want = (buf.len() - done).min(PIECE);
            let got = self
                .fs
                .read_buf(ino, fh, offset + done as u64, want as u32)?;
            let got = got.bytes();
            buf[done..done + got.len()].copy_from_slice(got);
            done += got.len();
            if got.len() < want {
                break;
            }
        }
        Ok(done)
    }

    /// Writes `data` at `offset` (at the end with `O_APPEND`): the bytes written.
    pub fn pwrite(&self, fh: u64, offset: u64, data: &[u8]) -> Result<usize> {
        let ino = self.handle_ino(fh)?;
        let mut done = 0;
        for piece in data.chunks(PIECE) {
            self.fs
                .write(ino, fh, offset + done as u64, piece, self.caller)?;
            done += piece.len();
        }
        Ok(done)
    }

    /// Reads into `buf` at the handle's position, and moves it past what was read.
    pub fn read(&self, fh: u64, buf: &mut [u8]) -> Result<usize> {
        let pos = self.position(fh)?;
        let n = self.pread(fh, pos, buf)?;
        self.advance(fh, pos + n as u64);
        Ok(n)
    }

    /// Writes `data` at the handle's position (the end with `O_APPEND`), and moves it past.
    pub fn write(&self, fh: u64, data: &[u8]) -> Result<usize> {
        let pos = self.position(fh)?;
        let n = self.pwrite(fh, pos, data)?;
        self.advance(fh, pos + n as u64);
        Ok(n)
    }

    /// Where `read` and `write` of `fh` go next.
    pub fn position(&self, fh: u64) -> Result<u64> {
        self.handle_ino(fh)?;
        Ok(self.handles.lock().get(&fh).map_or(0, |h| h.pos))
    }

    /// Sets where `read` and `write` of `fh` go next (lseek's SEEK_SET).
    pub fn seek(&self, fh: u64, pos: u64) -> Result<()> {
        self.handle_ino(fh)?;
        self.advance(fh, pos);
        Ok(())
    }

    fn advance(&self, fh: u64, pos: u64) {
        if let Some(h) = self.handles.lock().get_mut(&fh) {
            h.pos = pos;
        }
    }

    /// Makes what was written through `fh` durable: its bytes on the servers and, for a
    /// holder, its size and chunks committed to the journal.
    pub fn fsync(&self, fh: u64) -> Result<()> {
        let ino = self.handle_ino(fh)?;
        self.fs.fsync(ino).unwrap_or(Ok(()))
    }

    /// Closes `fh`.
    pub fn close(&self, fh: u64) -> Result<()> {
        self.here()?;
        let h = self
            .handles
            .lock()
            .remove(&fh)
            .ok_or_else(|| Error::new(libc::EBADF, format!("handle {fh} is not open")))?;
        self.fs.release(fh);
        drop(Looked {
            fs: &self.fs,
            inos: h.looked,
        });
        Ok(())
    }

    /// Serves every read of `reads` at once: their one-sided READs go out together, as many
    /// in flight as fit a pooled buffer (1 MiB: 256 reads of 4 KiB), into a buffer
    /// registered once, then copied to each `buf`. The bytes read into each (short only at
    /// the end of its file).
    pub fn read_many(&self, reads: &mut [ReadRequest<'_>]) -> Result<Vec<usize>> {
        let mut batch = Vec::with_capacity(reads.len());
        for r in reads.iter_mut() {
            let ino = self.handle_ino(r.fh)?;
            batch.push((ino, r.fh, r.offset, &mut *r.buf));
        }
        self.fs.read_many(&mut batch)
    }
}
