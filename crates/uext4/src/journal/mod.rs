//! The jbd2 journal: recovery (in memory for read-only opens, home for writable
//! ones), transaction handles, and writing through the log (log.rs).

pub mod handle;
pub mod log;
pub mod recovery;

use crate::error::{Error, Result};
use crate::extent::MapKind;
use crate::fs::Filesystem;
use std::collections::BTreeMap;

impl Filesystem {
    /// Runs recovery's scan, revoke and replay passes over the journal inode and
    /// returns the final content of every block the journal would write home.
    pub(crate) fn journal_replay_blocks(&self) -> Result<(BTreeMap<u64, Vec<u8>>, u32)> {
        let sb = self.superblock();
        if sb.s_journal_inum == 0 {
            return Err(Error::unsupported("external journal device (the journal is not in an inode)"));
        }
        let jino = sb.s_journal_inum;
        let jinode = self.inode(jino)?;
        let bs = self.vol.geo.block_size;
        let mut read_jblock = |n: u32| -> Result<Vec<u8>> {
            let m = self.map_blocks(jino, &jinode, n as u64, 1)?;
            match m.kind {
                MapKind::Mapped(p) => {
                    let mut v = vec![0u8; bs];
                    self.vol.cache.device().read_at(p * bs as u64, &mut v)?;
                    Ok(v)
                }
                _ => Err(Error::corrupt(format!("journal has no block at {n}"), format!("journal inode {jino}"))),
            }
        };
        let replay = recovery::recover(&mut read_jblock)?;
        for &blk in replay.blocks.keys() {
            self.vol.check_block(blk, &|| "journal replay target".to_string())?;
        }
        Ok((replay.blocks, replay.next_sequence))
    }
}

impl Filesystem {
    /// Makes every change so far durable: through the journal when there is one
    /// (the changes then wait in the log for a checkpoint), otherwise by writing
    /// them home (`sync`). The caller holds no lock of the filesystem.
    ///
    /// # Errors
    /// `Io` (EIO) once the filesystem has failed, or when the device fails.
    pub fn commit(&self) -> Result<()> {
        let Some(journal) = self.vol.journal() else { return self.sync() };
        if self.is_read_only() {
            return if self.has_failed() { Err(self.vol.error_state_eio()) } else { Ok(()) };
        }
        // Called holding no locks, so extent trees split since the last commit can
        // be packed first.
        self.compact_split_extent_trees()?;
        journal.commit_all()
    }

    /// The journal thread (the kernel's kjournald2) runs from the open of every
    /// writable journaled image and commits the running transaction once it is
    /// `commit_interval_secs` old, large, or asked for; and the write-back thread
    /// of an image without a journal from its open too. Kept for callers that
    /// started the former commit timer: there is nothing left to start.
    pub fn start_commit_timer(self: &std::sync::Arc<Self>) -> Result<()> {
        Ok(())
    }

    /// Returns once the changes to `ino` (file data included) are on disk: waits
    /// for the commit of the transaction that holds the inode's last change, or,
    /// when that has committed already, flushes the device (data overwritten in
    /// place may sit in its cache). In the error state: EIO.
    ///
    /// # Errors
    /// `Io` (EIO) once the filesystem has failed, when the device fails, or
    /// when new data of the file that waited for a commit (cache/write_behind.rs)
    /// failed to reach the device since the last fsync of it.
    pub fn fsync(&self, ino: u32) -> Result<()> {
        self.inode(ino)?;
        if self.vol.opened_read_only() {
            return Ok(());
        }
        if self.has_failed() && self.is_read_only() {
            return Err(self.vol.error_state_eio());
        }
        let Some(journal) = self.vol.journal() else { return self.sync() };
        if !self.extent_compact.lock().is_empty() {
            self.compact_split_extent_trees()?;
        }
        match journal.inode_tid(ino) {
            Some(tid) => journal.wait_committed(tid)?,
            None => self.vol.cache.device().flush()?,
        }
        self.report_data_failure(Some(ino))
    }

    /// Commits, then writes every committed block home and empties the log.
    pub fn checkpoint(&self) -> Result<()> {
        match self.vol.journal() {
            Some(journal) if !self.is_read_only() => journal.checkpoint_all(),
            _ => Ok(()),
        }
    }

    #[doc(hidden)]
    /// Counters of the journal since open (None without a journal).
    pub fn journal_stats(&self) -> Option<log::JournalStats> {
        self.vol.journal().map(|j| j.stats())
    }
}
