//! Writing through the jbd2 journal.
//!
//! One running transaction collects every metadata block dirtied in the cache
//! since the last commit; operations join it through their handles. A commit
//! closes it (waiting for the handles in flight, which is brief: no handle waits
//! on anything a committer holds), copies the dirty blocks, and writes descriptor
//! blocks with their tags, the copies, revoke blocks and a commit block into the
//! circular log, flushing the device before the commit block (file data, written
//! straight to its blocks, is thereby on disk before the commit that points at it)
//! and after it. The committed copies stay pinned in memory until a checkpoint
//! writes them home and empties the log; the cached buffers stay pinned with them,
//! so nobody reads a block's stale home copy meanwhile.
//!
//! Invariants: the journal superblock's s_start is 0 exactly when no committed
//! transaction awaits checkpoint, and the ext4 superblock says needs_recovery in
//! the same cases. A block freed while a live transaction holds a copy of it is
//! revoked in the next commit and its copy is never written home; dirtying it
//! again cancels the revoke, as jbd2 does.

use crate::cache::Buffer;
use crate::error::{Error, Result};
use crate::extent::MapKind;
use crate::format::journal::*;
use crate::format::superblock::*;
use crate::fs::Filesystem;
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) struct Journal {
    /// The physical block behind each journal block.
    map: Vec<u64>,
    /// Handles hold it shared; closing the running transaction takes it exclusively.
    pub(crate) gate: RwLock<()>,
    /// Blocks newly dirtied since the last commit (for the size trigger).
    pub(crate) running_blocks: AtomicUsize,
    /// Revokes of the running transaction.
    pub(crate) revokes: Mutex<BTreeSet<u64>>,
    log: Mutex<LogState>,
    /// A commit once the running transaction holds this many blocks.
    max_transaction_blocks: usize,
    commit_interval: Duration,
}

struct LogState {
    jsb: JournalSuperblock,
    /// One past the last block of the circular area (before any fast-commit area).
    last: u32,
    /// Where the next transaction's first block goes.
    head: u32,
    /// The sequence the running transaction will commit as.
    sequence: u32,
    /// Where the oldest committed, not yet checkpointed transaction starts.
    live_from: Option<u32>,
    /// The newest committed copy of every block awaiting checkpoint.
    checkpoint: BTreeMap<u64, (Arc<Buffer>, Box<[u8]>)>,
    last_commit: Instant,
    stats: JournalStats,
}

/// What `Filesystem::journal_stats` reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalStats {
    pub commits: u64,
    pub checkpoints: u64,
    pub blocks_logged: u64,
    pub revokes_logged: u64,
    /// Transactions too big for the log, written home directly (not atomic).
    pub unjournaled_commits: u64,
    /// Times the log's head passed its end and went on from the start.
    pub wraps: u64,
}

impl LogState {
    fn len(&self) -> u32 {
        self.last - self.jsb.s_first
    }

    fn used(&self) -> u32 {
        match self.live_from {
            Some(from) => (self.head + self.len() - from) % self.len(),
            None => 0,
        }
    }

    fn advance(&self, block: u32) -> u32 {
        if block + 1 >= self.last {
            self.jsb.s_first
        } else {
            block + 1
        }
    }
}

thread_local! {
    /// Handles this thread holds: a thread inside a handle must not commit (it
    /// would wait for itself).
    pub(crate) static HANDLES_HELD: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

fn now() -> (u64, u32) {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (d.as_secs(), d.subsec_nanos())
}

impl Journal {
    /// Maps the journal inode and readies its superblock for writing, setting the
    /// features the kernel sets when it mounts such a filesystem.
    pub(crate) fn load(fs: &Filesystem, commit_interval: Duration) -> Result<Journal> {
        let sb = fs.superblock();
        let jino = sb.s_journal_inum;
        if jino == 0 {
            return Err(Error::unsupported("writing through an external journal device"));
        }
        let inode = fs.inode(jino)?;
        let bs = fs.geo.block_size as u64;
        let count = inode.i_size / bs;
        let mut map = Vec::with_capacity(count as usize);
        let mut lblk = 0;
        while lblk < count {
            let m = fs.map_blocks(jino, &inode, lblk, count - lblk)?;
            match m.kind {
                MapKind::Mapped(p) => map.extend((0..m.len).map(|i| p + i)),
                _ => {
                    return Err(Error::corrupt(format!("journal has a hole at block {lblk}"), format!("inode {jino}")))
                }
            }
            lblk += m.len;
        }
        let mut raw = vec![0u8; bs as usize];
        let first = *map.first().ok_or_else(|| Error::corrupt("journal inode is empty", format!("inode {jino}")))?;
        fs.cache.device().read_at(first * bs, &mut raw)?;
        let mut jsb = JournalSuperblock::parse(&raw)?;
        if jsb.header.h_blocktype != JBD2_SUPERBLOCK_V2 {
            return Err(Error::unsupported("writing through a version 1 journal"));
        }
        if jsb.s_blocksize as u64 != bs || jsb.s_maxlen as usize > map.len() || jsb.s_first == 0 {
            return Err(Error::corrupt("journal superblock geometry does not match its inode", "journal superblock"));
        }
        if jsb.s_start != 0 {
            return Err(Error::corrupt("journal still holds transactions after recovery", "journal superblock"));
        }
        let known = JBD2_FEATURE_INCOMPAT_REVOKE
            | JBD2_FEATURE_INCOMPAT_64BIT
            | JBD2_FEATURE_INCOMPAT_CSUM_V2
            | JBD2_FEATURE_INCOMPAT_CSUM_V3
            | JBD2_FEATURE_INCOMPAT_FAST_COMMIT;
        if jsb.s_feature_incompat & !known != 0 {
            return Err(Error::unsupported(format!("journal incompat features {:#x}", jsb.s_feature_incompat)));
        }
        let before = jsb.clone();
        jsb.s_feature_incompat |= JBD2_FEATURE_INCOMPAT_REVOKE;
        if sb.is_64bit() {
            jsb.s_feature_incompat |= JBD2_FEATURE_INCOMPAT_64BIT;
        }
        if sb.has_metadata_csum() {
            jsb.s_feature_incompat =
                (jsb.s_feature_incompat & !JBD2_FEATURE_INCOMPAT_CSUM_V2) | JBD2_FEATURE_INCOMPAT_CSUM_V3;
            jsb.s_feature_compat &= !JBD2_FEATURE_COMPAT_CHECKSUM;
            jsb.s_checksum_type = JBD2_CRC32C_CHKSUM;
        }
        let mut last = jsb.s_maxlen;
        if jsb.has_incompat(JBD2_FEATURE_INCOMPAT_FAST_COMMIT) {
            let fc = if jsb.s_num_fc_blks == 0 { 256 } else { jsb.s_num_fc_blks };
            last = last.saturating_sub(fc);
        }
        if last <= jsb.s_first + 8 {
            return Err(Error::corrupt("journal is too small to hold a transaction", "journal superblock"));
        }
        if jsb != before {
            fs.cache.device().write_at(first * bs, &jsb.to_bytes())?;
            fs.cache.device().flush()?;
        }
        let log_len = (last - jsb.s_first) as usize;
        Ok(Journal {
            map,
            gate: RwLock::new(()),
            running_blocks: AtomicUsize::new(0),
            revokes: Mutex::new(BTreeSet::new()),
            max_transaction_blocks: (log_len / 4).max(8),
            commit_interval,
            log: Mutex::new(LogState {
                head: jsb.s_first,
                sequence: jsb.s_sequence,
                jsb,
                last,
                live_from: None,
                checkpoint: BTreeMap::new(),
                last_commit: Instant::now(),
                stats: JournalStats::default(),
            }),
        })
    }

    fn write_jblock(&self, fs: &Filesystem, jblock: u32, data: &[u8]) -> Result<()> {
        let bs = fs.geo.block_size as u64;
        fs.cache.device().write_at(self.map[jblock as usize] * bs, data)
    }

    /// Whether the running transaction is large or old enough to commit now.
    pub(crate) fn wants_commit(&self) -> bool {
        let blocks = self.running_blocks.load(Ordering::Relaxed);
        blocks >= self.max_transaction_blocks
            || (blocks > 0 && self.log.try_lock().is_some_and(|l| l.last_commit.elapsed() >= self.commit_interval))
    }

    /// A block was freed: copies of it in the live log must not be replayed over
    /// what it holds next, nor written home by a checkpoint.
    pub(crate) fn note_freed(&self, blocks: std::ops::Range<u64>) {
        let mut log = self.log.lock();
        if log.checkpoint.is_empty() {
            return;
        }
        let freed: Vec<u64> = log.checkpoint.range(blocks).map(|(&b, _)| b).collect();
        if freed.is_empty() {
            return;
        }
        let mut revokes = self.revokes.lock();
        for b in freed {
            log.checkpoint.remove(&b);
            revokes.insert(b);
        }
    }

    /// A block joins the running transaction: it is journaled again, so an earlier
    /// revoke of it in this transaction no longer applies.
    pub(crate) fn cancel_revoke(&self, block: u64) {
        let mut revokes = self.revokes.lock();
        if !revokes.is_empty() {
            revokes.remove(&block);
        }
    }
}

impl Filesystem {
    /// Makes every change so far durable: through the journal when there is one
    /// (the changes then wait in the log for a checkpoint), otherwise by writing
    /// them home (`sync`).
    pub fn commit(&self) -> Result<()> {
        if self.journal.is_none() {
            return self.sync();
        }
        // Called holding no locks, so extent trees split since the last commit can
        // be packed first (the automatic commit in `begin` cannot: its caller holds
        // inode locks).
        self.compact_split_extent_trees()?;
        self.commit_transaction()
    }

    fn commit_transaction(&self) -> Result<()> {
        let Some(journal) = self.journal.as_ref() else {
            return Ok(());
        };
        if self.is_read_only() {
            return Ok(());
        }
        // Gate first, then the log: handles take the log lock (note_freed) while
        // holding the gate shared, so the other order could deadlock.
        let (mut log, copies, revokes) = {
            let _closed = journal.gate.write();
            let log = journal.log.lock();
            journal.running_blocks.store(0, Ordering::Relaxed);
            (log, self.cache.take_dirty(), std::mem::take(&mut *journal.revokes.lock()))
        };
        log.last_commit = Instant::now();
        if copies.is_empty() && revokes.is_empty() {
            return Ok(());
        }
        let jsb = log.jsb.clone();
        let per_descriptor = tags_per_descriptor(&jsb);
        let per_revoke = revokes_per_block(&jsb);
        let needed = copies.len().div_ceil(per_descriptor) + copies.len() + revokes.len().div_ceil(per_revoke) + 1;
        if needed + 1 > (log.len() - log.used()) as usize {
            self.checkpoint_locked(journal, &mut log)?;
        }
        if needed + 1 > log.len() as usize {
            // Larger than the whole log: the blocks go home directly, as before
            // journaling. Commits are triggered well before this can happen.
            log.stats.unjournaled_commits += 1;
            let bs = self.geo.block_size as u64;
            for (buf, data) in &copies {
                self.cache.device().write_at(buf.block * bs, data)?;
            }
            return self.cache.device().flush();
        }
        let sequence = log.sequence;
        let start = log.head;
        let seed = jsb.csum_seed();
        let mut at = start;
        for chunk in copies.chunks(per_descriptor) {
            let mut tags = Vec::with_capacity(chunk.len());
            let mut bodies = Vec::with_capacity(chunk.len());
            for (buf, data) in chunk {
                let mut body = data.to_vec();
                let mut flags = 0;
                if body[..4] == JBD2_MAGIC.to_be_bytes() {
                    body[..4].fill(0);
                    flags = JBD2_FLAG_ESCAPE;
                }
                let checksum = data_checksum(seed, sequence, &body);
                tags.push(BlockTag { blocknr: buf.block, flags, checksum });
                bodies.push(body);
            }
            journal.write_jblock(self, at, &build_descriptor(&jsb, sequence, &tags))?;
            at = log.advance(at);
            for body in bodies {
                journal.write_jblock(self, at, &body)?;
                at = log.advance(at);
            }
        }
        let revoked: Vec<u64> = revokes.iter().copied().collect();
        for chunk in revoked.chunks(per_revoke) {
            journal.write_jblock(self, at, &build_revoke(&jsb, sequence, chunk))?;
            at = log.advance(at);
        }
        if log.live_from.is_none() {
            // The log becomes live: recovery must find it from here.
            log.jsb.s_start = start;
            log.jsb.s_sequence = sequence;
            journal.write_jblock(self, 0, &log.jsb.to_bytes())?;
            self.set_needs_recovery(true)?;
        }
        // Everything the commit block vouches for, file data included, first.
        self.cache.device().flush()?;
        let (sec, nsec) = now();
        journal.write_jblock(self, at, &build_commit(&jsb, sequence, sec, nsec))?;
        self.cache.device().flush()?;
        at = log.advance(at);

        if at < start {
            log.stats.wraps += 1;
        }
        log.head = at;
        log.sequence = sequence.wrapping_add(1);
        log.live_from.get_or_insert(start);
        log.stats.commits += 1;
        log.stats.blocks_logged += copies.len() as u64;
        log.stats.revokes_logged += revoked.len() as u64;
        for (buf, data) in copies {
            log.checkpoint.insert(buf.block, (buf, data));
        }
        Ok(())
    }

    /// Commits, then writes every committed block home and empties the log.
    pub fn checkpoint(&self) -> Result<()> {
        self.commit_transaction()?;
        if let Some(journal) = self.journal.as_ref() {
            let mut log = journal.log.lock();
            self.checkpoint_locked(journal, &mut log)?;
        }
        Ok(())
    }

    fn checkpoint_locked(&self, journal: &Journal, log: &mut LogState) -> Result<()> {
        if log.live_from.is_none() {
            return Ok(());
        }
        let bs = self.geo.block_size as u64;
        for (block, (_, data)) in &log.checkpoint {
            self.cache.device().write_at(block * bs, data)?;
        }
        self.cache.device().flush()?;
        log.jsb.s_start = 0;
        log.jsb.s_sequence = log.sequence;
        journal.write_jblock(self, 0, &log.jsb.to_bytes())?;
        self.cache.device().flush()?;
        self.set_needs_recovery(false)?;
        log.checkpoint.clear();
        log.live_from = None;
        log.stats.checkpoints += 1;
        Ok(())
    }

    /// Sets or clears needs_recovery in the superblock, written home at once (the
    /// flag must be on disk before the log it announces, and stay until it is gone).
    fn set_needs_recovery(&self, on: bool) -> Result<()> {
        let mut sb = self.sb.write();
        if on {
            sb.s_feature_incompat |= INCOMPAT_RECOVER;
        } else {
            sb.s_feature_incompat &= !INCOMPAT_RECOVER;
        }
        let bytes = sb.to_bytes();
        // The cached copy of the block must agree, or a later commit would undo it.
        let bs = self.geo.block_size as u64;
        let buf = self.cache.get(SUPERBLOCK_OFFSET / bs)?;
        let off = (SUPERBLOCK_OFFSET % bs) as usize;
        buf.write()[off..off + SUPERBLOCK_SIZE].copy_from_slice(&bytes);
        self.cache.device().write_at(SUPERBLOCK_OFFSET, &bytes)?;
        self.cache.device().flush()
    }

    /// Commits when the running transaction has grown large or old. Called where
    /// the thread holds no handle.
    pub(crate) fn commit_if_due(&self) -> Result<()> {
        if let Some(journal) = self.journal.as_ref() {
            if HANDLES_HELD.with(|h| h.get()) == 0 && journal.wants_commit() {
                return self.commit_transaction();
            }
        }
        Ok(())
    }

    /// Counters of the journal since open (None without a journal).
    pub fn journal_stats(&self) -> Option<JournalStats> {
        self.journal.as_ref().map(|j| j.log.lock().stats)
    }
}
