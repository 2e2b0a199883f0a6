//! `rmemfs-bench fabric`: throughput and latency of one-sided READ/WRITE over the TCP fabric on
//! loopback, measured side by side with plain TCP moving the same bytes, so the fabric's
//! efficiency is a ratio rather than an absolute figure on a noisy machine.
//!
//! The memory server and the plain-TCP peer both run as child processes (`rmemfs serve` of the
//! product binary, found by [`find_rmemfs`], and `rmemfs-bench peer`), so both sides cross
//! process boundaries alike. Children run with `RUST_LOG=error`: the output is the results, not
//! the server's logs.

use rmemfs::client::control::ControlConn;
use rmemfs::client::{Pool, PoolConfig};
use rmemfs::fabric::tcp::{TcpConfig, TcpFabric};
use rmemfs::fabric::{
    Access, AlignedBuf, CompletionQueue, Fabric, FabricError, Opcode, QueuePair, WcStatus,
    WorkRequest,
};
use rmemfs::proto::Message;
use rmemfs::size::format_size;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Benchmark parameters.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// The `rmemfs` binary that runs the memory server.
    pub rmemfs: PathBuf,
    pub sizes: Vec<u64>,
    pub depths: Vec<usize>,
    /// Bytes moved per throughput measurement.
    pub bytes: u64,
    /// Round trips per latency measurement.
    pub latency_iters: usize,
    /// Clients for the server memory measurement.
    pub clients: usize,
}

/// A child process killed on drop.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Environment variable naming the `rmemfs` binary, when `--rmemfs` is not given (the same
/// variable mount-tests/lib.sh uses).
pub const RMEMFS_BIN_ENV: &str = "RMEMFS_BIN";

/// The product binary that runs the memory server: `explicit` (`--rmemfs`), else
/// `$RMEMFS_BIN`, else `rmemfs` in the directory of this executable (the same cargo target
/// directory). An error names what was looked for.
pub fn find_rmemfs(explicit: Option<&Path>) -> Result<PathBuf, String> {
    let (path, from) = if let Some(p) = explicit {
        (p.to_path_buf(), "--rmemfs".to_string())
    } else if let Some(p) = std::env::var_os(RMEMFS_BIN_ENV).filter(|p| !p.is_empty()) {
        (PathBuf::from(p), format!("${RMEMFS_BIN_ENV}"))
    } else {
        let exe = std::env::current_exe().map_err(|e| {
            format!(
                "cannot find the rmemfs binary: no --rmemfs, no ${RMEMFS_BIN_ENV}, and the path \
                 of this executable is unknown ({e})"
            )
        })?;
        let dir = exe.parent().unwrap_or(Path::new("."));
        (
            dir.join("rmemfs"),
            format!(
                "no --rmemfs or ${RMEMFS_BIN_ENV}, so next to {}",
                exe.display()
            ),
        )
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "cannot find the rmemfs binary that runs the memory server: {} ({from}) is not a \
             file; build it (`cargo build --release --workspace`) or give its path with \
             --rmemfs PATH or ${RMEMFS_BIN_ENV}",
            path.display()
        ))
    }
}

/// How long a benchmark waits for a free's answer before its next timed allocation: ample
/// for a loopback server, which answers in well under a millisecond.
const SETTLE: Duration = Duration::from_secs(30);

/// Starts `program <args>` with `RUST_LOG=error` (its logs must not land between the results)
/// and reads the address from its "listening on ADDR" line.
fn spawn_listener(program: &Path, args: &[&str]) -> io::Result<(ChildGuard, SocketAddr)> {
    let mut child = Command::new(program)
        .args(args)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| {
            io::Error::new(e.kind(), format!("cannot start {}: {e}", program.display()))
        })?;
    let out = child.stdout.take().expect("piped");
    let guard = ChildGuard(child);
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    let addr = line
        .split_whitespace()
        .find_map(|w| w.parse::<SocketAddr>().ok())
        .ok_or_else(|| io::Error::other(format!("no address in child output: {line:?}")))?;
    Ok((guard, addr))
}

type QpAndCq = (Arc<dyn QueuePair>, Arc<CompletionQueue>);

/// Connects a queue pair (with its own completion queue) over an existing control connection.
fn connect_qp(fabric: &Arc<TcpFabric>, control: &ControlConn) -> Result<QpAndCq, FabricError> {
    let addr = control.addr;
    let cq = fabric.create_cq();
    let mut exchange = |blob: Vec<u8>| match control.request(|tag| Message::Connect { tag, blob }) {
        Ok(Message::Connected { blob, .. }) => Ok(blob),
        other => Err(FabricError::Handshake {
            addr,
            reason: format!("{other:?}"),
        }),
    };
    let qp = fabric.connect(addr, &mut exchange, cq.clone(), &control.token)?;
    Ok((qp, cq))
}

/// Runs `total_ops` operations of `size` bytes keeping `depth` in flight; returns seconds.
#[allow(clippy::too_many_arguments)]
fn run_window(
    qp: &dyn QueuePair,
    cq: &CompletionQueue,
    opcode: Opcode,
    lkey_base: (u64, u32),
    remote: (u64, u64),
    size: u64,
    depth: usize,
    total_ops: u64,
) -> io::Result<f64> {
    let wr = |i: u64| WorkRequest {
        wr_id: i,
        opcode,
        local: rmemfs::fabric::Sge {
            addr: lkey_base.0 + (i % depth as u64) * size,
            len: size,
            lkey: lkey_base.1,
        },
        remote_addr: remote.0 + (i % depth as u64) * size,
        rkey: remote.1,
    };
    let start = Instant::now();
    let mut posted = 0u64;
    while posted < (depth as u64).min(total_ops) {
        qp.post(&[wr(posted)]);
        posted += 1;
    }
    let mut done = 0u64;
    while done < total_ops {
        let c = cq
            .wait(Duration::from_secs(30))
            .ok_or_else(|| io::Error::other("completion timed out"))?;
        if c.status != WcStatus::Success {
            return Err(io::Error::other(format!("op failed: {:?}", c.status)));
        }
        done += 1;
        drop(c);
        if posted < total_ops {
            qp.post(&[wr(posted)]);
            posted += 1;
        }
    }
    Ok(start.elapsed().as_secs_f64())
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Plain-TCP peer modes (the first byte a bench client sends).
const PEER_SINK: u8 = 1;
const PEER_SOURCE: u8 = 2;
const PEER_REQ_RESP: u8 = 3;

/// `rmemfs-bench peer`: the plain-TCP side of the comparison. Serves one client at a time per
/// thread: sink (read and discard N bytes, then ack), source (send N bytes), request/response
/// (32-byte request, `size`-byte response).
pub fn run_peer(listen: SocketAddr) -> io::Result<()> {
    let listener = TcpListener::bind(listen)?;
    println!("rmemfs-bench peer: listening on {}", listener.local_addr()?);
    io::stdout().flush()?;
    for conn in listener.incoming() {
        let mut s = conn?;
        thread::spawn(move || {
            let _ = peer_session(&mut s);
        });
    }
    Ok(())
}

fn peer_session(s: &mut TcpStream) -> io::Result<()> {
    s.set_nodelay(true)?;
    let mut cmd = [0u8; PEER_CMD_LEN];
    s.read_exact(&mut cmd)?;
    let word = |i: usize| u64::from_le_bytes(cmd[1 + 8 * i..9 + 8 * i].try_into().unwrap());
    let (total, chunk, window) = (word(0), word(1) as usize, word(2) as usize);
    // The same working set as the fabric: `window` bytes, used `chunk` by `chunk` in turn.
    let mut buf = vec![0x33u8; window.max(chunk)];
    let span = (buf.len() - chunk + 1).max(1);
    let mut at = 0;
    let next = |at: &mut usize| {
        let o = *at;
        *at = (*at + chunk) % span;
        o
    };
    match cmd[0] {
        PEER_SINK => {
            let mut left = total;
            while left > 0 {
                let n = (left as usize).min(chunk);
                let o = next(&mut at);
                s.read_exact(&mut buf[o..o + n])?;
                left -= n as u64;
            }
            s.write_all(&[1])?;
        }
        PEER_SOURCE => {
            let mut left = total;
            while left > 0 {
                let n = (left as usize).min(chunk);
                let o = next(&mut at);
                s.write_all(&buf[o..o + n])?;
                left -= n as u64;
            }
        }
        PEER_REQ_RESP => {
            let mut req = [0u8; 32];
            for _ in 0..total {
                s.read_exact(&mut req)?;
                s.write_all(&buf[..chunk])?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn buf_len(window: usize, chunk: usize) -> usize {
    window.max(chunk)
}

const PEER_CMD_LEN: usize = 25;

fn peer_cmd(
    peer: SocketAddr,
    mode: u8,
    total: u64,
    chunk: u64,
    window: u64,
) -> io::Result<TcpStream> {
    let mut s = TcpStream::connect(peer)?;
    s.set_nodelay(true)?;
    let mut cmd = [0u8; PEER_CMD_LEN];
    cmd[0] = mode;
    for (i, v) in [total, chunk, window].into_iter().enumerate() {
        cmd[1 + 8 * i..9 + 8 * i].copy_from_slice(&v.to_le_bytes());
    }
    s.write_all(&cmd)?;
    Ok(s)
}

/// Plain TCP moving `total` bytes in `chunk`-byte pieces cycling over a `window`-byte buffer on
/// both ends (the fabric's working set at this depth); `send` or receive. Returns seconds.
fn tcp_stream(
    peer: SocketAddr,
    send: bool,
    total: u64,
    chunk: u64,
    window: u64,
) -> io::Result<f64> {
    let (chunk_u, window_u) = (chunk as usize, window as usize);
    let mut buf = vec![7u8; buf_len(window_u, chunk_u)];
    let span = (buf.len() - chunk_u + 1).max(1);
    let start = Instant::now();
    let mode = if send { PEER_SINK } else { PEER_SOURCE };
    let mut s = peer_cmd(peer, mode, total, chunk, window)?;
    let (mut left, mut at) = (total, 0usize);
    while left > 0 {
        let n = left.min(chunk) as usize;
        if send {
            s.write_all(&buf[at..at + n])?;
        } else {
            s.read_exact(&mut buf[at..at + n])?;
        }
        at = (at + chunk_u) % span;
        left -= n as u64;
    }
    if send {
        let mut ack = [0u8; 1];
        s.read_exact(&mut ack)?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Plain TCP request/response latencies in microseconds (sorted).
fn tcp_rr(peer: SocketAddr, size: u64, iters: usize) -> io::Result<Vec<f64>> {
    let mut s = peer_cmd(peer, PEER_REQ_RESP, iters as u64, size, size)?;
    let mut buf = vec![0u8; size as usize];
    let req = [0u8; 32];
    let mut lat = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        s.write_all(&req)?;
        s.read_exact(&mut buf)?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(f64::total_cmp);
    Ok(lat)
}

/// Rounds per throughput point; the median damps this machine's noise.
const ROUNDS: usize = 3;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn short_size(n: u64) -> String {
    format_size(n).replace(".0 ", "").replace(' ', "")
}

fn mbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / 1e6
}

fn rss_kib(pid: u32) -> io::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| io::Error::other("no VmRSS"))
}

/// Runs the whole benchmark and prints its tables.
pub fn run(cfg: &BenchConfig) -> io::Result<()> {
    let max_size = *cfg.sizes.iter().max().unwrap_or(&(1 << 20));
    let max_depth = *cfg.depths.iter().max().unwrap_or(&1) as u64;
    let window = max_size * max_depth;
    let arena = (window + (64 << 20)).max(256 << 20);
    let arena_arg = arena.to_string();
    // All the memory measurement's clients connect from 127.0.0.1: the per-peer cap must let
    // them in (the benchmark's own pool and its window take two more).
    let per_peer = (cfg.clients + 2).to_string();
    let (server, server_addr) = spawn_listener(
        &cfg.rmemfs,
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--size",
            arena_arg.as_str(),
            "--max-connections-per-peer",
            per_peer.as_str(),
        ],
    )?;
    let (_peer, peer_addr) = spawn_listener(
        &std::env::current_exe()?,
        &["peer", "--listen", "127.0.0.1:0"],
    )?;

    let fabric = TcpFabric::new(TcpConfig::default());
    // The benchmark's server listens on loopback without a secret.
    let control = ControlConn::connect(
        server_addr,
        "bench",
        Duration::from_secs(10),
        &rmemfs::auth::Secret::none(),
    )
    .map_err(io::Error::other)?;
    let (qp, cq) = connect_qp(&fabric, &control).map_err(io::Error::other)?;
    let (raddr, rkey) = match control.request(|tag| Message::Alloc { tag, len: window }) {
        Ok(Message::Allocated { addr, rkey, .. }) => (addr, rkey),
        other => return Err(io::Error::other(format!("alloc failed: {other:?}"))),
    };
    let buf = Arc::new(AlignedBuf::new(window as usize)?);
    buf.fill(0x5a);
    let mr = fabric
        .register_buf(buf.clone(), Access::LOCAL)
        .map_err(io::Error::other)?;
    let local = (mr.addr(), mr.lkey());

    println!(
        "# rmemfs fabric benchmark: tcp fabric vs plain TCP on loopback, {} per point, \
         median of {ROUNDS} alternating rounds; plain TCP uses the same working set \
         (depth x size bytes) on both ends",
        format_size(cfg.bytes)
    );
    println!(
        "{:<6} {:>6} {:>6} {:>12} {:>10} {:>7}",
        "op", "size", "depth", "fabric MB/s", "tcp MB/s", "ratio"
    );
    for &size in &cfg.sizes {
        let ops = (cfg.bytes / size).max(1);
        let bytes = ops * size;
        for &depth in &cfg.depths {
            let window = size * depth as u64;
            for (name, opcode) in [("WRITE", Opcode::Write), ("READ", Opcode::Read)] {
                let (mut fab, mut tcp) = (Vec::new(), Vec::new());
                for _ in 0..ROUNDS {
                    let send = opcode == Opcode::Write;
                    tcp.push(mbps(
                        bytes,
                        tcp_stream(peer_addr, send, bytes, size, window)?,
                    ));
                    let secs =
                        run_window(&*qp, &cq, opcode, local, (raddr, rkey), size, depth, ops)?;
                    fab.push(mbps(bytes, secs));
                }
                let (f, t) = (median(&mut fab), median(&mut tcp));
                println!(
                    "{:<6} {:>6} {:>6} {:>12.0} {:>10.0} {:>6.0}%",
                    name,
                    short_size(size),
                    depth,
                    f,
                    t,
                    100.0 * f / t
                );
            }
        }
    }

    // Latency for the small sizes only (round trips, not bandwidth); none asked, no table.
    let small: Vec<u64> = cfg
        .sizes
        .iter()
        .copied()
        .filter(|&s| s <= 64 << 10)
        .collect();
    if !small.is_empty() {
        println!("\n# latency at depth 1, microseconds");
        println!(
            "{:<28} {:>8} {:>8} {:>10}",
            "what", "p50", "p99", "vs tcp p50"
        );
    }
    for size in small {
        let tcp = tcp_rr(peer_addr, size, cfg.latency_iters)?;
        let tcp50 = percentile(&tcp, 0.5);
        println!(
            "{:<28} {:>8.1} {:>8.1} {:>10}",
            format!("plain TCP req/resp {}", short_size(size)),
            tcp50,
            percentile(&tcp, 0.99),
            "1.00x"
        );
        for (name, opcode) in [("READ", Opcode::Read), ("WRITE", Opcode::Write)] {
            let mut lat = Vec::with_capacity(cfg.latency_iters);
            for _ in 0..cfg.latency_iters {
                let secs = run_window(&*qp, &cq, opcode, local, (raddr, rkey), size, 1, 1)?;
                lat.push(secs * 1e6);
            }
            lat.sort_by(f64::total_cmp);
            let p50 = percentile(&lat, 0.5);
            println!(
                "{:<28} {:>8.1} {:>8.1} {:>9.2}x",
                format!("fabric {name} {}", short_size(size)),
                p50,
                percentile(&lat, 0.99),
                p50 / tcp50
            );
        }
    }

    // Server memory beyond its arena with many clients: each connects (control + data) and
    // writes one extent, so the arena pages they use are accounted for separately.
    let pid = server.0.id();
    let before = rss_kib(pid)?;
    let extent = 1u64 << 20;
    let mut pools = Vec::new();
    let client_fabric = TcpFabric::new(TcpConfig::default());
    let cbuf = Arc::new(AlignedBuf::new(extent as usize)?);
    cbuf.fill(1);
    let cmr = client_fabric
        .register_buf(cbuf, Access::LOCAL)
        .map_err(io::Error::other)?;
    for i in 0..cfg.clients {
        let pool = Pool::connect(
            client_fabric.clone(),
            &[server_addr],
            &PoolConfig {
                client_name: format!("bench-client-{i}"),
                ..PoolConfig::default()
            },
        )
        .map_err(io::Error::other)?;
        let region = pool.alloc(extent).map_err(io::Error::other)?;
        pool.write(region, 0, cmr.sge(0, extent))
            .map_err(io::Error::other)?;
        pools.push(pool);
    }
    thread::sleep(Duration::from_millis(300));
    let after = rss_kib(pid)?;
    // Arena pages in use are the extents clients hold (pinned, so resident), this benchmark's
    // own window included: the server's capacity report says how many bytes that is.
    let cap = pools
        .first()
        .map(|p| p.refresh()[0].capacity)
        .unwrap_or_default();
    let arena_kib = (cap.total - cap.free) / 1024;
    println!(
        "\n# server memory: RSS {} MiB before, {} MiB with {} clients connected (each holding a \
         written {} extent); arena in use {} MiB; beyond the arena: {:.1} MiB",
        before / 1024,
        after / 1024,
        cfg.clients,
        format_size(extent),
        arena_kib / 1024,
        after.saturating_sub(arena_kib) as f64 / 1024.0
    );
    drop(pools);
    drop(mr);
    drop(qp);
    Ok(())
}

/// Registers all of `buf` afresh (the client's registration cost, paid on every write in the
/// FRRWP benchmark; no cache on purpose).
fn register_whole(fabric: &dyn Fabric, buf: &AlignedBuf) -> io::Result<rmemfs::fabric::LocalMr> {
    // SAFETY: callers drop the registration before `buf`, within the same round.
    unsafe { fabric.register(buf.as_ptr(), buf.len(), Access::LOCAL) }.map_err(io::Error::other)
}

/// FRRWP registers and submits a large write in parts of this size, so that registering one
/// part overlaps sending the one before: small enough to pipeline a 1 MiB write in four
/// steps, large enough that the per-registration overhead stays small.
const FRRWP_PART: u64 = 256 << 10;

/// `rmemfs-bench frrwp`: latency of a write to fresh remote memory, the traditional serial
/// sequence (allocate and wait for the rkey, register the local buffer, write) against FRRWP
/// (tagged allocation first, local registration meanwhile, conditional write), on the TCP
/// fabric against a memory server in another process; beside the paper's model of the saving.
pub fn run_frrwp(
    rmemfs: &Path,
    sizes: &[u64],
    iters: usize,
    fabric_name: &str,
    options: &rmemfs::fabric::FabricOptions,
) -> io::Result<()> {
    let max = *sizes.iter().max().unwrap_or(&(1 << 20));
    let arena = (max * 4).max(256 << 20).to_string();
    let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--size", &arena];
    args.extend(["--fabric", fabric_name]);
    if let Some(device) = &options.device {
        args.extend(["--device", device]);
    }
    let (_server, addr) = spawn_listener(rmemfs, &args)?;
    let fabric = rmemfs::fabric::open(fabric_name, options).map_err(io::Error::other)?;
    let pool =
        Pool::connect(fabric.clone(), &[addr], &PoolConfig::default()).map_err(io::Error::other)?;
    let page = rmemfs::fabric::mem::page_size() as f64;

    // The client's registration cost on this fabric: register/deregister a touched buffer.
    let mut reg_points = Vec::new();
    for &size in sizes {
        let buf = AlignedBuf::new(size as usize)?;
        buf.fill(1);
        let mut lat = Vec::new();
        for _ in 0..iters.clamp(5, 50) {
            let t = Instant::now();
            let mr = register_whole(&*fabric, &buf)?;
            lat.push(t.elapsed().as_secs_f64() * 1e6);
            drop(mr);
        }
        reg_points.push((size as f64 / page, median(&mut lat)));
    }
    // Least-squares fit T = a*p + b.
    let n = reg_points.len() as f64;
    let (sx, sy) = reg_points
        .iter()
        .fold((0.0, 0.0), |(x, y), &(p, t)| (x + p, y + t));
    let sxx: f64 = reg_points.iter().map(|&(p, _)| p * p).sum();
    let sxy: f64 = reg_points.iter().map(|&(p, t)| p * t).sum();
    let a = (n * sxy - sx * sy) / (n * sxx - sx * sx).max(f64::MIN_POSITIVE);
    let b = (sy - a * sx) / n;
    println!(
        "# registration on the {} fabric, fitted: T_r = {a:.3} us/page + {b:.2} us \
         (paper: 0.77 us/page + 7.42 us)",
        fabric.name()
    );
    println!(
        "# write latency to fresh remote memory, {iters} writes per point, microseconds; \
         saving = serial - frrwp at the median"
    );
    println!(
        "{:>6} {:>10} {:>10} {:>10} {:>10} {:>9} {:>8} {:>12} {:>12}",
        "size",
        "serial p50",
        "serial p99",
        "frrwp p50",
        "frrwp p99",
        "saving",
        "saving%",
        "paper model",
        "model here"
    );
    let mut parts = Vec::new();
    for &size in sizes {
        let buf = AlignedBuf::new(size as usize)?;
        buf.fill(2);
        let (mut serial, mut frrwp) = (Vec::new(), Vec::new());
        for i in 0..iters * 2 {
            let use_frrwp = i % 2 == 1; // alternate, so drift hits both alike
            let t = Instant::now();
            let region = if use_frrwp {
                let ticket = pool.begin_alloc(size).map_err(io::Error::other)?;
                let t_sent = t.elapsed().as_secs_f64() * 1e6;
                // Register and submit part by part: registering one part overlaps the
                // transfer of the one before (and the first the server's allocation).
                let mut mrs = Vec::new();
                let mut subs = Vec::new();
                let mut at = 0;
                while at < size {
                    let n = (size - at).min(FRRWP_PART);
                    // SAFETY: `buf` outlives the registration, dropped at the end of the
                    // round; `at + n <= size`.
                    let mr = unsafe {
                        fabric.register(buf.as_ptr().add(at as usize), n as usize, Access::LOCAL)
                    }
                    .map_err(io::Error::other)?;
                    subs.push(
                        pool.submit_crw(&ticket, vec![(mr.sge(0, n), at)])
                            .map_err(io::Error::other)?,
                    );
                    mrs.push(mr);
                    at += n;
                }
                let t_reg = t.elapsed().as_secs_f64() * 1e6;
                let replied_first = ticket.region().is_some();
                for sub in subs {
                    pool.wait_crw(&ticket, sub).map_err(io::Error::other)?;
                }
                if std::env::var_os("RMEMFS_BENCH_TRACE").is_some() {
                    eprintln!(
                        "frrwp {size}: sent {t_sent:.0} registered {t_reg:.0} done {:.0} \
                         (reply before submit: {replied_first})",
                        t.elapsed().as_secs_f64() * 1e6
                    );
                }
                ticket.region().expect("allocated")
            } else {
                let region = pool.alloc(size).map_err(io::Error::other)?;
                let mr = register_whole(&*fabric, &buf)?;
                pool.write(region, 0, mr.sge(0, size))
                    .map_err(io::Error::other)?;
                region
            };
            let us = t.elapsed().as_secs_f64() * 1e6;
            if use_frrwp {
                frrwp.push(us);
            } else {
                serial.push(us);
            }
            pool.free(region).map_err(io::Error::other)?;
            // Frees do not wait for their answer: the next allocation would queue behind this
            // one's deregistration and zeroing on the server, inside the next measurement.
            pool.settle_frees(SETTLE);
        }
        // The parts of the serial sequence, measured alone.
        let (mut t_alloc, mut t_reg, mut t_write) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..iters.min(30) {
            let t = Instant::now();
            let region = pool.alloc(size).map_err(io::Error::other)?;
            t_alloc.push(t.elapsed().as_secs_f64() * 1e6);
            let t = Instant::now();
            let mr = register_whole(&*fabric, &buf)?;
            t_reg.push(t.elapsed().as_secs_f64() * 1e6);
            let t = Instant::now();
            pool.write(region, 0, mr.sge(0, size))
                .map_err(io::Error::other)?;
            t_write.push(t.elapsed().as_secs_f64() * 1e6);
            pool.free(region).map_err(io::Error::other)?;
            pool.settle_frees(SETTLE);
        }
        parts.push((
            size,
            median(&mut t_alloc),
            median(&mut t_reg),
            median(&mut t_write),
        ));
        serial.sort_by(f64::total_cmp);
        frrwp.sort_by(f64::total_cmp);
        let (s50, f50) = (percentile(&serial, 0.5), percentile(&frrwp, 0.5));
        let p = size as f64 / page;
        // The paper's saving: T_r + T_c = 0.77p + 7.42 + 8 (its T_c, the synchronization
        // message handled by the caller, is 8 us); "here" puts this fabric's T_r in.
        let paper = 15.42 + 0.77 * p;
        let here = a * p + b + 8.0;
        println!(
            "{:>6} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>9.0} {:>7.0}% {:>12.0} {:>12.0}",
            short_size(size),
            s50,
            percentile(&serial, 0.99),
            f50,
            percentile(&frrwp, 0.99),
            s50 - f50,
            100.0 * (s50 - f50) / s50,
            paper,
            here
        );
    }
    println!("\n# the serial sequence's parts alone (medians, us): what FRRWP can overlap is the");
    println!("# smaller of the allocation round trip and the local registration");
    println!(
        "{:>6} {:>14} {:>14} {:>10}",
        "size", "alloc (server)", "register here", "write"
    );
    for (size, a, r, w) in parts {
        println!("{:>6} {a:>14.0} {r:>14.0} {w:>10.0}", short_size(size));
    }
    Ok(())
}

/// `rmemfs-bench handshake`: what the authenticated handshake costs a mount. Two memory
/// servers (child processes of the product binary), one with a secret and one without, and
/// `iters` control connections to each, alternating; prints the p50/p99 connect time (TCP
/// connect, hello, challenge, proofs, welcome) of each and the difference.
pub fn run_handshake(rmemfs: &Path, iters: usize) -> io::Result<()> {
    use rmemfs::auth::Secret;
    let dir = std::env::temp_dir().join(format!("rmemfs-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("secret");
    let _ = std::fs::remove_file(&path);
    rmemfs::auth::keygen(&path, false).map_err(io::Error::other)?;
    let secret = Secret::from_file(&path).map_err(io::Error::other)?;
    let path_arg = path.to_string_lossy().into_owned();
    let (_open, open_addr) = spawn_listener(
        rmemfs,
        &["serve", "--listen", "127.0.0.1:0", "--size", "64M"],
    )?;
    let (_closed, closed_addr) = spawn_listener(
        rmemfs,
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--size",
            "64M",
            "--secret-file",
            &path_arg,
        ],
    )?;
    let mut times = [Vec::with_capacity(iters), Vec::with_capacity(iters)];
    let timeout = Duration::from_secs(10);
    for _ in 0..iters {
        for (k, (addr, secret)) in [(open_addr, Secret::none()), (closed_addr, secret.clone())]
            .into_iter()
            .enumerate()
        {
            let start = Instant::now();
            let c =
                ControlConn::connect(addr, "bench", timeout, &secret).map_err(io::Error::other)?;
            times[k].push(start.elapsed().as_secs_f64() * 1e3);
            drop(c);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("# control connection set-up, {iters} each, alternating; milliseconds");
    println!("{:<28} {:>8} {:>8}", "server", "p50", "p99");
    let mut p50 = [0.0; 2];
    for (k, name) in ["without a secret", "with a secret (mutual auth)"]
        .iter()
        .enumerate()
    {
        times[k].sort_by(f64::total_cmp);
        p50[k] = percentile(&times[k], 0.5);
        println!(
            "{name:<28} {:>8.3} {:>8.3}",
            p50[k],
            percentile(&times[k], 0.99)
        );
    }
    println!("authentication adds {:.3} ms (p50)", p50[1] - p50[0]);
    Ok(())
}
