//! The immutable and append-only flags (chattr +i, +a), enforced where the
//! kernel's VFS enforces IS_IMMUTABLE and IS_APPEND, with EPERM: an immutable
//! inode takes no change of its data, attributes, xattrs or names (and an
//! immutable directory no new or removed names); an append-only one only
//! grows: no write before its end, truncate, punch, removal, rename, link,
//! chmod, chown or xattr change (an append-only directory takes new names but
//! loses none). Atime alone still moves, as the kernel's atime updates do.
//!
//! `Filesystem::set_flags` is chattr: it changes the flags a user may set,
//! and is the one change an immutable inode takes.

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

/// Flags chattr may change here: sync, immutable, append-only, nodump,
/// noatime, dirsync, topdir (and the three the kernel keeps without acting on:
/// secure deletion, undelete, compression). Others (extents, inline data,
/// casefold, journaled data...) change only as the filesystem decides.
pub const SETTABLE_FLAGS: u32 = 0x1 | 0x2 | 0x4 | 0x8 | 0x10 | 0x20 | 0x40 | 0x80 | 0x10000 | 0x20000;

/// Flags lsattr sees (the kernel's EXT4_FL_USER_VISIBLE).
pub const VISIBLE_FLAGS: u32 = 0x705B_DFFF;

impl crate::fs::Filesystem {
    /// The inode's flags as lsattr sees them (FS_IOC_GETFLAGS).
    ///
    /// # Errors
    /// As [`crate::fs::Filesystem::stat`].
    pub fn flags(&self, ino: u32) -> Result<u32> {
        Ok(self.inode(ino)?.i_flags & VISIBLE_FLAGS)
    }

    /// chattr (FS_IOC_SETFLAGS): sets the flags in `SETTABLE_FLAGS` to those
    /// of `flags`, keeps the rest whatever `flags` says of them (the kernel's
    /// VFS, going through FS_IOC_FSGETXATTR for a FUSE file, passes on only
    /// the common flags), and moves ctime. Whether the caller may (the owner,
    /// and CAP_LINUX_IMMUTABLE for immutable and append-only) is the caller's
    /// check, as the kernel's VFS makes it before asking ext4.
    ///
    /// # Errors
    /// `ReadOnly`; `Corrupt`.
    pub fn set_flags(&self, ino: u32, flags: u32) -> Result<()> {
        let _lock = self.inode_locks.write(ino as u64);
        self.require_changeable(ino, &*self.inode(ino)?)?;
        let mut tx = self.begin(2)?;
        let mut inode = (*self.inode(ino)?).clone();
        inode.i_flags = (inode.i_flags & !SETTABLE_FLAGS) | (flags & SETTABLE_FLAGS);
        inode.i_ctime = crate::ns::change::now();
        self.write_inode(&mut tx, ino, &inode)?;
        tx.finish()
    }
}
