//! Block maps: the ext2/ext3 way of mapping a file, kept by inodes without the
//! extent flag (the kernel's `fs/ext4/indirect.c`). Read, allocated, truncated,
//! punched and freed here; `extent/mod.rs` and `extent/write.rs` send block-mapped
//! inodes to these functions.
//!
//! i_block holds 12 direct pointers, then one single (IND), one double (DIND) and
//! one triple (TIND) indirect pointer; an indirect block is an array of
//! block_size / 4 little-endian 32-bit pointers. A zero pointer is a hole, at any
//! level. Block maps address only blocks below 2^32.
//!
//! Invariants:
//! - every indirect block is checked when first read (once, through the cache) as
//!   the kernel's `ext4_check_indirect_blockref` does: each pointer it holds lies
//!   inside the filesystem and clear of group metadata; pointers in i_block are
//!   checked where they are used;
//! - allocation follows `ext4_ind_map_blocks`: the goal is the nearest mapped block
//!   to the left in the same pointer array, else the indirect block holding that
//!   array, else the inode's group (`ext4_find_near`); the missing indirect blocks
//!   are taken first, each the goal of the next, then the data right after them
//!   (`ext4_alloc_branch`); nothing is linked into the map until the whole branch
//!   is built, and on ENOSPC what was taken goes back with the map unchanged
//!   (`ext4_splice_branch`);
//! - removal (truncate, punch, release) reads and checks everything it will free —
//!   inside the filesystem, clear of metadata, marked in use, named only once —
//!   before it changes anything; an indirect block left without pointers is freed
//!   with the data it mapped (as `ext4_ind_truncate` frees the top of a branch that
//!   empties), and i_blocks follows every block taken or freed.

use crate::cache::Buffer;
use crate::error::{Error, Result};
use crate::extent::{MapKind, Mapping};
use crate::format::bytes::{le32, put_le32};
use crate::format::inode::{Inode, EXT4_EXTENTS_FL, EXT4_INLINE_DATA_FL, S_IFDIR, S_IFLNK, S_IFREG};
use crate::fs::Filesystem;
use crate::journal::handle::Handle;
use std::sync::Arc;

/// Direct pointers in i_block; slots 12, 13 and 14 hold the IND, DIND and TIND roots.
const DIRECT: usize = 12;
/// Block maps hold 32-bit block numbers (the kernel's EXT4_MAX_BLOCK_FILE_PHYS).
const MAX_PHYS: u64 = 1 << 32;

/// Where a logical block sits in the map (the kernel's `ext4_block_to_path`): the
/// i_block slot, then the index in each indirect block down to the data pointer.
#[derive(Clone, Copy, Debug)]
struct MapPath {
    depth: usize,
    offsets: [usize; 4],
    /// Pointers after this one in the same array (the last level's).
    boundary: u64,
}

fn path_of(per: u64, lblk: u64) -> Option<MapPath> {
    let mut offsets = [0usize; 4];
    let mut rem = lblk;
    if rem < DIRECT as u64 {
        offsets[0] = rem as usize;
        return Some(MapPath { depth: 1, offsets, boundary: DIRECT as u64 - 1 - rem });
    }
    rem -= DIRECT as u64;
    let mut span = per;
    for level in 1..=3 {
        if rem < span {
            offsets[0] = DIRECT + level - 1;
            let mut unit = span / per;
            for (i, slot) in offsets.iter_mut().enumerate().take(level + 1).skip(1) {
                *slot = (rem / unit) as usize;
                rem %= unit;
                if i < level {
                    unit /= per;
                }
            }
            let last = offsets[level] as u64;
            return Some(MapPath { depth: level + 1, offsets, boundary: per - 1 - last });
        }
        rem -= span;
        span *= per;
    }
    None
}

/// One step of a walk from i_block towards a data pointer: the pointer found at
/// `index` of `holder` (an indirect block; None for i_block).
struct Link {
    holder: Option<Arc<Buffer>>,
    index: usize,
    value: u64,
}

/// What a removal will do, planned (and checked) before anything changes.
#[derive(Default)]
struct Removal {
    /// Blocks to free, data and indirect, as runs (start, len) in walk order.
    free: Vec<(u64, u64)>,
    /// Indirect blocks that stay, with the pointers they keep.
    rewrite: Vec<(u64, Vec<u32>)>,
    /// Indirect blocks read that stay as they are.
    kept: Vec<u64>,
    /// The last logical block whose data is freed.
    last_data: Option<u64>,
}

impl Removal {
    fn free_block(&mut self, block: u64) {
        match self.free.last_mut() {
            Some((start, len)) if *start + *len == block => *len += 1,
            _ => self.free.push((block, 1)),
        }
    }

    fn freed_blocks(&self) -> u64 {
        self.free.iter().map(|r| r.1).sum()
    }
}

impl Filesystem {
    fn pointers_per_block(&self) -> u64 {
        (self.vol.geo.block_size / 4) as u64
    }

    /// The first logical block a block map cannot reach.
    pub(crate) fn block_map_reach(&self) -> u64 {
        let per = self.pointers_per_block();
        DIRECT as u64 + per + per * per + per * per * per
    }

    /// Whether `inode` keeps its data in a block map: a regular file, directory or
    /// slow symlink without the extent or inline flag. Fast symlinks, devices,
    /// fifos and sockets use i_block for something else.
    pub(crate) fn has_block_map(&self, inode: &Inode) -> bool {
        if inode.has_flag(EXT4_EXTENTS_FL) || inode.has_flag(EXT4_INLINE_DATA_FL) {
            return false;
        }
        match inode.file_type() {
            S_IFREG | S_IFDIR => true,
            S_IFLNK => !self.is_fast_symlink(inode),
            _ => false,
        }
    }

    /// Indirect block `block` of inode `ino`, its pointers checked on first read.
    fn indirect_block(&self, ino: u32, block: u64) -> Result<Arc<Buffer>> {
        let what = || format!("indirect block {block} of inode {ino}");
        self.vol.check_metadata_free_range(block, 1, &what)?;
        // Mapping metadata, as an extent node is, to the device's I/O model.
        self.vol.cache.get_verified_as(block, crate::dev::IoClass::ExtentNode, |data| {
            for (i, raw) in data.chunks_exact(4).enumerate() {
                let p = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]) as u64;
                if p != 0 {
                    self.vol.check_metadata_free_range(p, 1, &|| format!("{}, pointer {i}", what()))?;
                }
            }
            Ok(())
        })
    }

    /// A pointer taken from i_block, checked before it is followed or freed.
    fn root_pointer(&self, ino: u32, inode: &Inode, slot: usize) -> Result<u64> {
        let p = le32(&inode.i_block, slot * 4) as u64;
        if p != 0 {
            self.vol.check_metadata_free_range(p, 1, &|| format!("block map of inode {ino}, i_block slot {slot}"))?;
        }
        Ok(p)
    }

    /// Walks from i_block along `path`, stopping after the first zero pointer.
    fn walk_chain(&self, ino: u32, inode: &Inode, path: &MapPath) -> Result<Vec<Link>> {
        let mut chain = Vec::with_capacity(path.depth);
        let root = self.root_pointer(ino, inode, path.offsets[0])?;
        chain.push(Link { holder: None, index: path.offsets[0], value: root });
        for level in 1..path.depth {
            let parent = chain[level - 1].value;
            if parent == 0 {
                break;
            }
            let buf = self.indirect_block(ino, parent)?;
            let value = le32(&buf.read(), path.offsets[level] * 4) as u64;
            chain.push(Link { holder: Some(buf), index: path.offsets[level], value });
        }
        Ok(chain)
    }

    /// The pointer array a link lies in, as numbers.
    fn link_array(inode: &Inode, link: &Link) -> Vec<u64> {
        let read = |b: &[u8]| b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u64).collect();
        match &link.holder {
            Some(buf) => read(&buf.read()),
            None => read(&inode.i_block),
        }
    }

    /// Maps up to `max_len` blocks from `lblk` through the block map: a mapped run
    /// continues while the next pointers of the same array do; a hole spans the
    /// rest of the missing subtree (and, at the last level, the zero pointers after it).
    pub(crate) fn map_indirect(&self, ino: u32, inode: &Inode, lblk: u64, max_len: u64) -> Result<Mapping> {
        let per = self.pointers_per_block();
        let Some(path) = path_of(per, lblk) else {
            return Ok(Mapping { lblk, len: max_len, kind: MapKind::Hole });
        };
        let chain = self.walk_chain(ino, inode, &path)?;
        let last = chain.last().expect("a walk holds the root link");
        let leaf_level = chain.len() == path.depth;
        let array = || Self::link_array(inode, last);
        if leaf_level && last.value != 0 {
            let first = last.value;
            let mut len = 1;
            if max_len > 1 {
                let ptrs = array();
                while len < max_len && len <= path.boundary && ptrs[last.index + len as usize] == first + len {
                    len += 1;
                }
            }
            // Direct pointers were not checked with the block that holds them.
            if last.holder.is_none() {
                self.vol.check_metadata_free_range(first, len, &|| format!("block map of inode {ino}"))?;
            }
            return Ok(Mapping { lblk, len, kind: MapKind::Mapped(first) });
        }
        let level = chain.len() - 1;
        let mut len = 0u64;
        for i in level + 1..path.depth {
            len = len * per + (per - path.offsets[i] as u64 - 1);
        }
        len += 1;
        if leaf_level && len < max_len {
            let ptrs = array();
            while len < max_len && len <= path.boundary && ptrs[last.index + len as usize] == 0 {
                len += 1;
            }
        }
        Ok(Mapping { lblk, len: len.min(max_len), kind: MapKind::Hole })
    }

    /// ext4_find_near: the nearest mapped block to the left of the link in its
    /// array, else the indirect block holding it, else the inode's group.
    fn find_near(&self, ino: u32, inode: &Inode, link: &Link) -> u64 {
        let array = Self::link_array(inode, link);
        if let Some(&p) = array[..link.index].iter().rev().find(|&&p| p != 0) {
            return p;
        }
        match &link.holder {
            Some(buf) => buf.block,
            None => self.inode_goal(ino, inode.is_reg()),
        }
    }

    /// Takes `count` blocks for a block map's new indirect blocks, one at a time,
    /// each the goal of the next (ext4_alloc_branch). All or none.
    fn alloc_indirect(&self, tx: &mut Handle, goal: u64, count: usize) -> Result<Vec<u64>> {
        let mut got = Vec::with_capacity(count);
        let mut goal = goal;
        while got.len() < count {
            match self.alloc_below_2_32(tx, goal, 1) {
                Ok((b, _)) => {
                    got.push(b);
                    goal = b;
                }
                Err(e) => {
                    for &b in &got {
                        self.alloc.free_blocks_range(tx, b, 1)?;
                    }
                    return Err(e);
                }
            }
        }
        Ok(got)
    }

    /// An allocation for a block map, which holds only 32-bit block numbers. (The
    /// kernel limits such files to the groups below 2^32; a run reaching past it
    /// goes back and the map cannot grow.)
    fn alloc_below_2_32(&self, tx: &mut Handle, goal: u64, len: u32) -> Result<(u64, u32)> {
        let (start, got) = self.alloc.alloc_blocks(tx, goal.min(MAX_PHYS - 1), len)?;
        if start + got as u64 > MAX_PHYS {
            self.alloc.free_blocks_range(tx, start, got as u64)?;
            return Err(Error::NoSpace("a block-mapped file can only hold blocks below 2^32".into()));
        }
        Ok((start, got))
    }

    /// Links a branch built for `path` into the map at the chain's first zero
    /// pointer: `new_indirect` (the missing indirect blocks, outermost first) and
    /// `count` data blocks from `data`, which go into the last array from its
    /// path offset on. i_blocks grows by every block linked.
    #[allow(clippy::too_many_arguments)]
    fn splice_branch(
        &self,
        tx: &mut Handle,
        inode: &mut Inode,
        path: &MapPath,
        chain: &[Link],
        new_indirect: &[u64],
        data: u64,
        count: u64,
    ) {
        let level = chain.len() - 1;
        for (i, &block) in new_indirect.iter().enumerate() {
            self.vol.cache.classify(block, crate::dev::IoClass::ExtentNode);
            let buf = self.vol.cache.get_new(block);
            {
                let mut b = buf.write();
                if i + 1 < new_indirect.len() {
                    put_le32(&mut b, path.offsets[level + 1 + i] * 4, new_indirect[i + 1] as u32);
                } else {
                    let at = path.offsets[path.depth - 1];
                    for j in 0..count {
                        put_le32(&mut b, (at + j as usize) * 4, (data + j) as u32);
                    }
                }
            }
            tx.dirty(&buf);
        }
        // The missing link last: until it is set, nothing of the branch is reachable.
        let link = &chain[level];
        let values: Vec<u64> = match new_indirect.first() {
            Some(&top) => vec![top],
            None => (0..count).map(|j| data + j).collect(),
        };
        match &link.holder {
            Some(buf) => {
                {
                    let mut b = buf.write();
                    for (j, v) in values.iter().enumerate() {
                        put_le32(&mut b, (link.index + j) * 4, *v as u32);
                    }
                }
                tx.dirty(buf);
            }
            None => {
                for (j, v) in values.iter().enumerate() {
                    put_le32(&mut inode.i_block, (link.index + j) * 4, *v as u32);
                }
            }
        }
        inode.i_blocks += (new_indirect.len() as u64 + count) * (self.vol.geo.block_size as u64 / 512);
    }

    /// Allocates and maps up to `want` blocks of the hole at `lblk` (the kernel's
    /// `ext4_ind_map_blocks` with CREATE): the indirect blocks the path lacks, then
    /// the data after them, as far as the hole runs within one pointer array.
    /// Returns the first data block and how many were mapped. The caller writes or
    /// zeroes them before the handle ends.
    ///
    /// # Errors
    /// `NoSpace` (nothing taken, the map as it was); `FileTooLarge` past the map's
    /// reach; `Corrupt` for a damaged map; `Invalid` if `lblk` is mapped already.
    pub(crate) fn ind_alloc(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        lblk: u64,
        want: u64,
    ) -> Result<(u64, u32)> {
        let path = path_of(self.pointers_per_block(), lblk)
            .ok_or_else(|| Error::FileTooLarge(format!("logical block {lblk} is past the reach of a block map")))?;
        let chain = self.walk_chain(ino, inode, &path)?;
        let link = chain.last().expect("a walk holds the root link");
        // A walk stops early only at a zero pointer; a non-zero last one maps lblk.
        if link.value != 0 {
            return Err(Error::Invalid(format!("logical block {lblk} of inode {ino} is mapped already")));
        }
        let missing = path.depth - chain.len();
        let room = (path.boundary + 1).min(want.max(1)).min(u32::MAX as u64);
        // With the last array there already, only the zero pointers that follow count.
        let len = if missing > 0 {
            room
        } else {
            let array = Self::link_array(inode, link);
            (1..room).take_while(|&j| array[link.index + j as usize] == 0).count() as u64 + 1
        };
        let goal = self.find_near(ino, inode, link) & (MAX_PHYS - 1);
        let new_indirect = self.alloc_indirect(tx, goal, missing)?;
        let data_goal = new_indirect.last().copied().unwrap_or(goal);
        let (data, got) = match self.alloc_below_2_32(tx, data_goal, len as u32) {
            Ok(v) => v,
            Err(e) => {
                for &b in &new_indirect {
                    self.alloc.free_blocks_range(tx, b, 1)?;
                }
                return Err(e);
            }
        };
        self.splice_branch(tx, inode, &path, &chain, &new_indirect, data, got as u64);
        Ok((data, got))
    }

    /// Maps logical [lblk, lblk + len) to the already allocated `pblk..` (a hole
    /// lying in one pointer array), taking the indirect blocks the path lacks.
    /// i_blocks grows by the data and the new indirect blocks. All or nothing.
    ///
    /// # Errors
    /// `NoSpace` for the indirect blocks (nothing changed); `Invalid` when the
    /// range is not a hole in one array; `Corrupt` for a damaged map.
    pub(crate) fn ind_map_range(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        lblk: u64,
        pblk: u64,
        len: u32,
    ) -> Result<()> {
        let path = path_of(self.pointers_per_block(), lblk)
            .ok_or_else(|| Error::FileTooLarge(format!("logical block {lblk} is past the reach of a block map")))?;
        if len == 0 || len as u64 > path.boundary + 1 || pblk + len as u64 > MAX_PHYS {
            return Err(Error::Invalid(format!(
                "mapping {len} blocks at logical {lblk} of inode {ino} (physical {pblk}) in one block-map array"
            )));
        }
        let chain = self.walk_chain(ino, inode, &path)?;
        let link = chain.last().expect("a walk holds the root link");
        if link.value != 0 {
            return Err(Error::Invalid(format!("logical block {lblk} of inode {ino} is mapped already")));
        }
        let missing = path.depth - chain.len();
        if missing == 0 {
            let array = Self::link_array(inode, link);
            if array[link.index..link.index + len as usize].iter().any(|&p| p != 0) {
                return Err(Error::Invalid(format!("logical block {lblk} of inode {ino} is mapped already")));
            }
        }
        let goal = self.find_near(ino, inode, link) & (MAX_PHYS - 1);
        let new_indirect = self.alloc_indirect(tx, goal, missing)?;
        self.splice_branch(tx, inode, &path, &chain, &new_indirect, pblk, len as u64);
        Ok(())
    }

    /// Plans the removal of logical [first, end) from the pointers in `ptrs`,
    /// where `ptrs[i]` maps [base + i * span, base + (i + 1) * span) with span =
    /// per^level (level 0: data pointers). Pointers whose whole subtree goes (or
    /// whose indirect block is left empty) become zero in `ptrs`.
    #[allow(clippy::too_many_arguments)]
    fn plan_removal(
        &self,
        ino: u32,
        ptrs: &mut [u64],
        base: u64,
        level: u32,
        first: u64,
        end: u64,
        plan: &mut Removal,
    ) -> Result<()> {
        let per = self.pointers_per_block();
        let span = per.pow(level);
        for (i, slot) in ptrs.iter_mut().enumerate() {
            let (lo, hi) = (base + i as u64 * span, base + (i as u64 + 1) * span);
            if *slot == 0 || hi <= first || lo >= end {
                continue;
            }
            if level == 0 {
                plan.free_block(*slot);
                plan.last_data = plan.last_data.max(Some(lo));
                *slot = 0;
                continue;
            }
            let buf = self.indirect_block(ino, *slot)?;
            let before: Vec<u64> = buf.read().chunks_exact(4).map(|c| le32(c, 0) as u64).collect();
            drop(buf);
            let mut after = before.clone();
            self.plan_removal(ino, &mut after, lo, level - 1, first, end, plan)?;
            if after.iter().all(|&p| p == 0) {
                // Emptied (or wholly in the range): it goes after what it mapped.
                plan.free_block(*slot);
                *slot = 0;
            } else if after != before {
                plan.rewrite.push((*slot, after.iter().map(|&p| p as u32).collect()));
            } else {
                plan.kept.push(*slot);
            }
        }
        Ok(())
    }

    /// Plans and checks the removal of [first, end) from `inode`'s map: the new
    /// i_block, and what to free and rewrite. Nothing is changed.
    fn plan_inode_removal(&self, ino: u32, inode: &Inode, first: u64, end: u64) -> Result<(Removal, [u64; 15])> {
        let per = self.pointers_per_block();
        let mut slots = [0u64; 15];
        for (i, s) in slots.iter_mut().enumerate() {
            *s = self.root_pointer(ino, inode, i)?;
        }
        let mut plan = Removal::default();
        self.plan_removal(ino, &mut slots[..DIRECT], 0, 0, first, end, &mut plan)?;
        let mut base = DIRECT as u64;
        for level in 1..=3u32 {
            let slot = DIRECT + level as usize - 1;
            self.plan_removal(ino, &mut slots[slot..slot + 1], base, level, first, end, &mut plan)?;
            base += per.pow(level);
        }
        // Validate before walking on: a block named twice would be freed twice, and
        // one the bitmap already calls free would stop the change half-way.
        let location = || format!("block map of inode {ino}");
        let mut named: Vec<(u64, u64)> = plan.free.clone();
        named.extend(plan.rewrite.iter().map(|(b, _)| (*b, 1)));
        named.extend(plan.kept.iter().map(|&b| (b, 1)));
        named.sort_unstable();
        for w in named.windows(2) {
            if w[0].0 + w[0].1 > w[1].0 {
                return Err(Error::corrupt(format!("block {} is mapped twice", w[1].0), location()));
            }
        }
        for &(start, len) in &plan.free {
            self.vol.check_metadata_free_range(start, len, &location)?;
        }
        let mut to_free = plan.free.clone();
        to_free.sort_unstable();
        self.alloc.check_blocks_in_use(&to_free, &location)?;
        Ok((plan, slots))
    }

    /// Unmaps and frees logical blocks [first, end) of a block-mapped inode, with
    /// every indirect block left empty (ext4_ind_truncate, ext4_ind_remove_space).
    ///
    /// # Errors
    /// `Corrupt` for a damaged map, before anything changed.
    pub(crate) fn ind_remove(&self, tx: &mut Handle, ino: u32, inode: &mut Inode, first: u64, end: u64) -> Result<()> {
        let end = end.min(self.block_map_reach());
        if first >= end {
            return Ok(());
        }
        let (plan, slots) = self.plan_inode_removal(ino, inode, first, end)?;
        for (block, pointers) in &plan.rewrite {
            let buf = self.vol.cache.get(*block)?;
            {
                let mut b = buf.write();
                for (i, &p) in pointers.iter().enumerate() {
                    put_le32(&mut b, i * 4, p);
                }
            }
            tx.dirty(&buf);
        }
        for (i, &p) in slots.iter().enumerate() {
            put_le32(&mut inode.i_block, i * 4, p as u32);
        }
        for &(start, len) in &plan.free {
            self.alloc.free_blocks_range(tx, start, len)?;
        }
        let sectors = plan.freed_blocks() * (self.vol.geo.block_size as u64 / 512);
        inode.i_blocks = inode.i_blocks.saturating_sub(sectors);
        Ok(())
    }

    /// Reads and checks the whole map of `inode` as a release would free it, so
    /// that damage refuses an unlink before any name is removed.
    ///
    /// # Errors
    /// `Corrupt` for a damaged map.
    pub(crate) fn ind_check_releasable(&self, ino: u32, inode: &Inode) -> Result<()> {
        let (plan, _) = self.plan_inode_removal(ino, inode, 0, self.block_map_reach())?;
        // A directory has no blocks past its size (e2fsck: "too big"); one that maps
        // some names blocks that may belong to another file by now.
        let blocks = inode.i_size.div_ceil(self.vol.geo.block_size as u64);
        match plan.last_data {
            Some(last) if inode.is_dir() && last >= blocks => Err(Error::corrupt(
                format!("directory of {blocks} blocks maps logical block {last}"),
                format!("block map of inode {ino}"),
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::path_of;

    #[test]
    fn paths_follow_the_kernel_layout() {
        let per = 256;
        let p = path_of(per, 0).unwrap();
        assert_eq!((p.depth, p.offsets[0], p.boundary), (1, 0, 11));
        let p = path_of(per, 12).unwrap();
        assert_eq!((p.depth, p.offsets[..2].to_vec(), p.boundary), (2, vec![12, 0], 255));
        let p = path_of(per, 12 + 255).unwrap();
        assert_eq!((p.depth, p.offsets[..2].to_vec(), p.boundary), (2, vec![12, 255], 0));
        let p = path_of(per, 12 + 256).unwrap();
        assert_eq!((p.depth, p.offsets[..3].to_vec()), (3, vec![13, 0, 0]));
        let p = path_of(per, 12 + 256 + 256 * 3 + 7).unwrap();
        assert_eq!((p.depth, p.offsets[..3].to_vec(), p.boundary), (3, vec![13, 3, 7], 248));
        let tind = 12 + 256 + 256 * 256;
        let p = path_of(per, tind + 256 * 256 * 2 + 256 * 5 + 9).unwrap();
        assert_eq!((p.depth, p.offsets.to_vec()), (4, vec![14, 2, 5, 9]));
        assert!(path_of(per, tind + 256 * 256 * 256).is_none());
        assert!(path_of(per, tind + 256 * 256 * 256 - 1).is_some());
    }
}
