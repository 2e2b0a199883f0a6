//! One message of every kind, for the protocol tests and the fuzzers' seed corpus.

use super::*;

/// One message of every kind, with plausible fields: the protocol tests' round trips, and the
/// fuzzers' seed corpus.
pub fn sample_messages() -> Vec<Message> {
    let cap = Capacity {
        total: 1 << 30,
        free: 1 << 29,
        largest_free: 1 << 28,
    };
    vec![
        Message::Hello {
            version: PROTOCOL_VERSION,
            client_name: "mount@host".into(),
            nonce: [7; 32],
            observer: false,
        },
        Message::Challenge {
            version: PROTOCOL_VERSION,
            nonce: [8; 32],
            authenticated: true,
            proof: [9; 32],
        },
        Message::Proof { proof: [10; 32] },
        Message::Welcome {
            version: PROTOCOL_VERSION,
            server_instance: 0xdead_beef,
            fabric: "tcp".into(),
            capacity: cap,
            backed: true,
        },
        Message::Connect {
            tag: 1,
            blob: vec![1, 2, 3],
        },
        Message::Connected {
            tag: 1,
            blob: vec![],
        },
        Message::Alloc { tag: 7, len: 4096 },
        Message::Allocated {
            tag: 7,
            addr: 0x1000,
            len: 4096,
            rkey: 42,
            capacity: cap,
        },
        Message::Free {
            tag: 8,
            addr: 0x1000,
            rkey: 42,
        },
        Message::Freed {
            tag: 8,
            capacity: cap,
        },
        Message::Stat { tag: 9 },
        Message::Stats {
            tag: 9,
            capacity: cap,
            extents: 3,
            clients: 2,
            counters: ServerCounters::from_fields([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]),
            session: crate::proto::Holding {
                extents: 2,
                bytes: 8192,
            },
        },
        Message::Refused {
            tag: 10,
            code: RefusalCode::NoSpace,
            message: "pool is full: largest free extent 0 bytes".into(),
        },
        Message::Fatal {
            message: "bad magic".into(),
        },
        Message::Resume {
            tag: 11,
            token: [12; 32],
        },
        Message::Resumed {
            tag: 11,
            extents: 4,
            bytes: 1 << 22,
            rekeyed: true,
            behind: true,
        },
        Message::Goodbye,
        Message::VolumeClaim {
            tag: 12,
            name: "builds".into(),
            holder: "host pid 42".into(),
            mode: ClaimMode::Adopt,
            takeover: true,
            min_epoch: 3,
        },
        Message::VolumeClaimed {
            tag: 12,
            epoch: 4,
            created: false,
            root: vec![1, 2, 3],
            extents: 5,
            bytes: 1 << 20,
        },
        Message::VolumeRoot {
            tag: 13,
            root: vec![4; 40],
        },
        Message::VolumeDone { tag: 13 },
        Message::VolumeExtents { tag: 14, after: 0 },
        Message::ExtentList {
            tag: 14,
            extents: vec![(0x1000, 4096, 7), (0x3000, 8192, 9)],
            more: true,
        },
        Message::VolumeList {
            tag: 15,
            after: String::new(),
        },
        Message::Volumes {
            tag: 15,
            volumes: vec![VolumeInfo {
                name: "builds".into(),
                epoch: 4,
                holder: "host pid 42".into(),
                live: true,
                idle_secs: 1,
                extents: 5,
                bytes: 1 << 20,
                root: vec![1],
            }],
            more: false,
        },
        Message::VolumeDrop {
            tag: 16,
            name: "builds".into(),
        },
        Message::Persist { tag: 17 },
        Message::Persisted { tag: 17 },
        Message::FollowAt { tag: 18, lsn: 99 },
        Message::FollowRoot {
            tag: 18,
            epoch: 4,
            root: vec![1, 2, 3],
        },
        Message::Followers { tag: 19 },
        Message::FollowerFloor {
            tag: 19,
            followers: 2,
            floor: u64::MAX,
        },
        Message::Evict {
            tag: 20,
            who: "host-b pid 77 session 4".into(),
        },
        Message::MemberExtents {
            tag: 21,
            who: "host-b pid 77 session 4".into(),
            after: 0x1000,
        },
    ]
}
