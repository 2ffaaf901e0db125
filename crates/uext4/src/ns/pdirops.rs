//! Parallel directory operations (seed 002, Alex Tomas 2005; Lustre's
//! htree_lock in production): changes of different names in one indexed
//! directory go on side by side.
//!
//! Protocol (levels as in docs/ARCHITECTURE.md):
//! - The directory lock (`dir_locks`, 2a) is taken shared by a change in an
//!   indexed directory when `pdirops` is on, exclusive otherwise (linear and
//!   inline directories, pdirops off). A directory's index flag changes only
//!   under the exclusive hold (linear → htree; remove_tree's clearing of a
//!   directory it empties) or when the directory is freed, so "indexed" judged
//!   under the shared hold stays true until it is released.
//! - Under a shared hold, each name changed is locked by its hash slot
//!   (`name_locks`, 2b, key (directory, slot)): two changes of one name
//!   serialize, so an exclusive create or a rename stays atomic from its
//!   lookup to its change; changes of different names do not meet here. A
//!   lookup from outside (`Filesystem::lookup`) takes its name's slot shared,
//!   so it sees a rename — which adds the new name before it removes the old
//!   one — whole; changes look names up under their own slots
//!   (`lookup_held`). Listings take no slots: one may show both names of a
//!   rename in progress (never neither).
//! - The directory's own inode lock (3) is taken shared by every change of its
//!   names; changes of the inode itself (setattr, xattrs, its removal by rmdir or
//!   a rename over it) take it exclusive, so "the directory is still linked"
//!   checked under the shared hold stays true until the name is added.
//! - Blocks (`dir_structure`, 5): a name goes into, or leaves, an existing leaf
//!   under the structure lock held for reading, the leaf's buffer lock making
//!   the block change atomic; a full leaf drops the read hold and retries the
//!   whole insert under the write hold (Lustre's CW → EX), where it may find
//!   that someone else split the leaf meanwhile. Everything that changes the
//!   index, the size or the map, or turns a directory into another kind, holds
//!   it for writing, as before.
//! - The directory inode's times and link count are short updates under its
//!   attribute lock (`attr_locks`, 5b, taken last), applied to the inode as it
//!   is then; a change that made the directory grow also writes its size and
//!   map there, before its structure write hold ends.

use crate::error::Result;
use crate::format::inode::Inode;
use crate::fs::Filesystem;
use crate::journal::handle::Handle;
use crate::locks::{Mode, RwHeld};

/// Name-lock slots per directory: name hashes are folded to this many. The
/// lock table only holds slots in use, so a wide space costs nothing, and two
/// of T concurrent changes share a slot with odds of about T² / 2^17 — a few in
/// a million for the 2 to 4 threads of this machine.
const NAME_SLOTS: u32 = 1 << 16;

/// The slot of `name`: FNV-1a, folded. Any hash spreading names would do; this
/// one needs no directory state (the htree's hash needs the root's version and
/// the seed, which a linear directory does not have yet).
pub(crate) fn name_slot(name: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in name {
        h = (h ^ b as u32).wrapping_mul(0x0100_0193);
    }
    (h ^ (h >> 16)) % NAME_SLOTS
}

pub(crate) fn slot_key(dir: u32, name: &[u8]) -> u64 {
    ((dir as u64) << 32) | name_slot(name) as u64
}

/// The namespace locks of one change (levels 2a and 2b), held until dropped.
pub(crate) struct NameLocks<'a> {
    /// Directories held shared: their changes take the leaf path (`add_name`).
    shared: Vec<u32>,
    _dirs: Vec<RwHeld<'a>>,
    _names: Vec<RwHeld<'a>>,
}

impl NameLocks<'_> {
    /// Whether `dir` is held shared (an indexed directory under pdirops).
    pub(crate) fn parallel(&self, dir: u32) -> bool {
        self.shared.contains(&dir)
    }
}

impl Filesystem {
    fn wants_parallel(&self, dir: u32) -> Result<bool> {
        Ok(self.pdirops && self.is_indexed(&*self.inode(dir)?))
    }

    /// Takes the directory and name locks for changing each (directory, name):
    /// directories in ascending inode order, shared where pdirops applies, then
    /// the name slots of the shared ones in ascending key order.
    ///
    /// With pdirops on every directory is first taken shared and judged once
    /// held: an indexed one stays so (its index flag changes only under the
    /// exclusive hold), any other is let go and taken exclusive, which costs a
    /// change in a linear directory one more uncontended lock and release.
    /// Judging before taking the lock as well read each directory's inode
    /// twice per change, a line both CPUs changing names in one directory met on.
    ///
    /// # Errors
    /// What reading a directory's inode gives (out of range, I/O).
    pub(crate) fn lock_names(&self, names: &[(u32, &[u8])]) -> Result<NameLocks<'_>> {
        let mut dirs: Vec<u32> = names.iter().map(|&(d, _)| d).collect();
        dirs.sort_unstable();
        dirs.dedup();
        let first = if self.pdirops { Mode::Shared } else { Mode::Exclusive };
        let mut modes: Vec<(u64, Mode)> = dirs.iter().map(|&d| (d as u64, first)).collect();
        loop {
            let held = self.dir_locks.lock_modes(&modes);
            // Each round turns at least one directory exclusive, so this ends.
            let mut linear = Vec::new();
            for (i, &(d, mode)) in modes.iter().enumerate() {
                if mode == Mode::Shared && !self.wants_parallel(d as u32)? {
                    linear.push(i);
                }
            }
            if !linear.is_empty() {
                drop(held);
                for i in linear {
                    modes[i].1 = Mode::Exclusive;
                }
                continue;
            }
            let shared: Vec<u32> = modes.iter().filter(|(_, m)| *m == Mode::Shared).map(|&(d, _)| d as u32).collect();
            let keys: Vec<u64> =
                names.iter().filter(|(d, _)| shared.contains(d)).map(|&(d, n)| slot_key(d, n)).collect();
            let names_held = self.name_locks.write_many(&keys);
            return Ok(NameLocks { shared, _dirs: held, _names: names_held });
        }
    }

    /// Writes directory `dir`'s inode under its attribute lock: the inode as it
    /// is now, or, from a change that holds the structure lock for writing and
    /// changed size, map or flags, that change's `grown` inode with the current
    /// times and link count; then `attrs` applied. An inode `attrs` leaves as
    /// it was is not written.
    ///
    /// # Errors
    /// What writing the inode gives.
    pub(crate) fn update_dir_attrs(
        &self,
        tx: &mut Handle,
        dir: u32,
        grown: Option<Inode>,
        attrs: &dyn Fn(&mut Inode),
    ) -> Result<()> {
        let _attr = self.attr_locks.lock(dir as u64);
        let current = self.inode(dir)?;
        let grew = grown.is_some();
        let mut inode = match grown {
            Some(mut g) => {
                (g.i_atime, g.i_mtime, g.i_ctime) = (current.i_atime, current.i_mtime, current.i_ctime);
                g.i_links_count = current.i_links_count;
                g
            }
            None => (*current).clone(),
        };
        attrs(&mut inode);
        if !grew && inode == *current {
            // Nothing changed (times already this tick's): no write, no block dirtied.
            return Ok(());
        }
        self.write_inode(tx, dir, &inode)
    }

    /// Adds `name` → `ino` to `dir` and applies `attrs` to the directory inode.
    /// With `parallel` (the caller holds `dir` shared and the name's slot), into
    /// its leaf under the structure read lock when the leaf has room; otherwise,
    /// and on a full leaf, under the write lock (an inline directory takes the name
    /// in place, or moves to a block when full: inline/dir.rs).
    ///
    /// # Errors
    /// What the directory code gives; a full leaf is not an error.
    pub(crate) fn add_name(
        &self,
        tx: &mut Handle,
        dir: u32,
        parallel: bool,
        entry: (&[u8], u32, u8),
        attrs: &dyn Fn(&mut Inode),
    ) -> Result<()> {
        let (name, ino, file_type) = entry;
        if parallel {
            let read = self.dir_structure.read(dir as u64);
            let inode = self.inode(dir)?;
            if self.is_indexed(&inode) && self.dx_add_to_leaf(tx, dir, &inode, name, ino, file_type)? {
                drop(read);
                return self.update_dir_attrs(tx, dir, None, attrs);
            }
        }
        let _write = self.dir_structure.write(dir as u64);
        let inode = self.inode(dir)?;
        let grown = self.add_entry(tx, dir, (*inode).clone(), name, ino, file_type)?;
        // Written before the write hold ends: readers map blocks through it.
        self.update_dir_attrs(tx, dir, Some(grown), attrs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_spread_names_and_stay_in_range() {
        let slots: std::collections::HashSet<u32> =
            (0..10_000).map(|i| name_slot(format!("f-{i}").as_bytes())).collect();
        assert!(slots.iter().all(|&s| s < NAME_SLOTS));
        // 10,000 names into 65,536 slots: about 9,300 distinct expected.
        assert!(slots.len() > 9_000, "{} distinct slots", slots.len());
    }
}
