//! The journal under concurrency and faults, judged by e2fsck -fn and the kernel.
//!
//! - The fsync storm: on a device whose flush takes 20 ms, creates in one
//!   directory keep going while 2 and 4 other threads fsync their own files (the
//!   commits run on the journal thread; a create never waits for their I/O).
//! - A commit whose write fails puts the filesystem in its error state: fsync
//!   answers EIO, writes EROFS, the superblock records the error; the kernel
//!   mounts the image, and e2fsck -fn finds nothing lost.
//! - The buffer cache keeps its bound (cache_mb = 4) under a write-heavy
//!   workload, with and without a journal.
//! - Without a journal, errors=continue and errors=remount-ro do what the
//!   kernel's do after an operation fails halfway.

mod oracle;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uext4::dev::{BlockDevice, IoStats, MemDevice, SlowFlushDevice};
use uext4::{Filesystem, Options, Owner, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };
const MAX_CREATES: usize = 50_000;

fn mkfs(image: &Path, mb: u64, extra: &[&str]) -> Vec<u8> {
    std::fs::write(image, vec![0u8; (mb << 20) as usize]).unwrap();
    oracle::run(std::process::Command::new("mkfs.ext4").args(["-F", "-q", "-b", "4096"]).args(extra).arg(image));
    std::fs::read(image).unwrap()
}

fn writable() -> Options {
    Options { read_only: false, ..Options::default() }
}

/// Creates in `dir` for `span` while `fsyncers` threads each rewrite and fsync
/// a file of their own in directories of their own; returns creates per second
/// and the 99th percentile of a create's latency.
fn storm(fs: &Filesystem, round: usize, fsyncers: usize, span: Duration) -> (f64, Duration, u64) {
    let dir = fs.mkdir(ROOT_INO, format!("creates{round}").as_bytes(), 0o755, ROOT).unwrap().ino;
    let stop = AtomicBool::new(false);
    let fsyncs = std::sync::atomic::AtomicU64::new(0);
    let mut latencies = Vec::new();
    let mut loop_time = span;
    std::thread::scope(|s| {
        for t in 0..fsyncers {
            let (stop, fsyncs) = (&stop, &fsyncs);
            s.spawn(move || {
                let own = fs.mkdir(ROOT_INO, format!("sync{round}-{t}").as_bytes(), 0o755, ROOT).unwrap().ino;
                let file = fs.create(own, b"file", 0o644, ROOT).unwrap().ino;
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    fs.write(file, (i % 64) * 4096, &[i as u8; 4096]).unwrap();
                    fs.fsync(file).unwrap();
                    fsyncs.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            });
        }
        // The fsyncers stop even if a create fails (the scope waits for them).
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = StopOnDrop(&stop);
        let start = Instant::now();
        let mut n = 0;
        // At most MAX_CREATES a phase, so three phases fit the image's inodes.
        while start.elapsed() < span && n < MAX_CREATES {
            let t = Instant::now();
            fs.create(dir, format!("f{n}").as_bytes(), 0o644, ROOT).unwrap();
            latencies.push(t.elapsed());
            n += 1;
        }
        loop_time = start.elapsed();
        stop.store(true, Ordering::Relaxed);
    });
    latencies.sort();
    let p99 = latencies[latencies.len() * 99 / 100];
    (latencies.len() as f64 / loop_time.as_secs_f64(), p99, fsyncs.into_inner())
}

#[test]
fn fsync_storm_does_not_stall_creates_elsewhere() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("storm.img");
    let base = mkfs(&image, 256, &["-N", "200000"]);
    let mem = Arc::new(MemDevice::new(base));
    let slow = Arc::new(SlowFlushDevice::new(mem.clone(), Duration::from_millis(20)));
    let fs = Filesystem::open_device(slow.clone(), writable()).unwrap();
    let span = Duration::from_millis(1500);
    let (base_rate, base_p99, _) = storm(&fs, 0, 0, span);
    let mut report = format!("0 fsyncers: {base_rate:.0} creates/s, p99 {base_p99:?}");
    for (round, n) in [(1, 2), (2, 4)] {
        let (rate, p99, fsyncs) = storm(&fs, round, n, span);
        report +=
            &format!("; {n} fsyncers ({fsyncs} fsyncs): {rate:.0} creates/s ({:.2}x), p99 {p99:?}", rate / base_rate);
        eprintln!("{report}");
        assert!(fsyncs > 0, "the fsyncers made no progress: {report}");
        assert!(rate >= 0.8 * base_rate, "creates fell below 0.8x with {n} fsyncers: {report}");
        assert!(p99 < Duration::from_millis(5), "create p99 over 5 ms with {n} fsyncers: {report}");
    }
    eprintln!("{report}; {} flushes", slow.flushes());
    drop(fs);
    std::fs::write(&image, mem.contents()).unwrap();
    oracle::assert_e2fsck_clean(&image);
}

/// Fails every write while `fail` is set.
struct Switch {
    inner: Arc<MemDevice>,
    fail: AtomicBool,
}

impl BlockDevice for Switch {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> uext4::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> uext4::Result<()> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(uext4::Error::Io(std::io::Error::from_raw_os_error(5)));
        }
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> uext4::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn stats(&self) -> IoStats {
        self.inner.stats()
    }
}

#[test]
fn a_failed_commit_enters_the_error_state_and_loses_nothing_committed() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("err.img");
    let base = mkfs(&image, 64, &[]);
    let mem = Arc::new(MemDevice::new(base));
    let dev = Arc::new(Switch { inner: mem.clone(), fail: AtomicBool::new(false) });
    let fs = Filesystem::open_device(dev.clone(), writable()).unwrap();
    let kept = fs.mkdir(ROOT_INO, b"kept", 0o755, ROOT).unwrap().ino;
    let mut files = Vec::new();
    for i in 0..20 {
        let ino = fs.create(kept, format!("f{i}").as_bytes(), 0o644, ROOT).unwrap().ino;
        fs.write(ino, 0, &[i as u8; 5000]).unwrap();
        fs.fsync(ino).unwrap();
        files.push(ino);
    }
    // The next commit's writes fail.
    let doomed = fs.create(ROOT_INO, b"doomed", 0o644, ROOT).unwrap().ino;
    dev.fail.store(true, Ordering::SeqCst);
    let err = fs.fsync(doomed).unwrap_err();
    assert_eq!(err.errno(), 5, "fsync after a failed commit: {err}");
    assert!(fs.has_failed() && fs.is_read_only(), "the filesystem is in its error state");
    let refused = fs.create(ROOT_INO, b"later", 0o644, ROOT).unwrap_err();
    assert_eq!(refused.errno(), 30, "writes after the error: {refused}");
    assert_eq!(fs.fsync(files[0]).unwrap_err().errno(), 5, "fsync in the error state");
    assert_eq!(fs.sync().unwrap_err().errno(), 5, "sync in the error state");
    dev.fail.store(false, Ordering::SeqCst);
    drop(fs);

    // Every write failed, the error record's too: the next open finds the state
    // the last good commit left, fsync'd files whole.
    std::fs::write(&image, mem.contents()).unwrap();
    // The log is left to recover, by the kernel (on a copy) and by uext4.
    kernel_reads_kept_files(&image, work.path());
    {
        let fs = Filesystem::open(&image, writable()).unwrap();
        for (i, &ino) in files.iter().enumerate() {
            assert_eq!(fs.read_all(ino).unwrap(), vec![i as u8; 5000], "fsync'd file f{i}");
        }
    }
    oracle::assert_e2fsck_clean(&image);

    // Now an error whose record reaches the disk: only the log writes fail.
    let mem = Arc::new(MemDevice::new(std::fs::read(&image).unwrap()));
    let fs = Filesystem::open_device(mem.clone(), writable()).unwrap();
    let journal_first = {
        let out = oracle::run(std::process::Command::new("debugfs").args(["-R", "bmap <8> 0"]).arg(&image));
        out.lines().filter_map(|l| l.trim().parse::<u64>().ok()).next().unwrap()
    };
    drop(fs);
    let dev = Arc::new(LogFails { inner: mem.clone(), from: journal_first * 4096, fail: AtomicBool::new(false) });
    let fs = Filesystem::open_device(dev.clone(), writable()).unwrap();
    let more = fs.create(kept, b"more", 0o644, ROOT).unwrap().ino;
    dev.fail.store(true, Ordering::SeqCst);
    assert_eq!(fs.fsync(more).unwrap_err().errno(), 5);
    assert!(fs.has_failed());
    drop(fs);
    std::fs::write(&image, mem.contents()).unwrap();
    let state = oracle::dumpe2fs_field(&image, "Filesystem state").unwrap();
    assert!(state.contains("with errors"), "dumpe2fs says the state is {state}");
    let count: u32 = oracle::dumpe2fs_field(&image, "FS Error count").unwrap().parse().unwrap();
    assert!(count >= 1);
    kernel_reads_kept_files(&image, work.path());
    let fs = Filesystem::open(&image, writable()).unwrap();
    assert!(fs.superblock().first_error().is_some(), "uext4's recovery keeps the error record");
    drop(fs);
    oracle::assert_e2fsck_clean(&image);
}

/// The kernel mounts a copy (replaying its journal), reads the fsync'd files,
/// and e2fsck -fn finds the copy clean after.
fn kernel_reads_kept_files(image: &Path, work: &Path) {
    if !oracle::require_loop() {
        return;
    }
    let copy = work.join("kernel.img");
    std::fs::copy(image, &copy).unwrap();
    {
        let m = oracle::Mount::new(&copy, "");
        for i in 0..20u8 {
            let got = std::fs::read(m.dir.join(format!("kept/f{i}"))).unwrap();
            assert_eq!(got, vec![i; 5000], "the kernel reads kept/f{i}");
        }
    }
    oracle::assert_e2fsck_clean(&copy);
}

/// Fails writes at or beyond byte `from` (the journal) while `fail` is set.
struct LogFails {
    inner: Arc<MemDevice>,
    from: u64,
    fail: AtomicBool,
}

impl BlockDevice for LogFails {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> uext4::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> uext4::Result<()> {
        if self.fail.load(Ordering::SeqCst) && offset >= self.from {
            return Err(uext4::Error::Io(std::io::Error::from_raw_os_error(5)));
        }
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> uext4::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn stats(&self) -> IoStats {
        self.inner.stats()
    }
}

/// A write-heavy workload with cache_mb = 4: the cache's resident bytes never
/// exceed the bound plus the stated slack.
fn cache_stays_bounded(extra: &[&str]) {
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("cache.img");
    let base = mkfs(&image, 256, extra);
    let mem = Arc::new(MemDevice::new(base));
    let opts = Options { cache_mb: 4, ..writable() };
    let fs = Filesystem::open_device(mem.clone(), opts).unwrap();
    let cache = fs.cache();
    let bound = 4 << 20;
    let slack = uext4::cache::RESIDENT_SLACK_BLOCKS * cache.block_size();
    let mut peak = 0;
    // 24,000 inodes: their tables alone (6 MiB) outgrow the cache.
    for d in 0..40 {
        let dir = fs.mkdir(ROOT_INO, format!("d{d}").as_bytes(), 0o755, ROOT).unwrap().ino;
        for f in 0..600 {
            let ino = fs.create(dir, format!("file-{f}").as_bytes(), 0o644, ROOT).unwrap().ino;
            if f % 4 == 0 {
                fs.write(ino, 0, &vec![f as u8; 6000 + f * 13]).unwrap();
            }
            peak = peak.max(cache.resident_bytes());
            assert!(
                cache.resident_bytes() <= bound + slack,
                "cache holds {} bytes, over {bound} + {slack} (d{d}/file-{f})",
                cache.resident_bytes()
            );
        }
    }
    eprintln!("peak resident {peak} bytes for a bound of {bound} + {slack} slack ({extra:?})");
    drop(fs);
    std::fs::write(&image, mem.contents()).unwrap();
    oracle::assert_e2fsck_clean(&image);
}

#[test]
fn cache_keeps_its_bound_with_a_journal() {
    if oracle::require_e2fsprogs() {
        cache_stays_bounded(&["-N", "32768"]);
    }
}

#[test]
fn cache_keeps_its_bound_without_a_journal() {
    if oracle::require_e2fsprogs() {
        cache_stays_bounded(&["-N", "32768", "-O", "^has_journal"]);
    }
}

/// Without a journal, errors= decides: continue records the error and goes on,
/// remount-ro records it and refuses writes; either way the superblock on disk
/// says so (dumpe2fs reads it).
#[test]
fn errors_continue_and_remount_ro_without_a_journal() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    use uext4::dev::{Fault, FaultDevice};
    use uext4::fs::Errors;
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("nojournal.img");
    let base = mkfs(&image, 64, &["-O", "^has_journal"]);
    for (errors, read_only) in [(Errors::Continue, false), (Errors::RemountRo, true)] {
        let mem = Arc::new(MemDevice::new(base.clone()));
        // The first write after the open is the file's data: it fails, after the
        // write has allocated its block (a change that cannot be undone).
        let dev = Arc::new(FaultDevice::new(mem.clone(), Fault::FailWrite(1)));
        let fs = Filesystem::open_device(dev.clone(), Options { errors: Some(errors), ..writable() }).unwrap();
        let ino = fs.create(ROOT_INO, b"f", 0o644, ROOT).unwrap().ino;
        assert_eq!(dev.writes(), 0, "nothing written before the data");
        assert_eq!(fs.write(ino, 0, &[1u8; 8192]).unwrap_err().errno(), 5);
        assert!(fs.has_failed(), "{errors:?}: the error state");
        assert_eq!(fs.is_read_only(), read_only, "{errors:?}");
        let later = fs.create(ROOT_INO, b"g", 0o644, ROOT);
        match read_only {
            true => assert_eq!(later.unwrap_err().errno(), 30, "{errors:?}: EROFS"),
            false => assert!(later.is_ok(), "{errors:?}: goes on"),
        }
        assert!(fs.superblock().s_error_count() >= 1);
        drop(fs);
        std::fs::write(&image, mem.contents()).unwrap();
        let state = oracle::dumpe2fs_field(&image, "Filesystem state").unwrap();
        assert!(state.contains("with errors"), "{errors:?}: dumpe2fs says {state}");
        let count: u32 = oracle::dumpe2fs_field(&image, "FS Error count").unwrap().parse().unwrap();
        assert!(count >= 1, "{errors:?}");
        // Without a journal nothing keeps changes whole: as the kernel's write-back,
        // what was changed before the error reaches the disk at close — the
        // acknowledged create above is not dropped — and so do the two blocks
        // the failed write took. e2fsck (which the error record forces) finds
        // those leaked blocks and summary counts not brought up to date, nothing else.
        let listing = oracle::run(Command::new("debugfs").arg("-R").arg("ls -l /").arg(&image));
        assert!(listing.split_whitespace().any(|w| w == "f"), "{errors:?}: the created file is lost:\n{listing}");
        let out = Command::new("e2fsck").arg("-fn").arg(&image).output().unwrap();
        let report = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        let unexpected: Vec<&str> = report
            .lines()
            .filter(|l| {
                let l = l.trim();
                !(l.is_empty()
                    || l.starts_with("Pass ")
                    || l.starts_with("e2fsck ")
                    || l.contains(" files (")
                    || l.starts_with("Block bitmap differences:")
                    || l.starts_with("Free blocks count wrong")
                    || l.starts_with("Free inodes count wrong (")
                    || l.starts_with("Fix? no")
                    || l.contains("WARNING: Filesystem still has errors"))
            })
            .collect();
        assert!(unexpected.is_empty(), "{errors:?}: e2fsck -fn finds more than the leaked blocks:\n{report}");
        if read_only {
            let leaked: usize = report.lines().filter(|l| l.starts_with("Block bitmap differences:")).count();
            assert_eq!(leaked, 1, "{errors:?}: the failed write's blocks are the only damage:\n{report}");
        }
    }
}
