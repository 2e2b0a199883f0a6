//! `fallocate(2)`: reserving, punching, zeroing, collapsing and inserting ranges.

use super::rules::{check_not_immutable, FS_APPEND_FL};
use super::{err, inode, Caller, Fs, BLOCK};
use crate::error::{Error, Result};
use crate::meta::Ino;

impl Fs {
    /// `fallocate(2)`, as Linux file systems do it:
    /// - mode 0 reserves remote memory and extends the size; `FALLOC_FL_KEEP_SIZE` only
    ///   reserves;
    /// - `PUNCH_HOLE` (with `KEEP_SIZE`) gives back the chunks inside the range and zeroes
    ///   the rest of it;
    /// - `ZERO_RANGE` punches, then reserves the range (extending the size unless
    ///   `KEEP_SIZE`);
    /// - `COLLAPSE_RANGE` removes the range, `INSERT_RANGE` opens a hole there, moving what
    ///   follows; both want [`BLOCK`]-aligned ranges inside the file (EINVAL otherwise, as on
    ///   ext4), and renumber whole chunks when the range is whole chunks, else copy.
    ///
    /// Any other mode is EOPNOTSUPP. An unprivileged caller drops the file's set-ID bits.
    pub fn fallocate(
        &self,
        ino: Ino,
        fh: u64,
        offset: u64,
        len: u64,
        mode: i32,
        caller: Caller,
    ) -> Result<()> {
        let _turn = self.file_turn(ino)?;
        let op = mode & !libc::FALLOC_FL_KEEP_SIZE;
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let shifts = op == libc::FALLOC_FL_COLLAPSE_RANGE || op == libc::FALLOC_FL_INSERT_RANGE;
        let known = [
            0,
            libc::FALLOC_FL_PUNCH_HOLE,
            libc::FALLOC_FL_ZERO_RANGE,
            libc::FALLOC_FL_COLLAPSE_RANGE,
            libc::FALLOC_FL_INSERT_RANGE,
        ];
        if !known.contains(&op)
            || (op == libc::FALLOC_FL_PUNCH_HOLE && !keep_size)
            || (shifts && keep_size)
        {
            return Err(err(libc::EOPNOTSUPP));
        }
        if len == 0 {
            return Err(err(libc::EINVAL));
        }
        if !self.handle(fh, ino)?.write {
            return Err(err(libc::EBADF));
        }
        let end = self.data.check_end(offset, len)?;
        let file = self.file_data(ino)?;
        // Every mode but plain allocation changes bytes the file holds in place (a punch or
        // zeroed range, or all it holds from `offset` on when ranges shift).
        let mut io = if op == 0 {
            self.data.lock(&file)
        } else {
            self.lock_for_overwrite(ino, &file, |i| (offset, if shifts { i.size } else { end }))?
        };
        let size = {
            let meta = self.meta.lock();
            let i = inode(&meta, ino)?;
            check_not_immutable(i)?;
            // An append-only file may only have room reserved past its end.
            if i.flags & FS_APPEND_FL != 0 && !(op == 0 && keep_size) {
                return Err(Error::new(
                    libc::EPERM,
                    "the file is append-only (chattr +a)",
                ));
            }
            i.size
        };
        let changed = match op {
            libc::FALLOC_FL_COLLAPSE_RANGE | libc::FALLOC_FL_INSERT_RANGE => {
                if !offset.is_multiple_of(BLOCK) || !len.is_multiple_of(BLOCK) {
                    return Err(err(libc::EINVAL));
                }
                if op == libc::FALLOC_FL_COLLAPSE_RANGE {
                    if end >= size {
                        return Err(err(libc::EINVAL));
                    }
                    io.collapse(offset, len, size).map(|()| size - len)
                } else {
                    if offset >= size {
                        return Err(err(libc::EINVAL));
                    }
                    let grown = self
                        .data
                        .check_end(size, len)
                        .map_err(|_| err(libc::EFBIG))?;
                    io.insert(offset, len, size).map(|()| grown)
                }
            }
            _ => (|| {
                if !keep_size && end > size {
                    io.zero_past_end(size, end)?;
                }
                if op != 0 {
                    io.punch(offset, len)?;
                }
                if op != libc::FALLOC_FL_PUNCH_HOLE {
                    io.allocate(offset, len)?;
                }
                Ok::<_, Error>(if keep_size { size } else { size.max(end) })
            })(),
        };
        {
            let mut meta = self.meta.lock();
            let mut b = meta.batch();
            if let Ok(new_size) = changed {
                let now = crate::meta::now();
                b.update(ino, |a| {
                    if new_size != a.size {
                        a.size = new_size;
                        a.ctime = now;
                    }
                    if op != 0 {
                        // The contents changed.
                        a.mtime = now;
                        a.ctime = now;
                    }
                })?;
            }
            Self::commit_with(b, ino, &mut io)?;
        }
        self.settle_overwrite(ino, &io);
        changed?;
        drop(io);
        self.drop_set_id_bits(ino, &caller)
    }
}
