//! The encoder (`--redundancy ec:K+M`): chunks of files no write has touched for
//! [`crate::config::EC_COLD_AFTER`] become erasure-coded stripes, and their copies are freed
//! (see `data::coding` for why only cold data is encoded).
//!
//! One pass visits every file; each chunk is encoded with its file's chunk map locked for
//! writing, so no write races it (a write lands before the encoding, and is encoded, or
//! after, and finds the chunk copies again), and the change is committed as any chunk
//! change (a volume's journal records the stripe before its copies are freed).

use super::rebuild::Stop;
use crate::fs::Fs;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How often the encoder looks for cold chunks, on a mount with `--redundancy` (a mount
/// without one looks every [`ENCODE_SCAN_UNASKED`], for files given a code of their own).
pub const ENCODE_SCAN: Duration = Duration::from_secs(1);
pub const ENCODE_SCAN_UNASKED: Duration = Duration::from_secs(10);

/// What `stats` shows of the encoder.
#[derive(Debug, Default)]
pub struct EncodeStats {
    pub running: AtomicBool,
    pub passes: AtomicU64,
    /// Chunks made stripes, and the bytes their fragments took.
    pub stripes_made: AtomicU64,
    pub bytes_written: AtomicU64,
    /// Chunks left as copies at the end of the last pass that an erasure code is to encode:
    /// their files were written to too lately, too few servers are up for the fragments, or
    /// encoding failed (0: all encoded).
    pub pending: AtomicU64,
}

/// One pass of the encoder over every file (each file's code: its own redundancy attribute,
/// else the mount's); returns the chunks left to encode.
pub fn pass(fs: &Fs, stop: &Stop, stats: &EncodeStats) -> u64 {
    let data = fs.data();
    stats.running.store(true, Ordering::Relaxed);
    let mut pending = 0;
    for (ino, file) in fs.files_by_ino() {
        let Some(coding) = fs.file_coding(ino) else {
            continue;
        };
        let todo = data.view(&file).to_encode();
        if todo.is_empty() {
            continue;
        }
        // Written to lately, or too few servers up for the fragments: the next pass.
        if stop.is_stopped() || !data.is_cold(&file) || !data.may_encode(coding) {
            pending += todo.len() as u64;
            continue;
        }
        for (n, idx) in todo.iter().enumerate() {
            // Written to since the pass began: the rest waits for the next one.
            if stop.is_stopped() || !data.is_cold(&file) {
                pending += (todo.len() - n) as u64;
                break;
            }
            let mut io = data.lock(&file);
            let done = io.encode_chunk(*idx, coding);
            fs.commit_extents(ino, &mut io);
            match done {
                Ok(0) => pending += 1,
                Ok(bytes) => {
                    stats.stripes_made.fetch_add(1, Ordering::Relaxed);
                    stats.bytes_written.fetch_add(bytes, Ordering::Relaxed);
                }
                Err(e) => {
                    pending += 1;
                    log::warn!("encoder: chunk {idx} of inode {ino} keeps its copies: {e}");
                }
            }
        }
    }
    stats.pending.store(pending, Ordering::Relaxed);
    stats.passes.fetch_add(1, Ordering::Relaxed);
    stats.running.store(false, Ordering::Relaxed);
    pending
}
