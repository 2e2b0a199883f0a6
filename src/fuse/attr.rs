//! Attributes: a file's (getattr, statx, setattr, access) and the file system's (statfs).

use super::*;

pub(super) fn getattr(f: &FuseFs, ino: INodeNo, reply: ReplyAttr) {
    match f.fs.getattr(ino.0) {
        Ok(a) => reply.attr(&f.ttl, &file_attr(&a)),
        Err(e) => reply.error(errno(&e)),
    }
}

/// Asked when a caller wants the birth time (the basic stats come by `getattr`).
pub(super) fn statx(f: &FuseFs, ino: INodeNo, reply: ReplyStatx) {
    match f.fs.getattr(ino.0) {
        Ok(a) => reply.statx(&f.ttl, &file_attr(&a)),
        Err(e) => reply.error(errno(&e)),
    }
}

pub(super) fn setattr(f: &FuseFs, req: &Request, ino: INodeNo, set: &SetAttr, reply: ReplyAttr) {
    match f.fs.setattr(ino.0, set, caller(req)) {
        Ok(a) => reply.attr(&f.ttl, &file_attr(&a)),
        Err(e) => reply.error(errno(&e)),
    }
}

pub(super) fn statfs(f: &FuseFs, reply: ReplyStatfs) {
    let s = f.fs.statfs();
    reply.statfs(
        s.blocks,
        s.blocks_free,
        s.blocks_free,
        s.files,
        s.files_free,
        s.block_size,
        s.name_max,
        s.block_size,
    );
}
