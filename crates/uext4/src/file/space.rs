//! A file's space as opposed to its bytes: fallocate (preallocate, punch a hole,
//! zero a range) and finding data and holes (lseek SEEK_DATA / SEEK_HOLE).
//!
//! Preallocated blocks are unwritten extents: allocated, counted in i_blocks, and
//! read as zeros until written. A punched range loses its blocks; a zeroed range
//! keeps them, made unwritten; the partial first and last blocks of either are
//! zeroed in place. As in the kernel, unwritten extents count as holes when
//! seeking data.
//!
//! Preallocation runs in bounded handles, each leaving the file complete; out of
//! space part-way, what was allocated stays (as unwritten extents, i_size grown
//! over it unless KEEP_SIZE) and the call reports ENOSPC.

use crate::error::{Error, Result};
use crate::extent::MapKind;
use crate::format::inode::EXT4_INLINE_DATA_FL;
use crate::fs::Filesystem;
use crate::ns::change::now;

/// fallocate(2) mode bits, as Linux numbers them.
pub const FALLOC_FL_KEEP_SIZE: u32 = 0x01;
pub const FALLOC_FL_PUNCH_HOLE: u32 = 0x02;
pub const FALLOC_FL_ZERO_RANGE: u32 = 0x10;
pub const FALLOC_FL_COLLAPSE_RANGE: u32 = 0x08;
pub const FALLOC_FL_INSERT_RANGE: u32 = 0x20;

/// Headroom for tree nodes and bitmaps on top of the data blocks themselves.
const TREE_SPACE_BLOCKS: u64 = 16;
/// Extents preallocated per transaction handle (bounds a handle's size, as the
/// kernel's fallocate bounds each of its handles).
const EXTENTS_PER_HANDLE: usize = 256;

impl Filesystem {
    /// fallocate(2) on a regular file: `mode` 0 preallocates [offset, offset + len)
    /// and grows the size to cover it; with KEEP_SIZE the size stays. PUNCH_HOLE
    /// (with KEEP_SIZE, as Linux requires) frees the range; ZERO_RANGE makes it
    /// read as zeros, keeping it allocated; COLLAPSE_RANGE and INSERT_RANGE
    /// remove or open a block-aligned range, moving the rest of the file
    /// (file/shift.rs).
    ///
    /// # Errors
    /// `Invalid` for unknown or unsupported mode combinations and for shifts the
    /// kernel refuses; `Unsupported` (EOPNOTSUPP) for preallocation or shifts on
    /// block-mapped files; `NoSpace` part-way (what was allocated stays);
    /// `FileTooLarge`; `NoDevice`/`NotSeekable` for devices and fifos; `ReadOnly`; `Corrupt`.
    pub fn fallocate(&self, ino: u32, offset: u64, len: u64, mode: u32) -> Result<()> {
        let shifts = FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_INSERT_RANGE;
        let known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE | shifts;
        if mode & !known != 0 {
            return Err(Error::unsupported(format!("fallocate mode {mode:#x}")));
        }
        if mode & shifts != 0 {
            // Alone, as vfs_fallocate demands (file/shift.rs).
            if mode != FALLOC_FL_COLLAPSE_RANGE && mode != FALLOC_FL_INSERT_RANGE {
                return Err(Error::Invalid(format!("fallocate mode {mode:#x}: a shift goes alone")));
            }
            return self.shift_range(ino, offset, len, mode == FALLOC_FL_COLLAPSE_RANGE);
        }
        let punch = mode & FALLOC_FL_PUNCH_HOLE != 0;
        let zero = mode & FALLOC_FL_ZERO_RANGE != 0;
        if punch && (zero || mode & FALLOC_FL_KEEP_SIZE == 0) {
            return Err(Error::unsupported("fallocate: PUNCH_HOLE goes with KEEP_SIZE alone"));
        }
        if len == 0 {
            return Err(Error::Invalid("fallocate of 0 bytes".into()));
        }
        let end = offset.checked_add(len).filter(|&e| e <= self.max_file_size()).ok_or_else(|| {
            Error::FileTooLarge(format!(
                "fallocate range {offset}+{len} ends past the largest file size, {}",
                self.max_file_size()
            ))
        })?;
        let _lock = self.inode_locks.write(ino as u64);
        let inode = self.inode(ino)?;
        self.require_changeable(ino, &inode)?;
        if inode.is_dir() {
            return Err(Error::IsADirectory(format!("fallocate on directory inode {ino}")));
        }
        if inode.file_type() == crate::format::inode::S_IFIFO {
            return Err(Error::NotSeekable(format!("fallocate on fifo inode {ino}")));
        }
        if !inode.is_reg() {
            return Err(Error::NoDevice(format!("fallocate on inode {ino}, which is not a regular file")));
        }
        // As vfs_fallocate: an append-only file only preallocates.
        crate::ns::inode_flags::refuse_if_immutable(ino, &inode, "fallocate")?;
        if mode & !FALLOC_FL_KEEP_SIZE != 0 {
            crate::ns::inode_flags::refuse_if_pinned(ino, &inode, "fallocate")?;
        }
        // Block maps cannot hold unwritten blocks: as the kernel's ext4_fallocate,
        // only punching works on them (inline files become block-mapped without
        // the extent feature).
        let block_mapped = !inode.has_flag(crate::format::inode::EXT4_EXTENTS_FL)
            && (!inode.has_flag(EXT4_INLINE_DATA_FL) || !self.vol.geo.has_extents);
        if block_mapped && !punch {
            return Err(Error::unsupported(format!(
                "fallocate mode {mode:#x} on block-mapped inode {ino} (only extent-mapped files preallocate)"
            )));
        }
        let bs = self.vol.geo.block_size as u64;
        let (first_block, end_block) = (offset / bs, end.div_ceil(bs));
        let to_allocate = if punch { 0 } else { self.unmapped_blocks(ino, first_block, end_block)? };
        let _space = match punch {
            true => None,
            false => Some(self.alloc.ensure_space(to_allocate + TREE_SPACE_BLOCKS)?),
        };
        let grows = !punch && mode & FALLOC_FL_KEEP_SIZE == 0 && end > inode.i_size;
        let mut tx = self.begin(32)?;
        self.uninline(&mut tx, ino)?;
        let mut inode = (*self.inode(ino)?).clone();
        if punch || zero {
            // Partial blocks at the edges keep their other bytes: zero just the range.
            let whole_first = offset.div_ceil(bs);
            let whole_end = (end / bs).max(whole_first);
            for (from, to) in [(offset, end.min(whole_first * bs)), ((whole_end * bs).max(offset), end)] {
                if from < to && from < inode.i_size {
                    if let MapKind::Mapped(p) = self.map_blocks(ino, &inode, from / bs, 1)?.kind {
                        let bytes = (to.min(inode.i_size) - from) as usize;
                        self.vol.cache.write_data_at(p * bs + from % bs, &vec![0u8; bytes])?;
                    }
                }
            }
            if whole_first < whole_end {
                if punch {
                    self.extent_punch(&mut tx, ino, &mut inode, whole_first, whole_end)?;
                } else {
                    // Zeroing keeps the blocks: they become unwritten in place.
                    self.extent_mark_unwritten(&mut tx, ino, &mut inode, whole_first, whole_end)?;
                }
            }
        }
        // Every mode moves both, even a preallocation inside the size that
        // allocates nothing (as the kernel's ext4_fallocate does).
        let t = now();
        inode.i_ctime = t;
        inode.i_mtime = t;
        self.write_inode(&mut tx, ino, &inode)?;
        tx.finish()?;
        if punch {
            return Ok(());
        }
        self.preallocate(ino, first_block, end_block, if grows { Some(end) } else { None })
    }

    /// Blocks in [first, end) with nothing mapped.
    fn unmapped_blocks(&self, ino: u32, first: u64, end: u64) -> Result<u64> {
        let inode = self.inode(ino)?;
        if inode.has_flag(EXT4_INLINE_DATA_FL) {
            return Ok(end - first);
        }
        let mut holes = 0;
        let mut lblk = first;
        while lblk < end {
            let m = self.map_blocks(ino, &inode, lblk, end - lblk)?;
            if m.kind == MapKind::Hole {
                holes += m.len;
            }
            lblk += m.len;
        }
        Ok(holes)
    }

    /// Fills every hole in [first, end) with unwritten extents, as the kernel does:
    /// in handles of a bounded number of extents, each of which leaves the file
    /// complete (its extents in the tree, its i_size grown towards `grow_to` as far
    /// as the allocation got). Running out of space part-way keeps what was
    /// allocated and reports ENOSPC; nothing is left half-inserted or unowned.
    fn preallocate(&self, ino: u32, first: u64, end: u64, grow_to: Option<u64>) -> Result<()> {
        let bs = self.vol.geo.block_size as u64;
        let mut lblk = first;
        let mut goal = self.inode_goal(ino, true);
        while lblk < end {
            let mut tx = self.begin(32)?;
            let mut inode = (*self.inode(ino)?).clone();
            let mut outcome = Ok(());
            for _ in 0..EXTENTS_PER_HANDLE {
                if lblk >= end {
                    break;
                }
                match self.preallocate_one(&mut tx, ino, &mut inode, lblk, end, &mut goal) {
                    Ok(next) => lblk = next,
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                }
            }
            // The size covers what is mapped, never a range the disk had no room for.
            if let (Some(size), true) = (grow_to, lblk > first) {
                let reached = (lblk * bs).min(size);
                if reached > inode.i_size {
                    inode.i_size = reached;
                }
            }
            self.write_inode(&mut tx, ino, &inode)?;
            tx.finish()?;
            outcome?;
        }
        Ok(())
    }

    /// Maps the run at `lblk` (up to `end`): skips it when mapped, else allocates
    /// and inserts one unwritten extent for as much of the hole as one allocation
    /// gives. Returns the next logical block to look at.
    fn preallocate_one(
        &self,
        tx: &mut crate::journal::handle::Handle,
        ino: u32,
        inode: &mut crate::format::inode::Inode,
        lblk: u64,
        end: u64,
        goal: &mut u64,
    ) -> Result<u64> {
        let m = self.map_blocks(ino, inode, lblk, end - lblk)?;
        if let MapKind::Mapped(p) | MapKind::Unwritten(p) = m.kind {
            *goal = p + m.len;
            return Ok(lblk + m.len);
        }
        // Room for the extent's own tree growth stays free: a split at every level
        // and a new root level.
        let depth = crate::format::extent::ExtentHeader::parse(&inode.i_block).eh_depth as u64;
        let tree_worst = depth + 2;
        let spare = self.alloc.allocatable_blocks().saturating_sub(self.alloc.reserved_blocks() + tree_worst);
        if spare == 0 {
            return Err(Error::NoSpace(format!("preallocating inode {ino}: the disk filled at logical block {lblk}")));
        }
        let want = m.len.min(crate::format::extent::EXT_UNWRITTEN_MAX_LEN as u64).min(spare) as u32;
        let (p, got) = self.alloc.alloc_blocks(tx, *goal, want)?;
        if let Err(e) = self.extent_append_unwritten(tx, ino, inode, lblk, p, got) {
            // The tree is as it was: the data blocks go back.
            self.alloc.free_blocks_range(tx, p, got as u64)?;
            return Err(e);
        }
        *goal = p + got as u64;
        Ok(lblk + got as u64)
    }

    /// lseek(2)'s SEEK_DATA (`data`) or SEEK_HOLE from `offset`: the offset found,
    /// or None (ENXIO) when `offset` is at or past the end, or no data follows it.
    ///
    /// # Errors
    /// `NotFound` for an inode not in use; `Corrupt` for a damaged mapping.
    pub fn seek_data_or_hole(&self, ino: u32, offset: u64, data: bool) -> Result<Option<u64>> {
        let inode = self.inode(ino)?;
        if offset >= inode.i_size {
            return Ok(None);
        }
        if inode.has_flag(EXT4_INLINE_DATA_FL) {
            return Ok(Some(if data { offset } else { inode.i_size }));
        }
        let bs = self.vol.geo.block_size as u64;
        let mut lblk = offset / bs;
        let last = inode.i_size.div_ceil(bs);
        while lblk < last {
            let m = self.map_blocks(ino, &inode, lblk, last - lblk)?;
            if m.len == 0 {
                return Err(Error::corrupt(format!("block {lblk} cannot be mapped"), format!("inode {ino}")));
            }
            let is_data = matches!(m.kind, MapKind::Mapped(_));
            if is_data == data {
                return Ok(Some((lblk * bs).max(offset)));
            }
            lblk += m.len;
        }
        // The end of the file is a hole; no data lies past it.
        Ok(if data { None } else { Some(inode.i_size) })
    }

    /// The largest file size, the kernel's s_maxbytes: 2^32 - 1 blocks (the
    /// last logical block must stay addressable by a 32-bit ee_block with room for
    /// its length), and without huge_file no more than a 32-bit i_blocks of
    /// 512-byte sectors can count.
    pub fn max_file_size(&self) -> u64 {
        let bs = self.vol.geo.block_size as u64;
        let by_extents = ((1u64 << 32) - 1) * bs;
        if self.vol.geo.huge_file {
            return by_extents;
        }
        let by_i_blocks = ((1u64 << 32) - 1) / (bs / 512) * bs;
        by_extents.min(by_i_blocks)
    }

    #[doc(hidden)]
    /// The largest size of a block-mapped (ext2/3-style) file, the kernel's
    /// s_bitmap_maxbytes: what 12 direct, one indirect, one double and one triple
    /// indirect pointer reach, less what i_blocks (48-bit with huge_file, else
    /// 32-bit, in sectors) can count once the map's own blocks are included.
    pub fn max_block_mapped_size(&self) -> u64 {
        let bs = self.vol.geo.block_size as u64;
        let per = bs / 4;
        let sectors = bs / 512;
        let i_blocks_limit = if self.vol.geo.huge_file { (1u64 << 48) - 1 } else { ((1u64 << 32) - 1) / sectors };
        let reach = 12 + per + per * per + per * per * per;
        let map_blocks = 1 + (1 + per) + (1 + per + per * per);
        let blocks = if reach + map_blocks <= i_blocks_limit {
            reach
        } else {
            // Data plus the map blocks addressing it must fit in i_blocks.
            let mut left = i_blocks_limit - 12 - per;
            let mut map = 1;
            if left < per * per {
                map += 1 + left.div_ceil(per);
            } else {
                map += 1 + per;
                left -= per * per;
                map += 1 + left.div_ceil(per) + left.div_ceil(per * per);
            }
            i_blocks_limit - map
        };
        blocks * bs
    }

    /// The largest size `inode` may have: by its extent tree or its block map.
    pub(crate) fn max_size_of(&self, inode: &crate::format::inode::Inode) -> u64 {
        if inode.has_flag(crate::format::inode::EXT4_EXTENTS_FL) || inode.has_flag(EXT4_INLINE_DATA_FL) {
            self.max_file_size()
        } else {
            self.max_block_mapped_size()
        }
    }
}
