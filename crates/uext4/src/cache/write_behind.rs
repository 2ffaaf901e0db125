//! Write-behind of small files' new data: the blocks a write takes for a hole
//! wait here, in memory, and go to the device sorted by block, together with
//! the others waiting, when the transaction that maps them commits (or when
//! `WRITE_BEHIND_BLOCKS` wait, or on a read or overwrite of one of them, or
//! just before a run too long to wait is written: its blocks were taken after
//! theirs, mostly just above them, and the device then sees one sweep).
//! This is the kernel's write-back of ordered data, kept small: written one
//! by one as they came, a round of small files made in many directories costs
//! a disk seek per file between the directory blocks and the data area; sorted
//! at commit they stream (seed 000's create experiment, docs/BENCHMARKS.md).
//!
//! Only runs of up to `WRITE_BEHIND_RUN_MAX` fresh blocks wait (the kernel's
//! mballoc treats files below 16 blocks as small, `mb_stream_req`); larger runs
//! and overwrites of mapped blocks go to the device at once, as before.
//!
//! A send takes the whole queue under its lock and writes it outside, one
//! send at a time, so other writers go on queueing meanwhile.
//!
//! Invariants, under `queued`'s lock:
//! - a block waits at most once, with its whole content, queued or in flight;
//!   what reads or writes its bytes on the device first sends it or waits for
//!   the send that carries it (or patches the queued copy);
//! - a freed block stops waiting (`forget`): its data must never land on the
//!   block's next owner (one in flight lands before the commit that lets the
//!   block be handed out again);
//! - everything waiting reaches the device before the commit block of any
//!   transaction that closed after it was queued (ordered data), so a commit
//!   never maps a block whose bytes are not on disk.
//!
//! A failed write is remembered against the inode that wrote the block and
//! reported by that inode's next `fsync` (and by the next `sync`), as the
//! kernel reports write-back errors; the filesystem does not fail for it.

use crate::dev::BlockDevice;
use crate::error::Result;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Blocks that may wait before the writer that adds one sends them all.
pub(crate) const WRITE_BEHIND_BLOCKS: usize = 1024;

/// The longest run of fresh blocks that waits; longer runs are one request
/// already and go at once.
pub(crate) const WRITE_BEHIND_RUN_MAX: u64 = 16;

/// Waiting blocks: block number -> (the inode that wrote it, its content).
type Waiting = BTreeMap<u64, (u32, Box<[u8]>)>;

pub(crate) struct WriteBehind {
    block_size: usize,
    queued: Mutex<Waiting>,
    /// The blocks a send is writing, out of `queued`'s lock (taken under it):
    /// whoever touches one of them waits for that send (`sending`).
    in_flight: Mutex<Option<Arc<Waiting>>>,
    /// Held by the one send under way.
    sending: Mutex<()>,
    /// How many blocks wait or are being sent: lets reads and writes skip the
    /// locks when none do.
    waiting: AtomicUsize,
    /// Inodes whose waiting data the device refused, not yet reported.
    failed: Mutex<HashSet<u32>>,
}

impl WriteBehind {
    pub(crate) fn new(block_size: usize) -> WriteBehind {
        WriteBehind {
            block_size,
            queued: Mutex::new(BTreeMap::new()),
            in_flight: Mutex::new(None),
            sending: Mutex::new(()),
            waiting: AtomicUsize::new(0),
            failed: Mutex::new(HashSet::new()),
        }
    }

    /// Queues the `count` fresh blocks from `first`, holding `data` from byte
    /// `at` of the first and zeros around it (what a write into a hole leaves
    /// of them). Sends everything waiting when that makes more than
    /// `WRITE_BEHIND_BLOCKS`.
    ///
    /// # Errors
    /// None of its own: a failed send is remembered for `fsync` (see the module).
    pub(crate) fn queue(&self, dev: &dyn BlockDevice, ino: u32, first: u64, count: u64, at: usize, data: &[u8]) {
        let bs = self.block_size;
        debug_assert!(at + data.len() <= count as usize * bs);
        // Each block made from zeros and its part of `data`, outside the lock.
        let blocks: Vec<Box<[u8]>> = (0..count as usize)
            .map(|i| {
                let mut block = vec![0u8; bs].into_boxed_slice();
                let (from, to) = ((i * bs).max(at), ((i + 1) * bs).min(at + data.len()));
                if from < to {
                    block[from - i * bs..to - i * bs].copy_from_slice(&data[from - at..to - at]);
                }
                block
            })
            .collect();
        let full = {
            let mut queued = self.queued.lock();
            for (block, content) in (first..).zip(blocks) {
                if queued.insert(block, (ino, content)).is_none() {
                    self.waiting.fetch_add(1, Ordering::Relaxed);
                }
            }
            queued.len() > WRITE_BEHIND_BLOCKS
        };
        if full {
            self.send(dev);
        }
    }

    /// Writes `bytes` at byte `pos` of the device, where file data lives: a
    /// write inside one waiting block patches the waiting copy; one touching
    /// waiting blocks otherwise sends them first.
    ///
    /// # Errors
    /// `Io` when the device fails the write (or what it had to send first).
    pub(crate) fn write_at(&self, dev: &dyn BlockDevice, pos: u64, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        if self.waiting.load(Ordering::Acquire) > 0 && self.settle_range(dev, pos, bytes.len() as u64, Some(bytes)) {
            return Ok(());
        }
        dev.write_at(pos, bytes)
    }

    /// Reads `buf.len()` bytes at byte `pos` of the device after sending any
    /// waiting block among them.
    ///
    /// # Errors
    /// `Io` when the device fails.
    pub(crate) fn read_at(&self, dev: &dyn BlockDevice, pos: u64, buf: &mut [u8]) -> Result<()> {
        self.settle(dev, pos, buf.len() as u64);
        dev.read_at(pos, buf)
    }

    /// Sends every waiting block among the `len` bytes at `pos`, for a caller
    /// that reads them from the device by other means (spliced replies).
    pub(crate) fn settle(&self, dev: &dyn BlockDevice, pos: u64, len: u64) {
        if len == 0 || self.waiting.load(Ordering::Acquire) == 0 {
            return;
        }
        self.settle_range(dev, pos, len, None);
    }

    /// Sends (or waits for the send of) whatever waits among the `len` bytes
    /// at `pos`; with `patch`, the bytes to write there, which patch the
    /// waiting copy instead when they lie inside one queued block (returns
    /// true then).
    fn settle_range(&self, dev: &dyn BlockDevice, pos: u64, len: u64, patch: Option<&[u8]>) -> bool {
        let bs = self.block_size as u64;
        let (first, last) = (pos / bs, (pos + len - 1) / bs);
        {
            let mut queued = self.queued.lock();
            if let (Some(bytes), true) = (patch, first == last) {
                if let Some((_, block)) = queued.get_mut(&first) {
                    let at = (pos % bs) as usize;
                    block[at..at + bytes.len()].copy_from_slice(bytes);
                    return true;
                }
            }
            // Under `queued`'s lock a batch is either still queued or in flight.
            let touched = |w: &Waiting| w.range(first..=last).next().is_some();
            if !touched(&queued) && !self.in_flight.lock().as_deref().is_some_and(touched) {
                return false;
            }
        }
        // Waits for a send under way, then sends what is queued.
        self.send(dev);
        false
    }

    /// Sends everything waiting, sorted by block (before a commit, a sync),
    /// after the send under way if there is one: when it returns, everything
    /// queued before the call is on the device.
    pub(crate) fn send(&self, dev: &dyn BlockDevice) {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return;
        }
        let _one_at_a_time = self.sending.lock();
        let batch = {
            let mut queued = self.queued.lock();
            if queued.is_empty() {
                return;
            }
            let batch = Arc::new(std::mem::take(&mut *queued));
            *self.in_flight.lock() = Some(batch.clone());
            batch
        };
        self.write_batch(dev, &batch);
        *self.in_flight.lock() = None;
        // Only now: a reader that skips the locks because none wait must find
        // them on the device.
        self.waiting.fetch_sub(batch.len(), Ordering::Release);
    }

    /// `block` was freed: whatever waits for it is dropped. (A block already
    /// in flight is written anyway: a freed block is handed out again only
    /// after the commit, whose send waits for this one.)
    pub(crate) fn forget(&self, block: u64) {
        if self.waiting.load(Ordering::Relaxed) == 0 {
            return;
        }
        if self.queued.lock().remove(&block).is_some() {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether data `ino` queued failed to reach the device since the last
    /// report; reporting clears it.
    pub(crate) fn take_failure(&self, ino: u32) -> bool {
        self.failed.lock().remove(&ino)
    }

    /// Whether any queued data failed since the last report; clears them all.
    pub(crate) fn take_any_failure(&self) -> bool {
        let mut failed = self.failed.lock();
        let any = !failed.is_empty();
        failed.clear();
        any
    }

    /// Writes a batch in block order, a run of one inode's neighbours as one
    /// request; a refused request is remembered against its inode.
    fn write_batch(&self, dev: &dyn BlockDevice, batch: &Waiting) {
        let bs = self.block_size as u64;
        let mut blocks = batch.iter().peekable();
        while let Some((&first, (ino, data))) = blocks.next() {
            let mut run = data.to_vec();
            let mut next = first + 1;
            while let Some((_, (_, more))) = blocks.next_if(|(&b, (i, _))| b == next && i == ino) {
                run.extend_from_slice(more);
                next += 1;
            }
            if dev.write_at(first * bs, &run).is_err() {
                self.failed.lock().insert(*ino);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemDevice;

    const BS: usize = 1024;

    fn device() -> MemDevice {
        MemDevice::new(vec![0u8; 64 * BS])
    }

    #[test]
    fn waiting_blocks_are_read_and_patched_as_if_written() {
        let dev = device();
        let wb = WriteBehind::new(BS);
        wb.queue(&dev, 12, 5, 2, 0, &[1u8; 2 * BS]);
        let mut raw = vec![0u8; BS];
        dev.read_at(5 * BS as u64, &mut raw).unwrap();
        assert!(raw.iter().all(|&b| b == 0), "nothing is written yet");
        wb.write_at(&dev, 6 * BS as u64 + 10, &[2u8; 4]).unwrap();
        let mut back = vec![0u8; 2 * BS];
        wb.read_at(&dev, 5 * BS as u64, &mut back).unwrap();
        assert!(back[..BS + 10].iter().all(|&b| b == 1));
        assert_eq!(&back[BS + 10..BS + 14], &[2u8; 4]);
        assert!(back[BS + 14..].iter().all(|&b| b == 1));
        assert_eq!(wb.waiting.load(Ordering::Relaxed), 0, "the read sent them");
    }

    #[test]
    fn a_freed_block_never_reaches_the_device() {
        let dev = device();
        let wb = WriteBehind::new(BS);
        wb.queue(&dev, 12, 7, 1, 0, &[9u8; BS]);
        wb.forget(7);
        wb.send(&dev);
        let mut raw = vec![1u8; BS];
        dev.read_at(7 * BS as u64, &mut raw).unwrap();
        assert!(raw.iter().all(|&b| b == 0));
    }

    #[test]
    fn too_many_waiting_blocks_are_sent_by_the_writer() {
        let blocks = WRITE_BEHIND_BLOCKS as u64 + 1;
        let dev = MemDevice::new(vec![0u8; blocks as usize * BS]);
        let wb = WriteBehind::new(BS);
        for i in 0..blocks {
            wb.queue(&dev, 12, i, 1, 0, &[1u8; BS]);
        }
        assert_eq!(wb.waiting.load(Ordering::Relaxed), 0, "the last queue sent them all");
        let mut raw = vec![0u8; BS];
        dev.read_at(0, &mut raw).unwrap();
        assert!(raw.iter().all(|&b| b == 1));
    }

    #[test]
    fn a_refused_block_is_reported_once_to_its_inode() {
        use crate::dev::{BadSpot, BadSpotDevice};
        let dev = BadSpotDevice::new(std::sync::Arc::new(device()), BadSpot::Writes(0..BS as u64), true);
        let wb = WriteBehind::new(BS);
        wb.queue(&dev, 12, 0, 1, 0, &[1u8; BS]);
        wb.queue(&dev, 13, 1, 1, 0, &[1u8; BS]);
        wb.send(&dev);
        assert!(!wb.take_failure(13), "inode 13's block was written");
        assert!(wb.take_failure(12));
        assert!(!wb.take_failure(12), "reported once");
        wb.queue(&dev, 14, 0, 1, 0, &[1u8; BS]);
        wb.send(&dev);
        assert!(wb.take_any_failure());
        assert!(!wb.take_any_failure());
    }
}
