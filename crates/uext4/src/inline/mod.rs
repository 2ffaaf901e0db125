//! Inline data (seed 004): a small file's or directory's bytes kept in the inode —
//! the first 60 in i_block, the rest in the value of the `system.data` xattr in
//! the inode body, laid out as the kernel's `fs/ext4/inline.c` lays them out.
//!
//! This module holds what files and directories share: reading the inline bytes,
//! the capacity (the kernel's `ext4_get_max_inline_size`), storing bytes back into
//! the inode, and `uninline`, the move to a block (`ext4_convert_inline_data`),
//! always inside the caller's handle so that a conversion is one transaction.
//! `file.rs` has regular files (writes and truncates in place), `dir.rs`
//! directories (creation, names added, removed and repointed in place).
//!
//! Invariants: an inode with EXT4_INLINE_DATA_FL has a `system.data` attribute in
//! its body (empty when everything fits i_block) and no extent or block map;
//! `system.data`'s e_hash is 0, as the kernel writes it (a hash would go stale
//! when the kernel later changes the value in place, and e2fsck then aborts).
//! Symlinks: the kernel (6.18) never creates inline symlinks — targets of 60 bytes
//! or more get a block — so neither does uext4; e2fsprogs' inline symlinks are read
//! (`file::read`) and left as they are.

mod dir;
mod file;

use crate::error::{Error, Result};
use crate::format::inode::{Inode, EXT4_EXTENTS_FL, EXT4_INLINE_DATA_FL};
use crate::format::xattr::{self, INDEX_SYSTEM};
use crate::fs::Filesystem;
use crate::journal::handle::Handle;

/// The part of the inline bytes kept in i_block (EXT4_MIN_INLINE_DATA_SIZE).
pub const EXT4_MIN_INLINE_DATA_SIZE: usize = 60;

/// The name suffix of the attribute holding the rest ("system.data").
const DATA_NAME: &[u8] = b"data";

fn is_data(index: u8, name: &[u8]) -> bool {
    index == INDEX_SYSTEM && name == DATA_NAME
}

impl Filesystem {
    #[doc(hidden)]
    /// The inline bytes: i_block followed by the system.data value, as stored.
    pub fn inline_data(&self, ino: u32, inode: &Inode) -> Result<Vec<u8>> {
        let mut data = inode.i_block.to_vec();
        let attrs = xattr::parse_ibody(inode.xattr_area(), ino)?;
        match attrs.into_iter().find(|(e, _)| is_data(e.e_name_index, &e.name)) {
            Some((_, value)) => data.extend_from_slice(&value),
            None => {
                return Err(Error::corrupt("inline inode has no system.data attribute", format!("inode {ino}")));
            }
        }
        let capacity = self.max_inline_size(ino, inode)?;
        if data.len() > capacity {
            return Err(Error::corrupt(
                format!("system.data of {} bytes is longer than the inode body holds", data.len() - 60),
                format!("inode {ino}"),
            ));
        }
        // An i_size past the inline bytes, even past the capacity, is not damage:
        // the kernel makes such files (a file truncated up before its first
        // write, which then goes inline) and e2fsck accepts them; the rest reads
        // as zeros. Directories are held to their inline size (inline/dir.rs).
        Ok(data)
    }

    #[doc(hidden)]
    /// The most bytes this inode can hold inline (the kernel's
    /// `ext4_get_max_inline_size`): 60 in i_block plus the largest system.data value
    /// its body can take beside its other attributes (its own value counts as free).
    /// 0 when the body cannot hold the attribute at all (128-byte inodes).
    pub fn max_inline_size(&self, ino: u32, inode: &Inode) -> Result<usize> {
        let area = inode.xattr_area();
        if area.len() < 4 {
            return Ok(0);
        }
        let region = area.len() - 4;
        let attrs = xattr::parse_ibody(area, ino)?;
        let mut used = 4; // the list's terminating zero word
        let mut own = None;
        for (e, v) in &attrs {
            if is_data(e.e_name_index, &e.name) {
                own = Some(v.len());
            }
            used += xattr::entry_len(e.name.len()) + if v.is_empty() { 0 } else { xattr::value_len(v.len()) };
        }
        let Some(free) = region.checked_sub(used) else { return Ok(0) };
        Ok(match own {
            Some(len) => free + xattr::value_len(len) + EXT4_MIN_INLINE_DATA_SIZE,
            None => match free.checked_sub(xattr::entry_len(DATA_NAME.len())) {
                Some(free) => (free & !3) + EXT4_MIN_INLINE_DATA_SIZE,
                None => 0,
            },
        })
    }

    /// Stores `bytes` as the inode's inline data: the first 60 in i_block (zero
    /// padded), the rest as the system.data value; the inode's other in-body
    /// attributes stay. Sets the inline flag (clearing the extent flag, as the
    /// kernel's `ext4_create_inline_data`). The caller has checked the bytes fit.
    pub(crate) fn store_inline(&self, ino: u32, inode: &mut Inode, bytes: &[u8]) -> Result<()> {
        let (head, value) = bytes.split_at(bytes.len().min(EXT4_MIN_INLINE_DATA_SIZE));
        if bytes.len() > self.max_inline_size(ino, inode)? {
            return Err(Error::corrupt("inline data larger than the inode holds", format!("inode {ino}")));
        }
        let mut attrs: Vec<(u8, Vec<u8>, Vec<u8>)> = vec![(INDEX_SYSTEM, DATA_NAME.to_vec(), value.to_vec())];
        for (e, v) in xattr::parse_ibody(inode.xattr_area(), ino)? {
            if !is_data(e.e_name_index, &e.name) {
                attrs.push((e.e_name_index, e.name, v));
            }
        }
        let area = crate::xattr::ibody_area(inode.xattr_area().len(), &attrs);
        inode.set_xattr_area(&area);
        inode.i_block = [0; 60];
        inode.i_block[..head.len()].copy_from_slice(head);
        inode.i_flags = (inode.i_flags & !EXT4_EXTENTS_FL) | EXT4_INLINE_DATA_FL;
        Ok(())
    }

    /// Whether new inodes may be inline here: the feature, the tunable, and a
    /// body with room for system.data.
    pub(crate) fn inline_allowed(&self, ino: u32, inode: &Inode) -> Result<bool> {
        Ok(self.inline_on && self.max_inline_size(ino, inode)? >= EXT4_MIN_INLINE_DATA_SIZE)
    }
}

impl Filesystem {
    /// Moves an inline file's or directory's contents into a block, as the kernel's
    /// `ext4_convert_inline_data_nolock` does when inline space runs out: afterwards
    /// the ordinary block paths apply. The system.data attribute goes and the inline
    /// flag is cleared. The caller holds the inode's lock (or owns the inode), and a
    /// directory's structure lock for writing. A no-op for other inodes.
    pub(crate) fn uninline(&self, tx: &mut Handle, ino: u32) -> Result<()> {
        let mut inode = (*self.inode(ino)?).clone();
        if !inode.has_flag(EXT4_INLINE_DATA_FL) || inode.is_symlink() {
            return Ok(());
        }
        let bs = self.vol.geo.block_size;
        let data = self.inline_data(ino, &inode)?;
        let (block, size) = if inode.is_dir() {
            (self.inline_dir_block(ino, &inode, &data)?, bs as u64)
        } else {
            let mut block = vec![0u8; bs];
            let n = (inode.i_size as usize).min(data.len()).min(bs);
            block[..n].copy_from_slice(&data[..n]);
            (block, inode.i_size)
        };
        self.may_inline_forget(ino);
        // Drop system.data from the inode body, keeping the other attributes there.
        let kept: Vec<(u8, Vec<u8>, Vec<u8>)> = xattr::parse_ibody(inode.xattr_area(), ino)?
            .into_iter()
            .filter(|(e, _)| !is_data(e.e_name_index, &e.name))
            .map(|(e, v)| (e.e_name_index, e.name, v))
            .collect();
        let area = crate::xattr::ibody_area(inode.xattr_area().len(), &kept);
        inode.set_xattr_area(&area);
        // As the kernel's ext4_destroy_inline_data: an extent root where the
        // filesystem has extents, else an empty block map.
        inode.i_flags &= !EXT4_INLINE_DATA_FL;
        inode.i_block = [0; 60];
        if self.vol.geo.has_extents {
            inode.i_flags |= EXT4_EXTENTS_FL;
            inode.i_block = Self::empty_extent_root();
        }
        if size > 0 {
            let _space = self.alloc.ensure_space(8)?;
            let (blk, _) = self.alloc.alloc_blocks(tx, self.inode_goal(ino, inode.is_reg()), 1)?;
            if inode.is_dir() {
                self.vol.cache.classify(blk, crate::dev::IoClass::Directory);
                let buf = self.vol.cache.get_new(blk);
                buf.write().copy_from_slice(&block);
                tx.dirty(&buf);
            } else {
                self.vol.cache.write_data_at(blk * bs as u64, &block)?;
            }
            self.extent_append(tx, ino, &mut inode, 0, blk, 1)?;
        }
        inode.i_size = size;
        self.write_inode(tx, ino, &inode)
    }
}
