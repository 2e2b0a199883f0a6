//! Reference-model test of the file system core: random operation sequences are applied to
//! the real `Fs` (over in-process memory servers and fabric, with small chunks so files span
//! several chunks and servers) and to a plain in-memory model; results (data or errno) must
//! agree after every step, and the whole tree must agree at the end.

mod common;

use common::{bytes, TestFs, ME};
use proptest::prelude::*;
use rmemfs::data::WritePath;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// The model: inodes are files (bytes) or directories (names to inodes, and a parent).
#[derive(Debug, Clone)]
enum Node {
    File(Vec<u8>),
    Dir {
        parent: u64,
        entries: BTreeMap<String, u64>,
    },
}

#[derive(Debug)]
struct Model {
    nodes: HashMap<u64, Node>,
    next: u64,
}

const ROOT: u64 = 1;

impl Model {
    fn new() -> Model {
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node::Dir {
                parent: ROOT,
                entries: BTreeMap::new(),
            },
        );
        Model { nodes, next: 2 }
    }

    fn entries(&self, dir: u64) -> Result<&BTreeMap<String, u64>, i32> {
        match &self.nodes[&dir] {
            Node::Dir { entries, .. } => Ok(entries),
            Node::File(_) => Err(libc::ENOTDIR),
        }
    }
    fn entries_mut(&mut self, dir: u64) -> &mut BTreeMap<String, u64> {
        match self.nodes.get_mut(&dir).unwrap() {
            Node::Dir { entries, .. } => entries,
            Node::File(_) => unreachable!(),
        }
    }
    fn is_dir(&self, n: u64) -> bool {
        matches!(self.nodes[&n], Node::Dir { .. })
    }
    /// The names a node has (hard links), in every directory.
    fn links(&self, n: u64) -> usize {
        self.nodes
            .values()
            .filter_map(|node| match node {
                Node::Dir { entries, .. } => Some(entries.values().filter(|&&e| e == n).count()),
                Node::File(_) => None,
            })
            .sum()
    }

    fn resolve(&self, path: &str) -> Result<u64, i32> {
        let mut n = ROOT;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            n = *self.entries(n)?.get(part).ok_or(libc::ENOENT)?;
        }
        Ok(n)
    }
    fn parent<'p>(&self, path: &'p str) -> Result<(u64, &'p str), i32> {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        Ok((self.resolve(dir)?, name))
    }
    fn add(&mut self, node: Node) -> u64 {
        let n = self.next;
        self.next += 1;
        self.nodes.insert(n, node);
        n
    }

    fn create(&mut self, path: &str) -> Result<(), i32> {
        let (p, name) = self.parent(path)?;
        if self.entries(p)?.contains_key(name) {
            return Err(libc::EEXIST);
        }
        let n = self.add(Node::File(Vec::new()));
        self.entries_mut(p).insert(name.into(), n);
        Ok(())
    }
    fn mkdir(&mut self, path: &str) -> Result<(), i32> {
        let (p, name) = self.parent(path)?;
        if self.entries(p)?.contains_key(name) {
            return Err(libc::EEXIST);
        }
        let n = self.add(Node::Dir {
            parent: p,
            entries: BTreeMap::new(),
        });
        self.entries_mut(p).insert(name.into(), n);
        Ok(())
    }
    fn file_mut(&mut self, path: &str) -> Result<&mut Vec<u8>, i32> {
        let n = self.resolve(path)?;
        match self.nodes.get_mut(&n).unwrap() {
            Node::File(d) => Ok(d),
            Node::Dir { .. } => Err(libc::EISDIR),
        }
    }
    fn write(&mut self, path: &str, off: usize, data: &[u8]) -> Result<(), i32> {
        let f = self.file_mut(path)?;
        if f.len() < off + data.len() {
            f.resize(off + data.len(), 0);
        }
        f[off..off + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn truncate(&mut self, path: &str, size: usize) -> Result<(), i32> {
        self.file_mut(path)?.resize(size, 0);
        Ok(())
    }
    /// `fallocate(2)` on the bytes alone (what is allocated is not modelled).
    fn fallocate(&mut self, path: &str, how: Falloc, off: usize, len: usize) -> Result<(), i32> {
        let f = self.file_mut(path)?;
        if len == 0 {
            return Err(libc::EINVAL);
        }
        let end = off + len;
        let size = f.len();
        match how {
            Falloc::Reserve { keep_size } => {
                if !keep_size && end > size {
                    f.resize(end, 0);
                }
            }
            Falloc::Punch => f[off.min(size)..end.min(size)].fill(0),
            Falloc::Zero { keep_size } => {
                if !keep_size && end > size {
                    f.resize(end, 0);
                }
                let size = f.len();
                f[off.min(size)..end.min(size)].fill(0);
            }
            Falloc::Collapse | Falloc::Insert
                if !off.is_multiple_of(4096) || !len.is_multiple_of(4096) =>
            {
                return Err(libc::EINVAL)
            }
            Falloc::Collapse => {
                if end >= size {
                    return Err(libc::EINVAL);
                }
                f.drain(off..end);
            }
            Falloc::Insert => {
                if off >= size {
                    return Err(libc::EINVAL);
                }
                f.splice(off..off, std::iter::repeat_n(0, len));
            }
        }
        Ok(())
    }
    fn read(&self, path: &str) -> Result<Vec<u8>, i32> {
        match &self.nodes[&self.resolve(path)?] {
            Node::File(d) => Ok(d.clone()),
            Node::Dir { .. } => Err(libc::EISDIR),
        }
    }
    fn unlink(&mut self, path: &str) -> Result<(), i32> {
        let (p, name) = self.parent(path)?;
        let n = *self.entries(p)?.get(name).ok_or(libc::ENOENT)?;
        if self.is_dir(n) {
            return Err(libc::EISDIR);
        }
        self.entries_mut(p).remove(name);
        Ok(())
    }
    fn rmdir(&mut self, path: &str) -> Result<(), i32> {
        let (p, name) = self.parent(path)?;
        let n = *self.entries(p)?.get(name).ok_or(libc::ENOENT)?;
        if !self.is_dir(n) {
            return Err(libc::ENOTDIR);
        }
        if !self.entries(n)?.is_empty() {
            return Err(libc::ENOTEMPTY);
        }
        self.entries_mut(p).remove(name);
        Ok(())
    }
    fn link(&mut self, from: &str, to: &str) -> Result<(), i32> {
        let n = self.resolve(from)?;
        let (p, name) = self.parent(to)?;
        if self.is_dir(n) {
            return Err(libc::EPERM);
        }
        if self.entries(p)?.contains_key(name) {
            return Err(libc::EEXIST);
        }
        self.entries_mut(p).insert(name.into(), n);
        Ok(())
    }
    fn within(&self, mut n: u64, ancestor: u64) -> bool {
        loop {
            if n == ancestor {
                return true;
            }
            match &self.nodes[&n] {
                Node::Dir { parent, .. } if *parent != n => n = *parent,
                _ => return false,
            }
        }
    }
    fn rename(&mut self, from: &str, to: &str) -> Result<(), i32> {
        let (sp, sname) = self.parent(from)?;
        let (dp, dname) = self.parent(to)?;
        let src = *self.entries(sp)?.get(sname).ok_or(libc::ENOENT)?;
        let src_dir = self.is_dir(src);
        if src_dir && self.within(dp, src) {
            return Err(libc::EINVAL);
        }
        if let Some(&dst) = self.entries(dp)?.get(dname) {
            if dst == src {
                return Ok(());
            }
            match (src_dir, self.is_dir(dst)) {
                (true, false) => return Err(libc::ENOTDIR),
                (false, true) => return Err(libc::EISDIR),
                (true, true) if !self.entries(dst)?.is_empty() => return Err(libc::ENOTEMPTY),
                _ => {}
            }
        }
        self.entries_mut(sp).remove(sname);
        self.entries_mut(dp).insert(dname.into(), src);
        if let Node::Dir { parent, .. } = self.nodes.get_mut(&src).unwrap() {
            *parent = dp;
        }
        Ok(())
    }
    fn list(&self, path: &str) -> Result<Vec<String>, i32> {
        Ok(self.entries(self.resolve(path)?)?.keys().cloned().collect())
    }
}

/// The `fallocate` modes the model knows.
#[derive(Debug, Clone, Copy)]
enum Falloc {
    Reserve { keep_size: bool },
    Punch,
    Zero { keep_size: bool },
    Collapse,
    Insert,
}

impl Falloc {
    fn mode(self) -> i32 {
        let keep = |k: bool| if k { libc::FALLOC_FL_KEEP_SIZE } else { 0 };
        match self {
            Falloc::Reserve { keep_size } => keep(keep_size),
            Falloc::Punch => libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            Falloc::Zero { keep_size } => libc::FALLOC_FL_ZERO_RANGE | keep(keep_size),
            Falloc::Collapse => libc::FALLOC_FL_COLLAPSE_RANGE,
            Falloc::Insert => libc::FALLOC_FL_INSERT_RANGE,
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Fallocate(String, Falloc, usize, usize),
    /// `O_TMPFILE` in the directory, written (length, seed), then linked as the name.
    TmpfileLink(String, String, usize, u64),
    Create(String),
    Mkdir(String),
    Write(String, usize, usize, u64),
    Truncate(String, usize),
    Read(String),
    Unlink(String),
    Rmdir(String),
    Link(String, String),
    Rename(String, String),
    List(String),
    /// A directory read with attributes (READDIRPLUS): names, and each file's size and links.
    ListPlus(String),
}

/// Mostly top-level names, so operations meet the same few files often; some deeper paths
/// for directories and renames across them.
fn path() -> impl Strategy<Value = String> {
    let part = || prop_oneof!["a", "b", "c"];
    prop_oneof![
        3 => part().prop_map(String::from),
        2 => (part(), part()).prop_map(|(x, y)| format!("{x}/{y}")),
        1 => (part(), part(), part()).prop_map(|(x, y, z)| format!("{x}/{y}/{z}")),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    // Offsets and sizes cross the 8 KiB chunk boundaries of the test file system.
    prop_oneof![
        3 => path().prop_map(Op::Create),
        2 => path().prop_map(Op::Mkdir),
        4 => (path(), prop_oneof![0usize..6000, 0usize..40_000],
              prop_oneof![0usize..3000, 0usize..20_000], any::<u64>())
            .prop_map(|(p, o, l, s)| Op::Write(p, o, l, s)),
        2 => (path(), prop_oneof![0usize..9000, 0usize..50_000])
            .prop_map(|(p, s)| Op::Truncate(p, s)),
        2 => path().prop_map(Op::Read),
        2 => path().prop_map(Op::Unlink),
        1 => path().prop_map(Op::Rmdir),
        1 => (path(), path()).prop_map(|(a, b)| Op::Link(a, b)),
        2 => (path(), path()).prop_map(|(a, b)| Op::Rename(a, b)),
        1 => prop_oneof![Just(String::new()), path()].prop_map(Op::List),
        1 => prop_oneof![Just(String::new()), path()].prop_map(Op::ListPlus),
        // Byte ranges for reserving, punching and zeroing; 4 KiB blocks (half a chunk here,
        // so both whole-chunk renumbering and copying run) for collapse and insert, with
        // now and then a range that is not aligned.
        2 => (path(), prop_oneof![
                  any::<bool>().prop_map(|keep_size| Falloc::Reserve { keep_size }),
                  Just(Falloc::Punch),
                  any::<bool>().prop_map(|keep_size| Falloc::Zero { keep_size }),
              ], 0usize..40_000, 0usize..20_000)
            .prop_map(|(p, how, o, l)| Op::Fallocate(p, how, o, l)),
        1 => (prop_oneof![Just(String::new()), path()], prop_oneof!["a", "b", "c"],
              0usize..20_000, any::<u64>())
            .prop_map(|(d, n, l, s)| Op::TmpfileLink(d, n.to_string(), l, s)),
        2 => (path(), prop_oneof![Just(Falloc::Collapse), Just(Falloc::Insert)],
              0usize..10, 1usize..4, prop_oneof![9 => Just(0usize), 1 => 1usize..4096])
            .prop_map(|(p, how, o, l, skew)| Op::Fallocate(p, how, o * 4096 + skew, l * 4096)),
    ]
}

/// How writes reach the file system: copied (`Fs::write`) or in place (the FUSE adapter's
/// zero-copy path, `Fs::write_in_place`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Writes {
    Copied,
    InPlace,
}

/// The op with every path under `dir/` (each thread of the concurrent test has its own tree).
fn under(dir: &str, op: &Op) -> Op {
    let p = |x: &String| format!("{dir}/{x}");
    match op {
        Op::Create(a) => Op::Create(p(a)),
        Op::Fallocate(a, how, o, l) => Op::Fallocate(p(a), *how, *o, *l),
        Op::TmpfileLink(d, n, l, s) => Op::TmpfileLink(p(d), n.clone(), *l, *s),
        Op::Mkdir(a) => Op::Mkdir(p(a)),
        Op::Write(a, o, l, s) => Op::Write(p(a), *o, *l, *s),
        Op::Truncate(a, s) => Op::Truncate(p(a), *s),
        Op::Read(a) => Op::Read(p(a)),
        Op::Unlink(a) => Op::Unlink(p(a)),
        Op::Rmdir(a) => Op::Rmdir(p(a)),
        Op::Link(a, b) => Op::Link(p(a), p(b)),
        Op::Rename(a, b) => Op::Rename(p(a), p(b)),
        Op::List(a) => Op::List(p(a)),
        Op::ListPlus(a) => Op::ListPlus(p(a)),
    }
}

/// Applies one op to the real file system.
fn apply_fs(t: &TestFs, op: &Op, writes: Writes) -> Result<Vec<u8>, i32> {
    let e = |e: rmemfs::error::Error| e.errno;
    let none = |r: Result<(), i32>| r.map(|()| Vec::new());
    match op {
        Op::Create(p) => none(t.create(p)),
        Op::Mkdir(p) => {
            let (d, n) = t.parent(p)?;
            t.fs.mkdir(d, n.as_bytes(), 0o755, common::ME).map_err(e)?;
            Ok(Vec::new())
        }
        Op::Write(p, off, len, seed) => {
            let data = bytes(*seed, *len);
            none(match writes {
                Writes::Copied => t.write_file(p, *off as u64, &data),
                Writes::InPlace => t.write_file_in_place(p, *off as u64, &data),
            })
        }
        Op::Truncate(p, size) => {
            let ino = t.resolve(p)?;
            let set = rmemfs::fs::SetAttr {
                size: Some(*size as u64),
                ..Default::default()
            };
            t.fs.setattr(ino, &set, ME).map_err(e)?;
            Ok(Vec::new())
        }
        Op::Read(p) => t.read_file(p),
        Op::TmpfileLink(dir, name, len, seed) => {
            let d = t.resolve(dir)?;
            let (a, fh) = t.fs.tmpfile(d, 0o644, libc::O_RDWR, ME).map_err(e)?;
            let linked =
                t.fs.write(a.ino, fh, 0, &bytes(*seed, *len), ME)
                    .and_then(|_| t.fs.link(a.ino, d, name.as_bytes()));
            t.fs.release(fh);
            t.fs.forget(a.ino, 1);
            linked.map_err(e)?;
            Ok(Vec::new())
        }
        Op::Fallocate(p, how, off, len) => {
            let ino = t.resolve(p)?;
            let fh = t.fs.open(ino, libc::O_WRONLY).map_err(e)?;
            let r =
                t.fs.fallocate(ino, fh, *off as u64, *len as u64, how.mode(), common::ME);
            t.fs.release(fh);
            r.map_err(e)?;
            Ok(Vec::new())
        }
        Op::Unlink(p) => {
            let (d, n) = t.parent(p)?;
            none(t.fs.unlink(d, n.as_bytes()).map_err(e))
        }
        Op::Rmdir(p) => {
            let (d, n) = t.parent(p)?;
            none(t.fs.rmdir(d, n.as_bytes()).map_err(e))
        }
        Op::Link(a, b) => {
            let ino = t.resolve(a)?;
            let (d, n) = t.parent(b)?;
            t.fs.link(ino, d, n.as_bytes()).map_err(e)?;
            Ok(Vec::new())
        }
        Op::Rename(a, b) => {
            let (sd, sn) = t.parent(a)?;
            let (dd, dn) = t.parent(b)?;
            none(
                t.fs.rename(sd, sn.as_bytes(), dd, dn.as_bytes(), 0, ME)
                    .map_err(e),
            )
        }
        Op::List(p) => t.list(p).map(|v| v.join("\n").into_bytes()),
        Op::ListPlus(p) => {
            let dir = t.resolve(p)?;
            let fh = t.fs.opendir(dir).map_err(e)?;
            let mut got = Vec::new();
            let read = t.fs.readdirplus(dir, fh, 0, &mut |entry, attr| {
                got.push((String::from_utf8(entry.name).unwrap(), attr.clone()));
                true
            });
            t.fs.releasedir(fh);
            read.map_err(e)?;
            got.retain(|(n, _)| n != "." && n != "..");
            // The kernel forgets what it was given, in time: one reference each.
            for (_, a) in &got {
                t.fs.forget(a.ino, 1);
            }
            got.sort_by(|a, b| a.0.cmp(&b.0));
            let lines: Vec<String> = got
                .iter()
                .map(|(n, a)| match a.kind {
                    rmemfs::meta::Kind::Dir => n.clone(),
                    _ => format!("{n} {} {}", a.size, a.nlink),
                })
                .collect();
            Ok(lines.join("\n").into_bytes())
        }
    }
}

fn apply_model(m: &mut Model, op: &Op) -> Result<Vec<u8>, i32> {
    let none = |r: Result<(), i32>| r.map(|()| Vec::new());
    match op {
        Op::Create(p) => none(m.create(p)),
        Op::Mkdir(p) => none(m.mkdir(p)),
        Op::Write(p, off, len, seed) => none(m.write(p, *off, &bytes(*seed, *len))),
        Op::Truncate(p, size) => none(m.truncate(p, *size)),
        Op::Read(p) => m.read(p),
        Op::Fallocate(p, how, off, len) => none(m.fallocate(p, *how, *off, *len)),
        Op::TmpfileLink(dir, name, len, seed) => {
            let path = if dir.is_empty() {
                name.clone()
            } else {
                format!("{dir}/{name}")
            };
            // As a create plus a write, except that a taken name fails after the write
            // (the data goes with the unnamed file) and a missing directory first.
            m.resolve(dir)?;
            if !m.is_dir(m.resolve(dir)?) {
                return Err(libc::ENOTDIR);
            }
            none(
                m.create(&path)
                    .and_then(|()| m.write(&path, 0, &bytes(*seed, *len))),
            )
        }
        Op::Unlink(p) => none(m.unlink(p)),
        Op::Rmdir(p) => none(m.rmdir(p)),
        Op::Link(a, b) => none(m.link(a, b)),
        Op::Rename(a, b) => none(m.rename(a, b)),
        Op::List(p) => m.list(p).map(|v| v.join("\n").into_bytes()),
        Op::ListPlus(p) => {
            let dir = m.resolve(p)?;
            let lines: Vec<String> = m
                .entries(dir)?
                .iter()
                .map(|(name, &n)| match &m.nodes[&n] {
                    Node::Dir { .. } => name.clone(),
                    Node::File(d) => format!("{name} {} {}", d.len(), m.links(n)),
                })
                .collect();
            Ok(lines.join("\n").into_bytes())
        }
    }
}

/// Every path in the model, for the final comparison.
fn walk(m: &Model, dir: u64, prefix: &str, out: &mut Vec<(String, bool)>) {
    for (name, &n) in m.entries(dir).unwrap() {
        let p = format!("{prefix}{name}");
        out.push((p.clone(), m.is_dir(n)));
        if m.is_dir(n) {
            walk(m, n, &format!("{p}/"), out);
        }
    }
}

/// Every directory lists and every file reads as the model says.
fn matches_at_the_end(t: &TestFs, m: &Model) -> Result<(), TestCaseError> {
    let mut all = Vec::new();
    walk(m, ROOT, "", &mut all);
    for (p, is_dir) in all {
        if is_dir {
            prop_assert_eq!(t.list(&p), m.list(&p), "listing {}", p);
        } else {
            prop_assert!(t.read_file(&p) == m.read(&p), "final contents of {}", p);
        }
    }
    prop_assert_eq!(t.list(""), m.list(""));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn fs_matches_the_model(ops in proptest::collection::vec(op(), 1..60), frrwp in any::<bool>(),
                            in_place in any::<bool>(), behind in any::<bool>()) {
        // Two servers, 8 KiB chunks: files cross chunks and servers. Both write paths, and
        // writes copied or registered in place (the FUSE adapter's zero-copy path), answered
        // once remote or before (write-behind: the next operation on the file sends them).
        let path = if frrwp { WritePath::Frrwp } else { WritePath::Serial };
        let writes = if in_place { Writes::InPlace } else { Writes::Copied };
        let t = make_fs(path, behind);
        let mut m = Model::new();
        let mut ok = 0;
        for (i, op) in ops.iter().enumerate() {
            let got = apply_fs(&t, op, writes);
            ok += got.is_ok() as usize;
            let want = apply_model(&mut m, op);
            prop_assert_eq!(
                got.as_ref().map(|v| v.len()),
                want.as_ref().map(|v| v.len()),
                "step {} {:?}", i, op
            );
            prop_assert!(got == want, "step {} {:?}: contents differ", i, op);
        }
        if std::env::var_os("FS_MODEL_STATS").is_some() {
            eprintln!("{ok}/{} ops succeeded", ops.len());
        }
        matches_at_the_end(&t, &m)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The same on a volume: every operation goes through the journal; then, after an fsync,
    /// the daemon dies and the volume is attached again: the replayed file system still
    /// matches the model (contents, listings), and its namespace is the one it had.
    #[test]
    fn a_volume_matches_the_model_after_a_crash(ops in proptest::collection::vec(op(), 1..60)) {
        let mut t = TestFs::volume(2, 16 << 20, 8192, WritePath::Frrwp, "model");
        let mut m = Model::new();
        for (i, op) in ops.iter().enumerate() {
            let got = apply_fs(&t, op, Writes::Copied);
            let want = apply_model(&mut m, op);
            prop_assert!(got == want, "step {} {:?}", i, op);
        }
        t.fs.sync().expect("a volume has a barrier").unwrap();
        let before = t.fs.namespace_digest();
        t.crash_and_reattach();
        prop_assert!(t.fs.namespace_digest() == before, "the replayed namespace differs");
        matches_at_the_end(&t, &m)?;
    }
}

/// What one thread of the concurrent test does: its own op sequence, under its own directory,
/// checked step by step against its own model, plus writes into its own part of a file both
/// threads share.
/// Two servers of 16 MiB, 8 KiB chunks: files cross chunks and servers.
fn make_fs(path: WritePath, behind: bool) -> TestFs {
    if behind {
        TestFs::writing_behind(2, 16 << 20, 8192, path, (1, 1))
    } else {
        TestFs::with_write_path(2, 16 << 20, 8192, path)
    }
}

fn run_thread(
    t: &TestFs,
    dir: &str,
    ops: &[Op],
    shared_writes: &[(usize, usize, u64)],
    writes: Writes,
    start: &std::sync::Barrier,
) -> Result<(Model, Vec<u8>), String> {
    let mut m = Model::new();
    let mut region = vec![0u8; SHARED_REGION];
    start.wait();
    for i in 0..ops.len().max(shared_writes.len()) {
        if let Some(op) = ops.get(i) {
            let got = apply_fs(t, &under(dir, op), writes);
            let want = apply_model(&mut m, op);
            if got != want {
                return Err(format!(
                    "{dir} step {i} {op:?}: got {:?}, model {:?}",
                    got.as_ref().map(|v| v.len()),
                    want.as_ref().map(|v| v.len())
                ));
            }
        }
        if let Some(&(off, len, seed)) = shared_writes.get(i) {
            let base = if dir == "t0" { 0 } else { SHARED_REGION };
            let data = bytes(seed, len);
            let put = match writes {
                Writes::Copied => t.write_file("shared", (base + off) as u64, &data),
                Writes::InPlace => t.write_file_in_place("shared", (base + off) as u64, &data),
            };
            put.map_err(|e| format!("{dir}: shared write failed: errno {e}"))?;
            region[off..off + len].copy_from_slice(&data);
        }
    }
    Ok((m, region))
}

/// Each thread's part of the shared file (chunks are 8 KiB: the parts share chunks at the
/// border and both allocate chunks of the same file at once).
const SHARED_REGION: usize = 20_000;

fn shared_write() -> impl Strategy<Value = (usize, usize, u64)> {
    (0usize..SHARED_REGION, 1usize..6000, any::<u64>())
        .prop_map(|(off, len, seed)| (off.min(SHARED_REGION - len), len, seed))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Two threads use one file system at once: each its own tree (so its results are
    /// deterministic and checked against its own model at every step) and its own part of
    /// one shared file. Afterwards each tree matches its model and the shared file holds
    /// both threads' bytes.
    #[test]
    fn fs_matches_the_model_from_two_threads(
        ops in proptest::collection::vec((op(), op()), 1..40),
        shared in proptest::collection::vec((shared_write(), shared_write()), 0..20),
        frrwp in any::<bool>(),
        in_place in any::<bool>(),
        behind in any::<bool>(),
    ) {
        let path = if frrwp { WritePath::Frrwp } else { WritePath::Serial };
        let writes = if in_place { Writes::InPlace } else { Writes::Copied };
        let t = make_fs(path, behind);
        for d in ["t0", "t1"] {
            t.fs.mkdir(ROOT, d.as_bytes(), 0o755, common::ME).unwrap();
        }
        t.create("shared").unwrap();
        let start = std::sync::Barrier::new(2);
        let (ops0, ops1): (Vec<Op>, Vec<Op>) = ops.into_iter().unzip();
        let (sh0, sh1): (Vec<_>, Vec<_>) = shared.into_iter().unzip();
        let done = std::sync::atomic::AtomicBool::new(false);
        let (r0, r1) = std::thread::scope(|s| {
            // With write-behind, its worker sends waiting writes while both threads run.
            if behind {
                s.spawn(|| {
                    while !done.load(std::sync::atomic::Ordering::Relaxed) {
                        t.fs.data().flush_queued(Duration::from_millis(1));
                    }
                });
            }
            let a = s.spawn(|| run_thread(&t, "t0", &ops0, &sh0, writes, &start));
            let b = s.spawn(|| run_thread(&t, "t1", &ops1, &sh1, writes, &start));
            let r = (a.join().unwrap(), b.join().unwrap());
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            r
        });
        let (m0, region0) = r0.map_err(TestCaseError::fail)?;
        let (m1, region1) = r1.map_err(TestCaseError::fail)?;
        for (dir, m) in [("t0", &m0), ("t1", &m1)] {
            let mut all = Vec::new();
            walk(m, ROOT, "", &mut all);
            for (p, is_dir) in all {
                let full = format!("{dir}/{p}");
                if is_dir {
                    prop_assert_eq!(t.list(&full), m.list(&p), "listing {}", full);
                } else {
                    prop_assert!(t.read_file(&full) == m.read(&p), "final contents of {}", full);
                }
            }
            prop_assert_eq!(t.list(dir), m.list(""));
        }
        let got = t.read_file("shared").unwrap();
        let mut want = region0;
        want.extend_from_slice(&region1);
        // The file ends at the last byte written; unwritten parts read as zeros.
        let wrote0 = sh0.iter().map(|(o, l, _)| o + l).max();
        let wrote1 = sh1.iter().map(|(o, l, _)| SHARED_REGION + o + l).max();
        let end = wrote1.or(wrote0).unwrap_or(0);
        want.truncate(end);
        prop_assert!(got == want, "shared file: {} bytes, expected {}", got.len(), want.len());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Three servers, two copies of every chunk, and one server killed at a random step (or
    /// never): the file system still agrees with the model at every step, so no operation
    /// sees EIO or loses a byte while one copy of each chunk lives. Writes after the kill
    /// place the missing copies on the third server.
    #[test]
    fn replicated_fs_survives_a_dead_server(
        ops in proptest::collection::vec(op(), 1..60),
        frrwp in any::<bool>(),
        kill_at in 0usize..70,
        victim in 0usize..3,
    ) {
        let path = if frrwp { WritePath::Frrwp } else { WritePath::Serial };
        let mut t = TestFs::replicated(3, 16 << 20, 8192, path, 2);
        let mut m = Model::new();
        for (i, op) in ops.iter().enumerate() {
            if i == kill_at {
                t.kill_server(victim);
            }
            let got = apply_fs(&t, op, Writes::Copied);
            let want = apply_model(&mut m, op);
            prop_assert_eq!(
                got.as_ref().map(|v| v.len()),
                want.as_ref().map(|v| v.len()),
                "step {} {:?} (server {} killed at step {})", i, op, victim, kill_at
            );
            prop_assert!(got == want, "step {} {:?}: contents differ", i, op);
        }
        let mut all = Vec::new();
        walk(&m, ROOT, "", &mut all);
        for (p, is_dir) in all {
            if !is_dir {
                prop_assert!(t.read_file(&p) == m.read(&p), "final contents of {}", p);
            }
        }
        let h = t.fs.replica_health();
        prop_assert_eq!(h.lost, 0, "{:?}", h);
    }
}
