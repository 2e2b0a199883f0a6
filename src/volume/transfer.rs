//! `rmemfs volume export` and `import`: a volume as files in a directory or objects in an
//! S3-compatible bucket ([`super::store`]), the answer to losing the whole rack's power.
//!
//! Why content-addressed: chunks are stored under their SHA-256 (`chunks/ab/abcd…`), so a
//! second export into the same directory copies only the chunks that changed, and an import
//! verifies every byte it reads. The namespace (inodes, entries at their cookies, xattrs,
//! ACLs, symlinks, hard links) is one file of journal records (`namespace/<sha256>.rmj`,
//! the checkpoint's format). The manifest, naming the namespace file and every file's chunks
//! by hash, is written last (to a temporary name, synced, then renamed), so an interrupted
//! export never passes for a complete one.
//!
//! Export reads a detached volume by attaching it (the servers fence any holder; a live one
//! is refused as for a mount), so it copies a consistent point: the last commit.

use super::store::ExportStore;
use crate::fs::Fs;
use crate::meta::{record, Change, Ino};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// The manifest's format; a newer one is refused naming both.
pub const MANIFEST_FORMAT: u32 = 1;

/// What an export wrote (the manifest, `manifest.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    pub format: u32,
    pub volume: String,
    pub exported_unix: u64,
    pub chunk_size: u64,
    /// SHA-256 of the namespace file (`namespace/<hash>.rmj`).
    pub namespace: String,
    /// Per regular file (by inode number): `(chunk index, bytes, SHA-256)`; a missing index
    /// is a hole.
    pub files: BTreeMap<Ino, Vec<(u64, u64, String)>>,
    pub bytes: u64,
    pub chunks: u64,
}

/// What an export or import did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Transferred {
    pub files: u64,
    pub chunks: u64,
    /// Chunks copied (an export skips those already in the directory).
    pub chunks_copied: u64,
    pub bytes: u64,
    pub seconds: f64,
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key of the chunk whose SHA-256 is `hash`.
fn chunk_key(hash: &str) -> String {
    format!("chunks/{}/{hash}", &hash[..2])
}

fn namespace_key(hash: &str) -> String {
    format!("namespace/{hash}.rmj")
}

const MANIFEST_KEY: &str = "manifest.json";

/// One chunk to export: its file, index, and the bytes of it the file's size covers.
struct ChunkJob {
    ino: Ino,
    file: std::sync::Arc<crate::meta::FileData>,
    idx: u64,
    len: usize,
}

/// Reads, hashes and stores one chunk; its hash and whether it was copied (not there yet).
fn export_chunk(fs: &Fs, dest: &dyn ExportStore, job: &ChunkJob) -> Result<(String, bool), String> {
    let view = fs.data().view(&job.file);
    let off = job.idx * fs.data().chunk_size();
    let buf = view
        .read_buf(off, job.len)
        .map_err(|e| format!("reading inode {} chunk {}: {}", job.ino, job.idx, e.message))?;
    let bytes = buf.bytes();
    let hash = hex(&Sha256::digest(bytes));
    let key = chunk_key(&hash);
    let copy = !dest.exists(&key)?;
    if copy {
        dest.put(&key, bytes)?;
    }
    Ok((hash, copy))
}

/// Copies `fs` (an attached volume) into `dest`. Chunks go through
/// [`crate::config::EXPORT_THREADS`] threads at once, each reading, hashing and storing its
/// own: one waits on the servers or the store while another hashes.
pub fn export(fs: &Fs, volume: &str, dest: &dyn ExportStore) -> Result<Transferred, String> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let start = std::time::Instant::now();
    let mut image = fs.inspect_meta(|m| m.image());
    let files = image.take_files();
    let chunk_size = fs.data().chunk_size();
    let mut out = Transferred::default();
    let mut table: BTreeMap<Ino, Vec<(u64, u64, String)>> = BTreeMap::new();
    let mut jobs = Vec::new();
    for (ino, f) in files {
        let size = fs.inspect_meta(|m| m.get(ino).map(|i| i.size)).unwrap_or(0);
        let idxs: Vec<(u64, u64)> = fs
            .data()
            .view(&f)
            .iter()
            .map(|(i, c)| (*i, c.len))
            .collect();
        for (idx, clen) in idxs {
            let off = idx * chunk_size;
            if off < size {
                let len = clen.min(size - off).min(chunk_size) as usize;
                jobs.push(ChunkJob {
                    ino,
                    file: f.clone(),
                    idx,
                    len,
                });
            }
        }
        out.files += 1;
        table.insert(ino, Vec::new());
    }
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let done: crate::sync::Mutex<Vec<(usize, String, bool)>> = Default::default();
    let first_error: crate::sync::Mutex<Option<String>> = Default::default();
    std::thread::scope(|s| {
        for _ in 0..crate::config::EXPORT_THREADS {
            s.spawn(|| {
                while !failed.load(Ordering::SeqCst) {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(job) = jobs.get(i) else { break };
                    match export_chunk(fs, dest, job) {
                        Ok((hash, copied)) => done.lock().push((i, hash, copied)),
                        Err(e) => {
                            failed.store(true, Ordering::SeqCst);
                            first_error.lock().get_or_insert(e);
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = first_error.into_inner() {
        return Err(e);
    }
    let mut done = done.into_inner();
    done.sort_unstable_by_key(|d| d.0);
    for (i, hash, copied) in done {
        let job = &jobs[i];
        out.chunks += 1;
        out.chunks_copied += u64::from(copied);
        out.bytes += job.len as u64;
        table
            .entry(job.ino)
            .or_default()
            .push((job.idx, job.len as u64, hash));
    }
    let mut ns = Vec::new();
    for (i, group) in image.changes.chunks(4096).enumerate() {
        ns.extend(record::encode(i as u64, group));
    }
    let ns_hash = hex(&Sha256::digest(&ns));
    dest.put(&namespace_key(&ns_hash), &ns)?;
    let manifest = Manifest {
        format: MANIFEST_FORMAT,
        volume: volume.to_string(),
        exported_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        chunk_size,
        namespace: ns_hash,
        files: table,
        bytes: out.bytes,
        chunks: out.chunks,
    };
    let json = serde_json::to_vec(&manifest).map_err(|e| e.to_string())?;
    // Last: only a complete export has a manifest.
    dest.put(MANIFEST_KEY, &json)?;
    dest.finish()?;
    out.seconds = start.elapsed().as_secs_f64();
    Ok(out)
}

/// Reads the manifest of the export in `src` (refusing a partial or newer export).
pub fn read_manifest(src: &dyn ExportStore) -> Result<Manifest, String> {
    let bytes = src.get(MANIFEST_KEY)?.ok_or_else(|| {
        format!(
            "no complete export in {} (an interrupted one has no {MANIFEST_KEY})",
            src.describe()
        )
    })?;
    let m: Manifest = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{}/{MANIFEST_KEY}: {e}", src.describe()))?;
    if m.format > MANIFEST_FORMAT {
        return Err(format!(
            "the export is format {}; this rmemfs reads formats up to {MANIFEST_FORMAT}",
            m.format
        ));
    }
    Ok(m)
}

fn read_verified(src: &dyn ExportStore, key: &str, hash: &str) -> Result<Vec<u8>, String> {
    let bytes = src
        .get(key)?
        .ok_or_else(|| format!("{}/{key} is missing", src.describe()))?;
    let got = hex(&Sha256::digest(&bytes));
    if got != hash {
        return Err(format!(
            "{}/{key} is damaged: its SHA-256 is {got}, the manifest says {hash}",
            src.describe()
        ));
    }
    Ok(bytes)
}

/// Loads the export in `src` into `fs`, a volume just made (before its first checkpoint,
/// which then holds everything). Every hash is verified before a byte is used.
pub fn import(fs: &Fs, src: &dyn ExportStore) -> Result<Transferred, String> {
    let start = std::time::Instant::now();
    let m = read_manifest(src)?;
    if m.chunk_size != fs.data().chunk_size() {
        return Err(format!(
            "the export's chunks are {} bytes; this volume's are {} (--chunk-size {})",
            m.chunk_size,
            fs.data().chunk_size(),
            m.chunk_size
        ));
    }
    let ns = read_verified(src, &namespace_key(&m.namespace), &m.namespace)?;
    let read = record::read(&ns, 0);
    if read.end != ns.len() {
        return Err(format!(
            "the export's namespace does not read whole: {:?}",
            read.stop
        ));
    }
    let changes: Vec<Change> = read.records.into_iter().flat_map(|(_, c)| c).collect();
    fs.load_image(&changes).map_err(|e| e.message)?;
    let mut out = Transferred::default();
    for (ino, chunks) in &m.files {
        for (idx, len, hash) in chunks {
            let bytes = read_verified(src, &chunk_key(hash), hash)?;
            if bytes.len() as u64 != *len {
                return Err(format!(
                    "chunk {hash} holds {} bytes, not {len}",
                    bytes.len()
                ));
            }
            fs.load_data(*ino, idx * m.chunk_size, &bytes)
                .map_err(|e| format!("writing inode {ino}: {}", e.message))?;
            out.chunks += 1;
            out.bytes += len;
        }
        out.files += 1;
    }
    out.seconds = start.elapsed().as_secs_f64();
    Ok(out)
}
