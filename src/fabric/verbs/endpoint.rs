//! A queue pair's data-path address as the two sides exchange it (the `Connect` blob), and
//! the ACK timeout that makes a QP's retries last the op timeout. Plain data, no device: so
//! that its tests run in every build, `fabric/mod.rs` also compiles this file for tests
//! without the `verbs` feature.

use std::time::Duration;

/// The 24 bits of a packet sequence number (and of a QP number).
pub(super) const PSN_MASK: u32 = 0x00ff_ffff;

/// ACK retries before a request fails with a transport error (the verbs maximum).
pub(super) const RETRY_COUNT: u8 = 7;

/// The QP's local ACK timeout exponent (4.096 µs × 2^t) so that all retries together take
/// about `op_timeout`.
pub(super) fn ack_timeout_for(op_timeout: Duration) -> u8 {
    let per_try_us = op_timeout.as_micros() as f64 / f64::from(RETRY_COUNT + 1);
    let t = (per_try_us / 4.096).max(1.0).log2().floor() as i64;
    // 14 (67 ms) keeps rxe under TCG, where one 1 MiB transfer takes 30 ms, from retrying
    // spuriously; 24 (69 s) is far beyond any timeout anyone sets.
    t.clamp(14, 24) as u8
}

/// The data-path address of one side of a QP, as exchanged in the `Connect` blobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Endpoint {
    pub(super) qpn: u32,
    pub(super) psn: u32,
    pub(super) lid: u16,
    pub(super) mtu: u8,
    pub(super) gid: [u8; 16],
}

const BLOB_MAGIC: &[u8; 4] = b"RMVB";
const BLOB_VERSION: u8 = 1;
const BLOB_LEN: usize = 4 + 1 + 1 + 2 + 4 + 4 + 16;

impl Endpoint {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(BLOB_LEN);
        v.extend_from_slice(BLOB_MAGIC);
        v.push(BLOB_VERSION);
        v.push(self.mtu);
        v.extend_from_slice(&self.lid.to_le_bytes());
        v.extend_from_slice(&self.qpn.to_le_bytes());
        v.extend_from_slice(&self.psn.to_le_bytes());
        v.extend_from_slice(&self.gid);
        v
    }

    pub(super) fn decode(b: &[u8]) -> Result<Endpoint, String> {
        if b.len() != BLOB_LEN || &b[..4] != BLOB_MAGIC {
            return Err(format!(
                "not a verbs endpoint ({} bytes; is the peer on another fabric?)",
                b.len()
            ));
        }
        if b[4] != BLOB_VERSION {
            return Err(format!(
                "verbs endpoint version {} (expected {BLOB_VERSION})",
                b[4]
            ));
        }
        let mtu = b[5];
        if !(1..=5).contains(&mtu) {
            return Err(format!("invalid path MTU code {mtu}"));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let mut gid = [0; 16];
        gid.copy_from_slice(&b[16..32]);
        Ok(Endpoint {
            mtu,
            lid: u16::from_le_bytes([b[6], b[7]]),
            qpn: u32_at(8) & PSN_MASK,
            psn: u32_at(12) & PSN_MASK,
            gid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_blob_round_trips_and_rejects_junk() {
        let e = Endpoint {
            qpn: 0x12_3456,
            psn: 0xab_cdef,
            lid: 7,
            mtu: 3,
            gid: [9; 16],
        };
        assert_eq!(Endpoint::decode(&e.encode()).unwrap(), e);
        assert!(Endpoint::decode(&[]).is_err());
        assert!(Endpoint::decode(&[0u8; 2]).is_err());
        let mut bad = e.encode();
        bad[4] = 99;
        assert!(Endpoint::decode(&bad).is_err());
        let mut bad = e.encode();
        bad[5] = 0;
        assert!(Endpoint::decode(&bad).is_err());
    }

    #[test]
    fn ack_timeout_tracks_the_op_timeout() {
        // 4.096 µs × 2^t × 8 tries ≈ the op timeout, within a factor of two.
        for secs in [1u64, 3, 10, 60] {
            let t = ack_timeout_for(Duration::from_secs(secs));
            let total = 4.096e-6 * f64::from(1u32 << t) * f64::from(RETRY_COUNT + 1);
            assert!(
                total <= secs as f64 && total * 2.0 > secs as f64,
                "{secs}s: t={t}"
            );
        }
        assert_eq!(ack_timeout_for(Duration::from_millis(1)), 14);
    }
}
