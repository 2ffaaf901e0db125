//! Open files and the orphan list.
//!
//! A file unlinked while open keeps its blocks until the last close. Meanwhile it
//! sits on the on-disk orphan list — the chain from `s_last_orphan` through each
//! inode's i_dtime, as the kernel keeps it — so that if uext4 stops before the
//! close, the next writable open (or the kernel, or e2fsck) frees it.

use crate::error::{Error, Result};
use crate::fs::Filesystem;
use crate::journal::handle::Handle;

impl Filesystem {
    /// Records an open handle on `ino` (FUSE open / opendir).
    pub fn open_inode(&self, ino: u32) -> Result<()> {
        self.inode(ino)?;
        *self.open_files.lock().entry(ino).or_insert(0) += 1;
        Ok(())
    }

    /// Drops an open handle; the last close of an unlinked inode frees it.
    pub fn close_inode(&self, ino: u32) -> Result<()> {
        {
            let mut open = self.open_files.lock();
            let Some(n) = open.get_mut(&ino) else {
                return Err(Error::Invalid(format!("inode {ino} is not open")));
            };
            *n -= 1;
            if *n > 0 {
                return Ok(());
            }
            open.remove(&ino);
        }
        let _lock = self.inode_locks.lock(ino as u64);
        let mut inode = (*self.inode(ino)?).clone();
        if inode.i_links_count != 0 {
            return Ok(());
        }
        let mut tx = self.begin(8)?;
        self.orphan_remove(&mut tx, ino)?;
        self.release_inode(&mut tx, ino, &mut inode)?;
        self.write_inode(&mut tx, ino, &inode)?;
        tx.finish()
    }

    pub(crate) fn is_open(&self, ino: u32) -> bool {
        self.open_files.lock().contains_key(&ino)
    }

    /// Puts an inode whose last link went on the orphan list (caller writes `inode`).
    pub(crate) fn orphan_add(&self, ino: u32, inode: &mut crate::format::inode::Inode) {
        let mut sb = self.sb.write();
        inode.i_dtime = sb.s_last_orphan;
        sb.s_last_orphan = ino;
    }

    /// Takes `ino` off the orphan list.
    fn orphan_remove(&self, tx: &mut Handle, ino: u32) -> Result<()> {
        let next_of = |i: u32| -> Result<u32> { Ok(self.inode(i)?.i_dtime) };
        let mut sb = self.sb.write();
        if sb.s_last_orphan == ino {
            sb.s_last_orphan = next_of(ino)?;
            return Ok(());
        }
        let mut at = sb.s_last_orphan;
        for _ in 0..self.geo.inodes_count {
            if at == 0 {
                return Ok(());
            }
            let next = next_of(at)?;
            if next == ino {
                let mut prev = (*self.inode(at)?).clone();
                prev.i_dtime = next_of(ino)?;
                drop(sb);
                return self.write_inode(tx, at, &prev);
            }
            at = next;
        }
        Err(Error::corrupt("orphan list does not end", "superblock s_last_orphan"))
    }

    /// Frees what a previous session left on the orphan list (run at a writable open).
    pub(crate) fn process_orphans(&self) -> Result<usize> {
        let mut freed = 0;
        let mut at = std::mem::take(&mut self.sb.write().s_last_orphan);
        let mut tx = self.begin(8)?;
        for _ in 0..self.geo.inodes_count {
            if at == 0 {
                break;
            }
            if at > self.geo.inodes_count {
                return Err(Error::corrupt(format!("orphan list names inode {at}"), "orphan list"));
            }
            let mut inode = (*self.inode(at)?).clone();
            let next = inode.i_dtime;
            if inode.i_links_count == 0 {
                self.release_inode(&mut tx, at, &mut inode)?;
                freed += 1;
            } else {
                inode.i_dtime = 0;
            }
            self.write_inode(&mut tx, at, &inode)?;
            at = next;
        }
        tx.finish()?;
        Ok(freed)
    }
}
