//! The inode table as the layers above see it: inodes parsed, their checksums
//! verified and their size checked against the largest file once, then served
//! from a bounded, sharded cache, and written back to their table slots under
//! a handle.
//!
//! Invariants: the cached copy of an inode is never older than its table slot
//! (a reader caches its parse while still holding the block's read lock, and
//! `write_inode` replaces the cached copy after writing the slot). An inode
//! without links may be on the orphan chain, whose link lives in its i_dtime:
//! `write_inode` stamps it from the chain (ns/orphan.rs).

use crate::error::{Error, Result};
use crate::format::group_desc::{GdCsum, EXT4_BG_INODE_UNINIT};
use crate::format::inode::Inode;
use crate::fs::{Filesystem, INODE_CACHE_SHARDS};
use crate::journal::handle::Handle;
use std::sync::Arc;

impl Filesystem {
    #[doc(hidden)]
    /// The inode, parsed and checksum-verified once, then cached.
    pub fn inode(&self, ino: u32) -> Result<Arc<Inode>> {
        if ino == 0 || ino > self.vol.geo.inodes_count {
            return Err(Error::corrupt(
                format!("inode number {ino} is out of range 1..={}", self.vol.geo.inodes_count),
                "inode reference",
            ));
        }
        let shard = &self.inode_cache[crate::number_map::shard_of(ino as u64, INODE_CACHE_SHARDS)];
        if let Some(i) = shard.lock().get(&ino) {
            return Ok(i.clone());
        }
        self.read_inode_from_table(ino)
    }

    /// Makes `inode` the cached copy of `ino` (after a write).
    pub(crate) fn cache_inode(&self, ino: u32, inode: Inode) -> Arc<Inode> {
        let inode = Arc::new(inode);
        let mut s = self.inode_cache[crate::number_map::shard_of(ino as u64, INODE_CACHE_SHARDS)].lock();
        if s.len() >= self.inode_cache_shard_capacity {
            // Crude but bounded: drop the shard; parsed inodes are cheap to rebuild
            // from the buffer cache, which keeps their table blocks.
            s.clear();
        }
        s.insert(ino, inode.clone());
        inode
    }

    /// Parses an inode from its table block and caches it while still holding the
    /// block's read lock, so a concurrent write_inode (which needs the write lock)
    /// cannot have its newer copy replaced by this older one.
    fn read_inode_from_table(&self, ino: u32) -> Result<Arc<Inode>> {
        let group = (ino - 1) / self.vol.geo.inodes_per_group;
        let index = (ino - 1) % self.vol.geo.inodes_per_group;
        let gd = self.vol.groups[group as usize].read().clone();
        if gd.bg_flags & EXT4_BG_INODE_UNINIT != 0 && self.vol.geo.gd_csum != GdCsum::None {
            return Err(Error::corrupt(
                format!("inode {ino} lies in uninitialized group {group}"),
                format!("inode {ino}"),
            ));
        }
        let byte = index as u64 * self.vol.geo.inode_size as u64;
        let block = gd.bg_inode_table + byte / self.vol.geo.block_size as u64;
        let off = (byte % self.vol.geo.block_size as u64) as usize;
        let buf = self.vol.inode_table_block(&gd, index).map_err(|e| {
            self.vol.read_error(
                e,
                "read_inode_from_table",
                &format!("reading the inode table block of inode {ino}"),
                ino,
                block,
            )
        })?;
        let data = buf.read();
        let slot = &data[off..off + self.vol.geo.inode_size];
        let inode = Inode::parse(slot).map_err(|e| match e {
            Error::Corrupt { what, .. } => Error::corrupt(what, format!("inode {ino}")),
            e => e,
        })?;
        if self.vol.geo.metadata_csum && self.vol.geo.verify_checksums {
            inode.verify_checksum(ino, self.vol.geo.csum_seed)?;
        }
        // As the kernel's ext4_iget ("bad i_size value"): a size past what the
        // inode's mapping can reach is damage, and walking to it would never end.
        if inode.i_mode != 0 {
            let limit = match inode.has_flag(crate::format::inode::EXT4_EXTENTS_FL) {
                true => self.max_file_size(),
                false => self.max_block_mapped_size().max(self.max_file_size()),
            };
            if inode.i_size > limit {
                return Err(Error::corrupt(
                    format!("i_size {} is past the largest file size, {limit}", inode.i_size),
                    format!("inode {ino}"),
                ));
            }
        }
        Ok(self.cache_inode(ino, inode))
    }

    /// A zeroed buffer for the inode-table block holding slot `index` of
    /// `group`, when the block is not cached and every other inode in it is
    /// free: nothing in it needs reading, as the kernel's __ext4_get_inode_loc
    /// skips the read then. A new directory in its own window (dir_ireserve)
    /// would otherwise read a block per mkdir. The group lock keeps the bitmap
    /// still while it is checked and the block made: an inode allocated in the
    /// block meanwhile is written into this buffer, never over it.
    fn inode_block_unread(&self, group: u32, index: u32, block: u64) -> Result<Option<Arc<crate::cache::Buffer>>> {
        if self.vol.cache.holds(block) {
            return Ok(None);
        }
        let gd = self.vol.groups[group as usize].read();
        if gd.bg_flags & EXT4_BG_INODE_UNINIT != 0 || !self.vol.cache.holds(gd.bg_inode_bitmap) {
            return Ok(None);
        }
        let bitmap = self.vol.cache.get(gd.bg_inode_bitmap)?;
        let others_free = self.vol.geo.inode_block_others_free(&bitmap.read(), index);
        if !others_free || self.vol.cache.holds(block) {
            return Ok(None);
        }
        Ok(Some(self.vol.cache.get_new(block)))
    }

    /// Per-inode checksum seed for its extent, directory and htree blocks.
    pub(crate) fn inode_seed(&self, ino: u32, inode: &Inode) -> u32 {
        crate::format::inode::inode_csum_seed(self.vol.geo.csum_seed, ino, inode.i_generation)
    }

    #[doc(hidden)]
    /// Writes `inode` to its slot in the inode table and makes it the cached copy.
    /// An inode without links may be on the orphan chain, whose link lives in its
    /// i_dtime: that is stamped from the chain, under the orphans lock, so a
    /// caller's older copy cannot undo a chain change (see ns/orphan.rs).
    pub fn write_inode(&self, tx: &mut Handle, ino: u32, inode: &Inode) -> Result<()> {
        if inode.i_links_count == 0 {
            let orphans = self.orphans.lock();
            if let Some(next) = orphans.chain_next(ino) {
                let mut on_chain = inode.clone();
                on_chain.i_dtime = next;
                return self.write_inode_slot(tx, ino, &on_chain);
            }
        }
        self.write_inode_slot(tx, ino, inode)
    }

    /// `write_inode` without the orphan chain's stamp (for callers holding the
    /// orphans lock).
    pub(crate) fn write_inode_slot(&self, tx: &mut Handle, ino: u32, inode: &Inode) -> Result<()> {
        tx.note_inode(ino);
        let group = (ino - 1) / self.vol.geo.inodes_per_group;
        let index = (ino - 1) % self.vol.geo.inodes_per_group;
        let gd = self.vol.groups[group as usize].read().clone();
        let table = gd.bg_inode_table;
        let byte = index as u64 * self.vol.geo.inode_size as u64;
        let block = table + byte / self.vol.geo.block_size as u64;
        let off = (byte % self.vol.geo.block_size as u64) as usize;
        let seed = if self.vol.geo.metadata_csum { Some(self.vol.geo.csum_seed) } else { None };
        let raw = inode.to_bytes(ino, seed);
        let buf = match self.vol.cache.cached(block) {
            Some(hit) => hit,
            None => match self.inode_block_unread(group, index, block)? {
                Some(fresh) => fresh,
                None => self.vol.inode_table_block(&gd, index)?,
            },
        };
        buf.write()[off..off + raw.len()].copy_from_slice(&raw);
        tx.dirty(&buf);
        self.cache_inode(ino, Inode::parse(&raw)?);
        Ok(())
    }
}
