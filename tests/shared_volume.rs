//! A shared volume's writers on a memory server (`ClaimMode::Share`, the servers' side of many
//! writers whose namespace lives in a metadata engine): what one member allocates is the
//! volume's and outlives it, any member frees it, a member is evicted on its own (connections
//! closed, its name refused from then on), and a shared volume and a held one do not mix.

mod common;

use common::rack::Rack;
use common::{claim, control as connect, eventually};
use rmemfs::client::control::ControlConn;
use rmemfs::proto::{ClaimMode, Message, RefusalCode};
use std::net::SocketAddr;

/// A member joined as `who`.
fn member(addr: SocketAddr, who: &str) -> ControlConn {
    let c = connect(addr);
    let m = claim(&c, "shared", who, ClaimMode::Share);
    assert!(matches!(m, Message::VolumeClaimed { .. }), "{m:?}");
    c
}

fn alloc(c: &ControlConn, len: u64) -> (u64, u64) {
    match c.request(|tag| Message::Alloc { tag, len }).unwrap() {
        Message::Allocated { addr, rkey, .. } => (addr, rkey),
        other => panic!("{other:?}"),
    }
}

fn free(c: &ControlConn, (addr, rkey): (u64, u64)) -> Message {
    c.request(|tag| Message::Free { tag, addr, rkey }).unwrap()
}

#[test]
fn members_share_the_volume_s_memory_and_are_evicted_on_their_own() {
    let rack = Rack::new(1);
    let addr = rack.addrs()[0];
    let free_at_start = rack.free()[0];
    let a = member(addr, "client-a");
    let b = member(addr, "client-b");
    let one = alloc(&a, 1 << 20);
    let two = alloc(&a, 1 << 20);
    // B frees what A made.
    assert!(matches!(free(&b, one), Message::Freed { .. }));
    // A leaves (a crash): its other extent stays with the volume.
    a.kill();
    let c = member(addr, "client-c");
    assert!(rack.free()[0] < free_at_start);
    assert!(matches!(free(&c, two), Message::Freed { .. }));
    assert_eq!(rack.free()[0], free_at_start);
    // The floor counts members: none has said how far it has applied yet.
    match b.request(|tag| Message::Followers { tag }).unwrap() {
        Message::FollowerFloor {
            followers, floor, ..
        } => assert_eq!((followers, floor), (2, 0)),
        other => panic!("{other:?}"),
    }
    b.request(|tag| Message::FollowAt { tag, lsn: 9 }).unwrap();
    c.request(|tag| Message::FollowAt { tag, lsn: 7 }).unwrap();
    match b.request(|tag| Message::Followers { tag }).unwrap() {
        Message::FollowerFloor { floor, .. } => assert_eq!(floor, 7),
        other => panic!("{other:?}"),
    }

    // B evicts C: C's connection is closed, and its name is refused from then on.
    let kept = alloc(&c, 4096);
    assert!(matches!(
        b.request(|tag| Message::Evict {
            tag,
            who: "client-c".into()
        })
        .unwrap(),
        Message::VolumeDone { .. }
    ));
    eventually("the evicted member's connection is closed", || {
        c.request(|tag| Message::Stat { tag }).is_err()
    });
    let again = connect(addr);
    match claim(&again, "shared", "client-c", ClaimMode::Share) {
        Message::Refused { code, message, .. } => {
            assert_eq!(code, RefusalCode::Fenced);
            assert!(message.contains("evicted"), "{message}");
        }
        other => panic!("an evicted member joined again: {other:?}"),
    }
    // What it made stays the volume's.
    assert!(matches!(free(&b, kept), Message::Freed { .. }));
    // No member may be evicted by a session that is not one.
    let stranger = connect(addr);
    assert!(stranger
        .request(|tag| Message::Evict {
            tag,
            who: "client-b".into()
        })
        .is_err());
}

#[test]
fn a_shared_volume_and_a_held_one_do_not_mix() {
    let rack = Rack::new(1);
    let addr = rack.addrs()[0];
    let _held = rack.attach("vol", true, false).unwrap();
    let c = connect(addr);
    match claim(&c, "vol", "client-a", ClaimMode::Share) {
        Message::Refused { code, .. } => assert_eq!(code, RefusalCode::Held),
        other => panic!("a held volume took a member: {other:?}"),
    }
    let _m = member(addr, "client-a");
    let c = connect(addr);
    match claim(&c, "shared", "x pid 1", ClaimMode::Attach) {
        Message::Refused { code, message, .. } => {
            assert_eq!(code, RefusalCode::Held);
            assert!(message.contains("--meta"), "{message}");
        }
        other => panic!("a shared volume was attached by a holder: {other:?}"),
    }
    // Nor removed while a member writes.
    let c = connect(addr);
    assert!(matches!(
        c.request(|tag| Message::VolumeDrop {
            tag,
            name: "shared".into()
        })
        .unwrap(),
        Message::Refused {
            code: RefusalCode::Held,
            ..
        }
    ));
}
