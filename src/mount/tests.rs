use super::*;

#[test]
fn server_addresses_get_the_default_port() {
    assert_eq!(
        resolve_server("127.0.0.1").unwrap(),
        SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT))
    );
    assert_eq!(
        resolve_server("127.0.0.1:9").unwrap(),
        SocketAddr::from(([127, 0, 0, 1], 9))
    );
    assert_eq!(resolve_server("::1").unwrap().port(), DEFAULT_PORT);
    assert_eq!(resolve_server("[::1]:10").unwrap().port(), 10);
    assert!(resolve_server("localhost").is_ok());
    assert!(resolve_server("no.such.host.invalid").is_err());
}

#[test]
fn bad_mount_points_are_named() {
    let e = check_mountpoint(Path::new("/no/such/dir")).unwrap_err();
    assert!(e.contains("does not exist"), "{e}");
    let e = check_mountpoint(Path::new("/etc/hostname")).unwrap_err();
    assert!(e.contains("not a directory"), "{e}");
    let e = check_mountpoint(Path::new("/proc")).unwrap_err();
    assert!(e.contains("already a mount point"), "{e}");
}

#[test]
fn mount_options_parse() {
    let (cfg, choices) = fuser_config(&["allow_other,ro".into(), "fsname=pool".into()], 4).unwrap();
    assert!(choices.read_only);
    assert_eq!(choices.atime, crate::fs::Atime::Relative);
    let (_, c) = fuser_config(&["strictatime,nodiratime,lazytime".into()], 1).unwrap();
    assert_eq!((c.atime, c.dir_atime), (crate::fs::Atime::Strict, false));
    let (_, c) = fuser_config(&["noatime".into()], 1).unwrap();
    assert_eq!(c.atime, crate::fs::Atime::Never);
    assert!(c.readdirplus);
    let (_, c) = fuser_config(&["nordirplus".into()], 1).unwrap();
    assert!(!c.readdirplus);
    assert!(c.io_uring, "FUSE over io_uring by default");
    let (_, c) = fuser_config(&["no_io_uring".into()], 1).unwrap();
    assert!(!c.io_uring);
    let (_, c) = fuser_config(&["no_io_uring,io_uring".into()], 1).unwrap();
    assert!(c.io_uring);
    let (_, c) = fuser_config(&["io_uring,no_io_uring".into()], 1).unwrap();
    assert!(!c.io_uring);
    assert_eq!(cfg.n_threads, Some(4));
    assert!(cfg
        .mount_options
        .contains(&fuser::MountOption::FSName("pool".into())));
    assert!(fuser_config(&["bogus".into()], 1).is_err());
}

/// The command line as `rmemfs mount` gets it, turned into what the mount is asked for.
fn asked(argv: &[&str]) -> MountConfig {
    let argv = std::iter::once("mount").chain(argv.iter().copied());
    let args = <asked::Defaults as clap::Parser>::try_parse_from(argv)
        .unwrap()
        .args;
    args.config().unwrap()
}

#[test]
fn the_namespace_mode_is_decided_from_the_command_line_once() {
    let volume = |more: &[&str]| {
        let mut argv = vec!["/m", "--servers", "a", "--volume", "v"];
        argv.extend_from_slice(more);
        asked(&argv).namespace
    };
    assert_eq!(asked(&["/m"]).namespace, Namespace::Private);
    assert_eq!(MountConfig::new("/m".into()).namespace, Namespace::Private);
    assert_eq!(
        volume(&["--create", "--meta", "redis://r"]),
        Namespace::Shared {
            name: "v".into(),
            meta: "redis://r".into(),
            create: true,
        }
    );
    assert_eq!(
        volume(&["--meta", "redis://r"]),
        Namespace::Shared {
            name: "v".into(),
            meta: "redis://r".into(),
            create: false,
        }
    );
    assert_eq!(
        volume(&["--read-only"]),
        Namespace::Follower { name: "v".into() }
    );
    assert_eq!(
        volume(&["--takeover", "--force-without", "b"]),
        Namespace::Held {
            name: "v".into(),
            create: false,
            takeover: true,
            force_without: vec!["b".into()],
        }
    );
    // `--supervise` keeps the connection; the defaults are the grammar's.
    let c = asked(&["/m", "--servers", "a", "--volume", "v", "--supervise"]);
    assert!(c.keep_connection);
    assert_eq!(c.chunk_size, config::CHUNK_SIZE);
    assert_eq!(c.op_timeout, config::OP_TIMEOUT);
}
