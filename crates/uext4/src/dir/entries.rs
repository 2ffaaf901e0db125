//! Adding and removing names in directory blocks (indexed directories route
//! through `index.rs` to the one leaf a name belongs in).
//!
//! An insert takes the first entry with room to spare after its own name (or an
//! empty one), splitting it; when no block has room, a new block is appended. A
//! removal merges the entry into the one before it in the same block, or empties it
//! when it is first. Each changed block gets its checksum tail recomputed. The
//! caller holds the directory's lock.

use crate::error::{Error, Result};
use crate::extent::MapKind;
use crate::format::bytes::le32;
use crate::format::dirent::{self, DirEntryIter, DIRENT_TAIL_LEN};
use crate::format::inode::{Inode, EXT4_INLINE_DATA_FL};
use crate::fs::Filesystem;
use crate::journal::handle::Handle;

impl Filesystem {
    fn tail_len(&self) -> usize {
        if self.vol.geo.metadata_csum {
            DIRENT_TAIL_LEN
        } else {
            0
        }
    }

    /// Adds `name` -> `ino` to directory `dir`; returns the directory inode as updated
    /// (flags, size and blocks change when it grows). The name must not exist.
    pub(crate) fn add_entry(
        &self,
        tx: &mut Handle,
        dir: u32,
        mut dir_inode: Inode,
        name: &[u8],
        ino: u32,
        file_type: u8,
    ) -> Result<Inode> {
        if dir_inode.has_flag(EXT4_INLINE_DATA_FL)
            && self.add_entry_inline_first(tx, dir, &mut dir_inode, name, ino, file_type)?
        {
            return Ok(dir_inode);
        }
        if self.is_indexed(&dir_inode) {
            return self.dx_add_entry(tx, dir, dir_inode, name, ino, file_type);
        }
        let nblocks = self.dir_blocks(dir, &dir_inode)?;
        for lblk in 0..nblocks {
            if self.insert_in_block(tx, dir, &dir_inode, lblk, name, ino, file_type)? {
                return Ok(dir_inode);
            }
        }
        // As the kernel does: a one-block directory that fills up becomes indexed.
        if nblocks == 1 && self.vol.geo.has_dir_index {
            self.make_indexed(tx, dir, &mut dir_inode)?;
            return self.dx_add_entry(tx, dir, dir_inode, name, ino, file_type);
        }
        let (lblk, _) = self.append_dir_block(tx, dir, &mut dir_inode)?;
        if !self.insert_in_block(tx, dir, &dir_inode, lblk, name, ino, file_type)? {
            return Err(Error::corrupt("a new directory block has no room", format!("directory inode {dir}")));
        }
        Ok(dir_inode)
    }

    /// Whether adding `name` to `dir` would take a new block: false when a block
    /// it may go in has room (an indexed directory's leaf for its hash, any block of
    /// a linear one). Inline directories answer true. Read-only.
    pub(crate) fn entry_needs_block(&self, dir: u32, dir_inode: &Inode, name: &[u8]) -> Result<bool> {
        let _structure = self.dir_structure.read(dir as u64);
        if dir_inode.has_flag(EXT4_INLINE_DATA_FL) {
            return Ok(true);
        }
        let need = dirent::rec_len_for(name.len());
        let blocks = if self.is_indexed(dir_inode) {
            let leaf = self.dx_leaf_for(dir, dir_inode, name)?;
            leaf..leaf + 1
        } else {
            0..self.dir_blocks(dir, dir_inode)?
        };
        for lblk in blocks {
            let buf = self.dir_block(dir, dir_inode, lblk)?;
            if self.slot_for(&buf.read(), dir, lblk, need)?.is_some() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The first entry of a directory block with `need` bytes to spare after its
    /// own name: (offset, rec_len, bytes it uses).
    fn slot_for(&self, data: &[u8], dir: u32, lblk: u64, need: usize) -> Result<Option<(usize, usize, usize)>> {
        let bs = self.vol.geo.block_size;
        let tail = self.tail_len();
        let location = format!("directory inode {dir} block {lblk}");
        for e in
            DirEntryIter::new(&data[..bs - tail], bs, self.vol.geo.has_filetype, self.vol.geo.inodes_count, &location)
        {
            let e = e?;
            let used = if e.inode == 0 { 0 } else { dirent::rec_len_for(e.name.len()) };
            if e.rec_len - used >= need {
                return Ok(Some((e.offset, e.rec_len, used)));
            }
        }
        Ok(None)
    }

    /// Puts the entry into block `lblk` if some entry there has room to spare.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn insert_in_block(
        &self,
        tx: &mut Handle,
        dir: u32,
        dir_inode: &Inode,
        lblk: u64,
        name: &[u8],
        ino: u32,
        file_type: u8,
    ) -> Result<bool> {
        let bs = self.vol.geo.block_size;
        let need = dirent::rec_len_for(name.len());
        // Without `filetype` the type byte is name_len's high byte: always 0, as the
        // kernel's ext4_set_de_type leaves it.
        let file_type = if self.vol.geo.has_filetype { file_type } else { 0 };
        let buf = self.dir_block(dir, dir_inode, lblk)?;
        let mut data = buf.write();
        let Some((off, rec_len, used)) = self.slot_for(&data, dir, lblk, need)? else { return Ok(false) };
        if used > 0 {
            // Shrink the existing entry to its own size and put ours after it.
            data[off + 4..off + 6].copy_from_slice(&dirent::rec_len_to_disk(used, bs).to_le_bytes());
        }
        dirent::write_entry(&mut data, off + used, ino, rec_len - used, file_type, name, bs);
        if self.vol.geo.metadata_csum {
            dirent::set_tail(&mut data, self.inode_seed(dir, dir_inode));
        }
        drop(data);
        tx.dirty(&buf);
        Ok(true)
    }

    /// Appends an empty leaf block to the directory; returns its logical number and buffer.
    pub(crate) fn append_dir_block(
        &self,
        tx: &mut Handle,
        dir: u32,
        dir_inode: &mut Inode,
    ) -> Result<(u64, std::sync::Arc<crate::cache::Buffer>)> {
        let bs = self.vol.geo.block_size;
        let nblocks = self.dir_blocks(dir, dir_inode)?;
        let (pblk, _) = self.alloc.alloc_blocks(tx, self.dir_goal(dir, dir_inode, nblocks)?, 1)?;
        self.vol.cache.classify(pblk, crate::dev::IoClass::Directory);
        let buf = self.vol.cache.get_new(pblk);
        {
            let mut data = buf.write();
            dirent::write_entry(&mut data, 0, 0, bs - self.tail_len(), 0, b"", bs);
            if self.vol.geo.metadata_csum {
                dirent::set_tail(&mut data, self.inode_seed(dir, dir_inode));
            }
        }
        tx.dirty(&buf);
        if let Err(e) = self.extent_append(tx, dir, dir_inode, nblocks, pblk, 1) {
            // The tree is as it was (see extent::write): the block goes back.
            self.alloc.free_blocks_range(tx, pblk, 1)?;
            return Err(e);
        }
        dir_inode.i_size += bs as u64;
        Ok((nblocks, buf))
    }

    /// Where a directory's next block should go: right after its last one.
    fn dir_goal(&self, dir: u32, inode: &Inode, nblocks: u64) -> Result<u64> {
        if nblocks > 0 {
            if let MapKind::Mapped(p) = self.map_blocks(dir, inode, nblocks - 1, 1)?.kind {
                return Ok(p + 1);
            }
        }
        Ok(self.inode_goal(dir, false))
    }

    /// Where an inode's first block goes, by the kernel's rule
    /// (`ext4_inode_to_goal_block`, as under delalloc, without the per-process
    /// colour): with flex groups of at least 4 groups, the first block of the
    /// inode's flex group for directories, symlinks and xattr blocks of
    /// anything but a regular file — beside the flex group's bitmaps and inode
    /// tables, so directories cluster and a tree walk seeks less — and of its
    /// second group for regular files. Without flex_bg, the inode's own group.
    pub(crate) fn inode_goal(&self, ino: u32, regular: bool) -> u64 {
        let geo = &self.vol.geo;
        let mut group = (ino - 1) / geo.inodes_per_group;
        if geo.groups_per_flex >= 4 {
            group &= !(geo.groups_per_flex - 1);
            if regular {
                group += 1;
            }
        }
        self.vol.group_first_block(group.min(geo.group_count - 1))
    }

    /// Removes `name` from `dir`; returns the inode it named. Looks first in
    /// block `hint`, where the caller's lookup found the name
    /// (`lookup_held_at`): in a linear directory, so that remove_tree's scans
    /// of thousands of blocks are not quadratic; in an indexed one, to spare a
    /// second walk of the index and a second search of the leaf. A name is in
    /// one place only, so finding it in `hint` settles it; a split since the
    /// lookup may have moved it, and then the index is walked. Leaves stay
    /// leaves; only block 0 changes role (a linear directory's one block
    /// becomes the htree root), so an indexed directory never takes hint 0.
    pub(crate) fn remove_entry_near(
        &self,
        tx: &mut Handle,
        dir: u32,
        dir_inode: &Inode,
        name: &[u8],
        hint: Option<u64>,
    ) -> Result<u32> {
        if dir_inode.has_flag(EXT4_INLINE_DATA_FL) {
            let mut changed = dir_inode.clone();
            let ino = self.inline_remove_entry(dir, &mut changed, name)?;
            self.write_inode(tx, dir, &changed)?;
            return Ok(ino);
        }
        let nblocks = self.dir_blocks(dir, dir_inode)?;
        let hint = hint.filter(|&h| h < nblocks);
        if self.is_indexed(dir_inode) {
            // Block 0 is the root now, though it may have been the one block of
            // a linear directory when the lookup found the name there (a rename
            // whose new name turned the directory into an htree).
            let leaf_hint = hint.filter(|&h| h != 0);
            if let Some(ino) =
                leaf_hint.map(|leaf| self.remove_in_block(tx, dir, dir_inode, leaf, name)).transpose()?.flatten()
            {
                return Ok(ino);
            }
            if let Some((_, leaf)) = self.htree_lookup(dir, dir_inode, name)? {
                if let Some(ino) = self.remove_in_block(tx, dir, dir_inode, leaf, name)? {
                    return Ok(ino);
                }
            }
        } else {
            for lblk in Self::linear_order(nblocks, hint) {
                if let Some(ino) = self.remove_in_block(tx, dir, dir_inode, lblk, name)? {
                    return Ok(ino);
                }
            }
        }
        Err(Error::NotFound(String::from_utf8_lossy(name).into_owned()))
    }

    /// Removes `name` from block `lblk` if it is there (merging its record into
    /// the one before it, or clearing its inode when it is the block's first);
    /// returns the inode it named.
    fn remove_in_block(
        &self,
        tx: &mut Handle,
        dir: u32,
        dir_inode: &Inode,
        lblk: u64,
        name: &[u8],
    ) -> Result<Option<u32>> {
        let bs = self.vol.geo.block_size;
        let tail = self.tail_len();
        let buf = self.dir_block(dir, dir_inode, lblk)?;
        let mut data = buf.write();
        let location = format!("directory inode {dir} block {lblk}");
        let mut prev: Option<(usize, usize)> = None;
        let mut found = None;
        for e in
            DirEntryIter::new(&data[..bs - tail], bs, self.vol.geo.has_filetype, self.vol.geo.inodes_count, &location)
        {
            let e = e?;
            if e.inode != 0 && e.name == name {
                found = Some((e.offset, e.rec_len, e.inode, prev));
                break;
            }
            prev = Some((e.offset, e.rec_len));
        }
        let Some((off, rec_len, ino, prev)) = found else { return Ok(None) };
        match prev {
            Some((poff, prec)) => {
                let merged = dirent::rec_len_to_disk(prec + rec_len, bs);
                data[poff + 4..poff + 6].copy_from_slice(&merged.to_le_bytes());
            }
            None => data[off..off + 4].copy_from_slice(&0u32.to_le_bytes()),
        }
        debug_assert_eq!(le32(&data, off), if prev.is_none() { 0 } else { ino });
        if self.vol.geo.metadata_csum {
            dirent::set_tail(&mut data, self.inode_seed(dir, dir_inode));
        }
        drop(data);
        tx.dirty(&buf);
        Ok(Some(ino))
    }
}

impl Filesystem {
    /// Points the existing entry `name` in `dir` at `ino` (with its file type), in place.
    pub(crate) fn retarget_entry(
        &self,
        tx: &mut Handle,
        dir: u32,
        dir_inode: &Inode,
        name: &[u8],
        ino: u32,
        file_type: u8,
    ) -> Result<()> {
        if dir_inode.has_flag(EXT4_INLINE_DATA_FL) {
            let mut changed = dir_inode.clone();
            self.inline_retarget_entry(dir, &mut changed, name, ino, file_type)?;
            return self.write_inode(tx, dir, &changed);
        }
        let blocks: Vec<u64> = if self.is_indexed(dir_inode) {
            self.htree_lookup(dir, dir_inode, name)?.map(|(_, leaf)| vec![leaf]).unwrap_or_default()
        } else {
            (0..self.dir_blocks(dir, dir_inode)?).collect()
        };
        let bs = self.vol.geo.block_size;
        let tail = self.tail_len();
        for lblk in blocks {
            let buf = self.dir_block(dir, dir_inode, lblk)?;
            let mut data = buf.write();
            let location = format!("directory inode {dir} block {lblk}");
            let found = DirEntryIter::new(
                &data[..bs - tail],
                bs,
                self.vol.geo.has_filetype,
                self.vol.geo.inodes_count,
                &location,
            )
            .find_map(|e| match e {
                Ok(e) if e.inode != 0 && e.name == name => Some(Ok(e.offset)),
                Ok(_) => None,
                Err(err) => Some(Err(err)),
            })
            .transpose()?;
            let Some(off) = found else { continue };
            data[off..off + 4].copy_from_slice(&ino.to_le_bytes());
            if self.vol.geo.has_filetype {
                data[off + 7] = file_type;
            }
            if self.vol.geo.metadata_csum {
                dirent::set_tail(&mut data, self.inode_seed(dir, dir_inode));
            }
            drop(data);
            tx.dirty(&buf);
            return Ok(());
        }
        Err(Error::NotFound(String::from_utf8_lossy(name).into_owned()))
    }

    /// Rewrites a directory's ".." to `parent` (block 0, offset 12, in linear and
    /// indexed directories alike; in an inline directory, the parent number at the
    /// start of i_block, changed in `dir_inode`, which the caller writes).
    pub(crate) fn set_dotdot(&self, tx: &mut Handle, dir: u32, dir_inode: &mut Inode, parent: u32) -> Result<()> {
        if dir_inode.has_flag(EXT4_INLINE_DATA_FL) {
            return self.inline_set_parent(dir, dir_inode, parent);
        }
        let buf = self.dir_block(dir, dir_inode, 0)?;
        {
            let mut data = buf.write();
            if data[12 + 6] != 2 || &data[12 + 8..12 + 10] != b".." {
                return Err(Error::corrupt("second entry of block 0 is not '..'", format!("directory inode {dir}")));
            }
            data[12..16].copy_from_slice(&parent.to_le_bytes());
            if self.vol.geo.metadata_csum {
                let seed = self.inode_seed(dir, dir_inode);
                if self.is_indexed(dir_inode) {
                    crate::format::htree::set_checksum(&mut data, super::DX_ROOT_COUNTLIMIT_OFFSET, seed)?;
                } else {
                    dirent::set_tail(&mut data, seed);
                }
            }
        }
        tx.dirty(&buf);
        Ok(())
    }
}
