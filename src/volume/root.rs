//! A volume's root: the small record every server of the volume keeps for it (set by the
//! holder with `VolumeRoot`), saying where the checkpoint and the journal ring are.
//!
//! Why a root at all: the journal and checkpoint are extents like any other; after a crash
//! the next holder must find them without the namespace they describe. Every server keeps the
//! latest root it was given; attach takes the newest: the highest holder's epoch, then the
//! highest generation (a fenced holder that got a server back, one that had forgotten the
//! volume, writes roots there at its old epoch and higher generations: they never win). Its
//! format is
//! versioned: a newer daemon reads older roots, an older one refuses a newer root naming both
//! versions.

use crate::meta::record::Cursor;

/// "RMV1".
const ROOT_MAGIC: u32 = 0x3156_4d52;
/// The root format this build writes.
/// 2: the holder's epoch after the generation.
pub const ROOT_VERSION: u16 = 2;

/// One copy of an extent of the volume's own (ring or checkpoint): server index in
/// [`Root::servers`], remote address and key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub server: u32,
    pub addr: u64,
    pub rkey: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Root {
    /// Bumped at every change: the highest on any server, among the roots of the highest
    /// epoch, is the current root.
    pub generation: u64,
    /// The epoch of the holder that set it (0 in format 1).
    pub epoch: u64,
    /// The servers the volume's records name by index (`host:port`).
    pub servers: Vec<String>,
    /// Bytes per chunk: the records' chunk indexes count in it, so every holder must use it.
    pub chunk_size: u64,
    /// The checkpoint's copies, its length in bytes, the LSN it holds everything up to, and
    /// the inode number the next new inode takes.
    pub checkpoint: Vec<Place>,
    pub checkpoint_len: u64,
    pub checkpoint_lsn: u64,
    pub next_ino: u64,
    /// The ring's copies and length; its first record is `checkpoint_lsn + 1`, at offset 0.
    pub ring: Vec<Place>,
    pub ring_len: u64,
    /// For `volume status`, as of the checkpoint: files, bytes of file data, and when.
    pub files: u64,
    pub bytes: u64,
    pub checkpoint_unix: u64,
}

fn put_places(out: &mut Vec<u8>, places: &[Place]) {
    out.push(places.len() as u8);
    for p in places {
        out.extend_from_slice(&p.server.to_le_bytes());
        out.extend_from_slice(&p.addr.to_le_bytes());
        out.extend_from_slice(&p.rkey.to_le_bytes());
    }
}

fn places(c: &mut Cursor<'_>) -> Result<Vec<Place>, String> {
    let n = c.u8()?;
    (0..n)
        .map(|_| {
            Ok(Place {
                server: c.u32()?,
                addr: c.u64()?,
                rkey: c.u64()?,
            })
        })
        .collect()
}

impl Root {
    /// How roots are ordered: the newest is the greatest.
    pub fn order(&self) -> (u64, u64) {
        (self.epoch, self.generation)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(&ROOT_MAGIC.to_le_bytes());
        out.extend_from_slice(&ROOT_VERSION.to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.push(self.servers.len() as u8);
        for s in &self.servers {
            out.push(s.len() as u8);
            out.extend_from_slice(s.as_bytes());
        }
        out.extend_from_slice(&self.chunk_size.to_le_bytes());
        put_places(&mut out, &self.checkpoint);
        for v in [self.checkpoint_len, self.checkpoint_lsn, self.next_ino] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        put_places(&mut out, &self.ring);
        for v in [self.ring_len, self.files, self.bytes, self.checkpoint_unix] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let sum = crc32fast::hash(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Reads a root; `Ok(None)` for an empty one (a volume whose holder never set it).
    pub fn decode(bytes: &[u8]) -> Result<Option<Root>, String> {
        if bytes.is_empty() {
            return Ok(None);
        }
        if bytes.len() < 4 + 2 + 4 {
            return Err("volume root truncated".into());
        }
        let (body, sum) = bytes.split_at(bytes.len() - 4);
        let mut c = Cursor::new(body);
        if c.u32()? != ROOT_MAGIC {
            return Err("not a volume root (bad magic)".into());
        }
        let version = c.u16()?;
        if version > ROOT_VERSION {
            return Err(format!(
                "the volume's root is format {version}; this rmemfs reads formats up to \
                 {ROOT_VERSION}: upgrade rmemfs to attach it"
            ));
        }
        if crc32fast::hash(body) != u32::from_le_bytes(sum.try_into().expect("4")) {
            return Err("volume root damaged (checksum)".into());
        }
        let generation = c.u64()?;
        let epoch = if version >= 2 { c.u64()? } else { 0 };
        let n = c.u8()?;
        let mut servers = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let len = c.u8()? as usize;
            let s = std::str::from_utf8(c.take(len)?).map_err(|_| "bad server name".to_string())?;
            servers.push(s.to_string());
        }
        let chunk_size = c.u64()?;
        let checkpoint = places(&mut c)?;
        let (checkpoint_len, checkpoint_lsn, next_ino) = (c.u64()?, c.u64()?, c.u64()?);
        let ring = places(&mut c)?;
        let root = Root {
            generation,
            epoch,
            servers,
            chunk_size,
            checkpoint,
            checkpoint_len,
            checkpoint_lsn,
            next_ino,
            ring,
            ring_len: c.u64()?,
            files: c.u64()?,
            bytes: c.u64()?,
            checkpoint_unix: c.u64()?,
        };
        if c.left() != 0 {
            return Err("volume root has trailing bytes".into());
        }
        Ok(Some(root))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Root {
        Root {
            generation: 7,
            epoch: 3,
            servers: vec!["127.0.0.1:7471".into(), "127.0.0.2:7471".into()],
            chunk_size: 1 << 20,
            checkpoint: vec![Place {
                server: 1,
                addr: 0x1000,
                rkey: 9,
            }],
            checkpoint_len: 4096,
            checkpoint_lsn: 41,
            next_ino: 100,
            ring: vec![
                Place {
                    server: 0,
                    addr: 0x2000,
                    rkey: 3,
                },
                Place {
                    server: 1,
                    addr: 0x9000,
                    rkey: 4,
                },
            ],
            ring_len: 1 << 20,
            files: 3,
            bytes: 12,
            checkpoint_unix: 1_700_000_000,
        }
    }

    #[test]
    fn a_root_round_trips_and_damage_is_refused() {
        let r = sample();
        let bytes = r.encode();
        assert_eq!(Root::decode(&bytes).unwrap(), Some(r));
        assert_eq!(Root::decode(&[]).unwrap(), None);
        let mut bad = bytes.clone();
        bad[20] ^= 1;
        assert!(Root::decode(&bad).unwrap_err().contains("checksum"));
        assert!(Root::decode(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn a_newer_root_format_is_refused_naming_both_versions() {
        let mut bytes = sample().encode();
        bytes[4..6].copy_from_slice(&(ROOT_VERSION + 1).to_le_bytes());
        let e = Root::decode(&bytes).unwrap_err();
        assert!(e.contains(&format!("format {}", ROOT_VERSION + 1)), "{e}");
        assert!(e.contains(&format!("up to {ROOT_VERSION}")), "{e}");
    }
}
