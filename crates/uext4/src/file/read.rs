//! Reading file contents: mapped runs are read straight from the device (file data
//! does not go through the metadata cache), holes and unwritten extents read as
//! zeros, and inline files come from the inode.

use crate::error::{Error, Result};
use crate::extent::MapKind;
use crate::format::inode::{Inode, EXT4_INLINE_DATA_FL};
use crate::fs::Filesystem;

/// Longest run read from the device in one request.
const MAX_RUN_BLOCKS: u64 = 256;

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
        if inode.is_dir() {
            return Err(Error::IsADirectory(format!("inode {ino}")));
        }
        if offset >= inode.i_size {
            return Ok(0);
        }
        let want = (buf.len() as u64).min(inode.i_size - offset) as usize;
        let buf = &mut buf[..want];
        if inode.has_flag(EXT4_INLINE_DATA_FL) {
            let data = self.inline_data(ino, inode)?;
            // i_size may claim more than is stored; clamp so the slice stays in range.
            let start = (offset.min(data.len() as u64)) as usize;
            let avail = (data.len() - start).min(want);
            buf[..avail].copy_from_slice(&data[start..start + avail]);
            // Past the stored bytes an inline file reads as zeros (as the kernel does).
            buf[avail..].fill(0);
            return Ok(want);
        }
        let bs = self.vol.geo.block_size as u64;
        let mut done = 0usize;
        while done < want {
            let pos = offset + done as u64;
            let lblk = pos / bs;
            let in_block = pos % bs;
            let blocks_needed = (in_block + (want - done) as u64).div_ceil(bs);
            let m = self.map_blocks(ino, inode, lblk, blocks_needed.min(MAX_RUN_BLOCKS))?;
            let run_bytes = (m.len * bs - in_block).min((want - done) as u64) as usize;
            let dst = &mut buf[done..done + run_bytes];
            match m.kind {
                MapKind::Hole | MapKind::Unwritten(_) => dst.fill(0),
                MapKind::Mapped(pblk) => self.vol.cache.device().read_at(pblk * bs + in_block, dst)?,
            }
            done += run_bytes;
        }
        Ok(done)
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
