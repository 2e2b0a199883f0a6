//! The journal's record format: one committed [`Batch`](super::Batch)'s changes as a framed,
//! checksummed record, and the reader that takes records back from a journal's bytes.
//!
//! Why a format of our own: a volume's journal lives in memory servers and is written by
//! one-sided RDMA WRITEs, so a crash can leave a record half written (a torn tail) and a
//! replica can lag behind the others. A frame carries its log sequence number (LSN), its
//! length and a CRC-32 of the whole frame, so the reader stops at the first frame that is
//! torn, stale (an LSN out of sequence: the ring's older contents) or damaged, and never
//! applies a half-written batch. Records carry images (the new attributes, the new entry, the
//! new chunk), so replaying a journal from a checkpoint's LSN rebuilds the same table.
//!
//! Layout, little-endian: `magic u32, version u16, reserved u16, lsn u64, length u32,
//! crc u32`, then `length` bytes of payload: a count of changes and each change, tagged. The
//! CRC covers the header (its own field as zero) and the payload.

use super::batch::{Change, Seed};
use super::{Attrs, Ino, Kind, Xattrs};
use std::time::{Duration, SystemTime};

mod chunk;
use chunk::put_chunk;

/// "RMJ1": a journal record (and not the ring's zeroed or older bytes).
pub const RECORD_MAGIC: u32 = 0x314a_4d52;
/// The record format this build writes: 2 for a record naming an erasure-coded chunk (or
/// one of four copies), 1 for any other (so a volume without encoded chunks stays readable by builds that read only 1).
/// A reader refuses a newer one, naming both.
pub const RECORD_VERSION: u16 = 2;
/// The format of records that name no encoded chunk.
const PLAIN_VERSION: u16 = 1;
/// Bytes of a frame's header.
pub const HEADER_LEN: usize = 24;
/// The longest payload a frame may claim: a batch of one operation's changes (a rename over
/// a file, a large write's chunk changes) stays far below; a longer claim is damage.
pub const MAX_PAYLOAD: usize = 64 << 20;

/// Why reading stopped before the end of the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The bytes ended on a frame boundary.
    End,
    /// Not a record here: zeros, older contents or a torn header (where the journal ends).
    NoRecord,
    /// A frame whose length runs past the bytes given (a torn write).
    Torn,
    /// A frame whose checksum does not match (torn or damaged).
    BadChecksum,
    /// A frame whose LSN is not the next one (the ring's older contents).
    OutOfSequence { expected: u64, found: u64 },
    /// A record of a newer format than this build reads.
    NewerFormat { found: u16 },
    /// A frame whose checksum matched but whose contents do not parse (a bug, not a crash).
    Malformed(String),
}

/// Records read from a journal's bytes, and where and why reading stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub records: Vec<(u64, Vec<Change>)>,
    /// Bytes of whole, valid frames: where the next record is appended.
    pub end: usize,
    pub stop: Stop,
}

fn crc(header: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&header[..20]);
    h.update(&[0; 4]);
    h.update(payload);
    h.finalize()
}

/// One frame holding `changes` under `lsn`.
pub fn encode(lsn: u64, changes: &[Change]) -> Vec<u8> {
    let mut payload = Vec::new();
    put_u32(&mut payload, changes.len() as u32);
    for c in changes {
        put_change(&mut payload, c);
    }
    // Builds that read only format 1 know no stripe and at most three copies.
    let encoded = changes.iter().any(|c| {
        matches!(c, Change::Extent { chunk: Some(c), .. }
            if c.stripe().is_some() || c.replicas().len() > 3)
    });
    let version = if encoded {
        RECORD_VERSION
    } else {
        PLAIN_VERSION
    };
    let mut frame = Vec::with_capacity(HEADER_LEN + payload.len());
    put_u32(&mut frame, RECORD_MAGIC);
    frame.extend_from_slice(&version.to_le_bytes());
    frame.extend_from_slice(&0u16.to_le_bytes());
    put_u64(&mut frame, lsn);
    put_u32(&mut frame, payload.len() as u32);
    put_u32(&mut frame, 0);
    let sum = crc(&frame, &payload);
    frame[20..24].copy_from_slice(&sum.to_le_bytes());
    frame.extend_from_slice(&payload);
    frame
}

/// Reads the frames of `bytes` from its start, the first of them numbered `first_lsn`.
pub fn read(bytes: &[u8], first_lsn: u64) -> Read {
    let mut records = Vec::new();
    let mut at = 0;
    let mut lsn = first_lsn;
    let stop = loop {
        let rest = &bytes[at..];
        if rest.is_empty() {
            break Stop::End;
        }
        if rest.len() < HEADER_LEN || u32_at(rest, 0) != RECORD_MAGIC {
            break Stop::NoRecord;
        }
        let version = u16::from_le_bytes([rest[4], rest[5]]);
        if version > RECORD_VERSION {
            break Stop::NewerFormat { found: version };
        }
        let found = u64::from_le_bytes(rest[8..16].try_into().expect("8 bytes"));
        let len = u32_at(rest, 16) as usize;
        if len > MAX_PAYLOAD || rest.len() < HEADER_LEN + len {
            break Stop::Torn;
        }
        let payload = &rest[HEADER_LEN..HEADER_LEN + len];
        if crc(rest, payload) != u32_at(rest, 20) {
            break Stop::BadChecksum;
        }
        if found != lsn {
            break Stop::OutOfSequence {
                expected: lsn,
                found,
            };
        }
        match parse_batch(payload) {
            Ok(changes) => records.push((lsn, changes)),
            Err(why) => break Stop::Malformed(why),
        }
        at += HEADER_LEN + len;
        lsn += 1;
    };
    Read {
        records,
        end: at,
        stop,
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len() as u32);
    out.extend_from_slice(b);
}

fn put_time(out: &mut Vec<u8>, t: SystemTime) {
    // Seconds and nanoseconds from the epoch; times before it (a `touch -d 1960`) as a
    // negative second count with a positive nanosecond part, as a timespec.
    let (secs, nanos) = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            match d.subsec_nanos() {
                0 => (-(d.as_secs() as i64), 0),
                n => (-(d.as_secs() as i64) - 1, 1_000_000_000 - n),
            }
        }
    };
    out.extend_from_slice(&secs.to_le_bytes());
    put_u32(out, nanos);
}

fn kind_code(k: Kind) -> u8 {
    match k {
        Kind::File => 1,
        Kind::Dir => 2,
        Kind::Symlink => 3,
        Kind::Fifo => 4,
        Kind::Socket => 5,
        Kind::CharDevice => 6,
        Kind::BlockDevice => 7,
    }
}

fn put_attrs(out: &mut Vec<u8>, a: &Attrs) {
    out.extend_from_slice(&a.perm.to_le_bytes());
    put_u32(out, a.uid);
    put_u32(out, a.gid);
    put_u32(out, a.nlink);
    put_u32(out, a.rdev);
    put_u64(out, a.size);
    for t in [a.atime, a.mtime, a.ctime, a.btime] {
        put_time(out, t);
    }
    put_u32(out, a.flags);
    out.push(u8::from(a.tmpfile) | u8::from(a.overwriting) << 1);
}

fn put_change(out: &mut Vec<u8>, c: &Change) {
    match c {
        Change::Make {
            ino,
            kind,
            attrs,
            seed,
            xattrs,
        } => {
            out.push(1);
            put_u64(out, *ino);
            out.push(kind_code(*kind));
            put_attrs(out, attrs);
            match seed {
                Seed::File => out.push(1),
                Seed::Dir { parent } => {
                    out.push(2);
                    put_u64(out, *parent);
                }
                Seed::Symlink(t) => {
                    out.push(3);
                    put_bytes(out, t);
                }
                Seed::Special => out.push(4),
            }
            let empty = Xattrs::new();
            let x = xattrs.as_ref().unwrap_or(&empty);
            put_u32(out, x.len() as u32);
            for (k, v) in x {
                put_bytes(out, k);
                put_bytes(out, v);
            }
        }
        Change::Attrs { ino, attrs } => {
            out.push(2);
            put_u64(out, *ino);
            put_attrs(out, attrs);
        }
        Change::Entry { dir, name, ino } => {
            out.push(3);
            put_u64(out, *dir);
            put_bytes(out, name);
            match ino {
                Some(i) => {
                    out.push(1);
                    put_u64(out, *i);
                }
                None => out.push(0),
            }
        }
        Change::Parent { dir, parent } => {
            out.push(4);
            put_u64(out, *dir);
            put_u64(out, *parent);
        }
        Change::Xattr { ino, name, value } => {
            out.push(5);
            put_u64(out, *ino);
            put_bytes(out, name);
            match value {
                Some(v) => {
                    out.push(1);
                    put_bytes(out, v);
                }
                None => out.push(0),
            }
        }
        Change::Extent { ino, idx, chunk } => {
            out.push(6);
            put_u64(out, *ino);
            put_u64(out, *idx);
            match chunk {
                Some(c) => {
                    out.push(1);
                    put_chunk(out, c);
                }
                None => out.push(0),
            }
        }
        Change::Drop { ino } => {
            out.push(7);
            put_u64(out, *ino);
        }
        Change::EntryAt {
            dir,
            name,
            ino,
            cookie,
        } => {
            out.push(8);
            put_u64(out, *dir);
            put_bytes(out, name);
            put_u64(out, *ino);
            put_u64(out, *cookie);
        }
        Change::Cookies { dir, next } => {
            out.push(9);
            put_u64(out, *dir);
            put_u64(out, *next);
        }
        Change::Born {
            server,
            birth,
            stale,
        } => {
            out.push(10);
            put_u32(out, *server);
            put_bytes(out, birth);
            out.push(u8::from(*stale));
        }
        Change::DirStamp { dir, time, links } => {
            out.push(11);
            put_u64(out, *dir);
            put_time(out, *time);
            put_u32(out, *links as u32);
        }
    }
}

/// A cursor over a payload; every read checks the bounds (the volume's root reads with it
/// too).
pub(crate) struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(b: &'a [u8]) -> Cursor<'a> {
        Cursor { b, at: 0 }
    }
    /// Bytes not read yet.
    pub(crate) fn left(&self) -> usize {
        self.b.len() - self.at
    }
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| format!("payload ends at {} reading {n} bytes", self.at))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn bytes(&mut self) -> Result<Box<[u8]>, String> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.into())
    }
    fn time(&mut self) -> Result<SystemTime, String> {
        let secs = i64::from_le_bytes(self.take(8)?.try_into().expect("8"));
        let nanos = self.u32()?;
        if nanos >= 1_000_000_000 {
            return Err(format!("a time with {nanos} nanoseconds"));
        }
        let t = if secs >= 0 {
            SystemTime::UNIX_EPOCH.checked_add(Duration::new(secs as u64, nanos))
        } else {
            SystemTime::UNIX_EPOCH
                .checked_sub(Duration::from_secs(secs.unsigned_abs()))
                .and_then(|t| t.checked_add(Duration::from_nanos(nanos.into())))
        };
        t.ok_or_else(|| format!("a time of {secs} s out of range"))
    }
    fn kind(&mut self) -> Result<Kind, String> {
        Ok(match self.u8()? {
            1 => Kind::File,
            2 => Kind::Dir,
            3 => Kind::Symlink,
            4 => Kind::Fifo,
            5 => Kind::Socket,
            6 => Kind::CharDevice,
            7 => Kind::BlockDevice,
            k => return Err(format!("unknown inode kind {k}")),
        })
    }
    fn attrs(&mut self) -> Result<Attrs, String> {
        let mut a = Attrs {
            perm: self.u16()?,
            uid: self.u32()?,
            gid: self.u32()?,
            nlink: self.u32()?,
            rdev: self.u32()?,
            size: self.u64()?,
            atime: self.time()?,
            mtime: self.time()?,
            ctime: self.time()?,
            btime: self.time()?,
            flags: self.u32()?,
            tmpfile: false,
            overwriting: false,
        };
        // One byte of state bits (a record from before the second bit holds 0 or 1).
        let bits = self.u8()?;
        if bits & !0b11 != 0 {
            return Err(format!("unknown inode state bits {bits:#x}"));
        }
        (a.tmpfile, a.overwriting) = (bits & 1 != 0, bits & 2 != 0);
        Ok(a)
    }
    fn opt<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, String>,
    ) -> Result<Option<T>, String> {
        match self.u8()? {
            0 => Ok(None),
            1 => f(self).map(Some),
            t => Err(format!("an option tagged {t}")),
        }
    }
    fn ino(&mut self) -> Result<Ino, String> {
        self.u64()
    }
}

fn parse_batch(payload: &[u8]) -> Result<Vec<Change>, String> {
    let mut c = Cursor { b: payload, at: 0 };
    let n = c.u32()? as usize;
    // Each change takes at least 9 bytes: a claim beyond that is damage, not a batch.
    if n > payload.len() / 9 {
        return Err(format!("{n} changes claimed in {} bytes", payload.len()));
    }
    let mut changes = Vec::with_capacity(n);
    for _ in 0..n {
        changes.push(parse_change(&mut c)?);
    }
    if c.at != payload.len() {
        return Err(format!(
            "{} bytes after the last change",
            payload.len() - c.at
        ));
    }
    Ok(changes)
}

fn parse_change(c: &mut Cursor<'_>) -> Result<Change, String> {
    Ok(match c.u8()? {
        1 => {
            let ino = c.ino()?;
            let kind = c.kind()?;
            let attrs = c.attrs()?;
            let seed = match c.u8()? {
                1 => Seed::File,
                2 => Seed::Dir { parent: c.ino()? },
                3 => Seed::Symlink(c.bytes()?),
                4 => Seed::Special,
                s => return Err(format!("unknown inode seed {s}")),
            };
            let n = c.u32()? as usize;
            let mut x = Xattrs::new();
            for _ in 0..n {
                let k = c.bytes()?;
                let v = c.bytes()?;
                x.insert(k, v);
            }
            Change::Make {
                ino,
                kind,
                attrs,
                seed,
                xattrs: (n > 0).then_some(x),
            }
        }
        2 => Change::Attrs {
            ino: c.ino()?,
            attrs: c.attrs()?,
        },
        3 => Change::Entry {
            dir: c.ino()?,
            name: c.bytes()?.into(),
            ino: c.opt(Cursor::ino)?,
        },
        4 => Change::Parent {
            dir: c.ino()?,
            parent: c.ino()?,
        },
        5 => Change::Xattr {
            ino: c.ino()?,
            name: c.bytes()?,
            value: c.opt(Cursor::bytes)?,
        },
        6 => Change::Extent {
            ino: c.ino()?,
            idx: c.u64()?,
            chunk: c.opt(Cursor::chunk)?,
        },
        7 => Change::Drop { ino: c.ino()? },
        8 => Change::EntryAt {
            dir: c.ino()?,
            name: c.bytes()?.into(),
            ino: c.ino()?,
            cookie: c.u64()?,
        },
        9 => Change::Cookies {
            dir: c.ino()?,
            next: c.u64()?,
        },
        10 => Change::Born {
            server: c.u32()?,
            birth: c.bytes()?,
            stale: c.u8()? != 0,
        },
        11 => Change::DirStamp {
            dir: c.ino()?,
            time: c.time()?,
            links: c.u32()? as i32,
        },
        t => return Err(format!("unknown change tag {t}")),
    })
}

#[cfg(test)]
mod tests;
