//! A chunk in a record: its length, then its copies, or its stripe (format 2).

use super::{put_u32, put_u64, Cursor};
use crate::meta::{Chunk, Replica, MAX_REPLICAS};

/// A chunk's copy count with this bit set: an encoded chunk (a stripe follows).
const ENCODED: u8 = 0x80;

fn put_replica(out: &mut Vec<u8>, r: &Replica) {
    put_u32(out, r.server);
    put_u64(out, r.addr);
    put_u64(out, r.rkey);
}

pub(super) fn put_chunk(out: &mut Vec<u8>, c: &Chunk) {
    put_u64(out, c.len);
    if let Some(s) = c.stripe() {
        out.push(ENCODED);
        put_u64(out, s.id);
        out.push(s.k);
        out.push(s.m);
        put_u64(out, s.frag_len);
        for f in &s.frags {
            out.push(u8::from(f.is_some()));
            if let Some(r) = f {
                put_replica(out, r);
            }
        }
        return;
    }
    out.push(c.replicas().len() as u8);
    for r in c.replicas() {
        put_replica(out, r);
    }
}

impl Cursor<'_> {
    fn replica(&mut self) -> Result<Replica, String> {
        Ok(Replica {
            server: self.u32()?,
            addr: self.u64()?,
            rkey: self.u64()?,
        })
    }
    pub(super) fn chunk(&mut self) -> Result<Chunk, String> {
        let len = self.u64()?;
        let n = self.u8()?;
        if n == ENCODED {
            return self.stripe(len);
        }
        let n = n as usize;
        if n > MAX_REPLICAS {
            return Err(format!("a chunk with {n} copies"));
        }
        let mut replicas = Vec::with_capacity(n);
        for _ in 0..n {
            replicas.push(self.replica()?);
        }
        Ok(Chunk::with_replicas(len, &replicas))
    }
    fn stripe(&mut self, len: u64) -> Result<Chunk, String> {
        let id = self.u64()?;
        let (k, m) = (self.u8()?, self.u8()?);
        let frag_len = self.u64()?;
        if !crate::meta::Coding::valid(k as usize, m as usize)
            || frag_len.checked_mul(k as u64).is_none_or(|all| all < len)
        {
            return Err(format!(
                "an encoded chunk of {len} bytes as {k}+{m} fragments of {frag_len}"
            ));
        }
        let mut frags = Vec::with_capacity((k + m) as usize);
        for _ in 0..k + m {
            frags.push(match self.u8()? {
                0 => None,
                1 => Some(self.replica()?),
                b => return Err(format!("a fragment marked {b:#x}")),
            });
        }
        Ok(Chunk::encoded(
            len,
            crate::meta::Stripe {
                id,
                k,
                m,
                frag_len,
                frags,
            },
        ))
    }
}
