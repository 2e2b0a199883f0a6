//! The control protocol between a client (the mount daemon) and a memory server.
//!
//! Only control traffic travels here (hello, allocation, free, capacity, fabric connection
//! setup); file data never does: it moves by one-sided READ/WRITE on the fabric. Client and
//! server share this one module so the two ends cannot drift apart.
//!
//! Framing: every frame is a little-endian `u32` body length followed by the body; the body is a
//! one-byte message type and its fields, little-endian, strings and blobs prefixed by a `u16`
//! length. The first frame on a connection is `Hello`, which carries the protocol version.
//! Decoding validates every field and never panics: a malformed, truncated, oversized or
//! trailing-garbage frame is a [`ProtoError`], and the server closes such a connection.

use std::io::{self, Read, Write};

mod decode;
mod encode;
mod volume;
mod wire;

/// Wire protocol version; bumped on any incompatible change (10: `MemberExtents`, what an
/// evicted member of a shared volume allocated, for its collection).
pub const PROTOCOL_VERSION: u16 = 10;

/// Magic at the start of `Hello`, so a stray client (HTTP, a port scanner) is rejected at once.
pub const HELLO_MAGIC: u32 = 0x524d_4653; // "RMFS"

/// Largest frame body either side accepts. Control messages are tiny; the largest is a fabric
/// connection blob (verbs QP attributes, well under 1 KiB). 64 KiB leaves room without letting a
/// hostile peer make us buffer much.
pub const MAX_FRAME_LEN: usize = 64 * 1024;

/// Longest string field (names, error messages).
pub const MAX_STRING_LEN: usize = 1024;

/// Largest opaque fabric blob.
pub const MAX_BLOB_LEN: usize = 4096;

/// Why an allocation or free was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalCode {
    /// Not enough contiguous free memory.
    NoSpace = 1,
    /// Length zero or larger than the server will ever hand out.
    BadLength = 2,
    /// The server could not register (pin) the extent.
    RegistrationFailed = 3,
    /// The extent named in a free does not exist or belongs to someone else.
    NotFound = 4,
    /// The server is shutting down.
    ShuttingDown = 5,
    /// The volume is held by a live daemon (the message names it and its epoch).
    Held = 6,
    /// This session's volume was taken over by a newer epoch: it may not resume.
    Fenced = 7,
    /// No volume of that name on this server (the message lists the known ones).
    NoVolume = 8,
    /// A volume of that name exists already (`--create` of an existing one).
    VolumeExists = 9,
    /// The server's backing medium failed to take a write (`Persist`).
    Io = 10,
}

impl RefusalCode {
    fn from_u16(v: u16) -> Result<Self, ProtoError> {
        Ok(match v {
            1 => Self::NoSpace,
            2 => Self::BadLength,
            3 => Self::RegistrationFailed,
            4 => Self::NotFound,
            5 => Self::ShuttingDown,
            6 => Self::Held,
            7 => Self::Fenced,
            8 => Self::NoVolume,
            9 => Self::VolumeExists,
            10 => Self::Io,
            other => return Err(ProtoError::BadField("refusal code", other as u64)),
        })
    }
}

/// Capacity of one memory server, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capacity {
    pub total: u64,
    pub free: u64,
    pub largest_free: u64,
}

/// Extents one session holds on a server, and their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Holding {
    pub extents: u64,
    pub bytes: u64,
}

/// What a memory server has refused since it started, for `rmemfs stats --server`: the
/// signs of a misconfigured or hostile client, which the server otherwise only logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerCounters {
    /// Sessions held under a lease now (clients that dropped without a goodbye).
    pub leased_sessions: u64,
    /// Sessions a client took back with `Resume`.
    pub resumed_sessions: u64,
    /// Handshakes refused because the two ends' secrets differ (a client without one, or
    /// with another, refused by either end).
    pub refused_secret: u64,
    /// Handshakes that failed otherwise: wrong version, too slow, malformed or out of order.
    pub failed_handshakes: u64,
    /// Connections closed at accept: their peer address was at its connection cap.
    pub refused_peer_cap: u64,
    /// Clients turned away by `--max-clients`.
    pub refused_max_clients: u64,
    /// Allocations refused by a client's `--max-client-memory` quota.
    pub refused_quota: u64,
    /// Allocations refused for want of free memory.
    pub refused_no_space: u64,
    /// Authenticated sessions closed for breaking the protocol.
    pub protocol_violations: u64,
    /// Remote READs and WRITEs the server's NIC refused (bad key, bounds or session); each
    /// closed its data connection.
    pub remote_refused: u64,
}

impl ServerCounters {
    /// The fields' names for scripts and metrics (`stats --json`, `rmemfs_serve_*`), in the
    /// order of [`ServerCounters::fields`].
    pub const KEYS: [&'static str; 10] = [
        "leased_sessions",
        "resumed_sessions",
        "refused_secret",
        "failed_handshakes",
        "refused_peer_cap",
        "refused_max_clients",
        "refused_quota",
        "refused_no_space",
        "protocol_violations",
        "remote_refused",
    ];

    /// Field names and values, in wire order (the encoder, decoder and `stats` share it).
    pub fn fields(&self) -> [(&'static str, u64); 10] {
        [
            ("leased sessions", self.leased_sessions),
            ("resumed sessions", self.resumed_sessions),
            ("handshakes refused: secrets differ", self.refused_secret),
            ("handshakes failed otherwise", self.failed_handshakes),
            ("connections over the per-peer cap", self.refused_peer_cap),
            ("clients over --max-clients", self.refused_max_clients),
            ("allocations over a quota", self.refused_quota),
            ("allocations without free memory", self.refused_no_space),
            (
                "sessions closed for protocol violations",
                self.protocol_violations,
            ),
            ("remote accesses refused", self.remote_refused),
        ]
    }

    fn from_fields(v: [u64; 10]) -> Self {
        let [leased_sessions, resumed_sessions, refused_secret, failed_handshakes, refused_peer_cap, refused_max_clients, refused_quota, refused_no_space, protocol_violations, remote_refused] =
            v;
        ServerCounters {
            leased_sessions,
            resumed_sessions,
            refused_secret,
            failed_handshakes,
            refused_peer_cap,
            refused_max_clients,
            refused_quota,
            refused_no_space,
            protocol_violations,
            remote_refused,
        }
    }
}

/// Every control message. Requests carry a `tag` chosen by the client; the reply echoes it so
/// a client may have many requests outstanding on one connection (FRRWP relies on this).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Client to server, first frame: who, and the client's half of the challenge.
    Hello {
        version: u16,
        client_name: String,
        nonce: [u8; 32],
        /// An observer (`rmemfs stats --server`) only asks for `Stats`: it is not a client
        /// (not held to `--max-clients`) and may send nothing else.
        observer: bool,
    },
    /// Server to client, reply to `Hello`: the server's nonce and its proof that it holds the
    /// secret (`authenticated` false: the server has none and proves nothing).
    Challenge {
        version: u16,
        nonce: [u8; 32],
        authenticated: bool,
        proof: [u8; 32],
    },
    /// Client to server, reply to `Challenge`: the client's proof.
    Proof { proof: [u8; 32] },
    /// Server to client, reply to an accepted `Proof`.
    Welcome {
        version: u16,
        server_instance: u64,
        fabric: String,
        capacity: Capacity,
        /// The server keeps its arena and extent table in a file (`serve --backing`): its
        /// extents outlive a restart, and `Persist` makes what was written durable.
        backed: bool,
    },
    /// Client to server: set up the fabric data path; `blob` is fabric-specific.
    Connect { tag: u64, blob: Vec<u8> },
    /// Server to client: the server's half of the data path setup.
    Connected { tag: u64, blob: Vec<u8> },
    /// Allocate (and register for remote access) `len` bytes.
    Alloc { tag: u64, len: u64 },
    /// Reply to `Alloc`: a remote region the client may READ and WRITE.
    Allocated {
        tag: u64,
        addr: u64,
        len: u64,
        rkey: u64,
        capacity: Capacity,
    },
    /// Free an extent this connection allocated.
    Free { tag: u64, addr: u64, rkey: u64 },
    /// Reply to `Free`.
    Freed { tag: u64, capacity: Capacity },
    /// Ask for the current capacity.
    Stat { tag: u64 },
    /// Reply to `Stat`.
    Stats {
        tag: u64,
        capacity: Capacity,
        extents: u64,
        clients: u32,
        counters: ServerCounters,
        /// What the asking session holds (a volume holder: the volume's extents there).
        session: Holding,
    },
    /// A request was refused; the connection stays usable.
    Refused {
        tag: u64,
        code: RefusalCode,
        message: String,
    },
    /// The peer broke the protocol; the sender closes the connection after this.
    Fatal { message: String },
    /// Client to server, right after `Welcome` and before `Connect`: take over the extents of
    /// the earlier session whose token was `token` (a connection that dropped, within the
    /// server's lease), so they survive a lost link.
    Resume { tag: u64, token: [u8; 32] },
    /// Reply to `Resume`: the session's `extents` (`bytes` in all) are this session's now.
    /// `rekeyed`: the server restarted from its backing file on a fabric whose device issues
    /// the keys, so the extents have new remote keys: the client lists them
    /// (`VolumeExtents`) and uses those before anything else. `behind`: the server was
    /// restored from a backing file that may hold less than was written into it (a restart
    /// after a power loss): a client back from before it takes its copies there for stale
    /// where it has others.
    Resumed {
        tag: u64,
        extents: u64,
        bytes: u64,
        rekeyed: bool,
        behind: bool,
    },
    /// Client to server: this client is leaving for good (an unmount); its extents are freed
    /// at once instead of being kept for a lease (a volume's stay with the volume).
    Goodbye,
    /// Client to server, right after `Welcome` and before `Connect`: become the holder of
    /// volume `name` (its extents become this session's, and every extent this session
    /// allocates is the volume's). The epoch granted is above every earlier one and at least
    /// `min_epoch`; a live holder is fenced first (its connections closed) when it is silent
    /// past the lease or `takeover` is set, else the claim is refused with `Held`.
    VolumeClaim {
        tag: u64,
        name: String,
        /// Who claims it, for the refusals a later claimer sees: `host pid N`.
        holder: String,
        mode: ClaimMode,
        takeover: bool,
        min_epoch: u64,
    },
    /// Reply to `VolumeClaim`.
    VolumeClaimed {
        tag: u64,
        epoch: u64,
        /// The server did not know the volume and made it (create or adopt).
        created: bool,
        /// The volume's root as its holder last set it (empty: never set).
        root: Vec<u8>,
        extents: u64,
        bytes: u64,
    },
    /// Holder to server: the volume's root is now `root` (where its journal and checkpoint are).
    VolumeRoot { tag: u64, root: Vec<u8> },
    /// Reply to `VolumeRoot` and `VolumeDrop`.
    VolumeDone { tag: u64 },
    /// Client to server: list this session's extents (a holder's: the volume's) above address
    /// `after`, with their keys (a volume's attach; a session `Resumed` as `rekeyed`).
    VolumeExtents { tag: u64, after: u64 },
    /// Reply to `VolumeExtents`: `(addr, len, rkey)` in address order; `more` if cut short.
    ExtentList {
        tag: u64,
        extents: Vec<(u64, u64, u64)>,
        more: bool,
    },
    /// List the volumes this server holds extents of, by name after `after` (observers may).
    VolumeList { tag: u64, after: String },
    /// Reply to `VolumeList`; `more` if cut short.
    Volumes {
        tag: u64,
        volumes: Vec<VolumeInfo>,
        more: bool,
    },
    /// Forget volume `name` and free every extent of it; refused while a holder is live.
    VolumeDrop { tag: u64, name: String },
    /// Client to server: make everything written into this server's arena so far durable on
    /// its backing medium (a volume commit; answered at once by a server without one).
    Persist { tag: u64 },
    /// Reply to `Persist`.
    Persisted { tag: u64 },
    /// Follower to server (a session that claimed with [`ClaimMode::Follow`]): it has
    /// applied the volume's journal through `lsn`, and reads nothing older (frees the holder
    /// makes after `lsn` wait for it). The reply says where the journal is now.
    FollowAt { tag: u64, lsn: u64 },
    /// Reply to `FollowAt`: the volume's epoch and root.
    FollowRoot { tag: u64, epoch: u64, root: Vec<u8> },
    /// Holder to server: how far the volume's followers have applied its journal.
    Followers { tag: u64 },
    /// Reply to `Followers`: how many follow, and the lowest sequence number every one of
    /// them has applied (`u64::MAX` when none does).
    FollowerFloor {
        tag: u64,
        followers: u32,
        floor: u64,
    },
    /// Member to server: fence the member of the same shared volume that joined as `who`
    /// (its engine session ended): its connections are closed and the name is refused from
    /// then on. Answered `VolumeDone`.
    Evict { tag: u64, who: String },
    /// Member to server: the extents of its shared volume that evicted member `who`
    /// allocated and no one freed, above address `after` (the collection of what it never
    /// logged). Answered `ExtentList`.
    MemberExtents { tag: u64, who: String, after: u64 },
}

pub use volume::{
    ClaimMode, VolumeInfo, EXTENTS_PER_LIST, MAX_ROOT_LEN, MAX_VOLUMES_PER_LIST,
    SHARED_VOLUME_HOLDER,
};

/// Why bytes could not be decoded into a [`Message`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtoError {
    #[error("frame truncated")]
    Truncated,
    #[error("frame of {0} bytes exceeds the {MAX_FRAME_LEN}-byte limit")]
    Oversized(usize),
    #[error("unknown message type {0}")]
    UnknownType(u8),
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
    #[error("invalid {0}: {1}")]
    BadField(&'static str, u64),
    #[error("string is not UTF-8")]
    BadString,
    #[error("bad magic {0:#x}: not an rmemfs peer")]
    BadMagic(u32),
}

/// Errors reading or writing frames on a stream.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("connection closed by peer")]
    Closed,
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    #[error("protocol error: {0}")]
    Proto(#[from] ProtoError),
}

impl Message {
    /// The request tag of a reply, if it has one (used to route replies to waiters).
    pub fn reply_tag(&self) -> Option<u64> {
        match self {
            Message::Connected { tag, .. }
            | Message::Allocated { tag, .. }
            | Message::Freed { tag, .. }
            | Message::Stats { tag, .. }
            | Message::Resumed { tag, .. }
            | Message::VolumeClaimed { tag, .. }
            | Message::VolumeDone { tag, .. }
            | Message::ExtentList { tag, .. }
            | Message::Volumes { tag, .. }
            | Message::Persisted { tag }
            | Message::FollowRoot { tag, .. }
            | Message::FollowerFloor { tag, .. }
            | Message::Refused { tag, .. } => Some(*tag),
            _ => None,
        }
    }
}

/// Writes one length-prefixed frame.
pub fn write_frame(w: &mut impl Write, msg: &Message) -> io::Result<()> {
    let body = msg.encode();
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame)
}

/// Reads one length-prefixed frame and decodes it. A clean EOF before the first byte of the
/// frame is [`FrameError::Closed`]; an EOF inside it is a truncation.
pub fn read_frame(r: &mut impl Read) -> Result<Message, FrameError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => return Err(ProtoError::Truncated.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME_LEN {
        return Err(ProtoError::Oversized(len).into());
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            FrameError::Proto(ProtoError::Truncated)
        } else {
            FrameError::Io(e)
        }
    })?;
    Ok(Message::decode(&body)?)
}

#[cfg(any(test, feature = "testing"))]
mod samples;
#[cfg(any(test, feature = "testing"))]
pub use samples::sample_messages;

#[cfg(test)]
mod tests;
