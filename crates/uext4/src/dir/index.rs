//! Changing hash-indexed (htree) directories, as the kernel's namei.c does.
//!
//! Insert: walk the index by the name's hash to a leaf and add the entry there. A
//! full leaf is split at its median hash into itself and a new block (when the
//! entries around the median share a hash, the new block's index hash gets the low
//! "continued" bit so lookups know to look on); the new block goes into the index
//! node after the one that led to the leaf. A full index node is split in two, and
//! a full root pushes all its entries down into a new node, adding a level (at most
//! 2 levels below the root, 3 with largedir). A linear directory of one block that
//! runs out of room becomes indexed first (`make_indexed`).

use crate::cache::Buffer;
use crate::error::{Error, Result};
use crate::format::dirent::{self, DirEntryIter, DIRENT_TAIL_LEN, EXT4_FT_DIR};
use crate::format::hash;
use crate::format::htree::{self, DxEntry, DxNode, DX_NODE_COUNTLIMIT_OFFSET, DX_ROOT_INFO_OFFSET};
use crate::format::inode::{Inode, EXT4_INDEX_FL};
use crate::fs::Filesystem;
use crate::journal::handle::Handle;
use std::sync::Arc;

use super::{DirEntryOwned, DX_ROOT_COUNTLIMIT_OFFSET};

/// One index node on the path from the root to a leaf.
struct Frame {
    lblk: u64,
    offset: usize,
    limit: u16,
    entries: Vec<DxEntry>,
    /// The entry followed downward.
    at: usize,
}

impl Frame {
    /// The block of the entry followed downward: at the lowest level, the leaf.
    fn leaf(&self) -> u64 {
        self.entries[self.at].block as u64
    }
}

/// What `dx_path` finds for a name.
struct DxPath {
    root_version: u8,
    hash: u32,
    levels: u8,
    frames: Vec<Frame>,
}

impl DxPath {
    /// The leaf the name belongs in. `dx_path` always starts `frames` with
    /// the root's, so there is a last frame.
    fn leaf(&self) -> u64 {
        self.frames.last().expect("an htree has a root frame").leaf()
    }
}

impl Filesystem {
    /// The hash the index files `name` under, in a directory whose dx_root
    /// names hash version `root_version` (`dx_root_version`).
    pub(crate) fn dx_hash_of(&self, root_version: u8, name: &[u8]) -> Result<u32> {
        Ok(hash::dx_hash(name, self.effective_hash_version(root_version), &self.vol.geo.hash_seed)?.major)
    }

    /// The hash version in directory `dir`'s dx_root (before the superblock's
    /// unsigned flag is applied: `effective_hash_version`).
    pub(crate) fn dx_root_version(&self, dir: u32, inode: &Inode) -> Result<u8> {
        let root = self.dir_block(dir, inode, 0)?;
        let info = htree::parse_root_info(&root.read(), &format!("htree of directory inode {dir}"))?;
        Ok(info.hash_version)
    }

    /// The path to the leaf `name` belongs in, with one read of the root: the
    /// root's hash version (before the superblock's unsigned flag), the
    /// name's hash, the index depth, and the frames from the root down. (Each
    /// insert used to read the root twice, once for its hash version.)
    fn dx_path(&self, dir: u32, inode: &Inode, name: &[u8]) -> Result<DxPath> {
        let bs = self.vol.geo.block_size;
        let csum = self.vol.geo.metadata_csum;
        let loc = |lblk: u64| format!("htree of directory inode {dir} block {lblk}");
        let root = self.dir_block(dir, inode, 0)?;
        let data = root.read();
        let info = htree::parse_root_info(&data, &loc(0))?;
        let hash = self.dx_hash_of(info.hash_version, name)?;
        let limit = htree::dx_limit(bs, DX_ROOT_COUNTLIMIT_OFFSET, csum);
        let node = htree::parse_node(&data, DX_ROOT_COUNTLIMIT_OFFSET, limit, &loc(0))?;
        drop(data);
        let pick = |e: &[DxEntry]| e.partition_point(|x| x.hash <= hash).max(1) - 1;
        let at = pick(&node.entries);
        let mut frames = vec![Frame { lblk: 0, offset: DX_ROOT_COUNTLIMIT_OFFSET, limit, entries: node.entries, at }];
        let node_limit = htree::dx_limit(bs, DX_NODE_COUNTLIMIT_OFFSET, csum);
        for _ in 0..info.indirect_levels {
            let f = frames.last().unwrap();
            let lblk = f.entries[f.at].block as u64;
            let buf = self.dir_block(dir, inode, lblk)?;
            let node = htree::parse_node(&buf.read(), DX_NODE_COUNTLIMIT_OFFSET, node_limit, &loc(lblk))?;
            let at = pick(&node.entries);
            frames.push(Frame {
                lblk,
                offset: DX_NODE_COUNTLIMIT_OFFSET,
                limit: node_limit,
                entries: node.entries,
                at,
            });
        }
        Ok(DxPath { root_version: info.hash_version, hash, levels: info.indirect_levels, frames })
    }

    /// The leaf block `name` belongs in.
    pub(crate) fn dx_leaf_for(&self, dir: u32, inode: &Inode, name: &[u8]) -> Result<u64> {
        Ok(self.dx_path(dir, inode, name)?.leaf())
    }

    /// Writes a frame's entries back to its block (creating the node header for a new block).
    fn write_frame(&self, tx: &mut Handle, dir: u32, inode: &Inode, f: &Frame, buf: &Arc<Buffer>) -> Result<()> {
        let bs = self.vol.geo.block_size;
        {
            let mut data = buf.write();
            if f.lblk != 0 {
                // An interior node hides behind one empty entry spanning the block.
                dirent::write_entry(&mut data, 0, 0, bs, 0, b"", bs);
            }
            htree::write_node(
                &mut data,
                &DxNode { countlimit_offset: f.offset, limit: f.limit, entries: f.entries.clone() },
            );
            if self.vol.geo.metadata_csum {
                htree::set_checksum(&mut data, f.offset, self.inode_seed(dir, inode))?;
            }
        }
        tx.dirty(buf);
        Ok(())
    }

    fn frame_buffer(&self, dir: u32, inode: &Inode, lblk: u64) -> Result<Arc<Buffer>> {
        self.dir_block(dir, inode, lblk)
    }

    /// Adds a name to the leaf of an indexed directory its hash leads to, if that
    /// leaf has room; false (nothing changed) when it is full. Changes no index
    /// node and not the inode, so a caller holding the structure lock for reading
    /// may call it (pdirops: the leaf's buffer lock makes the insert atomic).
    pub(crate) fn dx_add_to_leaf(
        &self,
        tx: &mut Handle,
        dir: u32,
        inode: &Inode,
        name: &[u8],
        ino: u32,
        ft: u8,
    ) -> Result<bool> {
        let leaf = self.dx_leaf_for(dir, inode, name)?;
        self.insert_in_block(tx, dir, inode, leaf, name, ino, ft)
    }

    /// Adds a name to an indexed directory; returns the directory inode as updated.
    pub(crate) fn dx_add_entry(
        &self,
        tx: &mut Handle,
        dir: u32,
        mut inode: Inode,
        name: &[u8],
        ino: u32,
        ft: u8,
    ) -> Result<Inode> {
        let path = self.dx_path(dir, &inode, name)?;
        let leaf = path.leaf();
        let DxPath { root_version, hash, levels, mut frames } = path;
        if self.insert_in_block(tx, dir, &inode, leaf, name, ino, ft)? {
            return Ok(inode);
        }
        let (new_leaf, split_hash) = self.split_leaf(tx, dir, &mut inode, leaf, root_version, hash, name, ino, ft)?;
        let new = DxEntry { hash: split_hash, block: new_leaf as u32 };
        self.dx_insert_index(tx, dir, &mut inode, &mut frames, levels, new)?;
        Ok(inode)
    }

    fn entries_of(&self, dir: u32, data: &[u8], lblk: u64) -> Result<Vec<DirEntryOwned>> {
        let bs = self.vol.geo.block_size;
        let end = if self.vol.geo.metadata_csum { bs - DIRENT_TAIL_LEN } else { bs };
        let location = format!("directory inode {dir} block {lblk}");
        let mut out = Vec::new();
        for e in DirEntryIter::new(&data[..end], bs, self.vol.geo.has_filetype, self.vol.geo.inodes_count, &location) {
            let e = e?;
            if e.inode != 0 {
                out.push(DirEntryOwned { ino: e.inode, file_type: e.file_type, name: e.name.to_vec() });
            }
        }
        Ok(out)
    }

    /// Rewrites a leaf block holding exactly `entries`, packed, with its tail
    /// (a linear directory's block is the same shape: remove_tree's sort).
    pub(crate) fn write_leaf(&self, data: &mut [u8], entries: &[&DirEntryOwned], seed: u32) {
        let bs = self.vol.geo.block_size;
        let end = if self.vol.geo.metadata_csum { bs - DIRENT_TAIL_LEN } else { bs };
        data.fill(0);
        let mut off = 0;
        for (i, e) in entries.iter().enumerate() {
            let len = if i + 1 == entries.len() { end - off } else { dirent::rec_len_for(e.name.len()) };
            dirent::write_entry(data, off, e.ino, len, e.file_type, &e.name, bs);
            off += len;
        }
        if entries.is_empty() {
            dirent::write_entry(data, 0, 0, end, 0, b"", bs);
        }
        if self.vol.geo.metadata_csum {
            dirent::set_tail(data, seed);
        }
    }

    /// Splits a full leaf at its median hash into itself and a new block, then adds
    /// the name to the half it belongs in. Returns the new block and its index hash.
    #[allow(clippy::too_many_arguments)]
    fn split_leaf(
        &self,
        tx: &mut Handle,
        dir: u32,
        inode: &mut Inode,
        leaf: u64,
        root_version: u8,
        hash: u32,
        name: &[u8],
        ino: u32,
        ft: u8,
    ) -> Result<(u64, u32)> {
        let old = self.dir_block(dir, inode, leaf)?;
        let entries = self.entries_of(dir, &old.read(), leaf)?;
        let mut hashed: Vec<(u32, &DirEntryOwned)> =
            entries.iter().map(|e| Ok((self.dx_hash_of(root_version, &e.name)?, e))).collect::<Result<_>>()?;
        hashed.sort_by_key(|(h, _)| *h);
        let split = hashed.len() / 2;
        let split_hash = hashed.get(split).map(|(h, _)| *h).unwrap_or(hash);
        let continued = split > 0 && hashed[split - 1].0 == split_hash;
        let (new_lblk, new_buf) = self.append_dir_block(tx, dir, inode)?;
        let seed = self.inode_seed(dir, inode);
        let lower: Vec<&DirEntryOwned> = hashed[..split].iter().map(|(_, e)| *e).collect();
        let upper: Vec<&DirEntryOwned> = hashed[split..].iter().map(|(_, e)| *e).collect();
        self.write_leaf(&mut old.write(), &lower, seed);
        tx.dirty(&old);
        self.write_leaf(&mut new_buf.write(), &upper, seed);
        tx.dirty(&new_buf);
        let target = if hash >= split_hash { new_lblk } else { leaf };
        if !self.insert_in_block(tx, dir, inode, target, name, ino, ft)? {
            return Err(Error::corrupt("a split directory leaf still has no room", format!("directory inode {dir}")));
        }
        Ok((new_lblk, split_hash | u32::from(continued)))
    }

    /// Inserts `new` (hash -> block) into the lowest index node, making room as needed.
    fn dx_insert_index(
        &self,
        tx: &mut Handle,
        dir: u32,
        inode: &mut Inode,
        frames: &mut Vec<Frame>,
        levels: u8,
        new: DxEntry,
    ) -> Result<()> {
        let mut levels = levels;
        let bottom = frames.len() - 1;
        self.make_room(tx, dir, inode, frames, &mut levels, bottom)?;
        let f = frames.last_mut().unwrap();
        f.entries.insert(f.at + 1, new);
        let buf = self.frame_buffer(dir, inode, f.lblk)?;
        let f = frames.last().unwrap();
        self.write_frame(tx, dir, inode, f, &buf)
    }

    /// Makes sure the node at `level` has room for one more entry: a full node splits
    /// in two (after making room in its parent, recursively), and a full root pushes
    /// its entries down into a new node, adding a level. The frames keep describing
    /// the path to the leaf; levels below a push-down shift down by one.
    fn make_room(
        &self,
        tx: &mut Handle,
        dir: u32,
        inode: &mut Inode,
        frames: &mut Vec<Frame>,
        levels: &mut u8,
        level: usize,
    ) -> Result<()> {
        if frames[level].entries.len() < frames[level].limit as usize {
            return Ok(());
        }
        let max_levels = if self.vol.geo.largedir { htree::DX_MAX_LEVELS_LARGEDIR } else { htree::DX_MAX_LEVELS };
        let node_limit =
            htree::dx_limit(self.vol.geo.block_size, DX_NODE_COUNTLIMIT_OFFSET, self.vol.geo.metadata_csum);
        if level == 0 {
            if *levels + 1 >= max_levels {
                return Err(Error::NoSpace(format!("directory inode {dir}: the hash index is full")));
            }
            // Push the root's entries into a new node; the root points at it alone.
            let (lblk, buf) = self.append_dir_block(tx, dir, inode)?;
            let root = &mut frames[0];
            let moved = Frame {
                lblk,
                offset: DX_NODE_COUNTLIMIT_OFFSET,
                limit: node_limit,
                entries: std::mem::take(&mut root.entries),
                at: root.at,
            };
            root.entries = vec![DxEntry { hash: 0, block: lblk as u32 }];
            root.at = 0;
            self.write_frame(tx, dir, inode, &moved, &buf)?;
            frames.insert(1, moved);
            *levels += 1;
            self.set_root_levels(tx, dir, inode, *levels)?;
            let root_buf = self.frame_buffer(dir, inode, 0)?;
            return self.write_frame(tx, dir, inode, &frames[0], &root_buf);
        }
        // The parent needs room for the new sibling first; a push-down above shifts us.
        let before = frames.len();
        self.make_room(tx, dir, inode, frames, levels, level - 1)?;
        let level = level + (frames.len() - before);
        if frames[level].entries.len() < frames[level].limit as usize {
            return Ok(());
        }
        let (lblk, buf) = self.append_dir_block(tx, dir, inode)?;
        let half = frames[level].entries.len() / 2;
        let upper: Vec<DxEntry> = frames[level].entries.split_off(half);
        let upper_hash = upper[0].hash;
        let old_at = frames[level].at;
        let mut sibling = Frame { lblk, offset: DX_NODE_COUNTLIMIT_OFFSET, limit: node_limit, entries: upper, at: 0 };
        let parent = &mut frames[level - 1];
        parent.entries.insert(parent.at + 1, DxEntry { hash: upper_hash, block: lblk as u32 });
        let parent_buf = self.frame_buffer(dir, inode, frames[level - 1].lblk)?;
        self.write_frame(tx, dir, inode, &frames[level - 1], &parent_buf)?;
        let lower_buf = self.frame_buffer(dir, inode, frames[level].lblk)?;
        self.write_frame(tx, dir, inode, &frames[level], &lower_buf)?;
        self.write_frame(tx, dir, inode, &sibling, &buf)?;
        if old_at >= half {
            // The path continues through the new sibling.
            sibling.at = old_at - half;
            frames[level - 1].at += 1;
            frames[level] = sibling;
        }
        Ok(())
    }

    fn set_root_levels(&self, tx: &mut Handle, dir: u32, inode: &Inode, levels: u8) -> Result<()> {
        let buf = self.dir_block(dir, inode, 0)?;
        buf.write()[DX_ROOT_INFO_OFFSET + 6] = levels;
        tx.dirty(&buf);
        Ok(())
    }

    /// Turns a one-block linear directory into an indexed one: its entries move to a
    /// new block 1 and block 0 becomes the dx_root pointing at it.
    pub(crate) fn make_indexed(&self, tx: &mut Handle, dir: u32, inode: &mut Inode) -> Result<()> {
        let bs = self.vol.geo.block_size;
        let root = self.dir_block(dir, inode, 0)?;
        let entries = self.entries_of(dir, &root.read(), 0)?;
        let parent =
            entries.iter().find(|e| e.name == b"..").map(|e| e.ino).ok_or_else(|| {
                Error::corrupt("directory block 0 has no '..' entry", format!("directory inode {dir}"))
            })?;
        let rest: Vec<&DirEntryOwned> = entries.iter().filter(|e| e.name != b"." && e.name != b"..").collect();
        let (lblk, buf) = self.append_dir_block(tx, dir, inode)?;
        debug_assert_eq!(lblk, 1);
        let seed = self.inode_seed(dir, inode);
        self.write_leaf(&mut buf.write(), &rest, seed);
        tx.dirty(&buf);
        let ft = if self.vol.geo.has_filetype { EXT4_FT_DIR } else { 0 };
        {
            let mut data = root.write();
            data.fill(0);
            dirent::write_entry(&mut data, 0, dir, 12, ft, b".", bs);
            dirent::write_entry(&mut data, 12, parent, bs - 12, ft, b"..", bs);
            let info = DX_ROOT_INFO_OFFSET;
            data[info + 4] = self.vol.geo.def_hash_version;
            data[info + 5] = 8; // info_length
        }
        inode.i_flags |= EXT4_INDEX_FL;
        let limit = htree::dx_limit(bs, DX_ROOT_COUNTLIMIT_OFFSET, self.vol.geo.metadata_csum);
        let frame = Frame {
            lblk: 0,
            offset: DX_ROOT_COUNTLIMIT_OFFSET,
            limit,
            entries: vec![DxEntry { hash: 0, block: lblk as u32 }],
            at: 0,
        };
        self.write_frame(tx, dir, inode, &frame, &root)
    }
}
