//! Directory inode reservation, `dir_ireserve` (seed 000: Coly Li's patch and
//! its review).
//!
//! A new directory takes the first slot of a free, aligned window of N inode
//! slots (low 16, normal 64, high 128, or N); its files take the free slots of
//! that window, so a directory and its files share inode-table blocks and an
//! operation on both dirties one block instead of two. When the window is full
//! the directory gets another, twice as large, up to `MAX_WINDOW_FACTOR` times N
//! (Andreas Dilger: the window grows with the directory), in the parent's group
//! (Jan Kara: the group is the parent's, not whatever the generic policy picks);
//! only when none is free there does the file go where the ordinary policy puts
//! it. A new directory looks for its window in the groups the ordinary policy
//! would try, in that order; a top-level one in the flex group where the
//! ordinary policy would put it, packed from that flex group's first group:
//! directories made one after another take windows one after another (seed
//! 000's round-robin creates then walk windows and first blocks in order, and
//! packed windows go home in long runs), where the kernel's Orlov choice, the
//! emptiest flex group, alternated them between flex groups.
//!
//! Each group keeps a next-free-window hint (Mingming Cao): the first base
//! window that may be free. Searches start there, never at bit 0, and a freed
//! inode lowers it; that rescan from bit 0 on every mkdir is the likely cause
//! of the seed's 3.7x slower mkdir.
//!
//! Nothing is written for a window: it is a claim in memory, soft (the
//! ordinary pass may hand its free slots to anyone once no window is left), so
//! a full inode table still fills completely and the on-disk format is
//! unchanged. After a remount the claims are gone; a directory's window is
//! derived again from the inode numbers in its block the new name goes into
//! (Andreas Dilger's restart idea): the base window holding one of them, if it
//! has a free slot and nobody claims it.
//!
//! Invariants (under `state`): claimed windows never overlap; every directory
//! in `dirs` owns exactly the claim it names; a window is claimed only while
//! all its slots were free (new) or it holds its directory's inodes (derived).
//! The state mutex is a leaf lock, taken under a group lock.

use super::inode::{InodePolicy, InodeRequest, MainlinePolicy};
use crate::error::{Error, Result};
use crate::format::bitmap;
use crate::volume::Volume;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};

/// How many inode slots a new directory reserves (`dir_ireserve=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DirReserve {
    /// No reservation (the default).
    #[default]
    Off,
    /// A window of this many slots, the directory's own included.
    Slots(u32),
}

/// The named levels of the seed's patch: 16, 64 and 128 slots.
const NAMED: [(&str, u32); 3] = [("low", 16), ("normal", 64), ("high", 128)];

impl DirReserve {
    /// `off`, `low`, `normal`, `high` or a number of slots (2 to 65,536).
    ///
    /// # Errors
    /// `Invalid` for anything else.
    pub fn parse(value: &str) -> Result<DirReserve> {
        if value == "off" {
            return Ok(DirReserve::Off);
        }
        if let Some(&(_, n)) = NAMED.iter().find(|(name, _)| *name == value) {
            return Ok(DirReserve::Slots(n));
        }
        match value.parse::<u32>() {
            Ok(n) if (2..=65536).contains(&n) => Ok(DirReserve::Slots(n)),
            _ => Err(Error::Invalid(format!(
                "dir_ireserve={value}: expected off, low (16), normal (64), high (128) or a number of slots from 2 to 65536"
            ))),
        }
    }

    /// The window size in inode slots; None when off.
    pub fn slots(self) -> Option<u32> {
        match self {
            DirReserve::Off => None,
            DirReserve::Slots(n) => Some(n),
        }
    }
}

impl std::fmt::Display for DirReserve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DirReserve::Off => f.write_str("off"),
            DirReserve::Slots(n) => match NAMED.iter().find(|(_, m)| m == n) {
                Some((name, _)) => f.write_str(name),
                None => write!(f, "{n}"),
            },
        }
    }
}

/// A run of inode numbers [start, start + len).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Window {
    pub start: u32,
    pub len: u32,
}

impl Window {
    fn end(self) -> u32 {
        self.start + self.len
    }
}

/// Grown windows reach at most this many times the base size (and the group).
const MAX_WINDOW_FACTOR: u32 = 16;

/// Directories remembered at most; past it the memory is dropped and windows
/// are derived again from directory blocks, as after a remount.
const MAX_DIRS: usize = 1 << 20;

#[derive(Default)]
struct State {
    /// Directory inode -> its current window.
    dirs: HashMap<u32, Window>,
    /// Window start -> (length, owning directory): the claims, none overlapping.
    claimed: BTreeMap<u32, (u32, u32)>,
}

impl State {
    /// The directory claiming any of `w`'s slots, if one does.
    fn claimant(&self, w: Window) -> Option<u32> {
        let before = self.claimed.range(..w.end()).next_back();
        before.filter(|(&start, &(len, _))| start + len > w.start).map(|(_, &(_, dir))| dir)
    }

    fn set(&mut self, dir: u32, w: Window) {
        self.release(dir);
        self.claimed.insert(w.start, (w.len, dir));
        self.dirs.insert(dir, w);
    }

    fn release(&mut self, dir: u32) {
        if let Some(old) = self.dirs.remove(&dir) {
            self.claimed.remove(&old.start);
        }
    }
}

/// The `dir_ireserve` placement policy (see the module comment).
pub struct DirReservePolicy {
    slots: u32,
    max_window: u32,
    ipg: u32,
    /// Per group: the first base window that may be free.
    next_free: Vec<AtomicU32>,
    state: Mutex<State>,
    ordinary: MainlinePolicy,
}

impl DirReservePolicy {
    /// # Errors
    /// `Invalid` when a window of `slots` does not fit in a group.
    pub fn new(vol: &Volume, slots: u32) -> Result<DirReservePolicy> {
        let ipg = vol.geo.inodes_per_group;
        if slots < 2 || slots > ipg {
            return Err(Error::Invalid(format!("dir_ireserve={slots}: a window must fit in a group of {ipg} inodes")));
        }
        let largest = (ipg / slots).max(1) * slots;
        Ok(DirReservePolicy {
            slots,
            max_window: (slots.saturating_mul(MAX_WINDOW_FACTOR)).min(largest),
            ipg,
            next_free: (0..vol.geo.group_count).map(|_| AtomicU32::new(0)).collect(),
            state: Mutex::new(State::default()),
            ordinary: MainlinePolicy,
        })
    }

    fn group_of(&self, ino: u32) -> u32 {
        (ino - 1) / self.ipg
    }

    fn index_of(&self, ino: u32) -> u32 {
        (ino - 1) % self.ipg
    }

    fn window_at(&self, g: u32, index: u32, len: u32) -> Window {
        Window { start: g * self.ipg + index + 1, len }
    }

    /// A free, unclaimed window of `len` slots (a multiple of the base size)
    /// aligned at `len` in group `g`; returns its first index. Searches from the
    /// group's next-free-window hint; a search for a base window moves the hint
    /// to what it found.
    fn free_window(&self, st: &State, g: u32, bits: &[u8], len: u32, usable: &dyn Fn(u32) -> bool) -> Option<u32> {
        let per = len / self.slots;
        let hint = &self.next_free[g as usize];
        let mut w = hint.load(Ordering::Relaxed).div_ceil(per) * per;
        while (w + per) * self.slots <= self.ipg {
            let lo = w * self.slots;
            let free = all_clear(bits, lo, len) && usable(lo) && usable(lo + len - 1);
            if free && st.claimant(self.window_at(g, lo, len)).is_none() {
                if len == self.slots {
                    hint.store(w + 1, Ordering::Relaxed);
                }
                return Some(lo);
            }
            w += per;
        }
        if len == self.slots {
            hint.store(w, Ordering::Relaxed);
        }
        None
    }

    /// The first free, usable slot of `w`, which lies in group `g`.
    fn free_slot_in(&self, g: u32, bits: &[u8], w: Window, usable: &dyn Fn(u32) -> bool) -> Option<u32> {
        let lo = self.index_of(w.start);
        (lo..lo + w.len)
            .find(|&i| usable(i) && !bitmap::test_bit(bits, i as usize))
            .filter(|_| self.group_of(w.start) == g)
    }

    /// After a remount: the base window holding the parent or one of its
    /// entries' inodes (highest first: the newest) in group `g`, if it has a free
    /// slot and no other directory claims it.
    fn derive(
        &self,
        st: &State,
        g: u32,
        bits: &[u8],
        req: &InodeRequest,
        usable: &dyn Fn(u32) -> bool,
    ) -> Option<Window> {
        let mut candidates: Vec<u32> = std::iter::once(req.parent).chain(req.neighbours.iter().copied()).collect();
        candidates.retain(|&ino| ino >= 1 && self.group_of(ino) == g);
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        candidates.dedup();
        candidates.into_iter().find_map(|ino| {
            let lo = self.index_of(ino) / self.slots * self.slots;
            if lo + self.slots > self.ipg {
                return None;
            }
            let w = self.window_at(g, lo, self.slots);
            let ours = st.claimant(w).is_none_or(|d| d == req.parent);
            (ours && self.free_slot_in(g, bits, w, usable).is_some()).then_some(w)
        })
    }
}

/// Whether bits [from, from + len) are all clear.
fn all_clear(bits: &[u8], from: u32, len: u32) -> bool {
    let (from, len) = (from as usize, len as usize);
    if from % 8 == 0 && len % 8 == 0 {
        return bits.get(from / 8..(from + len) / 8).is_some_and(|b| b.iter().all(|&x| x == 0));
    }
    (from..from + len).all(|i| !bitmap::test_bit(bits, i))
}

impl InodePolicy for DirReservePolicy {
    fn group_order(&self, vol: &Volume, req: &InodeRequest) -> Vec<u32> {
        self.ordinary.group_order(vol, req)
    }

    fn preferred(&self, vol: &Volume, req: &InodeRequest) -> Vec<u32> {
        match req.is_dir {
            // A top-level directory's window goes in the flex group where the
            // ordinary policy would put the directory, packed from its first
            // group: directories made one after another stay together there,
            // as their first blocks do (the flex group's first group), and
            // packed windows are written home in a few long runs instead of
            // one per group.
            true if req.parent == crate::ns::ROOT_INO => {
                super::inode::packed_in_flex(vol, self.ordinary.group_order(vol, req))
            }
            true => self.ordinary.group_order(vol, req),
            false => vec![self.group_of(req.parent)],
        }
    }

    fn pick(
        &self,
        _vol: &Volume,
        g: u32,
        bits: &[u8],
        req: &InodeRequest,
        usable: &dyn Fn(u32) -> bool,
    ) -> Option<u32> {
        let mut st = self.state.lock();
        if st.dirs.len() >= MAX_DIRS {
            *st = State::default();
        }
        if req.is_dir {
            // The directory's inode is its window's first slot: claimed for it now
            // (its number is known), before the group lock lets anyone else look.
            let lo = self.free_window(&st, g, bits, self.slots, usable)?;
            let w = self.window_at(g, lo, self.slots);
            st.set(w.start, w);
            return Some(lo);
        }
        if self.group_of(req.parent) != g {
            return None;
        }
        let current = match st.dirs.get(&req.parent).copied() {
            Some(w) => Some(w),
            None => {
                let derived = self.derive(&st, g, bits, req, usable);
                if let Some(w) = derived {
                    st.set(req.parent, w);
                }
                derived
            }
        };
        if let Some(slot) = current.and_then(|w| self.free_slot_in(g, bits, w, usable)) {
            return Some(slot);
        }
        // Full (or none could be derived): a window twice as large, else any
        // smaller one down to the base size.
        let grown = current.map_or(self.slots * 2, |w| w.len.saturating_mul(2)).min(self.max_window);
        let mut len = grown;
        loop {
            if let Some(lo) = self.free_window(&st, g, bits, len, usable) {
                st.set(req.parent, self.window_at(g, lo, len));
                return Some(lo);
            }
            if len <= self.slots {
                return None;
            }
            len = (len / 2).max(self.slots) / self.slots * self.slots;
        }
    }

    fn freed(&self, _vol: &Volume, ino: u32, was_dir: bool) {
        let (g, index) = (self.group_of(ino), self.index_of(ino));
        if let Some(hint) = self.next_free.get(g as usize) {
            hint.fetch_min(index / self.slots, Ordering::Relaxed);
        }
        if was_dir {
            self.state.lock().release(ino);
        }
    }

    fn wants_neighbours(&self, parent: u32, _indexed: bool, is_dir: bool) -> bool {
        // A new directory takes a new window: its parent's files do not matter.
        !is_dir && !self.state.lock().dirs.contains_key(&parent)
    }

    fn windows(&self) -> Vec<(u32, Window)> {
        let st = self.state.lock();
        let mut out: Vec<(u32, Window)> = st.dirs.iter().map(|(&d, &w)| (d, w)).collect();
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_print_as_the_seed_names_them() {
        assert_eq!(DirReserve::parse("low").unwrap(), DirReserve::Slots(16));
        assert_eq!(DirReserve::parse("normal").unwrap(), DirReserve::Slots(64));
        assert_eq!(DirReserve::parse("high").unwrap(), DirReserve::Slots(128));
        assert_eq!(DirReserve::parse("32").unwrap(), DirReserve::Slots(32));
        assert_eq!(DirReserve::parse("off").unwrap(), DirReserve::Off);
        for bad in ["1", "0", "huge", "70000", ""] {
            assert!(matches!(DirReserve::parse(bad), Err(Error::Invalid(_))), "{bad}");
        }
        assert_eq!(DirReserve::Slots(64).to_string(), "normal");
        assert_eq!(DirReserve::Slots(48).to_string(), "48");
    }

    #[test]
    fn claims_never_overlap() {
        let mut st = State::default();
        st.set(1, Window { start: 17, len: 16 });
        assert_eq!(st.claimant(Window { start: 1, len: 16 }), None);
        assert_eq!(st.claimant(Window { start: 1, len: 32 }), Some(1));
        assert_eq!(st.claimant(Window { start: 32, len: 16 }), Some(1));
        assert_eq!(st.claimant(Window { start: 33, len: 16 }), None);
        st.set(1, Window { start: 33, len: 32 });
        assert_eq!(st.claimant(Window { start: 17, len: 16 }), None, "a grown window replaces the old claim");
        st.release(1);
        assert!(st.claimed.is_empty() && st.dirs.is_empty());
    }
}
