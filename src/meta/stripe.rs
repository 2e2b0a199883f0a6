//! Erasure codes and the stripes they make of a chunk: a code's shape (`K+M`), a file's
//! redundancy (copies or a code), and an encoded chunk's fragments. Data only: what encodes
//! and decodes is `data::coding`.

use super::Replica;

/// An erasure code's shape (`--redundancy ec:K+M`): `k` data fragments and `m` parity
/// fragments, any `k` of which give the chunk back, so `m` servers may be lost at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coding {
    pub k: u8,
    pub m: u8,
}

impl Coding {
    /// Most data fragments: 16 keeps a 1 MiB chunk's fragments at 64 KiB or more (a
    /// fragment shorter than that costs a round trip for too few bytes).
    pub const MAX_K: usize = 16;
    /// Most parity fragments: 4 faults at once is beyond what a rack's spare memory is
    /// asked to survive (three copies survive two).
    pub const MAX_M: usize = 4;

    /// Whether `k` and `m` make a code this build uses: 2 to [`Self::MAX_K`] data fragments
    /// (one would be a copy) and 1 to [`Self::MAX_M`] parity fragments.
    pub fn valid(k: usize, m: usize) -> bool {
        (2..=Self::MAX_K).contains(&k) && (1..=Self::MAX_M).contains(&m)
    }

    /// Servers a stripe spans.
    pub fn width(&self) -> usize {
        self.k as usize + self.m as usize
    }
}

impl std::str::FromStr for Coding {
    type Err = String;
    /// `K+M`, as in `4+2`.
    fn from_str(s: &str) -> Result<Coding, String> {
        let bad = || {
            format!(
                "'{s}': an erasure code is K+M, K data fragments (2 to {}) and M parity \
                 fragments (1 to {}), as in 4+2",
                Self::MAX_K,
                Self::MAX_M
            )
        };
        let (k, m) = s.split_once('+').ok_or_else(bad)?;
        let (k, m): (usize, usize) = (
            k.trim().parse().map_err(|_| bad())?,
            m.trim().parse().map_err(|_| bad())?,
        );
        if !Coding::valid(k, m) {
            return Err(bad());
        }
        Ok(Coding {
            k: k as u8,
            m: m as u8,
        })
    }
}

impl std::fmt::Display for Coding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}+{}", self.k, self.m)
    }
}

/// What keeps a file's data: copies (as many as the mount keeps), or stripes of an erasure
/// code once cold. A file's or directory's `user.rmemfs.redundancy` attribute says it
/// (`copies` or `ec:K+M`); without one, the mount's `--redundancy` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redundancy {
    Copies,
    Coded(Coding),
}

impl std::str::FromStr for Redundancy {
    type Err = String;
    fn from_str(s: &str) -> Result<Redundancy, String> {
        match s.split_once(':') {
            None if s == "copies" => Ok(Redundancy::Copies),
            Some(("ec", code)) => code.parse().map(Redundancy::Coded),
            _ => Err(format!(
                "'{s}': redundancy is copies or ec:K+M (as in ec:4+2)"
            )),
        }
    }
}

impl std::fmt::Display for Redundancy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Redundancy::Copies => write!(f, "copies"),
            Redundancy::Coded(c) => write!(f, "ec:{c}"),
        }
    }
}

/// An erasure-coded chunk's fragments (`--redundancy ec:K+M`, see `data::coding`): the
/// chunk's bytes cut into `k` data fragments of `frag_len` bytes each (fragment `i` holds
/// chunk bytes `[i*frag_len, (i+1)*frag_len)`, the last one zero-padded), then `m` parity
/// fragments, each on its own server. A stripe is never written in place: a write to the
/// chunk makes it copies again first, so the fragments always decode to the chunk's bytes
/// (no write hole). `id` names this stripe's bytes (a decoded stripe is cached under it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stripe {
    pub id: u64,
    pub k: u8,
    pub m: u8,
    pub frag_len: u64,
    /// `k + m` fragments in order, data first; none: lost (its server restarted empty).
    pub frags: Vec<Option<Replica>>,
}

impl Stripe {
    pub fn coding(&self) -> Coding {
        Coding {
            k: self.k,
            m: self.m,
        }
    }

    /// The fragments still listed, with their positions.
    pub fn present(&self) -> impl Iterator<Item = (usize, Replica)> + '_ {
        self.frags
            .iter()
            .enumerate()
            .filter_map(|(i, f)| f.map(|r| (i, r)))
    }
}
