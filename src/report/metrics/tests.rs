use super::*;

#[test]
fn counters_get_their_sample_name_in_help_and_type() {
    let om = "# HELP x_requests Requests.\n# TYPE x_requests counter\n\
              x_requests_total{op=\"a\"} 3\n# HELP g A gauge.\n# TYPE g gauge\ng 1\n\
              h_bucket{le=\"inf\"} 2\n# EOF\n";
    assert_eq!(
        prometheus_text(om),
        "# HELP x_requests_total Requests.\n# TYPE x_requests_total counter\n\
         x_requests_total{op=\"a\"} 3\n# HELP g A gauge.\n# TYPE g gauge\ng 1\n\
         h_bucket{le=\"+Inf\"} 2\n# EOF\n"
    );
}

#[test]
fn upkeep_panics_are_counted_per_thread_and_generic_sections_exported() {
    let report: ReportSource = Arc::new(|| MountReport {
        upkeep_panics: [
            ("heartbeat".to_string(), 0),
            ("reconnect".to_string(), 3),
            ("rebuild".to_string(), 1),
        ]
        .into(),
        namespace: crate::report::NamespaceFigures {
            commits: 7,
            changes: 19,
        },
        ..Default::default()
    });
    let collector = MountCollector {
        report,
        requests: Arc::new(Vec::new),
        batches: Arc::new(Vec::new),
    };
    let mut om = String::new();
    prometheus_client::encoding::text::encode(&mut om, &registry_with(Box::new(collector)))
        .unwrap();
    let text = prometheus_text(&om);
    for line in [
        "# TYPE rmemfs_upkeep_panics_total counter",
        "rmemfs_upkeep_panics_total{thread=\"heartbeat\"} 0",
        "rmemfs_upkeep_panics_total{thread=\"reconnect\"} 3",
        "rmemfs_upkeep_panics_total{thread=\"rebuild\"} 1",
        "# TYPE rmemfs_namespace_commits_total counter",
        "rmemfs_namespace_commits_total 7",
        "rmemfs_namespace_changes_total 19",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line:?} missing from\n{text}"
        );
    }
}

#[test]
fn a_scrape_gets_the_metrics_and_nothing_else_is_served() {
    let report = Arc::new(|| {
        let counters = crate::proto::ServerCounters {
            refused_secret: 2,
            ..Default::default()
        };
        let cap = crate::proto::Capacity {
            total: 9,
            free: 5,
            largest_free: 5,
        };
        ServerReport::new("127.0.0.1:7471", "tcp", 1, cap, 1, 0, &counters)
    });
    let server = MetricsServer::start(
        MetricsServer::bind("127.0.0.1:0".parse().unwrap()).unwrap(),
        registry_with(Box::new(ServerCollector { report })),
    )
    .unwrap();
    let get = |request: &str| {
        let mut c = TcpStream::connect(server.local_addr()).unwrap();
        c.write_all(request.as_bytes()).unwrap();
        let mut answer = Vec::new();
        // A refused request may be reset before all of it was sent: keep what came.
        let _ = c.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    };
    let ok = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    assert!(ok.contains("\nrmemfs_serve_free_bytes 5\n"), "{ok}");
    assert!(
        ok.contains("\nrmemfs_serve_refused_secret_total 2\n"),
        "{ok}"
    );
    assert!(
        ok.contains("# TYPE rmemfs_serve_refused_secret_total counter\n"),
        "{ok}"
    );
    assert!(get("POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
    assert!(get("GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
    let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(10_000));
    let refused = get(&huge);
    assert!(
        refused.is_empty() || refused.starts_with("HTTP/1.1 431"),
        "{refused}"
    );
    // A client that connects and sends nothing does not stop the next scrape for long.
    let _idle = TcpStream::connect(server.local_addr()).unwrap();
    drop(_idle);
    assert!(get("GET /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200"));
}

/// The metric families an endpoint serves, by their `# TYPE` lines.
fn families(collector: Box<dyn Collector>) -> Vec<String> {
    let mut om = String::new();
    prometheus_client::encoding::text::encode(&mut om, &registry_with(collector)).unwrap();
    let mut names: Vec<String> = prometheus_text(&om)
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(str::to_string)
        .collect();
    names.sort();
    names
}

#[test]
fn every_metric_of_the_mount_and_the_server_is_pinned() {
    let op = || crate::requests::OpSummary {
        op: "read",
        count: 1,
        mean_us: 1,
        p50_us: 1,
        p99_us: 1,
        max_us: 1,
        total_nanos: 1000,
        buckets: vec![(1, 1), (u64::MAX, 0)],
    };
    let mount = MountCollector {
        report: Arc::new(crate::report::pinned::every_section),
        requests: Arc::new(move || vec![op()]),
        batches: Arc::new(move || vec![op()]),
    };
    let got = families(Box::new(mount));
    crate::report::pinned::assert_pinned("the mount's metrics", MOUNT_METRICS, &got);
    let server = ServerCollector {
        report: Arc::new(crate::report::pinned::a_server),
    };
    let got = families(Box::new(server));
    crate::report::pinned::assert_pinned("the server's metrics", SERVER_METRICS, &got);
}

const MOUNT_METRICS: &[&str] = &[
    "rmemfs_chunk_copies gauge",
    "rmemfs_chunks gauge",
    "rmemfs_chunks_copied_on_write_total counter",
    "rmemfs_contained_panics_total counter",
    "rmemfs_drain_bytes_left gauge",
    "rmemfs_drain_rate_bytes_per_second gauge",
    "rmemfs_encoding_bytes_encoded_total counter",
    "rmemfs_encoding_copy_bytes gauge",
    "rmemfs_encoding_data_fragments gauge",
    "rmemfs_encoding_parity_fragments gauge",
    "rmemfs_encoding_passes_total counter",
    "rmemfs_encoding_pending gauge",
    "rmemfs_encoding_stripe_bytes gauge",
    "rmemfs_encoding_stripes gauge",
    "rmemfs_encoding_stripes_degraded gauge",
    "rmemfs_encoding_stripes_made_total counter",
    "rmemfs_fabric_batch_duration_seconds histogram",
    "rmemfs_fabric_bytes_total counter",
    "rmemfs_fabric_failed_operations_total counter",
    "rmemfs_fabric_operations_total counter",
    "rmemfs_fabric_registrations_total counter",
    "rmemfs_fabric_remote_access_errors_total counter",
    "rmemfs_follower_applied gauge",
    "rmemfs_follower_errors_total counter",
    "rmemfs_follower_invalidations_total counter",
    "rmemfs_follower_polls_total counter",
    "rmemfs_follower_records_total counter",
    "rmemfs_follower_reloads_total counter",
    "rmemfs_inodes gauge",
    "rmemfs_journal_bytes_total counter",
    "rmemfs_journal_checkpoints_total counter",
    "rmemfs_journal_committed gauge",
    "rmemfs_journal_epoch gauge",
    "rmemfs_journal_frees_held gauge",
    "rmemfs_journal_groups_total counter",
    "rmemfs_namespace_changes_total counter",
    "rmemfs_namespace_commits_total counter",
    "rmemfs_pinned_bytes gauge",
    "rmemfs_rebuild_bytes_total counter",
    "rmemfs_rebuild_chunks_left gauge",
    "rmemfs_rebuild_chunks_total counter",
    "rmemfs_rebuild_running gauge",
    "rmemfs_registration_cache_lookups_total counter",
    "rmemfs_request_duration_seconds histogram",
    "rmemfs_requests_total counter",
    "rmemfs_server_downs gauge",
    "rmemfs_server_free_bytes gauge",
    "rmemfs_server_total_bytes gauge",
    "rmemfs_server_up gauge",
    "rmemfs_shared_applied gauge",
    "rmemfs_shared_keeper gauge",
    "rmemfs_shared_large gauge",
    "rmemfs_shared_noted_inodes gauge",
    "rmemfs_shared_whole gauge",
    "rmemfs_unpinned_bytes gauge",
    "rmemfs_upkeep_panics_total counter",
];
const SERVER_METRICS: &[&str] = &[
    "rmemfs_serve_clients gauge",
    "rmemfs_serve_extents gauge",
    "rmemfs_serve_failed_handshakes_total counter",
    "rmemfs_serve_free_bytes gauge",
    "rmemfs_serve_largest_free_bytes gauge",
    "rmemfs_serve_leased_sessions gauge",
    "rmemfs_serve_protocol_violations_total counter",
    "rmemfs_serve_refused_max_clients_total counter",
    "rmemfs_serve_refused_no_space_total counter",
    "rmemfs_serve_refused_peer_cap_total counter",
    "rmemfs_serve_refused_quota_total counter",
    "rmemfs_serve_refused_secret_total counter",
    "rmemfs_serve_remote_refused_total counter",
    "rmemfs_serve_resumed_sessions_total counter",
    "rmemfs_serve_total_bytes gauge",
];
