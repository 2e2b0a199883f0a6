//! The `rmemfs` command line: parses arguments, picks the fabric, and calls the library.

mod cli;
mod mount_helper;

use cli::{AdminCmd, Cli, Cmd, VolumeCmd};

use clap::Parser;
use rmemfs::auth::Secret;
use rmemfs::fabric::FabricOptions;
use rmemfs::mount;
use rmemfs::server::{MemoryServer, ServerConfig};
use rmemfs::size::format_size;
use std::io::BufRead;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::process::{Command, Stdio};
use std::time::Duration;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn,rmemfs=info"))
        .init();
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.first().is_some_and(mount_helper::invoked_as_helper) {
        use clap::CommandFactory;
        let cli = Cli::command();
        let mount = cli
            .find_subcommand("mount")
            .expect("the CLI has a mount subcommand");
        let value_flag = |key: &str| {
            mount
                .get_arguments()
                .any(|a| a.get_long() == Some(key) && a.get_action().takes_values())
        };
        argv = match mount_helper::translate(&argv, &value_flag) {
            Ok(Some(a)) => a,
            Ok(None) => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e}");
                // mount(8)'s code for a usage error.
                return ExitCode::from(1);
            }
        };
    }
    let cli = Cli::parse_from(&argv);
    let result = match cli.command {
        Cmd::Serve {
            listen,
            size,
            lazy,
            backing,
            boot_id,
            fabric,
            op_timeout,
            secret_file,
            insecure,
            max_client_memory,
            max_clients,
            max_connections_per_peer,
            lease,
            metrics_listen,
        } => {
            let op_timeout = Duration::from_secs(op_timeout);
            Secret::from_option(secret_file.as_deref()).and_then(|secret| {
                serve(
                    ServerConfig {
                        client_op_timeout: op_timeout,
                        secret,
                        max_client_memory,
                        max_clients,
                        max_connections_per_peer,
                        lease: Duration::from_secs(lease),
                        reserve: !lazy,
                        backing,
                        boot_id,
                        ..ServerConfig::new(listen, size)
                    },
                    insecure,
                    metrics_listen,
                    fabric.fabric.as_deref().unwrap_or("tcp"),
                    &fabric.options(rmemfs::config::server_op_timeout(op_timeout)),
                )
            })
        }
        Cmd::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "rmemfs", &mut std::io::stdout());
            Ok(())
        }
        Cmd::Manpages { dir } => write_manpages(&dir),
        Cmd::Volume {
            action,
            servers,
            secret_file,
        } => volume_cmd(action, &servers, secret_file.as_deref()),
        Cmd::Admin { action } => admin_cmd(action),
        Cmd::Keygen { path, force } => rmemfs::auth::keygen(&path, force).map(|()| {
            println!(
                "wrote a new secret to {}: give it to every memory server and mount \
                 (--secret-file {0})",
                path.display()
            )
        }),
        Cmd::Stats {
            mountpoint,
            server,
            secret_file,
            json,
        } => match (mountpoint, server) {
            (Some(m), _) => mount::print_stats(&m, json),
            (None, Some(server)) => Secret::from_option(secret_file.as_deref())
                .and_then(|secret| {
                    mount::server_stats_text(&server, &secret, rmemfs::config::OP_TIMEOUT, json)
                })
                .map(|text| print!("{text}")),
            (None, None) => unreachable!("clap requires one of them"),
        },
        Cmd::Mount(args) => {
            let config = match args.config() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("rmemfs: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let (force, foreground, supervise) = (args.force, args.foreground, args.supervise);
            let log_file = args.log_file;
            // A daemon the supervisor runs serves in the foreground; the mount point is
            // its kept connection's, which nobody serves until it does (not to be looked at).
            let supervised = std::env::var_os(mount::keeper::SUPERVISED_ENV).is_some();
            if std::env::var_os(DAEMON_ENV).is_none() && !supervised {
                match mount::prepare_mountpoint(&config.mountpoint, force) {
                    Ok(Some(note)) => eprintln!("rmemfs: {note}"),
                    Ok(None) => {}
                    Err(e) => {
                        eprintln!("rmemfs: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            let notify_ready = &mut || rmemfs::notify::notify("READY=1");
            let supervise_args = || argv[1..].to_vec();
            if supervised {
                mount::run(&config, notify_ready)
            } else if supervise && foreground {
                mount::keeper::supervise(&supervise_args(), notify_ready)
            } else if foreground {
                mount::run(&config, notify_ready)
            } else if std::env::var_os(DAEMON_ENV).is_some() {
                if supervise {
                    daemon_child(&mut |ready| mount::keeper::supervise(&supervise_args(), ready))
                } else {
                    daemon_child(&mut |ready| mount::run(&config, ready))
                }
            } else {
                daemon_parent(&argv[1..], log_file.as_deref())
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("rmemfs: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn admin_cmd(action: AdminCmd) -> Result<(), String> {
    use mount::admin::{request, Request};
    let answer = match action {
        AdminCmd::Export { mountpoint, dest } => request(&mountpoint, &Request::Export { dest })?,
        AdminCmd::SetReplicas { mountpoint, copies } => {
            request(&mountpoint, &Request::SetReplicas { copies })?
        }
        AdminCmd::AddServer {
            mountpoint,
            server,
            rebalance,
        } => request(&mountpoint, &Request::AddServer { server, rebalance })?,
        AdminCmd::Drain { mountpoint, server } => request(&mountpoint, &Request::Drain { server })?,
        AdminCmd::Remove { mountpoint, server } => {
            request(&mountpoint, &Request::Remove { server })?
        }
        AdminCmd::Rebalance { mountpoint } => request(&mountpoint, &Request::Rebalance)?,
    };
    println!("{answer}");
    Ok(())
}

fn volume_cmd(action: VolumeCmd, servers: &[String], secret: Option<&Path>) -> Result<(), String> {
    use rmemfs::volume::admin;
    if servers.is_empty() {
        return Err("rmemfs volume needs --servers (every server of the volume)".into());
    }
    let addrs: Vec<SocketAddr> = servers
        .iter()
        .map(|s| mount::resolve_server(s))
        .collect::<Result<_, _>>()?;
    let config = rmemfs::client::PoolConfig {
        client_name: format!("rmemfs-volume pid {}", std::process::id()),
        secret: Secret::from_option(secret)?,
        ..Default::default()
    };
    let text = match action {
        VolumeCmd::Ls => admin::ls(&addrs, &config)?,
        VolumeCmd::Status { name } => admin::status(&addrs, &config, &name)?,
        VolumeCmd::Rm { name, meta } => admin::rm(&addrs, &config, &name, meta.as_deref())?,
        VolumeCmd::Export { name, dest } => admin::export(&addrs, &config, &name, &dest)?,
        VolumeCmd::Import { src, name } => admin::import(&addrs, &config, &src, &name)?,
    };
    print!("{text}");
    Ok(())
}

/// rmemfs.1 and rmemfs-SUBCOMMAND.1 for each visible subcommand, from the CLI definition.
fn write_manpages(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let cmd = <Cli as clap::CommandFactory>::command();
    let write = |name: &str, page: clap::Command| -> Result<(), String> {
        let path = dir.join(format!("{name}.1"));
        let mut out = Vec::new();
        clap_mangen::Man::new(page)
            .title(name.to_uppercase())
            .render(&mut out)
            .map_err(|e| format!("cannot render {name}.1: {e}"))?;
        std::fs::write(&path, out).map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("rmemfs-{}", sub.get_name());
        let page = sub
            .clone()
            .name(name.clone())
            .bin_name(format!("rmemfs {}", sub.get_name()));
        write(&name, page)?;
    }
    write("rmemfs", cmd)
}

fn serve(
    config: ServerConfig,
    insecure: bool,
    metrics_listen: Option<SocketAddr>,
    fabric: &str,
    options: &FabricOptions,
) -> Result<(), String> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    if !config.secret.is_set() && !config.listen.ip().is_loopback() {
        if !insecure {
            return Err(format!(
                "refusing to serve {} without a secret: anyone who reaches it could take this \
                 machine's memory. Create one with `rmemfs keygen FILE`, pass --secret-file FILE \
                 here and on every mount, or pass --insecure on a network where every host is \
                 trusted",
                config.listen
            ));
        }
        log::warn!(
            "serving {} WITHOUT a secret (--insecure): any host that reaches it can allocate \
             and read this server's memory",
            config.listen
        );
    }
    let fabric = rmemfs::fabric::open(fabric, options).map_err(|e| e.to_string())?;
    let fabric_name = fabric.name();
    let server_fabric = fabric.clone();
    // Register the signal handlers before announcing readiness, so a signal sent right after
    // the "listening" line is never missed.
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let metrics_listener = metrics_listen
        .map(rmemfs::report::metrics::MetricsServer::bind)
        .transpose()
        .map_err(|e| e.to_string())?;
    let mut server = MemoryServer::start(&config, fabric).map_err(|e| e.to_string())?;
    let _metrics = metrics_listener
        .map(|listener| {
            let report = server.report_source();
            rmemfs::report::metrics::serve(
                listener,
                Box::new(rmemfs::report::metrics::ServerCollector { report }),
            )
        })
        .transpose()?;
    println!(
        "rmemfs serve: listening on {} (arena {}, fabric {fabric_name}, memlock limit {})",
        server.local_addr(),
        format_size(server.capacity().total),
        rmemfs::fabric::mem::memlock_limit_text()
    );
    let _ = std::io::stdout().flush();
    rmemfs::notify::notify("READY=1");
    if let Some(sig) = signals.forever().next() {
        log::warn!("signal {sig}: shutting down");
    }
    rmemfs::notify::notify("STOPPING=1");
    server.shutdown();
    let refused = server_fabric.counters().remote_refused;
    eprintln!("rmemfs serve: stopped ({refused} remote accesses refused)");
    Ok(())
}

/// What the background process runs, given what to call once the mount is ready.
type ServeUntilDone<'a> = dyn FnMut(&mut dyn FnMut()) -> Result<(), String> + 'a;

/// Set in the environment of the background mount process.
const DAEMON_ENV: &str = "RMEMFS_DAEMON_CHILD";

/// Starts this same command (`args`, as parsed: a mount helper's call already translated)
/// again as a detached background process and waits until it says the mount is ready (or
/// why it failed) on its stdout.
fn daemon_parent(args: &[std::ffi::OsString], log_file: Option<&Path>) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own binary: {e}"))?;
    let stderr = match log_file {
        Some(p) => Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| format!("cannot open log file {}: {e}", p.display()))?,
        ),
        None => Stdio::null(),
    };
    let mut child = Command::new(exe)
        .args(args)
        .env(DAEMON_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("cannot start the mount daemon: {e}"))?;
    let mut line = String::new();
    let out = child.stdout.take().expect("piped");
    let _ = std::io::BufReader::new(out).read_line(&mut line);
    match line.trim_end().split_once(' ') {
        Some(("ready", _)) => Ok(()),
        Some(("error", msg)) => {
            let _ = child.wait();
            Err(msg.to_string())
        }
        _ => {
            let status = child.wait().map_err(|e| e.to_string())?;
            Err(format!(
                "the mount daemon exited before the mount was ready ({status})"
            ))
        }
    }
}

/// The background mount process: detaches, mounts, reports readiness to the parent through
/// stdout, then serves until unmounted.
fn daemon_child(run: &mut ServeUntilDone<'_>) -> Result<(), String> {
    // SAFETY: setsid has no memory-safety preconditions; it fails harmlessly if we already
    // lead a session.
    unsafe { libc::setsid() };
    let mut ready = || {
        println!("ready {}", std::process::id());
        let _ = std::io::stdout().flush();
        // Let the parent see end-of-file: point our stdout at /dev/null.
        if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
            use std::os::fd::AsRawFd;
            // SAFETY: dup2 onto fd 1 replaces our stdout; both descriptors are valid.
            unsafe { libc::dup2(null.as_raw_fd(), 1) };
        }
    };
    let result = run(&mut ready);
    if let Err(msg) = &result {
        // Before `ready`, stdout is still the parent's pipe: it reports this.
        println!("error {msg}");
        let _ = std::io::stdout().flush();
    }
    result
}
