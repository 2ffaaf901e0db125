//! The block allocator: goal-directed, one group at a time under its lock.
//!
//! Search starts in the goal's group at the goal (after a file's last block for an
//! append, near its inode otherwise) and takes the free run there (or the next one)
//! up to the request, then moves on group by group. Runs come from each group's
//! free-run map (`FreeRuns`), so no allocation walks the bitmap bit by bit. The reserved blocks
//! (s_r_blocks_count) go only to a privileged caller (see `alloc`).

use crate::cache::Buffer;
use crate::error::{Error, Result};
use crate::format::bitmap;
use crate::format::group_desc::{GroupDesc, EXT4_BG_BLOCK_UNINIT};
use crate::fs::{group_has_superblock, Filesystem};
use crate::journal::handle::Handle;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Filesystem {
    /// Writes group `g`'s descriptor into the primary descriptor table.
    pub(crate) fn write_group_desc(&self, tx: &mut Handle, g: u32, gd: &GroupDesc) -> Result<()> {
        let (block, off) = Filesystem::group_desc_location(&self.sb.read(), g);
        let buf = self.cache.get(block)?;
        {
            let mut data = buf.write();
            let ds = self.geo.desc_size;
            gd.write(&mut data[off..off + ds], ds, g, self.geo.gd_csum);
        }
        tx.dirty(&buf);
        Ok(())
    }

    /// Blocks at the start of group `g` taken by its superblock backup and descriptor
    /// blocks (as the kernel's ext4_bg_num_gdb counts them).
    pub(crate) fn base_meta_blocks(&self, g: u32) -> u64 {
        let sb = self.sb.read();
        let has_super = group_has_superblock(&sb, g);
        let per_block = self.geo.block_size as u64 / self.geo.desc_size as u64;
        let gdt_blocks = (self.geo.group_count as u64).div_ceil(per_block);
        let meta_group = g as u64 / per_block;
        let meta_bg = sb.has_incompat(crate::format::superblock::INCOMPAT_META_BG);
        let descriptors = if !meta_bg || meta_group < sb.s_first_meta_bg as u64 {
            let table = if meta_bg { sb.s_first_meta_bg as u64 } else { gdt_blocks };
            if has_super {
                table + sb.s_reserved_gdt_blocks as u64
            } else {
                0
            }
        } else {
            // meta_bg: one descriptor block in the first, second and last group of each meta group.
            let index = g as u64 % per_block;
            u64::from(index == 0 || index == 1 || index == per_block - 1)
        };
        u64::from(has_super) + descriptors
    }

    /// Group `g`'s block bitmap; a BLOCK_UNINIT group's is built from its layout and
    /// the flag cleared. The caller holds the group lock and writes `gd` back.
    pub(crate) fn block_bitmap(&self, tx: &mut Handle, g: u32, gd: &mut GroupDesc) -> Result<Arc<Buffer>> {
        let blk = gd.bg_block_bitmap;
        if gd.bg_flags & EXT4_BG_BLOCK_UNINIT != 0 {
            let buf = self.cache.get_new(blk);
            {
                let mut b = buf.write();
                let start = self.group_first_block(g);
                let in_group = self.blocks_in_group(g) as u64;
                let mut mark = |block: u64| {
                    if block >= start && block < start + in_group {
                        bitmap::set_bit(&mut b, (block - start) as usize);
                    }
                };
                for i in 0..self.base_meta_blocks(g) {
                    mark(start + i);
                }
                mark(gd.bg_block_bitmap);
                mark(gd.bg_inode_bitmap);
                let itb = (self.geo.inodes_per_group as u64 * self.geo.inode_size as u64)
                    .div_ceil(self.geo.block_size as u64);
                for i in 0..itb {
                    mark(gd.bg_inode_table + i);
                }
                for bit in in_group as usize..self.geo.block_size * 8 {
                    bitmap::set_bit(&mut b, bit);
                }
            }
            gd.bg_flags &= !EXT4_BG_BLOCK_UNINIT;
            tx.dirty(&buf);
            return Ok(buf);
        }
        self.verified_block_bitmap(g, gd)
    }

    /// Group `g`'s initialized block bitmap, its checksum verified once.
    pub(crate) fn verified_block_bitmap(&self, g: u32, gd: &GroupDesc) -> Result<Arc<Buffer>> {
        let blk = gd.bg_block_bitmap;
        let verify = self.geo.metadata_csum && self.geo.verify_checksums;
        let (seed, ds, bits) = (self.geo.csum_seed, self.geo.desc_size, self.geo.blocks_per_group);
        let stored = gd.bg_block_bitmap_csum;
        self.cache.get_verified(blk, |b| {
            if verify && !bitmap::matches(stored, bitmap::checksum(b, bits, seed), ds) {
                return Err(Error::corrupt(
                    "block bitmap checksum does not match",
                    format!("group {g} bitmap block {blk}"),
                ));
            }
            Ok(())
        })
    }

    /// Checks that every block of `ranges` ((start, len), sorted) is marked in use in
    /// its group's bitmap, before a change that frees them starts: freeing one the
    /// bitmap already calls free would stop the change halfway.
    pub(crate) fn check_blocks_in_use(&self, ranges: &[(u64, u64)], what: &dyn Fn() -> String) -> Result<()> {
        for &(start, len) in ranges {
            let mut block = start;
            while block < start + len {
                self.check_block(block, what)?;
                let g = self.group_of_block(block);
                let gstart = self.group_first_block(g);
                let run_end = (start + len).min(gstart + self.blocks_in_group(g) as u64);
                let gd = self.groups[g as usize].read().clone();
                if gd.bg_flags & EXT4_BG_BLOCK_UNINIT != 0 {
                    return Err(Error::corrupt(
                        format!("block {block} lies in group {g}, whose block bitmap is uninitialized (all free)"),
                        what(),
                    ));
                }
                let buf = self.verified_block_bitmap(g, &gd)?;
                let data = buf.read();
                if let Some(free) = (block..run_end).find(|b| !bitmap::test_bit(&data, (b - gstart) as usize)) {
                    return Err(Error::corrupt(format!("block {free} is in use but its bitmap says free"), what()));
                }
                block = run_end;
            }
        }
        Ok(())
    }

    /// Allocates up to `max_len` contiguous blocks (at least one) near `goal`.
    pub fn alloc_blocks(&self, tx: &mut Handle, goal: u64, max_len: u32) -> Result<(u64, u32)> {
        let reserved = self.reserved_blocks();
        let free = self.allocatable_blocks();
        if free <= reserved {
            return Err(Error::NoSpace(format!("{free} free blocks, {reserved} reserved")));
        }
        let max_len = (max_len as u64).min(free - reserved).max(1) as u32;
        let goal = goal.clamp(self.geo.first_data_block as u64, self.geo.blocks_count - 1);
        let first_group = self.group_of_block(goal);
        let groups = self.geo.group_count;
        for i in 0..groups {
            let g = (first_group + i) % groups;
            let start_bit = if i == 0 {
                (goal - self.group_first_block(g)) as usize
            } else {
                self.alloc.block_hint[g as usize].load(Ordering::Relaxed) as usize
            };
            if let Some(found) = self.alloc_in_group(tx, g, start_bit, max_len)? {
                return Ok(found);
            }
        }
        Err(Error::NoSpace("no free blocks in any group".into()))
    }

    fn alloc_in_group(&self, tx: &mut Handle, g: u32, start_bit: usize, max_len: u32) -> Result<Option<(u64, u32)>> {
        let mut gd_lock = self.groups[g as usize].write();
        if gd_lock.bg_free_blocks_count == 0 {
            return Ok(None);
        }
        let mut gd = gd_lock.clone();
        let buf = self.block_bitmap(tx, g, &mut gd)?;
        let nbits = self.blocks_in_group(g) as usize;
        let found = {
            let mut b = buf.write();
            let mut runs = self.alloc.free_runs[g as usize].lock();
            if runs.is_none() {
                // A group first used since the open (BLOCK_UNINIT then; the others
                // were compared at open, `Filesystem::check_block_bitmaps`). Its
                // bitmap must agree with the descriptor, whose count every allocation
                // here decrements; if not, the group is left alone, as the kernel's
                // mballoc leaves a group whose bitmap it finds corrupt.
                let built = crate::alloc::FreeRuns::from_bitmap(&b, nbits as u32);
                if built.total() != gd.bg_free_blocks_count as u64 {
                    eprintln!(
                        "uext4: corrupt filesystem: group {g}: block bitmap has {} free blocks, the descriptor says {}; \
                         not allocating from it (run e2fsck)",
                        built.total(),
                        gd.bg_free_blocks_count
                    );
                    // Its free blocks leave the filesystem's count, as the kernel's.
                    self.alloc.free_blocks.fetch_sub(gd.bg_free_blocks_count as u64, Ordering::Relaxed);
                    *runs = Some(crate::alloc::FreeRuns::default());
                    return Ok(None);
                }
                *runs = Some(built);
            }
            let runs = runs.as_mut().expect("built above");
            let Some((at, len)) = runs.take(start_bit.min(nbits) as u32, max_len) else {
                return Ok(None);
            };
            let (at, len) = (at as usize, len as usize);
            for bit in at..at + len {
                debug_assert!(!bitmap::test_bit(&b, bit), "free-run map and bitmap disagree");
                bitmap::set_bit(&mut b, bit);
            }
            if self.geo.metadata_csum {
                gd.bg_block_bitmap_csum = bitmap::checksum(&b, self.geo.blocks_per_group, self.geo.csum_seed);
            }
            (at, len)
        };
        tx.dirty(&buf);
        // Never short: the runs started equal to the count and both change together.
        gd.bg_free_blocks_count = gd.bg_free_blocks_count.saturating_sub(found.1 as u32);
        self.write_group_desc(tx, g, &gd)?;
        *gd_lock = gd;
        self.alloc.block_hint[g as usize].store((found.0 + found.1) as u32, Ordering::Relaxed);
        self.alloc.free_blocks.fetch_sub(found.1 as u64, Ordering::Relaxed);
        Ok(Some((self.group_first_block(g) + found.0 as u64, found.1 as u32)))
    }

    /// Frees `len` blocks from `start` (which may span groups).
    pub fn free_blocks_range(&self, tx: &mut Handle, start: u64, len: u64) -> Result<()> {
        let mut block = start;
        let end = start + len;
        while block < end {
            self.check_block(block, &|| "block being freed".to_string())?;
            let g = self.group_of_block(block);
            let gstart = self.group_first_block(g);
            let run_end = end.min(gstart + self.blocks_in_group(g) as u64);
            let mut gd_lock = self.groups[g as usize].write();
            let mut gd = gd_lock.clone();
            let buf = self.block_bitmap(tx, g, &mut gd)?;
            {
                let mut b = buf.write();
                // The free-run map must exist before the bits clear, or building it
                // later from the bitmap would offer the deferred blocks.
                let runs_before_free = match self.alloc.free_runs[g as usize].lock().is_none() {
                    true if self.journal.is_some() => {
                        Some(crate::alloc::FreeRuns::from_bitmap(&b, self.blocks_in_group(g)))
                    }
                    _ => None,
                };
                for blk in block..run_end {
                    let bit = (blk - gstart) as usize;
                    if !bitmap::test_bit(&b, bit) {
                        return Err(Error::corrupt(
                            format!("freeing block {blk}, which is already free"),
                            format!("group {g}"),
                        ));
                    }
                    bitmap::clear_bit(&mut b, bit);
                    self.cache.forget(blk);
                }
                if self.geo.metadata_csum {
                    gd.bg_block_bitmap_csum = bitmap::checksum(&b, self.geo.blocks_per_group, self.geo.csum_seed);
                }
                let (bit, len) = ((block - gstart) as u32, (run_end - block) as u32);
                match self.journal.as_ref() {
                    // Until the transaction freeing them commits, a crash brings back
                    // the owner of these blocks: new data written there meanwhile
                    // would land in it. They join the free runs at commit.
                    Some(journal) => {
                        if let Some(runs) = runs_before_free {
                            *self.alloc.free_runs[g as usize].lock() = Some(runs);
                        }
                        journal.defer_free(block, run_end - block);
                    }
                    None => {
                        if let Some(runs) = self.alloc.free_runs[g as usize].lock().as_mut() {
                            runs.put(bit, len);
                        }
                    }
                }
            }
            tx.dirty(&buf);
            if let Some(journal) = self.journal.as_ref() {
                // Takes the journal's brief state lock only (never the log's).
                journal.note_freed(block..run_end);
            }
            gd.bg_free_blocks_count = gd.bg_free_blocks_count.saturating_add((run_end - block) as u32);
            self.write_group_desc(tx, g, &gd)?;
            *gd_lock = gd;
            self.alloc.free_blocks.fetch_add(run_end - block, Ordering::Relaxed);
            block = run_end;
        }
        Ok(())
    }
}
