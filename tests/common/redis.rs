//! A `redis-server` for the metadata engine's tests (it must be installed: `tools/test.sh`
//! installs it).
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(10);

/// A `redis-server` on a free loopback port, without persistence; killed on drop.
pub struct Redis {
    child: Child,
    pub url: String,
}

impl Redis {
    /// Starts one on a free port. Tests start several at once, so a port may be taken
    /// between its choice and the server's bind: the server that answers must be this one
    /// (its `process_id`), else another port is tried.
    pub fn start() -> Redis {
        for _ in 0..10 {
            if let Some(redis) = Redis::try_start() {
                return redis;
            }
        }
        panic!("redis-server never listened on a port of its own");
    }

    /// Starts one that also speaks TLS, on its own port (`tls_url`), with the certificate
    /// and key in PEM files `cert` and `key` (clients show none).
    pub fn start_tls(cert: &std::path::Path, key: &std::path::Path) -> (Redis, String) {
        for _ in 0..10 {
            let tls = free_port();
            let args = [
                "--tls-port".to_string(),
                tls.to_string(),
                "--tls-cert-file".into(),
                cert.display().to_string(),
                "--tls-key-file".into(),
                key.display().to_string(),
                "--tls-auth-clients".into(),
                "no".into(),
            ];
            if let Some(redis) = Redis::try_start_with(&args) {
                return (redis, format!("rediss://127.0.0.1:{tls}/0"));
            }
        }
        panic!("redis-server never listened on ports of its own");
    }

    fn try_start() -> Option<Redis> {
        Redis::try_start_with(&[])
    }

    fn try_start_with(extra: &[String]) -> Option<Redis> {
        let port = free_port();
        let mut child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server ({e}): install it (apt install redis-server; tools/test.sh does)")
            });
        let url = format!("redis://127.0.0.1:{port}/0");
        let deadline = Instant::now() + LONG;
        loop {
            if child.try_wait().ok().flatten().is_some() {
                return None; // it could not bind: another took the port
            }
            if let Some(pid) = server_pid(port) {
                if pid == child.id() {
                    return Some(Redis { child, url });
                }
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            assert!(Instant::now() < deadline, "redis-server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The process id of the Redis answering on `port` (none: nothing answers yet).
fn server_pid(port: u16) -> Option<u32> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    conn.write_all(b"INFO server\r\n").ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("process_id:") || !got.ends_with(b"\r\n") {
        let n = conn.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    let line = text.lines().find(|l| l.starts_with("process_id:"))?;
    line["process_id:".len()..].trim().parse().ok()
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
