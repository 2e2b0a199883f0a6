//! Encoding: a message's body, field by field in the order `decode` reads them.

use super::wire::{tag, Writer};
use super::*;

impl Message {
    /// Encodes the message body (without the length prefix).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(64));
        match self {
            Message::Hello {
                version,
                client_name,
                nonce,
                observer,
            } => {
                w.u8(tag::HELLO);
                w.u32(HELLO_MAGIC);
                w.u16(*version);
                w.string(client_name);
                w.array(nonce);
                w.u8(u8::from(*observer));
            }
            Message::Challenge {
                version,
                nonce,
                authenticated,
                proof,
            } => {
                w.u8(tag::CHALLENGE);
                w.u16(*version);
                w.array(nonce);
                w.u8(*authenticated as u8);
                w.array(proof);
            }
            Message::Proof { proof } => {
                w.u8(tag::PROOF);
                w.array(proof);
            }
            Message::Welcome {
                version,
                server_instance,
                fabric,
                capacity,
                backed,
            } => {
                w.u8(tag::WELCOME);
                w.u16(*version);
                w.u64(*server_instance);
                w.string(fabric);
                w.capacity(capacity);
                w.u8(u8::from(*backed));
            }
            Message::Connect { tag: t, blob } => {
                w.u8(tag::CONNECT);
                w.u64(*t);
                w.bytes(blob, MAX_BLOB_LEN);
            }
            Message::Connected { tag: t, blob } => {
                w.u8(tag::CONNECTED);
                w.u64(*t);
                w.bytes(blob, MAX_BLOB_LEN);
            }
            Message::Alloc { tag: t, len } => {
                w.u8(tag::ALLOC);
                w.u64(*t);
                w.u64(*len);
            }
            Message::Allocated {
                tag: t,
                addr,
                len,
                rkey,
                capacity,
            } => {
                w.u8(tag::ALLOCATED);
                w.u64(*t);
                w.u64(*addr);
                w.u64(*len);
                w.u64(*rkey);
                w.capacity(capacity);
            }
            Message::Free { tag: t, addr, rkey } => {
                w.u8(tag::FREE);
                w.u64(*t);
                w.u64(*addr);
                w.u64(*rkey);
            }
            Message::Freed { tag: t, capacity } => {
                w.u8(tag::FREED);
                w.u64(*t);
                w.capacity(capacity);
            }
            Message::Stat { tag: t } => {
                w.u8(tag::STAT);
                w.u64(*t);
            }
            Message::Stats {
                tag: t,
                capacity,
                extents,
                clients,
                counters,
                session,
            } => {
                w.u8(tag::STATS);
                w.u64(*t);
                w.capacity(capacity);
                w.u64(*extents);
                w.u32(*clients);
                w.u64(session.extents);
                w.u64(session.bytes);
                for (_, v) in counters.fields() {
                    w.u64(v);
                }
            }
            Message::Refused {
                tag: t,
                code,
                message,
            } => {
                w.u8(tag::REFUSED);
                w.u64(*t);
                w.u16(*code as u16);
                w.string(message);
            }
            Message::Fatal { message } => {
                w.u8(tag::FATAL);
                w.string(message);
            }
            Message::Resume { tag: t, token } => {
                w.u8(tag::RESUME);
                w.u64(*t);
                w.array(token);
            }
            Message::Resumed {
                tag: t,
                extents,
                bytes,
                rekeyed,
                behind,
            } => {
                w.u8(tag::RESUMED);
                w.u64(*t);
                w.u64(*extents);
                w.u64(*bytes);
                w.u8(u8::from(*rekeyed));
                w.u8(u8::from(*behind));
            }
            Message::Goodbye => w.u8(tag::GOODBYE),
            Message::VolumeClaim {
                tag: t,
                name,
                holder,
                mode,
                takeover,
                min_epoch,
            } => {
                w.u8(tag::VOLUME_CLAIM);
                w.u64(*t);
                w.string(name);
                w.string(holder);
                w.u8(*mode as u8);
                w.u8(u8::from(*takeover));
                w.u64(*min_epoch);
            }
            Message::VolumeClaimed {
                tag: t,
                epoch,
                created,
                root,
                extents,
                bytes,
            } => {
                w.u8(tag::VOLUME_CLAIMED);
                w.u64(*t);
                w.u64(*epoch);
                w.u8(u8::from(*created));
                w.bytes(root, MAX_ROOT_LEN);
                w.u64(*extents);
                w.u64(*bytes);
            }
            Message::VolumeRoot { tag: t, root } => {
                w.u8(tag::VOLUME_ROOT);
                w.u64(*t);
                w.bytes(root, MAX_ROOT_LEN);
            }
            Message::VolumeDone { tag: t } => {
                w.u8(tag::VOLUME_DONE);
                w.u64(*t);
            }
            Message::VolumeExtents { tag: t, after } => {
                w.u8(tag::VOLUME_EXTENTS);
                w.u64(*t);
                w.u64(*after);
            }
            Message::ExtentList {
                tag: t,
                extents,
                more,
            } => {
                w.u8(tag::EXTENT_LIST);
                w.u64(*t);
                let n = extents.len().min(EXTENTS_PER_LIST);
                w.u16(n as u16);
                for (a, l, k) in &extents[..n] {
                    w.u64(*a);
                    w.u64(*l);
                    w.u64(*k);
                }
                w.u8(u8::from(*more || n < extents.len()));
            }
            Message::VolumeList { tag: t, after } => {
                w.u8(tag::VOLUME_LIST);
                w.u64(*t);
                w.string(after);
            }
            Message::Volumes {
                tag: t,
                volumes,
                more,
            } => {
                w.u8(tag::VOLUMES);
                w.u64(*t);
                let n = volumes.len().min(MAX_VOLUMES_PER_LIST);
                w.u16(n as u16);
                for v in &volumes[..n] {
                    w.string(&v.name);
                    w.u64(v.epoch);
                    w.string(&v.holder);
                    w.u8(u8::from(v.live));
                    w.u64(v.idle_secs);
                    w.u64(v.extents);
                    w.u64(v.bytes);
                    w.bytes(&v.root, MAX_ROOT_LEN);
                }
                w.u8(u8::from(*more || n < volumes.len()));
            }
            Message::VolumeDrop { tag: t, name } => {
                w.u8(tag::VOLUME_DROP);
                w.u64(*t);
                w.string(name);
            }
            Message::Persist { tag: t } => {
                w.u8(tag::PERSIST);
                w.u64(*t);
            }
            Message::Persisted { tag: t } => {
                w.u8(tag::PERSISTED);
                w.u64(*t);
            }
            Message::FollowAt { tag: t, lsn } => {
                w.u8(tag::FOLLOW_AT);
                w.u64(*t);
                w.u64(*lsn);
            }
            Message::FollowRoot {
                tag: t,
                epoch,
                root,
            } => {
                w.u8(tag::FOLLOW_ROOT);
                w.u64(*t);
                w.u64(*epoch);
                w.bytes(root, MAX_ROOT_LEN);
            }
            Message::Followers { tag: t } => {
                w.u8(tag::FOLLOWERS);
                w.u64(*t);
            }
            Message::FollowerFloor {
                tag: t,
                followers,
                floor,
            } => {
                w.u8(tag::FOLLOWER_FLOOR);
                w.u64(*t);
                w.u32(*followers);
                w.u64(*floor);
            }
            Message::Evict { tag: t, who } => {
                w.u8(tag::EVICT);
                w.u64(*t);
                w.string(who);
            }
            Message::MemberExtents { tag: t, who, after } => {
                w.u8(tag::MEMBER_EXTENTS);
                w.u64(*t);
                w.string(who);
                w.u64(*after);
            }
        }
        w.0
    }
}
