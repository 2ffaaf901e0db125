//! Inline data: a small file's or directory's bytes kept in the inode — the first 60
//! in i_block, the rest in the value of the `system.data` xattr in the inode body.
//! An inline directory's i_block starts with the parent's inode number (the
//! implicit ".."), followed by entries; "." is implicit too.

use crate::error::{Error, Result};
use crate::format::inode::Inode;
use crate::format::xattr::{self, INDEX_SYSTEM};
use crate::fs::Filesystem;

impl Filesystem {
    #[doc(hidden)]
    /// The inline bytes: i_block followed by the system.data value, as stored.
    pub fn inline_data(&self, ino: u32, inode: &Inode) -> Result<Vec<u8>> {
        let mut data = inode.i_block.to_vec();
        let attrs = xattr::parse_ibody(inode.xattr_area(), ino)?;
        let found = attrs.into_iter().find(|(e, _)| e.e_name_index == INDEX_SYSTEM && e.name == b"data");
        match found {
            Some((_, value)) => data.extend_from_slice(&value),
            None => {
                return Err(Error::corrupt("inline inode has no system.data attribute", format!("inode {ino}")));
            }
        }
        Ok(data)
    }
}

impl Filesystem {
    /// Moves an inline file's or directory's contents into a block, as the kernel does
    /// when inline space runs out: afterwards the ordinary block paths apply. The
    /// system.data attribute goes and the inline flag is cleared. The caller holds
    /// the inode's lock (or owns the inode), and a directory's structure lock for writing.
    pub(crate) fn uninline(&self, tx: &mut crate::journal::handle::Handle, ino: u32) -> Result<()> {
        use crate::format::dirent::{self, EXT4_FT_DIR};
        use crate::format::inode::{EXT4_EXTENTS_FL, EXT4_INLINE_DATA_FL};
        let mut inode = (*self.inode(ino)?).clone();
        if !inode.has_flag(EXT4_INLINE_DATA_FL) || inode.is_symlink() {
            return Ok(());
        }
        let bs = self.vol.geo.block_size;
        let mut block = vec![0u8; bs];
        let size = if inode.is_dir() {
            let entries = self.read_dir_locked(ino)?;
            let tail = if self.vol.geo.metadata_csum { dirent::DIRENT_TAIL_LEN } else { 0 };
            let ft = if self.vol.geo.has_filetype { EXT4_FT_DIR } else { 0 };
            let mut off = 0;
            for (i, e) in entries.iter().enumerate() {
                let len = if i + 1 == entries.len() { bs - tail - off } else { dirent::rec_len_for(e.name.len()) };
                let file_type = if i < 2 { ft } else { e.file_type };
                dirent::write_entry(&mut block, off, e.ino, len, file_type, &e.name, bs);
                off += len;
            }
            if self.vol.geo.metadata_csum {
                dirent::set_tail(&mut block, self.inode_seed(ino, &inode));
            }
            bs as u64
        } else {
            let data = self.inline_data(ino, &inode)?;
            let n = (inode.i_size as usize).min(data.len()).min(bs);
            block[..n].copy_from_slice(&data[..n]);
            inode.i_size
        };
        // Drop system.data from the inode body, keeping the other attributes there.
        let kept: Vec<_> = xattr::parse_ibody(inode.xattr_area(), ino)?
            .into_iter()
            .filter(|(e, _)| !(e.e_name_index == INDEX_SYSTEM && e.name == b"data"))
            .collect();
        let kept: Vec<(u8, Vec<u8>, Vec<u8>)> = kept.into_iter().map(|(e, v)| (e.e_name_index, e.name, v)).collect();
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
            let (blk, _) = self.alloc.alloc_blocks(tx, self.inode_goal(ino), 1)?;
            if inode.is_dir() {
                self.vol.cache.classify(blk, crate::dev::IoClass::Directory);
                let buf = self.vol.cache.get_new(blk);
                buf.write().copy_from_slice(&block);
                tx.dirty(&buf);
            } else {
                self.vol.cache.device().write_at(blk * bs as u64, &block)?;
            }
            self.extent_append(tx, ino, &mut inode, 0, blk, 1)?;
        }
        inode.i_size = size;
        self.write_inode(tx, ino, &inode)
    }
}
