//! Allocation of blocks and inodes.
//!
//! A group's descriptor lock (`Filesystem::groups[g]`, taken for writing) is the
//! allocator's group lock: bitmap, descriptor and checksums of a group change only
//! under it, and several groups are locked in ascending order. Filesystem-wide free
//! counts are kept in atomics and written to the superblock at sync. Groups still
//! marked BLOCK_UNINIT or INODE_UNINIT get their bitmaps built on first use, as the
//! kernel does.
//!
//! The reserved blocks (s_r_blocks_count) go only to a privileged caller, as the
//! kernel's ext4_has_free_clusters decides: uid 0, s_def_resuid, or a member of a
//! non-root s_def_resgid. Who is calling is per thread (`Filesystem::acting_as`);
//! a thread that never said counts as unprivileged.

pub mod block;
pub mod inode;

use crate::fs::Filesystem;
use crate::ns::change::Owner;
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

thread_local! {
    /// The credentials the library's calls on this thread act with.
    static CALLER: Cell<Option<Owner>> = const { Cell::new(None) };
}

/// While alive, the calling thread acts as one user (see `Filesystem::acting_as`).
pub struct ActingAs {
    before: Option<Owner>,
}

impl Drop for ActingAs {
    fn drop(&mut self) {
        CALLER.with(|c| c.set(self.before));
    }
}

pub use inode::{InodePolicy, MainlinePolicy};

/// A group's free blocks as runs: start bit -> length. Finding a run near a goal is
/// a range query instead of a walk over the bitmap.
#[derive(Default)]
pub struct FreeRuns {
    runs: std::collections::BTreeMap<u32, u32>,
}

impl FreeRuns {
    pub fn from_bitmap(bitmap: &[u8], nbits: u32) -> FreeRuns {
        let mut runs = std::collections::BTreeMap::new();
        let mut bit = 0;
        while bit < nbits {
            // Whole bytes of used blocks are skipped at once.
            if bit % 8 == 0 && bit + 8 <= nbits && bitmap[bit as usize / 8] == 0xff {
                bit += 8;
                continue;
            }
            if crate::format::bitmap::test_bit(bitmap, bit as usize) {
                bit += 1;
                continue;
            }
            let start = bit;
            while bit < nbits && !crate::format::bitmap::test_bit(bitmap, bit as usize) {
                bit += 1;
            }
            runs.insert(start, bit - start);
        }
        FreeRuns { runs }
    }

    /// Takes up to `max` free blocks at `goal` or in the first run after it,
    /// wrapping to the group's start; returns (start bit, length).
    pub fn take(&mut self, goal: u32, max: u32) -> Option<(u32, u32)> {
        let containing = self.runs.range(..=goal).next_back().filter(|(&s, &l)| s + l > goal).map(|(&s, &l)| (s, l));
        let (run_start, run_len) = containing
            .or_else(|| self.runs.range(goal..).next().map(|(&s, &l)| (s, l)))
            .or_else(|| self.runs.iter().next().map(|(&s, &l)| (s, l)))?;
        let at = if containing.is_some() { goal } else { run_start };
        let len = max.min(run_start + run_len - at);
        self.runs.remove(&run_start);
        if at > run_start {
            self.runs.insert(run_start, at - run_start);
        }
        if at + len < run_start + run_len {
            self.runs.insert(at + len, run_start + run_len - at - len);
        }
        Some((at, len))
    }

    /// How many blocks the runs hold.
    pub fn total(&self) -> u64 {
        self.runs.values().map(|&l| l as u64).sum()
    }

    /// Returns blocks [start, start + len) to the free runs, merging neighbours.
    pub fn put(&mut self, start: u32, len: u32) {
        let (mut s, mut l) = (start, len);
        if let Some((&ps, &pl)) = self.runs.range(..start).next_back() {
            if ps + pl == start {
                self.runs.remove(&ps);
                s = ps;
                l += pl;
            }
        }
        if let Some(&nl) = self.runs.get(&(start + len)) {
            self.runs.remove(&(start + len));
            l += nl;
        }
        self.runs.insert(s, l);
    }
}

pub struct AllocState {
    pub(crate) free_blocks: AtomicU64,
    pub(crate) free_inodes: AtomicU64,
    /// Per group: where the last inode search ended, so allocation never rescans from 0.
    pub(crate) inode_hint: Vec<AtomicU32>,
    /// Per group: where the last block search ended.
    pub(crate) block_hint: Vec<AtomicU32>,
    /// Per group: its free runs (start bit -> length), built from the bitmap on first
    /// use and kept current; touched only under the group's lock.
    pub(crate) free_runs: Vec<parking_lot::Mutex<Option<FreeRuns>>>,
    pub(crate) policy: Box<dyn InodePolicy>,
}

impl AllocState {
    pub(crate) fn new(groups: &[crate::format::group_desc::GroupDesc]) -> AllocState {
        AllocState {
            free_blocks: AtomicU64::new(groups.iter().map(|g| g.bg_free_blocks_count as u64).sum()),
            free_inodes: AtomicU64::new(groups.iter().map(|g| g.bg_free_inodes_count as u64).sum()),
            inode_hint: groups.iter().map(|_| AtomicU32::new(0)).collect(),
            block_hint: groups.iter().map(|_| AtomicU32::new(0)).collect(),
            free_runs: groups.iter().map(|_| parking_lot::Mutex::new(None)).collect(),
            policy: Box::new(MainlinePolicy),
        }
    }
}

impl Filesystem {
    pub fn free_blocks(&self) -> u64 {
        self.alloc.free_blocks.load(Ordering::Relaxed)
    }

    /// Free blocks that may be handed out now: blocks freed in the running
    /// transaction are free on disk but not reusable until it commits.
    pub(crate) fn allocatable_blocks(&self) -> u64 {
        let pending = self.journal.as_ref().map_or(0, |j| j.pending_free_blocks.load(Ordering::Relaxed));
        self.free_blocks().saturating_sub(pending)
    }

    /// Makes the calling thread act as `who` until the guard drops: a privileged
    /// caller may take the reserved blocks. Operations that create an inode act as
    /// its owner for their own duration.
    pub fn acting_as(&self, who: Owner) -> ActingAs {
        ActingAs { before: CALLER.with(|c| c.replace(Some(who))) }
    }

    /// Acts as `who` only when the calling thread has not said who it is.
    pub(crate) fn acting_as_unless_set(&self, who: Owner) -> Option<ActingAs> {
        CALLER.with(|c| c.get()).is_none().then(|| self.acting_as(who))
    }

    /// Whether `who` may take the reserved blocks.
    pub fn may_use_reserved(&self, who: Owner) -> bool {
        let sb = self.sb.read();
        who.uid == 0 || who.uid == sb.s_def_resuid as u32 || (sb.s_def_resgid != 0 && who.gid == sb.s_def_resgid as u32)
    }

    /// Blocks the current caller may not take: the reserved ones, unless it is privileged.
    pub(crate) fn reserved_blocks(&self) -> u64 {
        match CALLER.with(|c| c.get()) {
            Some(who) if self.may_use_reserved(who) => 0,
            _ => self.sb.read().s_r_blocks_count,
        }
    }

    pub fn free_inodes(&self) -> u64 {
        self.alloc.free_inodes.load(Ordering::Relaxed)
    }

    pub(crate) fn group_of_block(&self, block: u64) -> u32 {
        ((block - self.geo.first_data_block as u64) / self.geo.blocks_per_group as u64) as u32
    }

    pub(crate) fn group_first_block(&self, group: u32) -> u64 {
        self.geo.first_data_block as u64 + group as u64 * self.geo.blocks_per_group as u64
    }

    pub(crate) fn blocks_in_group(&self, group: u32) -> u32 {
        (self.geo.blocks_count - self.group_first_block(group)).min(self.geo.blocks_per_group as u64) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::FreeRuns;

    #[test]
    fn free_runs_take_and_put_agree_with_a_bitmap() {
        // Bits 0-9 used, 10-19 free, 20 used, 21-99 free.
        let mut bitmap = vec![0u8; 13];
        for bit in (0..10).chain([20]) {
            crate::format::bitmap::set_bit(&mut bitmap, bit);
        }
        let mut runs = FreeRuns::from_bitmap(&bitmap, 100);
        assert_eq!(runs.runs.iter().map(|(&s, &l)| (s, l)).collect::<Vec<_>>(), [(10, 10), (21, 79)]);
        assert_eq!(runs.take(15, 100), Some((15, 5)), "from the goal to the end of its run");
        assert_eq!(runs.take(15, 3), Some((21, 3)), "the next run after the goal");
        assert_eq!(runs.take(99, 50), Some((99, 1)));
        assert_eq!(runs.take(200, 4), Some((10, 4)), "wraps to the first run");
        runs.put(15, 5);
        assert_eq!(runs.runs.get(&14), Some(&6), "neighbours merge");
        runs.put(10, 4);
        runs.put(21, 3);
        runs.put(99, 1);
        assert_eq!(runs.runs.iter().map(|(&s, &l)| (s, l)).collect::<Vec<_>>(), [(10, 10), (21, 79)]);
    }
}
