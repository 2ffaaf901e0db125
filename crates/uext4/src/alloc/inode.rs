//! The inode allocator and its placement policy.
//!
//! Where a new inode goes is a policy (`InodePolicy`), kept apart from the bitmap
//! work: the allocator owns the group locks, the bitmaps, the counters and
//! `bg_itable_unused`; a policy only chooses. It is asked twice:
//! 1. `preferred` groups, locked in turn, where `pick` may name a slot in the
//!    group's bitmap (a reserved window, a hash position); a policy with no such
//!    slots names no groups;
//! 2. failing that, `group_order`, where the allocator takes the first free slot
//!    from its own per-group hint (groups busy with other creates are passed over
//!    first, waited for only when every group is busy).
//!
//! So a policy can never make a free inode unreachable: the second pass is the
//! ordinary allocator. `MainlinePolicy` follows mainline ext4 in spirit:
//! directories under the root are spread Orlov-style to groups with more free
//! inodes and blocks than average and few directories; other directories and
//! files stay near their parent. `dir_ireserve::DirReservePolicy` (seed 000) and
//! `hash_goal::HashGoal` (seed 003) are the others.

use crate::alloc::Allocator;
use crate::cache::Buffer;
use crate::error::{Error, Result};
use crate::format::bitmap;
use crate::format::group_desc::{GdCsum, GroupDesc, EXT4_BG_INODE_UNINIT};
use crate::journal::handle::Handle;
use crate::volume::Volume;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What the allocator knows of a new inode when a policy places it.
#[derive(Clone, Debug, Default)]
pub struct InodeRequest {
    pub parent: u32,
    pub is_dir: bool,
    /// Inode numbers named in the parent's directory block the new name will go
    /// into (Andreas Dilger's restart idea, seed 000): where the parent's files
    /// are when nothing in memory says. Filled only when the policy asks
    /// (`InodePolicy::wants_neighbours`).
    pub neighbours: Vec<u32>,
    /// In a hash-indexed parent, with a policy that asks: the new name's hash
    /// and the (hash, inode) of every entry in the leaf it goes into.
    pub name_hash: Option<u32>,
    pub leaf: Vec<(u32, u32)>,
    /// The parent's size in blocks, when the hint was taken.
    pub parent_blocks: u64,
}

impl InodeRequest {
    pub fn new(parent: u32, is_dir: bool) -> InodeRequest {
        InodeRequest { parent, is_dir, ..Default::default() }
    }
}

/// Chooses where a new inode goes (see the module comment for the two passes).
pub trait InodePolicy: Send + Sync {
    /// The groups the ordinary pass tries, best first.
    fn group_order(&self, vol: &Volume, req: &InodeRequest) -> Vec<u32>;

    /// Groups where `pick` may find a slot of the policy's own, best first.
    fn preferred(&self, _vol: &Volume, _req: &InodeRequest) -> Vec<u32> {
        Vec::new()
    }

    /// A free slot (index in the group) of `g`, whose inode bitmap `bitmap` the
    /// caller holds locked; `usable(i)` says whether slot i may be handed out at
    /// all (not one of the reserved inodes). None: nothing of the policy's here.
    fn pick(
        &self,
        _vol: &Volume,
        _g: u32,
        _bitmap: &[u8],
        _req: &InodeRequest,
        _usable: &dyn Fn(u32) -> bool,
    ) -> Option<u32> {
        None
    }

    /// `ino` went to `req` (by either pass).
    fn allocated(&self, _vol: &Volume, _req: &InodeRequest, _ino: u32) {}

    /// `ino` was freed.
    fn freed(&self, _vol: &Volume, _ino: u32, _was_dir: bool) {}

    /// Whether placing a new inode (a directory if `is_dir`) under `parent`
    /// needs `InodeRequest::neighbours` (and, in an indexed parent with a policy
    /// that wants the name hash, the leaf's hashes), which cost reading the
    /// parent's block.
    fn wants_neighbours(&self, _parent: u32, _indexed: bool, _is_dir: bool) -> bool {
        false
    }

    /// Whether placing a new inode in a directory that is (or is not) indexed
    /// needs `InodeRequest::name_hash`.
    fn wants_name_hash(&self, _indexed: bool) -> bool {
        false
    }

    /// The windows directories hold (`dir_ireserve`), by directory inode.
    fn windows(&self) -> Vec<(u32, crate::alloc::Window)> {
        Vec::new()
    }

    /// The span of directory `dir` (`hash_goal`).
    fn hash_span(&self, _dir: u32) -> Option<crate::alloc::hash_goal::Span> {
        None
    }
}

/// Policies stacked: each one's own slots in turn, then the ordinary pass of
/// the first.
pub struct Layered {
    layers: Vec<Box<dyn InodePolicy>>,
}

impl Layered {
    pub fn new(layers: Vec<Box<dyn InodePolicy>>) -> Layered {
        Layered { layers }
    }
}

impl InodePolicy for Layered {
    fn group_order(&self, vol: &Volume, req: &InodeRequest) -> Vec<u32> {
        match self.layers.first() {
            Some(first) => first.group_order(vol, req),
            None => MainlinePolicy.group_order(vol, req),
        }
    }

    fn preferred(&self, vol: &Volume, req: &InodeRequest) -> Vec<u32> {
        let mut out: Vec<u32> = Vec::new();
        for g in self.layers.iter().flat_map(|l| l.preferred(vol, req)) {
            if !out.contains(&g) {
                out.push(g);
            }
        }
        out
    }

    fn pick(
        &self,
        vol: &Volume,
        g: u32,
        bitmap: &[u8],
        req: &InodeRequest,
        usable: &dyn Fn(u32) -> bool,
    ) -> Option<u32> {
        self.layers.iter().find_map(|l| l.pick(vol, g, bitmap, req, usable))
    }

    fn allocated(&self, vol: &Volume, req: &InodeRequest, ino: u32) {
        self.layers.iter().for_each(|l| l.allocated(vol, req, ino));
    }

    fn freed(&self, vol: &Volume, ino: u32, was_dir: bool) {
        self.layers.iter().for_each(|l| l.freed(vol, ino, was_dir));
    }

    fn wants_neighbours(&self, parent: u32, indexed: bool, is_dir: bool) -> bool {
        self.layers.iter().any(|l| l.wants_neighbours(parent, indexed, is_dir))
    }

    fn wants_name_hash(&self, indexed: bool) -> bool {
        self.layers.iter().any(|l| l.wants_name_hash(indexed))
    }

    fn windows(&self) -> Vec<(u32, crate::alloc::Window)> {
        self.layers.iter().flat_map(|l| l.windows()).collect()
    }

    fn hash_span(&self, dir: u32) -> Option<crate::alloc::hash_goal::Span> {
        self.layers.iter().find_map(|l| l.hash_span(dir))
    }
}

pub struct MainlinePolicy;

impl InodePolicy for MainlinePolicy {
    fn group_order(&self, vol: &Volume, req: &InodeRequest) -> Vec<u32> {
        let groups = vol.geo.group_count;
        let parent_group = (req.parent - 1) / vol.geo.inodes_per_group;
        let rotated = |first: u32| (0..groups).map(move |i| (first + i) % groups);
        if !req.is_dir || req.parent != crate::ns::ROOT_INO {
            return rotated(parent_group).collect();
        }
        // Orlov for top-level directories: among groups with at least average free
        // inodes and blocks, the one with the fewest directories first. (The
        // kernel counts by flex group and fills each flex group's first group;
        // measured here, that halved mkdir's modelled time but interleaved the
        // files of directories made round-robin in one inode table, and tree's
        // and ireserve's cold rm -rf took 1.8x and 2.5x as long: docs/BENCHMARKS.md.)
        let descs: Vec<GroupDesc> = vol.groups.iter().map(|g| g.read().clone()).collect();
        let avg_inodes = descs.iter().map(|d| d.bg_free_inodes_count as u64).sum::<u64>() / groups as u64;
        let avg_blocks = descs.iter().map(|d| d.bg_free_blocks_count as u64).sum::<u64>() / groups as u64;
        let best = (0..groups)
            .filter(|&g| {
                let d = &descs[g as usize];
                d.bg_free_inodes_count as u64 >= avg_inodes.max(1) && d.bg_free_blocks_count as u64 >= avg_blocks
            })
            .min_by_key(|&g| (descs[g as usize].bg_used_dirs_count, g))
            .unwrap_or(parent_group);
        rotated(best).collect()
    }
}

/// `order` (a policy's groups, best first) moved to start at the first group of
/// the flex group its best group lies in: a window-reserving policy packs a
/// top-level directory's window from there, in the flex group the ordinary
/// policy chose, so directories made one after another keep their inodes (and
/// their first blocks, which go to the flex group's first group) together.
/// Without flex groups (or with one) it is `order` unchanged.
pub fn packed_in_flex(vol: &Volume, order: Vec<u32>) -> Vec<u32> {
    let groups = vol.geo.group_count;
    let per_flex = vol.geo.groups_per_flex.clamp(1, groups.max(1));
    let Some(&best) = order.first() else { return order };
    if per_flex == 1 || per_flex >= groups {
        return order;
    }
    let first = best - best % per_flex;
    (0..groups).map(|i| (first + i) % groups).collect()
}

impl Allocator {
    /// Group `g`'s inode bitmap; an INODE_UNINIT group's starts empty (with the bits
    /// past inodes_per_group set) and loses the flag. The caller holds the group lock.
    fn inode_bitmap(&self, tx: &mut Handle, g: u32, gd: &mut GroupDesc) -> Result<Arc<Buffer>> {
        let blk = gd.bg_inode_bitmap;
        if gd.bg_flags & EXT4_BG_INODE_UNINIT != 0 {
            let buf = self.vol.cache.get_new(blk);
            {
                let mut b = buf.write();
                for bit in self.vol.geo.inodes_per_group as usize..self.vol.geo.block_size * 8 {
                    bitmap::set_bit(&mut b, bit);
                }
            }
            gd.bg_flags &= !EXT4_BG_INODE_UNINIT;
            tx.dirty(&buf);
            return Ok(buf);
        }
        let verify = self.vol.geo.metadata_csum && self.vol.geo.verify_checksums;
        let (seed, ds, bits) = (self.vol.geo.csum_seed, self.vol.geo.desc_size, self.vol.geo.inodes_per_group);
        let stored = gd.bg_inode_bitmap_csum;
        self.vol
            .cache
            .get_verified(blk, |b| {
                if verify && !bitmap::matches(stored, bitmap::checksum(b, bits, seed), ds) {
                    return Err(Error::corrupt(
                        "inode bitmap checksum does not match",
                        format!("group {g} bitmap block {blk}"),
                    ));
                }
                Ok(())
            })
            .map_err(|e| {
                self.vol.read_error(e, "read_inode_bitmap", &format!("reading the inode bitmap of group {g}"), 0, blk)
            })
    }

    /// Whether the inode-table block of slot `index` is one the inode's write
    /// will make from zeros without reading it (`inodes::inode_block_unread`):
    /// not cached, and every other slot in it free in the bitmap (`others_free`,
    /// from `Geometry::inode_block_others_free`), one whose checksum was
    /// verified. Its slot is not read to be checked then either: the kernel
    /// trusts such a bitmap there, and a block read only for the
    /// check cost a read per new window of `dir_ireserve` (postmark's creates,
    /// 25x the modelled disk time). Without checksums a bitmap that lost bits
    /// would not be noticed, so the block is read and its slot checked.
    fn slot_block_written_unread(&self, gd: &GroupDesc, others_free: bool, index: u32) -> bool {
        if !(self.vol.geo.metadata_csum && self.vol.geo.verify_checksums) {
            return false;
        }
        let (bs, isz) = (self.vol.geo.block_size as u64, self.vol.geo.inode_size as u64);
        let block = gd.bg_inode_table + index as u64 * isz / bs;
        others_free && !self.vol.cache.holds(block)
    }

    /// A slot the bitmap calls free must not hold a live inode (links count 0): a
    /// bitmap that lost an in-use inode's bit would otherwise hand it out again and
    /// the two would share one number.
    fn check_inode_slot_free(&self, g: u32, gd: &GroupDesc, index: u32) -> Result<()> {
        let (bs, isz) = (self.vol.geo.block_size as u64, self.vol.geo.inode_size as u64);
        let byte = index as u64 * isz;
        let buf = self.vol.inode_table_block(gd, index)?;
        let links = crate::format::bytes::le16(&buf.read(), (byte % bs) as usize + 0x1A);
        if links != 0 {
            let ino = g * self.vol.geo.inodes_per_group + index + 1;
            return Err(Error::corrupt(
                format!("inode {ino} is free in the inode bitmap but in use ({links} links)"),
                format!("group {g} inode bitmap"),
            ));
        }
        Ok(())
    }

    /// Allocates an inode number for a new inode under `parent`.
    pub fn alloc_inode(&self, tx: &mut Handle, parent: u32, is_dir: bool) -> Result<u32> {
        self.alloc_inode_for(tx, &InodeRequest::new(parent, is_dir))
    }

    /// Whether placing a new inode under `parent` wants `InodeRequest::neighbours`
    /// (see `InodePolicy::wants_neighbours`).
    pub fn wants_neighbours(&self, parent: u32, indexed: bool, is_dir: bool) -> bool {
        self.policy.wants_neighbours(parent, indexed, is_dir)
    }

    /// Whether placing it wants `InodeRequest::name_hash`.
    pub fn wants_name_hash(&self, indexed: bool) -> bool {
        self.policy.wants_name_hash(indexed)
    }

    /// Allocates an inode number for `req`: the policy's own slots first, then
    /// the ordinary search (see the module comment).
    ///
    /// # Errors
    /// `NoSpace` when no inode is free; `Corrupt` for a bitmap that fails its
    /// checksum; `Io`.
    pub fn alloc_inode_for(&self, tx: &mut Handle, req: &InodeRequest) -> Result<u32> {
        if self.free_inodes.load(Ordering::Relaxed) == 0 {
            return Err(Error::NoSpace("no free inodes".into()));
        }
        for g in self.policy.preferred(&self.vol, req) {
            let Some(lock) = self.vol.groups.get(g as usize) else { continue };
            let mut gd_lock = lock.write();
            if gd_lock.bg_free_inodes_count == 0 {
                continue;
            }
            let mut gd = gd_lock.clone();
            let buf = self.inode_bitmap(tx, g, &mut gd)?;
            let first_ino = self.vol.geo.first_ino;
            let ipg = self.vol.geo.inodes_per_group;
            let usable = |i: u32| i < ipg && g as u64 * ipg as u64 + i as u64 + 1 >= first_ino as u64;
            let picked = self.policy.pick(&self.vol, g, &buf.read(), req, &usable);
            let Some(index) = picked else {
                // An INODE_UNINIT group's bitmap was built and its flag cleared.
                if gd != *gd_lock {
                    self.vol.write_group_desc(tx, g, &gd)?;
                    *gd_lock = gd;
                }
                continue;
            };
            if !usable(index) || bitmap::test_bit(&buf.read(), index as usize) {
                return Err(Error::corrupt(
                    format!("placement policy picked slot {index}, which is not free"),
                    format!("group {g}"),
                ));
            }
            let ino = self.take_inode(tx, g, &mut gd, &buf, index, req.is_dir)?;
            *gd_lock = gd;
            drop(gd_lock);
            self.policy.allocated(&self.vol, req, ino);
            return Ok(ino);
        }
        let first_ino = self.vol.geo.first_ino;
        let order = self.policy.group_order(&self.vol, req);
        // Many creates in one directory all start at its group: one busy there
        // tries the next group rather than queue (the policy's first choices are
        // tried without waiting); only if every group is busy does it wait.
        let busy_first = order.iter().map(|&g| (g, false));
        let waiting_after = order.iter().map(|&g| (g, true));
        for (g, wait) in busy_first.chain(waiting_after) {
            let lock = &self.vol.groups[g as usize];
            let mut gd_lock = match wait {
                true => lock.write(),
                false => match lock.try_write() {
                    Some(l) => l,
                    None => continue,
                },
            };
            if gd_lock.bg_free_inodes_count == 0 {
                continue;
            }
            let mut gd = gd_lock.clone();
            let buf = self.inode_bitmap(tx, g, &mut gd)?;
            let ipg = self.vol.geo.inodes_per_group as usize;
            let found = {
                let b = buf.read();
                let hint = (self.inode_hint[g as usize].load(Ordering::Relaxed) as usize).min(ipg);
                // Reserved inodes (below s_first_ino) are never handed out.
                let usable = |i: usize| g as usize * ipg + i + 1 >= first_ino as usize;
                let free = |i: &usize| !bitmap::test_bit(&b, *i) && usable(*i);
                (hint..ipg).find(free).or_else(|| (0..hint).find(free))
            };
            let Some(index) = found else {
                if gd != *gd_lock {
                    self.vol.write_group_desc(tx, g, &gd)?;
                    *gd_lock = gd;
                }
                continue;
            };
            let ino = self.take_inode(tx, g, &mut gd, &buf, index as u32, req.is_dir)?;
            self.inode_hint[g as usize].store(index as u32 + 1, Ordering::Relaxed);
            *gd_lock = gd;
            drop(gd_lock);
            self.policy.allocated(&self.vol, req, ino);
            return Ok(ino);
        }
        Err(Error::NoSpace("no group has a free inode".into()))
    }

    /// Marks slot `index` of group `g` in use: bitmap and its checksum, the
    /// descriptor's counts and `bg_itable_unused`. The caller holds the group
    /// lock and has checked that the slot is free.
    fn take_inode(
        &self,
        tx: &mut Handle,
        g: u32,
        gd: &mut GroupDesc,
        buf: &Arc<Buffer>,
        index: u32,
        is_dir: bool,
    ) -> Result<u32> {
        let ipg = self.vol.geo.inodes_per_group;
        // Slots past ipg - itable_unused may never have been initialized (lazy
        // inode table init); those before it hold what was last written there.
        let itable_trusted = match self.vol.geo.gd_csum {
            GdCsum::None => ipg,
            _ if gd.bg_flags & EXT4_BG_INODE_UNINIT != 0 => 0,
            _ => ipg.saturating_sub(gd.bg_itable_unused),
        };
        if index < itable_trusted {
            // The bitmap judged first and let go: no buffer lock held across the cache's shard lock.
            let others_free = self.vol.geo.inode_block_others_free(&buf.read(), index);
            if !self.slot_block_written_unread(gd, others_free, index) {
                // Before anything is set or dirtied: a refusal leaves the group as it was.
                self.check_inode_slot_free(g, gd, index)?;
            }
        }
        {
            let mut b = buf.write();
            bitmap::set_bit(&mut b, index as usize);
            if self.vol.geo.metadata_csum {
                gd.bg_inode_bitmap_csum = bitmap::checksum(&b, ipg, self.vol.geo.csum_seed);
            }
        }
        tx.dirty(buf);
        gd.bg_free_inodes_count -= 1;
        if is_dir {
            gd.bg_used_dirs_count += 1;
        }
        // Inodes past ipg - itable_unused have never been used; keep that true.
        // Writable opens refuse itable_unused > ipg (Filesystem::check_descriptors).
        let first_unused = ipg.saturating_sub(gd.bg_itable_unused);
        if index >= first_unused {
            gd.bg_itable_unused = ipg - index - 1;
        }
        self.vol.write_group_desc(tx, g, gd)?;
        self.free_inodes.fetch_sub(1, Ordering::Relaxed);
        Ok(g * ipg + index + 1)
    }

    pub fn free_inode(&self, tx: &mut Handle, ino: u32, was_dir: bool) -> Result<()> {
        let g = (ino - 1) / self.vol.geo.inodes_per_group;
        let index = ((ino - 1) % self.vol.geo.inodes_per_group) as usize;
        let mut gd_lock = self.vol.groups[g as usize].write();
        let mut gd = gd_lock.clone();
        let buf = self.inode_bitmap(tx, g, &mut gd)?;
        {
            let mut b = buf.write();
            if !bitmap::test_bit(&b, index) {
                return Err(Error::corrupt(
                    format!("freeing inode {ino}, which is already free"),
                    format!("group {g}"),
                ));
            }
            bitmap::clear_bit(&mut b, index);
            if self.vol.geo.metadata_csum {
                gd.bg_inode_bitmap_csum = bitmap::checksum(&b, self.vol.geo.inodes_per_group, self.vol.geo.csum_seed);
            }
        }
        tx.dirty(&buf);
        gd.bg_free_inodes_count = gd.bg_free_inodes_count.saturating_add(1);
        if was_dir {
            gd.bg_used_dirs_count = gd.bg_used_dirs_count.saturating_sub(1);
        }
        self.vol.write_group_desc(tx, g, &gd)?;
        *gd_lock = gd;
        let hint = &self.inode_hint[g as usize];
        hint.fetch_min(index as u32, Ordering::Relaxed);
        self.free_inodes.fetch_add(1, Ordering::Relaxed);
        drop(gd_lock);
        self.policy.freed(&self.vol, ino, was_dir);
        Ok(())
    }
}
