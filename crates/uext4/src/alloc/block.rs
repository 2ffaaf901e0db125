//! The block allocator: goal-directed, one group at a time under its lock.
//!
//! Search starts in the goal's group at the goal (after a file's last block for an
//! append, near its inode otherwise). It takes the free run at the goal when that
//! holds the whole request, else the first run after it that does, else the
//! longest (`FreeRuns::take`), so a request never crumbles into the holes deleted
//! files left while a run that fits exists; a group with no run of `GOOD_RUN`
//! blocks is passed over for one that has, before any crumbs are taken. Runs come
//! from each group's free-run map (`FreeRuns`), so no allocation walks the bitmap
//! bit by bit. The reserved blocks
//! (s_r_blocks_count) go only to a privileged caller (see `alloc`).

use crate::alloc::{Allocator, FreeRuns};

/// A run long enough that a request is not sent to another group for a
/// longer one (64 KiB in 4 KiB blocks).
const GOOD_RUN: u32 = 16;
use crate::cache::Buffer;
use crate::error::{Error, Result};
use crate::format::bitmap;
use crate::format::group_desc::{GroupDesc, EXT4_BG_BLOCK_UNINIT};
use crate::journal::handle::Handle;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Allocator {
    /// Group `g`'s block bitmap; a BLOCK_UNINIT group's is built from its layout and
    /// the flag cleared. The caller holds the group lock and writes `gd` back.
    pub(crate) fn block_bitmap(&self, tx: &mut Handle, g: u32, gd: &mut GroupDesc) -> Result<Arc<Buffer>> {
        let blk = gd.bg_block_bitmap;
        if gd.bg_flags & EXT4_BG_BLOCK_UNINIT != 0 {
            let buf = self.vol.cache.get_new(blk);
            {
                let mut b = buf.write();
                let start = self.vol.group_first_block(g);
                let in_group = self.vol.blocks_in_group(g) as u64;
                let mut mark = |block: u64| {
                    if block >= start && block < start + in_group {
                        bitmap::set_bit(&mut b, (block - start) as usize);
                    }
                };
                for i in 0..self.vol.base_meta_blocks(g) {
                    mark(start + i);
                }
                mark(gd.bg_block_bitmap);
                mark(gd.bg_inode_bitmap);
                let itb = (self.vol.geo.inodes_per_group as u64 * self.vol.geo.inode_size as u64)
                    .div_ceil(self.vol.geo.block_size as u64);
                for i in 0..itb {
                    mark(gd.bg_inode_table + i);
                }
                for bit in in_group as usize..self.vol.geo.block_size * 8 {
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
        let verify = self.vol.geo.metadata_csum && self.vol.geo.verify_checksums;
        let (seed, ds, bits) = (self.vol.geo.csum_seed, self.vol.geo.desc_size, self.vol.geo.blocks_per_group);
        let stored = gd.bg_block_bitmap_csum;
        self.vol
            .cache
            .get_verified(blk, |b| {
                if verify && !bitmap::matches(stored, bitmap::checksum(b, bits, seed), ds) {
                    return Err(Error::corrupt(
                        "block bitmap checksum does not match",
                        format!("group {g} bitmap block {blk}"),
                    ));
                }
                Ok(())
            })
            .map_err(|e| {
                self.vol.read_error(e, "read_block_bitmap", &format!("reading the block bitmap of group {g}"), 0, blk)
            })
    }

    /// Checks that every block of `ranges` ((start, len), sorted) is marked in use in
    /// its group's bitmap, before a change that frees them starts: freeing one the
    /// bitmap already calls free would stop the change halfway.
    pub(crate) fn check_blocks_in_use(&self, ranges: &[(u64, u64)], what: &dyn Fn() -> String) -> Result<()> {
        for &(start, len) in ranges {
            let mut block = start;
            while block < start + len {
                self.vol.check_block(block, what)?;
                let g = self.vol.group_of_block(block);
                let gstart = self.vol.group_first_block(g);
                let run_end = (start + len).min(gstart + self.vol.blocks_in_group(g) as u64);
                let gd = self.vol.groups[g as usize].read().clone();
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
    ///
    /// # Errors
    /// `NoSpace` when no group has a free block the caller may take; `Corrupt`
    /// when a bitmap fails its checksum.
    pub fn alloc_blocks(&self, tx: &mut Handle, goal: u64, max_len: u32) -> Result<(u64, u32)> {
        let Some(claim) = self.claim(max_len.max(1) as u64) else {
            return Err(Error::NoSpace(format!(
                "{} free blocks, all promised to operations in flight or freed since the last commit",
                self.free_blocks()
            )));
        };
        let found = self.alloc_claimed(tx, goal, (claim.0 + claim.1) as u32);
        self.settle(claim, found.as_ref().map_or(0, |&(_, len)| len as u64));
        found
    }

    /// Two passes over the groups from the goal's: the first takes only a run
    /// of `GOOD_RUN` blocks or the whole request if shorter, so a large request
    /// goes to the next group with room rather than into the crumbs of a full
    /// one (mballoc's criteria, in small); the second takes whatever is free.
    fn alloc_claimed(&self, tx: &mut Handle, goal: u64, max_len: u32) -> Result<(u64, u32)> {
        let goal = goal.clamp(self.vol.geo.first_data_block as u64, self.vol.geo.blocks_count - 1);
        let first_group = self.vol.group_of_block(goal);
        let groups = self.vol.geo.group_count;
        for min_len in [max_len.clamp(1, GOOD_RUN), 1] {
            for i in 0..groups {
                let g = (first_group + i) % groups;
                let start_bit = if i == 0 {
                    (goal - self.vol.group_first_block(g)) as usize
                } else {
                    self.block_hint[g as usize].load(Ordering::Relaxed) as usize
                };
                if let Some(found) = self.alloc_in_group(tx, g, start_bit, max_len, min_len)? {
                    return Ok(found);
                }
            }
            if min_len == 1 {
                break;
            }
        }
        Err(Error::NoSpace("no free blocks in any group".into()))
    }

    fn alloc_in_group(
        &self,
        tx: &mut Handle,
        g: u32,
        start_bit: usize,
        max_len: u32,
        min_len: u32,
    ) -> Result<Option<(u64, u32)>> {
        if let Some(runs) = &*self.free_runs[g as usize].lock() {
            if runs.longest() < min_len {
                return Ok(None);
            }
        }
        let mut gd_lock = self.vol.groups[g as usize].write();
        if gd_lock.bg_free_blocks_count < min_len.max(1) {
            return Ok(None);
        }
        let mut gd = gd_lock.clone();
        let buf = self.block_bitmap(tx, g, &mut gd)?;
        let nbits = self.vol.blocks_in_group(g) as usize;
        let found = {
            let mut b = buf.write();
            let mut runs = self.free_runs[g as usize].lock();
            if runs.is_none() {
                // A group first used since the open (BLOCK_UNINIT then; the others
                // were compared at open, `Filesystem::check_block_bitmaps`). Its
                // bitmap must agree with the descriptor, whose count every allocation
                // here decrements; if not, the group is left alone, as the kernel's
                // mballoc leaves a group whose bitmap it finds corrupt.
                let built = FreeRuns::from_bitmap(&b, nbits as u32);
                if built.total() != gd.bg_free_blocks_count as u64 {
                    eprintln!(
                        "uext4: corrupt filesystem: group {g}: block bitmap has {} free blocks, the descriptor says {}; \
                         not allocating from it (run e2fsck)",
                        built.total(),
                        gd.bg_free_blocks_count
                    );
                    // Its free blocks leave the filesystem's count, as the kernel's.
                    self.free_blocks.fetch_sub(gd.bg_free_blocks_count as u64, Ordering::Relaxed);
                    *runs = Some(FreeRuns::default());
                    return Ok(None);
                }
                *runs = Some(built);
            }
            let runs = runs.as_mut().expect("built above");
            let Some((at, len)) = runs.take(start_bit.min(nbits) as u32, max_len, min_len) else {
                return Ok(None);
            };
            let (at, len) = (at as usize, len as usize);
            for bit in at..at + len {
                debug_assert!(!bitmap::test_bit(&b, bit), "free-run map and bitmap disagree");
                bitmap::set_bit(&mut b, bit);
            }
            if self.vol.geo.metadata_csum {
                gd.bg_block_bitmap_csum = bitmap::checksum(&b, self.vol.geo.blocks_per_group, self.vol.geo.csum_seed);
            }
            (at, len)
        };
        tx.dirty(&buf);
        // Never short: the runs started equal to the count and both change together.
        gd.bg_free_blocks_count = gd.bg_free_blocks_count.saturating_sub(found.1 as u32);
        self.vol.write_group_desc(tx, g, &gd)?;
        *gd_lock = gd;
        self.block_hint[g as usize].store((found.0 + found.1) as u32, Ordering::Relaxed);
        self.free_blocks.fetch_sub(found.1 as u64, Ordering::Relaxed);
        Ok(Some((self.vol.group_first_block(g) + found.0 as u64, found.1 as u32)))
    }

    /// Frees `len` blocks from `start` (which may span groups). Under a journal
    /// they become allocatable once `tx`'s transaction commits.
    ///
    /// # Errors
    /// `Corrupt` when a block lies outside the filesystem or is already free.
    pub fn free_blocks_range(&self, tx: &mut Handle, start: u64, len: u64) -> Result<()> {
        let mut block = start;
        let end = start + len;
        while block < end {
            self.vol.check_block(block, &|| "block being freed".to_string())?;
            let g = self.vol.group_of_block(block);
            let gstart = self.vol.group_first_block(g);
            let run_end = end.min(gstart + self.vol.blocks_in_group(g) as u64);
            let mut gd_lock = self.vol.groups[g as usize].write();
            let mut gd = gd_lock.clone();
            let buf = self.block_bitmap(tx, g, &mut gd)?;
            {
                let mut b = buf.write();
                // The free-run map must exist before the bits clear, or building it
                // later from the bitmap would offer the deferred blocks.
                let runs_before_free = match self.free_runs[g as usize].lock().is_none() {
                    true if self.vol.journal().is_some() => {
                        Some(FreeRuns::from_bitmap(&b, self.vol.blocks_in_group(g)))
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
                    self.vol.cache.forget(blk);
                }
                if self.vol.geo.metadata_csum {
                    gd.bg_block_bitmap_csum =
                        bitmap::checksum(&b, self.vol.geo.blocks_per_group, self.vol.geo.csum_seed);
                }
                let (bit, len) = ((block - gstart) as u32, (run_end - block) as u32);
                match tx.tid() {
                    // Until the transaction freeing them commits, a crash brings back
                    // the owner of these blocks: new data written there meanwhile
                    // would land in it. They join the free runs at its commit
                    // (`Allocator::committed`).
                    Some(tid) => {
                        if let Some(runs) = runs_before_free {
                            *self.free_runs[g as usize].lock() = Some(runs);
                        }
                        self.deferred.lock().entry(tid).or_default().push((block, run_end - block));
                        self.pending_free_blocks.fetch_add(run_end - block, Ordering::Relaxed);
                    }
                    None => {
                        if let Some(runs) = self.free_runs[g as usize].lock().as_mut() {
                            runs.put(bit, len);
                        }
                    }
                }
            }
            tx.dirty(&buf);
            if let Some(journal) = self.vol.journal() {
                // Takes the journal's brief state lock only (never the log's).
                journal.note_freed(block..run_end);
            }
            gd.bg_free_blocks_count = gd.bg_free_blocks_count.saturating_add((run_end - block) as u32);
            self.vol.write_group_desc(tx, g, &gd)?;
            *gd_lock = gd;
            self.free_blocks.fetch_add(run_end - block, Ordering::Relaxed);
            block = run_end;
        }
        Ok(())
    }

    /// Reads every initialized block bitmap once and compares its free blocks with
    /// the descriptor's count, so that no change discovers a disagreement halfway
    /// (after, say, taking an inode). A group that disagrees is left alone, as the
    /// kernel's mballoc leaves a group whose bitmap it finds corrupt: nothing is
    /// handed out from it and its free blocks leave the filesystem's count.
    pub(crate) fn check_block_bitmaps(&self) -> Result<()> {
        for g in 0..self.vol.geo.group_count {
            let gd = self.vol.groups[g as usize].read().clone();
            if gd.bg_flags & EXT4_BG_BLOCK_UNINIT != 0 {
                continue;
            }
            let buf = self.verified_block_bitmap(g, &gd)?;
            let runs = FreeRuns::from_bitmap(&buf.read(), self.vol.blocks_in_group(g));
            let mut slot = self.free_runs[g as usize].lock();
            if runs.total() == gd.bg_free_blocks_count as u64 {
                *slot = Some(runs);
                continue;
            }
            eprintln!(
                "uext4: corrupt filesystem: group {g}: block bitmap has {} free blocks, the descriptor says {}; \
                 not allocating from it (run e2fsck)",
                runs.total(),
                gd.bg_free_blocks_count
            );
            self.free_blocks.fetch_sub(gd.bg_free_blocks_count as u64, Ordering::Relaxed);
            *slot = Some(FreeRuns::default());
        }
        Ok(())
    }
}
