//! `rmemfs stats`: a mount's report read through its stats attribute, and a memory server's
//! counters asked over an authenticated control session.

use super::*;

/// `rmemfs stats MOUNTPOINT [--json]`: reads the live counters from the mount's virtual
/// attribute (its text form, or JSON).
pub fn print_stats(mountpoint: &Path, json: bool) -> Result<(), String> {
    let report = read_report(mountpoint, json)?;
    print!("{}", String::from_utf8_lossy(&report));
    Ok(())
}

/// The mount's report (`stats --json`), read through its virtual attribute.
pub fn report_json(mountpoint: &Path) -> Result<serde_json::Value, String> {
    serde_json::from_slice(&read_report(mountpoint, true)?)
        .map_err(|e| format!("{}: the report is not JSON ({e})", mountpoint.display()))
}

/// The mount's report, as text or JSON, read through its virtual attribute.
pub(super) fn read_report(mountpoint: &Path, json: bool) -> Result<Vec<u8>, String> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| "mount point contains a NUL byte".to_string())?;
    let name = std::ffi::CString::new(if json {
        crate::fuse::STATS_JSON_XATTR
    } else {
        crate::fuse::STATS_XATTR
    })
    .expect("no NUL");
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: both strings are NUL-terminated and `buf` is writable for its length.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!(
            "{} is not a live rmemfs mount ({e})",
            mountpoint.display()
        ));
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// The counters of a memory server, asked over an authenticated control session (the
/// server's secret is needed: they tell who was refused and how often). The session
/// allocates nothing and says goodbye.
pub fn server_stats_text(
    server: &str,
    secret: &crate::auth::Secret,
    timeout: Duration,
    json: bool,
) -> Result<String, String> {
    let addr = resolve_server(server)?;
    let conn = ControlConn::connect_observer(addr, "rmemfs-stats", timeout, secret)
        .map_err(|e| e.to_string())?;
    let reply = conn.request(|tag| crate::proto::Message::Stat { tag });
    conn.goodbye();
    let (capacity, extents, clients, counters) = match reply.map_err(|e| e.to_string())? {
        crate::proto::Message::Stats {
            capacity,
            extents,
            clients,
            counters,
            ..
        } => (capacity, extents, clients, counters),
        other => return Err(format!("memory server {addr} answered {other:?}")),
    };
    let mut report = crate::server::ServerReport::new(
        &addr.to_string(),
        &conn.hello.fabric,
        conn.hello.instance,
        capacity,
        clients,
        extents,
        &counters,
    );
    report.backed = conn.hello.backed;
    if json {
        return Ok(format!("{}\n", report.to_json()));
    }
    Ok(report.text())
}
