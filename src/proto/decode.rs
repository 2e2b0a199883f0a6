//! Decoding: every field validated, never a panic (see the module doc of `proto`).

use super::wire::{tag, Reader};
use super::*;

impl Message {
    /// Decodes one frame body. Never panics; any defect is a [`ProtoError`].
    pub fn decode(body: &[u8]) -> Result<Message, ProtoError> {
        if body.len() > MAX_FRAME_LEN {
            return Err(ProtoError::Oversized(body.len()));
        }
        let mut r = Reader { buf: body };
        let msg = match r.u8()? {
            tag::HELLO => {
                let magic = r.u32()?;
                if magic != HELLO_MAGIC {
                    return Err(ProtoError::BadMagic(magic));
                }
                Message::Hello {
                    version: r.u16()?,
                    client_name: r.string("client name")?,
                    nonce: r.array()?,
                    observer: r.bool("observer flag")?,
                }
            }
            tag::CHALLENGE => Message::Challenge {
                version: r.u16()?,
                nonce: r.array()?,
                authenticated: r.bool("authenticated flag")?,
                proof: r.array()?,
            },
            tag::PROOF => Message::Proof { proof: r.array()? },
            tag::WELCOME => Message::Welcome {
                version: r.u16()?,
                server_instance: r.u64()?,
                fabric: r.string("fabric name")?,
                capacity: r.capacity()?,
                backed: r.bool("backed flag")?,
            },
            tag::CONNECT => Message::Connect {
                tag: r.u64()?,
                blob: r.bytes(MAX_BLOB_LEN, "connect blob")?.to_vec(),
            },
            tag::CONNECTED => Message::Connected {
                tag: r.u64()?,
                blob: r.bytes(MAX_BLOB_LEN, "connect blob")?.to_vec(),
            },
            tag::ALLOC => {
                let t = r.u64()?;
                let len = r.u64()?;
                if len == 0 {
                    return Err(ProtoError::BadField("allocation length", 0));
                }
                Message::Alloc { tag: t, len }
            }
            tag::ALLOCATED => {
                let t = r.u64()?;
                let addr = r.u64()?;
                let len = r.u64()?;
                if len == 0 || addr.checked_add(len).is_none() {
                    return Err(ProtoError::BadField("extent length", len));
                }
                Message::Allocated {
                    tag: t,
                    addr,
                    len,
                    rkey: r.u64()?,
                    capacity: r.capacity()?,
                }
            }
            tag::FREE => Message::Free {
                tag: r.u64()?,
                addr: r.u64()?,
                rkey: r.u64()?,
            },
            tag::FREED => Message::Freed {
                tag: r.u64()?,
                capacity: r.capacity()?,
            },
            tag::STAT => Message::Stat { tag: r.u64()? },
            tag::STATS => Message::Stats {
                tag: r.u64()?,
                capacity: r.capacity()?,
                extents: r.u64()?,
                clients: r.u32()?,
                session: Holding {
                    extents: r.u64()?,
                    bytes: r.u64()?,
                },
                counters: {
                    let mut v = [0u64; 10];
                    for x in &mut v {
                        *x = r.u64()?;
                    }
                    ServerCounters::from_fields(v)
                },
            },
            tag::REFUSED => Message::Refused {
                tag: r.u64()?,
                code: RefusalCode::from_u16(r.u16()?)?,
                message: r.string("refusal message")?,
            },
            tag::FATAL => Message::Fatal {
                message: r.string("fatal message")?,
            },
            tag::RESUME => Message::Resume {
                tag: r.u64()?,
                token: r.array()?,
            },
            tag::RESUMED => Message::Resumed {
                tag: r.u64()?,
                extents: r.u64()?,
                bytes: r.u64()?,
                rekeyed: r.bool("rekeyed flag")?,
                behind: r.bool("behind flag")?,
            },
            tag::GOODBYE => Message::Goodbye,
            tag::VOLUME_CLAIM => Message::VolumeClaim {
                tag: r.u64()?,
                name: r.string("volume name")?,
                holder: r.string("holder")?,
                mode: match r.u8()? {
                    0 => ClaimMode::Attach,
                    1 => ClaimMode::Create,
                    2 => ClaimMode::Adopt,
                    3 => ClaimMode::Follow,
                    4 => ClaimMode::Share,
                    other => return Err(ProtoError::BadField("claim mode", other as u64)),
                },
                takeover: r.bool("takeover flag")?,
                min_epoch: r.u64()?,
            },
            tag::VOLUME_CLAIMED => Message::VolumeClaimed {
                tag: r.u64()?,
                epoch: r.u64()?,
                created: r.bool("created flag")?,
                root: r.bytes(MAX_ROOT_LEN, "volume root")?.to_vec(),
                extents: r.u64()?,
                bytes: r.u64()?,
            },
            tag::VOLUME_ROOT => Message::VolumeRoot {
                tag: r.u64()?,
                root: r.bytes(MAX_ROOT_LEN, "volume root")?.to_vec(),
            },
            tag::VOLUME_DONE => Message::VolumeDone { tag: r.u64()? },
            tag::VOLUME_EXTENTS => Message::VolumeExtents {
                tag: r.u64()?,
                after: r.u64()?,
            },
            tag::EXTENT_LIST => {
                let t = r.u64()?;
                let n = r.u16()? as usize;
                if n > EXTENTS_PER_LIST {
                    return Err(ProtoError::BadField("extent count", n as u64));
                }
                let mut extents = Vec::with_capacity(n);
                for _ in 0..n {
                    extents.push((r.u64()?, r.u64()?, r.u64()?));
                }
                Message::ExtentList {
                    tag: t,
                    extents,
                    more: r.bool("more flag")?,
                }
            }
            tag::VOLUME_LIST => Message::VolumeList {
                tag: r.u64()?,
                after: r.string("volume name")?,
            },
            tag::VOLUMES => {
                let t = r.u64()?;
                let n = r.u16()? as usize;
                if n > MAX_VOLUMES_PER_LIST {
                    return Err(ProtoError::BadField("volume count", n as u64));
                }
                let mut volumes = Vec::with_capacity(n);
                for _ in 0..n {
                    volumes.push(VolumeInfo {
                        name: r.string("volume name")?,
                        epoch: r.u64()?,
                        holder: r.string("holder")?,
                        live: r.bool("live flag")?,
                        idle_secs: r.u64()?,
                        extents: r.u64()?,
                        bytes: r.u64()?,
                        root: r.bytes(MAX_ROOT_LEN, "volume root")?.to_vec(),
                    });
                }
                Message::Volumes {
                    tag: t,
                    volumes,
                    more: r.bool("more flag")?,
                }
            }
            tag::VOLUME_DROP => Message::VolumeDrop {
                tag: r.u64()?,
                name: r.string("volume name")?,
            },
            tag::PERSIST => Message::Persist { tag: r.u64()? },
            tag::PERSISTED => Message::Persisted { tag: r.u64()? },
            tag::FOLLOW_AT => Message::FollowAt {
                tag: r.u64()?,
                lsn: r.u64()?,
            },
            tag::FOLLOW_ROOT => Message::FollowRoot {
                tag: r.u64()?,
                epoch: r.u64()?,
                root: r.bytes(MAX_ROOT_LEN, "volume root")?.to_vec(),
            },
            tag::FOLLOWERS => Message::Followers { tag: r.u64()? },
            tag::FOLLOWER_FLOOR => Message::FollowerFloor {
                tag: r.u64()?,
                followers: r.u32()?,
                floor: r.u64()?,
            },
            tag::EVICT => Message::Evict {
                tag: r.u64()?,
                who: r.string("member name")?,
            },
            tag::MEMBER_EXTENTS => Message::MemberExtents {
                tag: r.u64()?,
                who: r.string("member name")?,
                after: r.u64()?,
            },
            other => return Err(ProtoError::UnknownType(other)),
        };
        if !r.buf.is_empty() {
            return Err(ProtoError::TrailingBytes(r.buf.len()));
        }
        Ok(msg)
    }
}
