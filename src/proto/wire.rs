//! The wire's primitives: message type bytes and little-endian field writers and readers.
//! Decoding never panics: every length is checked against the frame and its limit.

use super::{Capacity, ProtoError, MAX_STRING_LEN};

pub(super) mod tag {
    pub const HELLO: u8 = 1;
    pub const WELCOME: u8 = 2;
    pub const CONNECT: u8 = 3;
    pub const CONNECTED: u8 = 4;
    pub const ALLOC: u8 = 5;
    pub const ALLOCATED: u8 = 6;
    pub const FREE: u8 = 7;
    pub const FREED: u8 = 8;
    pub const STAT: u8 = 9;
    pub const STATS: u8 = 10;
    pub const REFUSED: u8 = 11;
    pub const FATAL: u8 = 12;
    pub const CHALLENGE: u8 = 13;
    pub const PROOF: u8 = 14;
    pub const RESUME: u8 = 15;
    pub const RESUMED: u8 = 16;
    pub const GOODBYE: u8 = 17;
    pub const VOLUME_CLAIM: u8 = 18;
    pub const VOLUME_CLAIMED: u8 = 19;
    pub const VOLUME_ROOT: u8 = 20;
    pub const VOLUME_DONE: u8 = 21;
    pub const VOLUME_EXTENTS: u8 = 22;
    pub const EXTENT_LIST: u8 = 23;
    pub const VOLUME_LIST: u8 = 24;
    pub const VOLUMES: u8 = 25;
    pub const VOLUME_DROP: u8 = 26;
    pub const PERSIST: u8 = 27;
    pub const PERSISTED: u8 = 28;
    pub const FOLLOW_AT: u8 = 29;
    pub const FOLLOW_ROOT: u8 = 30;
    pub const FOLLOWERS: u8 = 31;
    pub const FOLLOWER_FLOOR: u8 = 32;
    pub const EVICT: u8 = 33;
    pub const MEMBER_EXTENTS: u8 = 34;
}

pub(super) struct Writer(pub(super) Vec<u8>);

impl Writer {
    pub(super) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(super) fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(super) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(super) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(super) fn bytes(&mut self, v: &[u8], max: usize) {
        // Encoding is under our control: clamp rather than emit something the peer rejects.
        let v = &v[..v.len().min(max)];
        self.u16(v.len() as u16);
        self.0.extend_from_slice(v);
    }
    pub(super) fn string(&mut self, s: &str) {
        let mut end = s.len().min(MAX_STRING_LEN);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.bytes(&s.as_bytes()[..end], MAX_STRING_LEN);
    }
    pub(super) fn array(&mut self, v: &[u8; 32]) {
        self.0.extend_from_slice(v);
    }
    pub(super) fn capacity(&mut self, c: &Capacity) {
        self.u64(c.total);
        self.u64(c.free);
        self.u64(c.largest_free);
    }
}

pub(super) struct Reader<'a> {
    pub(super) buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.buf.len() < n {
            return Err(ProtoError::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    pub(super) fn u8(&mut self) -> Result<u8, ProtoError> {
        Ok(self.take(1)?[0])
    }
    pub(super) fn u16(&mut self) -> Result<u16, ProtoError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    pub(super) fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub(super) fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub(super) fn bytes(&mut self, max: usize, what: &'static str) -> Result<&'a [u8], ProtoError> {
        let n = self.u16()? as usize;
        if n > max {
            return Err(ProtoError::BadField(what, n as u64));
        }
        self.take(n)
    }
    pub(super) fn string(&mut self, what: &'static str) -> Result<String, ProtoError> {
        let b = self.bytes(MAX_STRING_LEN, what)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| ProtoError::BadString)
    }
    pub(super) fn array(&mut self) -> Result<[u8; 32], ProtoError> {
        Ok(self.take(32)?.try_into().expect("32 bytes"))
    }
    pub(super) fn bool(&mut self, what: &'static str) -> Result<bool, ProtoError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(ProtoError::BadField(what, other as u64)),
        }
    }
    pub(super) fn capacity(&mut self) -> Result<Capacity, ProtoError> {
        let c = Capacity {
            total: self.u64()?,
            free: self.u64()?,
            largest_free: self.u64()?,
        };
        if c.free > c.total {
            return Err(ProtoError::BadField("free capacity", c.free));
        }
        if c.largest_free > c.free {
            return Err(ProtoError::BadField("largest free extent", c.largest_free));
        }
        Ok(c)
    }
}
