//! Inline regular files, as the kernel keeps them. A new file is an ordinary empty
//! file that may become inline (the kernel's in-memory EXT4_STATE_MAY_INLINE_DATA,
//! here `Filesystem::may_inline`); its first write makes it inline when the write
//! ends within the capacity (`ext4_try_to_write_inline_data`), and the state goes
//! either way. An inline file stays inline through writes, appends and overwrites
//! that end within the capacity (the system.data value grows to the write's end,
//! never shrinks on a write), through truncates down (the value is cut to the new
//! size and i_block zeroed past it, `ext4_inline_data_truncate`) and truncates up
//! that stay within its current inline size; anything else (a write ending past
//! the capacity, a truncate up past the inline size, fallocate, punch) moves it to
//! a block first, in the caller's handle (`uninline`). The caller holds the file's
//! inode lock exclusive.

use super::EXT4_MIN_INLINE_DATA_SIZE;
use crate::error::Result;
use crate::format::inode::{Inode, EXT4_INLINE_DATA_FL};
use crate::fs::Filesystem;

impl Filesystem {
    /// A new regular file may become inline at its first write.
    pub(crate) fn may_inline_mark(&self, ino: u32) {
        if self.inline_on {
            self.may_inline.shard(ino).insert(ino, ());
        }
    }

    /// The file will not become inline (written, converted, released).
    pub(crate) fn may_inline_forget(&self, ino: u32) {
        if self.inline_on {
            self.may_inline.shard(ino).remove(&ino);
        }
    }

    /// Writes `data` at `offset` into the inode itself when the file is inline, or
    /// may become so, and the write ends within the capacity; `inode` is changed in
    /// place (data, flags, size; the caller stamps times and writes it). False when
    /// the file is (or must become) a block file.
    pub(crate) fn write_inline(&self, ino: u32, inode: &mut Inode, offset: u64, data: &[u8]) -> Result<bool> {
        let inline = inode.has_flag(EXT4_INLINE_DATA_FL);
        if !inline {
            if data.is_empty() {
                return Ok(false);
            }
            let first_write = self.inline_on && self.may_inline.shard(ino).remove(&ino).is_some();
            // Blocks already (fallocate with KEEP_SIZE) or an xattr block: the
            // first write goes to blocks. A size set by a truncate before the first
            // write does not stop it, as in the kernel (i_size may then stay past
            // the inline bytes, even past the capacity; the rest reads as zeros).
            if !first_write || inode.i_blocks != 0 || !self.inline_allowed(ino, inode)? {
                return Ok(false);
            }
        }
        let end = offset.saturating_add(data.len() as u64);
        let capacity = self.max_inline_size(ino, inode)? as u64;
        if end > capacity {
            return Ok(false);
        }
        let mut bytes = if inline { self.inline_data(ino, inode)? } else { vec![0u8; EXT4_MIN_INLINE_DATA_SIZE] };
        let end = end as usize;
        if bytes.len() < end {
            bytes.resize(end, 0);
        }
        bytes[offset as usize..end].copy_from_slice(data);
        self.store_inline(ino, inode, &bytes)?;
        inode.i_size = inode.i_size.max(end as u64);
        Ok(true)
    }

    /// Sets an inline file's size in place when it stays inline (down, or up within
    /// its inline size); false when it must move to a block first (or is not inline).
    pub(crate) fn truncate_inline(&self, ino: u32, inode: &mut Inode, size: u64) -> Result<bool> {
        if !inode.has_flag(EXT4_INLINE_DATA_FL) {
            return Ok(false);
        }
        let mut bytes = self.inline_data(ino, inode)?;
        if size > bytes.len() as u64 {
            return Ok(false);
        }
        let size = size as usize;
        if size < bytes.len() {
            bytes.truncate(size.max(EXT4_MIN_INLINE_DATA_SIZE));
            if size < EXT4_MIN_INLINE_DATA_SIZE {
                bytes[size..].fill(0);
            }
            self.store_inline(ino, inode, &bytes)?;
        }
        inode.i_size = size as u64;
        Ok(true)
    }
}
