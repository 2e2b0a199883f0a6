//! The fuzz targets' regression tests, without libFuzzer: every file under
//! `fuzz/regressions/<target>/` (and every seed under `fuzz/corpus/<target>/`) goes through the
//! same check as the target (`rmemfs::fuzz_checks`).
//!
//! Every crash the fuzzers find is copied to `fuzz/regressions/<target>/` and becomes a test
//! here (tools/fuzz.sh prints the artifact's path). The seed corpus is written by
//! `cargo test --features testing --test fuzz_regressions -- --ignored write_seed_corpus`.

use rmemfs::fabric::tcp::wire::{Request, Response, DATA_MAGIC, REQ_HEADER, RESP_HEADER};
use rmemfs::fabric::{Opcode, WcStatus};
use rmemfs::fuzz_checks;
use rmemfs::proto::{read_frame, write_frame, FrameError, Message, ProtoError};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The input files of one target in `fuzz/<kind>/<target>/` (dot files left out).
fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = fuzz_dir().join(kind).join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| {
            p.is_file()
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    files.sort();
    files
}

/// Runs `check` on every regression input and seed of `target`, naming every one that fails.
fn replay(target: &str, check: fn(&[u8])) {
    let mut failed = Vec::new();
    let mut n = 0;
    for kind in ["regressions", "corpus"] {
        for path in inputs(kind, target) {
            let data = std::fs::read(&path).expect("reading an input");
            n += 1;
            if catch_unwind(AssertUnwindSafe(|| check(&data))).is_err() {
                failed.push(path.display().to_string());
            }
        }
    }
    assert!(failed.is_empty(), "{target}: failing inputs: {failed:#?}");
    // No input at all would pass without checking anything (a moved or emptied corpus).
    assert!(n > 0, "{target}: no regression inputs or seeds under fuzz/");
    eprintln!("{target}: {n} inputs pass");
}

#[test]
fn control_message_regressions() {
    replay("control_message", fuzz_checks::control_message);
}

#[test]
fn tcp_request_regressions() {
    replay("tcp_request", fuzz_checks::tcp_request);
}

#[test]
fn nic_stream_regressions() {
    replay("nic_stream", fuzz_checks::nic_stream);
}

#[test]
fn control_session_regressions() {
    replay("control_session", fuzz_checks::control_session);
}

fn regression(target: &str, name: &str) -> Vec<u8> {
    let path = fuzz_dir().join("regressions").join(target).join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The hand-made regression inputs are refused the way the protocol says.
#[test]
fn hand_made_inputs_are_refused() {
    let huge = regression("control_message", "frame-announcing-4GiB");
    assert!(matches!(
        read_frame(&mut huge.as_slice()),
        Err(FrameError::Proto(ProtoError::Oversized(0xffff_ffff)))
    ));
    let unknown = regression("control_message", "unknown-message-type");
    assert_eq!(
        Message::decode(&unknown[4..]),
        Err(ProtoError::UnknownType(0xc8))
    );
    let op = regression("tcp_request", "unknown-opcode");
    assert!(Request::decode(op[..REQ_HEADER].try_into().unwrap()).is_err());
    let len = regression("tcp_request", "length-over-max-op");
    assert!(Request::decode(len[..REQ_HEADER].try_into().unwrap()).is_err());
}

/// Found by `tcp_request`: `Response::decode` ignored the padding (bytes 1..8) that
/// `Request::decode` refuses when nonzero, so junk there decoded and re-encoded to other bytes.
#[test]
fn response_with_junk_padding_is_refused() {
    let h = regression("tcp_request", "response-junk-padding");
    assert!(Response::decode(h[..RESP_HEADER].try_into().unwrap()).is_err());
}

fn write_seeds(target: &str, seeds: Vec<(String, Vec<u8>)>) {
    let dir = fuzz_dir().join("corpus").join(target);
    std::fs::create_dir_all(&dir).expect("creating the corpus directory");
    for (name, bytes) in seeds {
        std::fs::write(dir.join(name), bytes).expect("writing a seed");
    }
}

/// Writes the seed corpus (valid encodings of every message and header) into fuzz/corpus/.
#[test]
#[ignore = "writes fuzz/corpus/: run by hand when the wire formats change"]
fn write_seed_corpus() {
    let mut seeds = Vec::new();
    let mut stream = Vec::new();
    for (i, msg) in rmemfs::proto::sample_messages().into_iter().enumerate() {
        seeds.push((format!("body-{i:02}"), msg.encode()));
        write_frame(&mut stream, &msg).unwrap();
    }
    seeds.push(("frames-all".into(), stream));
    write_seeds("control_message", seeds);

    let read = Request {
        opcode: Opcode::Read,
        rkey: 0xdead_beef,
        addr: 1 << 40,
        len: 4096,
        seq: 1,
    };
    let write = Request {
        opcode: Opcode::Write,
        len: 16,
        seq: 2,
        ..read
    };
    let ok = Response {
        status: WcStatus::Success,
        seq: 1,
        len: 4096,
    };
    let refused = Response {
        status: WcStatus::RemoteAccessError,
        seq: 2,
        len: 16,
    };
    write_seeds(
        "tcp_request",
        vec![
            ("request-read".into(), read.encode().to_vec()),
            ("request-write".into(), write.encode().to_vec()),
            ("response-ok".into(), ok.encode().to_vec()),
            ("response-refused".into(), refused.encode().to_vec()),
        ],
    );

    // `nic_stream`: an even first byte has the target send the magic and a live session's
    // token first; an odd one sends the input as it is.
    let mut conn = vec![0u8];
    conn.extend_from_slice(&read.encode());
    let mut with_write = conn.clone();
    with_write.extend_from_slice(&write.encode());
    with_write.extend_from_slice(&[0xab; 16]);
    with_write.extend_from_slice(&Request { seq: 3, ..read }.encode());
    write_seeds(
        "nic_stream",
        vec![
            ("magic-only".into(), [&[1u8][..], &DATA_MAGIC[..]].concat()),
            ("read".into(), conn),
            ("read-write-read".into(), with_write),
        ],
    );

    // `control_session`: the first byte picks raw (0), after Hello (1) or authenticated (2);
    // the rest is a stream of frames.
    let frames = |msgs: &[Message]| {
        let mut v = Vec::new();
        for m in msgs {
            write_frame(&mut v, m).unwrap();
        }
        v
    };
    let sample = rmemfs::proto::sample_messages();
    write_seeds(
        "control_session",
        vec![
            (
                "raw-hello".into(),
                [&[0u8][..], &frames(&sample[..1])].concat(),
            ),
            (
                "proof".into(),
                [&[1u8][..], &frames(&[Message::Proof { proof: [3; 32] }])].concat(),
            ),
            (
                "session".into(),
                [
                    &[2u8][..],
                    &frames(&[
                        Message::Alloc { tag: 1, len: 8192 },
                        Message::Stat { tag: 2 },
                        Message::Free {
                            tag: 3,
                            addr: 0x1000,
                            rkey: 42,
                        },
                        Message::Resume {
                            tag: 4,
                            token: [9; 32],
                        },
                        Message::Connect {
                            tag: 5,
                            blob: vec![],
                        },
                        Message::Goodbye,
                    ]),
                ]
                .concat(),
            ),
            (
                "session-every-message".into(),
                [&[2u8][..], &frames(&sample)].concat(),
            ),
        ],
    );
}
