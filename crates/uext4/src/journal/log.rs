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
//! revoked in the next commit, and from that commit on its copy is never written
//! home; dirtying it again cancels the revoke, as jbd2 does. Blocks freed in the
//! running transaction are not handed out again until it commits: a crash before
//! then brings back their old owner, whose blocks must still hold its bytes.

use crate::cache::Buffer;
use crate::error::{Error, Result};
use crate::extent::MapKind;
use crate::format::journal::*;
use crate::format::superblock::*;
use crate::fs::Filesystem;
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
    /// Blocks the running transaction freed (start, length): not reusable until it
    /// commits. Their count is subtracted from what the allocator may hand out.
    pending_free: Mutex<Vec<(u64, u64)>>,
    pub(crate) pending_free_blocks: AtomicU64,
    log: Mutex<LogState>,
    /// Dropped with the filesystem, which wakes and ends the commit timer thread.
    timer_stop: Mutex<Option<std::sync::mpsc::Sender<()>>>,
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
            pending_free: Mutex::new(Vec::new()),
            timer_stop: Mutex::new(None),
            pending_free_blocks: AtomicU64::new(0),
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

    /// Writes `blocks` into the log from `start` on, one request per stretch that
    /// is contiguous both in the log and on the device; returns the block after.
    fn write_log(&self, fs: &Filesystem, log: &LogState, start: u32, blocks: &[Vec<u8>]) -> Result<u32> {
        const MAX_RUN_BLOCKS: usize = 256;
        let bs = fs.geo.block_size as u64;
        let mut at = start;
        let mut run: Vec<u8> = Vec::new();
        let mut run_start = at;
        for block in blocks {
            let contiguous = !run.is_empty()
                && at > run_start
                && self.map[at as usize] == self.map[at as usize - 1] + 1
                && run.len() < MAX_RUN_BLOCKS * bs as usize;
            if !contiguous && !run.is_empty() {
                fs.cache.device().write_at(self.map[run_start as usize] * bs, &run)?;
                run.clear();
            }
            if run.is_empty() {
                run_start = at;
            }
            run.extend_from_slice(block);
            at = log.advance(at);
        }
        if !run.is_empty() {
            fs.cache.device().write_at(self.map[run_start as usize] * bs, &run)?;
        }
        Ok(at)
    }

    /// Whether the running transaction is large or old enough to commit now.
    pub(crate) fn wants_commit(&self) -> bool {
        let blocks = self.running_blocks.load(Ordering::Relaxed);
        blocks >= self.max_transaction_blocks
            || (blocks > 0 && self.log.try_lock().is_some_and(|l| l.last_commit.elapsed() >= self.commit_interval))
    }

    /// A block was freed: copies of it in the live log must not be replayed over
    /// what it holds next. The revoke goes out with the running transaction; until
    /// that commits, the committed copy stays due for checkpoint (a checkpoint
    /// meanwhile brings home the state in which the block is still in use).
    pub(crate) fn note_freed(&self, blocks: std::ops::Range<u64>) {
        let log = self.log.lock();
        if log.checkpoint.is_empty() {
            return;
        }
        let mut revokes = self.revokes.lock();
        revokes.extend(log.checkpoint.range(blocks).map(|(&b, _)| b));
    }

    /// Blocks freed under a handle of the running transaction.
    pub(crate) fn defer_free(&self, start: u64, len: u64) {
        self.pending_free.lock().push((start, len));
        self.pending_free_blocks.fetch_add(len, Ordering::Relaxed);
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
        self.commit_transaction().map(drop)
    }

    /// Starts the commit timer (the kernel's kjournald2): a thread that commits
    /// the running transaction once it is `commit_interval_secs` old, whether or
    /// not another change comes along to notice. It ends when the filesystem is
    /// dropped. Without a journal, or read-only, there is nothing to do.
    pub fn start_commit_timer(self: &Arc<Self>) -> Result<()> {
        let Some(journal) = self.journal.as_ref() else { return Ok(()) };
        if self.is_read_only() {
            return Ok(());
        }
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        {
            let mut slot = journal.timer_stop.lock();
            if slot.is_some() {
                return Ok(()); // Already running.
            }
            *slot = Some(stop);
        }
        let tick = (journal.commit_interval / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
        let fs = Arc::downgrade(self);
        std::thread::Builder::new().name("uext4-commit".into()).spawn(move || loop {
            match stopped.recv_timeout(tick) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            let Some(fs) = fs.upgrade() else { return };
            let due = fs.journal.as_ref().is_some_and(|j| j.wants_commit());
            if due {
                if let Err(e) = fs.commit() {
                    eprintln!("uext4: timed journal commit failed: {e}");
                }
            }
        })?;
        Ok(())
    }

    /// Returns once the changes to `ino` (file data included) are on disk. The
    /// journal commits whole transactions, so every earlier change of any file
    /// is made durable with them.
    pub fn fsync(&self, ino: u32) -> Result<()> {
        self.inode(ino)?;
        if self.is_read_only() {
            return Ok(());
        }
        if self.journal.is_none() {
            return self.sync();
        }
        self.compact_split_extent_trees()?;
        if !self.commit_transaction()? {
            // No metadata changed, but data overwritten in place may still sit in
            // the host's cache.
            self.cache.device().flush()?;
        }
        Ok(())
    }

    /// Commits the running transaction; returns whether it held anything.
    fn commit_transaction(&self) -> Result<bool> {
        let Some(journal) = self.journal.as_ref() else {
            return Ok(false);
        };
        if self.is_read_only() {
            return Ok(false);
        }
        // Gate first, then the log: handles take the log lock (note_freed) while
        // holding the gate shared, so the other order could deadlock.
        let (mut log, copies, revokes, freed) = {
            let _closed = journal.gate.write();
            let log = journal.log.lock();
            journal.running_blocks.store(0, Ordering::Relaxed);
            let freed = std::mem::take(&mut *journal.pending_free.lock());
            (log, self.cache.take_dirty(), std::mem::take(&mut *journal.revokes.lock()), freed)
        };
        log.last_commit = Instant::now();
        if copies.is_empty() && revokes.is_empty() {
            self.release_freed(journal, &freed);
            return Ok(false);
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
            self.cache.device().flush()?;
            self.release_freed(journal, &freed);
            return Ok(true);
        }
        let sequence = log.sequence;
        let start = log.head;
        let seed = jsb.csum_seed();
        // Descriptors with the copies they describe, then the revokes, in log order.
        let mut blocks: Vec<Vec<u8>> = Vec::with_capacity(needed);
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
            blocks.push(build_descriptor(&jsb, sequence, &tags));
            blocks.append(&mut bodies);
        }
        let revoked: Vec<u64> = revokes.iter().copied().collect();
        for chunk in revoked.chunks(per_revoke) {
            blocks.push(build_revoke(&jsb, sequence, chunk));
        }
        let mut at = journal.write_log(self, &log, start, &blocks)?;
        if log.live_from.is_none() {
            // The log becomes live: recovery must find it from here. The flag goes
            // first: a live log without it is discarded by the kernel and refused
            // by e2fsck, while the flag over an empty log is harmless.
            self.set_needs_recovery(true)?;
            log.jsb.s_start = start;
            log.jsb.s_sequence = sequence;
            journal.write_jblock(self, 0, &log.jsb.to_bytes())?;
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
        // Revoked blocks are free now and may be reused once this returns: their
        // old copies must never be written home.
        for block in &revoked {
            log.checkpoint.remove(block);
        }
        for (buf, data) in copies {
            log.checkpoint.insert(buf.block, (buf, data));
        }
        drop(log);
        self.release_freed(journal, &freed);
        Ok(true)
    }

    /// The transaction that freed these blocks is on disk: they may be reused.
    fn release_freed(&self, journal: &Journal, freed: &[(u64, u64)]) {
        for &(start, len) in freed {
            let mut block = start;
            while block < start + len {
                let g = self.group_of_block(block);
                let gstart = self.group_first_block(g);
                let end = (start + len).min(gstart + self.blocks_in_group(g) as u64);
                if let Some(runs) = self.alloc.free_runs[g as usize].lock().as_mut() {
                    runs.put((block - gstart) as u32, (end - block) as u32);
                }
                block = end;
            }
            journal.pending_free_blocks.fetch_sub(len, Ordering::Relaxed);
        }
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
        // Neighbouring blocks (inode tables, bitmaps) go home in one request.
        const MAX_RUN_BLOCKS: u64 = 256;
        let bs = self.geo.block_size as u64;
        let mut run: Vec<u8> = Vec::new();
        let (mut run_start, mut run_len) = (0u64, 0u64);
        for (&block, (_, data)) in &log.checkpoint {
            if run_len > 0 && (block != run_start + run_len || run_len == MAX_RUN_BLOCKS) {
                self.cache.device().write_at(run_start * bs, &run)?;
                run.clear();
                run_len = 0;
            }
            if run_len == 0 {
                run_start = block;
            }
            run.extend_from_slice(data);
            run_len += 1;
        }
        if run_len > 0 {
            self.cache.device().write_at(run_start * bs, &run)?;
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
            if HANDLES_HELD.with(|h| h.get()) == 0 && (journal.wants_commit() || self.frees_wanted()) {
                return self.commit_transaction().map(drop);
            }
        }
        Ok(())
    }

    /// Whether space is short enough that the blocks waiting for a commit to be
    /// reusable are needed: an operation may want a few hundred blocks of
    /// headroom, and would otherwise fail with ENOSPC while they wait.
    fn frees_wanted(&self) -> bool {
        const LOW_SPACE_BLOCKS: u64 = 1024;
        let Some(journal) = self.journal.as_ref() else { return false };
        if journal.pending_free_blocks.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let reserved = self.sb.read().s_r_blocks_count;
        self.allocatable_blocks() < reserved + LOW_SPACE_BLOCKS
    }

    /// Counters of the journal since open (None without a journal).
    pub fn journal_stats(&self) -> Option<JournalStats> {
        self.journal.as_ref().map(|j| j.log.lock().stats)
    }
}
