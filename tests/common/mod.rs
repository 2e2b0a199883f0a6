//! Builds a file system over in-process memory servers and the in-process fabric.
#![allow(dead_code)]

pub mod rack;
pub mod redis;

use rmemfs::client::{Pool, PoolConfig};
use rmemfs::data::{DataStore, WritePath};
use rmemfs::fabric::local::{LocalFabric, LocalNetwork};
use rmemfs::fs::{Caller, Fs, FsConfig};
use rmemfs::meta::{Ino, ROOT_INO};
use rmemfs::regcache::{CacheConfig, Policy};
use rmemfs::server::{MemoryServer, ServerConfig};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub struct TestFs {
    /// Shared, so the upkeep threads (`rebuild::Rebuilder`) can run over it too.
    pub fs: Arc<Fs>,
    pub servers: Vec<MemoryServer>,
    pub nodes: Vec<Arc<LocalFabric>>,
    pub net: Arc<LocalNetwork>,
    /// Each server's arena size and lease.
    pub server_config: ServerConfig,
    /// The relays the pool reaches each server's control port through (none unless built
    /// by [`TestFs::behind_relays`]).
    pub relays: Vec<Relay>,
    /// The volume this file system is (none: a private namespace): its name, and how the
    /// data store was made, to attach it again ([`TestFs::crash_and_reattach`]).
    pub volume: Option<(String, u64, WritePath)>,
    /// The volume's running journal (none without a volume).
    pub journal: Option<Arc<rmemfs::volume::VolumeJournal>>,
    /// Each server's backing file (`serve --backing`), when the servers are backed.
    pub backing: Vec<Option<std::path::PathBuf>>,
    /// Where those files are; removed with the last holder.
    pub backing_dir: Option<Arc<TempDir>>,
    /// The servers' fabric nodes issue their own keys, as a verbs device does (a backed
    /// server's restart gives its extents new keys).
    pub device_keys: bool,
    /// The erasure code a volume attached here encodes cold chunks with.
    pub coding: Option<rmemfs::meta::Coding>,
}

/// A directory removed when dropped: on tmpfs (`/dev/shm`) where there is one.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(what: &str) -> TempDir {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = match std::path::Path::new("/dev/shm").is_dir() {
            true => std::path::PathBuf::from("/dev/shm"),
            false => std::env::temp_dir(),
        };
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let dir = base.join(format!("rmemfs-{what}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A TCP relay in front of a memory server's control port that can be frozen: frozen, it
/// keeps every connection open but passes nothing on from the server, which is how a server
/// stopped by SIGSTOP (or a one-way cut link) looks to its clients. While the mount is idle
/// only its heartbeats notice such a server. The data path (the in-process fabric) does not
/// pass through it.
pub struct Relay {
    pub addr: SocketAddr,
    /// Held while frozen; the server-to-client copy takes it for every write.
    gate: Arc<Mutex<()>>,
}

impl Relay {
    pub fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let gate = Arc::new(Mutex::new(()));
        let g = gate.clone();
        // Lives as long as the test process (blocked in accept).
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                pipe(
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    None,
                );
                pipe(server, client, Some(g.clone()));
            }
        });
        Relay { addr, gate }
    }

    /// Frozen while the guard lives.
    pub fn freeze(&self) -> MutexGuard<'_, ()> {
        self.gate.lock().unwrap()
    }
}

/// Copies `from` to `to` on a thread of its own, each write under `gate` if there is one.
fn pipe(mut from: TcpStream, mut to: TcpStream, gate: Option<Arc<Mutex<()>>>) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            let _open = gate.as_ref().map(|g| g.lock().unwrap());
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

pub const ME: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 0,
    umask: 0,
    cap_fsetid: true,
};

impl TestFs {
    /// `servers` memory servers of `size` bytes each; files cut into `chunk`-byte chunks.
    pub fn new(servers: usize, size: u64, chunk: u64) -> TestFs {
        Self::with_write_path(servers, size, chunk, WritePath::Frrwp)
    }

    pub fn with_write_path(servers: usize, size: u64, chunk: u64, path: WritePath) -> TestFs {
        Self::replicated(servers, size, chunk, path, 1)
    }

    /// As [`TestFs::with_write_path`], keeping `replicas` copies of every chunk.
    pub fn replicated(
        servers: usize,
        size: u64,
        chunk: u64,
        path: WritePath,
        replicas: usize,
    ) -> TestFs {
        Self::with_lease(servers, size, chunk, path, replicas, rmemfs::config::LEASE)
    }

    /// As [`TestFs::replicated`], with servers that keep a dropped session for `lease`.
    pub fn with_lease(
        servers: usize,
        size: u64,
        chunk: u64,
        path: WritePath,
        replicas: usize,
        lease: Duration,
    ) -> TestFs {
        let config = FsConfig {
            dir_atime: true,
            acl: true,
            ..FsConfig::default()
        };
        Self::build(
            servers,
            size,
            chunk,
            path,
            (replicas, 1),
            lease,
            config,
            false,
        )
    }

    /// As [`TestFs::replicated`], refusing writes that would land on fewer than
    /// `min_replicas` copies (`--min-replicas`).
    pub fn min_replicas(
        servers: usize,
        size: u64,
        path: WritePath,
        replicas: usize,
        min_replicas: usize,
    ) -> TestFs {
        let config = FsConfig {
            acl: true,
            ..FsConfig::default()
        };
        let lease = rmemfs::config::LEASE;
        let copies = (replicas, min_replicas);
        Self::build(servers, size, 1 << 20, path, copies, lease, config, false)
    }

    /// As [`TestFs::replicated`] (16 MiB servers, 1 MiB chunks), each server's control port
    /// reached through a [`Relay`] (in `relays`), so a test can freeze it.
    pub fn behind_relays(servers: usize, replicas: usize) -> TestFs {
        let (lease, config) = (rmemfs::config::LEASE, FsConfig::default());
        let (path, copies) = (WritePath::Frrwp, (replicas, 1));
        Self::build(
            servers,
            16 << 20,
            1 << 20,
            path,
            copies,
            lease,
            config,
            true,
        )
    }

    /// One 8 MiB server, 1 MiB chunks, and the file system set up by `config`.
    pub fn with_config(config: FsConfig) -> TestFs {
        let lease = rmemfs::config::LEASE;
        let copies = (1, 1);
        Self::build(
            1,
            8 << 20,
            1 << 20,
            WritePath::Frrwp,
            copies,
            lease,
            config,
            false,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        servers: usize,
        size: u64,
        chunk: u64,
        path: WritePath,
        copies: (usize, usize),
        lease: Duration,
        config: FsConfig,
        relayed: bool,
    ) -> TestFs {
        Self::build_full(
            servers, size, chunk, path, copies, lease, config, relayed, false, Ok,
        )
    }

    /// `servers` backed memory servers (`serve --backing`, files in a fresh directory) of
    /// `size` bytes, keeping `replicas` copies of `chunk`-byte chunks.
    pub fn backed(servers: usize, size: u64, chunk: u64, replicas: usize) -> TestFs {
        Self::build_full(
            servers,
            size,
            chunk,
            WritePath::Frrwp,
            (replicas, 1),
            rmemfs::config::LEASE,
            FsConfig::default(),
            false,
            true,
            Ok,
        )
    }

    /// As [`TestFs::backed`], on fabric nodes that issue their own keys (as verbs does).
    pub fn backed_device_keys(servers: usize, size: u64, chunk: u64, replicas: usize) -> TestFs {
        let mut t = Self::backed(servers, size, chunk, replicas);
        t.device_keys = true;
        t
    }

    /// As [`TestFs::volume`] over backed servers.
    pub fn backed_volume(servers: usize, size: u64, chunk: u64, name: &str) -> TestFs {
        let mut t = Self::build_full(
            servers,
            size,
            chunk,
            WritePath::Frrwp,
            (1, 1),
            rmemfs::config::LEASE,
            FsConfig::default(),
            false,
            true,
            Ok,
        );
        t.volume = Some((name.to_string(), chunk, WritePath::Frrwp));
        let attached = t.attach_volume(true).unwrap();
        t.fs = attached.fs;
        t.journal = Some(attached.journal);
        t
    }

    /// `servers` memory servers of `size` bytes, 1 MiB chunks, keeping `coding.m + 1` copies
    /// of chunks being written and encoding cold ones with `coding` (`--redundancy ec:K+M`).
    pub fn encoded(servers: usize, size: u64, coding: rmemfs::meta::Coding) -> TestFs {
        Self::encoding(servers, size, coding.m as usize + 1, Some(coding))
    }

    /// `servers` memory servers of `size` bytes, 1 MiB chunks and `replicas` copies, no
    /// `--redundancy`; files given a code of their own are encoded once their writes end.
    pub fn copies_encoding_on_request(servers: usize, size: u64, replicas: usize) -> TestFs {
        Self::encoding(servers, size, replicas, None)
    }

    /// `replicas` copies, the mount's code `coding`, files cold as soon as written.
    fn encoding(
        servers: usize,
        size: u64,
        replicas: usize,
        coding: Option<rmemfs::meta::Coding>,
    ) -> TestFs {
        let (lease, config) = (rmemfs::config::LEASE, FsConfig::default());
        Self::build_full(
            servers,
            size,
            1 << 20,
            WritePath::Frrwp,
            (replicas, 1),
            lease,
            config,
            false,
            false,
            move |d| {
                let d = d.cold_after(Duration::ZERO);
                Ok(match coding {
                    Some(c) => d.encoded(c),
                    None => d,
                })
            },
        )
    }

    /// As [`TestFs::min_replicas`] with `chunk`-byte chunks, and small writes answered
    /// before they are remote, as on a private mount (`data::behind`). Nothing sends them in
    /// the background unless the test runs [`DataStore::flush_queued`].
    pub fn writing_behind(
        servers: usize,
        size: u64,
        chunk: u64,
        path: WritePath,
        copies: (usize, usize),
    ) -> TestFs {
        let config = FsConfig {
            dir_atime: true,
            acl: true,
            ..FsConfig::default()
        };
        let lease = rmemfs::config::LEASE;
        Self::build_full(
            servers,
            size,
            chunk,
            path,
            copies,
            lease,
            config,
            false,
            false,
            DataStore::write_behind,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn build_full(
        servers: usize,
        size: u64,
        chunk: u64,
        path: WritePath,
        (replicas, min_replicas): (usize, usize),
        lease: Duration,
        config: FsConfig,
        relayed: bool,
        backed: bool,
        finish: impl FnOnce(DataStore) -> rmemfs::error::Result<DataStore>,
    ) -> TestFs {
        let net = LocalNetwork::new();
        let mut srv = Vec::new();
        let mut nodes = Vec::new();
        let server_config = ServerConfig {
            lease,
            ..ServerConfig::new("127.0.0.1:0".parse().unwrap(), size)
        };
        let backing_dir = backed.then(|| Arc::new(TempDir::new("backing")));
        let backing: Vec<_> = (0..servers)
            .map(|i| backing_dir.as_ref().map(|d| d.0.join(format!("server{i}"))))
            .collect();
        for file in &backing {
            let node = net.node();
            let config = ServerConfig {
                backing: file.clone(),
                ..server_config.clone()
            };
            srv.push(MemoryServer::start(&config, node.clone()).unwrap());
            nodes.push(node);
        }
        let relays: Vec<Relay> = srv
            .iter()
            .filter(|_| relayed)
            .map(|s| Relay::start(s.local_addr()))
            .collect();
        let addrs: Vec<_> = match relayed {
            true => relays.iter().map(|r| r.addr).collect(),
            false => srv.iter().map(|s| s.local_addr()).collect(),
        };
        let pool = Pool::connect(
            net.node(),
            &addrs,
            &PoolConfig {
                timeout: Duration::from_secs(5),
                ..PoolConfig::default()
            },
        )
        .unwrap();
        let data = DataStore::new(
            Arc::new(pool),
            chunk,
            4,
            Policy::Mrrc,
            CacheConfig::default(),
            path,
        )
        .and_then(|d| d.replicated(replicas, min_replicas))
        .and_then(finish)
        .unwrap();
        let fs = Arc::new(Fs::new(data, config));
        TestFs {
            fs,
            servers: srv,
            nodes,
            net,
            server_config,
            relays,
            volume: None,
            journal: None,
            backing,
            backing_dir,
            device_keys: false,
            coding: None,
        }
    }

    /// `servers` memory servers of `size` bytes each and a new volume `name` on them (two
    /// copies with two servers or more); files cut into `chunk`-byte chunks.
    pub fn volume(servers: usize, size: u64, chunk: u64, path: WritePath, name: &str) -> TestFs {
        let mut t = Self::build(
            servers,
            size,
            chunk,
            path,
            (1, 1),
            rmemfs::config::LEASE,
            FsConfig::default(),
            false,
        );
        t.volume = Some((name.to_string(), chunk, path));
        let attached = t.attach_volume(true).unwrap();
        t.fs = attached.fs;
        t.journal = Some(attached.journal);
        t
    }

    /// As [`TestFs::volume`] (1 MiB chunks), the volume's cold chunks encoded with `coding`.
    pub fn encoded_volume(
        servers: usize,
        size: u64,
        coding: rmemfs::meta::Coding,
        name: &str,
    ) -> TestFs {
        let (lease, config) = (rmemfs::config::LEASE, FsConfig::default());
        let mut t = Self::build(
            servers,
            size,
            1 << 20,
            WritePath::Frrwp,
            (1, 1),
            lease,
            config,
            false,
        );
        t.coding = Some(coding);
        t.volume = Some((name.to_string(), 1 << 20, WritePath::Frrwp));
        let attached = t.attach_volume(true).unwrap();
        t.fs = attached.fs;
        t.journal = Some(attached.journal);
        t
    }

    fn attach_volume(&self, create: bool) -> Result<rmemfs::volume::Attached, String> {
        let (name, chunk, path) = self.volume.clone().expect("a volume");
        let addrs: Vec<_> = self.servers.iter().map(|s| s.local_addr()).collect();
        let pool = Pool::connect(
            self.net.node(),
            &addrs,
            &PoolConfig {
                timeout: Duration::from_secs(5),
                volume: Some(rmemfs::client::volume::VolumeSpec {
                    name,
                    holder: "test pid 1".into(),
                    create,
                    takeover: false,
                    role: Default::default(),
                }),
                ..PoolConfig::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let data = DataStore::new(
            Arc::new(pool),
            chunk,
            4,
            Policy::Mrrc,
            CacheConfig::default(),
            path,
        )
        .and_then(|d| match self.coding {
            Some(c) => Ok(d
                .replicated(c.m as usize + 1, 1)?
                .encoded(c)
                .cold_after(Duration::ZERO)),
            None => d.replicated(addrs.len().min(2), 1),
        })
        .map_err(|e| e.message)?;
        let config = FsConfig {
            dir_atime: true,
            acl: true,
            ..FsConfig::default()
        };
        rmemfs::volume::attach(data, config, &addrs, &[])
    }

    /// The volume's daemon dies (nothing more sent, nothing pending committed) and a new
    /// one attaches it.
    pub fn crash_and_reattach(&mut self) -> rmemfs::volume::AttachReport {
        self.fs.data().pool().crash();
        let attached = self.attach_volume(false).unwrap();
        self.fs = attached.fs;
        self.journal = Some(attached.journal);
        attached.report
    }

    /// Memory server `i` dies: its data path stops answering and its control connections
    /// close, as when its process is killed.
    pub fn kill_server(&mut self, i: usize) {
        self.nodes[i].kill();
        self.servers[i].shutdown();
    }

    /// Memory server `i` (killed before) starts again as a new process would: same address,
    /// an empty arena, or a backed server's file as it left it (the old server is gone
    /// first, so its mapping of the file is).
    pub fn restart_server(&mut self, i: usize) {
        let node = self.net.node();
        if self.device_keys {
            node.issue_own_keys();
        }
        let config = ServerConfig {
            listen: self.servers[i].local_addr(),
            backing: self.backing.get(i).cloned().flatten(),
            ..self.server_config.clone()
        };
        let stand_in = MemoryServer::start(
            &ServerConfig::new("127.0.0.1:0".parse().unwrap(), 1 << 20),
            self.net.node(),
        )
        .unwrap();
        drop(std::mem::replace(&mut self.servers[i], stand_in));
        self.servers[i] = MemoryServer::start(&config, node.clone()).unwrap();
        self.nodes[i] = node;
    }

    /// The addresses that hold a copy of each chunk of `path` (its placement xattr).
    pub fn placement_addrs(&self, path: &str) -> Vec<std::collections::BTreeSet<String>> {
        let ino = self.resolve(path).unwrap();
        let raw = self.fs.getxattr(ino, rmemfs::fs::PLACEMENT_XATTR).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|c| {
                c[1].as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap().to_string())
                    .collect()
            })
            .collect()
    }

    /// The volume's journal (none without a volume).
    pub fn journal(&self) -> Option<Arc<rmemfs::volume::VolumeJournal>> {
        self.journal.clone()
    }

    /// Starts one more memory server like the others (in no pool until a test adds it);
    /// returns its address.
    pub fn start_server(&mut self) -> std::net::SocketAddr {
        let node = self.net.node();
        let server = MemoryServer::start(&self.server_config, node.clone()).unwrap();
        let addr = server.local_addr();
        self.servers.push(server);
        self.backing.push(None);
        self.nodes.push(node);
        addr
    }

    /// Resolves a '/'-separated path from the root.
    pub fn resolve(&self, path: &str) -> Result<Ino, i32> {
        let mut ino = ROOT_INO;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            ino = self
                .fs
                .lookup(ino, part.as_bytes())
                .map_err(|e| e.errno)?
                .ino;
        }
        Ok(ino)
    }

    /// Parent inode and last component.
    pub fn parent<'p>(&self, path: &'p str) -> Result<(Ino, &'p str), i32> {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        Ok((self.resolve(dir)?, name))
    }

    pub fn write_file(&self, path: &str, offset: u64, data: &[u8]) -> Result<(), i32> {
        let ino = self.resolve(path)?;
        let fh = self.fs.open(ino, libc::O_WRONLY).map_err(|e| e.errno)?;
        let r = self
            .fs
            .write(ino, fh, offset, data, ME)
            .map_err(|e| e.errno);
        self.fs.release(fh);
        r.map(|_| ())
    }

    /// As `write_file`, through the in-place (zero-copy) path the FUSE adapter uses: the
    /// payload is registered where it lies, so it must live for good (it is leaked).
    pub fn write_file_in_place(&self, path: &str, offset: u64, data: &[u8]) -> Result<(), i32> {
        let ino = self.resolve(path)?;
        let fh = self.fs.open(ino, libc::O_WRONLY).map_err(|e| e.errno)?;
        let payload = rmemfs::data::RequestBuffer::leaked(data.to_vec());
        let r = self
            .fs
            .write_in_place(ino, fh, offset, payload, ME)
            .map_err(|e| e.errno);
        self.fs.release(fh);
        r.map(|_| ())
    }

    pub fn read_file(&self, path: &str) -> Result<Vec<u8>, i32> {
        let ino = self.resolve(path)?;
        let fh = self.fs.open(ino, libc::O_RDONLY).map_err(|e| e.errno)?;
        let mut out = Vec::new();
        let r = loop {
            match self.fs.read(ino, fh, out.len() as u64, 1 << 20) {
                Ok(d) if d.is_empty() => break Ok(out),
                Ok(d) => out.extend_from_slice(&d),
                Err(e) => break Err(e.errno),
            }
        };
        self.fs.release(fh);
        r
    }

    pub fn create(&self, path: &str) -> Result<(), i32> {
        let (p, name) = self.parent(path)?;
        let (_, fh) = self
            .fs
            .create(p, name.as_bytes(), 0o644, libc::O_WRONLY | libc::O_EXCL, ME)
            .map_err(|e| e.errno)?;
        self.fs.release(fh);
        Ok(())
    }

    /// Remote memory the files hold: what the servers say is used, less the extents the
    /// pool holds in stock for new files (answered before the servers' status, which comes
    /// after them on each connection).
    pub fn remote_used(&self) -> u64 {
        let pool = self.fs.data().pool();
        pool.refresh()
            .iter()
            .map(|s| s.capacity.total - s.capacity.free - pool.stocked_bytes(s.id))
            .sum()
    }

    pub fn list(&self, path: &str) -> Result<Vec<String>, i32> {
        let ino = self.resolve(path)?;
        let mut names = Vec::new();
        let fh = self.fs.opendir(ino).map_err(|e| e.errno)?;
        let read = self.fs.readdir(ino, fh, 0, &mut |e| {
            names.push(String::from_utf8(e.name).unwrap());
            true
        });
        self.fs.releasedir(fh);
        read.map_err(|e| e.errno)?;
        names.retain(|n| n != "." && n != "..");
        names.sort();
        Ok(names)
    }
}

/// Deterministic bytes for a seed.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Waits until `done` holds, or fails naming `what` after a generous deadline.
pub fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A control connection to the server at `addr` (no secret).
pub fn control(addr: SocketAddr) -> rmemfs::client::control::ControlConn {
    rmemfs::client::control::ControlConn::connect(
        addr,
        "test",
        Duration::from_secs(5),
        &rmemfs::auth::Secret::none(),
    )
    .unwrap()
}

/// Claims volume `name` on `c` as `who`, in `mode`; the server's answer.
pub fn claim(
    c: &rmemfs::client::control::ControlConn,
    name: &str,
    who: &str,
    mode: rmemfs::proto::ClaimMode,
) -> rmemfs::proto::Message {
    c.request(|tag| rmemfs::proto::Message::VolumeClaim {
        tag,
        name: name.into(),
        holder: who.into(),
        mode,
        takeover: false,
        min_epoch: 0,
    })
    .unwrap()
}
