//! The I/O model: what the device is asked to do, sorted by what the blocks
//! hold and priced on disks we do not have.
//!
//! A `TracedDevice` wraps any `BlockDevice` and hands every request to an
//! `IoModel`, which
//! - classifies it (`IoClass`: superblock and descriptors, bitmaps, inode
//!   table, directory, extent node, file data, journal, other) block by block
//!   through `BlockClasses`: fixed ranges the volume registers at open, tags the
//!   upper layers set through the cache (`BufferCache::classify`); a request
//!   counts once, under the class most of its blocks have;
//! - counts requests and blocks per class, inode-table block writes, and the
//!   distinct inode-table blocks written since `IoModel::new_epoch` (seed 000's
//!   measure: how many inode-table blocks an operation dirties);
//! - prices it on two disks (`cost`): the seeds' 7200 rpm SATA disk and a SATA
//!   SSD, serving requests in issue order; the rotating disk's time is also
//!   summed per class (`hdd_s_by_class`), to show where a phase's time goes.
//!
//! The model outlives the filesystems opened on it: a benchmark that closes and
//! reopens an image (a cold cache) keeps one model, whose disk head stays where
//! the last request left it. `IoModel::record` takes requests from elsewhere
//! too (the kernel's, from its block tracepoint), so both are priced alike.
//!
//! Invariant: `report()` figures only grow, except `itable_blocks_written`,
//! which restarts at each epoch.

mod classes;
pub mod cost;

pub use classes::{BlockClasses, IoClass};
pub use cost::{Direction, DiskModel, RotatingDisk, RotatingDiskParams, SolidState, SolidStateParams};

use super::{BlockDevice, IoStats};
use crate::error::Result;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Requests and blocks of one class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassCount {
    pub reads: u64,
    pub read_blocks: u64,
    pub writes: u64,
    pub write_blocks: u64,
}

impl ClassCount {
    fn minus(self, earlier: ClassCount) -> ClassCount {
        ClassCount {
            reads: self.reads - earlier.reads,
            read_blocks: self.read_blocks - earlier.read_blocks,
            writes: self.writes - earlier.writes,
            write_blocks: self.write_blocks - earlier.write_blocks,
        }
    }
}

/// What the model has seen: cumulative, except `itable_blocks_written`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IoReport {
    /// Indexed by `IoClass::ALL` order (see `class`).
    pub by_class: [ClassCount; 8],
    pub requests: u64,
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub flushes: u64,
    /// Inode-table blocks written, each time it is written.
    pub itable_block_writes: u64,
    /// Distinct inode-table blocks written since the epoch began.
    pub itable_blocks_written: u64,
    /// Modelled seconds on the rotating disk and on the SSD.
    pub hdd_s: f64,
    pub ssd_s: f64,
    /// `hdd_s` split by the class each request counted under (`IoClass::ALL`
    /// order): where a phase's modelled time goes.
    pub hdd_s_by_class: [f64; 8],
}

impl IoReport {
    pub fn class(&self, class: IoClass) -> ClassCount {
        self.by_class[class.index()]
    }

    /// Modelled rotating-disk seconds of the requests counted under `class`.
    pub fn class_hdd_s(&self, class: IoClass) -> f64 {
        self.hdd_s_by_class[class.index()]
    }

    /// What happened between `earlier` and this report (the epoch's distinct
    /// inode-table blocks are this report's own).
    pub fn since(&self, earlier: &IoReport) -> IoReport {
        let mut by_class = [ClassCount::default(); 8];
        let mut hdd_s_by_class = [0.0; 8];
        for i in 0..8 {
            by_class[i] = self.by_class[i].minus(earlier.by_class[i]);
            hdd_s_by_class[i] = self.hdd_s_by_class[i] - earlier.hdd_s_by_class[i];
        }
        IoReport {
            by_class,
            requests: self.requests - earlier.requests,
            reads: self.reads - earlier.reads,
            read_bytes: self.read_bytes - earlier.read_bytes,
            writes: self.writes - earlier.writes,
            write_bytes: self.write_bytes - earlier.write_bytes,
            flushes: self.flushes - earlier.flushes,
            itable_block_writes: self.itable_block_writes - earlier.itable_block_writes,
            itable_blocks_written: self.itable_blocks_written,
            hdd_s: self.hdd_s - earlier.hdd_s,
            ssd_s: self.ssd_s - earlier.ssd_s,
            hdd_s_by_class,
        }
    }
}

struct ModelState {
    report: IoReport,
    epoch: u64,
    /// Inode-table block -> the epoch it was last written in.
    itable_epochs: HashMap<u64, u64>,
    hdd: RotatingDisk,
    ssd: SolidState,
}

/// Classifies, counts and prices requests (see the module comment).
pub struct IoModel {
    classes: BlockClasses,
    /// The block size classification works in; the volume sets it at open
    /// (the superblock itself is read before anyone knows it).
    block_size: AtomicU64,
    state: Mutex<ModelState>,
}

impl std::fmt::Debug for IoModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoModel").field("report", &self.report()).finish()
    }
}

impl Default for IoModel {
    fn default() -> IoModel {
        IoModel::new(RotatingDiskParams::SEED_7200_RPM_SATA, SolidStateParams::SATA_SSD)
    }
}

impl IoModel {
    pub fn new(hdd: RotatingDiskParams, ssd: SolidStateParams) -> IoModel {
        IoModel {
            classes: BlockClasses::default(),
            block_size: AtomicU64::new(4096),
            state: Mutex::new(ModelState {
                report: IoReport::default(),
                epoch: 0,
                itable_epochs: HashMap::new(),
                hdd: RotatingDisk::new(hdd),
                ssd: SolidState::new(ssd),
            }),
        }
    }

    pub fn classes(&self) -> &BlockClasses {
        &self.classes
    }

    pub fn set_block_size(&self, block_size: u64) {
        self.block_size.store(block_size.max(512), Ordering::Relaxed);
    }

    /// Starts counting distinct inode-table blocks written afresh.
    pub fn new_epoch(&self) {
        let mut st = self.state.lock();
        st.epoch += 1;
        st.report.itable_blocks_written = 0;
    }

    pub fn report(&self) -> IoReport {
        self.state.lock().report
    }

    /// Forgets every count and where the disk heads are; the classes stay (a
    /// benchmark opens an image once to learn them, then starts counting).
    pub fn reset(&self) {
        let mut st = self.state.lock();
        st.report = IoReport::default();
        st.itable_epochs.clear();
        let (hdd, ssd) = (*st.hdd.params(), *st.ssd.params());
        st.hdd = RotatingDisk::new(hdd);
        st.ssd = SolidState::new(ssd);
    }

    /// Takes one request of `len` bytes at byte `offset`.
    pub fn record(&self, direction: Direction, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let bs = self.block_size.load(Ordering::Relaxed);
        let (first, last) = (offset / bs, (offset + len - 1) / bs);
        let mut blocks = [0u64; 8];
        let mut itable = Vec::new();
        for block in first..=last {
            let class = self.classes.class_of(block);
            blocks[class.index()] += 1;
            if class == IoClass::InodeTable && direction == Direction::Write {
                itable.push(block);
            }
        }
        // The class most of its blocks have; the first such in IoClass order on a tie.
        let main = (0..8).max_by_key(|&i| (blocks[i], std::cmp::Reverse(i))).unwrap_or(0);
        let mut st = self.state.lock();
        let st = &mut *st;
        for (i, &n) in blocks.iter().enumerate() {
            let c = &mut st.report.by_class[i];
            match direction {
                Direction::Read => c.read_blocks += n,
                Direction::Write => c.write_blocks += n,
            }
        }
        match direction {
            Direction::Read => {
                st.report.by_class[main].reads += 1;
                st.report.reads += 1;
                st.report.read_bytes += len;
            }
            Direction::Write => {
                st.report.by_class[main].writes += 1;
                st.report.writes += 1;
                st.report.write_bytes += len;
            }
        }
        st.report.requests += 1;
        st.report.itable_block_writes += itable.len() as u64;
        for block in itable {
            if st.itable_epochs.insert(block, st.epoch) != Some(st.epoch) {
                st.report.itable_blocks_written += 1;
            }
        }
        let hdd_s = st.hdd.serve(direction, offset, len);
        st.report.hdd_s += hdd_s;
        st.report.hdd_s_by_class[main] += hdd_s;
        st.report.ssd_s += st.ssd.serve(direction, offset, len);
    }

    pub fn record_flush(&self) {
        self.state.lock().report.flushes += 1;
    }
}

/// A device whose requests an `IoModel` sees (on their way to `inner`).
pub struct TracedDevice {
    inner: Arc<dyn BlockDevice>,
    model: Arc<IoModel>,
}

impl TracedDevice {
    pub fn new(inner: Arc<dyn BlockDevice>, model: Arc<IoModel>) -> TracedDevice {
        TracedDevice { inner, model }
    }
}

impl BlockDevice for TracedDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.model.record(Direction::Read, offset, buf.len() as u64);
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.model.record(Direction::Write, offset, buf.len() as u64);
        self.inner.write_at(offset, buf)
    }

    fn flush(&self) -> Result<()> {
        self.model.record_flush();
        self.inner.flush()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn stats(&self) -> IoStats {
        self.inner.stats()
    }

    fn in_use(&self) -> Option<String> {
        self.inner.in_use()
    }

    fn io_model(&self) -> Option<&Arc<IoModel>> {
        Some(&self.model)
    }

    fn host_range(&self, offset: u64, len: usize) -> Result<Option<super::HostRange<'_>>> {
        let range = self.inner.host_range(offset, len)?;
        if range.is_some() {
            self.model.record(Direction::Read, offset, len as u64);
        }
        Ok(range)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemDevice;

    #[test]
    fn requests_count_under_their_blocks_class_and_itable_blocks_once_per_epoch() {
        let model = Arc::new(IoModel::default());
        model.set_block_size(1024);
        model.classes().add_fixed([(10, 20, IoClass::InodeTable), (1, 2, IoClass::Superblock)]);
        model.classes().tag(30, IoClass::Directory);
        let dev = TracedDevice::new(Arc::new(MemDevice::new(vec![0; 64 << 10])), model.clone());
        dev.write_at(10 * 1024, &[1; 3 * 1024]).unwrap();
        dev.write_at(11 * 1024, &[1; 1024]).unwrap();
        dev.write_at(30 * 1024, &[1; 1024]).unwrap();
        dev.write_at(19 * 1024, &[1; 3 * 1024]).unwrap(); // one itable block, two data blocks
        let mut b = [0u8; 1024];
        dev.read_at(1024, &mut b).unwrap();
        dev.flush().unwrap();
        let r = model.report();
        assert_eq!(r.class(IoClass::InodeTable), ClassCount { reads: 0, read_blocks: 0, writes: 2, write_blocks: 5 });
        assert_eq!(r.class(IoClass::FileData).writes, 1, "the last write is mostly data");
        assert_eq!(r.class(IoClass::FileData).write_blocks, 2);
        assert_eq!(r.class(IoClass::Directory).writes, 1);
        assert_eq!(r.class(IoClass::Superblock).reads, 1);
        assert_eq!((r.requests, r.flushes, r.itable_block_writes, r.itable_blocks_written), (5, 1, 5, 4));
        assert!(r.hdd_s > r.ssd_s && r.ssd_s > 0.0);
        model.new_epoch();
        dev.write_at(10 * 1024, &[1; 1024]).unwrap();
        let later = model.report();
        assert_eq!(later.itable_blocks_written, 1, "a new epoch counts afresh");
        assert_eq!(later.since(&r).requests, 1);
    }
}
