//! Write-behind (private mounts, `data::behind`): a small write is answered before its bytes
//! are remote, yet reads see it, ENOSPC is still the write's own error, a send that fails is
//! reported by the file's next fsync (once), and a file removed with a write waiting drops it.

mod common;

use common::{bytes, TestFs};
use rmemfs::data::WritePath;
use std::time::Duration;

const KIB: usize = 1 << 10;

#[test]
fn a_write_answered_before_it_was_sent_reads_back_exactly() {
    let t = TestFs::writing_behind(2, 16 << 20, 1 << 20, WritePath::Frrwp, (1, 1));
    t.create("f").unwrap();
    let data = bytes(1, 20 * KIB);
    t.write_file("f", 0, &data).unwrap();
    let s = t.fs.data().write_behind_stats();
    assert_eq!((s.deferred, s.sent_inline, s.sent_by_worker), (1, 0, 0));
    // Its chunk exists (allocated before the answer), its bytes wait.
    assert!(t.remote_used() > 0);
    assert_eq!(
        t.read_file("f").unwrap(),
        data,
        "a read sends the waiting write first"
    );
    let s = t.fs.data().write_behind_stats();
    assert_eq!((s.sent_inline, s.failed), (1, 0));
}

#[test]
fn the_worker_sends_waiting_writes_of_many_files_in_one_round() {
    let t = TestFs::writing_behind(2, 16 << 20, 1 << 20, WritePath::Frrwp, (1, 1));
    let names: Vec<String> = (0..5).map(|i| format!("f{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        t.create(n).unwrap();
        t.write_file(n, 0, &bytes(i as u64, 3 * KIB + i)).unwrap();
    }
    assert_eq!(t.fs.data().flush_queued(Duration::ZERO), 5);
    assert_eq!(
        t.fs.data().flush_queued(Duration::ZERO),
        0,
        "nothing left waiting"
    );
    let s = t.fs.data().write_behind_stats();
    assert_eq!((s.deferred, s.sent_by_worker, s.sent_inline), (5, 5, 0));
    for (i, n) in names.iter().enumerate() {
        assert_eq!(t.read_file(n).unwrap(), bytes(i as u64, 3 * KIB + i));
    }
}

#[test]
fn a_failed_send_is_reported_by_the_next_fsync_once() {
    // Two copies required: with one server gone, the waiting write cannot land.
    let mut t = TestFs::writing_behind(2, 16 << 20, 1 << 20, WritePath::Frrwp, (2, 2));
    t.create("f").unwrap();
    let ino = t.resolve("f").unwrap();
    t.write_file("f", 0, &bytes(2, 8 * KIB))
        .expect("both servers up: the write is answered");
    t.kill_server(1);
    let first = t.fs.fsync(ino).expect("write-behind answers fsync");
    assert_eq!(first.map_err(|e| e.errno), Err(libc::EIO));
    assert_eq!(t.fs.data().write_behind_stats().failed, 1);
    assert!(
        t.fs.fsync(ino).expect("answered").is_ok(),
        "a failure is reported once, as a failed writeback is"
    );
}

#[test]
fn enospc_is_the_writes_own_error() {
    // One 1 MiB server, 64 KiB chunks: files fill it; the write that finds no room fails
    // itself, and everything answered before reads back.
    let t = TestFs::writing_behind(1, 1 << 20, 64 << 10, WritePath::Frrwp, (1, 1));
    let mut written = Vec::new();
    let err = loop {
        let name = format!("f{}", written.len());
        t.create(&name).unwrap();
        let data = bytes(written.len() as u64, 48 * KIB);
        match t.write_file(&name, 0, &data) {
            Ok(()) => written.push((name, data)),
            Err(e) => break e,
        }
        assert!(written.len() < 64, "a 1 MiB pool took more than 64 chunks");
    };
    assert_eq!(err, libc::ENOSPC);
    assert!(written.len() >= 8, "only {} files fit", written.len());
    for (name, data) in &written {
        let ino = t.resolve(name).unwrap();
        assert!(t.fs.fsync(ino).unwrap().is_ok(), "{name}");
        assert_eq!(&t.read_file(name).unwrap(), data, "{name}");
    }
}

#[test]
fn a_file_removed_with_a_write_waiting_drops_it_unsent() {
    let t = TestFs::writing_behind(1, 16 << 20, 1 << 20, WritePath::Frrwp, (1, 1));
    t.create("f").unwrap();
    t.write_file("f", 0, &bytes(3, 4 * KIB)).unwrap();
    t.fs.unlink(rmemfs::meta::ROOT_INO, b"f").unwrap();
    assert_eq!(t.fs.data().flush_queued(Duration::ZERO), 0);
    let s = t.fs.data().write_behind_stats();
    assert_eq!((s.deferred, s.sent_by_worker, s.sent_inline), (1, 0, 0));
    common::eventually("the file's extent freed", || t.remote_used() == 0);
}

#[test]
fn large_writes_go_out_before_their_answer() {
    let t = TestFs::writing_behind(1, 16 << 20, 1 << 20, WritePath::Frrwp, (1, 1));
    t.create("f").unwrap();
    let data = bytes(4, rmemfs::config::WRITE_BEHIND_SLOT_BYTES + 1);
    t.write_file("f", 0, &data).unwrap();
    assert_eq!(t.fs.data().write_behind_stats().deferred, 0);
    assert_eq!(t.read_file("f").unwrap(), data);
}

#[test]
fn a_file_written_once_is_queued_however_often_another_is_rewritten() {
    // A hot file's writes each send the one before (the worker idle meanwhile); a file
    // written once after them must still be in the worker's queue, not left unsent.
    let t = TestFs::writing_behind(1, 16 << 20, 1 << 20, WritePath::Frrwp, (1, 1));
    t.create("hot").unwrap();
    for i in 0..600u64 {
        t.write_file("hot", (i % 8) * 4096, &bytes(i, 4 * KIB))
            .unwrap();
    }
    t.create("once").unwrap();
    t.write_file("once", 0, &bytes(99, 5 * KIB)).unwrap();
    assert_eq!(
        t.fs.data().flush_queued(Duration::ZERO),
        2,
        "the worker sends both waiting writes"
    );
    let s = t.fs.data().write_behind_stats();
    assert_eq!((s.deferred, s.sent_inline, s.sent_by_worker), (601, 599, 2));
}
