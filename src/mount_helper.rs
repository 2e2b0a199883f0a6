//! `mount -t rmemfs` and `/etc/fstab`: mount(8) runs `/sbin/mount.rmemfs SOURCE DIR -o OPTS`
//! (or `mount.fuse.rmemfs` for `-t fuse.rmemfs`); installed as a link to `rmemfs`, the binary
//! recognises the name and turns that call into `rmemfs mount`.
//!
//! Options that are flags of `rmemfs mount` are written `key=value` (`servers=a+b:7471`,
//! with `+` between servers since commas separate options); the rest are FUSE mount
//! options (`allow_other`, `ro`, ...). What only mount(8) and systemd read (`_netdev`,
//! `nofail`, `noauto`, `x-systemd.*`, ...) is dropped.

use std::ffi::OsString;
use std::path::Path;

/// The names rmemfs answers to as a mount helper.
const HELPER_NAMES: [&str; 2] = ["mount.rmemfs", "mount.fuse.rmemfs"];

/// Options for mount(8), systemd or fstab bookkeeping only.
fn for_mount_only(opt: &str) -> bool {
    matches!(
        opt,
        "defaults"
            | "auto"
            | "noauto"
            | "nofail"
            | "_netdev"
            | "user"
            | "users"
            | "nouser"
            | "owner"
            | "group"
    ) || opt.starts_with("x-")
        || opt.starts_with("comment=")
}

/// Whether the program was run under a mount helper's name.
pub fn invoked_as_helper(argv0: &OsString) -> bool {
    Path::new(argv0)
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| HELPER_NAMES.contains(&n))
}

/// What a helper call means: the `rmemfs mount` arguments, or `None` for a fake mount
/// (`-f`: mount(8) only wants to know it would work). `value_flag` says whether `--KEY`
/// (`-` for `_`) is a flag of `rmemfs mount` that takes a value: the CLI definition decides,
/// so every such flag is an option too.
pub fn translate(
    args: &[OsString],
    value_flag: &dyn Fn(&str) -> bool,
) -> Result<Option<Vec<OsString>>, String> {
    let usage = "usage: mount.rmemfs SOURCE DIR [-sfnv] [-o OPTIONS]";
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut fake = false;
    let mut rest = args.iter().skip(1);
    while let Some(a) = rest.next() {
        let s = a.to_str().ok_or("mount.rmemfs: arguments must be UTF-8")?;
        match s {
            "-o" => {
                let o = rest.next().ok_or(usage)?;
                let o = o.to_str().ok_or("mount.rmemfs: options must be UTF-8")?;
                options.extend(o.split(',').filter(|o| !o.is_empty()).map(String::from));
            }
            // mount(8) may pass the type again; the helper's name already says it.
            "-t" => {
                rest.next().ok_or(usage)?;
            }
            "-f" => fake = true,
            "-s" | "-n" | "-v" => {}
            _ if s.starts_with('-') && !s.starts_with("-o") => {
                return Err(format!("mount.rmemfs: unknown flag {s}; {usage}"))
            }
            _ if s.starts_with("-o") => options.extend(
                s[2..]
                    .split(',')
                    .filter(|o| !o.is_empty())
                    .map(String::from),
            ),
            _ => positional.push(s.to_string()),
        }
    }
    let [source, dir] = <[String; 2]>::try_from(positional).map_err(|_| usage.to_string())?;
    let mut out: Vec<OsString> = vec!["rmemfs".into(), "mount".into(), dir.into()];
    if !matches!(source.as_str(), "" | "none" | "rmemfs") {
        out.push("-o".into());
        out.push(format!("fsname={source}").into());
    }
    for opt in options {
        if for_mount_only(&opt) {
            continue;
        }
        match opt.split_once('=') {
            Some((key, value)) if value_flag(&key.replace('_', "-")) => {
                let value = if key == "servers" {
                    value.replace('+', ",")
                } else {
                    value.to_string()
                };
                out.push(format!("--{}", key.replace('_', "-")).into());
                out.push(value.into());
            }
            _ => {
                out.push("-o".into());
                out.push(opt.into());
            }
        }
    }
    Ok((!fake).then_some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(args: &[&str]) -> Result<Option<Vec<String>>, String> {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let flags = ["servers", "replicas", "secret-file"];
        translate(&args, &|k| flags.contains(&k))
            .map(|o| o.map(|v| v.into_iter().map(|s| s.into_string().unwrap()).collect()))
    }

    #[test]
    fn fstab_options_become_flags_and_fuse_options() {
        let got = t(&[
            "/sbin/mount.rmemfs",
            "pool",
            "/mnt/pool",
            "-o",
            "rw,_netdev,nofail,servers=10.0.0.5+10.0.0.6:7000,replicas=2,allow_other,x-systemd.requires=network-online.target,secret_file=/etc/rmemfs/secret",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            got,
            [
                "rmemfs",
                "mount",
                "/mnt/pool",
                "-o",
                "fsname=pool",
                "-o",
                "rw",
                "--servers",
                "10.0.0.5,10.0.0.6:7000",
                "--replicas",
                "2",
                "-o",
                "allow_other",
                "--secret-file",
                "/etc/rmemfs/secret",
            ]
        );
        assert_eq!(t(&["mount.rmemfs", "none", "/m", "-f"]), Ok(None));
        assert!(t(&["mount.rmemfs", "/m"]).is_err());
        assert!(t(&["mount.rmemfs", "a", "/m", "-x"]).is_err());
        assert!(invoked_as_helper(&"/usr/sbin/mount.fuse.rmemfs".into()));
        assert!(!invoked_as_helper(&"/usr/bin/rmemfs".into()));
    }
}
