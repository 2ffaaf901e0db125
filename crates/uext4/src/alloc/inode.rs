//! The inode allocator and its placement policy.
//!
//! Where a new inode goes is a policy (`InodePolicy`), kept apart from the bitmap
//! work so that directory inode reservation and hash-derived goals can replace it.
//! `MainlinePolicy` follows mainline ext4 in spirit: directories under the root are
//! spread Orlov-style to groups with more free inodes and blocks than average and
//! few directories; other directories and files stay near their parent.

use crate::alloc::Allocator;
use crate::cache::Buffer;
use crate::error::{Error, Result};
use crate::format::bitmap;
use crate::format::group_desc::{GdCsum, GroupDesc, EXT4_BG_INODE_UNINIT};
use crate::journal::handle::Handle;
use crate::volume::Volume;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Chooses the order in which groups are tried for a new inode.
pub trait InodePolicy: Send + Sync {
    fn group_order(&self, vol: &Volume, parent: u32, is_dir: bool) -> Vec<u32>;
}

pub struct MainlinePolicy;

impl InodePolicy for MainlinePolicy {
    fn group_order(&self, vol: &Volume, parent: u32, is_dir: bool) -> Vec<u32> {
        let groups = vol.geo.group_count;
        let parent_group = (parent - 1) / vol.geo.inodes_per_group;
        let rotated = |first: u32| (0..groups).map(move |i| (first + i) % groups);
        if !is_dir || parent != crate::ns::ROOT_INO {
            return rotated(parent_group).collect();
        }
        // Orlov for top-level directories: among groups with at least average free
        // inodes and blocks, the one with the fewest directories first.
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
        self.vol.cache.get_verified(blk, |b| {
            if verify && !bitmap::matches(stored, bitmap::checksum(b, bits, seed), ds) {
                return Err(Error::corrupt(
                    "inode bitmap checksum does not match",
                    format!("group {g} bitmap block {blk}"),
                ));
            }
            Ok(())
        })
    }

    /// A slot the bitmap calls free must not hold a live inode (links count 0): a
    /// bitmap that lost an in-use inode's bit would otherwise hand it out again and
    /// the two would share one number.
    fn check_inode_slot_free(&self, g: u32, gd: &GroupDesc, index: u32) -> Result<()> {
        let (bs, isz) = (self.vol.geo.block_size as u64, self.vol.geo.inode_size as u64);
        let byte = index as u64 * isz;
        let buf = self.vol.cache.get(gd.bg_inode_table + byte / bs)?;
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
        if self.free_inodes.load(Ordering::Relaxed) == 0 {
            return Err(Error::NoSpace("no free inodes".into()));
        }
        let first_ino = self.vol.sb.read().first_ino();
        let order = self.policy.group_order(&self.vol, parent, is_dir);
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
            // Slots past ipg - itable_unused may never have been initialized (lazy
            // inode table init); those before it hold what was last written there.
            let itable_trusted = match self.vol.geo.gd_csum {
                GdCsum::None => self.vol.geo.inodes_per_group,
                _ if gd.bg_flags & EXT4_BG_INODE_UNINIT != 0 => 0,
                _ => self.vol.geo.inodes_per_group.saturating_sub(gd.bg_itable_unused),
            };
            let buf = self.inode_bitmap(tx, g, &mut gd)?;
            let ipg = self.vol.geo.inodes_per_group as usize;
            let index = {
                let mut b = buf.write();
                let hint = (self.inode_hint[g as usize].load(Ordering::Relaxed) as usize).min(ipg);
                // Reserved inodes (below s_first_ino) are never handed out.
                let usable = |i: usize| g as usize * ipg + i + 1 >= first_ino as usize;
                let free = |i: &usize| !bitmap::test_bit(&b, *i) && usable(*i);
                let Some(i) = (hint..ipg).find(free).or_else(|| (0..hint).find(free)) else {
                    continue;
                };
                bitmap::set_bit(&mut b, i);
                if self.vol.geo.metadata_csum {
                    gd.bg_inode_bitmap_csum =
                        bitmap::checksum(&b, self.vol.geo.inodes_per_group, self.vol.geo.csum_seed);
                }
                i
            };
            if (index as u32) < itable_trusted {
                if let Err(e) = self.check_inode_slot_free(g, &gd, index as u32) {
                    // Nothing is dirtied yet: the bit goes back and the group is as it was.
                    bitmap::clear_bit(&mut buf.write(), index);
                    return Err(e);
                }
            }
            tx.dirty(&buf);
            gd.bg_free_inodes_count -= 1;
            if is_dir {
                gd.bg_used_dirs_count += 1;
            }
            // Inodes past ipg - itable_unused have never been used; keep that true.
            // Writable opens refuse itable_unused > ipg (Filesystem::check_descriptors).
            let first_unused = (ipg as u32).saturating_sub(gd.bg_itable_unused);
            if index as u32 >= first_unused {
                gd.bg_itable_unused = ipg as u32 - index as u32 - 1;
            }
            self.vol.write_group_desc(tx, g, &gd)?;
            *gd_lock = gd;
            self.inode_hint[g as usize].store(index as u32 + 1, Ordering::Relaxed);
            self.free_inodes.fetch_sub(1, Ordering::Relaxed);
            return Ok(g * self.vol.geo.inodes_per_group + index as u32 + 1);
        }
        Err(Error::NoSpace("no group has a free inode".into()))
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
        Ok(())
    }
}
