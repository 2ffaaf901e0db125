//! Writing through the jbd2 journal: transactions, their commit on the journal
//! thread, checkpoint, and abort.
//!
//! The shape is jbd2's. One *running* transaction collects the buffers handles
//! dirty (the cache's dirty list is its list: no scan of the cache finds them).
//! A commit runs on the journal thread (the kernel's kjournald2), which closes the
//! running transaction (taking the gate exclusively waits for the handles in
//! flight, which never wait on a commit), takes a frozen copy of each of its
//! buffers (jbd2's b_frozen_data), opens the next running transaction, and only
//! then writes descriptors with their tags, the copies, revoke blocks and a commit
//! block into the circular log, flushing the device before the commit block (file
//! data, written straight to its blocks, is thereby on disk before the commit that
//! points at it) and after it. Meanwhile handles go on in the new running
//! transaction: a buffer changed again joins it, and the commit writes its frozen
//! copy. A handle waits for a commit only when the running transaction has grown
//! past the hard limit (half the log, or half the cache): that is where a large
//! change is split, at a handle boundary, so no transaction outgrows the log.
//!
//! Committed copies stay pinned in memory with their cached buffers (so nobody
//! reads a block's stale home copy) until a checkpoint writes them home. The
//! journal thread checkpoints once half the log or a quarter of the cache is
//! pinned: it writes home all but the hot copies (blocks the last two
//! transactions both logged), whose last transaction stays in the log as its
//! tail; sync and close empty the log. Who waits for what: `wait_committed(tid)` waits for one
//! transaction (fsync waits for the one holding its inode's last change); nobody
//! waiting holds a handle, and the journal thread takes no lock of the namespace,
//! inodes or groups (its narrow view of the filesystem is `JournalOwner`).
//!
//! Abort: a commit or checkpoint whose write fails, or a handle that ends without
//! `finish` after dirtying buffers, aborts the journal. Nothing commits after
//! that (the half-done transaction never becomes durable), the buffers of a failed
//! commit are put back dirty (their state is not dropped), the journal superblock
//! records the errno as jbd2 does, and the owner records the error in the ext4
//! superblock and turns read-only. Recovery at the next open replays what was
//! committed before the abort.
//!
//! Invariants: every committed copy not yet home was logged by a transaction of
//! the live log (from s_start on); the journal superblock's s_start is 0 exactly
//! when no committed transaction awaits checkpoint, and the ext4 superblock says needs_recovery
//! whenever it is not 0; the flag stays set over an empty log after the
//! journal thread's checkpoints (as the kernel keeps it while mounted) and is
//! cleared by `checkpoint_all` (sync, close). A block freed while the live log or the committing transaction
//! holds a copy of it is revoked by the freeing transaction, and from its commit on
//! that copy is never written home; dirtying it again cancels the revoke, as jbd2
//! does. Blocks a transaction freed are not handed out again until it commits
//! (the allocator holds them until `JournalOwner::committed`): a crash before then brings back their old owner,
//! whose blocks must still hold its bytes. Transaction ids (tids) count every
//! closed transaction, empty ones too; log sequences count only those written.

use crate::cache::{Buffer, BufferCache};
use crate::error::{Error, ErrorSite, Result};
use crate::format::journal::*;
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The journal's narrow view of the filesystem that owns it.
pub(crate) trait JournalOwner: Send + Sync {
    /// Sets or clears needs_recovery in the superblock, written home and flushed
    /// at once (the flag must be on disk before the log it announces, and stay
    /// until the log is empty).
    fn set_needs_recovery(&self, on: bool) -> Result<()>;
    /// Transaction `tid` (and every one before it) committed: what it freed may
    /// be handed out again (jbd2's j_commit_callback; the allocator keeps the
    /// frees, keyed by transaction).
    fn committed(&self, tid: u64);
    /// The journal aborted: record the error and stop writing.
    fn aborted(&self, site: ErrorSite, why: &str);
    /// The journal superblock recorded an errno (an abort in a previous mount):
    /// record it as an error of the filesystem, as the kernel does at mount.
    fn error_from_previous_mount(&self, errno: i32);
}

pub(crate) struct Journal {
    /// The physical block behind each journal block.
    map: Vec<u64>,
    cache: Arc<BufferCache>,
    owner: Arc<dyn JournalOwner>,
    /// Handles hold it shared; closing the running transaction takes it exclusively.
    pub(crate) gate: RwLock<()>,
    state: Mutex<TxState>,
    /// Wakes the journal thread.
    wake: Condvar,
    /// Signals waiters: a transaction closed or committed, the log has room, an abort.
    changed: Condvar,
    /// The log itself: held by whoever writes it (the journal thread through a
    /// commit's I/O, a checkpoint), never by a handle.
    log: Mutex<LogState>,
    /// How many revokes the running transaction holds (a copy of
    /// `TxState::revokes.len()`, kept under the state lock, read without it).
    revokes_pending: std::sync::atomic::AtomicUsize,
    /// Milliseconds (since `epoch`) when the running transaction got its first
    /// buffer; 0 while it is empty.
    running_since: AtomicU64,
    epoch: Instant,
    handle_waits: AtomicU64,
    /// The last transaction that changed each inode (for fsync), in shards by
    /// inode number: every change of an inode notes it here.
    inode_tids: crate::number_map::ShardedMap<u64>,
    /// The running transaction's id. It moves only under the gate's write hold
    /// and the state lock, so a handle holding the gate, or anyone holding the
    /// state lock, reads it without the race a lone atomic would have.
    running_tid: AtomicU64,
    /// Set with `TxState::aborted` (read without the state lock by `join`).
    aborted_flag: std::sync::atomic::AtomicBool,
    limits: Limits,
    commit_interval: Duration,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[derive(Clone, Copy, Debug)]
struct Limits {
    /// The journal thread commits once the running transaction holds this many blocks.
    commit_blocks: usize,
    /// New handles wait for a commit beyond this many.
    hard_blocks: usize,
    /// The journal thread checkpoints once the log uses this many blocks...
    checkpoint_log_blocks: u32,
    /// ... or this many committed buffers are pinned.
    checkpoint_pinned: usize,
}

struct TxState {
    /// The last transaction committed (or found empty).
    committed: u64,
    /// The highest transaction someone waits to see committed.
    requested: u64,
    /// Revokes of the running transaction.
    revokes: BTreeSet<u64>,
    /// Blocks with a copy in the live log or in the committing transaction.
    in_log: HashSet<u64>,
    /// Blocks the live log uses and committed copies pinned, as of the last commit
    /// or checkpoint (what the journal thread's checkpoint trigger reads).
    log_used: u32,
    pinned: usize,
    aborted: Option<String>,
    aborting: bool,
    stop: bool,
}

struct LogState {
    jsb: JournalSuperblock,
    /// One past the last block of the circular area (before any fast-commit area).
    last: u32,
    /// Where the next transaction's first block goes.
    head: u32,
    /// The sequence the next transaction written will commit as.
    sequence: u32,
    /// Where the oldest committed, not yet checkpointed transaction starts.
    live_from: Option<u32>,
    /// Whether this journal last wrote needs_recovery home as set. It stays set
    /// over an empty log after a background checkpoint (the kernel keeps it set
    /// while mounted): clearing it there and setting it again at the next
    /// commit cost two superblock writes and flushes per checkpoint.
    recovery_flag_home: bool,
    /// The newest committed copy of every block awaiting checkpoint.
    checkpoint: BTreeMap<u64, Pinned>,
    /// The committed transactions of the live log, oldest first.
    live: VecDeque<LiveTransaction>,
    /// The blocks of the last transaction written: a block logged by two
    /// transactions in a row is hot, and a checkpoint leaves it in the log.
    last_blocks: HashSet<u64>,
    stats: JournalStats,
}

/// A committed copy awaiting checkpoint: its buffer (pinned in the cache, so
/// nobody reads the stale home block), the bytes as committed, the transaction
/// that logged them (its `JournalStats::commits` number), and whether the
/// transaction before that one logged the block too.
struct Pinned {
    buf: Arc<Buffer>,
    data: Box<[u8]>,
    commit: u64,
    hot: bool,
}

/// A transaction of the live log: where recovery would start to replay it.
struct LiveTransaction {
    commit: u64,
    sequence: u32,
    start: u32,
    blocks: Vec<u64>,
}

/// What `Filesystem::journal_stats` reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalStats {
    pub commits: u64,
    pub checkpoints: u64,
    pub blocks_logged: u64,
    pub revokes_logged: u64,
    /// Committed copies written to their home blocks by checkpoints.
    pub blocks_written_home: u64,
    /// Hot copies a checkpoint left in the log (each counted once per checkpoint).
    pub blocks_kept_in_log: u64,
    /// Always 0: a transaction is split at handle boundaries before it outgrows
    /// the log, never written home outside it. Kept for callers that report it.
    pub unjournaled_commits: u64,
    /// Times the log's head passed its end and went on from the start.
    pub wraps: u64,
    /// Times a handle waited for a commit to make room (the hard limit).
    pub handle_waits: u64,
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
    /// Handles this thread holds: a thread inside a handle must not wait for a
    /// commit (the commit waits for its handle).
    pub(crate) static HANDLES_HELD: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// The commit block's time (the fixed time when one is set: `clock`).
fn now() -> (u64, u32) {
    let (sec, nsec) = crate::clock::precise();
    (u64::try_from(sec).unwrap_or(0), nsec)
}

fn io_error(why: &str) -> Error {
    Error::Io(std::io::Error::other(format!("journal aborted: {why}")))
}

/// A place in the running transaction, held by a handle: its id, and the gate
/// that keeps the transaction from closing until the handle is done.
pub(crate) struct Joined<'a> {
    pub(crate) tid: u64,
    _gate: parking_lot::RwLockReadGuard<'a, ()>,
}

impl Journal {
    /// Readies the journal whose blocks are `map` (journal block n at physical
    /// block map[n]) for writing, setting the features the kernel sets when it
    /// mounts such a filesystem, and starts its thread.
    pub(crate) fn load(
        map: Vec<u64>,
        cache: Arc<BufferCache>,
        owner: Arc<dyn JournalOwner>,
        commit_interval: Duration,
        want_64bit: bool,
        want_csum_v3: bool,
    ) -> Result<Arc<Journal>> {
        let bs = cache.block_size() as u64;
        let dev = cache.device().clone();
        let mut raw = vec![0u8; bs as usize];
        let first = *map.first().ok_or_else(|| Error::corrupt("journal inode is empty", "journal"))?;
        dev.read_at(first * bs, &mut raw)?;
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
            | JBD2_FEATURE_INCOMPAT_ASYNC_COMMIT
            | JBD2_FEATURE_INCOMPAT_CSUM_V2
            | JBD2_FEATURE_INCOMPAT_CSUM_V3
            | JBD2_FEATURE_INCOMPAT_FAST_COMMIT;
        let unknown = jsb.s_feature_incompat & !known;
        if unknown != 0 {
            return Err(Error::unsupported(format!("journal incompat features {unknown:#x}, unknown to uext4")));
        }
        let before = jsb.clone();
        if jsb.s_errno != 0 {
            owner.error_from_previous_mount(jsb.s_errno);
            jsb.s_errno = 0;
        }
        jsb.s_feature_incompat |= JBD2_FEATURE_INCOMPAT_REVOKE;
        // uext4 writes each commit block after its transaction's blocks and no v1
        // (crc32) commit checksum: as the kernel's mount without the
        // journal_async_commit and journal_checksum options does, it clears the
        // features a previous mount with them left.
        jsb.s_feature_incompat &= !JBD2_FEATURE_INCOMPAT_ASYNC_COMMIT;
        jsb.s_feature_compat &= !JBD2_FEATURE_COMPAT_CHECKSUM;
        if want_64bit {
            jsb.s_feature_incompat |= JBD2_FEATURE_INCOMPAT_64BIT;
        }
        if want_csum_v3 {
            jsb.s_feature_incompat =
                (jsb.s_feature_incompat & !JBD2_FEATURE_INCOMPAT_CSUM_V2) | JBD2_FEATURE_INCOMPAT_CSUM_V3;
            jsb.s_checksum_type = JBD2_CRC32C_CHKSUM;
        }
        let last = jsb.s_maxlen.saturating_sub(jsb.fast_commit_blocks());
        if last <= jsb.s_first + 8 {
            return Err(Error::corrupt("journal is too small to hold a transaction", "journal superblock"));
        }
        if jsb != before {
            dev.write_at(first * bs, &jsb.to_bytes())?;
            dev.flush()?;
        }
        let log_len = (last - jsb.s_first) as usize;
        let cache_blocks = cache.capacity();
        let limits = Limits {
            commit_blocks: (log_len / 4).min(cache_blocks / 4).max(8),
            hard_blocks: (log_len / 2).min(cache_blocks / 2).max(16),
            checkpoint_log_blocks: (log_len / 2) as u32,
            checkpoint_pinned: (cache_blocks / 4).max(16),
        };
        let journal = Arc::new(Journal {
            map,
            cache,
            owner,
            gate: RwLock::new(()),
            state: Mutex::new(TxState {
                committed: 0,
                requested: 0,
                revokes: BTreeSet::new(),
                in_log: HashSet::new(),
                log_used: 0,
                pinned: 0,
                aborted: None,
                aborting: false,
                stop: false,
            }),
            wake: Condvar::new(),
            changed: Condvar::new(),
            revokes_pending: std::sync::atomic::AtomicUsize::new(0),
            running_since: AtomicU64::new(0),
            epoch: Instant::now(),
            handle_waits: AtomicU64::new(0),
            inode_tids: Default::default(),
            running_tid: AtomicU64::new(1),
            aborted_flag: std::sync::atomic::AtomicBool::new(false),
            limits,
            commit_interval,
            thread: Mutex::new(None),
            log: Mutex::new(LogState {
                head: jsb.s_first,
                sequence: jsb.s_sequence,
                jsb,
                last,
                live_from: None,
                recovery_flag_home: false,
                checkpoint: BTreeMap::new(),
                live: VecDeque::new(),
                last_blocks: HashSet::new(),
                stats: JournalStats::default(),
            }),
        });
        let worker = journal.clone();
        let thread = std::thread::Builder::new().name("uext4-journal".into()).spawn(move || worker.run())?;
        *journal.thread.lock() = Some(thread);
        Ok(journal)
    }

    /// Stops the journal thread (after the commit it may be doing); what is still
    /// running stays uncommitted. Called when the filesystem closes.
    pub(crate) fn shutdown(&self) {
        self.state.lock().stop = true;
        self.wake.notify_all();
        self.changed.notify_all();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }

    /// Joins the running transaction for a handle that may dirty up to `credits`
    /// blocks. A handle nested in another of the same thread joins at once; any
    /// other waits, holding no gate, while the running transaction is past the
    /// hard limit, until a commit has closed it (this splits large changes at
    /// handle boundaries and keeps the cache's dirty buffers bounded).
    pub(crate) fn join(&self, credits: u32) -> Result<Joined<'_>> {
        let nested = HANDLES_HELD.with(|h| h.get()) > 0;
        // Every change of every thread starts here: with room in the running
        // transaction and no abort, no lock but the gate is taken.
        if !nested && (!self.has_room(credits) || self.aborted_flag.load(Ordering::Acquire)) {
            let mut waited = false;
            let mut st = self.state.lock();
            loop {
                if let Some(why) = &st.aborted {
                    return Err(Error::ReadOnly(format!("the journal aborted: {why}")));
                }
                if self.has_room(credits) || st.stop {
                    break;
                }
                if !waited {
                    waited = true;
                    self.handle_waits.fetch_add(1, Ordering::Relaxed);
                }
                let tid = self.running_tid();
                st.requested = st.requested.max(tid);
                self.wake.notify_one();
                while self.running_tid() == tid && st.aborted.is_none() && !st.stop {
                    self.changed.wait(&mut st);
                }
            }
        }
        // Not `read_recursive` outside a handle: a closing commit waiting for the
        // gate goes first, so a stream of handles cannot starve it.
        let gate = if nested { self.gate.read_recursive() } else { self.gate.read() };
        // Stable while the gate is held: it moves only under the gate's write hold.
        let tid = self.running_tid();
        Ok(Joined { tid, _gate: gate })
    }

    /// A buffer was dirtied under a handle of the running transaction.
    pub(crate) fn dirtied(&self, buf: &Arc<Buffer>) {
        if self.cache.mark_dirty(buf) {
            let since = self.epoch.elapsed().as_millis() as u64 + 1;
            let _ = self.running_since.compare_exchange(0, since, Ordering::Relaxed, Ordering::Relaxed);
            if self.cache.dirty_count() == self.limits.commit_blocks {
                self.wake.notify_one();
            }
        }
        self.cancel_revoke(buf.block);
    }

    /// Whether a handle of `credits` blocks fits under the running
    /// transaction's hard limit (an empty one always takes it).
    fn has_room(&self, credits: u32) -> bool {
        let dirty = self.cache.dirty_count();
        dirty == 0 || dirty + credits as usize <= self.limits.hard_blocks
    }

    /// `ino` changed in transaction `tid`.
    pub(crate) fn note_inode(&self, ino: u32, tid: u64) {
        self.inode_tids.shard(ino).insert(ino, tid);
    }

    /// The transaction that last changed `ino`, if it may not have committed yet.
    pub(crate) fn inode_tid(&self, ino: u32) -> Option<u64> {
        let tid = *self.inode_tids.shard(ino).get(&ino)?;
        (tid > self.state.lock().committed).then_some(tid)
    }

    /// The running transaction's id (see the field `running_tid`).
    pub(crate) fn running_tid(&self) -> u64 {
        self.running_tid.load(Ordering::Acquire)
    }

    /// Waits until transaction `tid` has committed, asking the journal thread for
    /// it. The caller holds no handle (nor, by the lock order, any lock a handle
    /// may wait for). An aborted journal answers EIO.
    pub(crate) fn wait_committed(&self, tid: u64) -> Result<()> {
        if HANDLES_HELD.with(|h| h.get()) > 0 {
            return Err(Error::Busy("waiting for a commit inside a transaction handle would deadlock".into()));
        }
        let mut st = self.state.lock();
        loop {
            if let Some(why) = &st.aborted {
                return Err(io_error(why));
            }
            if st.committed >= tid {
                return Ok(());
            }
            if st.stop {
                return Err(Error::ReadOnly("the journal is shut down".into()));
            }
            if st.requested < tid {
                st.requested = tid;
                self.wake.notify_one();
            }
            self.changed.wait(&mut st);
        }
    }

    /// Asks the journal thread to commit the running transaction, without waiting.
    pub(crate) fn request_commit(&self) {
        let mut st = self.state.lock();
        st.requested = st.requested.max(self.running_tid());
        self.wake.notify_one();
    }

    /// Commits everything so far and waits for it.
    pub(crate) fn commit_all(&self) -> Result<()> {
        let tid = self.running_tid();
        self.wait_committed(tid)
    }

    /// Commits everything so far, then writes every committed block home and
    /// empties the log.
    pub(crate) fn checkpoint_all(&self) -> Result<()> {
        self.commit_all()?;
        let mut log = self.log.lock();
        self.checkpoint_locked(&mut log, &[], FlagAfter::Clear)
    }

    /// A block was freed: copies of it in the live log (or in the transaction
    /// being committed) must not be replayed over what it holds next. The revoke
    /// goes out with the running transaction; until that commits, the committed
    /// copy stays due for checkpoint (a checkpoint meanwhile brings home the state
    /// in which the block is still in use). Takes only the brief state lock.
    pub(crate) fn note_freed(&self, blocks: std::ops::Range<u64>) {
        let mut st = self.state.lock();
        if st.in_log.is_empty() {
            return;
        }
        let hits: Vec<u64> = blocks.filter(|b| st.in_log.contains(b)).collect();
        st.revokes.extend(hits);
        self.revokes_pending.store(st.revokes.len(), Ordering::SeqCst);
    }

    /// A block joins the running transaction: it is journaled again, so an earlier
    /// revoke of it in this transaction no longer applies.
    fn cancel_revoke(&self, block: u64) {
        // Almost always nothing is revoked: every handle's dirty then skips the
        // state lock, which all of them would otherwise meet on.
        if self.revokes_pending.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut st = self.state.lock();
        if st.revokes.remove(&block) {
            self.revokes_pending.store(st.revokes.len(), Ordering::SeqCst);
        }
    }

    /// Stops the journal: nothing commits from here on. Idempotent; the first
    /// reason is kept.
    pub(crate) fn abort(&self, site: ErrorSite, why: &str) {
        {
            let mut st = self.state.lock();
            if st.aborting {
                return;
            }
            // From here nothing closes or commits; waiters learn of the abort
            // once the owner has recorded it (so an EIO they return is never
            // seen before the error state).
            st.aborting = true;
        }
        // errors=panic panics in the owner: the journal still ends aborted, so no
        // waiter hangs on a journal that will never commit again.
        let recorded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.owner.aborted(site, why)));
        self.state.lock().aborted = Some(why.to_string());
        self.aborted_flag.store(true, Ordering::Release);
        self.changed.notify_all();
        self.wake.notify_all();
        if let Err(panic) = recorded {
            std::panic::resume_unwind(panic);
        }
    }

    /// jbd2 records an abort's errno in its superblock, so the next mount knows.
    /// The journal thread does it (it may hold the log when the abort happens).
    /// The ext4 superblock says needs_recovery first, as the kernel's does
    /// after an abort (it never clears the flag then): a journal with an errno
    /// but no needs_recovery is a state e2fsck -n cannot check (it would clear
    /// the errno, and may not write).
    fn record_errno(&self) {
        let mut log = self.log.lock();
        if log.jsb.s_errno == 0 {
            if !log.recovery_flag_home && self.owner.set_needs_recovery(true).is_ok() {
                log.recovery_flag_home = true;
            }
            log.jsb.s_errno = -5;
            let _ = self.write_jblock(0, &log.jsb.to_bytes()).and_then(|_| self.cache.device().flush());
        }
    }

    pub(crate) fn stats(&self) -> JournalStats {
        JournalStats { handle_waits: self.handle_waits.load(Ordering::Relaxed), ..self.log.lock().stats }
    }

    fn write_jblock(&self, jblock: u32, data: &[u8]) -> Result<()> {
        let bs = self.cache.block_size() as u64;
        self.cache.device().write_at(self.map[jblock as usize] * bs, data)
    }

    /// Writes `blocks` into the log from `start` on, one request per stretch that
    /// is contiguous both in the log and on the device; returns the block after.
    fn write_log(&self, log: &LogState, start: u32, blocks: &[Vec<u8>]) -> Result<u32> {
        const MAX_RUN_BLOCKS: usize = 256;
        let bs = self.cache.block_size() as u64;
        let dev = self.cache.device();
        let mut at = start;
        let mut run: Vec<u8> = Vec::new();
        let mut run_start = at;
        for block in blocks {
            let contiguous = !run.is_empty()
                && at > run_start
                && self.map[at as usize] == self.map[at as usize - 1] + 1
                && run.len() < MAX_RUN_BLOCKS * bs as usize;
            if !contiguous && !run.is_empty() {
                dev.write_at(self.map[run_start as usize] * bs, &run)?;
                run.clear();
            }
            if run.is_empty() {
                run_start = at;
            }
            run.extend_from_slice(block);
            at = log.advance(at);
        }
        if !run.is_empty() {
            dev.write_at(self.map[run_start as usize] * bs, &run)?;
        }
        Ok(at)
    }

    /// The journal thread: commits when asked, when the running transaction is
    /// large or old, and checkpoints when the log or the pinned copies grow.
    fn run(self: Arc<Self>) {
        let tick = (self.commit_interval / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
        let mut st = self.state.lock();
        loop {
            if st.stop {
                // An abort is recorded before the thread ends, however soon the
                // filesystem closes after it.
                if st.aborted.is_some() {
                    drop(st);
                    self.record_errno();
                }
                return;
            }
            let (commit, checkpoint) = match st.aborted {
                Some(_) => {
                    drop(st);
                    self.record_errno();
                    st = self.state.lock();
                    if !st.stop {
                        self.wake.wait_for(&mut st, tick);
                    }
                    continue;
                }
                None => {
                    let dirty = self.cache.dirty_count();
                    let since = self.running_since.load(Ordering::Relaxed);
                    let old = since != 0
                        && self.epoch.elapsed().as_millis() as u64 >= since + self.commit_interval.as_millis() as u64;
                    let pending = dirty > 0 || !st.revokes.is_empty();
                    let commit =
                        st.requested >= self.running_tid() || dirty >= self.limits.commit_blocks || (pending && old);
                    let checkpoint =
                        st.log_used >= self.limits.checkpoint_log_blocks || st.pinned >= self.limits.checkpoint_pinned;
                    (commit, checkpoint)
                }
            };
            if !commit && !checkpoint {
                self.wake.wait_for(&mut st, tick);
                continue;
            }
            drop(st);
            let mut log = self.log.lock();
            let mut result = Ok(());
            if commit {
                result = self.commit_running(&mut log);
            }
            if result.is_ok() && checkpoint {
                result = self.checkpoint_cold(&mut log);
            }
            drop(log);
            if let Err(e) = result {
                eprintln!("uext4: journal: {e}");
            }
            st = self.state.lock();
        }
    }

    /// Closes the running transaction and commits it. The caller holds the log.
    fn commit_running(&self, log: &mut LogState) -> Result<()> {
        // Close: no handle is in flight while the gate is held, so the copies are
        // whole; handles that come after join the next transaction.
        let (tid, copies, revokes) = {
            let _closed = self.gate.write();
            let mut st = self.state.lock();
            if st.aborting {
                return Ok(());
            }
            let tid = self.running_tid();
            self.running_tid.store(tid + 1, Ordering::Release);
            self.running_since.store(0, Ordering::Relaxed);
            let copies = self.cache.take_dirty();
            let revokes = std::mem::take(&mut st.revokes);
            self.revokes_pending.store(0, Ordering::SeqCst);
            st.in_log.extend(copies.iter().map(|(b, _)| b.block));
            (tid, copies, revokes)
        };
        self.changed.notify_all();
        // Ordered data: the new file data this transaction maps goes before its
        // commit block (failures are the writers' to report, cache/write_behind.rs).
        self.cache.send_data();
        let result = if copies.is_empty() && revokes.is_empty() {
            Ok(None)
        } else {
            self.write_transaction(log, &copies, &revokes).map(Some)
        };
        match result {
            Ok(written) => {
                // Revoked blocks are free now and may be reused once this returns:
                // their old copies must never be written home.
                for block in &revokes {
                    log.checkpoint.remove(block);
                }
                if let Some((sequence, start)) = written {
                    let commit = log.stats.commits;
                    let blocks: Vec<u64> = copies.iter().map(|(b, _)| b.block).collect();
                    let last_blocks: HashSet<u64> = blocks.iter().copied().collect();
                    for (buf, data) in copies {
                        let hot = log.last_blocks.contains(&buf.block);
                        log.checkpoint.insert(buf.block, Pinned { buf, data, commit, hot });
                    }
                    log.last_blocks = last_blocks;
                    log.live.push_back(LiveTransaction { commit, sequence, start, blocks });
                }
                self.owner.committed(tid);
                let mut st = self.state.lock();
                st.committed = tid;
                st.log_used = log.used();
                st.pinned = log.checkpoint.len();
                self.inode_tids.for_each_shard(|tids| {
                    if tids.len() > 256 {
                        tids.retain(|_, t| *t > tid);
                    }
                });
                drop(st);
                self.changed.notify_all();
                Ok(())
            }
            Err(e) => {
                // Nothing is dropped: the buffers go back dirty (the cache keeps
                // them, and what reads them sees the latest state), the frees stay
                // pending, and the journal stops.
                self.cache.redirty(copies.into_iter().map(|(b, _)| b));
                let site = ErrorSite { func: "journal_commit", errno: e.errno() };
                self.abort(site, &format!("commit of transaction {tid} failed: {e}"));
                Err(e)
            }
        }
    }

    /// Writes one transaction into the log: descriptors with their copies, revoke
    /// blocks, a flush, the commit block, a flush.
    /// Returns the transaction's sequence and the log block it starts at.
    fn write_transaction(
        &self,
        log: &mut LogState,
        copies: &[(Arc<Buffer>, Box<[u8]>)],
        revokes: &BTreeSet<u64>,
    ) -> Result<(u32, u32)> {
        let jsb = log.jsb.clone();
        let per_descriptor = tags_per_descriptor(&jsb);
        let per_revoke = revokes_per_block(&jsb);
        let needed = copies.len().div_ceil(per_descriptor) + copies.len() + revokes.len().div_ceil(per_revoke) + 1;
        if needed + 1 > (log.len() - log.used()) as usize {
            // The committing transaction's own blocks stay known as logged: a free
            // of one of them must still be revoked.
            self.checkpoint_locked(log, copies, FlagAfter::Keep)?;
        }
        if needed + 1 > log.len() as usize {
            // Handles wait at half the log, so only a single handle larger than
            // the log gets here: it cannot be made durable atomically.
            return Err(Error::NoSpace(format!(
                "a transaction of {needed} journal blocks does not fit a log of {}",
                log.len()
            )));
        }
        let sequence = log.sequence;
        let start = log.head;
        let seed = jsb.csum_seed();
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
        let mut at = self.write_log(log, start, &blocks)?;
        if !log.recovery_flag_home {
            // The flag goes before the log is live: a live log without it is
            // discarded by the kernel and refused by e2fsck, while the flag over
            // an empty log is harmless.
            self.owner.set_needs_recovery(true)?;
            log.recovery_flag_home = true;
        }
        if log.live_from.is_none() {
            // The log becomes live: recovery must find it from here.
            log.jsb.s_start = start;
            log.jsb.s_sequence = sequence;
            self.write_jblock(0, &log.jsb.to_bytes())?;
        }
        // Everything the commit block vouches for, file data included, first.
        self.cache.device().flush()?;
        let (sec, nsec) = now();
        self.write_jblock(at, &build_commit(&jsb, sequence, sec, nsec))?;
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
        Ok((sequence, start))
    }

    /// Writes every committed copy home and empties the log, then clears
    /// needs_recovery if `flag` says so. The caller holds the log; `committing`
    /// is the transaction it is about to write (if any), whose blocks stay in
    /// `in_log`. A failed write aborts the journal.
    fn checkpoint_locked(
        &self,
        log: &mut LogState,
        committing: &[(Arc<Buffer>, Box<[u8]>)],
        flag: FlagAfter,
    ) -> Result<()> {
        if log.live_from.is_none() {
            return self.clear_recovery_flag(log, flag);
        }
        if let Some(why) = &self.state.lock().aborted {
            return Err(io_error(why));
        }
        let result = self.write_home(log);
        if let Err(e) = &result {
            self.abort(checkpoint_site(e), &checkpoint_failed(e));
            return result;
        }
        log.checkpoint.clear();
        log.live.clear();
        log.live_from = None;
        log.stats.checkpoints += 1;
        if let Err(e) = self.clear_recovery_flag(log, flag) {
            self.abort(checkpoint_site(&e), &checkpoint_failed(&e));
            return Err(e);
        }
        let mut st = self.state.lock();
        st.in_log.clear();
        st.in_log.extend(committing.iter().map(|(b, _)| b.block));
        st.log_used = 0;
        st.pinned = 0;
        drop(st);
        self.changed.notify_all();
        Ok(())
    }

    fn write_home(&self, log: &mut LogState) -> Result<()> {
        self.write_copies_home(log.checkpoint.iter().map(|(&block, p)| (block, &p.data[..])))?;
        log.stats.blocks_written_home += log.checkpoint.len() as u64;
        log.jsb.s_start = 0;
        log.jsb.s_sequence = log.sequence;
        self.write_jblock(0, &log.jsb.to_bytes())?;
        self.cache.device().flush()
    }

    /// Writes committed copies to their home blocks, in ascending block order,
    /// then flushes: neighbouring blocks (inode tables, bitmaps) go in one request.
    fn write_copies_home<'a>(&self, copies: impl Iterator<Item = (u64, &'a [u8])>) -> Result<()> {
        const MAX_RUN_BLOCKS: u64 = 256;
        let dev = self.cache.device();
        let bs = self.cache.block_size() as u64;
        let mut run: Vec<u8> = Vec::new();
        let (mut run_start, mut run_len) = (0u64, 0u64);
        for (block, data) in copies {
            if run_len > 0 && (block != run_start + run_len || run_len == MAX_RUN_BLOCKS) {
                dev.write_at(run_start * bs, &run)?;
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
            dev.write_at(run_start * bs, &run)?;
        }
        dev.flush()
    }

    /// The journal thread's checkpoint: writes home every committed copy but the
    /// hot ones (logged by the last transaction and the one before it: a
    /// directory leaf or bitmap that every transaction changes), and moves the
    /// log's tail to the oldest transaction a kept copy needs. A hot block is
    /// thereby written home once when it cools (or at sync), not once per
    /// checkpoint, as jbd2 leaves a buffer that a newer transaction holds off its
    /// older transaction's checkpoint list. If the kept copies are more than
    /// half of what triggers a checkpoint, everything goes home instead (a
    /// workload whose every block is hot must still empty the log). A failed
    /// write aborts the journal. The caller holds the log.
    fn checkpoint_cold(&self, log: &mut LogState) -> Result<()> {
        let Some(&LiveTransaction { commit: latest, start, sequence, .. }) = log.live.back() else {
            return self.checkpoint_locked(log, &[], FlagAfter::Keep);
        };
        let keep = |p: &Pinned| p.hot && p.commit == latest;
        let kept = log.checkpoint.values().filter(|p| keep(p)).count();
        if kept == 0 || kept * 2 >= self.limits.checkpoint_pinned {
            return self.checkpoint_locked(log, &[], FlagAfter::Keep);
        }
        if let Some(why) = &self.state.lock().aborted {
            return Err(io_error(why));
        }
        let written =
            self.write_copies_home(log.checkpoint.values().filter(|p| !keep(p)).map(|p| (p.buf.block, &p.data[..])));
        if let Err(e) = written {
            self.abort(checkpoint_site(&e), &checkpoint_failed(&e));
            return Err(e);
        }
        let before = log.checkpoint.len();
        log.checkpoint.retain(|_, p| keep(p));
        log.stats.blocks_written_home += (before - log.checkpoint.len()) as u64;
        log.stats.blocks_kept_in_log += log.checkpoint.len() as u64;
        log.stats.checkpoints += 1;
        // Every kept copy is the last transaction's: the tail moves to it.
        while log.live.len() > 1 {
            log.live.pop_front();
        }
        if log.live_from != Some(start) {
            (log.jsb.s_start, log.jsb.s_sequence) = (start, sequence);
            let moved = self.write_jblock(0, &log.jsb.to_bytes()).and_then(|_| self.cache.device().flush());
            if let Err(e) = moved {
                self.abort(checkpoint_site(&e), &checkpoint_failed(&e));
                return Err(e);
            }
            log.live_from = Some(start);
        }
        let mut st = self.state.lock();
        st.in_log.clear();
        st.in_log.extend(log.live.iter().flat_map(|t| t.blocks.iter().copied()));
        st.log_used = log.used();
        st.pinned = log.checkpoint.len();
        drop(st);
        self.changed.notify_all();
        Ok(())
    }

    /// Clears needs_recovery over an empty log when `flag` asks for it.
    fn clear_recovery_flag(&self, log: &mut LogState, flag: FlagAfter) -> Result<()> {
        if flag == FlagAfter::Clear && log.recovery_flag_home && log.live_from.is_none() {
            self.owner.set_needs_recovery(false)?;
            log.recovery_flag_home = false;
        }
        Ok(())
    }
}

/// An abort's reason when a checkpoint's write fails: what was committed is
/// not lost, and the user should know that before retrying the change.
fn checkpoint_failed(e: &Error) -> String {
    format!(
        "writing committed changes to their places failed (they are safe in the journal, and the next open \
         replays them): {e}"
    )
}

fn checkpoint_site(e: &Error) -> ErrorSite {
    ErrorSite { func: "journal_checkpoint", errno: e.errno() }
}

/// What a checkpoint does with needs_recovery once the log is empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FlagAfter {
    /// Leave it set: a background checkpoint, with more commits to come.
    Keep,
    /// Clear it: a sync or close, after which the image needs no journal.
    Clear,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::{BlockDevice, MemDevice};

    /// An owner with no filesystem behind it: records what the journal tells it.
    #[derive(Default)]
    struct Recorder {
        recover_flag: Mutex<Vec<bool>>,
        committed: Mutex<Vec<u64>>,
        aborted: Mutex<Option<String>>,
    }

    impl JournalOwner for Recorder {
        fn set_needs_recovery(&self, on: bool) -> Result<()> {
            self.recover_flag.lock().push(on);
            Ok(())
        }
        fn committed(&self, tid: u64) {
            self.committed.lock().push(tid);
        }
        fn aborted(&self, _site: ErrorSite, why: &str) {
            *self.aborted.lock() = Some(why.to_string());
        }
        fn error_from_previous_mount(&self, _errno: i32) {}
    }

    const BS: usize = 1024;
    const JOURNAL_AT: u64 = 100;
    const JOURNAL_LEN: u32 = 64;

    /// A device with a v2 journal superblock at block JOURNAL_AT, the journal
    /// occupying JOURNAL_LEN blocks from there.
    fn device() -> Arc<MemDevice> {
        let mut image = vec![0u8; 512 * BS];
        let mut raw = vec![0u8; BS];
        BlockHeader { h_magic: JBD2_MAGIC, h_blocktype: JBD2_SUPERBLOCK_V2, h_sequence: 0 }.write(&mut raw);
        crate::format::bytes::put_be32(&mut raw, 0xC, BS as u32);
        crate::format::bytes::put_be32(&mut raw, 0x10, JOURNAL_LEN);
        crate::format::bytes::put_be32(&mut raw, 0x14, 1);
        crate::format::bytes::put_be32(&mut raw, 0x18, 7);
        image[JOURNAL_AT as usize * BS..][..BS].copy_from_slice(&raw);
        Arc::new(MemDevice::new(image))
    }

    fn load(dev: &Arc<MemDevice>, owner: &Arc<Recorder>) -> (Arc<BufferCache>, Arc<Journal>) {
        let cache = Arc::new(BufferCache::new(dev.clone(), BS, 1));
        let map = (JOURNAL_AT..JOURNAL_AT + JOURNAL_LEN as u64).collect();
        let journal =
            Journal::load(map, cache.clone(), owner.clone(), Duration::from_secs(3600), false, false).unwrap();
        (cache, journal)
    }

    fn replay(dev: &Arc<MemDevice>) -> crate::journal::recovery::Replay {
        let mut read = |n: u32| {
            let mut v = vec![0u8; BS];
            dev.read_at((JOURNAL_AT + n as u64) * BS as u64, &mut v)?;
            Ok(v)
        };
        crate::journal::recovery::recover(&mut read).unwrap()
    }

    #[test]
    fn a_commit_writes_frozen_copies_while_the_next_transaction_changes_the_buffers() {
        let dev = device();
        let owner = Arc::new(Recorder::default());
        let (cache, journal) = load(&dev, &owner);
        let buf = cache.get(10).unwrap();
        let tid = {
            let joined = journal.join(1).unwrap();
            buf.write().fill(0xAA);
            journal.dirtied(&buf);
            joined.tid
        };
        journal.wait_committed(tid).unwrap();
        // The next transaction changes the buffer; the first one's copy is what the log holds.
        {
            let _joined = journal.join(1).unwrap();
            buf.write().fill(0xBB);
            journal.dirtied(&buf);
        }
        let r = replay(&dev);
        assert_eq!(r.transactions, 1);
        assert!(r.blocks[&10].iter().all(|&b| b == 0xAA));
        assert_eq!(*owner.committed.lock(), [tid], "the commit callback names the transaction");
        assert_eq!(*owner.recover_flag.lock(), [true]);
        journal.checkpoint_all().unwrap();
        let mut home = vec![0u8; BS];
        dev.read_at(10 * BS as u64, &mut home).unwrap();
        assert!(home.iter().all(|&b| b == 0xBB), "checkpoint writes the newest committed copy home");
        assert_eq!(replay(&dev).transactions, 0, "the log is empty after a checkpoint");
        assert_eq!(*owner.recover_flag.lock(), [true, false]);
        journal.shutdown();
    }

    #[test]
    fn needs_recovery_stays_set_between_background_checkpoints_and_a_sync_clears_it() {
        let dev = device();
        let owner = Arc::new(Recorder::default());
        let (cache, journal) = load(&dev, &owner);
        // Commits of 8 blocks each until the journal thread has checkpointed
        // (half the 64-block log, or a quarter of the 1 MiB cache, pinned).
        let mut rounds = 0;
        while journal.stats().checkpoints < 2 {
            rounds += 1;
            assert!(rounds < 100, "no background checkpoint after {rounds} commits");
            let tid = {
                let joined = journal.join(8).unwrap();
                for block in 10..18 {
                    let buf = cache.get(block).unwrap();
                    buf.write().fill(rounds as u8);
                    journal.dirtied(&buf);
                }
                joined.tid
            };
            journal.wait_committed(tid).unwrap();
        }
        assert_eq!(*owner.recover_flag.lock(), [true], "set once, before the first commit; never cleared in between");
        journal.checkpoint_all().unwrap();
        assert_eq!(*owner.recover_flag.lock(), [true, false], "a sync empties the log and clears the flag");
        journal.checkpoint_all().unwrap();
        assert_eq!(*owner.recover_flag.lock(), [true, false], "nothing to clear twice");
        let mut home = vec![0u8; BS];
        dev.read_at(17 * BS as u64, &mut home).unwrap();
        assert!(home.iter().all(|&b| b == rounds as u8));
        journal.shutdown();
    }

    #[test]
    fn a_checkpoint_leaves_hot_blocks_in_the_log_and_writes_the_rest_home() {
        let dev = device();
        let owner = Arc::new(Recorder::default());
        let (cache, journal) = load(&dev, &owner);
        // Block 10 changes in every transaction (a leaf every create touches),
        // block 20 + round in one only (an inode-table block).
        let mut round = 0u8;
        while journal.stats().blocks_kept_in_log == 0 {
            round += 1;
            assert!(round < 60, "no checkpoint kept a hot block after {round} commits");
            let tid = {
                let joined = journal.join(2).unwrap();
                for block in [10, 20 + round as u64] {
                    let buf = cache.get(block).unwrap();
                    buf.write().fill(round);
                    journal.dirtied(&buf);
                }
                joined.tid
            };
            journal.wait_committed(tid).unwrap();
        }
        journal.shutdown();
        let stats = journal.stats();
        // A crash here: recovery replays the log over the home blocks.
        let r = replay(&dev);
        let recovered = |block: u64| {
            r.blocks.get(&block).map(|b| b[0]).unwrap_or_else(|| {
                let mut home = vec![0u8; BS];
                dev.read_at(block * BS as u64, &mut home).unwrap();
                home[0]
            })
        };
        assert_eq!(recovered(10), round, "the hot block's newest committed copy survives");
        for r in 1..=round {
            assert_eq!(recovered(20 + r as u64), r, "cold block {} after recovery", 20 + r as u64);
        }
        let mut home = vec![0u8; BS];
        dev.read_at(10 * BS as u64, &mut home).unwrap();
        assert_ne!(home[0], round, "the hot block was left in the log, not written home");
        assert!(r.transactions <= 2, "the tail moved past the older transactions ({} live)", r.transactions);
        assert!(stats.blocks_written_home >= 1, "the cold blocks went home: {stats:?}");
    }

    /// Fails writes from a chosen one on.
    struct FailingWrites {
        inner: Arc<MemDevice>,
        fail: std::sync::atomic::AtomicBool,
    }

    impl BlockDevice for FailingWrites {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
            self.inner.read_at(offset, buf)
        }
        fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
            if self.fail.load(Ordering::SeqCst) {
                return Err(Error::Io(std::io::Error::from_raw_os_error(5)));
            }
            self.inner.write_at(offset, buf)
        }
        fn flush(&self) -> Result<()> {
            self.inner.flush()
        }
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn stats(&self) -> crate::dev::IoStats {
            self.inner.stats()
        }
    }

    #[test]
    fn a_failed_commit_aborts_and_keeps_its_buffers_dirty() {
        let mem = device();
        let dev = Arc::new(FailingWrites { inner: mem.clone(), fail: false.into() });
        let owner = Arc::new(Recorder::default());
        let cache = Arc::new(BufferCache::new(dev.clone(), BS, 1));
        let map = (JOURNAL_AT..JOURNAL_AT + JOURNAL_LEN as u64).collect();
        let journal =
            Journal::load(map, cache.clone(), owner.clone(), Duration::from_secs(3600), false, false).unwrap();
        let buf = cache.get(12).unwrap();
        let tid = {
            let joined = journal.join(1).unwrap();
            buf.write().fill(0xCC);
            journal.dirtied(&buf);
            joined.tid
        };
        dev.fail.store(true, Ordering::SeqCst);
        let err = journal.wait_committed(tid).unwrap_err();
        assert_eq!(err.errno(), 5, "{err}");
        assert!(owner.aborted.lock().is_some());
        assert!(buf.is_dirty(), "a failed commit hands its buffers back dirty");
        assert!(owner.committed.lock().is_empty(), "a failed commit calls no commit callback");
        assert!(matches!(journal.join(1), Err(Error::ReadOnly(_))));
        assert_eq!(replay(&mem).transactions, 0, "nothing half-written is replayed");
        journal.shutdown();
    }

    #[test]
    fn a_large_change_is_split_at_handle_boundaries() {
        let dev = device();
        let owner = Arc::new(Recorder::default());
        let (cache, journal) = load(&dev, &owner);
        // 200 blocks in handles of 4: far more than the 63-block log holds at once.
        for h in 0..50u64 {
            let _joined = journal.join(4).unwrap();
            for i in 0..4 {
                let buf = cache.get(200 + h * 2 + i % 2).unwrap();
                buf.write()[0] = h as u8;
                journal.dirtied(&buf);
            }
        }
        journal.checkpoint_all().unwrap();
        let stats = journal.stats();
        assert!(stats.commits >= 2, "{stats:?}");
        assert!(owner.aborted.lock().is_none());
        journal.shutdown();
    }
}
