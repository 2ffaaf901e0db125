//! `remove_tree`: a directory and everything below it removed by the
//! filesystem itself, in inode order (seed 003's option 3).
//!
//! Deleting a huge indexed directory name by name in readdir (hash) order
//! touches the inode table at random; once the table no longer fits in the
//! cache every block is written out and read back several times. Here a big
//! indexed directory is first rewritten as a linear directory whose entries
//! lie in inode order (`sort_for_removal`), so that removing names in inode
//! order also walks its blocks in order and each is dirtied about once. Then
//! each pass over a directory keeps the `CHUNK_ENTRIES` entries with the lowest
//! inode numbers (a bounded max-heap) and removes them window by window: a
//! window is the entries whose inodes lie in the next eighth-of-the-cache of
//! inode-table blocks (read ahead in table order, then kept in the cache), and
//! within it names go in the order of the directory blocks they were seen in,
//! so each table block and each directory leaf is dirtied about once per window
//! instead of once per transaction.
//!
//! Invariants:
//! - Memory is bounded for any directory size and depth: a pass holds at most
//!   `CHUNK_ENTRIES` entries, less those the directories above it still hold
//!   waiting to be descended into, but never fewer than `MIN_CHUNK_ENTRIES`:
//!   at most `CHUNK_ENTRIES + MIN_CHUNK_ENTRIES × depth` entries (each a name
//!   of at most 255 bytes) at once. The sort holds one directory's entries and
//!   its sorted blocks, and is done only for directories of at most
//!   `SORT_MAX_BYTES` (64 MiB): at most about twice that. Subdirectories are
//!   removed bottom-up from an explicit stack, so depth costs no Rust stack.
//! - Crash safety: every transaction leaves a consistent filesystem. Up to
//!   `BATCH_NAMES` names of one directory go in one handle, each entry removed
//!   together with its inode's link-count change; an inode at 0 links is
//!   freed in that handle, or put on the orphan list in it (open files, and
//!   files of more than `STEP_BLOCKS` blocks, which are then released
//!   `STEP_BLOCKS` at a time, one handle each). A directory goes by `rmdir`
//!   once empty. A cut at any point leaves part of the tree removed, the rest
//!   a consistent tree, every orphan on the orphan list: the next open's
//!   orphan processing, or another `remove_tree`, finishes it. The sort
//!   builds its blocks in a linkless file on the orphan list and swaps block
//!   maps in one handle: a cut leaves the directory as it was or sorted (the
//!   same names), plus an orphan the next open frees.
//! - Concurrency: each batch takes the namespace locks of an unlink
//!   (docs/ARCHITECTURE.md's order: the directory's lock and the names' slots,
//!   then inode locks ascending, then the handle, then the structure lock) and
//!   checks under them that each name still names the inode the pass saw. A
//!   create in a directory being emptied either lands before its `rmdir`
//!   (which then finds it not empty and the directory gets another pass) or
//!   fails with ENOENT (`require_live_dir`); lookups see each name removed
//!   whole, as with unlink. While a directory is sorted its lock and inode
//!   lock are held exclusively (changes in it wait; lookups go on until the
//!   swap, which takes its structure lock for writing).
//! - I/O: before a window, its table blocks are read in aligned 32-block runs,
//!   one request each (`read_ahead_inode`), as the window uses them whole; a
//!   pass reads the directory in runs of `DIR_READ_AHEAD_BLOCKS` the same way.
//! - A directory whose blocks list names its lookups cannot find (a hash index
//!   that no longer matches its leaves) would be passed over forever: after
//!   `STUCK_LOOKUP_PASSES` passes in a row that remove nothing, `Corrupt`.
//! - An immutable or append-only name (or directory) stops the removal with
//!   EPERM where the kernel's rm -rf would fail on it; what went stays gone.
//! - Hard links: an inode with names elsewhere only loses a link; shared
//!   xattr blocks lose one reference per inode freed (`release_inode`).

use crate::dir::DirEntryOwned;
use crate::error::{Error, Result};
use crate::format::dirent::EXT4_FT_DIR;
use crate::format::inode::*;
use crate::fs::Filesystem;
use crate::locks::Mode;
use crate::ns::change::{check_name, now};
use std::collections::{BTreeMap, BinaryHeap, HashSet};
use std::ops::ControlFlow;

/// Entries one pass over a directory keeps (the lowest inode numbers).
pub const CHUNK_ENTRIES: usize = 65_536;
/// The least a pass keeps, however many its ancestors hold.
const MIN_CHUNK_ENTRIES: usize = 1_024;
/// Names removed in one handle: their leaves, inode-table blocks and xattr
/// blocks stay well inside the smallest journal's hard limit.
pub(crate) const BATCH_NAMES: usize = 64;
/// Passes in a row over one directory that find nothing yet cannot remove it.
const STUCK_PASSES: u32 = 1_000;
/// Passes in a row over one directory that see names but can remove none.
const STUCK_LOOKUP_PASSES: u32 = 8;
/// Blocks a big file releases per handle once on the orphan list.
pub const STEP_BLOCKS: u64 = 4_096;
/// An indexed directory of at least this many blocks is sorted before removal
/// (`sort_for_removal`); below it, its leaves stay in the cache anyway.
const SORT_MIN_BLOCKS: u64 = 64;
/// ... and of at most this many bytes: the sort holds its entries in memory.
const SORT_MAX_BYTES: u64 = 64 << 20;
/// New directory blocks per handle while the sorted copy is built.
const SORT_BLOCKS_PER_HANDLE: u64 = 64;

/// What a `remove_tree` removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemovedTree {
    /// Names removed, the top one included.
    pub names: u64,
    /// Directories removed, the top one included.
    pub directories: u64,
    /// Inodes that lost their last link: freed, or (open files) on the orphan
    /// list until their last close.
    pub inodes_released: u64,
}

/// A directory on the path being removed.
struct Level {
    dir: u32,
    parent: u32,
    name: Vec<u8>,
    /// Subdirectories this directory's last pass found, highest inode first
    /// (popped lowest first).
    subdirs: Vec<(u32, Vec<u8>)>,
}

impl Filesystem {
    /// Removes `name` in directory `parent` and, for a directory, everything
    /// below it; see the module comment (ns/remove_tree.rs) for the order,
    /// the memory bound (at most 65,536 entries per pass, plus 1,024 per level
    /// of depth) and what a crash leaves.
    ///
    /// # Errors
    /// `Invalid` for `.` and `..`; `NotFound` when there is no such name;
    /// `NotADirectory` when `parent` is not a directory; `ReadOnly`, `Corrupt` (a
    /// damaged directory, or a directory loop) as for unlink and rmdir. What was
    /// removed before an error stays removed.
    pub fn remove_tree(&self, parent: u32, name: &[u8]) -> Result<RemovedTree> {
        self.remove_tree_with_progress(parent, name, &mut |_| ControlFlow::Continue(()))
    }

    /// `remove_tree`, calling `progress` with the figures so far after each
    /// handle; `ControlFlow::Break` stops it there (EINTR), the tree part
    /// removed, as a cut would leave it.
    ///
    /// # Errors
    /// As [`Filesystem::remove_tree`]; `Io` (interrupted) when `progress` stopped it.
    pub fn remove_tree_with_progress(
        &self,
        parent: u32,
        name: &[u8],
        progress: &mut dyn FnMut(&RemovedTree) -> ControlFlow<()>,
    ) -> Result<RemovedTree> {
        self.remove_tree_with(parent, name, progress, &mut |_| {})
    }

    /// `remove_tree_with_progress`, also calling `kept_links` with every
    /// inode that lost a link but keeps others (a hard link from outside the
    /// tree): a FUSE server tells the kernel its cached link count is stale.
    ///
    /// # Errors
    /// As [`Filesystem::remove_tree_with_progress`].
    pub fn remove_tree_with(
        &self,
        parent: u32,
        name: &[u8],
        progress: &mut dyn FnMut(&RemovedTree) -> ControlFlow<()>,
        kept_links: &mut dyn FnMut(u32),
    ) -> Result<RemovedTree> {
        let mut stats = RemovedTree::default();
        let mut report = |stats: &RemovedTree| match progress(stats) {
            ControlFlow::Continue(()) => Ok(()),
            ControlFlow::Break(()) => Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::Interrupted,
                "remove_tree stopped by its caller",
            ))),
        };
        if name == b"." || name == b".." {
            return Err(Error::Invalid(format!("refusing to remove '{}'", String::from_utf8_lossy(name))));
        }
        check_name(name)?;
        self.require_dir(parent)?;
        let shown = || String::from_utf8_lossy(name).into_owned();
        let top = self.lookup(parent, name)?.ok_or_else(|| Error::NotFound(shown()))?;
        let top_inode = self.inode(top)?;
        if !top_inode.is_dir() {
            let last = top_inode.i_links_count <= 1;
            self.remove_name(parent, name, false, Some(top))?;
            if !last {
                kept_links(top);
            }
            stats.names = 1;
            stats.inodes_released = last as u64;
            report(&stats)?;
            return Ok(stats);
        }
        let mut on_path: HashSet<u32> = HashSet::from([crate::ns::ROOT_INO, parent, top]);
        if top == crate::ns::ROOT_INO || top == parent {
            return Err(Error::Busy(format!("refusing to remove '{}': it is the root or its parent", shown())));
        }
        let mut stack = vec![Level { dir: top, parent, name: name.to_vec(), subdirs: Vec::new() }];
        // Entries held in `subdirs` lists along the stack.
        let mut held = 0usize;
        // Passes in a row that found nothing to remove yet could not rmdir.
        let mut stuck = 0u32;
        // Passes in a row that saw names but removed none.
        let mut blind = 0u32;
        // Directories already offered to `sort_for_removal`.
        let mut sorted: HashSet<u32> = HashSet::new();
        while let Some(level) = stack.last_mut() {
            if let Some((sub, sub_name)) = level.subdirs.pop() {
                held -= 1;
                // Moved away (or replaced) since the pass saw it: not ours.
                if self.lookup(level.dir, &sub_name)? != Some(sub) {
                    continue;
                }
                if !on_path.insert(sub) {
                    return Err(Error::corrupt(
                        format!("directory inode {sub} is its own ancestor (a directory loop)"),
                        format!("entry '{}' in directory inode {}", String::from_utf8_lossy(&sub_name), level.dir),
                    ));
                }
                let dir = level.dir;
                stack.push(Level { dir: sub, parent: dir, name: sub_name, subdirs: Vec::new() });
                continue;
            }
            let dir = level.dir;
            if sorted.insert(dir) {
                self.sort_for_removal(dir)?;
            }
            let limit = CHUNK_ENTRIES.saturating_sub(held).max(MIN_CHUNK_ENTRIES);
            let chunk = match self.lowest_entries(dir, limit) {
                Ok(chunk) => chunk,
                // Removed by someone else meanwhile.
                Err(Error::NotFound(_)) => {
                    on_path.remove(&dir);
                    stack.pop();
                    continue;
                }
                Err(e) => return Err(e),
            };
            if chunk.is_empty() {
                let (parent, name) = (level.parent, level.name.clone());
                match self.remove_name(parent, &name, true, Some(dir)) {
                    Ok(()) => {
                        stats.names += 1;
                        stats.directories += 1;
                        stats.inodes_released += 1;
                        report(&stats)?;
                    }
                    // A create slipped in before the rmdir's locks: another
                    // pass. A directory that stays "not empty" with nothing a
                    // pass can see (a second '.' or '..') is damaged.
                    Err(Error::NotEmpty(_)) => {
                        stuck += 1;
                        if stuck > STUCK_PASSES {
                            return Err(Error::corrupt(
                                "directory is not empty but holds no entry to remove (a second '.' or '..'?)",
                                format!("directory inode {dir}"),
                            ));
                        }
                        continue;
                    }
                    // Moved or removed by someone else: what was below it is gone.
                    Err(Error::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
                on_path.remove(&dir);
                stack.pop();
                continue;
            }
            let names_before = stats.names;
            let first = chunk.first().map(|(e, _)| (e.name.clone(), e.ino)).unwrap_or_default();
            // Entries typed as directories wait for their descent; the rest
            // (and entries without a type) go in batches, which hand back
            // what turns out to be a directory.
            let mut subdirs = Vec::new();
            let mut others = Vec::with_capacity(chunk.len());
            for (e, lblk) in chunk {
                if e.file_type == EXT4_FT_DIR {
                    subdirs.push((e.ino, e.name));
                } else {
                    others.push((e, lblk));
                }
            }
            for window in self.table_windows(others) {
                // The window's table blocks in runs, in table order, before any lock.
                let mut inos: Vec<u32> = window.iter().map(|(e, _)| e.ino).collect();
                inos.sort_unstable();
                inos.into_iter().for_each(|ino| self.vol.read_ahead_inode(ino));
                for batch in window.chunks(BATCH_NAMES) {
                    subdirs.extend(self.remove_names_batch(dir, batch, &mut stats, kept_links)?);
                    report(&stats)?;
                }
            }
            // A pass that saw names but removed none and found no directory to
            // descend into: they were renamed or removed meanwhile, or the
            // directory's blocks list names its lookups cannot find (a hash
            // index that does not match its leaves). The first can happen a
            // few times in a row, the second every pass: after
            // `STUCK_LOOKUP_PASSES` such passes it is called damage.
            if stats.names == names_before && subdirs.is_empty() {
                blind += 1;
                if blind > STUCK_LOOKUP_PASSES {
                    return Err(Error::corrupt(
                        format!(
                            "directory lists '{}' (inode {}) but a lookup of that name does not find it (a damaged \
                             hash index?)",
                            String::from_utf8_lossy(&first.0),
                            first.1
                        ),
                        format!("directory inode {dir}"),
                    ));
                }
            } else {
                blind = 0;
            }
            stuck = 0;
            subdirs.sort_unstable_by(|a, b| b.cmp(a));
            held += subdirs.len();
            if let Some(level) = stack.last_mut() {
                level.subdirs = subdirs;
            }
        }
        Ok(stats)
    }

    /// Splits `entries` (ascending inode) into windows whose inodes lie in at
    /// most `window_table_blocks()` inode-table blocks, and orders each window by the
    /// directory block its entry was seen in (then by inode). Removing a window
    /// in that order dirties each directory leaf once per window rather than
    /// once per batch — in an htree, names in inode order lie in leaves all over
    /// the directory, and a leaf logged by every commit is what filled the
    /// journal — while the window's table blocks stay in the cache.
    fn table_windows(&self, entries: Vec<(DirEntryOwned, u32)>) -> Vec<Vec<(DirEntryOwned, u32)>> {
        let per_block = (self.vol.geo.block_size / self.vol.geo.inode_size).max(1) as u32;
        let span = self.window_table_blocks();
        let mut windows: Vec<Vec<(DirEntryOwned, u32)>> = Vec::new();
        let mut first_block = None;
        for (e, lblk) in entries {
            let block = (e.ino.saturating_sub(1) / per_block) as u64;
            match first_block {
                Some(first) if block < first + span => {}
                _ => {
                    first_block = Some(block);
                    windows.push(Vec::new());
                }
            }
            if let Some(w) = windows.last_mut() {
                w.push((e, lblk));
            }
        }
        windows
            .into_iter()
            .map(|mut w| {
                w.sort_by_key(|(e, lblk)| (*lblk, e.ino));
                w
            })
            .collect()
    }

    /// Inode-table blocks one window spans: an eighth of the cache, so that the
    /// window's table blocks, the leaves it dirties and the journal's pinned
    /// copies fit together.
    fn window_table_blocks(&self) -> u64 {
        (self.vol.cache.capacity() as u64 / 8).max(1)
    }

    /// The (at most) `limit` entries of `dir` with the lowest inode numbers,
    /// ascending, "." and ".." left out. One pass over the directory under its
    /// structure read lock; memory stays at `limit` entries plus one block's.
    fn lowest_entries(&self, dir: u32, limit: usize) -> Result<Vec<(DirEntryOwned, u32)>> {
        let _structure = self.dir_structure.read(dir as u64);
        let inode = self.require_dir(dir)?;
        if inode.i_links_count == 0 {
            return Err(Self::removed_dir_error(dir));
        }
        let mut heap: BinaryHeap<(u32, Vec<u8>, u8, u32)> = BinaryHeap::new();
        let mut keep = |e: DirEntryOwned, lblk: u32| {
            if e.name == b"." || e.name == b".." {
                return;
            }
            heap.push((e.ino, e.name, e.file_type, lblk));
            if heap.len() > limit {
                heap.pop();
            }
        };
        if inode.has_flag(EXT4_INLINE_DATA_FL) {
            self.read_inline_dir(dir, &inode)?.into_iter().for_each(|e| keep(e, 0));
        } else {
            self.scan_dir_blocks(dir, &inode, &mut |lblk, e| keep(e, u32::try_from(lblk).unwrap_or(u32::MAX)))?;
        }
        Ok(heap
            .into_sorted_vec()
            .into_iter()
            .map(|(ino, name, file_type, lblk)| (DirEntryOwned { ino, file_type, name }, lblk))
            .collect())
    }

    /// Hands every entry of the block-mapped directory `dir` to `each` with
    /// its logical block, reading the blocks in order in runs of
    /// `DIR_READ_AHEAD_BLOCKS` (both a pass and the sort read them all).
    fn scan_dir_blocks(&self, dir: u32, inode: &Inode, each: &mut dyn FnMut(u64, DirEntryOwned)) -> Result<()> {
        let mut block = Vec::new();
        let blocks = self.dir_blocks(dir, inode)?;
        let ahead = Self::DIR_READ_AHEAD_BLOCKS;
        for lblk in 0..blocks {
            if lblk.is_multiple_of(ahead) {
                self.read_ahead_dir(dir, inode, lblk, ahead.min(blocks - lblk));
            }
            let buf = self.dir_block(dir, inode, lblk)?;
            self.parse_dir_block(dir, lblk, &buf.read(), &mut block)?;
            block.drain(..).for_each(|e| each(lblk, e));
        }
        Ok(())
    }

    /// Removes the names of `batch` (entries of `dir`, one window's, in directory-block order) that
    /// still name the inode the pass saw, in one handle. Returns those that
    /// turned out to be directories, untouched.
    fn remove_names_batch(
        &self,
        dir: u32,
        batch: &[(DirEntryOwned, u32)],
        stats: &mut RemovedTree,
        kept_links: &mut dyn FnMut(u32),
    ) -> Result<Vec<(u32, Vec<u8>)>> {
        let mut subdirs = Vec::new();
        let mut big = Vec::new();
        // Told to `kept_links` once the locks are dropped: a caller may take
        // its own locks there, and call the library under them.
        let mut kept = Vec::new();
        {
            let keys: Vec<(u32, &[u8])> = batch.iter().map(|(e, _)| (dir, e.name.as_slice())).collect();
            let names = self.lock_names(&keys)?;
            if self.require_dir(dir)?.i_links_count == 0 {
                // Removed by someone else: the next pass says so.
                return Ok(subdirs);
            }
            let mut found = Vec::with_capacity(batch.len());
            for (e, lblk) in batch {
                if self.lookup_held_near(dir, &e.name, Some(*lblk as u64))? == Some(e.ino) {
                    found.push((e, *lblk));
                }
            }
            let mut modes = vec![(dir as u64, Mode::Shared)];
            modes.extend(found.iter().map(|(e, _)| (e.ino as u64, Mode::Exclusive)));
            let _inode_locks = self.inode_locks.lock_modes(&modes);
            // Working copies, one per inode (two names of one inode in this batch
            // drop two links of one copy).
            let mut inodes: BTreeMap<u32, Inode> = BTreeMap::new();
            let mut doomed = Vec::with_capacity(found.len());
            for (e, lblk) in found {
                if let std::collections::btree_map::Entry::Vacant(slot) = inodes.entry(e.ino) {
                    slot.insert((*self.inode(e.ino)?).clone());
                }
                if inodes[&e.ino].is_dir() {
                    subdirs.push((e.ino, e.name.clone()));
                } else {
                    doomed.push((e, lblk));
                }
            }
            inodes.retain(|_, i| !i.is_dir());
            if doomed.is_empty() {
                return Ok(subdirs);
            }
            // Everything that can refuse comes before the first change.
            let mut drops: BTreeMap<u32, u16> = BTreeMap::new();
            for (e, _) in &doomed {
                *drops.entry(e.ino).or_default() += 1;
            }
            // An immutable or append-only name stops the removal with EPERM, as
            // it stops the kernel's rm -rf (what was removed stays removed).
            crate::ns::inode_flags::refuse_if_pinned(dir, &*self.inode(dir)?, "removing names")?;
            for (e, _) in &doomed {
                crate::ns::inode_flags::refuse_if_pinned(e.ino, &inodes[&e.ino], "removing a name")?;
            }
            for (&ino, &n) in &drops {
                let inode = &inodes[&ino];
                if inode.i_links_count <= n {
                    self.check_releasable(ino, inode)?;
                }
            }
            let mut tx = self.begin(8 + 4 * doomed.len() as u32)?;
            let parallel = names.parallel(dir);
            // An inline directory loses its names in place (remove_entry_near): a
            // removal must not need a free block, least of all on a full disk.
            let _structure = self.dir_structure.lock(dir as u64, if parallel { Mode::Shared } else { Mode::Exclusive });
            for (e, lblk) in &doomed {
                let dir_inode = self.inode(dir)?;
                self.remove_entry_near(&mut tx, dir, &dir_inode, &e.name, Some(*lblk as u64))?;
            }
            self.update_dir_attrs(&mut tx, dir, None, &Self::touch_dir)?;
            let t = now();
            let big_blocks = STEP_BLOCKS * (self.vol.geo.block_size as u64 / 512);
            for (&ino, &n) in &drops {
                let Some(inode) = inodes.get_mut(&ino) else { continue };
                inode.i_links_count = inode.i_links_count.saturating_sub(n);
                inode.i_ctime = t;
                if inode.i_links_count == 0 {
                    stats.inodes_released += 1;
                    if self.is_open(ino) {
                        // Freed at the last close, like an unlinked open file.
                        self.orphan_add(&mut tx, ino, inode)?;
                    } else if inode.blocks_512(self.vol.geo.huge_file, self.vol.geo.block_size as u32) > big_blocks {
                        self.orphan_add(&mut tx, ino, inode)?;
                        big.push(ino);
                    } else {
                        self.release_inode(&mut tx, ino, inode)?;
                    }
                }
                self.write_inode(&mut tx, ino, inode)?;
            }
            tx.finish()?;
            stats.names += doomed.len() as u64;
            kept.extend(
                inodes.iter().filter(|(ino, i)| drops.contains_key(ino) && i.i_links_count > 0).map(|(&ino, _)| ino),
            );
        }
        kept.into_iter().for_each(&mut *kept_links);
        for ino in big {
            self.release_in_steps(ino)?;
        }
        Ok(subdirs)
    }

    /// Rewrites a big indexed directory, before its names are removed, as a
    /// linear directory whose entries lie in inode order, so that removing
    /// them in inode order dirties each of its blocks once instead of every
    /// leaf in every window (seed 003: "deleting inodes in storage order").
    ///
    /// The sorted blocks are built in a new regular file with no links, on
    /// the orphan list, over several handles; one handle then swaps the two
    /// block maps (the directory takes the sorted blocks and loses its index
    /// flag, the orphan the old blocks, whose extent nodes are re-sealed with
    /// its checksum seed), and the orphan is released like a big unlinked
    /// file. A cut anywhere leaves the directory as it was or sorted, and an
    /// orphan that the next open (uext4's or the kernel's) frees. Under the
    /// directory's lock and inode lock, held exclusively throughout, no name
    /// in it changes; lookups go on until the swap, which holds its structure
    /// lock.
    ///
    /// Skipped (Ok, nothing changed) for a directory that is not indexed, not
    /// extent-mapped, shorter than `SORT_MIN_BLOCKS` or longer than
    /// `SORT_MAX_BYTES` (the memory bound), whose extent tree is deeper than
    /// one level, or when the sorted copy does not fit in the four extents of
    /// an inode's root (fragmented free space).
    fn sort_for_removal(&self, dir: u32) -> Result<()> {
        let worth = |inode: &Inode| -> Result<bool> {
            Ok(self.is_indexed(inode)
                && inode.has_flag(EXT4_EXTENTS_FL)
                && inode.i_links_count > 0
                && inode.i_size <= SORT_MAX_BYTES
                && self.dir_blocks(dir, inode)? >= SORT_MIN_BLOCKS
                && Self::extent_depth(inode) <= 1)
        };
        if !worth(&*self.require_dir(dir)?)? {
            return Ok(());
        }
        // The orphan is released once the directory's locks are dropped:
        // release_in_steps takes the orphan's inode lock, which may sort
        // below the directory's.
        let (orphan, outcome) = {
            let _dir_lock = self.dir_locks.write(dir as u64);
            let _inode_lock = self.inode_locks.write(dir as u64);
            let inode = (*self.require_dir(dir)?).clone();
            if !worth(&inode)? {
                return Ok(());
            }
            let Some(blocks) = self.sorted_dir_blocks(dir, &inode)? else {
                return Ok(());
            };
            let orphan = match self.build_in_orphan(dir, &blocks) {
                Ok(orphan) => orphan,
                Err((orphan, e)) => {
                    drop((_inode_lock, _dir_lock));
                    if let Some(orphan) = orphan {
                        let _ = self.release_in_steps(orphan);
                    }
                    // A full disk is when trees get removed: go on unsorted,
                    // which needs no new block (the copy's blocks went back).
                    return if matches!(e, Error::NoSpace(_)) { Ok(()) } else { Err(e) };
                }
            };
            drop(blocks);
            let copy = (*self.inode(orphan)?).clone();
            // Free space too broken up for the root's four extents: no swap.
            let outcome = if Self::extent_depth(&copy) > 0 { Ok(()) } else { self.swap_block_maps(dir, orphan) };
            (orphan, outcome)
        };
        let released = self.release_in_steps(orphan);
        outcome.and(released)
    }

    /// Depth of an extent-mapped inode's tree (0: the extents are in i_block).
    fn extent_depth(inode: &Inode) -> u16 {
        crate::format::extent::ExtentHeader::parse(&inode.i_block).eh_depth
    }

    /// The directory's entries in inode order, packed into blocks as a linear
    /// directory ("." and ".." first), each with its checksum tail; None when
    /// block 0 does not start with them.
    fn sorted_dir_blocks(&self, dir: u32, inode: &Inode) -> Result<Option<Vec<Vec<u8>>>> {
        let mut entries = Vec::new();
        let mut dotdot = None;
        self.scan_dir_blocks(dir, inode, &mut |lblk, e| match (lblk, e.name.as_slice()) {
            (0, b".") => {}
            (0, b"..") => dotdot = Some(e),
            _ => entries.push(e),
        })?;
        let Some(dotdot) = dotdot else { return Ok(None) };
        entries.sort_by_key(|e| e.ino);
        let bs = self.vol.geo.block_size;
        let room = if self.vol.geo.metadata_csum { bs - crate::format::dirent::DIRENT_TAIL_LEN } else { bs };
        let seed = self.inode_seed(dir, inode);
        let dot = DirEntryOwned { ino: dir, file_type: dotdot.file_type, name: b".".to_vec() };
        let mut out = Vec::new();
        let mut current: Vec<&DirEntryOwned> = Vec::new();
        let mut used = 0;
        let mut seal = |current: &[&DirEntryOwned]| {
            let mut data = vec![0u8; bs];
            self.write_leaf(&mut data, current, seed);
            out.push(data);
        };
        for e in [&dot, &dotdot].into_iter().chain(&entries) {
            let need = crate::format::dirent::rec_len_for(e.name.len());
            if used + need > room {
                seal(&current);
                current.clear();
                used = 0;
            }
            current.push(e);
            used += need;
        }
        seal(&current);
        Ok(Some(out))
    }

    /// A new regular file with no links, on the orphan list, holding `blocks`
    /// (through the journal, `SORT_BLOCKS_PER_HANDLE` to a handle). No name
    /// leads to it and nobody opens it, so its inode lock is not taken after
    /// its first handle (taking it under the directory's, out of ascending
    /// order, could meet a caller holding a stale number for it). Returns
    /// its inode number; on an error, the orphan made (if any) with the
    /// error, for the caller to release once it has dropped the
    /// directory's locks.
    fn build_in_orphan(&self, dir: u32, blocks: &[Vec<u8>]) -> std::result::Result<u32, (Option<u32>, Error)> {
        let create = || -> Result<u32> {
            let mut tx = self.begin(8)?;
            let request = crate::alloc::InodeRequest::new(dir, false);
            let (ino, _lock) = self.alloc_inode_locked(&mut tx, &request)?;
            let mut inode = self.new_inode(S_IFREG | 0o600, crate::alloc::Owner { uid: 0, gid: 0 });
            inode.i_links_count = 0;
            self.orphan_add(&mut tx, ino, &mut inode)?;
            self.write_inode(&mut tx, ino, &inode)?;
            tx.finish()?;
            Ok(ino)
        };
        let orphan = create().map_err(|e| (None, e))?;
        self.fill_orphan(dir, orphan, blocks).map_err(|e| (Some(orphan), e))?;
        Ok(orphan)
    }

    /// `build_in_orphan`'s block copies.
    fn fill_orphan(&self, dir: u32, orphan: u32, blocks: &[Vec<u8>]) -> Result<()> {
        let bs = self.vol.geo.block_size as u64;
        let mut goal = self.inode_goal(dir, false);
        let mut lblk = 0u64;
        while lblk < blocks.len() as u64 {
            let mut tx = self.begin(8 + SORT_BLOCKS_PER_HANDLE as u32)?;
            let mut inode = (*self.inode(orphan)?).clone();
            let want = SORT_BLOCKS_PER_HANDLE.min(blocks.len() as u64 - lblk);
            let (pblk, got) = self.alloc.alloc_blocks(&mut tx, goal, want as u32)?;
            for i in 0..got as u64 {
                self.vol.cache.classify(pblk + i, crate::dev::IoClass::Directory);
                let buf = self.vol.cache.get_new(pblk + i);
                buf.write().copy_from_slice(&blocks[(lblk + i) as usize]);
                tx.dirty(&buf);
            }
            if let Err(e) = self.extent_append(&mut tx, orphan, &mut inode, lblk, pblk, got) {
                // The tree is as it was: the blocks go back.
                self.alloc.free_blocks_range(&mut tx, pblk, got as u64)?;
                self.write_inode(&mut tx, orphan, &inode)?;
                tx.finish()?;
                return Err(e);
            }
            lblk += got as u64;
            inode.i_size = lblk * bs;
            self.write_inode(&mut tx, orphan, &inode)?;
            tx.finish()?;
            goal = pblk + got as u64;
        }
        Ok(())
    }

    /// Swaps the block maps of directory `dir` and the orphan `orphan` in one
    /// handle: the directory gets the sorted blocks (linear now: no index
    /// flag), the orphan the old ones, whose extent nodes (a tree of depth 1
    /// at most) are re-sealed with the orphan's checksum seed.
    fn swap_block_maps(&self, dir: u32, orphan: u32) -> Result<()> {
        let mut tx = self.begin(16)?;
        let _structure = self.dir_structure.write(dir as u64);
        let mut d = (*self.inode(dir)?).clone();
        let mut o = (*self.inode(orphan)?).clone();
        if self.vol.geo.metadata_csum && Self::extent_depth(&d) == 1 {
            let seed = self.inode_seed(orphan, &o);
            let root = crate::format::extent::ExtentNode::parse(&d.i_block, Some(1), "directory's extent root")?;
            if let crate::format::extent::ExtentNode::Index(_, children) = root {
                for child in children {
                    self.vol.check_block(child.leaf, &|| format!("extent tree of inode {dir}"))?;
                    let buf = self.vol.cache.get(child.leaf)?;
                    crate::format::extent::set_block_checksum(&mut buf.write(), seed);
                    tx.dirty(&buf);
                }
            }
        }
        std::mem::swap(&mut d.i_block, &mut o.i_block);
        std::mem::swap(&mut d.i_size, &mut o.i_size);
        std::mem::swap(&mut d.i_blocks, &mut o.i_blocks);
        d.i_flags &= !EXT4_INDEX_FL;
        let t = now();
        d.i_ctime = t;
        self.write_inode(&mut tx, dir, &d)?;
        self.write_inode(&mut tx, orphan, &o)?;
        tx.finish()
    }

    /// Frees an unlinked, unopened inode on the orphan list `STEP_BLOCKS` at a
    /// time from its end, one handle each, then the inode and its record. A cut
    /// between steps leaves a shorter orphan that the next open frees.
    fn release_in_steps(&self, ino: u32) -> Result<()> {
        let bs = self.vol.geo.block_size as u64;
        loop {
            let _lock = self.inode_locks.write(ino as u64);
            let mut inode = (*self.inode(ino)?).clone();
            if inode.i_links_count != 0 || self.is_open(ino) {
                return Ok(());
            }
            let end = inode.i_size.div_ceil(bs);
            let mapped = inode.has_flag(EXT4_EXTENTS_FL) || self.has_block_map(&inode);
            let mut tx = self.begin(32)?;
            if end <= STEP_BLOCKS || !mapped {
                self.orphan_remove(&mut tx, ino, &mut inode)?;
                self.release_inode(&mut tx, ino, &mut inode)?;
                self.write_inode(&mut tx, ino, &inode)?;
                return tx.finish();
            }
            let keep = end - STEP_BLOCKS;
            self.extent_truncate(&mut tx, ino, &mut inode, keep)?;
            inode.i_size = keep * bs;
            self.write_inode(&mut tx, ino, &inode)?;
            tx.finish()?;
        }
    }
}
