//! Prometheus metrics of a mount and of a memory server (`--metrics-listen ADDR:PORT`), for
//! an operator's monitoring: what `rmemfs stats` shows, as counters, gauges and per-request
//! latency histograms (prometheus-client encodes them).
//!
//! The figures are read at scrape time from the counters the daemon keeps anyway (one
//! collector per process), so serving metrics costs nothing between scrapes. They are served
//! in the Prometheus text format (see [`prometheus_text`]). What is served is declared in
//! [`super::families`]; encoding it is one loop. The endpoint is a minimal HTTP/1.1 responder for `GET /metrics`, one connection at a time with short
//! timeouts: a slow or hostile client delays the next scrape, never the file system.

use crate::report::families::Family;
use crate::report::{MetricKind, MountReport};
use crate::server::ServerReport;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// How long one scrape's connection may take in all, to send its request and take the
/// answer: a Prometheus server scrapes within its own timeout (10 s by default) and reads at
/// once, and a client that trickles bytes holds the (single) endpoint no longer than this.
const SCRAPE_IO_TIMEOUT: Duration = Duration::from_secs(5);
/// The pause after a failed `accept` (out of file descriptors, say) before the next one, so
/// the loop does not spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);
/// The longest request head read (a scrape sends a few hundred bytes).
const MAX_REQUEST_HEAD: usize = 8 << 10;

/// Writes one family (see [`super::families`]).
fn encode_family(e: &mut DescriptorEncoder, f: &Family) -> fmt::Result {
    let kind = match f.kind {
        MetricKind::Counter => MetricType::Counter,
        MetricKind::Gauge => MetricType::Gauge,
    };
    let mut m = e.encode_descriptor(&f.name, f.help, None, kind)?;
    for (labels, v) in &f.samples {
        let sample = |m: &mut MetricEncoder| match f.kind {
            MetricKind::Counter => m.encode_counter::<NoLabelSet, _, u64>(v, None),
            MetricKind::Gauge => m.encode_gauge(&(*v as i64)),
        };
        if labels.is_empty() {
            sample(&mut m)?;
        } else {
            sample(&mut m.encode_family(labels)?)?;
        }
    }
    Ok(())
}

/// A mount's metrics, from its typed report and its per-request latencies.
pub struct MountCollector {
    pub report: ReportSource,
    /// Per-operation latency buckets (`requests::RequestStats::summary`).
    pub requests: Summaries,
    /// Per-kind latencies of fabric batches (`client::Pool::batch_latency`).
    pub batches: Summaries,
}

/// Reads the mount's report at scrape time.
pub type ReportSource = Arc<dyn Fn() -> MountReport + Send + Sync>;

/// Reads a set of per-operation latency summaries at scrape time.
pub type Summaries = Arc<dyn Fn() -> Vec<crate::requests::OpSummary> + Send + Sync>;

/// One histogram family: each summary under `label`, its power-of-two µs buckets in seconds.
fn histograms(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    summaries: &[crate::requests::OpSummary],
) -> fmt::Result {
    let mut h = e.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for o in summaries {
        // Per-bucket counts: the encoder sums them up to each bound.
        let buckets: Vec<(f64, u64)> = o
            .buckets
            .iter()
            .map(|&(bound_us, n)| {
                let le = if bound_us == u64::MAX {
                    f64::INFINITY
                } else {
                    bound_us as f64 / 1e6
                };
                (le, n)
            })
            .collect();
        let labels = [(label.to_string(), o.op.to_string())];
        h.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
            o.total_nanos as f64 / 1e9,
            o.count,
            &buckets,
            None,
        )?;
    }
    Ok(())
}

impl fmt::Debug for MountCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MountCollector")
    }
}

impl Collector for MountCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let s = (self.report)();
        let ops = (self.requests)();
        for family in s.families(&ops) {
            encode_family(&mut e, &family)?;
        }
        histograms(
            &mut e,
            "rmemfs_request_duration_seconds",
            "Time the daemon took to answer a FUSE request, by operation (buckets of powers of \
             two microseconds)",
            "op",
            &ops,
        )?;
        histograms(
            &mut e,
            "rmemfs_fabric_batch_duration_seconds",
            "Time from posting a batch of one-sided operations to its last completion, by \
             kind: read, write, write_fresh (with conditional writes to fresh memory), mixed",
            "kind",
            &(self.batches)(),
        )
    }
}

/// A memory server's metrics, from its typed report.
pub struct ServerCollector {
    pub report: Arc<dyn Fn() -> ServerReport + Send + Sync>,
}

impl fmt::Debug for ServerCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ServerCollector")
    }
}

impl Collector for ServerCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        for family in (self.report)().families() {
            encode_family(&mut e, &family)?;
        }
        Ok(())
    }
}

/// The endpoint: serves `GET /metrics` from `registry` on its own thread until dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `listen` (before anything else is set up, so a port in use fails at once).
    pub fn bind(listen: SocketAddr) -> io::Result<TcpListener> {
        TcpListener::bind(listen)
            .map_err(|e| io::Error::new(e.kind(), format!("metrics on {listen}: {e}")))
    }

    /// Starts answering scrapes on `listener` with what `registry` encodes.
    pub fn start(listener: TcpListener, registry: Registry) -> io::Result<MetricsServer> {
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if flag.load(Ordering::SeqCst) {
                        break;
                    }
                    match conn {
                        Ok(c) => {
                            if let Err(e) = answer(c, &registry) {
                                log::debug!("metrics scrape: {e}");
                            }
                        }
                        Err(e) => {
                            log::debug!("metrics accept: {e}");
                            thread::sleep(ACCEPT_RETRY);
                        }
                    }
                }
            })?;
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, SCRAPE_IO_TIMEOUT);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Answers one connection: the metrics for `GET /metrics`, 404 or 405 otherwise.
fn answer(mut c: TcpStream, registry: &Registry) -> io::Result<()> {
    let deadline = std::time::Instant::now() + SCRAPE_IO_TIMEOUT;
    let left = || {
        deadline
            .checked_duration_since(std::time::Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "scrape too slow"))
    };
    c.set_write_timeout(Some(SCRAPE_IO_TIMEOUT))?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        c.set_read_timeout(Some(left()?))?;
        let n = c.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_REQUEST_HEAD {
            return respond(
                &mut c,
                "431 Request Header Fields Too Large",
                "text/plain",
                "",
            );
        }
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, path) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    if method != b"GET" {
        return respond(&mut c, "405 Method Not Allowed", "text/plain", "only GET\n");
    }
    if path != b"/metrics" {
        return respond(
            &mut c,
            "404 Not Found",
            "text/plain",
            "metrics are at /metrics\n",
        );
    }
    let mut body = String::new();
    prometheus_client::encoding::text::encode(&mut body, registry)
        .map_err(|_| io::Error::other("encoding the metrics failed"))?;
    respond(
        &mut c,
        "200 OK",
        "text/plain; version=0.0.4; charset=utf-8",
        &prometheus_text(&body),
    )
}

/// The Prometheus text format (0.0.4) of an OpenMetrics text: the same but for counters,
/// whose HELP and TYPE lines OpenMetrics writes under the family name (`x`) and Prometheus's
/// format under the sample name (`x_total`). Served so, every Prometheus since 2.0 and
/// `promtool check metrics` read it; `# EOF` and `# UNIT` are comments there. Histogram
/// bounds of infinity are spelled `+Inf`.
fn prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + 64 * counters.len());
    for line in openmetrics.lines() {
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        let line = renamed.as_deref().unwrap_or(line);
        // The encoder writes an infinite bound as `inf`; the format's spelling is `+Inf`.
        out.push_str(&line.replace("le=\"inf\"", "le=\"+Inf\""));
        out.push('\n');
    }
    out
}

fn respond(c: &mut TcpStream, status: &str, kind: &str, body: &str) -> io::Result<()> {
    write!(
        c,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    c.flush()
}

/// Serves `collector`'s metrics on `listener` (bound early with [`MetricsServer::bind`]) and
/// logs where.
pub fn serve(
    listener: TcpListener,
    collector: Box<dyn Collector>,
) -> Result<MetricsServer, String> {
    let m = MetricsServer::start(listener, registry_with(collector)).map_err(|e| e.to_string())?;
    log::info!("metrics at http://{}/metrics", m.local_addr());
    Ok(m)
}

/// A registry holding one collector.
pub fn registry_with(collector: Box<dyn Collector>) -> Registry {
    let mut r = Registry::default();
    r.register_collector(collector);
    r
}

#[cfg(test)]
mod tests;
