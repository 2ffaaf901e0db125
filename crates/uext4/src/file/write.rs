//! Writing file data: mapped blocks are overwritten in place, holes get new
//! blocks allocated as one run per hole, and preallocated (unwritten) blocks are
//! marked written. File data goes straight to the device, before the metadata
//! that maps it commits (ordered data).
//!
//! Invariants: a write never maps a block whose bytes it has not written or
//! zeroed; whatever was written stays written and mapped in the inode, even when
//! a later block of the same call fails (a short write); a device error after a
//! block was mapped leaves the handle unfinished, which aborts the journal.

use crate::error::{Error, Result};
use crate::extent::MapKind;
use crate::format::inode::{Inode, EXT4_EXTENTS_FL};
use crate::fs::Filesystem;
use crate::journal::handle::Handle;
use crate::ns::change::now;

/// Worst case for one data block: itself and a node split at every tree level.
const DATA_SPACE_BLOCKS: u64 = 8;

impl Filesystem {
    /// Writes `data` at `offset`: mapped blocks are overwritten in place, holes get
    /// new blocks (merged into the neighbouring extent when contiguous). As the
    /// kernel does, a write starting at or past the largest file size fails with
    /// EFBIG and one crossing it is cut short there; running out of space part-way
    /// is a short write. Whatever was written is recorded in the inode.
    ///
    /// # Errors
    /// `FileTooLarge` at or past ext4's largest file; `NoSpace` when no block is left for the first
    /// byte; `IsADirectory` for a directory; `ReadOnly` on a read-only or failed filesystem; `Corrupt`
    /// for a damaged mapping; `Io` when the device fails.
    pub fn write(&self, ino: u32, offset: u64, data: &[u8]) -> Result<usize> {
        let _lock = self.inode_locks.write(ino as u64);
        let inode = self.inode(ino)?;
        if inode.is_dir() {
            return Err(Error::IsADirectory(format!("writing to directory inode {ino}")));
        }
        if !inode.is_reg() {
            return Err(Error::Invalid(format!("inode {ino} is not a regular file")));
        }
        let max = self.max_size_of(&inode);
        if offset >= max {
            return Err(Error::FileTooLarge(format!(
                "write at byte {offset} of inode {ino}: the largest file is {max} bytes"
            )));
        }
        let data = &data[..data.len().min((max - offset).min(usize::MAX as u64) as usize)];
        let mut tx = self.begin(16)?;
        self.uninline(&mut tx, ino)?;
        let mut inode = (*self.inode(ino)?).clone();
        let mut done = 0usize;
        let outcome = self.write_blocks(&mut tx, ino, &mut inode, offset, data, &mut done);
        if let Err(e @ Error::Io(_)) = outcome {
            // The device failed between a change (blocks taken, mapped) and the data
            // it maps: that cannot be undone. The handle ends unfinished, which aborts
            // the journal if it changed anything (see journal/handle.rs).
            return Err(e);
        }
        if outcome.is_err() && done == 0 {
            // Nothing was written; the inode may still have changed (a failed step
            // leaves the tree as it was, earlier steps may not), so it is saved.
            self.write_inode(&mut tx, ino, &inode)?;
            tx.finish()?;
            return outcome.map(|_| 0);
        }
        let end = offset + done as u64;
        if end > inode.i_size {
            inode.i_size = end;
        }
        let t = now();
        inode.i_mtime = t;
        inode.i_ctime = t;
        self.write_inode(&mut tx, ino, &inode)?;
        tx.finish()?;
        Ok(done)
    }

    /// The block loop of `write`: `done` counts the bytes written so far, which
    /// stay written (and mapped in `inode`) whatever happens next.
    fn write_blocks(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        offset: u64,
        data: &[u8],
        done: &mut usize,
    ) -> Result<()> {
        let bs = self.vol.geo.block_size as u64;
        let zeroout = self.extent_zeroout_len();
        let dev = self.vol.cache.device().clone();
        while *done < data.len() {
            let pos = offset + *done as u64;
            let lblk = pos / bs;
            let in_block = (pos % bs) as usize;
            let n = (bs as usize - in_block).min(data.len() - *done);
            let pblk = match self.map_blocks(ino, inode, lblk, 1)?.kind {
                MapKind::Mapped(p) => p,
                MapKind::Unwritten(p) => {
                    let _space = self.alloc.ensure_space(DATA_SPACE_BLOCKS)?;
                    // Preallocated but never written: its old bytes must not show, so
                    // what this write leaves of the block becomes zeros.
                    if n < bs as usize {
                        dev.write_at(p * bs, &vec![0u8; bs as usize])?;
                    }
                    self.extent_mark_written(tx, ino, inode, lblk, zeroout)?;
                    p
                }
                MapKind::Hole => {
                    // Out of space: a short write, or ENOSPC if nothing was written.
                    let _space = self.alloc.ensure_space(DATA_SPACE_BLOCKS)?;
                    // The whole hole this write covers is allocated as one run.
                    let want_blocks = (in_block as u64 + (data.len() - *done) as u64).div_ceil(bs);
                    let hole = self.map_blocks(ino, inode, lblk, want_blocks)?.len;
                    let reserved = self.alloc.reserved_blocks();
                    let spare = self.alloc.allocatable_blocks().saturating_sub(reserved + DATA_SPACE_BLOCKS);
                    let want = want_blocks.min(hole).min(spare + 1).min(u32::MAX as u64) as u32;
                    let block_mapped = !inode.has_flag(EXT4_EXTENTS_FL);
                    let (p, got) = if block_mapped {
                        // Allocated and mapped at once, with the kernel's goal rules for
                        // block maps (extent/indirect.rs).
                        self.ind_alloc(tx, ino, inode, lblk, want as u64)?
                    } else {
                        // Right after the block before, so sequential writes stay contiguous.
                        let goal = match lblk.checked_sub(1) {
                            Some(prev) => match self.map_blocks(ino, inode, prev, 1)?.kind {
                                MapKind::Mapped(p) | MapKind::Unwritten(p) => p + 1,
                                MapKind::Hole => self.inode_goal(ino),
                            },
                            None => self.inode_goal(ino),
                        };
                        self.alloc.alloc_blocks(tx, goal, want)?
                    };
                    let bytes = (got as usize * bs as usize - in_block).min(data.len() - *done);
                    // Fresh blocks: zero the parts of the first and last this write leaves.
                    if in_block > 0 {
                        dev.write_at(p * bs, &vec![0u8; bs as usize])?;
                    }
                    let end_in_block = (in_block + bytes) % bs as usize;
                    if end_in_block != 0 {
                        let last = p + (in_block + bytes) as u64 / bs;
                        dev.write_at(last * bs, &vec![0u8; bs as usize])?;
                    }
                    if !block_mapped {
                        if let Err(e) = self.extent_append(tx, ino, inode, lblk, p, got) {
                            // The tree is as it was: the blocks go back.
                            self.alloc.free_blocks_range(tx, p, got as u64)?;
                            return Err(e);
                        }
                    }
                    // File data goes straight to the device, before the metadata that maps it.
                    dev.write_at(p * bs + in_block as u64, &data[*done..*done + bytes])?;
                    *done += bytes;
                    continue;
                }
            };
            // File data goes straight to the device, before the metadata that maps it.
            dev.write_at(pblk * bs + in_block as u64, &data[*done..*done + n])?;
            *done += n;
        }
        Ok(())
    }
}
