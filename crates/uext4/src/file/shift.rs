//! fallocate's COLLAPSE_RANGE and INSERT_RANGE on extent-mapped files: a
//! block-aligned range is cut out of the file (what follows moves down, the size
//! shrinks) or opened as a hole (what follows moves up, the size grows), with the
//! kernel's ext4 limits: extent files only (EOPNOTSUPP), offset and length
//! aligned to the block (EINVAL), a collapse ending before the end of file and an
//! insert starting before it (EINVAL), an insert not growing the file past the
//! largest size (EFBIG).
//!
//! Invariant: one handle; the blocks of a collapsed range are freed only once the
//! tree no longer maps them, and the moved extents keep their physical blocks.

use crate::error::{Error, Result};
use crate::format::inode::{EXT4_EXTENTS_FL, EXT4_INLINE_DATA_FL};
use crate::fs::Filesystem;
use crate::ns::change::now;

impl Filesystem {
    /// COLLAPSE_RANGE (`collapse`) or INSERT_RANGE of [offset, offset + len).
    ///
    /// # Errors
    /// `Unsupported` (not an extent file), `Invalid` (unaligned, or the range
    /// against the end of file as above), `FileTooLarge`, `IsADirectory`,
    /// `NoDevice` (not a regular file), `NoSpace` (an insert splitting an extent
    /// needs a tree block), `Corrupt`, `Io`.
    pub(crate) fn shift_range(&self, ino: u32, offset: u64, len: u64, collapse: bool) -> Result<()> {
        let what = if collapse { "COLLAPSE_RANGE" } else { "INSERT_RANGE" };
        if len == 0 {
            return Err(Error::Invalid(format!("{what} of 0 bytes")));
        }
        let _lock = self.inode_locks.write(ino as u64);
        let inode = self.inode(ino)?;
        self.require_changeable(ino, &inode)?;
        if inode.is_dir() {
            return Err(Error::IsADirectory(format!("{what} on directory inode {ino}")));
        }
        if !inode.is_reg() {
            return Err(Error::NoDevice(format!("{what} on inode {ino}, which is not a regular file")));
        }
        if !inode.has_flag(EXT4_EXTENTS_FL) || inode.has_flag(EXT4_INLINE_DATA_FL) {
            return Err(Error::unsupported(format!("{what} on inode {ino}, which is not extent-mapped")));
        }
        let bs = self.vol.geo.block_size as u64;
        if !offset.is_multiple_of(bs) || !len.is_multiple_of(bs) {
            return Err(Error::Invalid(format!("{what} {offset}+{len}: not aligned to the {bs}-byte block")));
        }
        let end = offset.checked_add(len).ok_or_else(|| Error::FileTooLarge(format!("{what} {offset}+{len}")))?;
        if collapse && end >= inode.i_size {
            return Err(Error::Invalid(format!("{what} {offset}+{len} reaches the end of file ({})", inode.i_size)));
        }
        if !collapse && offset >= inode.i_size {
            return Err(Error::Invalid(format!("{what} at {offset}: not before the end of file ({})", inode.i_size)));
        }
        let max = self.max_file_size();
        if !collapse && inode.i_size + len > max {
            return Err(Error::FileTooLarge(format!("{what}: the file would pass the largest size, {max}")));
        }
        let mut tx = self.begin(32)?;
        let mut inode = (*inode).clone();
        let (first, blocks) = (offset / bs, len / bs);
        if collapse {
            self.extent_punch(&mut tx, ino, &mut inode, first, first + blocks)?;
            self.extent_shift(&mut tx, ino, &mut inode, first + blocks, -(blocks as i64))?;
            inode.i_size -= len;
        } else {
            self.extent_shift(&mut tx, ino, &mut inode, first, blocks as i64)?;
            inode.i_size += len;
        }
        let t = now();
        inode.i_mtime = t;
        inode.i_ctime = t;
        self.write_inode(&mut tx, ino, &inode)?;
        tx.finish()
    }
}
