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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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

    /// Inode-table blocks read ahead together, aligned on their multiple.
    const INODE_READ_AHEAD_BLOCKS: u64 = 32;

    /// On a miss for `ino`'s inode-table block, reads the aligned run of
    /// `INODE_READ_AHEAD_BLOCKS` around it (within its group's table) in one
    /// request, for a caller that will use the run whole (remove_tree's
    /// windows); the read starts a walk in `table_walks`. A miss that continues
    /// a walk reads ahead the same way (`read_inode_from_table`).
    /// Only a hint: errors are left for the read that needs the block.
    pub(crate) fn read_ahead_inode(&self, ino: u32) {
        if let Some(end) = self.read_ahead_inode_run(ino) {
            self.table_walks.read_ended(None, end);
        }
    }

    /// `read_ahead_inode`'s work; returns the block just past the run read.
    fn read_ahead_inode_run(&self, ino: u32) -> Option<u64> {
        if ino == 0 || ino > self.vol.geo.inodes_count {
            return None;
        }
        let group = (ino - 1) / self.vol.geo.inodes_per_group;
        let index = (ino - 1) % self.vol.geo.inodes_per_group;
        let gd = self.vol.groups[group as usize].read().clone();
        if gd.bg_flags & EXT4_BG_INODE_UNINIT != 0 && self.vol.geo.gd_csum != GdCsum::None {
            return None;
        }
        let bs = self.vol.geo.block_size as u64;
        let table_blocks = (self.vol.geo.inodes_per_group as u64 * self.vol.geo.inode_size as u64).div_ceil(bs);
        let rel = index as u64 * self.vol.geo.inode_size as u64 / bs;
        if self.vol.cache.holds(gd.bg_inode_table + rel) {
            return None;
        }
        let first = rel / Self::INODE_READ_AHEAD_BLOCKS * Self::INODE_READ_AHEAD_BLOCKS;
        let count = Self::INODE_READ_AHEAD_BLOCKS.min(table_blocks - first);
        self.vol.cache.read_ahead(gd.bg_inode_table + first, count as usize).ok()?;
        Some(gd.bg_inode_table + first + count)
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
        if !self.vol.cache.holds(block) {
            // A miss where an earlier read ended is a walk in table order
            // (unlinking names sorted by inode, as GNU rm does for big
            // directories; a hash-order walk of a hash_goal directory, one walk
            // per window): read the rest of the run in one request, as the
            // kernel's inode_readahead_blks does. Random misses read one block.
            if self.table_walks.continues(block) {
                if let Some(end) = self.read_ahead_inode_run(ino) {
                    self.table_walks.read_ended(Some(block), end);
                }
            }
        }
        let buf = self.vol.cache.get(block).map_err(|e| {
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
        let per_block = (self.vol.geo.block_size / self.vol.geo.inode_size) as u32;
        let first = index / per_block * per_block;
        let bitmap = self.vol.cache.get(gd.bg_inode_bitmap)?;
        let others_free = {
            let bits = bitmap.read();
            (first..(first + per_block).min(self.vol.geo.inodes_per_group))
                .all(|i| i == index || !crate::format::bitmap::test_bit(&bits, i as usize))
        };
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
        let table = self.vol.groups[group as usize].read().bg_inode_table;
        let byte = index as u64 * self.vol.geo.inode_size as u64;
        let block = table + byte / self.vol.geo.block_size as u64;
        let off = (byte % self.vol.geo.block_size as u64) as usize;
        let seed = if self.vol.geo.metadata_csum { Some(self.vol.geo.csum_seed) } else { None };
        let raw = inode.to_bytes(ino, seed);
        let buf = match self.inode_block_unread(group, index, block)? {
            Some(fresh) => fresh,
            None => self.vol.cache.get(block)?,
        };
        buf.write()[off..off + raw.len()].copy_from_slice(&raw);
        tx.dirty(&buf);
        self.cache_inode(ino, Inode::parse(&raw)?);
        Ok(())
    }
}

/// How many walks in inode-table order `TableWalks` follows at once.
const TABLE_WALKS: usize = 8;

/// A walk's mark in `TableWalks::ends`: seen twice in a row, so reads ahead.
const CONFIRMED: u64 = 1 << 63;

/// Where the last few inode-table reads ended, so that a miss at one of those
/// blocks is seen as a walk in table order going on. Several at once: a
/// `hash_goal` directory that outgrew its first span is walked in hash order
/// as one ascending run of inode numbers per span, interleaved; other threads
/// walk tables of their own. Slots are reused in turn, so a walk that stopped
/// is forgotten after eight misses elsewhere. A walk reads ahead from its
/// third miss in a row on: with eight ends kept, a single match would send
/// about one random miss in 60 of a 500-block table into a 32-block read.
/// Only a hint: racing updates may lose a walk, which then costs one-block
/// reads until it is seen again.
pub(crate) struct TableWalks {
    /// The block just past a walk's last read, with `CONFIRMED` once it has
    /// gone on for two misses; u64::MAX for none.
    ends: [AtomicU64; TABLE_WALKS],
    next: AtomicUsize,
}

impl TableWalks {
    pub(crate) fn new() -> TableWalks {
        TableWalks { ends: std::array::from_fn(|_| AtomicU64::new(u64::MAX)), next: AtomicUsize::new(0) }
    }

    /// Records a miss at `block`; true when it goes on with a confirmed walk,
    /// whose read ahead the caller then makes (and reports, `read_ended`).
    fn continues(&self, block: u64) -> bool {
        let after = block.saturating_add(1) & !CONFIRMED;
        let swap = |e: &AtomicU64, from: u64, to: u64| {
            e.compare_exchange(from, to, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        };
        if self.ends.iter().any(|e| swap(e, block | CONFIRMED, after | CONFIRMED)) {
            return true;
        }
        if !self.ends.iter().any(|e| swap(e, block, after | CONFIRMED)) {
            self.replace_oldest(after);
        }
        false
    }

    /// A read ended at `end`; `miss` is the block whose miss asked for it (its
    /// walk moves on to `end`), None for a read ahead asked for directly (a
    /// walk of its own, confirmed: its caller walks on).
    fn read_ended(&self, miss: Option<u64>, end: u64) {
        let moved = miss.is_some_and(|block| {
            let after = block.saturating_add(1) | CONFIRMED;
            self.ends
                .iter()
                .any(|e| e.compare_exchange(after, end | CONFIRMED, Ordering::Relaxed, Ordering::Relaxed).is_ok())
        });
        if !moved {
            self.replace_oldest(end | CONFIRMED);
        }
    }

    fn replace_oldest(&self, end: u64) {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % TABLE_WALKS;
        self.ends[i].store(end, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_walks_are_each_followed_and_random_misses_are_not_walks() {
        let walks = TableWalks::new();
        // Two walks, a and b: two misses in a row each confirm them, the third
        // reads ahead to the end of its 32-block run.
        let (mut a, mut b) = (1000u64, 5000u64);
        for step in 0..2 {
            assert!(!walks.continues(a + step) && !walks.continues(b + step), "misses {step}: no walk yet");
        }
        (a, b) = (a + 2, b + 2);
        for _ in 0..10 {
            assert!(walks.continues(a), "walk a at {a}");
            walks.read_ended(Some(a), a / 32 * 32 + 32);
            assert!(walks.continues(b), "walk b at {b}");
            walks.read_ended(Some(b), b / 32 * 32 + 32);
            (a, b) = (a / 32 * 32 + 32, b / 32 * 32 + 32);
        }
        // Misses elsewhere, even one next to another, are no walk and, up to
        // TABLE_WALKS - 3 more of them, do not push the two walks out. (Slots
        // are reused in turn: a walk that stops is forgotten after eight
        // misses, so stale walks do not turn later random misses into reads
        // ahead.)
        assert!(!walks.continues(90_000) && !walks.continues(90_001));
        for k in 0..(TABLE_WALKS as u64 - 3) {
            assert!(!walks.continues(100_000 + 7 * k));
        }
        assert!(walks.continues(a) && walks.continues(b));
        // A read ahead asked for directly starts a walk of its own.
        walks.read_ended(None, 7_000);
        assert!(walks.continues(7_000));
    }
}
