//! Inode-table blocks as every layer reads them: a miss that continues a walk
//! in table order (where an earlier read ended, or a few blocks on: one block
//! of each of a row of dir_ireserve windows) reads the rest of an aligned
//! run of `INODE_READ_AHEAD_BLOCKS` in one request, as the kernel's
//! inode_readahead_blks does; random misses read one block.
//!
//! Walks: unlinking names sorted by inode (GNU rm for big directories);
//! a hash-order walk of a hash_goal directory, one walk per window; creates in
//! directories made one after the other, each filling the next slot of its
//! own dir_ireserve window or of fresh blocks — there the allocator's check
//! that a free slot holds no live inode is the first read of the block.
//!
//! Invariant: only a hint. A read ahead loads blocks not cached and keeps the
//! cached ones; its errors are left for the read that needs the block.

use super::Volume;
use crate::cache::Buffer;
use crate::error::Result;
use crate::format::group_desc::{GdCsum, GroupDesc, EXT4_BG_INODE_UNINIT};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Inode-table blocks read ahead together, aligned on their multiple.
const INODE_READ_AHEAD_BLOCKS: u64 = 32;

impl Volume {
    /// The inode-table block of `gd`'s group holding slot `index`, read ahead
    /// with the rest of its run when its miss continues a walk. `gd` is the
    /// caller's copy of (or hold on) the group's descriptor: this takes no
    /// group lock, so the allocator may call it holding one.
    ///
    /// # Errors
    /// What reading the block gives (`Io`).
    pub(crate) fn inode_table_block(&self, gd: &GroupDesc, index: u32) -> Result<Arc<Buffer>> {
        let bs = self.geo.block_size as u64;
        let block = gd.bg_inode_table + index as u64 * self.geo.inode_size as u64 / bs;
        // A hit is one look at the cache: on the path of every inode write, of
        // two threads' inodes in one block, each look takes that shard's lock.
        if let Some(hit) = self.cache.cached(block) {
            return Ok(hit);
        }
        if self.table_walks.continues(block) {
            if let Some(end) = self.read_ahead_inode_run(gd, index) {
                self.table_walks.read_ended(Some(block), end);
            }
        }
        self.cache.get(block)
    }

    /// On a miss for `ino`'s inode-table block, reads the aligned run around it
    /// (within its group's table) in one request, for a caller that will use
    /// the run whole (remove_tree's windows); the read starts a walk.
    pub(crate) fn read_ahead_inode(&self, ino: u32) {
        if ino == 0 || ino > self.geo.inodes_count {
            return;
        }
        let group = (ino - 1) / self.geo.inodes_per_group;
        let Some(gd) = self.groups.get(group as usize).map(|g| g.read().clone()) else { return };
        if let Some(end) = self.read_ahead_inode_run(&gd, (ino - 1) % self.geo.inodes_per_group) {
            self.table_walks.read_ended(None, end);
        }
    }

    /// The read ahead itself; returns the block just past the run read.
    fn read_ahead_inode_run(&self, gd: &GroupDesc, index: u32) -> Option<u64> {
        if gd.bg_flags & EXT4_BG_INODE_UNINIT != 0 && self.geo.gd_csum != GdCsum::None {
            return None;
        }
        let bs = self.geo.block_size as u64;
        let table_blocks = (self.geo.inodes_per_group as u64 * self.geo.inode_size as u64).div_ceil(bs);
        let rel = index as u64 * self.geo.inode_size as u64 / bs;
        if self.cache.holds(gd.bg_inode_table + rel) {
            return None;
        }
        let first = rel / INODE_READ_AHEAD_BLOCKS * INODE_READ_AHEAD_BLOCKS;
        let count = INODE_READ_AHEAD_BLOCKS.min(table_blocks - first);
        self.cache.read_ahead(gd.bg_inode_table + first, count as usize).ok()?;
        Some(gd.bg_inode_table + first + count)
    }
}

/// How many walks in inode-table order `TableWalks` follows at once.
const TABLE_WALKS: usize = 8;

/// The longest stride of a walk (see `continues`).
const WALK_STRIDE_MAX: u64 = 8;

/// An empty slot of `TableWalks::ends`.
const NO_WALK: u64 = u64::MAX;

/// One walk, as a slot of `TableWalks::ends` holds it packed in one word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Walk {
    /// The block just past its last read.
    end: u64,
    /// Its next miss falls `stride - 1` blocks past `end` (1: right there).
    stride: u64,
    /// Seen twice in a row at that stride: its misses read ahead.
    confirmed: bool,
    /// Its last read was a read ahead, which ends on an aligned block: the
    /// next miss may fall anywhere within one stride of it.
    ahead: bool,
}

impl Walk {
    const END_BITS: u32 = 56;

    fn pack(self) -> u64 {
        (self.end & ((1 << Self::END_BITS) - 1))
            | (self.stride - 1) << Self::END_BITS
            | (self.confirmed as u64) << (Self::END_BITS + 3)
            | (self.ahead as u64) << (Self::END_BITS + 4)
    }

    fn unpack(v: u64) -> Option<Walk> {
        (v != NO_WALK).then(|| Walk {
            end: v & ((1 << Self::END_BITS) - 1),
            stride: ((v >> Self::END_BITS) & 7) + 1,
            confirmed: (v >> (Self::END_BITS + 3)) & 1 == 1,
            ahead: (v >> (Self::END_BITS + 4)) & 1 == 1,
        })
    }
}

/// Where the last few inode-table reads ended, so that a miss just past one
/// of them is seen as a walk in table order going on: at the next block, or
/// one block in each of a row of dir_ireserve windows of 64 or 128 slots (4 or
/// 8 blocks). Several at once: a `hash_goal` directory that outgrew its first
/// span is walked in hash order as one ascending run of inode numbers per
/// span, interleaved; other threads walk tables of their own. Slots are
/// reused in turn, so a walk that stopped is forgotten after eight misses
/// elsewhere. A walk reads ahead from its third miss on, each at the stride
/// the first two showed: a random miss rarely lands at exactly the stride of
/// one of eight walks (with stride 1 only, a single match would send about
/// one random miss in 60 of a 500-block table into a 32-block read).
/// Only a hint: racing updates may lose a walk, which then costs one-block
/// reads until it is seen again.
pub(crate) struct TableWalks {
    /// `Walk::pack`ed walks, `NO_WALK` for none.
    ends: [AtomicU64; TABLE_WALKS],
    next: AtomicUsize,
}

impl TableWalks {
    pub(crate) fn new() -> TableWalks {
        TableWalks { ends: std::array::from_fn(|_| AtomicU64::new(NO_WALK)), next: AtomicUsize::new(0) }
    }

    /// Records a miss at `block`; true when it goes on with a confirmed walk,
    /// whose read ahead the caller then makes (and reports, `read_ended`).
    fn continues(&self, block: u64) -> bool {
        let after = block.saturating_add(1);
        let moved = |e: &AtomicU64, v: u64, stride: u64| {
            let walk = Walk { end: after, stride, confirmed: true, ahead: false };
            e.compare_exchange(v, walk.pack(), Ordering::Relaxed, Ordering::Relaxed).is_ok()
        };
        // A confirmed walk this miss goes on with: at its stride, or anywhere
        // within one stride of a read ahead's end.
        for e in &self.ends {
            let v = e.load(Ordering::Relaxed);
            let Some(w) = Walk::unpack(v).filter(|w| w.confirmed && block >= w.end) else { continue };
            let fits = match w.ahead {
                true => block < w.end + w.stride,
                false => block == w.end + w.stride - 1,
            };
            if fits && moved(e, v, w.stride) {
                return true;
            }
        }
        // A walk seen once: this miss confirms it, at the stride it shows.
        for e in &self.ends {
            let v = e.load(Ordering::Relaxed);
            let Some(w) = Walk::unpack(v).filter(|w| !w.confirmed) else { continue };
            if (w.end..w.end + WALK_STRIDE_MAX).contains(&block) && moved(e, v, block - w.end + 1) {
                return false;
            }
        }
        self.replace_oldest(Walk { end: after, stride: 1, confirmed: false, ahead: false }.pack());
        false
    }

    /// A read ended at `end`; `miss` is the block whose miss asked for it (its
    /// walk moves on to `end`), None for a read ahead asked for directly (a
    /// walk of its own, confirmed: its caller walks on).
    fn read_ended(&self, miss: Option<u64>, end: u64) {
        let moved = miss.is_some_and(|block| {
            self.ends.iter().any(|e| {
                let v = e.load(Ordering::Relaxed);
                match Walk::unpack(v) {
                    Some(w) if w.confirmed && w.end == block.saturating_add(1) => {
                        let walk = Walk { end, ahead: true, ..w };
                        e.compare_exchange(v, walk.pack(), Ordering::Relaxed, Ordering::Relaxed).is_ok()
                    }
                    _ => false,
                }
            })
        });
        if !moved {
            self.replace_oldest(Walk { end, stride: 1, confirmed: true, ahead: true }.pack());
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
            assert!(!walks.continues(100_000 + (WALK_STRIDE_MAX + 1) * k));
        }
        assert!(walks.continues(a) && walks.continues(b));
        // A read ahead asked for directly starts a walk of its own.
        walks.read_ended(None, 7_000);
        assert!(walks.continues(7_000));
    }

    #[test]
    fn a_walk_that_takes_one_block_in_eight_is_followed() {
        let walks = TableWalks::new();
        // One directory's dir_ireserve=high window (8 blocks) after another.
        assert!(!walks.continues(2000) && !walks.continues(2008), "two misses: no walk yet");
        assert!(!walks.continues(2012), "a miss off the stride goes on with no walk");
        assert!(walks.continues(2016), "the third reads ahead");
        walks.read_ended(Some(2016), 2048);
        assert!(walks.continues(2048), "and the walk goes on past the run read");
        assert!(!walks.continues(2048 + 1 + WALK_STRIDE_MAX), "a miss further on is no walk");
    }
}
