//! Space promised to operations before they change anything.
//!
//! An operation that needs new blocks asks for its worst case up front
//! (`Allocator::ensure_space`) and gets a `Reservation`: the blocks are counted
//! as promised (the kernel's s_dirtyclusters_counter plays this part), so no
//! other caller can take them, and the operation's own allocations draw on them
//! when free space runs short. A refusal therefore comes before the first
//! `tx.dirty`, where ENOSPC is an ordinary answer; without it, a disk filling
//! under concurrent writers would leave an operation halfway, and a handle that
//! cannot finish aborts the journal.
//!
//! Every allocation claims its blocks on the same counter before it searches the
//! bitmaps, so a promise and a claim can never both count the same free block.
//! Two floors stand under ordinary claims: the reserved blocks
//! (s_r_blocks_count, for privileged callers only) and the kernel's
//! s_resv_clusters — 2% of the filesystem or 4,096 blocks, whichever is smaller,
//! none without extents — kept for changes that can no longer be refused (a tree
//! node for a punch, the last block of an operation whose estimate fell short).
//! Only an allocation that finds nothing above the floors dips below them.
//!
//! Invariants: `promised` is the sum of the live reservations' unused blocks
//! plus the claims of allocations in progress; a thread's reservations are
//! recorded in `HELD` under their allocator's address, and dropped in the reverse
//! order they were made (guards on the stack).

use super::Allocator;
use std::cell::RefCell;
use std::sync::atomic::Ordering;

thread_local! {
    /// This thread's live reservations: (allocator address, unused blocks), innermost last.
    static HELD: RefCell<Vec<(usize, u64)>> = const { RefCell::new(Vec::new()) };
}

/// Blocks promised to the calling thread's operation; they return to the free
/// pool (what is left of them) when the guard drops.
#[must_use = "the reservation lasts only while its guard lives"]
pub struct Reservation<'a> {
    alloc: &'a Allocator,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let key = self.alloc.key();
        let unused = HELD.with(|held| {
            let mut held = held.borrow_mut();
            let at = held.iter().rposition(|&(k, _)| k == key);
            at.map(|at| held.remove(at).1).unwrap_or(0)
        });
        self.alloc.promised.fetch_sub(unused, Ordering::SeqCst);
    }
}

impl Allocator {
    fn key(&self) -> usize {
        self as *const Allocator as usize
    }

    /// The kernel's s_resv_clusters (ext4_calculate_resv_clusters).
    pub(crate) fn emergency_pool(blocks_count: u64, extents: bool) -> u64 {
        if extents {
            (blocks_count / 50).min(4096)
        } else {
            0
        }
    }

    /// Blocks the calling thread's reservations on this allocator still hold.
    pub(crate) fn held_here(&self) -> u64 {
        let key = self.key();
        HELD.with(|held| held.borrow().iter().filter(|&&(k, _)| k == key).map(|&(_, n)| n).sum())
    }

    /// Free blocks beyond everything promised, the pending frees, and `floor`.
    fn unpromised_above(&self, promised: u64, floor: u64) -> u64 {
        self.free_blocks().saturating_sub(self.pending_free_blocks()).saturating_sub(promised).saturating_sub(floor)
    }

    /// Promises `blocks` if that many are free above the floors for the
    /// calling thread (the reserved blocks unless privileged, and the emergency
    /// pool); returns whether it did.
    pub(super) fn try_promise(&self, blocks: u64) -> Option<Reservation<'_>> {
        let floor = self.reserved_blocks() + self.emergency_blocks;
        let mut promised = self.promised.load(Ordering::SeqCst);
        loop {
            if self.unpromised_above(promised, floor) < blocks {
                return None;
            }
            match self.promised.compare_exchange(promised, promised + blocks, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => break,
                Err(now) => promised = now,
            }
        }
        HELD.with(|held| held.borrow_mut().push((self.key(), blocks)));
        Some(Reservation { alloc: self })
    }

    /// Claims up to `want` blocks (at least one) for an allocation about to
    /// search the bitmaps: first from the free blocks above the floors, then
    /// from the thread's reservations (so an operation's first allocations leave
    /// its promise for its last), and only when neither has any, from below the
    /// floors. Returns (claimed beside the reservations, claimed from them); the
    /// caller settles the claim with `settle` once it knows how many it got.
    pub(super) fn claim(&self, want: u64) -> Option<(u64, u64)> {
        let held = self.held_here();
        let floor = self.reserved_blocks() + self.emergency_blocks;
        let mut promised = self.promised.load(Ordering::SeqCst);
        loop {
            let extra = self.unpromised_above(promised, floor).min(want);
            let from_held = held.min(want - extra);
            if extra + from_held == 0 {
                break;
            }
            match self.promised.compare_exchange(promised, promised + extra, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return Some((extra, from_held)),
                Err(now) => promised = now,
            }
        }
        // Nothing above the floors and nothing promised: a change that can no
        // longer be refused takes from below them.
        loop {
            let extra = self.unpromised_above(promised, 0).min(want);
            if extra == 0 {
                return None;
            }
            match self.promised.compare_exchange(promised, promised + extra, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return Some((extra, 0)),
                Err(now) => promised = now,
            }
        }
    }

    /// Ends a claim: `got` blocks were allocated (and left the free count).
    /// They count against the part claimed beside the reservations first; what
    /// exceeds it is taken from the thread's reservations, and the rest of the
    /// claim is given back.
    pub(super) fn settle(&self, claim: (u64, u64), got: u64) {
        let (extra, from_held) = claim;
        let used_held = got.saturating_sub(extra).min(from_held);
        if used_held > 0 {
            let key = self.key();
            HELD.with(|held| {
                let mut left = used_held;
                for (k, n) in held.borrow_mut().iter_mut().rev() {
                    if *k == key && left > 0 {
                        let take = left.min(*n);
                        *n -= take;
                        left -= take;
                    }
                }
            });
        }
        self.promised.fetch_sub(extra + used_held, Ordering::SeqCst);
    }
}
