//! The namespace's requests: entries made, renamed and removed, and directories read.

use super::*;

pub(super) fn mknod(
    f: &FuseFs,
    parent: INodeNo,
    name: &OsStr,
    mode: u32,
    rdev: u32,
    who: Caller,
    reply: ReplyEntry,
) {
    let made = f.fs.mknod(parent.0, name.as_bytes(), mode, rdev, who);
    entry(reply, &f.ttl, made, f.gen());
}

pub(super) fn mkdir(
    f: &FuseFs,
    parent: INodeNo,
    name: &OsStr,
    mode: u32,
    who: Caller,
    reply: ReplyEntry,
) {
    let made = f.fs.mkdir(parent.0, name.as_bytes(), mode, who);
    entry(reply, &f.ttl, made, f.gen());
}

pub(super) fn symlink(
    f: &FuseFs,
    req: &Request,
    parent: INodeNo,
    link_name: &OsStr,
    target: &Path,
    reply: ReplyEntry,
) {
    let made = f.fs.symlink(
        parent.0,
        link_name.as_bytes(),
        target.as_os_str().as_bytes(),
        caller(req),
    );
    entry(reply, &f.ttl, made, f.gen());
}

/// A name's move: `from` and `to` are each a directory and a name in it.
pub(super) fn rename(
    f: &FuseFs,
    req: &Request,
    from: (INodeNo, &OsStr),
    to: (INodeNo, &OsStr),
    flags: RenameFlags,
    reply: ReplyEmpty,
) {
    let moved = f.fs.rename(
        from.0 .0,
        from.1.as_bytes(),
        to.0 .0,
        to.1.as_bytes(),
        flags.bits(),
        caller(req),
    );
    empty(reply, moved);
}

pub(super) fn link(
    f: &FuseFs,
    ino: INodeNo,
    newparent: INodeNo,
    newname: &OsStr,
    reply: ReplyEntry,
) {
    let made = f.fs.link(ino.0, newparent.0, newname.as_bytes());
    entry(reply, &f.ttl, made, f.gen());
}

/// A create or tmpfile (`parent` and a name, or none for an unnamed file), open with `flags`.
pub(super) fn create(
    f: &FuseFs,
    parent: INodeNo,
    name: Option<&OsStr>,
    mode: u32,
    flags: i32,
    who: Caller,
    reply: ReplyCreate,
) {
    let made = match name {
        Some(name) => f.fs.create(parent.0, name.as_bytes(), mode, flags, who),
        None => f.fs.tmpfile(parent.0, mode, flags, who),
    };
    match made {
        Ok((a, fh)) => reply.created(
            &f.ttl,
            &file_attr(&a),
            Generation(f.generation(a.ino)),
            FileHandle(fh),
            f.open_flags(flags),
        ),
        Err(e) => reply.error(errno(&e)),
    }
}

pub(super) fn opendir(f: &FuseFs, ino: INodeNo, reply: ReplyOpen) {
    match f.fs.opendir(ino.0) {
        Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
        Err(e) => reply.error(errno(&e)),
    }
}

pub(super) fn readdir(
    f: &FuseFs,
    ino: INodeNo,
    fh: FileHandle,
    offset: u64,
    mut reply: ReplyDirectory,
) {
    let res = f.fs.readdir(ino.0, fh.0, offset, &mut |e| {
        !reply.add(
            INodeNo(e.ino),
            e.offset,
            file_type(e.kind),
            OsStr::from_bytes(&e.name),
        )
    });
    match res {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

pub(super) fn readdirplus(
    f: &FuseFs,
    ino: INodeNo,
    fh: FileHandle,
    offset: u64,
    mut reply: ReplyDirectoryPlus,
) {
    let res = f.fs.readdirplus(ino.0, fh.0, offset, &mut |e, a| {
        !reply.add(
            INodeNo(e.ino),
            e.offset,
            OsStr::from_bytes(&e.name),
            &f.ttl,
            &file_attr(a),
            Generation(f.generation(e.ino)),
        )
    });
    match res {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}
