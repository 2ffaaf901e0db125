//! Truncating a regular file: the blocks past the new end are freed, and the
//! bytes past it in its last block are zeroed so that they read as zeros if the
//! file grows again. Growing only moves i_size (the new range reads as a hole).

use crate::error::{Error, Result};
use crate::extent::MapKind;
use crate::format::inode::Inode;
use crate::fs::Filesystem;
use crate::journal::handle::Handle;
use crate::ns::change::now;

impl Filesystem {
    /// Refuses, before anything changes, a truncate of `ino` to `size` that the
    /// kernel would refuse.
    ///
    /// # Errors
    /// `IsADirectory`, `Invalid` (not a regular file), `FileTooLarge` (past the
    /// largest file size).
    pub(crate) fn check_truncate(&self, ino: u32, size: u64) -> Result<()> {
        let inode = self.inode(ino)?;
        if inode.is_dir() {
            return Err(Error::IsADirectory(format!("truncating directory inode {ino}")));
        }
        if !inode.is_reg() {
            return Err(Error::Invalid(format!("inode {ino} is not a regular file")));
        }
        let max = self.max_size_of(&inode);
        if size > max {
            return Err(Error::FileTooLarge(format!("size {size} for inode {ino}: the largest file is {max} bytes")));
        }
        Ok(())
    }

    /// Sets `inode`'s size to `size` under `tx`, freeing what lies past it. The
    /// caller holds the inode lock, checked the call (`check_truncate`) and writes
    /// the inode back.
    pub(crate) fn truncate_data(&self, tx: &mut Handle, ino: u32, inode: &mut Inode, size: u64) -> Result<()> {
        if size < inode.i_size {
            let bs = self.vol.geo.block_size as u64;
            self.extent_truncate(tx, ino, inode, size.div_ceil(bs))?;
            if !size.is_multiple_of(bs) {
                if let MapKind::Mapped(p) = self.map_blocks(ino, inode, size / bs, 1)?.kind {
                    let tail = (bs - size % bs) as usize;
                    self.vol.cache.write_data_at(p * bs + size % bs, &vec![0u8; tail])?;
                }
            }
        }
        inode.i_size = size;
        inode.i_mtime = now();
        Ok(())
    }
}
