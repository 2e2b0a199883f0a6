//! Decoding one lost fragment's columns as a weighted sum of K others.
//!
//! Why not the crate's decoder for every degraded read: `reed-solomon-simd` decodes with
//! transforms over 2^⌈log2(K+M)⌉ shards plus a fixed 2^16-point evaluation per call, about
//! 2.6 ns per shard byte here, which made a degraded sequential read CPU-bound at 0.47 of a
//! healthy one. The code is linear over GF(2^16), so a lost fragment is `Σ c_j · shard_j`
//! for coefficients that depend only on the code and on which fragments are at hand. The
//! crate's own decoder, run once on a 64-byte probe (shard `j`'s symbol `j` set to the
//! field's one, every other symbol zero), gives all K of them (restored symbol `j` is
//! `c_j`); they are kept per thread by loss pattern, and each decode is then K multiplies and
//! XORs over the columns with the crate's SIMD engine. The bytes are the crate's decode's by
//! construction (the coefficients come from it; `tests` compares the two).

use crate::error::{Error, Result};
use reed_solomon_simd::engine::{self, DefaultEngine, Engine, GfElement};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// The crate's blocks: 32 symbols of GF(2^16) in 64 bytes, low bytes then high bytes.
const BLOCK: usize = 64;
const SYMBOLS: usize = BLOCK / 2;

/// A loss pattern: K and M, the fragment to restore, the K fragments it is restored from
/// (in the order their shards are given).
type Pattern = (usize, usize, usize, Vec<usize>);

/// For each shard of a pattern, the log of its coefficient (none: the coefficient is zero).
type Weights = Rc<Vec<Option<GfElement>>>;

struct Decoder {
    engine: DefaultEngine,
    weights: HashMap<Pattern, Weights>,
    /// The sum, and one shard being multiplied (reused: no allocation per decode).
    sum: Vec<[u8; BLOCK]>,
    term: Vec<[u8; BLOCK]>,
}

thread_local! {
    static DECODER: RefCell<Option<Decoder>> = const { RefCell::new(None) };
}

fn code_error(e: reed_solomon_simd::Error) -> Error {
    Error::new(libc::EIO, format!("erasure code: {e}"))
}

/// The coefficients restoring fragment `lost` from fragments `from` (of a K+M code), from
/// one decode of a probe by the crate's decoder.
fn weights(k: usize, m: usize, lost: usize, from: &[usize]) -> Result<Vec<Option<GfElement>>> {
    let tables = engine::tables::get_exp_log();
    // The field's one: the element whose log is 0.
    let one = tables.exp[0];
    let mut dec = reed_solomon_simd::ReedSolomonDecoder::new(k, m, BLOCK).map_err(code_error)?;
    for (j, &i) in from.iter().enumerate() {
        let mut probe = [0u8; BLOCK];
        probe[j] = one as u8;
        probe[j + SYMBOLS] = (one >> 8) as u8;
        match i < k {
            true => dec.add_original_shard(i, probe),
            false => dec.add_recovery_shard(i - k, probe),
        }
        .map_err(code_error)?;
    }
    let restored = dec.decode().map_err(code_error)?;
    let out = restored
        .restored_original(lost)
        .ok_or_else(|| Error::new(libc::EIO, format!("fragment {lost} was not decoded")))?;
    Ok((0..from.len())
        .map(|j| {
            let c = out[j] as GfElement | (out[j + SYMBOLS] as GfElement) << 8;
            (c != 0).then(|| tables.log[c as usize])
        })
        .collect())
}

/// Restores data fragment `lost` of a K+M code over `shards` (each `(fragment, bytes)`, K of
/// them, equally long, a multiple of 64 bytes) and hands its bytes to `take`.
pub(super) fn restore(
    k: usize,
    m: usize,
    lost: usize,
    shards: &[(usize, &[u8])],
    take: impl FnOnce(&[u8]),
) -> Result<()> {
    assert!(shards.len() == k && k <= SYMBOLS, "K shards, K at most 32");
    let len = shards.first().map_or(0, |(_, s)| s.len());
    assert!(
        len.is_multiple_of(BLOCK) && shards.iter().all(|(_, s)| s.len() == len),
        "shards of whole 64-byte blocks, equally long"
    );
    DECODER.with(|d| {
        let mut d = d.borrow_mut();
        let d = d.get_or_insert_with(|| Decoder {
            engine: DefaultEngine::new(),
            weights: HashMap::new(),
            sum: Vec::new(),
            term: Vec::new(),
        });
        let from: Vec<usize> = shards.iter().map(|(i, _)| *i).collect();
        let pattern = (k, m, lost, from);
        let w = match d.weights.get(&pattern) {
            Some(w) => w.clone(),
            None => {
                let w = Rc::new(weights(k, m, lost, &pattern.3)?);
                d.weights.insert(pattern, w.clone());
                w
            }
        };
        let blocks = len / BLOCK;
        d.sum.clear();
        d.sum.resize(blocks, [0; BLOCK]);
        d.term.resize(blocks, [0; BLOCK]);
        for ((_, bytes), log) in shards.iter().zip(w.iter()) {
            let Some(log) = *log else { continue };
            let term = &mut d.term[..blocks];
            term.as_flattened_mut().copy_from_slice(bytes);
            if log != 0 {
                d.engine.mul(term, log);
            }
            engine::utils::xor(&mut d.sum, term);
        }
        take(d.sum.as_flattened());
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(seed: usize, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed * 97) >> 7) as u8)
            .collect()
    }

    /// Every loss pattern of small codes, and some of wide ones: the weighted sum restores
    /// the crate's bytes.
    #[test]
    fn restores_what_the_crates_decoder_restores() {
        for (k, m) in [(2, 1), (4, 2), (3, 2), (8, 3), (16, 4)] {
            let len = 4096;
            let orig: Vec<Vec<u8>> = (0..k).map(|i| shard(i, len)).collect();
            let rec = reed_solomon_simd::encode(k, m, &orig).unwrap();
            let frag = |i: usize| -> &[u8] {
                match i < k {
                    true => &orig[i],
                    false => &rec[i - k],
                }
            };
            for (lost, want) in orig.iter().enumerate() {
                // The K others from the front, and (with M > 1) from the back: parity first.
                let others: Vec<usize> = (0..k + m).filter(|&i| i != lost).collect();
                let mut choices = vec![others[..k].to_vec()];
                if m > 1 {
                    choices.push(others[others.len() - k..].to_vec());
                }
                for from in choices {
                    let shards: Vec<(usize, &[u8])> = from.iter().map(|&i| (i, frag(i))).collect();
                    let mut got = Vec::new();
                    restore(k, m, lost, &shards, |b| got = b.to_vec()).unwrap();
                    assert!(got == *want, "{k}+{m}: fragment {lost} from {from:?}");
                }
            }
        }
    }

    /// A coefficient mistaken (the probe read from the wrong symbol) gives wrong bytes: the
    /// check above can fail.
    #[test]
    fn a_wrong_weight_is_wrong_bytes() {
        let (k, m) = (4, 2);
        let orig: Vec<Vec<u8>> = (0..k).map(|i| shard(i, 256)).collect();
        let rec = reed_solomon_simd::encode(k, m, &orig).unwrap();
        let from = [1usize, 2, 3, 4];
        let mut w = weights(k, m, 0, &from).unwrap();
        w.swap(0, 3);
        let e = DefaultEngine::new();
        let mut sum = vec![[0u8; BLOCK]; 256 / BLOCK];
        for (i, log) in from.iter().zip(w) {
            let src: &[u8] = if *i < k { &orig[*i] } else { &rec[*i - k] };
            let mut t = vec![[0u8; BLOCK]; 256 / BLOCK];
            t.as_flattened_mut().copy_from_slice(src);
            if let Some(log) = log {
                e.mul(&mut t, log);
                engine::utils::xor(&mut sum, &t);
            }
        }
        assert!(sum.as_flattened() != &orig[0][..]);
    }
}
