//! Writing file data by runs: each run of mapped blocks is overwritten in place
//! with one device request, each hole gets one allocation for the whole run, and
//! each run of preallocated (unwritten) blocks is written and converted in place
//! (extent/zeroout.rs). File data reaches the device before the metadata that
//! maps it commits (ordered data): at once, or for a hole's run of at most
//! `WRITE_BEHIND_RUN_MAX` blocks (a small file's), queued to go with others
//! just before the commit (cache/write_behind.rs).
//!
//! Invariants: a write never maps a block whose bytes it has not written,
//! queued or zeroed; whatever was written stays written and mapped in the
//! inode, even when a later block of the same call fails (a short write). A run
//! written at once goes to the device before the run's metadata changes, and a
//! run whose data write fails gives back what it took (its new blocks), so a
//! failed data write is an EIO to the caller and nothing more, as on the
//! kernel's ext4, where a data I/O error never puts the filesystem in its error
//! state; a queued run that fails is the next fsync's EIO. Any other device
//! error after a change leaves the handle unfinished, which aborts the journal.

use crate::cache::WRITE_BEHIND_RUN_MAX;
use crate::error::{Error, Result};
use crate::extent::MapKind;
use crate::format::inode::{Inode, EXT4_EXTENTS_FL};
use crate::fs::Filesystem;
use crate::journal::handle::Handle;
use crate::ns::change::now;

/// Worst case for one data block: itself and a node split at every tree level.
const DATA_SPACE_BLOCKS: u64 = 8;

/// Why `write_blocks` stopped before the end of the data.
enum Stop {
    /// The device refused a run's data; the run changed nothing that stays.
    DataWrite(Error),
    /// A metadata step failed; an `Io` here may have left the step half done.
    Step(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        Stop::Step(e)
    }
}

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
        self.require_changeable(ino, &inode)?;
        if inode.is_dir() {
            return Err(Error::IsADirectory(format!("writing to directory inode {ino}")));
        }
        if !inode.is_reg() {
            return Err(Error::Invalid(format!("inode {ino} is not a regular file")));
        }
        crate::ns::inode_flags::refuse_write(ino, &inode, offset)?;
        let max = self.max_size_of(&inode);
        if offset >= max {
            return Err(Error::FileTooLarge(format!(
                "write at byte {offset} of inode {ino}: the largest file is {max} bytes"
            )));
        }
        let data = &data[..data.len().min((max - offset).min(usize::MAX as u64) as usize)];
        let mut tx = self.begin(16)?;
        let mut inode = (*self.inode(ino)?).clone();
        if self.write_inline(ino, &mut inode, offset, data)? {
            // Kept in the inode (inline/file.rs).
            let t = now();
            inode.i_mtime = t;
            inode.i_ctime = t;
            self.write_inode(&mut tx, ino, &inode)?;
            tx.finish()?;
            return Ok(data.len());
        }
        // Past the inline capacity: moved to a block in this same handle.
        self.uninline(&mut tx, ino)?;
        let mut inode = (*self.inode(ino)?).clone();
        let mut done = 0usize;
        let outcome = match self.write_blocks(&mut tx, ino, &mut inode, offset, data, &mut done) {
            Ok(()) => Ok(()),
            // The data did not reach the device and the run gave back what it took:
            // the metadata is whole, and what was written before it stands.
            Err(Stop::DataWrite(e)) => Err(e),
            Err(Stop::Step(e @ Error::Io(_))) => {
                // The device failed inside a metadata step, which may be half done.
                // The handle ends unfinished, which aborts the journal if it changed
                // anything (see journal/handle.rs).
                return Err(e);
            }
            Err(Stop::Step(e)) => Err(e),
        };
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

    /// The run loop of `write`: each pass maps the longest run of one kind at the
    /// current position (mapped, unwritten, or a hole), handles all of it with one
    /// allocation at most and one contiguous device write (three when a big run
    /// starts or ends inside a block), and moves on. `done` counts the bytes
    /// written so far, which stay written (and mapped in `inode`) whatever
    /// happens next.
    fn write_blocks(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        offset: u64,
        data: &[u8],
        done: &mut usize,
    ) -> std::result::Result<(), Stop> {
        let bs = self.vol.geo.block_size as u64;
        // Read once for the whole operation (seed 001, Zach Brown's point): a
        // change through `tune` mid-write cannot mix two lengths in one write.
        let zeroout = self.extent_zeroout_len();
        while *done < data.len() {
            let pos = offset + *done as u64;
            let lblk = pos / bs;
            let in_block = (pos % bs) as usize;
            let rest = &data[*done..];
            let want_blocks = (in_block + rest.len()).div_ceil(bs as usize) as u64;
            let run = self.map_blocks(ino, inode, lblk, want_blocks)?;
            let run_bytes = |blocks: u64| (blocks as usize * bs as usize - in_block).min(rest.len());
            match run.kind {
                MapKind::Mapped(p) => {
                    // Over blocks already mapped: to the device at once (or into
                    // the waiting copy of a block written just before).
                    let bytes = run_bytes(run.len);
                    self.vol.cache.write_data_at(p * bs + in_block as u64, &rest[..bytes]).map_err(Stop::DataWrite)?;
                    *done += bytes;
                }
                MapKind::Unwritten(p) => {
                    let _space = self.alloc.ensure_space(DATA_SPACE_BLOCKS)?;
                    // Preallocated but never written: its old bytes must not show, so
                    // what this write leaves of its first and last block becomes zeros.
                    let bytes = run_bytes(run.len);
                    let planned = self.plan_unwritten_conversion(ino, inode, lblk, run.len, zeroout)?;
                    self.write_zero_padded(p, in_block, &rest[..bytes]).map_err(Stop::DataWrite)?;
                    for &(pblk, count) in &planned.plan.zero {
                        self.zero_blocks(pblk, count).map_err(Stop::DataWrite)?;
                    }
                    self.apply_unwritten_conversion(tx, ino, inode, planned)?;
                    *done += bytes;
                }
                MapKind::Hole => {
                    // Out of space: a short write, or ENOSPC if nothing was written.
                    let _space = self.alloc.ensure_space(DATA_SPACE_BLOCKS)?;
                    let reserved = self.alloc.reserved_blocks();
                    let spare = self.alloc.allocatable_blocks().saturating_sub(reserved + DATA_SPACE_BLOCKS);
                    let want = run.len.min(spare + 1).min(u32::MAX as u64) as u32;
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
                                MapKind::Hole => self.inode_goal(ino, true),
                            },
                            None => self.inode_goal(ino, true),
                        };
                        self.alloc.alloc_blocks(tx, goal, want)?
                    };
                    let bytes = run_bytes(got as u64);
                    // Fresh blocks: the parts of the first and last this write leaves are
                    // zeros. A small run waits to go with others before the commit
                    // (cache/write_behind.rs); it cannot fail here.
                    let written = match got as u64 <= WRITE_BEHIND_RUN_MAX {
                        true => {
                            self.vol.cache.queue_data(ino, p, got as u64, in_block, &rest[..bytes]);
                            Ok(())
                        }
                        false => {
                            // What waits went to blocks taken before these, most
                            // often just below them: first, so the device sees
                            // one sweep rather than two.
                            self.vol.cache.send_data();
                            self.write_zero_padded(p, in_block, &rest[..bytes])
                        }
                    };
                    if let Err(e) = written {
                        // The new blocks go back (unmapped first where the block map
                        // took them at once); the inode is as before this run.
                        match block_mapped {
                            true => self.ind_remove(tx, ino, inode, lblk, lblk + got as u64)?,
                            false => self.alloc.free_blocks_range(tx, p, got as u64)?,
                        }
                        return Err(Stop::DataWrite(e));
                    }
                    if !block_mapped {
                        if let Err(e) = self.extent_append(tx, ino, inode, lblk, p, got) {
                            // The tree is as it was: the blocks go back.
                            self.alloc.free_blocks_range(tx, p, got as u64)?;
                            return Err(Stop::Step(e));
                        }
                    }
                    *done += bytes;
                }
            }
        }
        Ok(())
    }

    /// Writes `data` at byte `in_block` of the contiguous blocks from `pblk`,
    /// with zeros in whatever of the first and last block it does not cover: one
    /// device request, or for a run of more than `PADDED_COPY_MAX` bytes that
    /// starts or ends inside a block, three (first block, middle, last block)
    /// rather than a copy of the whole run.
    fn write_zero_padded(&self, pblk: u64, in_block: usize, data: &[u8]) -> Result<()> {
        const PADDED_COPY_MAX: usize = 4 << 20;
        let bs = self.vol.geo.block_size;
        let cache = &self.vol.cache;
        let end = in_block + data.len();
        let total = end.div_ceil(bs) * bs;
        if in_block == 0 && end == total {
            return cache.write_data_at(pblk * bs as u64, data);
        }
        if total <= PADDED_COPY_MAX {
            let mut buf = vec![0u8; total];
            buf[in_block..end].copy_from_slice(data);
            return cache.write_data_at(pblk * bs as u64, &buf);
        }
        // A big run: the middle goes from the caller's buffer, whole blocks only.
        let head = (bs - in_block) % bs;
        let tail = end % bs;
        if head > 0 {
            let mut first = vec![0u8; bs];
            first[in_block..].copy_from_slice(&data[..head]);
            cache.write_data_at(pblk * bs as u64, &first)?;
        }
        let middle = &data[head..data.len() - tail];
        let middle_block = pblk + (in_block + head) as u64 / bs as u64;
        cache.write_data_at(middle_block * bs as u64, middle)?;
        if tail > 0 {
            let mut last = vec![0u8; bs];
            last[..tail].copy_from_slice(&data[data.len() - tail..]);
            cache.write_data_at((pblk + (end / bs) as u64) * bs as u64, &last)?;
        }
        Ok(())
    }
}
