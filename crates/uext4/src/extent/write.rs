//! Growing and freeing extent trees.
//!
//! Appending merges with the last extent when the new blocks continue it (up to the
//! 32,768-block limit of an initialized extent), else adds an entry; a full root
//! moves its entries into a new leaf block and becomes an index (depth 1), and a
//! full leaf under such a root gets a sibling. Deeper growth is not written yet and
//! is refused with `Unsupported` rather than done wrongly.

use crate::error::{Error, Result};
use crate::format::extent::{self as fext, Extent, ExtentHeader, ExtentIndex, ExtentNode, EXT4_EXT_MAGIC};
use crate::format::inode::{Inode, EXT4_EXTENTS_FL};
use crate::fs::Filesystem;
use crate::journal::handle::Handle;

const ROOT_MAX: u16 = 4;

fn header(entries: usize, max: u16, depth: u16) -> ExtentHeader {
    ExtentHeader {
        eh_magic: EXT4_EXT_MAGIC,
        eh_entries: entries as u16,
        eh_max: max,
        eh_depth: depth,
        eh_generation: 0,
    }
}

/// Adds `new` at the end of a leaf's extents, merging when it continues the last one.
/// Returns false when the leaf has no room.
fn push_extent(extents: &mut Vec<Extent>, max: u16, new: Extent) -> bool {
    if let Some(last) = extents.last_mut() {
        if !last.unwritten
            && !new.unwritten
            && last.end() == new.ee_block as u64
            && last.start + last.len as u64 == new.start
            && last.len + new.len <= fext::EXT_INIT_MAX_LEN
        {
            last.len += new.len;
            return true;
        }
    }
    if extents.len() >= max as usize {
        return false;
    }
    extents.push(new);
    true
}

impl Filesystem {
    /// An empty extent root for a new inode.
    pub(crate) fn empty_extent_root() -> [u8; 60] {
        let mut root = [0u8; 60];
        ExtentNode::Leaf(header(0, ROOT_MAX, 0), Vec::new()).write(&mut root);
        root
    }

    fn sectors_per_block(&self) -> u64 {
        self.geo.block_size as u64 / 512
    }

    fn write_leaf_block(&self, tx: &mut Handle, ino: u32, inode: &Inode, block: u64, node: &ExtentNode) -> Result<()> {
        let buf = self.cache.get_new(block);
        {
            let mut data = buf.write();
            node.write(&mut data);
            if self.geo.metadata_csum {
                fext::set_block_checksum(&mut data, self.inode_seed(ino, inode));
            }
        }
        tx.dirty(&buf);
        Ok(())
    }

    /// Maps logical blocks [lblk, lblk + len) of `inode` to physical `pblk..` at the
    /// end of the file's mapping; adds the data blocks (and any new tree block) to i_blocks.
    pub(crate) fn extent_append(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        lblk: u64,
        pblk: u64,
        len: u32,
    ) -> Result<()> {
        if !inode.has_flag(EXT4_EXTENTS_FL) {
            return Err(Error::unsupported(format!("writing block-mapped inode {ino}")));
        }
        let new = Extent { ee_block: lblk as u32, len, unwritten: false, start: pblk };
        let location = format!("extent tree of inode {ino}");
        let per_block = fext::max_entries_in_block(self.geo.block_size);
        match ExtentNode::parse(&inode.i_block, None, &location)? {
            ExtentNode::Leaf(_, mut extents) => {
                if !push_extent(&mut extents, ROOT_MAX, new) {
                    // Root full: its extents move to a new leaf; the root indexes it.
                    let (leaf_blk, _) = self.alloc_blocks(tx, pblk, 1)?;
                    let first = extents[0].ee_block;
                    push_extent(&mut extents, per_block, new);
                    let leaf = ExtentNode::Leaf(header(extents.len(), per_block, 0), extents);
                    self.write_leaf_block(tx, ino, inode, leaf_blk, &leaf)?;
                    let root = ExtentNode::Index(
                        header(1, ROOT_MAX, 1),
                        vec![ExtentIndex { ei_block: first, leaf: leaf_blk }],
                    );
                    root.write(&mut inode.i_block);
                    inode.i_blocks += self.sectors_per_block();
                } else {
                    ExtentNode::Leaf(header(extents.len(), ROOT_MAX, 0), extents).write(&mut inode.i_block);
                }
            }
            ExtentNode::Index(h, mut index) if h.eh_depth == 1 => {
                let last = *index.last().ok_or_else(|| Error::corrupt("empty extent index", location.clone()))?;
                let buf = self.cache.get(last.leaf)?;
                let node = ExtentNode::parse(&buf.read(), Some(0), &location)?;
                let ExtentNode::Leaf(lh, mut extents) = node else { unreachable!("depth 0 is a leaf") };
                if push_extent(&mut extents, lh.eh_max, new) {
                    self.write_leaf_block(
                        tx,
                        ino,
                        inode,
                        last.leaf,
                        &ExtentNode::Leaf(header(extents.len(), lh.eh_max, 0), extents),
                    )?;
                } else if index.len() < ROOT_MAX as usize {
                    let (leaf_blk, _) = self.alloc_blocks(tx, pblk, 1)?;
                    let leaf = ExtentNode::Leaf(header(1, per_block, 0), vec![new]);
                    self.write_leaf_block(tx, ino, inode, leaf_blk, &leaf)?;
                    index.push(ExtentIndex { ei_block: new.ee_block, leaf: leaf_blk });
                    ExtentNode::Index(header(index.len(), ROOT_MAX, 1), index).write(&mut inode.i_block);
                    inode.i_blocks += self.sectors_per_block();
                } else {
                    return Err(Error::unsupported("growing an extent tree past depth 1 (not yet written)"));
                }
            }
            ExtentNode::Index(..) => {
                return Err(Error::unsupported("appending to an extent tree deeper than 1 (not yet written)"));
            }
        }
        inode.i_blocks += len as u64 * self.sectors_per_block();
        Ok(())
    }

    /// One past the last logical block the extent tree maps (0 when empty), found by
    /// following the rightmost path.
    pub(crate) fn extent_end(&self, ino: u32, inode: &Inode) -> Result<u64> {
        let location = format!("extent tree of inode {ino}");
        let mut node = ExtentNode::parse(&inode.i_block, None, &location)?;
        loop {
            match node {
                ExtentNode::Leaf(_, extents) => return Ok(extents.last().map(|e| e.end()).unwrap_or(0)),
                ExtentNode::Index(h, index) => {
                    let Some(last) = index.last() else { return Ok(0) };
                    self.check_block(last.leaf, &|| location.clone())?;
                    let buf = self.cache.get(last.leaf)?;
                    node = ExtentNode::parse(&buf.read(), Some(h.eh_depth - 1), &location)?;
                }
            }
        }
    }

    /// Frees every data and tree block of an extent-mapped inode and leaves it an
    /// empty root (i_blocks keeps only an xattr block, if any).
    pub(crate) fn free_all_extents(&self, tx: &mut Handle, ino: u32, inode: &mut Inode) -> Result<()> {
        if !inode.has_flag(EXT4_EXTENTS_FL) {
            return Err(Error::unsupported(format!("freeing block-mapped inode {ino}")));
        }
        let location = format!("extent tree of inode {ino}");
        let mut stack = vec![ExtentNode::parse(&inode.i_block, None, &location)?];
        let mut node_blocks = Vec::new();
        while let Some(node) = stack.pop() {
            match node {
                ExtentNode::Leaf(_, extents) => {
                    for e in extents {
                        self.free_blocks_range(tx, e.start, e.len as u64)?;
                    }
                }
                ExtentNode::Index(h, index) => {
                    for e in index {
                        self.check_block(e.leaf, &|| location.clone())?;
                        let buf = self.cache.get(e.leaf)?;
                        stack.push(ExtentNode::parse(&buf.read(), Some(h.eh_depth - 1), &location)?);
                        node_blocks.push(e.leaf);
                    }
                }
            }
        }
        for b in node_blocks {
            self.free_blocks_range(tx, b, 1)?;
        }
        inode.i_block = Self::empty_extent_root();
        inode.i_blocks = if inode.i_file_acl != 0 { self.sectors_per_block() } else { 0 };
        Ok(())
    }
}
