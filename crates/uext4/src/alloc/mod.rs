//! Allocation of blocks and inodes.
//!
//! A group's descriptor lock (`Filesystem::groups[g]`, taken for writing) is the
//! allocator's group lock: bitmap, descriptor and checksums of a group change only
//! under it, and several groups are locked in ascending order. Filesystem-wide free
//! counts are kept in atomics and written to the superblock at sync. Groups still
//! marked BLOCK_UNINIT or INODE_UNINIT get their bitmaps built on first use, as the
//! kernel does.

pub mod block;
pub mod inode;

use crate::fs::Filesystem;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub use inode::{InodePolicy, MainlinePolicy};

pub struct AllocState {
    pub(crate) free_blocks: AtomicU64,
    pub(crate) free_inodes: AtomicU64,
    /// Per group: where the last inode search ended, so allocation never rescans from 0.
    pub(crate) inode_hint: Vec<AtomicU32>,
    /// Per group: where the last block search ended.
    pub(crate) block_hint: Vec<AtomicU32>,
    pub(crate) policy: Box<dyn InodePolicy>,
}

impl AllocState {
    pub(crate) fn new(groups: &[crate::format::group_desc::GroupDesc]) -> AllocState {
        AllocState {
            free_blocks: AtomicU64::new(groups.iter().map(|g| g.bg_free_blocks_count as u64).sum()),
            free_inodes: AtomicU64::new(groups.iter().map(|g| g.bg_free_inodes_count as u64).sum()),
            inode_hint: groups.iter().map(|_| AtomicU32::new(0)).collect(),
            block_hint: groups.iter().map(|_| AtomicU32::new(0)).collect(),
            policy: Box::new(MainlinePolicy),
        }
    }
}

impl Filesystem {
    pub fn free_blocks(&self) -> u64 {
        self.alloc.free_blocks.load(Ordering::Relaxed)
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
