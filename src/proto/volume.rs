//! The volume messages' own types and limits (`VolumeClaim`, `Volumes`, `ExtentList`).

/// How a `VolumeClaim` treats a volume the server does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimMode {
    /// It must exist (`NoVolume` otherwise).
    Attach = 0,
    /// It must not exist (`VolumeExists` otherwise).
    Create = 1,
    /// Made if absent: a server that restarted empty joins a volume the others hold.
    Adopt = 2,
    /// It must exist; the session becomes one of its followers (`mount --read-only`), not
    /// its holder: its data connections may READ the volume's extents and nothing else, and
    /// it may allocate nothing.
    Follow = 3,
    /// Made if absent; the session becomes one of the volume's many writers (a shared
    /// volume, its namespace in a metadata engine): what it allocates is the volume's, it
    /// may free any extent of the volume, and it is fenced on its own (`Evict`). `holder`
    /// names it as the engine does; a name once evicted is refused.
    Share = 4,
}

/// One volume as a server knows it (`rmemfs volume ls`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    pub name: String,
    pub epoch: u64,
    /// The holder's `host pid N` (the last one, if none is connected).
    pub holder: String,
    /// A holder is connected now.
    pub live: bool,
    /// Seconds since the holder was last heard (0 when live and just heard).
    pub idle_secs: u64,
    pub extents: u64,
    pub bytes: u64,
    pub root: Vec<u8>,
}

/// The holder a shared volume's record names (it has members, no one holder): how `volume`
/// commands tell it from a held one.
pub const SHARED_VOLUME_HOLDER: &str = "many writers";

/// Most extents one `ExtentList` carries (24 bytes each, well inside a frame).
pub const EXTENTS_PER_LIST: usize = 2048;

/// Most volumes one `Volumes` reply carries: each at most a root and two strings, so
/// twelve stay inside a frame.
pub const MAX_VOLUMES_PER_LIST: usize = 12;

/// Longest volume root: where a volume's journal and checkpoint are, a handful of extents.
pub const MAX_ROOT_LEN: usize = 4096;
