//! The immutable and append-only flags (chattr +i, +a), enforced where the
//! kernel's VFS enforces IS_IMMUTABLE and IS_APPEND, with EPERM: an immutable
//! inode takes no change of its data, attributes, xattrs or names (and an
//! immutable directory no new or removed names); an append-only one only
//! grows: no write before its end, truncate, punch, removal, rename, link,
//! chmod, chown or xattr change (an append-only directory takes new names but
//! loses none). Atime alone still moves, as the kernel's atime updates do.

use crate::error::{Error, Result};
use crate::format::inode::{Inode, EXT4_APPEND_FL, EXT4_IMMUTABLE_FL};

fn refused(ino: u32, inode: &Inode, what: &str) -> Error {
    let flag = if inode.has_flag(EXT4_IMMUTABLE_FL) { "immutable" } else { "append-only" };
    Error::NotPermitted(format!("{what}: inode {ino} is {flag}"))
}

/// EPERM for any change of an immutable inode.
pub(crate) fn refuse_if_immutable(ino: u32, inode: &Inode, what: &str) -> Result<()> {
    match inode.has_flag(EXT4_IMMUTABLE_FL) {
        true => Err(refused(ino, inode, what)),
        false => Ok(()),
    }
}

/// EPERM for a change that neither an immutable nor an append-only inode
/// takes: removal, rename, link, truncate, chmod, chown, xattrs.
pub(crate) fn refuse_if_pinned(ino: u32, inode: &Inode, what: &str) -> Result<()> {
    match inode.has_flag(EXT4_IMMUTABLE_FL) || inode.has_flag(EXT4_APPEND_FL) {
        true => Err(refused(ino, inode, what)),
        false => Ok(()),
    }
}

/// EPERM for a write at `offset` that an append-only inode refuses (before
/// its end) or an immutable one (any).
pub(crate) fn refuse_write(ino: u32, inode: &Inode, offset: u64) -> Result<()> {
    refuse_if_immutable(ino, inode, "write")?;
    match inode.has_flag(EXT4_APPEND_FL) && offset < inode.i_size {
        true => Err(refused(ino, inode, &format!("write at byte {offset}, before the end ({})", inode.i_size))),
        false => Ok(()),
    }
}
