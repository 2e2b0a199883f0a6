//! In-process racks of memory servers that outlive the daemons attaching volumes to them
//! (the volume and follower tests), and a daemon's file operations by path.
#![allow(dead_code)]

use super::ME;
use rmemfs::client::volume::VolumeSpec;
use rmemfs::client::{Pool, PoolConfig};
use rmemfs::data::{DataStore, WritePath};
use rmemfs::fabric::local::{LocalFabric, LocalNetwork};
use rmemfs::fs::{Fs, FsConfig};
use rmemfs::meta::{Ino, ROOT_INO};
use rmemfs::regcache::{CacheConfig, Policy};
use rmemfs::server::{MemoryServer, ServerConfig};
use rmemfs::volume::{attach_with, Attached, JournalOptions};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub const SERVER_BYTES: u64 = 256 << 20;
pub const CHUNK: u64 = 1 << 20;

/// In-process memory servers that outlive the daemons attaching to them.
pub struct Rack {
    pub net: Arc<LocalNetwork>,
    pub servers: Vec<MemoryServer>,
    pub nodes: Vec<Arc<LocalFabric>>,
    pub config: ServerConfig,
}

impl Rack {
    pub fn new(n: usize) -> Rack {
        Rack::with_lease(n, rmemfs::config::LEASE)
    }

    /// Servers that replace a silent holder after `lease`.
    pub fn with_lease(n: usize, lease: Duration) -> Rack {
        let net = LocalNetwork::new();
        let config = ServerConfig {
            lease,
            ..ServerConfig::new("127.0.0.1:0".parse().unwrap(), SERVER_BYTES)
        };
        let mut servers = Vec::new();
        let mut nodes = Vec::new();
        for _ in 0..n {
            let node = net.node();
            servers.push(MemoryServer::start(&config, node.clone()).unwrap());
            nodes.push(node);
        }
        Rack {
            net,
            servers,
            nodes,
            config,
        }
    }

    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.servers.iter().map(|s| s.local_addr()).collect()
    }

    /// A data store over `addrs` whose pool claims `spec`'s volume.
    pub fn store(
        &self,
        addrs: &[SocketAddr],
        spec: VolumeSpec,
        replicas: usize,
    ) -> Result<DataStore, String> {
        self.store_waiting(addrs, spec, replicas, Duration::from_secs(5))
    }

    /// [`Rack::store`] whose requests wait `timeout` for a server (a mount's op timeout).
    pub fn store_waiting(
        &self,
        addrs: &[SocketAddr],
        spec: VolumeSpec,
        replicas: usize,
        timeout: Duration,
    ) -> Result<DataStore, String> {
        let pool = Pool::connect(
            self.net.node(),
            addrs,
            &PoolConfig {
                timeout,
                volume: Some(spec),
                ..PoolConfig::default()
            },
        )
        .map_err(|e| e.to_string())?;
        DataStore::new(
            Arc::new(pool),
            CHUNK,
            4,
            Policy::Mrrc,
            CacheConfig::default(),
            WritePath::Frrwp,
        )
        .and_then(|d| d.replicated(replicas, 1))
        .map_err(|e| e.message)
    }

    /// A daemon attaching volume `name` (`create`: making it), as `holder`.
    pub fn attach(&self, name: &str, create: bool, takeover: bool) -> Result<Daemon, String> {
        self.attach_ring(name, create, takeover, JournalOptions::default())
    }

    /// [`Rack::attach`] whose small writes are answered before they are sent (a mount's
    /// default; no worker runs: the next operation on the file or the journal's next group
    /// sends them).
    pub fn attach_behind(&self, name: &str, create: bool) -> Result<Daemon, String> {
        let spec = VolumeSpec {
            name: name.into(),
            holder: format!("test-host pid {}", rand_pid()),
            create,
            takeover: false,
            role: Default::default(),
        };
        let replicas = self.servers.len().min(2);
        let data = self
            .store(&self.addrs(), spec, replicas)?
            .write_behind()
            .map_err(|e| e.message)?;
        let addrs = self.addrs();
        attach_with(
            data,
            FsConfig::default(),
            &addrs,
            &[],
            JournalOptions::default(),
        )
        .map(Daemon)
    }

    /// [`Rack::attach`] with journal ring copies of `ring` bytes.
    pub fn attach_ring(
        &self,
        name: &str,
        create: bool,
        takeover: bool,
        ring: JournalOptions,
    ) -> Result<Daemon, String> {
        let spec = VolumeSpec {
            name: name.into(),
            holder: format!("test-host pid {}", rand_pid()),
            create,
            takeover,
            role: Default::default(),
        };
        let replicas = self.servers.len().min(2);
        let data = self.store(&self.addrs(), spec, replicas)?;
        let config = FsConfig {
            acl: true,
            ..FsConfig::default()
        };
        attach_with(data, config, &self.addrs(), &[], ring).map(Daemon)
    }

    /// A daemon attaching `name` over the servers but `gone` (with `--force-without` them
    /// when `force`).
    pub fn attach_without(
        &self,
        name: &str,
        gone: &[usize],
        force: bool,
    ) -> Result<Daemon, String> {
        let addrs: Vec<SocketAddr> = (0..self.servers.len())
            .filter(|i| !gone.contains(i))
            .map(|i| self.servers[i].local_addr())
            .collect();
        let without: Vec<SocketAddr> = match force {
            true => gone.iter().map(|&i| self.servers[i].local_addr()).collect(),
            false => Vec::new(),
        };
        let spec = VolumeSpec {
            name: name.into(),
            holder: format!("test-host pid {}", rand_pid()),
            create: false,
            takeover: false,
            role: Default::default(),
        };
        let data = self.store(&addrs, spec, 2)?;
        attach_with(
            data,
            FsConfig::default(),
            &addrs,
            &without,
            JournalOptions::default(),
        )
        .map(Daemon)
    }

    /// A daemon making volume `name` from the export in `dir`.
    pub fn import(
        &self,
        name: &str,
        dir: &dyn rmemfs::volume::store::ExportStore,
    ) -> Result<Daemon, String> {
        let spec = VolumeSpec {
            name: name.into(),
            holder: format!("test-host pid {}", rand_pid()),
            create: true,
            takeover: false,
            role: Default::default(),
        };
        let data = self.store(&self.addrs(), spec, self.servers.len().min(2))?;
        rmemfs::volume::attach_then(
            data,
            FsConfig::default(),
            &self.addrs(),
            &[],
            JournalOptions::default(),
            |fs, _| rmemfs::volume::transfer::import(fs, dir).map(|_| ()),
        )
        .map(Daemon)
    }

    /// Free bytes on every server.
    pub fn free(&self) -> Vec<u64> {
        self.servers.iter().map(|s| s.capacity().free).collect()
    }

    /// Stops server `i` for good (its memory gone with it).
    pub fn stop(&mut self, i: usize) {
        self.nodes[i].kill();
        self.servers[i].shutdown();
    }

    pub fn restart(&mut self, i: usize) {
        self.nodes[i].kill();
        self.servers[i].shutdown();
        let node = self.net.node();
        let config = ServerConfig {
            listen: self.servers[i].local_addr(),
            ..self.config.clone()
        };
        self.servers[i] = MemoryServer::start(&config, node.clone()).unwrap();
        self.nodes[i] = node;
    }
}

/// The two namespaces are the same; else the first inodes that differ.
pub fn assert_same(got: &rmemfs::meta::Digest, want: &rmemfs::meta::Digest) {
    let differ: Vec<_> = want
        .iter()
        .filter(|(k, v)| got.get(k) != Some(v))
        .map(|(k, v)| (k, v, got.get(k)))
        .take(3)
        .collect();
    let extra: Vec<_> = got
        .keys()
        .filter(|k| !want.contains_key(k))
        .take(3)
        .collect();
    assert!(
        differ.is_empty() && extra.is_empty(),
        "replayed namespace differs: {differ:#?}; inodes only after replay: {extra:?}"
    );
}

pub fn rand_pid() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1000);
    N.fetch_add(1, Ordering::Relaxed)
}

pub struct Daemon(pub Attached);

impl Daemon {
    pub fn fs(&self) -> &Arc<Fs> {
        &self.0.fs
    }

    /// The daemon dies: nothing more is sent, nothing pending is committed.
    pub fn crash(self) {
        self.fs().data().pool().crash();
    }

    pub fn resolve(&self, path: &str) -> Result<Ino, i32> {
        resolve(self.fs(), path)
    }

    pub fn parent<'p>(&self, path: &'p str) -> Result<(Ino, &'p str), i32> {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        Ok((self.resolve(dir)?, name))
    }

    pub fn mkdir(&self, path: &str) -> Result<(), i32> {
        let (p, name) = self.parent(path)?;
        self.fs()
            .mkdir(p, name.as_bytes(), 0o755, ME)
            .map(|_| ())
            .map_err(|e| e.errno)
    }

    pub fn write(&self, path: &str, data: &[u8]) -> Result<(), i32> {
        let (p, name) = self.parent(path)?;
        let (_, fh) = match self.resolve(path) {
            Ok(ino) => (
                ino,
                self.fs().open(ino, libc::O_WRONLY).map_err(|e| e.errno)?,
            ),
            Err(_) => {
                let (e, fh) = self
                    .fs()
                    .create(p, name.as_bytes(), 0o644, libc::O_WRONLY, ME)
                    .map_err(|e| e.errno)?;
                (e.ino, fh)
            }
        };
        let ino = self.resolve(path)?;
        let r = self.fs().write(ino, fh, 0, data, ME).map_err(|e| e.errno);
        self.fs().release(fh);
        r.map(|_| ())
    }

    pub fn read(&self, path: &str) -> Result<Vec<u8>, i32> {
        read(self.fs(), path)
    }

    pub fn unlink(&self, path: &str) -> Result<(), i32> {
        let (p, name) = self.parent(path)?;
        self.fs().unlink(p, name.as_bytes()).map_err(|e| e.errno)
    }

    pub fn sync(&self) -> Result<(), i32> {
        self.fs()
            .sync()
            .expect("a volume mount has a barrier")
            .map_err(|e| e.errno)
    }
}

/// The inode at `path` in `fs`.
pub fn resolve(fs: &Fs, path: &str) -> Result<Ino, i32> {
    let mut ino = ROOT_INO;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        ino = fs.lookup(ino, part.as_bytes()).map_err(|e| e.errno)?.ino;
    }
    Ok(ino)
}

/// The whole file at `path` in `fs`.
pub fn read(fs: &Fs, path: &str) -> Result<Vec<u8>, i32> {
    let ino = resolve(fs, path)?;
    let fh = fs.open(ino, libc::O_RDONLY).map_err(|e| e.errno)?;
    let mut out = Vec::new();
    let r = loop {
        match fs.read(ino, fh, out.len() as u64, 1 << 20) {
            Ok(d) if d.is_empty() => break Ok(out),
            Ok(d) => out.extend_from_slice(&d),
            Err(e) => break Err(e.errno),
        }
    };
    fs.release(fh);
    r
}

/// A follower of a volume (`mount --read-only`): its file system and the thread keeping it
/// in step.
pub struct Reader {
    pub fs: Arc<Fs>,
    pub follower: rmemfs::volume::follow::Follower,
}

impl Rack {
    /// A follower of volume `name` over every server.
    pub fn follow(&self, name: &str) -> Result<Reader, String> {
        let spec = VolumeSpec {
            name: name.into(),
            holder: format!("test-reader pid {}", rand_pid()),
            create: false,
            takeover: false,
            role: rmemfs::client::volume::VolumeRole::Follow,
        };
        let data = self.store(&self.addrs(), spec, self.servers.len().min(2))?;
        let (fs, follower) =
            rmemfs::volume::follow::follow(data, FsConfig::default(), &self.addrs())?;
        Ok(Reader { fs, follower })
    }
}
