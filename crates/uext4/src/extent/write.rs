//! Growing and freeing extent trees.
//!
//! Inserting an extent follows the path from the root to the leaf for its logical
//! block; a new range merges with the extent before or after it when it continues
//! it (up to 32,768 blocks), else goes in sorted. A full node splits (in half, or
//! for an append at the right edge by moving only the new entry) and the new node
//! is indexed in the parent; a full root moves its entries into a new node and
//! indexes it, adding a level (up to the kernel's limit of 5). A node's entries
//! can also be spliced in place (`splice_items`: the conversion of unwritten
//! blocks, `zeroout.rs`, replaces an extent and its neighbours by up to two more
//! entries), splitting the node only when it overflows. Truncation and punching
//! remove their range in place too, leaf by leaf from the right, unlinking
//! leaves they empty (`remove_range`), and zero range marks its written extents
//! unwritten in place, one splice each; freeing a whole tree, collapse and
//! insert collect the extents and rebuild, reusing the old tree's blocks. Trees thinned
//! or split away from the right edge are packed at the next sync or fsync.
//!
//! Invariant: a change takes every block it needs before it writes anything, so
//! a failure (ENOSPC, maximum depth) leaves the tree as it was and never an inode
//! pointing at freed nodes; data blocks are freed only once the tree no longer
//! maps them.

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
        self.vol.geo.block_size as u64 / 512
    }

    fn write_leaf_block(&self, tx: &mut Handle, ino: u32, inode: &Inode, block: u64, node: &ExtentNode) -> Result<()> {
        self.vol.cache.classify(block, crate::dev::IoClass::ExtentNode);
        let buf = self.vol.cache.get_new(block);
        {
            let mut data = buf.write();
            node.write(&mut data);
            if self.vol.geo.metadata_csum {
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
            // Block maps: extent/indirect.rs.
            return self.ind_map_range(tx, ino, inode, lblk, pblk, len);
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
    /// are cut, in place (`remove_range`).
    pub(crate) fn extent_punch(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        first: u64,
        end: u64,
    ) -> Result<()> {
        if !inode.has_flag(EXT4_EXTENTS_FL) {
            // Block maps: extent/indirect.rs.
            return self.ind_remove(tx, ino, inode, first, end);
        }
        self.remove_range(tx, ino, inode, first, end)
    }

    /// Removes the mapping of [first, end) from the tree in place, leaf by leaf
    /// from the right as the kernel's ext4_ext_remove_space does: extents inside
    /// go, extents across an edge are cut (one across both edges splits in two,
    /// the only change that can grow a leaf, by a splice), a leaf left empty is
    /// freed and unlinked from its parent (and a parent left empty in turn), and
    /// a tree left empty becomes an empty root. Only the leaves that hold the
    /// range are read and written. The data blocks, and the nodes let go, are
    /// checked (in use, named once) and freed at the end. A tree thinned this way
    /// is packed at the next sync, as split ones are.
    fn remove_range(&self, tx: &mut Handle, ino: u32, inode: &mut Inode, first: u64, end: u64) -> Result<()> {
        let end = end.min(super::MAX_LBLK);
        let mut to_free: Vec<(u64, u64)> = Vec::new();
        let mut nodes_freed: Vec<u64> = Vec::new();
        let mut cursor = end;
        while cursor > first {
            let mut path = self.extent_path(ino, inode, (cursor - 1) as u32)?;
            let leaf = path.len() - 1;
            let leaf_start = leaf_start(&path);
            let mut kept: Vec<Item> = Vec::with_capacity(path[leaf].items.len() + 1);
            let mut changed = false;
            for item in &path[leaf].items {
                let Item::Ext(e) = *item else { unreachable!("leaves hold extents") };
                let (from, to) = ((e.ee_block as u64).max(first), e.end().min(end));
                if from >= to {
                    kept.push(*item);
                    continue;
                }
                changed = true;
                to_free.push((e.start + (from - e.ee_block as u64), to - from));
                if from > e.ee_block as u64 {
                    kept.push(Item::Ext(Extent { len: (from - e.ee_block as u64) as u32, ..e }));
                }
                if to < e.end() {
                    let skip = to - e.ee_block as u64;
                    kept.push(Item::Ext(Extent {
                        ee_block: to as u32,
                        len: e.len - skip as u32,
                        start: e.start + skip,
                        ..e
                    }));
                }
            }
            if changed {
                if kept.is_empty() && leaf > 0 {
                    self.unlink_empty_node(tx, ino, inode, &mut path, leaf, &mut nodes_freed)?;
                } else {
                    let old = path[leaf].items.len();
                    self.splice_items(tx, ino, inode, &mut path, leaf, 0, old, kept)?;
                }
            }
            // The leftmost leaf holds nothing below its key: done there.
            if leaf_start >= cursor {
                break;
            }
            cursor = leaf_start;
        }
        if to_free.is_empty() {
            return Ok(());
        }
        if ExtentHeader::parse(&inode.i_block).eh_depth > 0 {
            self.extent_compact.lock().insert(ino);
        }
        // Nothing is freed twice, and nothing that is not in use.
        let location = || format!("extent tree of inode {ino}");
        let mut ranges: Vec<(u64, u64)> = nodes_freed.iter().map(|&b| (b, 1)).collect();
        ranges.extend(to_free.iter().copied());
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            if w[0].0 + w[0].1 > w[1].0 {
                return Err(Error::corrupt(format!("block {} is mapped twice", w[1].0), location()));
            }
        }
        self.alloc.check_blocks_in_use(&ranges, &location)?;
        for &b in &nodes_freed {
            self.alloc.free_blocks_range(tx, b, 1)?;
            inode.i_blocks = inode.i_blocks.saturating_sub(self.sectors_per_block());
        }
        self.free_data_ranges(tx, inode, &to_free)
    }

    /// Takes the node at `level` of `path`, now empty, out of its parent (whose
    /// own emptiness is handled the same way, up to the root, which becomes an
    /// empty leaf). The node's block is added to `freed` for the caller to free.
    fn unlink_empty_node(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        path: &mut [Node],
        level: usize,
        freed: &mut Vec<u64>,
    ) -> Result<()> {
        let mut level = level;
        loop {
            freed.extend(path[level].block);
            let parent = level - 1;
            let at = path[parent].at;
            path[parent].items.remove(at);
            if !path[parent].items.is_empty() {
                self.fix_keys(tx, ino, inode, path, parent, at)?;
                let node = path[parent].clone();
                return self.write_node(tx, ino, inode, &node);
            }
            if parent == 0 {
                // The whole tree is gone: an empty root, depth 0, as a new inode's.
                inode.i_block = Self::empty_extent_root();
                return Ok(());
            }
            level = parent;
        }
    }

    /// Frees data blocks unmapped from `inode` and takes them off its i_blocks.
    fn free_data_ranges(&self, tx: &mut Handle, inode: &mut Inode, ranges: &[(u64, u64)]) -> Result<()> {
        for &(start, len) in ranges {
            self.alloc.free_blocks_range(tx, start, len)?;
            inode.i_blocks = inode.i_blocks.saturating_sub(len * self.sectors_per_block());
        }
        Ok(())
    }

    /// Marks the written blocks of [first, end) unwritten, so they read as zeros
    /// while staying allocated (ZERO_RANGE: no block is freed, so none needs to be
    /// found again on a full disk). Holes and unwritten extents stay as they are.
    ///
    /// In place, one extent at a time from the right: a written extent across
    /// the range is replaced by its written head, the unwritten middle and its
    /// written tail (`unwritten_pieces`), spliced into its own leaf, which splits
    /// when full. Only the leaves holding the range are read and written. A
    /// split needs a block, and ENOSPC after the first change could not be
    /// undone: a first pass changes nothing and counts the blocks the splits
    /// could need, which are promised before the second pass changes anything.
    /// When they cannot be promised, the tree is rebuilt instead (its blocks are
    /// those the caller promised).
    pub(crate) fn extent_mark_unwritten(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        first: u64,
        end: u64,
    ) -> Result<()> {
        if !inode.has_flag(EXT4_EXTENTS_FL) {
            return Err(Error::unsupported(format!("zeroing a range of block-mapped inode {ino}")));
        }
        let end = end.min(super::MAX_LBLK);
        let needed = self.mark_unwritten_pass(tx, ino, inode, first, end, false)?;
        let promise = match needed {
            0 => None,
            n => match self.alloc.ensure_space(n) {
                Ok(promise) => Some(promise),
                Err(Error::NoSpace(_)) => return self.mark_unwritten_by_rebuild(tx, ino, inode, first, end),
                Err(e) => return Err(e),
            },
        };
        self.mark_unwritten_pass(tx, ino, inode, first, end, true)?;
        drop(promise);
        Ok(())
    }

    fn mark_unwritten_by_rebuild(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        first: u64,
        end: u64,
    ) -> Result<()> {
        let (extents, node_blocks) = self.collect_extents(ino, inode)?;
        let mut out = Vec::with_capacity(extents.len() + 2);
        for e in extents {
            match unwritten_pieces(e, first, end) {
                Some(pieces) => out.extend(pieces),
                None => out.push(e),
            }
        }
        self.rebuild_tree(tx, ino, inode, out, node_blocks)
    }

    /// Walks the extents of [first, end) from the right. With `apply`, splices
    /// each written one's pieces into its leaf; without, changes nothing and
    /// returns how many tree blocks the splices could need at most: for each
    /// leaf they would overflow, a split of it and of every node above it (a
    /// full root adds a level), once per half a leaf of entries it gains.
    fn mark_unwritten_pass(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        first: u64,
        end: u64,
        apply: bool,
    ) -> Result<u64> {
        // The leaf being counted; the walk leaves a leaf for good once it
        // moves left of it.
        let mut growing: Option<LeafGrowth> = None;
        let mut needed = 0;
        let mut cursor = end;
        while cursor > first {
            let mut path = self.extent_path(ino, inode, (cursor - 1) as u32)?;
            let leaf = path.len() - 1;
            let items = &path[leaf].items;
            // The extent starting at or before cursor - 1 in this leaf.
            let Some(at) = items.partition_point(|i| (i.key() as u64) < cursor).checked_sub(1) else {
                // Nothing here starts before the cursor: go on left of this leaf.
                let leaf_start = leaf_start(&path);
                if leaf_start == 0 || leaf_start >= cursor {
                    break;
                }
                cursor = leaf_start;
                continue;
            };
            let Some(Item::Ext(e)) = items.get(at).copied() else {
                return Err(Error::corrupt("an index entry in a leaf", format!("extent tree of inode {ino}")));
            };
            if let Some(pieces) = unwritten_pieces(e, first, end) {
                if apply {
                    let pieces = pieces.into_iter().map(Item::Ext).collect();
                    self.splice_items(tx, ino, inode, &mut path, leaf, at, 1, pieces)?;
                } else {
                    let block = path[leaf].block;
                    if growing.as_ref().is_none_or(|g| g.block != block) {
                        needed += growing.map_or(0, |g| g.split_blocks());
                        growing = Some(LeafGrowth {
                            block,
                            entries: items.len(),
                            max: path[leaf].max as usize,
                            levels: path.len(),
                            gained: 0,
                        });
                    }
                    if let Some(g) = growing.as_mut() {
                        g.gained += pieces.len() - 1;
                    }
                }
            }
            cursor = e.ee_block as u64;
        }
        Ok(needed + growing.map_or(0, |g| g.split_blocks()))
    }

    /// The nodes from the root to the leaf whose range holds `lblk`.
    pub(super) fn extent_path(&self, ino: u32, inode: &Inode, lblk: u32) -> Result<Vec<Node>> {
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
    /// the root) when full. The blocks the splits need are taken first, all or
    /// none: ENOSPC (or a tree at its maximum depth) leaves the tree as it was.
    fn insert_item(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        path: &mut Vec<Node>,
        level: usize,
        item: Item,
    ) -> Result<()> {
        let at = path[level].items.partition_point(|i| i.key() <= item.key());
        self.splice_items(tx, ino, inode, path, level, at, 0, vec![item])
    }

    /// Replaces the `remove` entries from position `at` of the node at `level` with
    /// `items` (sorted, and fitting between the entries around them), in place:
    /// the node is rewritten, and split (a full root pushes down, adding a level)
    /// only when the result overflows it. The blocks the splits need are taken
    /// first, all or none: ENOSPC (or a tree at its maximum depth) leaves the tree
    /// as it was. A splice grows a node by at most two entries, so one split
    /// always makes room.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn splice_items(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        path: &mut Vec<Node>,
        level: usize,
        at: usize,
        remove: usize,
        items: Vec<Item>,
    ) -> Result<()> {
        let grown = path[level].items.len() - remove + items.len();
        debug_assert!(items.len() <= remove + 2, "a splice grows a node by at most two entries");
        // The node overflowing splits; each split adds an entry to the parent,
        // which splits in turn when full; a full root pushes down into a new node.
        let mut splits = 0;
        if grown > path[level].max as usize {
            let mut up = level;
            loop {
                splits += 1;
                if up == 0 {
                    if path[0].depth >= fext::EXT4_MAX_EXTENT_DEPTH {
                        return Err(Error::NoSpace(format!("extent tree of inode {ino} is at its maximum depth")));
                    }
                    break;
                }
                up -= 1;
                if path[up].items.len() < path[up].max as usize {
                    break;
                }
            }
        }
        // A leaf that loses entries (extents merged as holes fill, ranges
        // removed) may leave a tree that fits in fewer nodes or levels, which
        // e2fsck reports ("could be shorter", "could be narrower"): pack it at
        // the next commit, as after a split.
        if grown < path[level].items.len() && path[0].depth > 0 {
            self.extent_compact.lock().insert(ino);
        }
        let goal = path[level].block.unwrap_or_else(|| self.inode_goal(ino, inode.is_reg()));
        let mut new_blocks = self.alloc_tree_blocks(tx, goal, splits)?;
        inode.i_blocks += splits as u64 * self.sectors_per_block();
        let last = (at + items.len()).saturating_sub(1);
        path[level].items.splice(at..at + remove, items);
        self.fix_keys(tx, ino, inode, path, level, at)?;
        self.settle_node(tx, ino, inode, path, level, last, &mut new_blocks)
    }

    #[allow(clippy::too_many_arguments)]
    fn insert_item_into(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        path: &mut Vec<Node>,
        level: usize,
        item: Item,
        new_blocks: &mut Vec<u64>,
    ) -> Result<()> {
        let pos = path[level].items.partition_point(|i| i.key() <= item.key());
        path[level].items.insert(pos, item);
        self.fix_keys(tx, ino, inode, path, level, pos)?;
        self.settle_node(tx, ino, inode, path, level, pos, new_blocks)
    }

    /// Writes the node at `level` after a change whose last new entry is at `pos`,
    /// splitting it with a block from `new_blocks` when it overflows.
    #[allow(clippy::too_many_arguments)]
    fn settle_node(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        path: &mut Vec<Node>,
        level: usize,
        pos: usize,
        new_blocks: &mut Vec<u64>,
    ) -> Result<()> {
        if path[level].items.len() <= path[level].max as usize {
            let node = path[level].clone();
            return self.write_node(tx, ino, inode, &node);
        }
        let per_block = fext::max_entries_in_block(self.vol.geo.block_size);
        let new_block = new_blocks.pop().expect("the splice set aside a block per split");
        if level == 0 {
            // The root overflows: its entries move to a new node and the root indexes it.
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
        // Split in two; the upper part goes to the new block and into the parent.
        // An append at the far right of the tree (the common case: a file growing
        // in order) moves only the new entry, leaving full nodes behind as the
        // kernel's split does; other changes split in half, and the half-empty
        // nodes they leave are packed at sync.
        let len = path[level].items.len();
        let max = path[level].max as usize;
        let rightmost = path[..level].iter().all(|n| n.at + 1 == n.items.len());
        let split_at = if pos + 1 == len && rightmost {
            (len - 1).min(max)
        } else {
            self.extent_compact.lock().insert(ino);
            len / 2
        };
        let upper = path[level].items.split_off(split_at);
        let sibling =
            Node { block: Some(new_block), depth: path[level].depth, max: path[level].max, items: upper, at: 0 };
        let lower = path[level].clone();
        self.write_node(tx, ino, inode, &lower)?;
        self.write_node(tx, ino, inode, &sibling)?;
        let key = sibling.items[0].key();
        let index = Item::Idx(ExtentIndex { ei_block: key, leaf: new_block });
        self.insert_item_into(tx, ino, inode, path, level - 1, index, new_blocks)
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
        self.alloc.check_blocks_in_use(&ranges, &location)?;
        Ok((extents, node_blocks))
    }

    /// Cuts the mapping at logical block `keep`: blocks from there on are freed,
    /// in place (`remove_range`); cutting at 0 frees the whole tree.
    pub(crate) fn extent_truncate(&self, tx: &mut Handle, ino: u32, inode: &mut Inode, keep: u64) -> Result<()> {
        if !inode.has_flag(EXT4_EXTENTS_FL) {
            // Block maps: extent/indirect.rs.
            return self.ind_remove(tx, ino, inode, keep, u64::MAX);
        }
        if keep > 0 {
            return self.remove_range(tx, ino, inode, keep, super::MAX_LBLK);
        }
        // Freeing everything (an inode's release): the whole tree is read and
        // checked first (collect_extents), so a damaged one is refused before
        // any change.
        let (extents, node_blocks) = self.collect_extents(ino, inode)?;
        let mut kept = Vec::new();
        let mut to_free = Vec::new();
        for e in extents {
            if e.end() <= keep {
                kept.push(e);
            } else if (e.ee_block as u64) < keep {
                let stay = (keep - e.ee_block as u64) as u32;
                to_free.push((e.start + stay as u64, (e.len - stay) as u64));
                kept.push(Extent { len: stay, ..e });
            } else {
                to_free.push((e.start, e.len as u64));
            }
        }
        self.rebuild_tree(tx, ino, inode, kept, node_blocks)?;
        self.free_data_ranges(tx, inode, &to_free)
    }

    /// Moves every extent from logical block `from` on by `delta` blocks (down
    /// for a collapse, whose range [from + delta, from) the caller unmapped
    /// first; up for an insert, which first splits an extent across `from`).
    /// The tree is rebuilt from the moved list (a shift changes every key after
    /// `from`, so an edit in place would rewrite those nodes anyway); extents
    /// the shift makes contiguous stay apart, as the kernel leaves them when
    /// not in one leaf.
    ///
    /// # Errors
    /// `FileTooLarge` when an extent would end past 2^32 blocks; `NoSpace` when
    /// the split needs a tree block (nothing changed then); `Corrupt`.
    pub(crate) fn extent_shift(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        from: u64,
        delta: i64,
    ) -> Result<()> {
        let (extents, node_blocks) = self.collect_extents(ino, inode)?;
        let mut moved: Vec<Extent> = Vec::with_capacity(extents.len() + 1);
        for e in extents {
            let start = e.ee_block as u64;
            if e.end() <= from {
                moved.push(e);
                continue;
            }
            // An insert inside an extent splits it at `from`.
            let (head, tail) = if start < from {
                let head_len = (from - start) as u32;
                let tail =
                    Extent { ee_block: from as u32, len: e.len - head_len, start: e.start + head_len as u64, ..e };
                (Some(Extent { len: head_len, ..e }), tail)
            } else {
                (None, e)
            };
            moved.extend(head);
            let new_start = tail.ee_block as i64 + delta;
            if new_start < 0 || new_start as u64 + tail.len as u64 > super::MAX_LBLK {
                return Err(Error::FileTooLarge(format!(
                    "shifting the extent at logical {} of inode {ino} by {delta} blocks",
                    tail.ee_block
                )));
            }
            moved.push(Extent { ee_block: new_start as u32, ..tail });
        }
        self.rebuild_tree(tx, ino, inode, moved, node_blocks)
    }

    /// Rebuilds the tree with every node packed full, keeping the extents. Trees grown
    /// by inserts in random order (the kernel's delayed allocation inserts in file
    /// order instead) would otherwise have levels e2fsck calls "could be narrower".
    pub(crate) fn compact_extent_tree(&self, tx: &mut Handle, ino: u32, inode: &mut Inode) -> Result<()> {
        if !inode.has_flag(EXT4_EXTENTS_FL) {
            return Ok(());
        }
        let (extents, node_blocks) = self.collect_extents(ino, inode)?;
        self.rebuild_tree(tx, ino, inode, extents, node_blocks)
    }

    /// Replaces the tree whose node blocks are `old_nodes` with a packed one holding
    /// `extents` (sorted, non-overlapping). The old nodes are reused; any further
    /// blocks are allocated before anything is written, so a tree that cannot be
    /// built is refused with the old one intact (never an inode pointing at freed
    /// nodes). Old nodes left over are freed. i_blocks follows the node count.
    fn rebuild_tree(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        extents: Vec<Extent>,
        old_nodes: Vec<u64>,
    ) -> Result<()> {
        let per_block = fext::max_entries_in_block(self.vol.geo.block_size) as usize;
        let mut needed = 0usize;
        let mut width = extents.len();
        while width > ROOT_MAX as usize {
            width = width.div_ceil(per_block);
            needed += width;
        }
        let mut blocks = old_nodes;
        let extra = needed.saturating_sub(blocks.len());
        let goal = blocks.last().copied().unwrap_or_else(|| self.inode_goal(ino, inode.is_reg()));
        blocks.extend(self.alloc_tree_blocks(tx, goal, extra)?);
        let spare = blocks.split_off(needed);
        let spb = self.sectors_per_block();
        inode.i_blocks = inode.i_blocks.saturating_sub(spare.len() as u64 * spb) + extra as u64 * spb;
        for b in spare {
            self.alloc.free_blocks_range(tx, b, 1)?;
        }
        let mut blocks = blocks.into_iter();
        let mut level: Vec<Item> = extents.into_iter().map(Item::Ext).collect();
        let mut depth = 0u16;
        while level.len() > ROOT_MAX as usize {
            let mut up = Vec::new();
            for chunk in level.chunks(per_block) {
                let block = blocks.next().expect("one block was set aside per node");
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

    /// `count` blocks for new tree nodes, all or none: on ENOSPC those already
    /// taken are given back and nothing else has changed.
    fn alloc_tree_blocks(&self, tx: &mut Handle, goal: u64, count: usize) -> Result<Vec<u64>> {
        let mut got: Vec<u64> = Vec::with_capacity(count);
        while got.len() < count {
            let goal = got.last().map_or(goal, |&b| b + 1);
            match self.alloc.alloc_blocks(tx, goal, (count - got.len()) as u32) {
                Ok((start, len)) => got.extend(start..start + len as u64),
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

    /// Frees every data and tree block of an extent-mapped (or block-mapped) inode
    /// and leaves it an empty root or map (i_blocks keeps only an xattr block, if any).
    pub(crate) fn free_all_extents(&self, tx: &mut Handle, ino: u32, inode: &mut Inode) -> Result<()> {
        self.extent_truncate(tx, ino, inode, 0)?;
        inode.i_blocks = if inode.i_file_acl != 0 { self.sectors_per_block() } else { 0 };
        Ok(())
    }
}

/// The first logical block the leaf at the end of `path` may hold: its key in
/// its parent (0 for a root leaf). `at` of each index node is the entry
/// `extent_path` followed, so it is in range.
fn leaf_start(path: &[Node]) -> u64 {
    match path.len() {
        0 | 1 => 0,
        n => path[n - 2].items[path[n - 2].at].key() as u64,
    }
}

/// What zeroing a range adds to one leaf (`mark_unwritten_pass`).
struct LeafGrowth {
    /// None for a leaf that is the root in the inode.
    block: Option<u64>,
    entries: usize,
    max: usize,
    /// Nodes from the root down to this leaf, both counted.
    levels: usize,
    gained: usize,
}

impl LeafGrowth {
    /// The most tree blocks the leaf's splits can take: each split of the leaf
    /// may split every node above it and push the root down a level, and a
    /// split leaves each half room for half a leaf of entries.
    fn split_blocks(&self) -> u64 {
        match (self.entries + self.gained).checked_sub(self.max) {
            None | Some(0) => 0,
            Some(over) => (self.levels * (1 + (over - 1) / (self.max / 2).max(1))) as u64,
        }
    }
}

/// What a written extent `e` becomes when [first, end) is zeroed: its written
/// head, the unwritten middle (in pieces of at most 32,767 blocks, one less
/// than a written extent can hold) and its written tail; None when `e` is
/// unwritten or outside the range. At most three pieces: a middle that needs
/// two is a whole extent of 32,768 blocks, with no head or tail.
fn unwritten_pieces(e: Extent, first: u64, end: u64) -> Option<Vec<Extent>> {
    let (from, to) = ((e.ee_block as u64).max(first), e.end().min(end));
    if e.unwritten || from >= to {
        return None;
    }
    let at = |lblk: u64| e.start + (lblk - e.ee_block as u64);
    let mut pieces = Vec::with_capacity(3);
    if from > e.ee_block as u64 {
        pieces.push(Extent { len: (from - e.ee_block as u64) as u32, ..e });
    }
    let mut lblk = from;
    while lblk < to {
        let len = (to - lblk).min(fext::EXT_UNWRITTEN_MAX_LEN as u64);
        pieces.push(Extent { ee_block: lblk as u32, len: len as u32, unwritten: true, start: at(lblk) });
        lblk += len;
    }
    if to < e.end() {
        pieces.push(Extent { ee_block: to as u32, len: (e.end() - to) as u32, unwritten: false, start: at(to) });
    }
    Some(pieces)
}

/// An entry of a node being edited: an extent (leaf) or an index entry.
#[derive(Clone, Copy)]
pub(super) enum Item {
    Ext(Extent),
    Idx(ExtentIndex),
}

impl Item {
    pub(super) fn key(&self) -> u32 {
        match self {
            Item::Ext(e) => e.ee_block,
            Item::Idx(i) => i.ei_block,
        }
    }
}

/// A node on a root-to-leaf path; `block` is None for the root in i_block.
#[derive(Clone)]
pub(super) struct Node {
    pub(super) block: Option<u64>,
    pub(super) depth: u16,
    pub(super) max: u16,
    pub(super) items: Vec<Item>,
    /// The index entry followed downward.
    pub(super) at: usize,
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
