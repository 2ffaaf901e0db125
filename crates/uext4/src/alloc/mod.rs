//! Allocation of blocks and inodes: `Allocator`, built on a `Volume` alone.
//!
//! A group's descriptor lock (`Volume::groups[g]`, taken for writing) is the
//! allocator's group lock: bitmap, descriptor and checksums of a group change only
//! under it, and several groups are locked in ascending order. Filesystem-wide free
//! counts are kept in atomics and written to the superblock at sync. Groups still
//! marked BLOCK_UNINIT or INODE_UNINIT get their bitmaps built on first use, as the
//! kernel does.
//!
//! Blocks freed under a journal are not handed out again until the transaction
//! that freed them commits: a crash before then brings back their old owner, whose
//! blocks must still hold its bytes. The allocator keeps them, keyed by
//! transaction id, and the journal's commit callback (`Allocator::committed`, jbd2's
//! j_commit_callback) returns them to the free runs.
//!
//! The reserved blocks (s_r_blocks_count) go only to a privileged caller, as the
//! kernel's ext4_has_free_clusters decides: uid 0, s_def_resuid, or a member of a
//! non-root s_def_resgid. Who is calling is per thread (`acting_as`); a thread
//! that never said counts as unprivileged.

pub mod block;
pub mod dir_ireserve;
pub mod hash_goal;
pub mod inode;
mod reserve;

use crate::error::{Error, Result};
use crate::journal::log::HANDLES_HELD;
use crate::volume::Volume;
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

pub use dir_ireserve::{DirReserve, DirReservePolicy, Window};
pub use hash_goal::HashGoal;
pub use inode::{InodePolicy, InodeRequest, Layered, MainlinePolicy};
pub use reserve::Reservation;

/// The placement policy the options ask for: `hash_goal` first (indexed
/// directories), then `dir_ireserve`, then the ordinary policy.
///
/// # Errors
/// `Invalid` when a `dir_ireserve` window does not fit in a group.
pub fn policy_for(vol: &Volume, dir_ireserve: DirReserve, hash_goal: bool) -> Result<Box<dyn InodePolicy>> {
    let mut layers: Vec<Box<dyn InodePolicy>> = Vec::new();
    if hash_goal {
        layers.push(Box::new(HashGoal::new()));
    }
    if let Some(slots) = dir_ireserve.slots() {
        layers.push(Box::new(DirReservePolicy::new(vol, slots)?));
    }
    Ok(match layers.len() {
        0 => Box::new(MainlinePolicy),
        1 => layers.pop().expect("one layer"),
        _ => Box::new(Layered::new(layers)),
    })
}

/// A user and a group: the owner of a new inode, and who a call acts as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

thread_local! {
    /// The credentials the library's calls on this thread act with.
    static CALLER: Cell<Option<Owner>> = const { Cell::new(None) };
}

/// While alive, the calling thread acts as one user (see `acting_as`).
pub struct ActingAs {
    before: Option<Owner>,
}

impl Drop for ActingAs {
    fn drop(&mut self) {
        CALLER.with(|c| c.set(self.before));
    }
}

/// Makes the calling thread act as `who` until the guard drops: a privileged
/// caller may take the reserved blocks.
pub fn acting_as(who: Owner) -> ActingAs {
    ActingAs { before: CALLER.with(|c| c.replace(Some(who))) }
}

/// Who the calling thread acts as, if it has said (see `acting_as`).
pub(crate) fn caller() -> Option<Owner> {
    CALLER.with(|c| c.get())
}

/// Acts as `who` only when the calling thread has not said who it is.
pub(crate) fn acting_as_unless_set(who: Owner) -> Option<ActingAs> {
    CALLER.with(|c| c.get()).is_none().then(|| acting_as(who))
}

/// A group's free blocks as runs: start bit -> length, and how many runs
/// there are of each length. Finding a run near a goal, or one long enough, is
/// a range query instead of a walk over the bitmap.
#[derive(Default)]
pub struct FreeRuns {
    runs: std::collections::BTreeMap<u32, u32>,
    lengths: std::collections::BTreeMap<u32, u32>,
}

impl FreeRuns {
    pub fn from_bitmap(bitmap: &[u8], nbits: u32) -> FreeRuns {
        let mut free = FreeRuns::default();
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
            free.insert_run(start, bit - start);
        }
        free
    }

    fn insert_run(&mut self, start: u32, len: u32) {
        self.runs.insert(start, len);
        *self.lengths.entry(len).or_insert(0) += 1;
    }

    fn remove_run(&mut self, start: u32) -> Option<u32> {
        let len = self.runs.remove(&start)?;
        if let Some(count) = self.lengths.get_mut(&len) {
            *count -= 1;
            if *count == 0 {
                self.lengths.remove(&len);
            }
        }
        Some(len)
    }

    /// The longest free run's length (0 when the group is full).
    pub fn longest(&self) -> u32 {
        self.lengths.keys().next_back().copied().unwrap_or(0)
    }

    /// The first run at or after `goal`, wrapping to the group's start, whose
    /// length passes `fits`.
    fn first_run_after(&self, goal: u32, fits: impl Fn(u32) -> bool) -> Option<(u32, u32)> {
        self.runs.range(goal..).chain(self.runs.range(..goal)).find(|(_, &l)| fits(l)).map(|(&s, &l)| (s, l))
    }

    /// Takes up to `max` free blocks near `goal`, as the kernel's mballoc
    /// chooses: at the goal when the run there holds all `max` (a file growing
    /// in place); else the first run after the goal (wrapping) that holds them
    /// all; else the longest run, or the goal's when it is as long. A request
    /// is never broken into the small holes that deleted files leave near the
    /// goal while a run that fits it exists. Returns (start bit, length);
    /// `None` when the group has no run of at least `min_len`.
    pub fn take(&mut self, goal: u32, max: u32, min_len: u32) -> Option<(u32, u32)> {
        let max = max.max(1);
        let containing = self.runs.range(..=goal).next_back().filter(|(&s, &l)| s + l > goal).map(|(&s, &l)| (s, l));
        let at_goal = containing.map(|(s, l)| s + l - goal);
        let (run_start, run_len, at) = match (containing, at_goal) {
            (Some((s, l)), Some(tail)) if tail >= max => (s, l, goal),
            _ if self.longest() >= max => {
                let (s, l) = self.first_run_after(goal, |l| l >= max)?;
                (s, l, s)
            }
            _ => {
                let longest = self.longest();
                match (containing, at_goal) {
                    (Some((s, l)), Some(tail)) if tail >= longest => (s, l, goal),
                    _ => {
                        let (s, l) = self.first_run_after(goal, |l| l == longest)?;
                        (s, l, s)
                    }
                }
            }
        };
        let len = max.min(run_start + run_len - at);
        if len < min_len.max(1) {
            return None;
        }
        self.remove_run(run_start);
        if at > run_start {
            self.insert_run(run_start, at - run_start);
        }
        if at + len < run_start + run_len {
            self.insert_run(at + len, run_start + run_len - at - len);
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
                self.remove_run(ps);
                s = ps;
                l += pl;
            }
        }
        if let Some(nl) = self.remove_run(start + len) {
            l += nl;
        }
        self.insert_run(s, l);
    }
}

/// The block and inode allocator of one volume.
pub struct Allocator {
    vol: Arc<Volume>,
    free_blocks: AtomicU64,
    free_inodes: AtomicU64,
    /// Per group: where the last inode search ended, so allocation never rescans from 0.
    inode_hint: Vec<AtomicU32>,
    /// Per group: where the last block search ended.
    block_hint: Vec<AtomicU32>,
    /// Per group: its free runs (start bit -> length), built from the bitmap on first
    /// use and kept current; touched only under the group's lock. Blocks waiting in
    /// `deferred` are free in the bitmap but not in the runs.
    free_runs: Vec<Mutex<Option<FreeRuns>>>,
    policy: Box<dyn InodePolicy>,
    /// Blocks freed by transactions not yet committed, (start, length) by
    /// transaction id.
    deferred: Mutex<BTreeMap<u64, Vec<(u64, u64)>>>,
    /// How many blocks `deferred` holds: subtracted from what may be handed out.
    pending_free_blocks: AtomicU64,
    /// Blocks promised to operations in flight and claimed by allocations in
    /// progress (see reserve.rs).
    promised: AtomicU64,
    /// The kernel's s_resv_clusters: kept for changes that can no longer be refused.
    emergency_blocks: u64,
}

impl Allocator {
    /// An allocator over `vol`, its free counts taken from the group descriptors.
    pub fn new(vol: Arc<Volume>, policy: Box<dyn InodePolicy>) -> Allocator {
        let groups: Vec<_> = vol.groups.iter().map(|g| g.read().clone()).collect();
        Allocator {
            free_blocks: AtomicU64::new(groups.iter().map(|g| g.bg_free_blocks_count as u64).sum()),
            free_inodes: AtomicU64::new(groups.iter().map(|g| g.bg_free_inodes_count as u64).sum()),
            inode_hint: groups.iter().map(|_| AtomicU32::new(0)).collect(),
            block_hint: groups.iter().map(|_| AtomicU32::new(0)).collect(),
            free_runs: groups.iter().map(|_| Mutex::new(None)).collect(),
            policy,
            deferred: Mutex::new(BTreeMap::new()),
            pending_free_blocks: AtomicU64::new(0),
            promised: AtomicU64::new(0),
            emergency_blocks: Self::emergency_pool(vol.geo.blocks_count, vol.geo.has_extents),
            vol,
        }
    }

    pub fn volume(&self) -> &Arc<Volume> {
        &self.vol
    }

    /// The placement policy (to ask it what it holds, in tests and reports).
    pub fn policy(&self) -> &dyn InodePolicy {
        self.policy.as_ref()
    }

    pub fn free_blocks(&self) -> u64 {
        self.free_blocks.load(Ordering::Relaxed)
    }

    pub fn free_inodes(&self) -> u64 {
        self.free_inodes.load(Ordering::Relaxed)
    }

    /// Blocks freed by transactions that have not committed yet.
    pub fn pending_free_blocks(&self) -> u64 {
        self.pending_free_blocks.load(Ordering::Relaxed)
    }

    /// Free blocks an ordinary allocation of the calling thread may take now
    /// (before the reserved blocks, which `reserved_blocks` accounts for): blocks
    /// freed by transactions not yet committed are free on disk but not reusable
    /// until they commit, blocks promised to other operations are theirs, and
    /// the emergency pool is kept for changes that can no longer be refused.
    pub(crate) fn allocatable_blocks(&self) -> u64 {
        let promised_elsewhere = self.promised.load(Ordering::SeqCst).saturating_sub(self.held_here());
        self.free_blocks()
            .saturating_sub(self.pending_free_blocks())
            .saturating_sub(promised_elsewhere)
            .saturating_sub(self.emergency_blocks)
    }

    /// Free blocks an ordinary caller could be promised: the free count less
    /// what is promised, the emergency pool and the reserved blocks (statfs's
    /// f_bavail, as the kernel's ext4_statfs counts it).
    pub fn available_blocks(&self) -> u64 {
        let reserved = self.vol.sb.read().s_r_blocks_count;
        self.free_blocks()
            .saturating_sub(self.promised.load(Ordering::SeqCst))
            .saturating_sub(reserved + self.emergency_blocks)
    }

    /// Blocks promised to operations in flight (statfs leaves them out of
    /// f_bfree, as the kernel leaves out its dirty clusters).
    pub fn promised_blocks(&self) -> u64 {
        self.promised.load(Ordering::SeqCst)
    }

    /// Whether `who` may take the reserved blocks.
    pub fn may_use_reserved(&self, who: Owner) -> bool {
        let sb = self.vol.sb.read();
        who.uid == 0 || who.uid == sb.s_def_resuid as u32 || (sb.s_def_resgid != 0 && who.gid == sb.s_def_resgid as u32)
    }

    /// Blocks the current caller may not take: the reserved ones, unless it is privileged.
    pub(crate) fn reserved_blocks(&self) -> u64 {
        match CALLER.with(|c| c.get()) {
            Some(who) if self.may_use_reserved(who) => 0,
            _ => self.vol.sb.read().s_r_blocks_count,
        }
    }

    /// Transaction `tid` and every one before it committed: the blocks they freed
    /// join the free runs (the journal's commit callback).
    pub(crate) fn committed(&self, tid: u64) {
        let released: Vec<(u64, u64)> = {
            let mut deferred = self.deferred.lock();
            let later = deferred.split_off(&(tid + 1));
            std::mem::replace(&mut *deferred, later).into_values().flatten().collect()
        };
        for (start, len) in released {
            let mut block = start;
            while block < start + len {
                let g = self.vol.group_of_block(block);
                let gstart = self.vol.group_first_block(g);
                let end = (start + len).min(gstart + self.vol.blocks_in_group(g) as u64);
                if let Some(runs) = self.free_runs.get(g as usize) {
                    if let Some(runs) = runs.lock().as_mut() {
                        runs.put((block - gstart) as u32, (end - block) as u32);
                    }
                }
                block = end;
            }
            self.pending_free_blocks.fetch_sub(len, Ordering::Relaxed);
        }
    }

    /// Whether space is short enough that the blocks waiting for a commit to be
    /// reusable are needed: an operation may want a few hundred blocks of
    /// headroom, and would otherwise fail with ENOSPC while they wait.
    pub(crate) fn frees_wanted(&self) -> bool {
        const LOW_SPACE_BLOCKS: u64 = 1024;
        if self.pending_free_blocks() == 0 {
            return false;
        }
        let reserved = self.vol.sb.read().s_r_blocks_count;
        self.allocatable_blocks() < reserved + LOW_SPACE_BLOCKS
    }

    /// Promises (before anything changes) the `blocks` an operation could need
    /// at most, beyond those the caller may not take (the reserved ones, unless
    /// privileged, and the emergency pool): held for the operation while the
    /// returned guard lives, so a change never runs out of space halfway (a
    /// handle cannot be undone once it has dirtied buffers).
    ///
    /// # Errors
    /// `NoSpace` when not enough blocks are free, after letting the frees of
    /// uncommitted transactions commit once when the caller holds no handle.
    pub(crate) fn ensure_space(&self, blocks: u64) -> Result<Reservation<'_>> {
        if let Some(promise) = self.try_promise(blocks) {
            return Ok(promise);
        }
        if let Some(journal) = self.vol.journal() {
            // Blocks freed by transactions not yet committed come back when
            // they commit: wait for that once and look again, as the kernel's
            // ext4_should_retry_alloc does (the journal thread takes no lock
            // the caller may hold; inside a handle we cannot wait).
            let pending = self.pending_free_blocks() > 0;
            if pending && HANDLES_HELD.with(|h| h.get()) == 0 {
                journal.commit_all()?;
                if let Some(promise) = self.try_promise(blocks) {
                    return Ok(promise);
                }
            } else if pending {
                journal.request_commit();
            }
        }
        let reserved = self.reserved_blocks();
        Err(Error::NoSpace(format!(
            "{} free blocks (not counting those freed since the last commit or promised to other operations), \
             {reserved} reserved, {} kept for changes that cannot be refused, up to {blocks} needed",
            self.allocatable_blocks(),
            self.emergency_blocks
        )))
    }
}

#[cfg(test)]
mod allocator_tests;

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
        assert_eq!(runs.longest(), 79);
        assert_eq!(runs.take(15, 5, 1), Some((15, 5)), "at the goal, when its run holds the request");
        assert_eq!(runs.take(12, 8, 1), Some((21, 8)), "else the first run after the goal that holds it");
        assert_eq!(runs.take(12, 100, 1), Some((29, 71)), "else the longest run");
        assert_eq!(runs.take(12, 4, 5), None, "nothing of at least min_len");
        assert_eq!(runs.take(12, 2, 1), Some((12, 2)));
        assert_eq!(runs.take(200, 1, 1), Some((10, 1)), "wraps to the first run");
        assert_eq!(runs.longest(), 1, "bits 11 and 14 are left");
        for (start, len) in [(10, 1), (12, 2), (15, 5), (21, 8), (29, 71)] {
            runs.put(start, len);
        }
        assert_eq!(runs.runs.get(&10), Some(&10), "neighbours merge");
        assert_eq!(runs.longest(), 79);
        assert_eq!(runs.runs.iter().map(|(&s, &l)| (s, l)).collect::<Vec<_>>(), [(10, 10), (21, 79)]);
    }
}
