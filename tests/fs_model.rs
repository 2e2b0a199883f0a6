//! Reference-model test of the file system core: random operation sequences are applied to
//! the real `Fs` (over in-process memory servers and fabric, with small chunks so files span
//! several chunks and servers) and to a plain in-memory model; results (data or errno) must
//! agree after every step, and the whole tree must agree at the end.

mod common;

use common::{bytes, TestFs};
use proptest::prelude::*;
use rmemfs::data::WritePath;
use std::collections::{BTreeMap, HashMap};

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

#[derive(Debug, Clone)]
enum Op {
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
    ]
}

/// Applies one op to the real file system.
fn apply_fs(t: &TestFs, op: &Op) -> Result<Vec<u8>, i32> {
    let e = |e: rmemfs::error::Error| e.errno;
    let none = |r: Result<(), i32>| r.map(|()| Vec::new());
    match op {
        Op::Create(p) => none(t.create(p)),
        Op::Mkdir(p) => {
            let (d, n) = t.parent(p)?;
            t.fs.mkdir(d, n.as_bytes(), 0o755, common::ME).map_err(e)?;
            Ok(Vec::new())
        }
        Op::Write(p, off, len, seed) => none(t.write_file(p, *off as u64, &bytes(*seed, *len))),
        Op::Truncate(p, size) => {
            let ino = t.resolve(p)?;
            let set = rmemfs::fs::SetAttr {
                size: Some(*size as u64),
                ..Default::default()
            };
            t.fs.setattr(ino, &set).map_err(e)?;
            Ok(Vec::new())
        }
        Op::Read(p) => t.read_file(p),
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
                t.fs.rename(sd, sn.as_bytes(), dd, dn.as_bytes(), 0)
                    .map_err(e),
            )
        }
        Op::List(p) => t.list(p).map(|v| v.join("\n").into_bytes()),
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
        Op::Unlink(p) => none(m.unlink(p)),
        Op::Rmdir(p) => none(m.rmdir(p)),
        Op::Link(a, b) => none(m.link(a, b)),
        Op::Rename(a, b) => none(m.rename(a, b)),
        Op::List(p) => m.list(p).map(|v| v.join("\n").into_bytes()),
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn fs_matches_the_model(ops in proptest::collection::vec(op(), 1..60), frrwp in any::<bool>()) {
        // Two servers, 8 KiB chunks: files cross chunks and servers. Both write paths.
        let path = if frrwp { WritePath::Frrwp } else { WritePath::Serial };
        let t = TestFs::with_write_path(2, 16 << 20, 8192, path);
        let mut m = Model::new();
        let mut ok = 0;
        for (i, op) in ops.iter().enumerate() {
            let got = apply_fs(&t, op);
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
        let mut all = Vec::new();
        walk(&m, ROOT, "", &mut all);
        for (p, is_dir) in all {
            if is_dir {
                prop_assert_eq!(t.list(&p), m.list(&p), "listing {}", p);
            } else {
                prop_assert!(t.read_file(&p) == m.read(&p), "final contents of {}", p);
            }
        }
        prop_assert_eq!(t.list(""), m.list(""));
    }
}
