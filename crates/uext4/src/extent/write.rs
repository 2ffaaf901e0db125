//! Growing and freeing extent trees.
//!
//! Inserting an extent follows the path from the root to the leaf for its logical
//! block; a new range merges with the extent before or after it when it continues
//! it (up to 32,768 blocks), else goes in sorted. A full node splits in half and
//! its upper half is indexed in the parent; a full root moves its entries into a new
//! node and indexes it, adding a level (up to the kernel's limit of 5). Truncation
//! collects the extents that remain and rebuilds the tree from them.

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

    /// Maps logical blocks [lblk, lblk + len) of `inode` to physical `pblk..` (an
    /// unmapped range), merging with a neighbouring extent when it continues it, and
    /// adds the data blocks (and any new tree blocks) to i_blocks.
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
        self.extent_insert(tx, ino, inode, Extent { ee_block: lblk as u32, len, unwritten: false, start: pblk })?;
        inode.i_blocks += len as u64 * self.sectors_per_block();
        Ok(())
    }

    /// Maps [lblk, lblk + len) to `pblk..` as an unwritten (preallocated) extent:
    /// it reads as zeros until written. Never merged with neighbours.
    pub(crate) fn extent_append_unwritten(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        lblk: u64,
        pblk: u64,
        len: u32,
    ) -> Result<()> {
        if !inode.has_flag(EXT4_EXTENTS_FL) {
            return Err(Error::unsupported(format!("preallocating in block-mapped inode {ino}")));
        }
        let new = Extent { ee_block: lblk as u32, len, unwritten: true, start: pblk };
        let mut path = self.extent_path(ino, inode, new.ee_block)?;
        let leaf_level = path.len() - 1;
        self.insert_item(tx, ino, inode, &mut path, leaf_level, Item::Ext(new))?;
        inode.i_blocks += len as u64 * self.sectors_per_block();
        Ok(())
    }

    /// Unmaps logical blocks [first, end) and frees them; extents crossing an edge
    /// are cut. The tree is rebuilt from what remains.
    pub(crate) fn extent_punch(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        first: u64,
        end: u64,
    ) -> Result<()> {
        if !inode.has_flag(EXT4_EXTENTS_FL) {
            return Err(Error::unsupported(format!("punching a hole in block-mapped inode {ino}")));
        }
        let (extents, node_blocks) = self.collect_extents(ino, inode)?;
        if !extents.iter().any(|e| (e.ee_block as u64) < end && e.end() > first) {
            return Ok(());
        }
        let mut kept = Vec::with_capacity(extents.len() + 1);
        let mut freed = 0u64;
        for e in extents {
            let (from, to) = ((e.ee_block as u64).max(first), e.end().min(end));
            if from >= to {
                kept.push(e);
                continue;
            }
            let cut_at = from - e.ee_block as u64;
            self.free_blocks_range(tx, e.start + cut_at, to - from)?;
            freed += to - from;
            if cut_at > 0 {
                kept.push(Extent { len: cut_at as u32, ..e });
            }
            if to < e.end() {
                let skip = to - e.ee_block as u64;
                kept.push(Extent { ee_block: to as u32, len: e.len - skip as u32, start: e.start + skip, ..e });
            }
        }
        for &b in &node_blocks {
            self.free_blocks_range(tx, b, 1)?;
        }
        inode.i_blocks = inode.i_blocks.saturating_sub((node_blocks.len() as u64 + freed) * self.sectors_per_block());
        self.build_tree(tx, ino, inode, kept)
    }

    /// Writes zeros over `count` blocks from `pblk` (file data, straight to the device).
    fn zero_blocks(&self, pblk: u64, count: u64) -> Result<()> {
        const CHUNK_BLOCKS: u64 = 256;
        let bs = self.geo.block_size as u64;
        let zeros = vec![0u8; (CHUNK_BLOCKS.min(count) * bs) as usize];
        let mut done = 0;
        while done < count {
            let n = CHUNK_BLOCKS.min(count - done);
            self.cache.device().write_at((pblk + done) * bs, &zeros[..(n * bs) as usize])?;
            done += n;
        }
        Ok(())
    }

    /// The nodes from the root to the leaf whose range holds `lblk`.
    fn extent_path(&self, ino: u32, inode: &Inode, lblk: u32) -> Result<Vec<Node>> {
        let seed = self.inode_seed(ino, inode);
        let mut path = vec![Node::from(None, self.extent_root(ino, inode)?)];
        loop {
            let node = path.last_mut().unwrap();
            if node.depth == 0 {
                return Ok(path);
            }
            // Index nodes are never empty (ExtentNode::parse refuses them).
            let at = node.items.partition_point(|i| i.key() <= lblk).max(1) - 1;
            node.at = at;
            let Some(&Item::Idx(idx)) = node.items.get(at) else { unreachable!("index nodes hold index entries") };
            let child = self.read_extent_node(ino, seed, &idx, node.depth - 1)?;
            path.push(Node::from(Some(idx.leaf), child));
        }
    }

    fn write_node(&self, tx: &mut Handle, ino: u32, inode: &mut Inode, node: &Node) -> Result<()> {
        let ext = node.to_extent_node();
        match node.block {
            None => {
                ext.write(&mut inode.i_block);
                Ok(())
            }
            Some(b) => self.write_leaf_block(tx, ino, inode, b, &ext),
        }
    }

    /// Inserts an extent for an unmapped range, splitting nodes and growing the tree.
    fn extent_insert(&self, tx: &mut Handle, ino: u32, inode: &mut Inode, new: Extent) -> Result<()> {
        let mut path = self.extent_path(ino, inode, new.ee_block)?;
        let leaf_level = path.len() - 1;
        let leaf = &mut path[leaf_level];
        let pos = leaf.items.partition_point(|i| i.key() <= new.ee_block);
        let ext = |i: &Item| match i {
            Item::Ext(e) => *e,
            Item::Idx(_) => unreachable!("leaves hold extents"),
        };
        // Continue the extent before, or let the one after start earlier.
        if pos > 0 {
            let prev = ext(&leaf.items[pos - 1]);
            if !prev.unwritten
                && prev.end() == new.ee_block as u64
                && prev.start + prev.len as u64 == new.start
                && prev.len + new.len <= fext::EXT_INIT_MAX_LEN
            {
                leaf.items[pos - 1] = Item::Ext(Extent { len: prev.len + new.len, ..prev });
                let node = path[leaf_level].clone();
                return self.write_node(tx, ino, inode, &node);
            }
        }
        if pos < leaf.items.len() {
            let next = ext(&leaf.items[pos]);
            if !next.unwritten
                && new.end() == next.ee_block as u64
                && new.start + new.len as u64 == next.start
                && next.len + new.len <= fext::EXT_INIT_MAX_LEN
            {
                leaf.items[pos] = Item::Ext(Extent {
                    ee_block: new.ee_block,
                    start: new.start,
                    len: next.len + new.len,
                    unwritten: false,
                });
                self.fix_keys(tx, ino, inode, &mut path, leaf_level, pos)?;
                let node = path[leaf_level].clone();
                return self.write_node(tx, ino, inode, &node);
            }
        }
        self.insert_item(tx, ino, inode, &mut path, leaf_level, Item::Ext(new))
    }

    /// After entry `pos` of level `level` changed key: when it is the node's first,
    /// the parent's key for this node changes too (the kernel's correct_indexes).
    fn fix_keys(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        path: &mut [Node],
        level: usize,
        pos: usize,
    ) -> Result<()> {
        let (mut level, mut pos) = (level, pos);
        while pos == 0 && level > 0 {
            let key = path[level].items[0].key();
            let parent = &mut path[level - 1];
            let at = parent.at;
            if let Item::Idx(idx) = &mut parent.items[at] {
                idx.ei_block = key;
            }
            let node = parent.clone();
            self.write_node(tx, ino, inode, &node)?;
            level -= 1;
            pos = at;
        }
        Ok(())
    }

    /// Puts `item` into the node at `level`, splitting it (and growing the tree at
    /// the root) when full.
    fn insert_item(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        path: &mut Vec<Node>,
        level: usize,
        item: Item,
    ) -> Result<()> {
        let pos = path[level].items.partition_point(|i| i.key() <= item.key());
        path[level].items.insert(pos, item);
        self.fix_keys(tx, ino, inode, path, level, pos)?;
        if path[level].items.len() <= path[level].max as usize {
            let node = path[level].clone();
            return self.write_node(tx, ino, inode, &node);
        }
        let per_block = fext::max_entries_in_block(self.geo.block_size);
        let goal = path[level].block.unwrap_or_else(|| self.inode_goal(ino));
        let (new_block, _) = self.alloc_blocks(tx, goal, 1)?;
        inode.i_blocks += self.sectors_per_block();
        if level == 0 {
            // The root overflows: its entries move to a new node and the root indexes it.
            if path[0].depth >= fext::EXT4_MAX_EXTENT_DEPTH {
                return Err(Error::NoSpace(format!("extent tree of inode {ino} is at its maximum depth")));
            }
            let root = &path[0];
            let child =
                Node { block: Some(new_block), depth: root.depth, max: per_block, items: root.items.clone(), at: 0 };
            self.write_node(tx, ino, inode, &child)?;
            let key = child.items[0].key();
            let new_root = Node {
                block: None,
                depth: root.depth + 1,
                max: ROOT_MAX,
                items: vec![Item::Idx(ExtentIndex { ei_block: key, leaf: new_block })],
                at: 0,
            };
            return self.write_node(tx, ino, inode, &new_root);
        }
        // Split in two; the upper half goes to the new block and into the parent.
        // Random-order inserts leave half-empty nodes behind: sync packs the tree.
        self.extent_compact.lock().insert(ino);
        let half = path[level].items.len() / 2;
        let upper = path[level].items.split_off(half);
        let sibling =
            Node { block: Some(new_block), depth: path[level].depth, max: path[level].max, items: upper, at: 0 };
        let lower = path[level].clone();
        self.write_node(tx, ino, inode, &lower)?;
        self.write_node(tx, ino, inode, &sibling)?;
        let key = sibling.items[0].key();
        self.insert_item(tx, ino, inode, path, level - 1, Item::Idx(ExtentIndex { ei_block: key, leaf: new_block }))
    }

    /// Every extent of the tree in order, and the tree's own blocks.
    /// The whole tree is read and checked before the caller frees or rewrites any of
    /// it: extents in file order without overlap, and no block (node or data) named
    /// twice, which would otherwise be freed twice.
    pub(crate) fn collect_extents(&self, ino: u32, inode: &Inode) -> Result<(Vec<Extent>, Vec<u64>)> {
        let location = || format!("extent tree of inode {ino}");
        let seed = self.inode_seed(ino, inode);
        let mut extents: Vec<Extent> = Vec::new();
        let mut node_blocks = Vec::new();
        let mut stack = vec![self.extent_root(ino, inode)?];
        while let Some(node) = stack.pop() {
            match node {
                ExtentNode::Leaf(_, e) => {
                    if let (Some(last), Some(first)) = (extents.last(), e.first()) {
                        if last.end() > first.ee_block as u64 {
                            return Err(Error::corrupt(
                                format!(
                                    "extent at logical {} overlaps the one at {} in the previous leaf",
                                    first.ee_block, last.ee_block
                                ),
                                location(),
                            ));
                        }
                    }
                    extents.extend(e)
                }
                ExtentNode::Index(h, index) => {
                    for e in index.iter().rev() {
                        stack.push(self.read_extent_node(ino, seed, e, h.eh_depth - 1)?);
                        node_blocks.push(e.leaf);
                    }
                }
            }
        }
        let mut ranges: Vec<(u64, u64)> = node_blocks.iter().map(|&b| (b, 1)).collect();
        ranges.extend(extents.iter().map(|e| (e.start, e.len as u64)));
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            if w[0].0 + w[0].1 > w[1].0 {
                return Err(Error::corrupt(
                    format!("block {} is mapped twice (by the tree or its extents)", w[1].0),
                    location(),
                ));
            }
        }
        self.check_blocks_in_use(&ranges, &location)?;
        Ok((extents, node_blocks))
    }

    /// Cuts the mapping at logical block `keep`: blocks from there on are freed, and
    /// the tree is rebuilt from the extents that remain (truncate is rare enough
    /// that rebuilding beats editing in place).
    pub(crate) fn extent_truncate(&self, tx: &mut Handle, ino: u32, inode: &mut Inode, keep: u64) -> Result<()> {
        if !inode.has_flag(EXT4_EXTENTS_FL) {
            return Err(Error::unsupported(format!("truncating block-mapped inode {ino}")));
        }
        let (extents, node_blocks) = self.collect_extents(ino, inode)?;
        let mut kept = Vec::new();
        let mut freed = 0u64;
        for e in extents {
            if e.end() <= keep {
                kept.push(e);
            } else if (e.ee_block as u64) < keep {
                let stay = (keep - e.ee_block as u64) as u32;
                self.free_blocks_range(tx, e.start + stay as u64, (e.len - stay) as u64)?;
                freed += (e.len - stay) as u64;
                kept.push(Extent { len: stay, ..e });
            } else {
                self.free_blocks_range(tx, e.start, e.len as u64)?;
                freed += e.len as u64;
            }
        }
        for &b in &node_blocks {
            self.free_blocks_range(tx, b, 1)?;
        }
        let data_sectors = inode.i_blocks.saturating_sub((node_blocks.len() as u64 + freed) * self.sectors_per_block());
        inode.i_blocks = data_sectors;
        self.build_tree(tx, ino, inode, kept)
    }

    /// Rebuilds the tree with every node packed full, keeping the extents. Trees grown
    /// by inserts in random order (the kernel's delayed allocation inserts in file
    /// order instead) would otherwise have levels e2fsck calls "could be narrower".
    pub(crate) fn compact_extent_tree(&self, tx: &mut Handle, ino: u32, inode: &mut Inode) -> Result<()> {
        if !inode.has_flag(EXT4_EXTENTS_FL) {
            return Ok(());
        }
        let (extents, node_blocks) = self.collect_extents(ino, inode)?;
        for &b in &node_blocks {
            self.free_blocks_range(tx, b, 1)?;
        }
        inode.i_blocks = inode.i_blocks.saturating_sub(node_blocks.len() as u64 * self.sectors_per_block());
        self.build_tree(tx, ino, inode, extents)
    }

    /// Marks logical block `lblk` (inside an unwritten extent) as written: the extent
    /// splits around it and the written piece joins a contiguous written neighbour.
    /// Pieces of at most `zeroout` blocks (the extent_zeroout_len tunable) are not
    /// split off: they are written with zeros and become written too, as the
    /// kernel's extent_max_zeroout_kb does, trading a little I/O for fewer extents.
    /// The tree is rebuilt from the new list, a pass over the file's extents.
    pub(crate) fn extent_mark_written(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        lblk: u64,
        zeroout: u32,
    ) -> Result<()> {
        let (extents, node_blocks) = self.collect_extents(ino, inode)?;
        let mut out: Vec<Extent> = Vec::with_capacity(extents.len() + 2);
        for e in extents {
            let inside = (e.ee_block as u64) <= lblk && lblk < e.end();
            if !(inside && e.unwritten) {
                out.push(e);
                continue;
            }
            if e.len <= zeroout {
                self.zero_blocks(e.start, e.len as u64)?;
                out.push(Extent { unwritten: false, ..e });
                continue;
            }
            let before = (lblk - e.ee_block as u64) as u32;
            let after = e.len - before - 1;
            let (zero_before, zero_after) = (before <= zeroout, after <= zeroout);
            if zero_before {
                self.zero_blocks(e.start, before as u64)?;
            }
            if zero_after {
                self.zero_blocks(e.start + before as u64 + 1, after as u64)?;
            }
            if before > 0 {
                out.push(Extent { len: before, unwritten: !zero_before, ..e });
            }
            out.push(Extent { ee_block: lblk as u32, len: 1, unwritten: false, start: e.start + before as u64 });
            if after > 0 {
                out.push(Extent {
                    ee_block: lblk as u32 + 1,
                    len: after,
                    unwritten: !zero_after,
                    start: e.start + before as u64 + 1,
                });
            }
        }
        // Join contiguous neighbours of the same kind (within each kind's length limit).
        let mut merged: Vec<Extent> = Vec::with_capacity(out.len());
        for e in out {
            if let Some(last) = merged.last_mut() {
                let limit = if e.unwritten { fext::EXT_UNWRITTEN_MAX_LEN } else { fext::EXT_INIT_MAX_LEN };
                if last.unwritten == e.unwritten
                    && last.end() == e.ee_block as u64
                    && last.start + last.len as u64 == e.start
                    && last.len + e.len <= limit
                {
                    last.len += e.len;
                    continue;
                }
            }
            merged.push(e);
        }
        for &b in &node_blocks {
            self.free_blocks_range(tx, b, 1)?;
        }
        inode.i_blocks = inode.i_blocks.saturating_sub(node_blocks.len() as u64 * self.sectors_per_block());
        self.build_tree(tx, ino, inode, merged)
    }

    /// Writes a fresh tree holding `extents` (sorted, non-overlapping).
    fn build_tree(&self, tx: &mut Handle, ino: u32, inode: &mut Inode, extents: Vec<Extent>) -> Result<()> {
        let per_block = fext::max_entries_in_block(self.geo.block_size) as usize;
        let mut level: Vec<Item> = extents.into_iter().map(Item::Ext).collect();
        let mut depth = 0u16;
        while level.len() > ROOT_MAX as usize {
            let mut up = Vec::new();
            for chunk in level.chunks(per_block) {
                let (block, _) = self.alloc_blocks(tx, self.inode_goal(ino), 1)?;
                inode.i_blocks += self.sectors_per_block();
                let node = Node { block: Some(block), depth, max: per_block as u16, items: chunk.to_vec(), at: 0 };
                self.write_node(tx, ino, inode, &node)?;
                up.push(Item::Idx(ExtentIndex { ei_block: chunk[0].key(), leaf: block }));
            }
            level = up;
            depth += 1;
        }
        inode.i_block = [0; 60];
        self.write_node(tx, ino, inode, &Node { block: None, depth, max: ROOT_MAX, items: level, at: 0 })
    }

    /// Frees every data and tree block of an extent-mapped inode and leaves it an
    /// empty root (i_blocks keeps only an xattr block, if any).
    pub(crate) fn free_all_extents(&self, tx: &mut Handle, ino: u32, inode: &mut Inode) -> Result<()> {
        self.extent_truncate(tx, ino, inode, 0)?;
        inode.i_blocks = if inode.i_file_acl != 0 { self.sectors_per_block() } else { 0 };
        Ok(())
    }
}

/// An entry of a node being edited: an extent (leaf) or an index entry.
#[derive(Clone, Copy)]
enum Item {
    Ext(Extent),
    Idx(ExtentIndex),
}

impl Item {
    fn key(&self) -> u32 {
        match self {
            Item::Ext(e) => e.ee_block,
            Item::Idx(i) => i.ei_block,
        }
    }
}

/// A node on a root-to-leaf path; `block` is None for the root in i_block.
#[derive(Clone)]
struct Node {
    block: Option<u64>,
    depth: u16,
    max: u16,
    items: Vec<Item>,
    /// The index entry followed downward.
    at: usize,
}

impl Node {
    fn from(block: Option<u64>, node: ExtentNode) -> Node {
        match node {
            ExtentNode::Leaf(h, e) => {
                Node { block, depth: 0, max: h.eh_max, items: e.into_iter().map(Item::Ext).collect(), at: 0 }
            }
            ExtentNode::Index(h, i) => {
                Node { block, depth: h.eh_depth, max: h.eh_max, items: i.into_iter().map(Item::Idx).collect(), at: 0 }
            }
        }
    }

    fn to_extent_node(&self) -> ExtentNode {
        let h = header(self.items.len(), self.max, self.depth);
        if self.depth == 0 {
            ExtentNode::Leaf(
                h,
                self.items
                    .iter()
                    .map(|i| match i {
                        Item::Ext(e) => *e,
                        Item::Idx(_) => unreachable!(),
                    })
                    .collect(),
            )
        } else {
            ExtentNode::Index(
                h,
                self.items
                    .iter()
                    .map(|i| match i {
                        Item::Idx(x) => *x,
                        Item::Ext(_) => unreachable!(),
                    })
                    .collect(),
            )
        }
    }
}
