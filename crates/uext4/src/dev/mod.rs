//! Block devices: where bytes come from and go to.
//!
//! A `BlockDevice` reads and writes at byte offsets and is shared between threads
//! (positional I/O, no seek state). Every backend counts its I/O so benchmarks can
//! report it. A read past the end of the device is a `Corrupt` error, because only
//! a damaged or truncated image points there.
//!
//! `io_model` sorts requests by what they hold and prices them on model disks
//! (`TracedDevice`), for benchmarks.
//!
//! A writable `FileDevice` holds the exclusive lock of the bytes its filesystem
//! lies in (the whole image, or one `Region` of it) for its whole life and
//! refuses a range the kernel or another uext4 process holds (`in_use`).
//!
//! `partition`: a filesystem at an offset or in a partition of a larger device
//! (`Region`, `BoundedDevice`), kept inside it.

mod in_use;
pub mod io_model;
mod partition;
pub use in_use::{held_at, ByteRange};
pub use io_model::{IoClass, IoModel, IoReport, TracedDevice};
pub use partition::{starts_with_partition_table, BoundedDevice, Region};

use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Where a filesystem's bytes live: positional reads and writes, shared by
/// threads. Implement it to put a filesystem anywhere (a network disk, a
/// memory map); [`FileDevice`], [`MemDevice`] and [`BoundedDevice`] come with uext4.
pub trait BlockDevice: Send + Sync {
    /// Fills `buf` from byte `offset`.
    ///
    /// # Errors
    /// `Corrupt` for a range past the end (only a damaged image points there); `Io`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    /// Writes `buf` at byte `offset`.
    ///
    /// # Errors
    /// `ReadOnly` on a device opened read-only; `Corrupt` past the end; `Io`.
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()>;
    /// Makes every write so far durable (fdatasync).
    ///
    /// # Errors
    /// `Io`.
    fn flush(&self) -> Result<()>;
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Requests and bytes so far.
    fn stats(&self) -> IoStats;
    /// Who else held the image when a read-only open found it in use (a uext4
    /// mount, the kernel): what is read may be stale or half-changed.
    fn in_use(&self) -> Option<String> {
        None
    }
    /// The I/O model that sees this device's requests, if any (`TracedDevice`).
    fn io_model(&self) -> Option<&Arc<IoModel>> {
        None
    }
    /// Where the `len` bytes at `offset` lie in a host file the caller may read
    /// itself, to pass file data on without copying it (a FUSE reply spliced from
    /// the image). The bytes count as read once this returns them. `None` (the
    /// default) for a device whose bytes are not a file's, or that must serve
    /// every read itself (fault injection, overlays).
    ///
    /// # Errors
    /// `Corrupt` for a range past the end, as [`BlockDevice::read_at`].
    fn host_range(&self, offset: u64, len: usize) -> Result<Option<HostRange<'_>>> {
        let _ = (offset, len);
        Ok(None)
    }
}

/// Bytes of a device as they lie in a host file: that file, and the byte
/// offset in it.
#[derive(Clone, Copy, Debug)]
pub struct HostRange<'a> {
    pub file: BorrowedFd<'a>,
    pub offset: u64,
}

/// Counters of I/O requests and bytes since the device was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoStats {
    /// Read requests.
    pub reads: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Write requests.
    pub writes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Flushes.
    pub flushes: u64,
}

impl std::ops::Add for IoStats {
    type Output = IoStats;
    fn add(self, o: IoStats) -> IoStats {
        IoStats {
            reads: self.reads + o.reads,
            read_bytes: self.read_bytes + o.read_bytes,
            writes: self.writes + o.writes,
            write_bytes: self.write_bytes + o.write_bytes,
            flushes: self.flushes + o.flushes,
        }
    }
}

impl std::ops::Sub for IoStats {
    type Output = IoStats;
    /// The requests between an earlier reading and this one.
    fn sub(self, earlier: IoStats) -> IoStats {
        IoStats {
            reads: self.reads - earlier.reads,
            read_bytes: self.read_bytes - earlier.read_bytes,
            writes: self.writes - earlier.writes,
            write_bytes: self.write_bytes - earlier.write_bytes,
            flushes: self.flushes - earlier.flushes,
        }
    }
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    flushes: AtomicU64,
}

impl Counters {
    fn read(&self, n: usize) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.read_bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
    fn write(&self, n: usize) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.write_bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
    fn snapshot(&self) -> IoStats {
        IoStats {
            reads: self.reads.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
        }
    }
}

fn check_range(offset: u64, len: usize, size: u64) -> Result<()> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::corrupt(
            format!("access to bytes {offset}..+{len} lies beyond the end of the device ({size} bytes)"),
            "device",
        )),
    }
}

/// An image file or a block device, accessed with pread/pwrite.
pub struct FileDevice {
    /// Holds the lock of its region when writable (or opened with
    /// `open_locked`: a read lock then, for a file open read-only).
    file: File,
    size: u64,
    writable: bool,
    counters: Counters,
    others: Option<String>,
    /// The bytes its lock covers: a write elsewhere (a caller that opened
    /// one partition and then asked for another region) is refused.
    locked: ByteRange,
    /// The path it was opened by, for messages.
    path: PathBuf,
}

/// Whether the kernel marks the block device open as `file` read-only (BLKROGET).
fn block_device_read_only(file: &File) -> bool {
    // _IO(0x12, 94), linux/fs.h.
    const BLKROGET: u64 = 0x125e;
    let mut ro: libc::c_int = 0;
    // SAFETY: BLKROGET writes one int through the pointer, to a local we own.
    let r = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(file), BLKROGET as _, &mut ro) };
    r == 0 && ro != 0
}

impl FileDevice {
    /// Opens an image: writable, with its exclusive lock, refusing (`Error::Busy`)
    /// one that the kernel or another uext4 process holds; read-only, with no
    /// lock, noting who else holds it (`in_use`).
    ///
    /// # Errors
    /// `Busy` as above; `Io` when the file cannot be opened.
    pub fn open(path: &Path, writable: bool) -> Result<FileDevice> {
        Self::open_region(path, writable, Region::Whole)
    }

    /// As [`FileDevice::open`], for a filesystem in `region` of the image: the
    /// lock and the check cover that region's bytes only, so the partitions of
    /// one disk image can be opened by different processes (and the kernel) at
    /// once. The device is still the whole image (wrap it in a `BoundedDevice`).
    ///
    /// # Errors
    /// As [`FileDevice::open`]; `Invalid`, `Corrupt` or `Unsupported` when the
    /// region cannot be found (see [`Region::locate`]).
    pub fn open_region(path: &Path, writable: bool, region: Region) -> Result<FileDevice> {
        Self::open_as(path, writable, writable, region, |dev| byte_range(dev, region))
    }

    /// Opens an image to make a filesystem of `size` bytes (0: all the rest)
    /// in `region`: the lock covers what mkfs will write, not what an old
    /// filesystem there said it spanned.
    ///
    /// # Errors
    /// As [`FileDevice::open_region`].
    pub(crate) fn open_for_mkfs(path: &Path, region: Region, size: u64) -> Result<FileDevice> {
        Self::open_as(path, true, true, region, |dev| {
            if region == Region::Whole {
                return Ok(ByteRange::WHOLE);
            }
            let (start, rest) = region.locate(dev)?;
            Ok(ByteRange { start, len: if size == 0 { rest } else { size.min(rest) } })
        })
    }

    /// Opens an image with its exclusive lock even when read-only: a mount, which
    /// must be the only user of its region whether or not it writes.
    ///
    /// # Errors
    /// As [`FileDevice::open_region`], and `Busy` while another process holds the lock.
    pub fn open_locked(path: &Path, writable: bool, region: Region) -> Result<FileDevice> {
        Self::open_as(path, writable, true, region, |dev| byte_range(dev, region))
    }

    fn open_as(
        path: &Path,
        writable: bool,
        exclusive: bool,
        region: Region,
        range_of: impl FnOnce(&FileDevice) -> Result<ByteRange>,
    ) -> Result<FileDevice> {
        let mut dev = Self::open_unchecked(path, writable)?;
        // Finding a partition reads its table: nothing is written before the check.
        let range = range_of(&dev)?;
        let users = in_use::examine(&dev.file, range, exclusive, writable)?;
        if exclusive && users.locked || writable && users.any() {
            return Err(in_use::busy(&naming(path, region), &users, writable));
        }
        dev.others = users.any().then(|| users.describe());
        dev.locked = range;
        Ok(dev)
    }

    /// The open itself, with no lock and no look at who else uses the image.
    fn open_unchecked(path: &Path, writable: bool) -> Result<FileDevice> {
        // A writable open of a block device is exclusive (O_EXCL), as e2fsprogs'
        // is: the kernel refuses it while the device is mounted anywhere, even in
        // a mount namespace /proc/self/mounts does not show.
        let is_block_device = std::fs::metadata(path).is_ok_and(|m| {
            use std::os::unix::fs::FileTypeExt;
            m.file_type().is_block_device()
        });
        let mut options = OpenOptions::new();
        options.read(true).write(writable);
        if writable && is_block_device {
            use std::os::unix::fs::OpenOptionsExt;
            options.custom_flags(libc::O_EXCL);
        }
        let file = options.open(path).map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => Error::Busy(format!(
                "{} is held by the kernel (mounted, perhaps in another mount namespace, or opened \
                 exclusively); writing to it now would corrupt it",
                path.display()
            )),
            _ => Error::Io(std::io::Error::new(e.kind(), format!("cannot open {}: {e}", path.display()))),
        })?;
        if writable && is_block_device && block_device_read_only(&file) {
            // The kernel mounts such a device read-only; a write would fail with
            // EPERM only after the journal had been started.
            return Err(Error::ReadOnly(format!(
                "{} is a read-only block device; open it read-only (or make it writable: blockdev --setrw)",
                path.display()
            )));
        }
        // A block device reports size 0 in its metadata; seeking to the end works for both.
        let size = {
            use std::io::{Seek, SeekFrom};
            let mut f = &file;
            f.seek(SeekFrom::End(0))?
        };
        let (counters, locked) = (Counters::default(), ByteRange::WHOLE);
        Ok(FileDevice { file, size, writable, counters, others: None, locked, path: path.into() })
    }
}

impl FileDevice {
    /// Makes an image file `size` zero bytes (sparse): what it held is gone.
    /// For mkfs, which takes the image's lock before it destroys anything.
    ///
    /// # Errors
    /// `Io` when the file cannot be resized; `Invalid` for a device, not a file.
    pub(crate) fn zero_fill(&mut self, size: u64) -> Result<()> {
        if !self.file.metadata()?.is_file() || !self.writable {
            return Err(Error::Invalid(format!("{} is not an image file open for writing", self.path.display())));
        }
        self.file.set_len(0).map_err(|e| self.failed("truncating", 0, 0, e))?;
        self.file.set_len(size).map_err(|e| self.failed("extending", 0, 0, e))?;
        self.size = size;
        Ok(())
    }
}

/// The bytes of `dev` that `region` names, for its lock (`Whole`: all of it,
/// however it grows). A filesystem at an offset ends where its superblock's
/// block count says, not at the end of the image: one image may hold several
/// filesystems one after another with no partition table (two `--offset`s),
/// and each must leave the others usable.
fn byte_range(dev: &dyn BlockDevice, region: Region) -> Result<ByteRange> {
    let (start, rest) = match region {
        Region::Whole => return Ok(ByteRange::WHOLE),
        _ => region.locate(dev)?,
    };
    let len = match region {
        Region::Offset(_) => filesystem_len(dev, start).map_or(rest, |len| len.min(rest)),
        _ => rest,
    };
    Ok(ByteRange { start, len })
}

/// The bytes the ext4 filesystem starting at `start` spans, from its
/// superblock; `None` when no valid superblock is there (nothing to bound
/// it by, so its lock runs to the end of the image).
fn filesystem_len(dev: &dyn BlockDevice, start: u64) -> Option<u64> {
    use crate::format::superblock::{Superblock, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE};
    let mut raw = [0u8; SUPERBLOCK_SIZE];
    dev.read_at(start.checked_add(SUPERBLOCK_OFFSET)?, &mut raw).ok()?;
    let sb = Superblock::parse(&raw, false).ok()?;
    sb.s_blocks_count.checked_mul(u64::from(sb.block_size())).filter(|&len| len > 0)
}

/// Refuses (`Error::Busy`) an image whose `region` a uext4 process or the
/// kernel holds, without keeping any lock: for callers about to replace the
/// file (mkfs) or to write it after a read-only look. A file that does not
/// exist (yet) is unused.
///
/// # Errors
/// `Busy` as above; what finding the region gives.
pub fn check_unused(path: &Path, region: Region) -> Result<()> {
    let Ok(dev) = FileDevice::open_unchecked(path, false) else { return Ok(()) };
    in_use::check_range_unused(&naming(path, region), &dev.file, byte_range(&dev, region)?)
}

/// The image, or the region of it, as a refusal names it: which of several
/// filesystems in one image was asked for ("partition 2 of /tmp/disk.img").
fn naming(path: &Path, region: Region) -> String {
    match region {
        Region::Whole => path.display().to_string(),
        _ => format!("{region} of {}", path.display()),
    }
}

impl FileDevice {
    /// A host I/O error, saying which request of which image failed: the
    /// host's words alone ("No space left on device" for a full host disk
    /// under a sparse image) do not say it was the image's file.
    fn failed(&self, what: &str, offset: u64, len: usize, e: std::io::Error) -> Error {
        let request = match len {
            0 => format!("{what} {}", self.path.display()),
            _ => format!("{what} {len} bytes at byte {offset} of {}", self.path.display()),
        };
        Error::Io(std::io::Error::new(e.kind(), format!("{request}: {e}")))
    }
}

impl BlockDevice for FileDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        check_range(offset, buf.len(), self.size)?;
        self.counters.read(buf.len());
        self.file.read_exact_at(buf, offset).map_err(|e| self.failed("reading", offset, buf.len(), e))
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        if !self.writable {
            return Err(Error::ReadOnly("device opened read-only".into()));
        }
        if !self.locked.holds(offset, buf.len() as u64) {
            return Err(Error::Invalid(format!(
                "a write at byte {offset} of {} lies outside the region this open locked",
                self.path.display()
            )));
        }
        check_range(offset, buf.len(), self.size)?;
        self.counters.write(buf.len());
        self.file.write_all_at(buf, offset).map_err(|e| self.failed("writing", offset, buf.len(), e))
    }

    fn flush(&self) -> Result<()> {
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        if self.writable {
            self.file.sync_data().map_err(|e| self.failed("flushing", 0, 0, e))?;
        }
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn stats(&self) -> IoStats {
        self.counters.snapshot()
    }

    fn in_use(&self) -> Option<String> {
        self.others.clone()
    }

    fn host_range(&self, offset: u64, len: usize) -> Result<Option<HostRange<'_>>> {
        check_range(offset, len, self.size)?;
        self.counters.read(len);
        Ok(Some(HostRange { file: self.file.as_fd(), offset }))
    }
}

/// A device held in memory, for tests and fuzzing.
pub struct MemDevice {
    data: parking_lot::RwLock<Vec<u8>>,
    counters: Counters,
}

impl MemDevice {
    /// A device holding `data` (its size is `data.len()`).
    pub fn new(data: Vec<u8>) -> MemDevice {
        MemDevice { data: parking_lot::RwLock::new(data), counters: Counters::default() }
    }

    /// The bytes, giving up the device.
    pub fn into_inner(self) -> Vec<u8> {
        self.data.into_inner()
    }

    /// A copy of the bytes.
    pub fn contents(&self) -> Vec<u8> {
        self.data.read().clone()
    }
}

impl BlockDevice for MemDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let d = self.data.read();
        check_range(offset, buf.len(), d.len() as u64)?;
        self.counters.read(buf.len());
        buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        let mut d = self.data.write();
        check_range(offset, buf.len(), d.len() as u64)?;
        self.counters.write(buf.len());
        d[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn size(&self) -> u64 {
        self.data.read().len() as u64
    }

    fn stats(&self) -> IoStats {
        self.counters.snapshot()
    }
}

/// A read-only view of a device with some blocks replaced: how a journal that
/// needs recovery is applied in memory without writing to the image.
pub struct OverlayDevice {
    inner: Arc<dyn BlockDevice>,
    block_size: u64,
    blocks: BTreeMap<u64, Vec<u8>>,
}

impl OverlayDevice {
    pub fn new(inner: Arc<dyn BlockDevice>, block_size: u32, blocks: BTreeMap<u64, Vec<u8>>) -> OverlayDevice {
        OverlayDevice { inner, block_size: block_size as u64, blocks }
    }
}

impl BlockDevice for OverlayDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, buf)?;
        // Patch every replaced block that overlaps the request.
        let end = offset + buf.len() as u64;
        let first = offset / self.block_size;
        let last = (end - 1) / self.block_size;
        for (&blk, data) in self.blocks.range(first..=last) {
            let bstart = blk * self.block_size;
            let from = bstart.max(offset);
            let to = (bstart + self.block_size).min(end);
            buf[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&data[(from - bstart) as usize..(to - bstart) as usize]);
        }
        Ok(())
    }

    fn write_at(&self, _offset: u64, _buf: &[u8]) -> Result<()> {
        Err(Error::ReadOnly("journal replayed in memory only; the image is read-only".into()))
    }

    fn flush(&self) -> Result<()> {
        Ok(())
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
        self.inner.io_model()
    }
}

/// What a `FaultDevice` does to the writes it is given, counted from 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Every write reaches the device.
    None,
    /// A power cut after write `n`: writes `n + 1` onward never arrive.
    DropAfter(u64),
    /// A power cut during write `n`: only its first `keep` bytes arrive (the
    /// caller picks a multiple of the device's atomic write unit), and nothing
    /// after it.
    Tear { write: u64, keep: usize },
    /// Write `n` fails with EIO (nothing of it arrives); the others succeed, as
    /// on a disk with one bad spot.
    FailWrite(u64),
    /// Read `n` fails with EIO; the others succeed.
    FailRead(u64),
}

/// A device that loses writes the way a power cut does, for crash tests. Writes
/// it drops still succeed (the process does not learn of the cut); flushes
/// succeed. Reads see what reached the device.
pub struct FaultDevice {
    inner: Arc<dyn BlockDevice>,
    fault: Fault,
    writes: AtomicU64,
    reads: AtomicU64,
}

impl FaultDevice {
    pub fn new(inner: Arc<dyn BlockDevice>, fault: Fault) -> FaultDevice {
        FaultDevice { inner, fault, writes: AtomicU64::new(0), reads: AtomicU64::new(0) }
    }

    /// Writes requested so far, those dropped included.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }

    /// Reads requested so far, the failed one included.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }

    /// Whether the fault has happened: some write has been lost, or the failing
    /// request has been made.
    pub fn is_cut(&self) -> bool {
        let n = self.writes();
        match self.fault {
            Fault::None => false,
            Fault::FailWrite(bad) => n >= bad,
            Fault::FailRead(bad) => self.reads() >= bad,
            Fault::DropAfter(last) => n > last,
            Fault::Tear { write, .. } => n >= write,
        }
    }
}

impl BlockDevice for FaultDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let n = self.reads.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fault == Fault::FailRead(n) {
            return Err(Error::Io(std::io::Error::from_raw_os_error(5)));
        }
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        let n = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        match self.fault {
            Fault::FailWrite(bad) if n == bad => Err(Error::Io(std::io::Error::from_raw_os_error(5))),
            Fault::DropAfter(last) if n > last => Ok(()),
            Fault::Tear { write, .. } if n > write => Ok(()),
            Fault::Tear { write, keep } if n == write => self.inner.write_at(offset, &buf[..keep.min(buf.len())]),
            _ => self.inner.write_at(offset, buf),
        }
    }

    fn flush(&self) -> Result<()> {
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
}

/// Where a `BadSpotDevice` refuses requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BadSpot {
    /// Reads that touch any byte of the range fail (an unreadable sector).
    Reads(std::ops::Range<u64>),
    /// Writes that touch any byte of the range fail.
    Writes(std::ops::Range<u64>),
    /// Writes whose bytes begin with this marker fail: data a test chose to
    /// lose, which no metadata or journal block begins with.
    WritesStartingWith(Vec<u8>),
}

/// A device with a bad spot that can be armed and disarmed: requests that
/// meet it fail with EIO and change nothing; all others pass through. For
/// tests of what an I/O error in the middle of an operation does (the
/// mount's `UEXT4_TEST_UNREADABLE` hook arms one from the start).
pub struct BadSpotDevice {
    inner: Arc<dyn BlockDevice>,
    spot: BadSpot,
    armed: std::sync::atomic::AtomicBool,
    failed: AtomicU64,
}

impl BadSpotDevice {
    /// A device whose `spot` fails while armed (`armed`: from the start).
    pub fn new(inner: Arc<dyn BlockDevice>, spot: BadSpot, armed: bool) -> BadSpotDevice {
        BadSpotDevice { inner, spot, armed: armed.into(), failed: AtomicU64::new(0) }
    }

    /// Requests meeting the spot fail from now on (`true`) or pass (`false`).
    pub fn arm(&self, armed: bool) {
        self.armed.store(armed, Ordering::SeqCst);
    }

    /// Requests refused so far.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::SeqCst)
    }

    fn refuses(&self, reading: bool, offset: u64, bytes: &[u8]) -> bool {
        if !self.armed.load(Ordering::SeqCst) {
            return false;
        }
        let touches = |r: &std::ops::Range<u64>| offset < r.end && r.start < offset.saturating_add(bytes.len() as u64);
        let refused = match &self.spot {
            BadSpot::Reads(range) => reading && touches(range),
            BadSpot::Writes(range) => !reading && touches(range),
            BadSpot::WritesStartingWith(marker) => !reading && bytes.starts_with(marker),
        };
        if refused {
            self.failed.fetch_add(1, Ordering::SeqCst);
        }
        refused
    }
}

impl BlockDevice for BadSpotDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        if self.refuses(true, offset, buf) {
            return Err(Error::Io(std::io::Error::from_raw_os_error(libc::EIO)));
        }
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        if self.refuses(false, offset, buf) {
            return Err(Error::Io(std::io::Error::from_raw_os_error(libc::EIO)));
        }
        self.inner.write_at(offset, buf)
    }

    fn flush(&self) -> Result<()> {
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
}

/// A device whose flushes take `delay` (a disk with a slow cache flush), for
/// latency tests; reads and writes pass straight through.
pub struct SlowFlushDevice {
    inner: Arc<dyn BlockDevice>,
    delay: std::time::Duration,
    flushes: AtomicU64,
}

impl SlowFlushDevice {
    pub fn new(inner: Arc<dyn BlockDevice>, delay: std::time::Duration) -> SlowFlushDevice {
        SlowFlushDevice { inner, delay, flushes: AtomicU64::new(0) }
    }

    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }
}

impl BlockDevice for SlowFlushDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.inner.write_at(offset, buf)
    }

    fn flush(&self) -> Result<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(self.delay);
        self.inner.flush()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn stats(&self) -> IoStats {
        self.inner.stats()
    }
}

/// A device whose flushes wait while a gate is shut: a disk whose cache flush
/// takes as long as a test wants, for checking who waits on a flush (never a
/// timed test). The gate is shut by `shut()`, or while the file `gate_path`
/// exists (so a test can hold the flushes of a mount daemon it started).
pub struct GatedFlushDevice {
    inner: Arc<dyn BlockDevice>,
    shut: std::sync::atomic::AtomicBool,
    gate_path: Option<std::path::PathBuf>,
    waiting: AtomicU64,
    flushes: AtomicU64,
}

impl GatedFlushDevice {
    pub fn new(inner: Arc<dyn BlockDevice>, gate_path: Option<std::path::PathBuf>) -> GatedFlushDevice {
        GatedFlushDevice {
            inner,
            shut: false.into(),
            gate_path,
            waiting: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
        }
    }

    /// Flushes wait from now on until `open`.
    pub fn shut(&self) {
        self.shut.store(true, Ordering::SeqCst);
    }

    pub fn open(&self) {
        self.shut.store(false, Ordering::SeqCst);
    }

    /// Flushes waiting at the gate now.
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Flushes that have passed the gate.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::SeqCst)
    }

    fn is_shut(&self) -> bool {
        self.shut.load(Ordering::SeqCst) || self.gate_path.as_ref().is_some_and(|p| p.exists())
    }
}

impl BlockDevice for GatedFlushDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.inner.write_at(offset, buf)
    }

    fn flush(&self) -> Result<()> {
        if self.is_shut() {
            self.waiting.fetch_add(1, Ordering::SeqCst);
            while self.is_shut() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
        self.flushes.fetch_add(1, Ordering::SeqCst);
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_device_writes_only_inside_the_region_it_locked() {
        let path = std::env::temp_dir().join(format!("uext4-region-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 65536]).unwrap();
        let dev = FileDevice::open_region(&path, true, Region::Offset(8192)).unwrap();
        assert!(matches!(dev.write_at(0, &[1; 512]), Err(Error::Invalid(_))), "before the region");
        assert!(matches!(dev.write_at(8191, &[1; 2]), Err(Error::Invalid(_))), "across its start");
        dev.write_at(8192, &[1; 512]).unwrap();
        let other = FileDevice::open_region(&path, true, Region::Offset(4096));
        assert!(matches!(other, Err(Error::Busy(_))), "an overlapping region is held");
        let before = FileDevice::open(&path, false).unwrap();
        let mut head = [0u8; 8192];
        before.read_at(0, &mut head).unwrap();
        assert!(head.iter().all(|&b| b == 0), "nothing written outside");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn filesystems_one_after_another_in_one_image_lock_apart() {
        let path = std::env::temp_dir().join(format!("uext4-two-offsets-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 24 << 20]).unwrap();
        let make = |offset: u64| {
            let opts = crate::mkfs::MkfsOptions { size: 8 << 20, region: Region::Offset(offset), ..Default::default() };
            crate::mkfs::mkfs(&path, &opts).unwrap();
        };
        make(0);
        make(8 << 20);
        let first = FileDevice::open_region(&path, true, Region::Offset(0)).unwrap();
        assert_eq!(first.locked, ByteRange { start: 0, len: 8 << 20 }, "the first filesystem's own bytes");
        let second = FileDevice::open_region(&path, true, Region::Offset(8 << 20)).unwrap();
        assert_eq!(second.locked, ByteRange { start: 8 << 20, len: 8 << 20 });
        // Past both filesystems no superblock bounds the region: to the end.
        let rest = FileDevice::open_region(&path, true, Region::Offset(16 << 20)).unwrap();
        assert_eq!(rest.locked, ByteRange { start: 16 << 20, len: 8 << 20 });
        // mkfs over the first locks what it will write, not the old superblock's span.
        drop(first);
        let mkfs_bigger = FileDevice::open_for_mkfs(&path, Region::Offset(0), 12 << 20);
        assert!(matches!(mkfs_bigger, Err(Error::Busy(_))), "a bigger filesystem at 0 would overwrite the second");
        drop((second, rest));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn fault_device_cuts_and_tears_where_told() {
        let write_all = |fault| {
            let mem = Arc::new(MemDevice::new(vec![0u8; 64]));
            let dev = FaultDevice::new(mem.clone(), fault);
            for i in 0..4u8 {
                dev.write_at(i as u64 * 16, &[i + 1; 16]).unwrap();
            }
            (mem.contents(), dev.is_cut())
        };
        let blocks = |c: &[u8]| c.chunks(16).map(|b| b.iter().filter(|&&x| x != 0).count()).collect::<Vec<_>>();
        let (c, cut) = write_all(Fault::None);
        assert_eq!((blocks(&c), cut), (vec![16, 16, 16, 16], false));
        let (c, cut) = write_all(Fault::DropAfter(2));
        assert_eq!((blocks(&c), cut), (vec![16, 16, 0, 0], true));
        let (c, cut) = write_all(Fault::Tear { write: 2, keep: 4 });
        assert_eq!((blocks(&c), cut), (vec![16, 4, 0, 0], true));
        let (_, cut) = write_all(Fault::DropAfter(4));
        assert!(!cut, "nothing was lost");
        let mem = Arc::new(MemDevice::new(vec![0u8; 64]));
        let dev = FaultDevice::new(mem.clone(), Fault::FailWrite(2));
        let results: Vec<bool> = (0..3u64).map(|i| dev.write_at(i * 16, &[9; 16]).is_ok()).collect();
        assert_eq!(results, [true, false, true], "only the chosen write fails");
        assert_eq!(blocks(&mem.contents()), [16, 0, 16, 0]);
        let dev = FaultDevice::new(mem, Fault::FailRead(1));
        let mut b = [0u8; 16];
        assert_eq!(dev.read_at(0, &mut b).unwrap_err().errno(), 5);
        assert!(dev.read_at(0, &mut b).is_ok() && dev.is_cut());
    }
}
