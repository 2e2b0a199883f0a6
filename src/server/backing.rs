//! A memory server whose arena lives in a file (`serve --backing PATH`): a DAX device,
//! persistent memory, tmpfs, hugetlbfs or any file on a local file system. Gengar's tier:
//! a restarted server comes back with every extent it lent, so its clients resume and
//! nothing is rebuilt.
//!
//! The file holds, besides the arena, what a restart needs to hand the extents back:
//! - a header (format, sizes, the address the arena is mapped at: clients name extents by
//!   address, so a restart maps the file at the same one);
//! - an extent table with one 32-byte slot per arena page, indexed by the extent's first
//!   page: length, remote key, owning session and a checksum. An allocation writes its slot
//!   before it is answered; a free clears it after the extent is zeroed, so free space is
//!   zero whenever the slot says free. A slot is a store into the mapping, not a system call;
//! - the owners: two image slots (A/B, the newer valid one wins) holding the sessions that
//!   own extents (by the digest of their last token, so they can resume) and the volumes
//!   (epoch, holder, the tokens fenced, the root). Rewritten whenever an owner changes
//!   (a session's first extent, a resume, a claim, a root), before the change is answered.
//!
//! Stores into a shared file mapping survive the process at once (a `kill -9` loses
//! nothing); they reach the medium when written back: on the server's schedule
//! ([`crate::config::BACKING_FLUSH_INTERVAL`]) and on every `Persist` (a volume commit).
//! What survives a power loss with each medium is in doc/OPERATIONS.md. The owners and the
//! run are in [`owners`], the mapping and the header in [`mapping`].

mod mapping;
mod owners;

pub(super) use mapping::pinnable_by_device;
use mapping::{map, read_header};

use owners::OwnersState;
pub(super) use owners::{hex, host_boot, unhex, OwnersImage, Run, SessionRecord, VolumeRecord};

use super::alloc::ExtentAllocator;
use super::arena::Arena;
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::Mutex;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The backing file's format; a newer one is refused by name.
const FORMAT: u32 = 1;
const MAGIC: &[u8; 8] = b"RMEMFSBK";
/// Header: magic, format, page, arena length and offset, map address, owners offset and
/// slot length, table offset; then its CRC.
const HEADER_LEN: usize = 64;
/// One extent-table slot: length, rkey, session, check.
const SLOT_LEN: u64 = 32;
/// The high half of a slot's check word, so an all-zero slot never reads as valid.
const SLOT_MAGIC: u64 = 0x524d_4642 << 32;
/// Room for one owners image: every volume a server keeps (its root hex-coded, its fenced
/// tokens) takes under 10 KiB, so 1024 volumes fit with room for tens of thousands of
/// sessions. Sparse where unused.
const OWNERS_SLOT: u64 = 16 << 20;
/// An owners slot's own header: generation, length, CRC.
const OWNERS_HEADER: usize = 24;
/// The arena starts on a 2 MiB boundary of the file, so huge pages (hugetlbfs, devdax) map it.
const ARENA_ALIGN: u64 = 2 << 20;

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

/// Where things are in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    page: u64,
    arena_len: u64,
    owners_offset: u64,
    table_offset: u64,
    arena_offset: u64,
}

impl Layout {
    fn new(arena_len: u64, page: u64) -> Layout {
        let owners_offset = round_up(HEADER_LEN as u64, page);
        let table_offset = owners_offset + 2 * OWNERS_SLOT;
        let table_len = round_up(arena_len / page * SLOT_LEN, page);
        let arena_offset = round_up(table_offset + table_len, ARENA_ALIGN);
        Layout {
            page,
            arena_len,
            owners_offset,
            table_offset,
            arena_offset,
        }
    }
    fn file_len(&self) -> u64 {
        self.arena_offset + self.arena_len
    }
}

/// An extent the table lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SlotEntry {
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) rkey: u64,
    pub(super) session: u64,
}

fn slot_check(e: &SlotEntry) -> u64 {
    let mut h = crc32fast::Hasher::new();
    for v in [e.offset, e.len, e.rkey, e.session] {
        h.update(&v.to_le_bytes());
    }
    SLOT_MAGIC | h.finalize() as u64
}

/// What a restart found in the file.
pub(super) struct Found {
    pub(super) owners: OwnersImage,
    /// Valid table slots, in offset order, not overlapping.
    pub(super) extents: Vec<SlotEntry>,
    /// Slots that failed their check or overlapped another (cleared).
    pub(super) bad_slots: u64,
}

/// The backing file's metadata side. The arena (the same mapping) belongs to [`Arena`].
pub(super) struct Backing {
    path: PathBuf,
    /// Held for the server's life: its `flock` keeps a second server off the file.
    _file: File,
    base: *mut u8,
    map_len: usize,
    layout: Layout,
    /// The owners image's writer: the generation last written and the live sessions' records.
    owners: Mutex<OwnersState>,
    /// Set when the server stops (SIGTERM): from then on nothing is freed in the file, so a
    /// restart finds every session and volume as a crash would leave them.
    frozen: AtomicBool,
}

// SAFETY: `base` points into the server's own shared mapping of the file, which lives as long
// as the server's arena (dropped after this); the metadata pages are only written under
// `owners` (images) or at slots owned by exactly one extent (allocation and free of an
// extent are serialized by its owner), never exposed as Rust references.
unsafe impl Send for Backing {}
// SAFETY: as above.
unsafe impl Sync for Backing {}

impl Backing {
    /// Opens (or makes) the backing file for an arena of `size` bytes and maps it: at the
    /// address it had, when the file holds an arena already. Returns the arena and what the
    /// file held (`None`: a new file).
    pub(super) fn open(
        path: &Path,
        size: u64,
        page: u64,
    ) -> io::Result<(Backing, Arena, Option<Found>)> {
        let ctx = |e: io::Error, what: &str| {
            io::Error::new(
                e.kind(),
                format!("backing file {}: {what}: {e}", path.display()),
            )
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| ctx(e, "cannot open"))?;
        // SAFETY: flock on a descriptor this function owns; the result is checked.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(ctx(
                io::Error::last_os_error(),
                "in use by another memory server",
            ));
        }
        let meta = file.metadata().map_err(|e| ctx(e, "cannot stat"))?;
        let regular = meta.file_type().is_file();
        if !regular && !meta.file_type().is_char_device() && !meta.file_type().is_block_device() {
            return Err(ctx(
                io::Error::from(io::ErrorKind::InvalidInput),
                "neither a file nor a device",
            ));
        }
        let mut header = [0u8; HEADER_LEN + 4];
        let have_header = (!regular || meta.len() >= header.len() as u64)
            && std::os::unix::fs::FileExt::read_exact_at(&file, &mut header, 0).is_ok()
            && &header[..8] == MAGIC;
        if !have_header && regular && meta.len() > 0 {
            return Err(ctx(
                io::Error::from(io::ErrorKind::InvalidInput),
                "it is not an rmemfs backing file (give a new or empty file)",
            ));
        }
        let layout = Layout::new(size, page);
        if !have_header {
            if regular {
                file.set_len(layout.file_len())
                    .map_err(|e| ctx(e, "cannot size"))?;
            }
            let (base, map_len) =
                map(&file, layout.file_len(), None).map_err(|e| ctx(e, "cannot map"))?;
            let b = Backing::new(path, file, base, map_len, layout);
            b.write_header();
            let arena = b.arena();
            log::info!(
                "backing file {}: new, {} bytes (arena at {:#x})",
                path.display(),
                layout.file_len(),
                arena.ptr as u64
            );
            return Ok((b, arena, None));
        }
        let (found_layout, map_addr) = read_header(&header).map_err(|why| {
            ctx(
                io::Error::new(io::ErrorKind::InvalidData, why),
                "unusable header",
            )
        })?;
        if found_layout.arena_len != size {
            return Err(ctx(
                io::Error::from(io::ErrorKind::InvalidInput),
                &format!(
                    "it holds an arena of {} bytes, --size asks for {size} (start with --size {}, \
                     or give a new file)",
                    found_layout.arena_len, found_layout.arena_len
                ),
            ));
        }
        if found_layout.page != page {
            return Err(ctx(
                io::Error::from(io::ErrorKind::InvalidInput),
                &format!(
                    "it was made with {}-byte pages, this host has {page}",
                    found_layout.page
                ),
            ));
        }
        let (base, map_len) = map(&file, found_layout.file_len(), Some(map_addr)).map_err(|e| {
            ctx(
                e,
                &format!("cannot map at {map_addr:#x}, where its clients know it"),
            )
        })?;
        let b = Backing::new(path, file, base, map_len, found_layout);
        let (generation, owners) = b.read_owners();
        b.owners.lock().generation = generation;
        let (extents, bad_slots) = b.read_table();
        let arena = b.arena();
        Ok((
            b,
            arena,
            Some(Found {
                owners,
                extents,
                bad_slots,
            }),
        ))
    }

    fn new(path: &Path, file: File, base: *mut u8, map_len: usize, layout: Layout) -> Backing {
        Backing {
            path: path.to_path_buf(),
            _file: file,
            base,
            map_len,
            layout,
            owners: Mutex::new(OwnersState {
                generation: 0,
                sessions: HashMap::new(),
                run: None,
            }),
            frozen: AtomicBool::new(false),
        }
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// The arena: the mapping's tail, owned (and unmapped) by the returned value.
    fn arena(&self) -> Arena {
        // SAFETY: the arena's offset and length lie inside the mapping (the layout's file
        // length is the mapping's length).
        let ptr = unsafe { self.base.add(self.layout.arena_offset as usize) };
        Arena::backed(ptr, self.layout.arena_len as usize, self.base, self.map_len)
    }

    fn write_header(&self) {
        let l = &self.layout;
        let mut h = [0u8; HEADER_LEN];
        h[..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&FORMAT.to_le_bytes());
        h[12..16].copy_from_slice(&(l.page as u32).to_le_bytes());
        let fields = [
            l.arena_len,
            l.arena_offset,
            self.base as u64,
            l.owners_offset,
            OWNERS_SLOT,
            l.table_offset,
        ];
        for (i, v) in fields.iter().enumerate() {
            h[16 + i * 8..24 + i * 8].copy_from_slice(&v.to_le_bytes());
        }
        // 16 + 6 * 8 = 64: the CRC goes in the page after the fields.
        let crc = crc32fast::hash(&h);
        // SAFETY: the header page is inside the mapping and only written here, before the
        // server serves anyone.
        unsafe {
            std::ptr::copy_nonoverlapping(h.as_ptr(), self.base, HEADER_LEN);
            std::ptr::copy_nonoverlapping(crc.to_le_bytes().as_ptr(), self.base.add(HEADER_LEN), 4);
        }
    }

    /// Whether nothing may be freed in the file any more (the server is stopping).
    pub(super) fn frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }

    pub(super) fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    fn slot_ptr(&self, offset: u64) -> *mut u64 {
        let index = offset / self.layout.page;
        debug_assert!(offset.is_multiple_of(self.layout.page) && offset < self.layout.arena_len);
        // SAFETY: `index` is below the arena's page count, so the slot lies inside the table,
        // which lies inside the mapping.
        unsafe {
            self.base
                .add((self.layout.table_offset + index * SLOT_LEN) as usize)
                .cast::<u64>()
        }
    }

    /// Lists an extent in the table (before its allocation is answered).
    pub(super) fn write_slot(&self, e: &SlotEntry) {
        let p = self.slot_ptr(e.offset);
        let words = [e.len, e.rkey, e.session, slot_check(e)];
        for (i, w) in words.iter().enumerate() {
            // SAFETY: the slot belongs to this extent alone (its first page), inside the
            // mapping; volatile because a restart, not this process, reads it back.
            unsafe { std::ptr::write_volatile(p.add(i), *w) };
        }
    }

    /// Clears an extent's slot (after its memory was zeroed).
    pub(super) fn clear_slot(&self, offset: u64) {
        let p = self.slot_ptr(offset);
        for i in [3, 0, 1, 2] {
            // SAFETY: as in `write_slot`; the check word goes first, so a torn clear reads as
            // invalid.
            unsafe { std::ptr::write_volatile(p.add(i), 0) };
        }
    }

    fn read_table(&self) -> (Vec<SlotEntry>, u64) {
        let pages = self.layout.arena_len / self.layout.page;
        let mut found = Vec::new();
        let mut bad = 0;
        let mut end = 0u64;
        for index in 0..pages {
            let offset = index * self.layout.page;
            let p = self.slot_ptr(offset);
            // SAFETY: inside the table, in the mapping; no one else runs yet.
            let words: [u64; 4] =
                std::array::from_fn(|i| unsafe { std::ptr::read_volatile(p.add(i)) });
            if words == [0; 4] {
                continue;
            }
            let e = SlotEntry {
                offset,
                len: words[0],
                rkey: words[1],
                session: words[2],
            };
            let fits = e.len > 0
                && e.len.is_multiple_of(self.layout.page)
                && offset
                    .checked_add(e.len)
                    .is_some_and(|x| x <= self.layout.arena_len);
            if words[3] != slot_check(&e) || !fits || offset < end {
                bad += 1;
                self.clear_slot(offset);
                continue;
            }
            end = offset + e.len;
            found.push(e);
        }
        (found, bad)
    }

    /// Writes everything stored into the mapping so far back to the medium, and waits.
    pub(super) fn persist(&self) -> io::Result<()> {
        // SAFETY: msync of this server's own mapping.
        if unsafe { libc::msync(self.base.cast(), self.map_len, libc::MS_SYNC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Makes free arena ranges read as zeros and cost nothing (a restart: an extent freed
    /// just before a power loss may have had its zeroing lost while its slot's clear was
    /// not). A medium that cannot punch holes (devdax) is zeroed instead.
    pub(super) fn clear_free(&self, arena: &Arena, alloc: &ExtentAllocator) {
        for (off, len) in alloc.free_ranges() {
            let file_off = (self.layout.arena_offset + off) as libc::off_t;
            // SAFETY: punching a hole in our own file's arena range, which no registration
            // covers (it is free) and no client can reach (the server does not listen yet).
            let r = unsafe {
                libc::fallocate(
                    self._file.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    file_off,
                    len as libc::off_t,
                )
            };
            if r != 0 {
                // SAFETY: as above; the range lies inside the arena.
                unsafe { std::ptr::write_bytes(arena.ptr.add(off as usize), 0, len as usize) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 4096;
    const SIZE: u64 = 64 * PAGE;

    fn temp_file(name: &str) -> PathBuf {
        // No directory of its own: the tests remove their files, and nothing is left behind.
        let p = std::env::temp_dir().join(format!("rmemfs-backing-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    fn session(id: u64) -> SessionRecord {
        SessionRecord {
            id,
            token: hex(&[id as u8; 32]),
            client: format!("client {id}"),
            behind: false,
        }
    }

    #[test]
    fn slots_and_owners_come_back_and_damage_is_dropped() {
        let path = temp_file("roundtrip");
        let at = {
            let (b, arena, found) = Backing::open(&path, SIZE, PAGE).unwrap();
            assert!(found.is_none(), "a new file");
            b.write_slot(&SlotEntry {
                offset: 0,
                len: 2 * PAGE,
                rkey: 7,
                session: 3,
            });
            b.write_slot(&SlotEntry {
                offset: 4 * PAGE,
                len: PAGE,
                rkey: 9,
                session: 5,
            });
            b.write_slot(&SlotEntry {
                offset: 8 * PAGE,
                len: PAGE,
                rkey: 11,
                session: 3,
            });
            // A slot whose check does not match (a torn write) and one overlapping the first.
            b.write_slot(&SlotEntry {
                offset: 10 * PAGE,
                len: PAGE,
                rkey: 13,
                session: 3,
            });
            // SAFETY: the slot's rkey word, inside the table of this test's own mapping.
            unsafe { std::ptr::write_volatile(b.slot_ptr(10 * PAGE).add(1), 14) };
            b.write_slot(&SlotEntry {
                offset: PAGE,
                len: PAGE,
                rkey: 15,
                session: 3,
            });
            b.clear_slot(8 * PAGE);
            assert!(b.note_session(session(3)));
            assert!(!b.note_session(session(3)), "unchanged");
            b.save_owners(Vec::new);
            assert!(b.note_session(session(5)));
            b.save_owners(Vec::new);
            b.persist().unwrap();
            arena.ptr as u64
        };
        let (b, arena, found) = Backing::open(&path, SIZE, PAGE).unwrap();
        assert_eq!(arena.ptr as u64, at, "mapped where its clients know it");
        let found = found.expect("the file's contents");
        let offsets: Vec<u64> = found.extents.iter().map(|e| e.offset).collect();
        assert_eq!(offsets, vec![0, 4 * PAGE]);
        assert_eq!(found.bad_slots, 2);
        let ids: Vec<u64> = found.owners.sessions.iter().map(|s| s.id).collect();
        assert_eq!(ids, vec![3, 5], "the newer image wins");
        drop((b, arena));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_torn_newer_owners_image_leaves_the_older() {
        let path = temp_file("torn");
        {
            let (b, _arena, _) = Backing::open(&path, SIZE, PAGE).unwrap();
            b.note_session(session(1));
            b.save_owners(Vec::new);
            b.note_session(session(2));
            b.save_owners(Vec::new);
            // The second image (generation 2, slot 0) loses a byte of its body.
            // SAFETY: a byte inside owners slot 0 of this test's own mapping.
            unsafe { *b.owners_ptr(0).add(OWNERS_HEADER + 3) ^= 0xff };
        }
        let (_b, _arena, found) = Backing::open(&path, SIZE, PAGE).unwrap();
        let ids: Vec<u64> = found
            .unwrap()
            .owners
            .sessions
            .iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(ids, vec![1]);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_device_may_pin_tmpfs_files_and_nothing_else() {
        if std::path::Path::new("/dev/shm").is_dir() {
            assert_eq!(
                pinnable_by_device(Path::new("/dev/shm/rmemfs-not-made")),
                Ok(())
            );
        }
        // Only tmpfs, hugetlbfs and devdax pass: procfs, as ext4 or xfs, is refused.
        let why = pinnable_by_device(Path::new("/proc/version")).unwrap_err();
        assert!(why.contains("devdax, tmpfs or hugetlbfs"), "{why}");
    }

    #[test]
    fn wrong_files_are_refused_with_a_reason() {
        let path = temp_file("refusals");
        let (held, _arena, _) = Backing::open(&path, SIZE, PAGE).unwrap();
        let busy = Backing::open(&path, SIZE, PAGE).err().unwrap().to_string();
        assert!(busy.contains("in use by another memory server"), "{busy}");
        drop(held);
        drop(_arena);
        let size = Backing::open(&path, 2 * SIZE, PAGE)
            .err()
            .unwrap()
            .to_string();
        assert!(size.contains("--size"), "{size}");
        let other = temp_file("not-ours");
        std::fs::write(&other, b"someone's data").unwrap();
        let foreign = Backing::open(&other, SIZE, PAGE).err().unwrap().to_string();
        assert!(foreign.contains("not an rmemfs backing file"), "{foreign}");
        assert_eq!(
            std::fs::read(&other).unwrap(),
            b"someone's data",
            "left alone"
        );
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(&other);
    }
}
