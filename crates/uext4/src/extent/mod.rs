//! Mapping logical file blocks to physical blocks: extent trees of any depth, and
//! (in `indirect.rs`) the block maps of files without the extent flag. Writing
//! into unwritten extents, with seed 001's zero-out, is `zeroout.rs`.
//!
//! Every node read is checked before it is trusted: magic, counts, depth one less
//! than its parent's (which makes a looping tree impossible to follow), the node
//! checksum (once, through the buffer cache), and every block number against the
//! size of the filesystem.

use crate::error::{Error, Result};
use crate::format::extent::{self, ExtentIndex, ExtentNode};
use crate::format::inode::{Inode, EXT4_EXTENTS_FL};
use crate::fs::Filesystem;

pub mod indirect;
pub mod write;
mod zeroout;

/// Logical blocks are 32-bit in ext4.
pub const MAX_LBLK: u64 = 1 << 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapKind {
    Hole,
    /// Allocated but not yet written: reads as zeros.
    Unwritten(u64),
    Mapped(u64),
}

/// `len` logical blocks from `lblk` share one kind (and, if mapped, run contiguously).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub lblk: u64,
    pub len: u64,
    pub kind: MapKind,
}

impl Filesystem {
    #[doc(hidden)]
    /// Maps up to `max_len` blocks starting at `lblk`.
    pub fn map_blocks(&self, ino: u32, inode: &Inode, lblk: u64, max_len: u64) -> Result<Mapping> {
        let max_len = max_len.clamp(1, MAX_LBLK.saturating_sub(lblk).max(1));
        if inode.has_flag(EXT4_EXTENTS_FL) {
            self.map_extents(ino, inode, lblk, max_len)
        } else {
            self.map_indirect(ino, inode, lblk, max_len)
        }
    }

    fn map_extents(&self, ino: u32, inode: &Inode, lblk: u64, max_len: u64) -> Result<Mapping> {
        let loc = || format!("extent tree of inode {ino}");
        let mut node = self.extent_root(ino, inode)?;
        // The first logical block the current subtree does not cover.
        let mut upper_bound = MAX_LBLK;
        let seed = self.inode_seed(ino, inode);
        loop {
            match node {
                ExtentNode::Leaf(_, extents) => {
                    let pos = extents.partition_point(|e| e.ee_block as u64 <= lblk);
                    if pos > 0 {
                        let e = extents[pos - 1];
                        if lblk < e.end() {
                            let start = e.start + (lblk - e.ee_block as u64);
                            let len = (e.end() - lblk).min(max_len);
                            self.vol.check_block(start, &|| format!("{} logical {lblk}", loc()))?;
                            self.vol.check_block(start + len - 1, &|| format!("{} logical {lblk}", loc()))?;
                            let kind = if e.unwritten { MapKind::Unwritten(start) } else { MapKind::Mapped(start) };
                            return Ok(Mapping { lblk, len, kind });
                        }
                    }
                    let next = extents.get(pos).map(|e| e.ee_block as u64).unwrap_or(upper_bound);
                    let len = next.min(upper_bound).saturating_sub(lblk).clamp(1, max_len);
                    return Ok(Mapping { lblk, len, kind: MapKind::Hole });
                }
                ExtentNode::Index(h, idx) => {
                    let pos = idx.partition_point(|e| e.ei_block as u64 <= lblk);
                    if pos == 0 {
                        let next = idx.first().map(|e| e.ei_block as u64).unwrap_or(upper_bound);
                        let len = next.min(upper_bound).saturating_sub(lblk).clamp(1, max_len);
                        return Ok(Mapping { lblk, len, kind: MapKind::Hole });
                    }
                    if let Some(next) = idx.get(pos) {
                        upper_bound = upper_bound.min(next.ei_block as u64);
                    }
                    node = self.read_extent_node(ino, seed, &idx[pos - 1], h.eh_depth - 1)?;
                }
            }
        }
    }

    /// The root node in i_block, checked as every node is.
    pub(crate) fn extent_root(&self, ino: u32, inode: &Inode) -> Result<ExtentNode> {
        let location = format!("extent tree of inode {ino}");
        let node = ExtentNode::parse(&inode.i_block, None, &location)?;
        self.check_extent_node(&node, None, &location)?;
        Ok(node)
    }

    /// Reads the node `index` points to, which must have depth `depth`. Its
    /// checksum is verified once, through the cache; its structure and the
    /// blocks its entries name on every read: a buffer's verified mark says
    /// nothing of the role it was verified for, and a hostile image may reach
    /// one block as a directory block first and as an extent node later.
    pub(crate) fn read_extent_node(&self, ino: u32, seed: u32, index: &ExtentIndex, depth: u16) -> Result<ExtentNode> {
        let block = index.leaf;
        let location = format!("extent tree of inode {ino}, node at block {block}");
        self.vol.check_block(block, &|| location.clone())?;
        let verify = self.vol.geo.metadata_csum && self.vol.geo.verify_checksums;
        let buf = self.vol.cache.get_verified_as(block, crate::dev::IoClass::ExtentNode, |b| {
            if verify {
                extent::verify_block_checksum(b, seed, &location)?;
            }
            Ok(())
        })?;
        let node = ExtentNode::parse(&buf.read(), Some(depth), &location)?;
        self.check_extent_node(&node, Some(index.ei_block), &location)?;
        Ok(node)
    }

    /// The checks of the kernel's `ext4_valid_extent_entries` that need the
    /// filesystem: see
    /// `check_extent_entries`, and a non-root node's first key is the one its
    /// parent indexes it under.
    pub(crate) fn check_extent_node(&self, node: &ExtentNode, parent_key: Option<u32>, location: &str) -> Result<()> {
        check_first_key(node, parent_key, location)?;
        self.check_extent_entries(node, location)
    }

    /// Every block an entry names lies inside the filesystem, past the first
    /// data block and outside the group metadata (so that writing through a
    /// hostile extent cannot land on a bitmap or the inode table).
    fn check_extent_entries(&self, node: &ExtentNode, location: &str) -> Result<()> {
        match node {
            ExtentNode::Leaf(_, v) => {
                for e in v {
                    self.vol.check_metadata_free_range(e.start, e.len as u64, &|| {
                        format!("{location}: extent at logical {}", e.ee_block)
                    })?;
                }
            }
            ExtentNode::Index(_, v) => {
                for e in v {
                    self.vol.check_metadata_free_range(e.leaf, 1, &|| {
                        format!("{location}: index entry at logical {}", e.ei_block)
                    })?;
                }
            }
        }
        Ok(())
    }

    #[doc(hidden)]
    /// Every mapping of the file, in order, for `stat`-style reports. Bounded by
    /// i_size; holes are included.
    pub fn file_mappings(&self, ino: u32, inode: &Inode) -> Result<Vec<Mapping>> {
        let bs = self.vol.geo.block_size as u64;
        let end = inode.i_size.div_ceil(bs).min(MAX_LBLK);
        let mut out = Vec::new();
        let mut lblk = 0;
        while lblk < end {
            let m = self.map_blocks(ino, inode, lblk, end - lblk)?;
            if m.len == 0 {
                return Err(Error::corrupt("mapping made no progress", format!("inode {ino}")));
            }
            lblk += m.len;
            out.push(m);
        }
        Ok(out)
    }
}

/// A non-root node's first key must be the one its parent indexes it under.
fn check_first_key(node: &ExtentNode, parent_key: Option<u32>, location: &str) -> Result<()> {
    let first_key = match node {
        ExtentNode::Leaf(_, v) => v.first().map(|e| e.ee_block),
        ExtentNode::Index(_, v) => v.first().map(|e| e.ei_block),
    };
    if let (Some(want), Some(have)) = (parent_key, first_key) {
        if want != have {
            return Err(Error::corrupt(
                format!("node starts at logical block {have} but its parent indexes it at {want}"),
                location,
            ));
        }
    }
    Ok(())
}
