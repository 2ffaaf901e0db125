//! Directories: linear blocks, htree (hashed index) lookup, and inline directories.
//!
//! Listing reads every block in logical order (an indexed directory's names are
//! then put in hash order, as the kernel lists them); htree interior blocks hide from a
//! linear reader behind fake entries, so one loop serves both kinds, but checksums
//! differ: a block is verified as an index node when it is one (block 0 of an
//! indexed directory, or a block whose first entry is empty and spans the block),
//! else by its dirent tail. Lookup in an indexed directory walks the index by the
//! name's hash, continuing into the next leaf while its hash says the collision
//! chain goes on, as the kernel's `ext4_htree_next_block` does.
//!
//! Readers and writers of one directory meet on its structure lock
//! (`Filesystem::dir_structure`): `lookup` and `read_dir` hold it for reading
//! while they walk; a change of the directory's blocks (an entry added or
//! removed, a leaf or index split, a linear or inline directory turned into
//! another kind, the directory grown) holds it for writing from its first block
//! change until the directory inode that maps the new blocks is written. So a
//! reader never follows an index to a leaf that is not there yet, nor misses a
//! name that a split is moving. Inside the dir layer nothing takes it: the
//! namespace operations take it around their whole change (ns/change.rs).

use crate::alloc::InodeRequest;
use crate::dev::IoClass;
use crate::error::{Error, Result};
use crate::extent::MapKind;
use crate::format::bytes::{le16, le32};
use crate::format::dirent::{self, DirEntryIter, EXT4_FT_DIR};
use crate::format::hash;
use crate::format::htree::{self, DxEntry, DX_NODE_COUNTLIMIT_OFFSET, DX_ROOT_INFO_OFFSET};
use crate::format::inode::{Inode, EXT4_INDEX_FL, EXT4_INLINE_DATA_FL};
use crate::fs::Filesystem;
use std::sync::Arc;

pub mod entries;
pub mod index;

/// One name in a directory, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntryOwned {
    /// The inode the name points at.
    pub ino: u32,
    /// The entry's type byte (EXT4_FT_*: 1 file, 2 directory, 7 symlink...; 0 without `filetype`).
    pub file_type: u8,
    /// The name, as bytes.
    pub name: Vec<u8>,
}

/// Offset of the dx_root's count/limit: after the fake "." and ".." and the root info.
pub(crate) const DX_ROOT_COUNTLIMIT_OFFSET: usize = DX_ROOT_INFO_OFFSET + 8;

impl Filesystem {
    pub(crate) fn require_dir(&self, ino: u32) -> Result<Arc<Inode>> {
        let inode = self.inode(ino)?;
        if !inode.is_dir() {
            return Err(Error::NotADirectory(format!("inode {ino}")));
        }
        Ok(inode)
    }

    pub(crate) fn is_indexed(&self, inode: &Inode) -> bool {
        self.vol.geo.has_dir_index && inode.has_flag(EXT4_INDEX_FL) && !inode.has_flag(EXT4_INLINE_DATA_FL)
    }

    /// Number of directory blocks; a directory's size is a whole number of blocks.
    pub(crate) fn dir_blocks(&self, ino: u32, inode: &Inode) -> Result<u64> {
        let bs = self.vol.geo.block_size as u64;
        if !inode.i_size.is_multiple_of(bs) {
            return Err(Error::corrupt(
                format!("directory size {} is not a multiple of the block size", inode.i_size),
                format!("directory inode {ino}"),
            ));
        }
        // Directories have no holes and no shared blocks, so a directory larger
        // than the filesystem is damage; refusing it bounds every directory scan.
        let blocks = inode.i_size / bs;
        if blocks > self.vol.geo.blocks_count {
            return Err(Error::corrupt(
                format!(
                    "directory size {} exceeds the filesystem ({} blocks)",
                    inode.i_size, self.vol.geo.blocks_count
                ),
                format!("directory inode {ino}"),
            ));
        }
        Ok(blocks)
    }

    /// Blocks a whole-directory scan reads ahead in one request.
    pub(crate) const DIR_READ_AHEAD_BLOCKS: u64 = 32;

    /// Brings blocks `lblk..lblk + count` of directory `ino` into the cache, as
    /// far as they lie contiguously on disk from `lblk`, in one request. For
    /// scans that read every block in order (remove_tree's passes and sort): one block
    /// at a time, each read is a seek away from whatever came between. Best
    /// effort: a mapping or device error is left for `dir_block` to report.
    pub(crate) fn read_ahead_dir(&self, ino: u32, inode: &Inode, lblk: u64, count: u64) {
        if count == 0 || inode.has_flag(EXT4_INLINE_DATA_FL) {
            return;
        }
        let Ok(run) = self.map_blocks(ino, inode, lblk, count) else {
            return;
        };
        if let MapKind::Mapped(pblk) = run.kind {
            (pblk..pblk + run.len).for_each(|b| self.vol.cache.classify(b, IoClass::Directory));
            let _ = self.vol.cache.read_ahead(pblk, run.len as usize);
        }
    }

    /// Reads logical block `lblk` of directory `ino` through the cache, verifying
    /// it once as an index node or a leaf.
    pub(crate) fn dir_block(&self, ino: u32, inode: &Inode, lblk: u64) -> Result<Arc<crate::cache::Buffer>> {
        let m = self.map_blocks(ino, inode, lblk, 1)?;
        let pblk = match m.kind {
            MapKind::Mapped(p) => p,
            MapKind::Hole | MapKind::Unwritten(_) => {
                return Err(Error::corrupt(
                    format!("directory has a hole at block {lblk}"),
                    format!("directory inode {ino}"),
                ));
            }
        };
        let verify = self.vol.geo.metadata_csum && self.vol.geo.verify_checksums;
        let indexed = self.is_indexed(inode);
        let seed = self.inode_seed(ino, inode);
        let bs = self.vol.geo.block_size;
        self.vol.cache.get_verified_as(pblk, IoClass::Directory, |b| {
            if !verify {
                return Ok(());
            }
            let location = format!("directory inode {ino} block {lblk} (physical {pblk})");
            let first_rec_len = dirent::rec_len_from_disk(le16(b, 4), bs);
            if indexed && lblk == 0 {
                htree::verify_checksum(b, DX_ROOT_COUNTLIMIT_OFFSET, seed, &location)
            } else if indexed && le32(b, 0) == 0 && first_rec_len == bs {
                htree::verify_checksum(b, DX_NODE_COUNTLIMIT_OFFSET, seed, &location)
            } else {
                dirent::verify_block_checksum(b, seed, &location)
            }
        })
    }

    /// What reaching a directory with no links means. Any other directory with no
    /// links was removed while someone still held it (its blocks may be freed
    /// already): ENOENT, as the kernel's IS_DEADDIR checks answer. The root is
    /// never removed, so a root without links is a damaged image.
    pub(crate) fn removed_dir_error(ino: u32) -> Error {
        if ino == crate::ns::ROOT_INO {
            return Error::corrupt("root directory has links count 0", format!("inode {ino}"));
        }
        Error::NotFound(format!("directory inode {ino} has been removed"))
    }

    /// The kernel's ext4_empty_dir on a listing: a directory is empty when it holds
    /// exactly two entries, "." (itself) and "..", found by name (a one-block
    /// listing is in hash order). Anything else — a second "." or "..", other
    /// names, a missing "." — counts as not empty.
    pub(crate) fn only_dot_entries(ino: u32, entries: &[DirEntryOwned]) -> bool {
        entries.len() == 2
            && entries.iter().any(|e| e.name == b"." && e.ino == ino)
            && entries.iter().any(|e| e.name == b"..")
    }

    /// Every entry of the directory, "." and ".." included, in the kernel's
    /// readdir order: hash order after "." and ".." for an indexed directory
    /// (see `in_hash_order`); hash order, dots included, for a one-block or
    /// inline directory on a filesystem with dir_index (`in_block_hash_order`);
    /// on-disk order otherwise.
    ///
    /// # Errors
    /// `NotADirectory` when `ino` is not a directory; `Corrupt` for a damaged directory block.
    pub fn read_dir(&self, ino: u32) -> Result<Vec<DirEntryOwned>> {
        let _structure = self.dir_structure.read(ino as u64);
        self.read_dir_locked(ino)
    }

    /// `read_dir` for a caller that holds the directory's structure lock.
    pub(crate) fn read_dir_locked(&self, ino: u32) -> Result<Vec<DirEntryOwned>> {
        let inode = self.require_dir(ino)?;
        if inode.i_links_count == 0 {
            return Err(Self::removed_dir_error(ino));
        }
        if inode.has_flag(EXT4_INLINE_DATA_FL) {
            return Ok(self.in_block_hash_order(&inode, self.read_inline_dir(ino, &inode)?));
        }
        let mut out = Vec::new();
        let mut in_root = 0;
        for lblk in 0..self.dir_blocks(ino, &inode)? {
            let buf = self.dir_block(ino, &inode, lblk)?;
            let data = buf.read();
            self.parse_dir_block(ino, lblk, &data, &mut out)?;
            if lblk == 0 {
                in_root = out.len();
            }
        }
        if self.is_indexed(&inode) {
            out = self.in_hash_order(ino, &inode, out, in_root.min(2));
        } else if inode.i_size == self.vol.geo.block_size as u64 {
            out = self.in_block_hash_order(&inode, out);
        }
        Ok(out)
    }

    /// A directory of one block, or an inline one, on a filesystem with
    /// dir_index, listed as the kernel's `ext4_htree_fill_tree` lists it (its
    /// `is_dx_dir` counts these as indexed): every entry, "." and ".."
    /// included, by the (major, minor) hash of its name under the superblock's
    /// default hash; equal hashes keep their on-disk order. A casefolded
    /// directory, whose names the kernel hashes folded, or a hash this library
    /// does not implement keeps on-disk order.
    fn in_block_hash_order(&self, inode: &Inode, out: Vec<DirEntryOwned>) -> Vec<DirEntryOwned> {
        if !self.vol.geo.has_dir_index || inode.has_flag(crate::format::inode::EXT4_CASEFOLD_FL) {
            return out;
        }
        let version = self.effective_hash_version(self.vol.geo.def_hash_version);
        let keys: Result<Vec<(u32, u32)>> = out
            .iter()
            .map(|e| hash::dx_hash(&e.name, version, &self.vol.geo.hash_seed).map(|h| (h.major, h.minor)))
            .collect();
        let Ok(keys) = keys else { return out };
        let mut keyed: Vec<_> = keys.into_iter().zip(out).collect();
        keyed.sort_by_key(|(h, _)| *h);
        keyed.into_iter().map(|(_, e)| e).collect()
    }

    /// An indexed directory's listing in the kernel's readdir order
    /// (`ext4_dx_readdir`): the root block's entries ("." and "..", the first
    /// `dots` of `out`) first, as the kernel takes them from the root's fixed
    /// slots, then every name by its (major, minor) hash; equal hashes keep
    /// their on-disk order. (One-block and inline directories: see
    /// `in_block_hash_order`.)
    ///
    /// Why not on-disk order: a leaf split moves half a leaf to a block at the
    /// directory's end, so block order is unrelated to both hash and inode
    /// order, whereas hash order is what every program walking the kernel's
    /// mount sees (rm -rf, find, backups), and what `hash_goal` lines inode
    /// numbers up with. The listing is read in block order all the same: the
    /// device sees one sequential pass instead of the kernel's leaf-by-leaf
    /// walk of the index.
    ///
    /// Where the root's hash cannot be computed (a damaged root, a hash this
    /// library does not implement) the listing stays in on-disk order, as the
    /// kernel's readdir falls back to a linear walk of a bad index on a
    /// filesystem without metadata_csum; lookups through the index still
    /// report the damage.
    fn in_hash_order(&self, ino: u32, inode: &Inode, mut out: Vec<DirEntryOwned>, dots: usize) -> Vec<DirEntryOwned> {
        let Ok(root_version) = self.dx_root_version(ino, inode) else { return out };
        let version = self.effective_hash_version(root_version);
        let keys: Result<Vec<(u32, u32)>> = out[dots..]
            .iter()
            .map(|e| hash::dx_hash(&e.name, version, &self.vol.geo.hash_seed).map(|h| (h.major, h.minor)))
            .collect();
        let Ok(keys) = keys else { return out };
        let mut keyed: Vec<_> = keys.into_iter().zip(out.drain(dots..)).collect();
        keyed.sort_by_key(|(h, _)| *h);
        out.extend(keyed.into_iter().map(|(_, e)| e));
        out
    }

    pub(crate) fn parse_dir_block(&self, ino: u32, lblk: u64, data: &[u8], out: &mut Vec<DirEntryOwned>) -> Result<()> {
        let location = format!("directory inode {ino} block {lblk}");
        for e in DirEntryIter::new(
            data,
            self.vol.geo.block_size,
            self.vol.geo.has_filetype,
            self.vol.geo.inodes_count,
            &location,
        ) {
            let e = e?;
            if e.inode != 0 && !e.is_tail() {
                out.push(DirEntryOwned { ino: e.inode, file_type: e.file_type, name: e.name.to_vec() });
            }
        }
        Ok(())
    }

    pub(crate) fn read_inline_dir(&self, ino: u32, inode: &Inode) -> Result<Vec<DirEntryOwned>> {
        let data = self.inline_dir_bytes(ino, inode)?;
        let parent = le32(&data, 0);
        let mut out = vec![
            DirEntryOwned { ino, file_type: EXT4_FT_DIR, name: b".".to_vec() },
            DirEntryOwned { ino: parent, file_type: EXT4_FT_DIR, name: b"..".to_vec() },
        ];
        let size = (inode.i_size as usize).min(data.len());
        if size < 4 {
            return Err(Error::corrupt("inline directory smaller than its parent pointer", format!("inode {ino}")));
        }
        // i_block after the parent pointer, and the xattr value, are separate runs of entries.
        let regions: [(&[u8], &str); 2] =
            [(&data[4..60.min(size)], "i_block"), (&data[60.min(size)..size], "system.data")];
        for (region, what) in regions {
            let location = format!("inline directory inode {ino} ({what})");
            for e in
                DirEntryIter::new(region, region.len(), self.vol.geo.has_filetype, self.vol.geo.inodes_count, &location)
            {
                let e = e?;
                if e.inode != 0 {
                    out.push(DirEntryOwned { ino: e.inode, file_type: e.file_type, name: e.name.to_vec() });
                }
            }
        }
        Ok(out)
    }

    /// What the inode allocator's placement policy asks to know of a new `name`
    /// in `dir` (`InodeRequest`): the inode numbers in the block the name will
    /// most likely go into (its htree leaf; a linear directory's last block) and,
    /// in an indexed directory, the name's hash and the (hash, inode) of that
    /// leaf's entries. Reads blocks only for what the policy asks. `inode` is
    /// `dir`'s, as the caller last read it.
    pub(crate) fn inode_request(&self, dir: u32, inode: &Inode, name: &[u8], is_dir: bool) -> Result<InodeRequest> {
        let mut req = InodeRequest::new(dir, is_dir);
        let indexed = self.is_indexed(inode);
        let (want_neighbours, want_hash) =
            (self.alloc.wants_neighbours(dir, indexed, is_dir), self.alloc.wants_name_hash(indexed));
        if !(want_neighbours || want_hash) || inode.has_flag(EXT4_INLINE_DATA_FL) {
            return Ok(req);
        }
        let _structure = self.dir_structure.read(dir as u64);
        req.parent_blocks = self.dir_blocks(dir, inode)?;
        if req.parent_blocks == 0 {
            return Ok(req);
        }
        // One read of the htree root for every hash this request needs.
        let version = match want_hash && indexed {
            true => Some(self.dx_root_version(dir, inode)?),
            false => None,
        };
        if let Some(v) = version {
            req.name_hash = Some(self.dx_hash_of(v, name)?);
        }
        if !want_neighbours {
            return Ok(req);
        }
        let lblk = match indexed {
            true => self.dx_leaf_for(dir, inode, name)?,
            false => req.parent_blocks - 1,
        };
        let mut entries = Vec::new();
        {
            let buf = self.dir_block(dir, inode, lblk)?;
            let data = buf.read();
            self.parse_dir_block(dir, lblk, &data, &mut entries)?;
        }
        entries.retain(|e| e.name != b"." && e.name != b"..");
        req.neighbours = entries.iter().map(|e| e.ino).collect();
        if let Some(v) = version {
            for e in &entries {
                req.leaf.push((self.dx_hash_of(v, &e.name)?, e.ino));
            }
        }
        Ok(req)
    }

    /// Finds `name` in directory `dir`; Ok(None) if absent. An entry naming a
    /// reserved inode, or an inode without links, is corrupt, as the kernel's ext4_lookup has it ("deleted
    /// inode referenced"): serving it would let its blocks be used twice, and its
    /// last close free it again.
    ///
    /// # Errors
    /// `NotADirectory` when `dir` is not a directory; `Corrupt` for a damaged directory or an entry
    /// naming a deleted or reserved inode.
    pub fn lookup(&self, dir: u32, name: &[u8]) -> Result<Option<u32>> {
        // Under pdirops a change holds its names' slots from its lookup to its
        // last block change: waiting on the slot (shared) shows a rename whole.
        let _slot = self.pdirops.then(|| self.name_locks.read(crate::ns::pdirops::slot_key(dir, name)));
        self.lookup_held(dir, name)
    }

    /// `lookup` for a caller that holds the name's slot (a change of names), or
    /// needs none.
    pub(crate) fn lookup_held(&self, dir: u32, name: &[u8]) -> Result<Option<u32>> {
        self.lookup_held_near(dir, name, None)
    }

    /// `lookup_held`, looking first in block `hint` of a linear directory (where
    /// a caller saw the name): remove_tree's sorted directories are thousands
    /// of blocks long, and a scan from block 0 for every name would be
    /// quadratic. The answer is the same with any hint.
    pub(crate) fn lookup_held_near(&self, dir: u32, name: &[u8], hint: Option<u64>) -> Result<Option<u32>> {
        Ok(self.lookup_held_at(dir, name, hint)?.map(|(ino, _)| ino))
    }

    /// `lookup_held_near`, also saying which block the name was found in (none
    /// for an inline directory), for a removal to look there first
    /// (`remove_entry_near`).
    pub(crate) fn lookup_held_at(
        &self,
        dir: u32,
        name: &[u8],
        hint: Option<u64>,
    ) -> Result<Option<(u32, Option<u64>)>> {
        // The inode is judged under the structure lock too: an unlink or rmdir
        // holds it (for writing in a linear directory, where a lookup takes no
        // name slot) from removing the entry until the inode's link count is
        // written, so a name seen here still names a linked inode. Judged after
        // the lock, a removal in between showed a live name's inode as deleted
        // (remove_tree's racing lookups met it).
        let _structure = self.dir_structure.read(dir as u64);
        let found = self.lookup_entry(dir, name, hint)?;
        if let Some((ino, _)) = found {
            // Reserved inodes are never named (the kernel's __ext4_iget refuses them).
            let first_ino = self.vol.geo.first_ino;
            if ino < first_ino && ino != crate::ns::ROOT_INO {
                return Err(Error::corrupt(
                    format!(
                        "entry '{}' names reserved inode {ino} (below the first inode {first_ino})",
                        String::from_utf8_lossy(name)
                    ),
                    format!("directory inode {dir}"),
                ));
            }
            if self.inode(ino)?.i_links_count == 0 {
                return Err(Error::corrupt(
                    format!("entry '{}' names deleted inode {ino} (links count 0)", String::from_utf8_lossy(name)),
                    format!("directory inode {dir}"),
                ));
            }
        }
        Ok(found)
    }

    /// The inode `name` names, and the block it is in (none in an inline directory).
    fn lookup_entry(&self, dir: u32, name: &[u8], hint: Option<u64>) -> Result<Option<(u32, Option<u64>)>> {
        let inode = self.require_dir(dir)?;
        if inode.i_links_count == 0 {
            if dir == crate::ns::ROOT_INO {
                return Err(Self::removed_dir_error(dir));
            }
            // A removed directory holds no names (and its blocks may be freed).
            return Ok(None);
        }
        // As the kernel's ext4_lookup: no such name can exist, and saying so differs
        // from "not found".
        if name.len() > crate::format::dirent::EXT4_NAME_LEN {
            return Err(Error::NameTooLong(format!("name of {} bytes is longer than 255", name.len())));
        }
        if inode.has_flag(EXT4_INLINE_DATA_FL) {
            return Ok(self.read_inline_dir(dir, &inode)?.into_iter().find(|e| e.name == name).map(|e| (e.ino, None)));
        }
        // "." and ".." are never in the index: they are block 0's first two entries.
        if name == b"." || name == b".." {
            return Ok(self.search_block(dir, &inode, 0, name)?.map(|ino| (ino, Some(0))));
        }
        if self.is_indexed(&inode) {
            return Ok(self.htree_lookup(dir, &inode, name)?.map(|(ino, leaf)| (ino, Some(leaf))));
        }
        for lblk in Self::linear_order(self.dir_blocks(dir, &inode)?, hint) {
            if let Some(ino) = self.search_block(dir, &inode, lblk, name)? {
                return Ok(Some((ino, Some(lblk))));
            }
        }
        Ok(None)
    }

    /// The blocks of a linear directory of `blocks` blocks in the order a
    /// search visits them: `hint` first (when it is one of them), then the rest
    /// in order.
    pub(crate) fn linear_order(blocks: u64, hint: Option<u64>) -> impl Iterator<Item = u64> {
        let hint = hint.filter(|&h| h < blocks);
        hint.into_iter().chain((0..blocks).filter(move |&b| Some(b) != hint))
    }

    fn search_block(&self, dir: u32, inode: &Inode, lblk: u64, name: &[u8]) -> Result<Option<u32>> {
        let buf = self.dir_block(dir, inode, lblk)?;
        let data = buf.read();
        let location = format!("directory inode {dir} block {lblk}");
        for e in DirEntryIter::new(
            &data,
            self.vol.geo.block_size,
            self.vol.geo.has_filetype,
            self.vol.geo.inodes_count,
            &location,
        ) {
            let e = e?;
            if e.inode != 0 && e.name == name {
                return Ok(Some(e.inode));
            }
        }
        Ok(None)
    }

    /// The hash version a directory uses: its root's, made unsigned by the superblock flag.
    pub(crate) fn effective_hash_version(&self, root_version: u8) -> u8 {
        let flags = if self.vol.geo.unsigned_hash { crate::format::superblock::EXT2_FLAGS_UNSIGNED_HASH } else { 0 };
        hash::effective_hash_version(root_version, flags)
    }

    /// Finds `name` through the index; returns its inode and the leaf block holding it.
    pub(crate) fn htree_lookup(&self, dir: u32, inode: &Inode, name: &[u8]) -> Result<Option<(u32, u64)>> {
        let nblocks = self.dir_blocks(dir, inode)?;
        let loc = |lblk: u64| format!("htree of directory inode {dir} block {lblk}");
        let csum = self.vol.geo.metadata_csum;
        let bs = self.vol.geo.block_size;
        let root = self.dir_block(dir, inode, 0)?;
        let (info, root_node) = {
            let data = root.read();
            let info = htree::parse_root_info(&data, &loc(0))?;
            let countlimit = DX_ROOT_INFO_OFFSET + info.info_length as usize;
            let node = htree::parse_node(&data, countlimit, htree::dx_limit(bs, countlimit, csum), &loc(0))?;
            (info, node)
        };
        let max_levels = if self.vol.geo.largedir { htree::DX_MAX_LEVELS_LARGEDIR } else { htree::DX_MAX_LEVELS };
        if info.indirect_levels >= max_levels {
            return Err(Error::corrupt(format!("htree has {} indirect levels", info.indirect_levels), loc(0)));
        }
        let target =
            hash::dx_hash(name, self.effective_hash_version(info.hash_version), &self.vol.geo.hash_seed)?.major;

        // path[i] = (entries of the node at level i, index chosen in it)
        let mut path: Vec<(Vec<DxEntry>, usize)> = Vec::new();
        let mut entries = root_node.entries;
        let descend = |entries: &[DxEntry]| entries.partition_point(|e| e.hash <= target).max(1) - 1;
        let read_node = |lblk: u32| -> Result<Vec<DxEntry>> {
            if lblk as u64 >= nblocks || lblk == 0 {
                return Err(Error::corrupt(format!("htree points at block {lblk} of {nblocks}"), loc(lblk as u64)));
            }
            let buf = self.dir_block(dir, inode, lblk as u64)?;
            let data = buf.read();
            let limit = htree::dx_limit(bs, DX_NODE_COUNTLIMIT_OFFSET, csum);
            Ok(htree::parse_node(&data, DX_NODE_COUNTLIMIT_OFFSET, limit, &loc(lblk as u64))?.entries)
        };
        for _ in 0..info.indirect_levels {
            let at = descend(&entries);
            let child = entries[at].block;
            path.push((entries, at));
            entries = read_node(child)?;
        }
        let at = descend(&entries);
        path.push((entries, at));

        // Search the leaf; on a miss, continue while the next leaf's hash continues ours.
        let mut visited = 0u64;
        loop {
            let (entries, at) = path.last().unwrap();
            let leaf = entries[*at].block as u64;
            if leaf >= nblocks {
                return Err(Error::corrupt(format!("htree points at leaf {leaf} of {nblocks}"), loc(leaf)));
            }
            if let Some(ino) = self.search_block(dir, inode, leaf, name)? {
                return Ok(Some((ino, leaf)));
            }
            visited += 1;
            if visited > nblocks {
                return Err(Error::corrupt("htree collision chain does not end", loc(leaf)));
            }
            // Step to the next entry at the lowest level that has one.
            let mut level = path.len();
            loop {
                if level == 0 {
                    return Ok(None);
                }
                level -= 1;
                let (entries, at) = &mut path[level];
                if *at + 1 < entries.len() {
                    *at += 1;
                    break;
                }
            }
            let (entries, at) = &path[level];
            let next_hash = entries[*at].hash;
            if next_hash & !1 != target {
                return Ok(None);
            }
            // Re-descend along first entries to the leaf level.
            let mut child = entries[*at].block;
            path.truncate(level + 1);
            while path.len() < info.indirect_levels as usize + 1 {
                let e = read_node(child)?;
                child = e[0].block;
                path.push((e, 0));
            }
        }
    }
}
