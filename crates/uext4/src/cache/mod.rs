//! The bounded buffer cache.
//!
//! Blocks are shared as `Arc<Buffer>`; a block held in the cache is never read from
//! the device again while it stays, and its checksum is verified once (`verified`),
//! not on every access. Capacity is `cache_mb` worth of blocks, split over shards
//! so that threads touching different blocks rarely meet on a lock. Eviction is a
//! clock: recently used buffers get a second chance, and buffers still held by a
//! caller or dirty are never evicted.
//!
//! Every buffer that turns dirty is put on one dirty list, so neither a commit nor a
//! write-back ever scans the whole cache: with a journal the list is the running
//! transaction's (the commit takes it whole, `take_dirty`); without one it is what
//! `flush` and the write-back thread (`start_writeback`) write home, sorted by block.
//!
//! File data is not cached, but the cache is the seam it passes: small files' new
//! blocks wait in `write_behind.rs` until the next commit (or write-back, which
//! sends them before any metadata), and every other file-data read or write goes
//! through `write_data_at`/`read_data_at` so that none overtakes a waiting block.
//!
//! The bound holds because whoever makes buffers unevictable also drains them
//! before they fill the cache: the journal commits once the dirty list reaches a
//! quarter of the capacity, and makes new handles wait at a half; it checkpoints
//! (unpinning committed buffers) once a quarter is pinned; the write-back thread
//! writes home past a quarter. What remains is the slack of the shards: each
//! evicts on its own, so the cache may exceed `capacity()` by at most
//! `capacity() / 4` blocks held unevictable in excess of their fair share in one
//! shard, plus the buffers callers hold at that moment, plus up to
//! `memo::MEMO_SLOTS` (8) directory, extent or xattr blocks each thread that
//! used the cache remembers (`lookup_remembered`) for as long as it lives
//! (`RESIDENT_SLACK_BLOCKS` states a bound for tests, of up to 16 threads).

mod write_behind;

use write_behind::WriteBehind;
pub(crate) use write_behind::WRITE_BEHIND_RUN_MAX;

use crate::dev::{BlockDevice, IoClass};
use crate::error::Result;
use crate::number_map::NumberMap;
use crate::padded::CachePadded;
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SHARDS: usize = 16;

pub struct Buffer {
    pub block: u64,
    data: RwLock<Box<[u8]>>,
    verified: AtomicBool,
    dirty: AtomicBool,
    referenced: AtomicBool,
    /// Set when `forget` drops it: a thread's memo may still hold it, and must
    /// not hand it out for the block's next life.
    forgotten: AtomicBool,
}

impl Buffer {
    pub fn read(&self) -> RwLockReadGuard<'_, Box<[u8]>> {
        self.data.read()
    }

    /// Write access; the caller marks the buffer dirty through the cache (or the
    /// transaction handle) once it has changed it.
    pub fn write(&self) -> RwLockWriteGuard<'_, Box<[u8]>> {
        self.data.write()
    }

    pub fn is_verified(&self) -> bool {
        self.verified.load(Ordering::Acquire)
    }

    pub fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
    }
}

#[derive(Default)]
struct Shard {
    map: NumberMap<u64, Arc<Buffer>>,
    clock: VecDeque<u64>,
    /// Lookups that found their block, counted here under the shard's lock:
    /// one counter for the whole cache was a line every lookup of every
    /// thread wrote.
    hits: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub checksum_verifications: u64,
}

pub struct BufferCache {
    dev: Arc<dyn BlockDevice>,
    block_size: usize,
    shards: Vec<CachePadded<Mutex<Shard>>>,
    shard_capacity: usize,
    misses: AtomicU64,
    evictions: AtomicU64,
    verifications: AtomicU64,
    /// Buffers that turned dirty since the list was last taken (some may have
    /// been cleaned or forgotten since: takers skip those).
    dirty: Mutex<Vec<Arc<Buffer>>>,
    dirty_count: AtomicUsize,
    /// This cache among all caches of the process, for the memos.
    id: u64,
    /// Lookups answered by a thread's memo, counted per thread slot so that
    /// counting writes no line another thread writes.
    memo_hits: Vec<CachePadded<AtomicU64>>,
    /// New data of small files waiting to be written (write_behind.rs).
    data: WriteBehind,
}

thread_local!(static BUFFER_MEMO: std::cell::RefCell<crate::memo::Memo<Buffer>> = Default::default());

/// Counter slots for per-thread statistics.
const THREAD_SLOTS: usize = 16;

/// This thread's counter slot: threads numbered as they first ask.
fn thread_slot() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed) % THREAD_SLOTS);
    SLOT.try_with(|s| *s).unwrap_or(0)
}

/// Blocks the cache may hold beyond `capacity()` under any workload whose
/// unevictable buffers its owner keeps under three quarters of the capacity (see
/// the module comment): one shard's excess plus buffers held by callers, plus
/// what the memos of up to 16 threads remember.
pub const RESIDENT_SLACK_BLOCKS: usize = 256 + 16 * crate::memo::MEMO_SLOTS;

impl BufferCache {
    pub fn new(dev: Arc<dyn BlockDevice>, block_size: usize, cache_mb: usize) -> BufferCache {
        let capacity = (cache_mb.max(1) << 20) / block_size;
        BufferCache {
            dev,
            block_size,
            shards: (0..SHARDS).map(|_| CachePadded::default()).collect(),
            shard_capacity: (capacity / SHARDS).max(4),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            verifications: AtomicU64::new(0),
            dirty: Mutex::new(Vec::new()),
            dirty_count: AtomicUsize::new(0),
            id: crate::memo::next_owner_id(),
            memo_hits: (0..THREAD_SLOTS).map(|_| CachePadded::default()).collect(),
            data: WriteBehind::new(block_size),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    fn shard(&self, block: u64) -> &Mutex<Shard> {
        &self.shards[crate::number_map::shard_of(block, SHARDS)]
    }

    /// The buffer for `block`, read from the device on a miss.
    pub fn get(&self, block: u64) -> Result<Arc<Buffer>> {
        if let Some(b) = self.lookup(block) {
            return Ok(b);
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let mut data = vec![0u8; self.block_size].into_boxed_slice();
        self.dev.read_at(block * self.block_size as u64, &mut data)?;
        Ok(self.insert(block, data))
    }

    /// The buffer for `block`, with `verify` run on its contents the first time it is
    /// loaded (checksum and structure checks); later gets skip it.
    pub fn get_verified(&self, block: u64, verify: impl FnOnce(&[u8]) -> Result<()>) -> Result<Arc<Buffer>> {
        let b = self.get(block)?;
        self.verify_once(&b, verify)?;
        Ok(b)
    }

    /// As `get_verified`, for a block whose role the geometry does not tell
    /// (see `classify`): it is classified only when it is not cached, before
    /// it is read. A cached block was classified when it came in (read or
    /// made) and keeps its class until `forget`; classifying on every get put
    /// a shared map's lock on the path of every directory block access.
    pub fn get_verified_as(
        &self,
        block: u64,
        class: IoClass,
        verify: impl FnOnce(&[u8]) -> Result<()>,
    ) -> Result<Arc<Buffer>> {
        let b = match self.lookup_remembered(block) {
            Some(b) => b,
            None => {
                self.classify(block, class);
                self.get(block)?
            }
        };
        self.verify_once(&b, verify)?;
        Ok(b)
    }

    fn verify_once(&self, b: &Buffer, verify: impl FnOnce(&[u8]) -> Result<()>) -> Result<()> {
        if !b.is_verified() {
            self.verifications.fetch_add(1, Ordering::Relaxed);
            verify(&b.read())?;
            b.verified.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// A buffer for a block whose old contents do not matter (newly allocated):
    /// zero-filled, not read from the device.
    pub fn get_new(&self, block: u64) -> Arc<Buffer> {
        if let Some(b) = self.lookup(block) {
            b.write().fill(0);
            return b;
        }
        self.insert(block, vec![0u8; self.block_size].into_boxed_slice())
    }

    /// Loads the blocks of `start..start + count` that are not cached, reading
    /// the whole run in one device request (remove_tree's inode-table
    /// read-ahead: one request for 32 blocks instead of 32). Blocks cached
    /// already keep their contents, which may be newer than the device's; a
    /// block loaded by another thread meanwhile is kept too, as `get` does.
    pub fn read_ahead(&self, start: u64, count: usize) -> Result<()> {
        let missing = (start..start + count as u64).filter(|&b| !self.holds(b)).count();
        if missing == 0 {
            return Ok(());
        }
        let bs = self.block_size;
        let mut data = vec![0u8; count * bs];
        self.dev.read_at(start * bs as u64, &mut data)?;
        self.misses.fetch_add(missing as u64, Ordering::Relaxed);
        for (i, chunk) in data.chunks_exact(bs).enumerate() {
            let block = start + i as u64;
            if !self.holds(block) {
                self.insert(block, chunk.to_vec().into_boxed_slice());
            }
        }
        Ok(())
    }

    /// Whether `block` is in the cache now.
    pub fn holds(&self, block: u64) -> bool {
        self.shard(block).lock().map.contains_key(&block)
    }

    /// The buffer of `block` if it is cached now (a hit, counted as one), never
    /// reading: for callers with another way to make a missing block.
    pub fn cached(&self, block: u64) -> Option<Arc<Buffer>> {
        self.lookup(block)
    }

    /// The cached buffer of `block`, from this thread's memo when it
    /// remembers it (see `memo.rs`: an htree root or leaf that every change
    /// of names in its directory reads was a shard mutex every thread wrote),
    /// else from its shard. Only for directory, extent and xattr blocks
    /// (`get_verified_as`): remembered inode-table blocks of a walk stayed
    /// pinned in a small cache while the read-ahead of the next needed room.
    fn lookup_remembered(&self, block: u64) -> Option<Arc<Buffer>> {
        // A thread that is exiting (its memo dropped) looks in the shard.
        let remembered = BUFFER_MEMO.try_with(|memo| {
            let mut memo = memo.borrow_mut();
            if let Some(b) = memo.find(self.id, block).filter(|b| !b.forgotten.load(Ordering::Acquire)) {
                self.memo_hits[thread_slot()].fetch_add(1, Ordering::Relaxed);
                return Some(b.clone());
            }
            let b = self.lookup(block)?;
            memo.remember(self.id, block, b.clone());
            Some(b)
        });
        remembered.unwrap_or_else(|_| self.lookup(block))
    }

    /// The cached buffer of `block`, from its shard.
    fn lookup(&self, block: u64) -> Option<Arc<Buffer>> {
        let mut shard = self.shard(block).lock();
        let b = shard.map.get(&block)?.clone();
        shard.hits += 1;
        // Written only when clear: blocks every operation reads (an htree root,
        // a bitmap) would otherwise have their line taken by each reader.
        if !b.referenced.load(Ordering::Relaxed) {
            b.referenced.store(true, Ordering::Relaxed);
        }
        Some(b)
    }

    fn insert(&self, block: u64, data: Box<[u8]>) -> Arc<Buffer> {
        let mut shard = self.shard(block).lock();
        // Another thread may have loaded the same block meanwhile; keep one copy.
        if let Some(b) = shard.map.get(&block) {
            return b.clone();
        }
        let buf = Arc::new(Buffer {
            block,
            data: RwLock::new(data),
            verified: AtomicBool::new(false),
            dirty: AtomicBool::new(false),
            referenced: AtomicBool::new(false),
            forgotten: AtomicBool::new(false),
        });
        shard.map.insert(block, buf.clone());
        shard.clock.push_back(block);
        self.evict(&mut shard);
        buf
    }

    fn evict(&self, shard: &mut Shard) {
        let mut budget = shard.clock.len() * 2;
        while shard.map.len() > self.shard_capacity && budget > 0 {
            budget -= 1;
            let Some(block) = shard.clock.pop_front() else {
                break;
            };
            let Some(b) = shard.map.get(&block) else {
                continue;
            };
            let in_use = Arc::strong_count(b) > 1;
            if in_use || b.is_dirty() || b.referenced.swap(false, Ordering::Relaxed) {
                shard.clock.push_back(block);
                continue;
            }
            shard.map.remove(&block);
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Drops every buffer nobody holds that is clean (the kernel's drop_caches):
    /// the next access reads it from the device again. Returns how many went.
    ///
    /// Buffers other threads' memos remember (at most `MEMO_SLOTS` each) count
    /// as held and stay; the calling thread's own are let go first.
    pub fn drop_clean(&self) -> usize {
        let _ = BUFFER_MEMO.try_with(|memo| memo.borrow_mut().forget_owner(self.id));
        let mut dropped = 0;
        for shard in &self.shards {
            let mut shard = shard.lock();
            let before = shard.map.len();
            shard.map.retain(|_, b| Arc::strong_count(b) > 1 || b.is_dirty());
            let map = &shard.map;
            let kept: VecDeque<u64> = shard.clock.iter().copied().filter(|b| map.contains_key(b)).collect();
            shard.clock = kept;
            dropped += before - shard.map.len();
        }
        self.evictions.fetch_add(dropped as u64, Ordering::Relaxed);
        dropped
    }

    /// Queues the `count` fresh blocks from `first`, which `ino`'s write just
    /// took, holding `data` from byte `at` of the first and zeros around it:
    /// written before the next commit (write_behind.rs). For runs of at most
    /// `WRITE_BEHIND_RUN_MAX` blocks.
    pub(crate) fn queue_data(&self, ino: u32, first: u64, count: u64, at: usize, data: &[u8]) {
        self.data.queue(&*self.dev, ino, first, count, at, data);
    }

    /// Writes file data (or zeros over it) at byte `pos` of the device; the one
    /// way file data is written besides `queue_data`, so a waiting block is
    /// never overtaken.
    ///
    /// # Errors
    /// `Io` when the device fails.
    pub(crate) fn write_data_at(&self, pos: u64, bytes: &[u8]) -> Result<()> {
        self.data.write_at(&*self.dev, pos, bytes)
    }

    /// Reads file data at byte `pos` of the device, waiting blocks included.
    ///
    /// # Errors
    /// `Io` when the device fails.
    pub(crate) fn read_data_at(&self, pos: u64, buf: &mut [u8]) -> Result<()> {
        self.data.read_at(&*self.dev, pos, buf)
    }

    /// Writes any waiting block among the `len` bytes at `pos`, for a reader
    /// that takes them from the device itself (the mount's spliced replies).
    pub(crate) fn settle_data(&self, pos: u64, len: u64) {
        self.data.settle(&*self.dev, pos, len);
    }

    /// Writes every waiting data block (before a commit or a write-back).
    pub(crate) fn send_data(&self) {
        self.data.send(&*self.dev);
    }

    /// Whether `ino`'s waiting data failed to reach the device since last asked.
    pub(crate) fn take_data_failure(&self, ino: u32) -> bool {
        self.data.take_failure(ino)
    }

    /// Whether any waiting data failed to reach the device since last asked.
    pub(crate) fn take_any_data_failure(&self) -> bool {
        self.data.take_any_failure()
    }

    /// Says what `block` holds, for the device's I/O model (nothing happens
    /// without one): the layers that read or make blocks whose role the geometry
    /// does not tell (directory blocks, extent nodes, xattr blocks) call it
    /// before the block's first request. The class lasts until `forget`.
    pub fn classify(&self, block: u64, class: IoClass) {
        if let Some(model) = self.dev.io_model() {
            model.classes().tag(block, class);
        }
    }

    /// Drops a block that was freed: a dirty copy must never be written back over
    /// whatever the block holds next (file data is written behind the cache), nor
    /// a small file's data still waiting for it (write_behind.rs).
    pub fn forget(&self, block: u64) {
        self.data.forget(block);
        if let Some(model) = self.dev.io_model() {
            model.classes().untag(block);
        }
        if let Some(b) = self.shard(block).lock().map.remove(&block) {
            b.forgotten.store(true, Ordering::Release);
            b.dirty.store(false, Ordering::Release);
        }
    }

    /// Marks the buffer dirty, putting it on the dirty list if it was clean;
    /// returns whether it was clean before.
    pub fn mark_dirty(&self, buf: &Arc<Buffer>) -> bool {
        // A block we wrote ourselves carries checksums we computed. Both flags
        // are read before they are written: threads changing one block (a
        // group's bitmap and descriptors, a shared inode-table block) mark it
        // dirty again and again, and a write would take the line from the others.
        // A buffer seen dirty is on the dirty list, and what clears the flag
        // (a commit, a write-back) reads the contents after clearing it.
        if !buf.verified.load(Ordering::Relaxed) {
            buf.verified.store(true, Ordering::Release);
        }
        if buf.dirty.load(Ordering::Acquire) {
            return false;
        }
        let was_clean = !buf.dirty.swap(true, Ordering::AcqRel);
        if was_clean {
            self.dirty.lock().push(buf.clone());
            self.dirty_count.fetch_add(1, Ordering::Relaxed);
        }
        was_clean
    }

    /// Buffers on the dirty list (an upper bound of the dirty buffers).
    pub fn dirty_count(&self) -> usize {
        self.dirty_count.load(Ordering::Relaxed)
    }

    /// Takes the dirty list, in block order, with a copy of every buffer's contents
    /// (the frozen copy a commit writes while handles go on changing the buffer),
    /// and marks them clean: the journal's commit owns them from here. The caller
    /// keeps buffers from changing meanwhile (the journal closes its gate).
    pub fn take_dirty(&self) -> Vec<(Arc<Buffer>, Box<[u8]>)> {
        self.take_dirty_list()
            .into_iter()
            .map(|b| {
                b.dirty.store(false, Ordering::Release);
                let copy = b.read().clone();
                (b, copy)
            })
            .collect()
    }

    fn take_dirty_list(&self) -> Vec<Arc<Buffer>> {
        let mut list = std::mem::take(&mut *self.dirty.lock());
        self.dirty_count.fetch_sub(list.len(), Ordering::Relaxed);
        list.retain(|b| b.is_dirty());
        list.sort_by_key(|b| b.block);
        list.dedup_by_key(|b| b.block);
        list
    }

    /// Puts buffers back on the dirty list: a commit that could not write them
    /// hands them back dirty, so the cache neither evicts nor forgets their state.
    pub fn redirty(&self, bufs: impl IntoIterator<Item = Arc<Buffer>>) {
        for b in bufs {
            self.mark_dirty(&b);
        }
    }

    /// Writes every dirty buffer, in block order, then flushes the device.
    pub fn flush(&self) -> Result<()> {
        self.write_back()?;
        self.dev.flush()
    }

    /// Writes every buffer on the dirty list home (without a flush).
    fn write_back(&self) -> Result<()> {
        // Ordered data: what the metadata about to go home maps, first.
        self.send_data();
        let dirty = self.take_dirty_list();
        let mut rest = dirty.into_iter();
        for b in rest.by_ref() {
            // Clear first: a change racing with the write re-marks it for the next flush.
            b.dirty.store(false, Ordering::Release);
            let result = self.dev.write_at(b.block * self.block_size as u64, &b.read());
            if let Err(e) = result {
                self.mark_dirty(&b);
                self.redirty(rest);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Starts the write-back thread of a cache without a journal: it writes the
    /// dirty list home once it passes a quarter of the capacity, and every
    /// `interval` whatever its length, so the cache keeps its bound and a crash
    /// loses at most `interval` of changes. Ends when the returned guard drops.
    pub fn start_writeback(self: &Arc<Self>, interval: Duration) -> Result<Writeback> {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let wake = Arc::new((Mutex::new(false), parking_lot::Condvar::new()));
        let cache = Arc::downgrade(self);
        let wake2 = wake.clone();
        let thread = std::thread::Builder::new().name("uext4-writeback".into()).spawn(move || {
            let tick = Duration::from_millis(50);
            let mut last = std::time::Instant::now();
            loop {
                {
                    let mut woken = wake2.0.lock();
                    if !*woken {
                        wake2.1.wait_for(&mut woken, tick);
                    }
                    *woken = false;
                }
                if !matches!(stopped.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty)) {
                    return;
                }
                let Some(cache) = cache.upgrade() else { return };
                let due = cache.dirty_count() > cache.capacity() / 4
                    || (cache.dirty_count() > 0 && last.elapsed() >= interval);
                if due {
                    last = std::time::Instant::now();
                    if let Err(e) = cache.write_back() {
                        eprintln!("uext4: write-back failed: {e}");
                    }
                }
            }
        })?;
        Ok(Writeback { stop: Some(stop), wake, thread: Some(thread) })
    }

    /// Bytes of block data resident in the cache.
    pub fn resident_bytes(&self) -> usize {
        self.len() * self.block_size
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        self.shard_capacity * SHARDS
    }

    /// Wakes the write-back thread (if any) when the dirty list has grown.
    pub(crate) fn dirty_pressure(&self) -> bool {
        self.dirty_count() > self.capacity() / 4
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.shards.iter().map(|s| s.lock().hits).sum::<u64>()
                + self.memo_hits.iter().map(|h| h.load(Ordering::Relaxed)).sum::<u64>(),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            checksum_verifications: self.verifications.load(Ordering::Relaxed),
        }
    }
}

/// The running write-back thread; dropping it stops the thread (after the write it
/// may be doing).
pub struct Writeback {
    stop: Option<std::sync::mpsc::Sender<()>>,
    wake: Arc<(Mutex<bool>, parking_lot::Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writeback {
    /// Asks the thread to look at the dirty list now.
    pub fn kick(&self) {
        *self.wake.0.lock() = true;
        self.wake.1.notify_one();
    }
}

impl Drop for Writeback {
    fn drop(&mut self) {
        drop(self.stop.take());
        self.kick();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemDevice;

    #[test]
    fn a_remembered_directory_block_is_never_handed_out_after_it_is_forgotten() {
        let dev = Arc::new(MemDevice::new(vec![1u8; 64 * 1024]));
        let cache = BufferCache::new(dev.clone(), 1024, 1);
        let ok = |_: &[u8]| Ok(());
        let first = cache.get_verified_as(7, IoClass::Directory, ok).unwrap();
        let again = cache.get_verified_as(7, IoClass::Directory, ok).unwrap();
        assert!(Arc::ptr_eq(&first, &again), "one buffer per block, remembered or not");
        drop((first, again));
        assert_eq!(cache.drop_clean(), 1, "this thread's memo let go of it");
        let remembered = cache.get_verified_as(7, IoClass::Directory, ok).unwrap();
        drop(cache.get_verified_as(7, IoClass::Directory, ok).unwrap());
        // Freed, then written anew behind the cache (as file data is).
        cache.forget(7);
        dev.write_at(7 * 1024, &[2u8; 1024]).unwrap();
        let next_life = cache.get_verified_as(7, IoClass::Directory, ok).unwrap();
        assert!(!Arc::ptr_eq(&remembered, &next_life));
        assert_eq!(next_life.read()[0], 2, "the forgotten buffer came back from the memo");
        // Other threads find the same buffer as this one.
        std::thread::scope(|s| {
            s.spawn(|| assert!(Arc::ptr_eq(&cache.get(7).unwrap(), &next_life)));
        });
    }

    #[test]
    fn read_ahead_loads_a_run_in_one_request_and_keeps_cached_blocks() {
        let dev = Arc::new(MemDevice::new((0..256u32 * 1024).map(|i| (i / 1024) as u8).collect()));
        let cache = BufferCache::new(dev.clone(), 1024, 1);
        let held = cache.get(35).unwrap();
        held.write()[0] = 0xee;
        let before = dev.stats().reads;
        cache.read_ahead(32, 32).unwrap();
        assert_eq!(dev.stats().reads, before + 1, "one request for the run");
        for blk in 32..64u64 {
            assert!(cache.holds(blk));
            let want = if blk == 35 { 0xee } else { blk as u8 };
            assert_eq!(cache.get(blk).unwrap().read()[0], want, "block {blk}");
        }
        assert_eq!(dev.stats().reads, before + 1, "the run was served from the cache");
        cache.read_ahead(32, 32).unwrap();
        assert_eq!(dev.stats().reads, before + 1, "nothing missing, nothing read");
    }

    #[test]
    fn cache_stays_bounded_and_never_rereads_a_held_block() {
        let dev = Arc::new(MemDevice::new((0..4096u32 * 1024).map(|i| (i / 1024) as u8).collect()));
        let cache = BufferCache::new(dev.clone(), 1024, 1);
        for round in 0..3 {
            for blk in 0..4096u64 {
                let b = cache.get(blk).unwrap();
                assert_eq!(b.read()[0], blk as u8, "round {round}");
            }
            assert!(cache.len() <= cache.capacity() + SHARDS, "{} > {}", cache.len(), cache.capacity());
        }
        let before = dev.stats().reads;
        let held = cache.get(7).unwrap();
        for _ in 0..100 {
            cache.get(7).unwrap();
        }
        assert!(dev.stats().reads <= before + 1);
        drop(held);
        let mut verified = 0;
        for _ in 0..5 {
            cache
                .get_verified(9, |_| {
                    verified += 1;
                    Ok(())
                })
                .unwrap();
        }
        assert_eq!(verified, 1, "a cached block is verified once");
    }

    #[test]
    fn the_dirty_list_is_what_gets_written_and_the_write_back_thread_keeps_the_bound() {
        let dev = Arc::new(MemDevice::new(vec![0u8; 4096 * 1024]));
        let cache = Arc::new(BufferCache::new(dev.clone(), 1024, 1));
        let a = cache.get(3).unwrap();
        a.write().fill(7);
        assert!(cache.mark_dirty(&a));
        assert!(!cache.mark_dirty(&a), "dirty once, listed once");
        let gone = cache.get(4).unwrap();
        gone.write().fill(8);
        cache.mark_dirty(&gone);
        cache.forget(4);
        let taken = cache.take_dirty();
        assert_eq!(taken.iter().map(|(b, _)| b.block).collect::<Vec<_>>(), [3], "a forgotten block is never written");
        assert!(taken[0].1.iter().all(|&x| x == 7) && !a.is_dirty());
        assert_eq!(cache.dirty_count(), 0);

        // Without a journal: the write-back thread writes the list home on its
        // own, and the cache stays within its bound while 4,000 blocks are dirtied.
        let _writeback = cache.start_writeback(Duration::from_secs(3600)).unwrap();
        let mut peak = 0;
        for blk in 0..4000u64 {
            let b = cache.get(blk).unwrap();
            b.write()[0] = blk as u8 | 1;
            cache.mark_dirty(&b);
            drop(b);
            if cache.dirty_pressure() {
                _writeback.kick();
                while cache.dirty_count() > cache.capacity() / 2 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            peak = peak.max(cache.len());
        }
        assert!(peak <= cache.capacity() + RESIDENT_SLACK_BLOCKS, "{peak} blocks resident");
        cache.flush().unwrap();
        let mut block = [0u8; 1024];
        dev.read_at(3999 * 1024, &mut block).unwrap();
        assert_eq!(block[0], (3999u64 as u8) | 1);
    }
}
