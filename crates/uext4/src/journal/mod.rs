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
        let bs = self.geo.block_size;
        let mut read_jblock = |n: u32| -> Result<Vec<u8>> {
            let m = self.map_blocks(jino, &jinode, n as u64, 1)?;
            match m.kind {
                MapKind::Mapped(p) => {
                    let mut v = vec![0u8; bs];
                    self.cache.device().read_at(p * bs as u64, &mut v)?;
                    Ok(v)
                }
                _ => Err(Error::corrupt(format!("journal has no block at {n}"), format!("journal inode {jino}"))),
            }
        };
        let replay = recovery::recover(&mut read_jblock)?;
        for &blk in replay.blocks.keys() {
            self.check_block(blk, &|| "journal replay target".to_string())?;
        }
        Ok((replay.blocks, replay.next_sequence))
    }
}
