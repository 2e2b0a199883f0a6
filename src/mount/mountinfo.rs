//! `/proc/self/mountinfo`, read in one place: which mounts this process's namespace has,
//! their devices, mount points and flags (proc(5)). Mount points, flags and types come from
//! here rather than from a stat of the mount point, which would be a FUSE request to a
//! daemon that may be this one, or not serving.

use std::path::Path;

/// Where the kernel lists this process's mounts.
pub(super) const PATH: &str = "/proc/self/mountinfo";

/// One mount: the fields of its line that rmemfs reads.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Mount<'a> {
    pub id: u64,
    /// "MAJOR:MINOR" of the file system.
    pub device: &'a str,
    pub point: String,
    /// The per-mount options ("rw,nosuid,relatime").
    pub options: &'a str,
    pub fstype: &'a str,
}

impl Mount<'_> {
    /// Whether the per-mount options include `option`.
    pub fn has(&self, option: &str) -> bool {
        self.options.split(',').any(|o| o == option)
    }
}

/// Every mount of `text` (mountinfo's content), in the order they were made: a mount over
/// another comes after it.
pub(super) fn mounts(text: &str) -> impl Iterator<Item = Mount<'_>> {
    text.lines().filter_map(|l| {
        let (head, tail) = l.split_once(" - ")?;
        let f: Vec<&str> = head.split(' ').collect();
        Some(Mount {
            id: f.first()?.parse().ok()?,
            device: f.get(2)?,
            point: unescape(f.get(4)?),
            options: f.get(5)?,
            fstype: tail.split(' ').next()?,
        })
    })
}

/// The topmost mount at `target` in `text`, as `f` reads it.
pub(super) fn topmost<T>(text: &str, target: &Path, f: impl Fn(&Mount<'_>) -> T) -> Option<T> {
    let target = target.to_string_lossy();
    mounts(text)
        .filter(|m| m.point == target)
        .last()
        .map(|m| f(&m))
}

/// The topmost mount at `target` now, as `f` reads it.
pub(super) fn topmost_now<T>(target: &Path, f: impl Fn(&Mount<'_>) -> T) -> Option<T> {
    topmost(&std::fs::read_to_string(PATH).ok()?, target, f)
}

/// The kernel writes space, tab, newline and backslash in paths as octal escapes (`\040`).
pub(super) fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
41 22 0:40 / /mnt/my\\040pool rw,nosuid,nodev,relatime shared:20 - fuse.rmemfs rmemfs rw,user_id=0
43 41 0:42 / /mnt/my\\040pool rw,noatime,nodiratime shared:21 - fuse.rmemfs rmemfs rw
";

    #[test]
    fn lines_are_read_and_the_topmost_mount_wins() {
        let all: Vec<Mount> = mounts(TABLE).collect();
        assert_eq!(all.len(), 3);
        assert_eq!((all[1].id, all[1].device), (41, "0:40"));
        assert_eq!(all[1].point, "/mnt/my pool");
        assert_eq!(all[1].fstype, "fuse.rmemfs");
        assert!(all[2].has("nodiratime") && !all[2].has("diratime"));
        assert_eq!(
            topmost(TABLE, Path::new("/mnt/my pool"), |m| m.id),
            Some(43)
        );
        assert_eq!(topmost(TABLE, Path::new("/mnt"), |m| m.id), None);
    }

    #[test]
    fn escapes_in_mount_points_are_read() {
        assert_eq!(unescape("/a\\040b\\011c\\134d\\012"), "/a b\tc\\d\n");
        assert_eq!(unescape("/plain\\x"), "/plain\\x");
    }
}
