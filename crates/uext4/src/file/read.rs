//! Reading file contents: mapped runs are read straight from the device (file data
//! does not go through the metadata cache), holes and unwritten extents read as
//! zeros, and inline files come from the inode.
//!
//! `plan_read` maps a read without doing it, for a caller that passes the
//! image's pages on without copying them (the mount's spliced replies); the
//! plan keeps the inode's mapping lock, so what it names stays the file's.

use crate::dev::HostRange;
use crate::error::{Error, Result};
use crate::extent::MapKind;
use crate::format::inode::{Inode, EXT4_INLINE_DATA_FL};
use crate::fs::Filesystem;
use crate::locks::RwHeld;

/// Longest run read from the device in one request.
const MAX_RUN_BLOCKS: u64 = 256;

/// A stretch of a read, as `for_each_run` finds it.
enum Run<'a> {
    Zeros(usize),
    Inline(&'a [u8]),
    Device { pos: u64, len: usize },
}

impl Run<'_> {
    fn len(&self) -> usize {
        match self {
            Run::Zeros(n) => *n,
            Run::Inline(bytes) => bytes.len(),
            Run::Device { len, .. } => *len,
        }
    }
}

/// A read mapped but not done (`Filesystem::plan_read`): its pieces in order,
/// and the inode's mapping lock, held until the plan is dropped.
pub struct ReadPlan<'fs> {
    _mapping: RwHeld<'fs>,
    pieces: Vec<ReadPiece<'fs>>,
}

/// One piece of a planned read.
#[derive(Debug)]
pub enum ReadPiece<'fs> {
    /// This many zero bytes (a hole, an unwritten extent, past an inline file's data).
    Zeros(usize),
    /// Bytes already in memory (inline data, or a device that is not a host file).
    Bytes(Vec<u8>),
    /// This many bytes of a host file, from the range's offset.
    Host(HostRange<'fs>, usize),
}

impl ReadPiece<'_> {
    pub fn len(&self) -> usize {
        match self {
            ReadPiece::Zeros(n) | ReadPiece::Host(_, n) => *n,
            ReadPiece::Bytes(bytes) => bytes.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<'fs> ReadPlan<'fs> {
    pub fn pieces(&self) -> &[ReadPiece<'fs>] {
        &self.pieces
    }

    /// Bytes the read returns (0 at or past EOF).
    pub fn len(&self) -> usize {
        self.pieces.iter().map(ReadPiece::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Filesystem {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many (0 at or past EOF).
    ///
    /// # Errors
    /// `IsADirectory` for a directory; `NotFound` for an inode not in use; `Corrupt` for a damaged
    /// mapping; `Io` when the device fails.
    pub fn read(&self, ino: u32, offset: u64, buf: &mut [u8]) -> Result<usize> {
        // Writes, truncates, punches and the packing at commit change the tree
        // holding the inode's lock exclusive, and may free nodes a walk would
        // read next: map under the lock shared, as the kernel's i_data_sem.
        let _mapping = self.inode_locks.read(ino as u64);
        let inode = self.inode(ino)?;
        self.read_inode_data(ino, &inode, offset, buf)
    }

    pub(crate) fn read_inode_data(&self, ino: u32, inode: &Inode, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let mut done = 0usize;
        self.for_each_run(ino, inode, offset, buf.len(), |run| {
            let n = run.len();
            let dst = &mut buf[done..done + n];
            match run {
                Run::Zeros(_) => dst.fill(0),
                Run::Inline(bytes) => dst.copy_from_slice(bytes),
                Run::Device { pos, .. } => self.vol.cache.read_data_at(pos, dst)?,
            }
            done += n;
            Ok(())
        })?;
        Ok(done)
    }

    /// Maps up to `len` bytes at `offset` without reading them: the pieces a
    /// reply made of them holds, in order. The plan holds the inode's mapping
    /// lock until dropped, so no block it names is freed and reused meanwhile:
    /// a caller passing the host file's pages on by reference (splice) must be
    /// done with them before dropping it.
    ///
    /// # Errors
    /// As [`Filesystem::read`].
    pub fn plan_read(&self, ino: u32, offset: u64, len: usize) -> Result<ReadPlan<'_>> {
        let mapping = self.inode_locks.read(ino as u64);
        let inode = self.inode(ino)?;
        let device = self.vol.cache.device();
        let mut pieces = Vec::new();
        self.for_each_run(ino, &inode, offset, len, |run| {
            let piece = match run {
                Run::Zeros(n) => ReadPiece::Zeros(n),
                Run::Inline(bytes) => ReadPiece::Bytes(bytes.to_vec()),
                Run::Device { pos, len } => match device.host_range(pos, len)? {
                    Some(range) => {
                        // The reply takes these bytes from the image itself.
                        self.vol.cache.settle_data(pos, len as u64);
                        ReadPiece::Host(range, len)
                    }
                    None => {
                        let mut bytes = vec![0u8; len];
                        self.vol.cache.read_data_at(pos, &mut bytes)?;
                        ReadPiece::Bytes(bytes)
                    }
                },
            };
            pieces.push(piece);
            Ok(())
        })?;
        Ok(ReadPlan { _mapping: mapping, pieces })
    }

    /// Walks the bytes a read of `len` at `offset` returns, in runs: zeros
    /// (holes, unwritten extents, an inline file's tail), inline bytes, device
    /// ranges. The runs end at EOF. The caller holds the inode's mapping lock.
    fn for_each_run(
        &self,
        ino: u32,
        inode: &Inode,
        offset: u64,
        len: usize,
        mut each: impl FnMut(Run<'_>) -> Result<()>,
    ) -> Result<()> {
        if inode.is_dir() {
            return Err(Error::IsADirectory(format!("inode {ino}")));
        }
        if offset >= inode.i_size {
            return Ok(());
        }
        let want = (len as u64).min(inode.i_size - offset) as usize;
        if inode.has_flag(EXT4_INLINE_DATA_FL) {
            let data = self.inline_data(ino, inode)?;
            // i_size may claim more than is stored; clamp so the slice stays in range.
            let start = (offset.min(data.len() as u64)) as usize;
            let avail = (data.len() - start).min(want);
            if avail > 0 {
                each(Run::Inline(&data[start..start + avail]))?;
            }
            // Past the stored bytes an inline file reads as zeros (as the kernel does).
            if want > avail {
                each(Run::Zeros(want - avail))?;
            }
            return Ok(());
        }
        let bs = self.vol.geo.block_size as u64;
        let mut done = 0usize;
        while done < want {
            let pos = offset + done as u64;
            let lblk = pos / bs;
            let in_block = pos % bs;
            let blocks_needed = (in_block + (want - done) as u64).div_ceil(bs);
            let m = self.map_blocks(ino, inode, lblk, blocks_needed.min(MAX_RUN_BLOCKS))?;
            // Never a step of nothing (a loop that would not end).
            if m.len == 0 {
                return Err(Error::corrupt(format!("block {lblk} cannot be mapped"), format!("inode {ino}")));
            }
            let run_bytes = (m.len * bs - in_block).min((want - done) as u64) as usize;
            match m.kind {
                MapKind::Hole | MapKind::Unwritten(_) => each(Run::Zeros(run_bytes))?,
                MapKind::Mapped(pblk) => each(Run::Device { pos: pblk * bs + in_block, len: run_bytes })?,
            }
            done += run_bytes;
        }
        Ok(())
    }

    /// The whole content of a file (or symlink) as bytes.
    ///
    /// # Errors
    /// As [`Filesystem::read`]; `Invalid` for a file too large for memory.
    pub fn read_all(&self, ino: u32) -> Result<Vec<u8>> {
        // As in `read`: no tree change while this walks it.
        let _mapping = self.inode_locks.read(ino as u64);
        let inode = self.inode(ino)?;
        let size = usize::try_from(inode.i_size)
            .map_err(|_| Error::Invalid(format!("inode {ino} of {} bytes does not fit in memory", inode.i_size)))?;
        // A damaged i_size can ask for terabytes: fail instead of aborting on allocation.
        let mut v = Vec::new();
        v.try_reserve_exact(size)
            .map_err(|_| Error::Invalid(format!("inode {ino} of {} bytes does not fit in memory", inode.i_size)))?;
        v.resize(size, 0);
        let n = self.read_inode_data(ino, &inode, 0, &mut v)?;
        v.truncate(n);
        Ok(v)
    }

    /// A symlink's target. Fast symlinks keep it in i_block; others in a data block
    /// or inline.
    ///
    /// # Errors
    /// `Invalid` when `ino` is not a symlink; `Corrupt` for a damaged one.
    pub fn read_link(&self, ino: u32) -> Result<Vec<u8>> {
        let inode = self.inode(ino)?;
        if !inode.is_symlink() {
            return Err(Error::Invalid(format!("inode {ino} is not a symlink")));
        }
        if inode.i_size > 4096 {
            return Err(Error::corrupt(format!("symlink of {} bytes", inode.i_size), format!("inode {ino}")));
        }
        if self.is_fast_symlink(&inode) {
            let n = inode.i_size as usize;
            if n > inode.i_block.len() {
                return Err(Error::corrupt(format!("fast symlink of {n} bytes exceeds 60"), format!("inode {ino}")));
            }
            return Ok(inode.i_block[..n].to_vec());
        }
        let mut v = vec![0u8; inode.i_size as usize];
        let n = self.read_inode_data(ino, &inode, 0, &mut v)?;
        v.truncate(n);
        Ok(v)
    }

    /// The kernel's rule: a symlink with no data blocks of its own (an xattr block
    /// does not count) keeps its target in i_block.
    pub fn is_fast_symlink(&self, inode: &Inode) -> bool {
        if inode.has_flag(EXT4_INLINE_DATA_FL) || !inode.is_symlink() {
            return false;
        }
        let xattr_sectors = if inode.i_file_acl != 0 { self.vol.geo.block_size as u64 / 512 } else { 0 };
        inode.blocks_512(self.vol.geo.huge_file, self.vol.geo.block_size as u32) <= xattr_sectors
    }
}
