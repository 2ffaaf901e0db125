//! The journal under concurrency and faults, judged by e2fsck -fn and the kernel.
//!
//! - The fsync storm: while 1, 2 and 4 threads wait in fsync, their commit's
//!   device flush held shut, a thousand creates and writes in another directory
//!   all finish (the commits run on the journal thread; a create never waits for
//!   their I/O). How fast they go beside fsyncers is `uext4 bench fsync-storm`'s.
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
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uext4::dev::{BadSpot, BadSpotDevice, GatedFlushDevice, MemDevice};
use uext4::{Filesystem, Options, Owner, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };

fn mkfs(image: &Path, mb: u64, extra: &[&str]) -> Vec<u8> {
    std::fs::write(image, vec![0u8; (mb << 20) as usize]).unwrap();
    oracle::run(std::process::Command::new("mkfs.ext4").args(["-F", "-q", "-b", "4096"]).args(extra).arg(image));
    std::fs::read(image).unwrap()
}

fn writable() -> Options {
    Options { read_only: false, ..Options::default() }
}

/// Waits (polling) until `done` says so; a hang detector, never a speed
/// check: `limit` is minutes beyond anything the step needs.
fn wait_until(what: &str, limit: Duration, done: &dyn Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: still waiting after {limit:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// While `fsyncers` threads sit in fsync, their commit's device flush held shut
/// at the gate, another thread creates and writes `CREATES` files in a
/// directory of its own: every create must finish while every fsync still waits
/// (a create that waited for the commit's I/O would wait for the gate forever).
fn creates_pass_waiting_fsyncs(fs: &Filesystem, gate: &GatedFlushDevice, round: usize, fsyncers: usize) {
    const CREATES: usize = 1_000;
    let dir = fs.mkdir(ROOT_INO, format!("creates{round}").as_bytes(), 0o755, ROOT).unwrap().ino;
    let files: Vec<u32> = (0..fsyncers)
        .map(|t| {
            let own = fs.mkdir(ROOT_INO, format!("sync{round}-{t}").as_bytes(), 0o755, ROOT).unwrap().ino;
            fs.create(own, b"file", 0o644, ROOT).unwrap().ino
        })
        .collect();
    let synced = std::sync::atomic::AtomicUsize::new(0);
    gate.shut();
    std::thread::scope(|s| {
        for (t, &file) in files.iter().enumerate() {
            let synced = &synced;
            s.spawn(move || {
                fs.write(file, 0, &[t as u8 + 1; 4096]).unwrap();
                fs.fsync(file).unwrap();
                synced.fetch_add(1, Ordering::SeqCst);
            });
        }
        wait_until("a commit reaching the shut gate", Duration::from_secs(120), &|| gate.waiting() > 0);
        let creator = s.spawn(|| {
            for i in 0..CREATES {
                let ino = fs.create(dir, format!("f{i:05}").as_bytes(), 0o644, ROOT).unwrap().ino;
                fs.write(ino, 0, &(i as u32).to_le_bytes()).unwrap();
            }
        });
        wait_until(
            &format!("{CREATES} creates while {fsyncers} fsyncs wait on a flush"),
            Duration::from_secs(300),
            &|| creator.is_finished(),
        );
        creator.join().unwrap();
        assert_eq!(synced.load(Ordering::SeqCst), 0, "an fsync returned while its commit's flush was held");
        assert!(gate.waiting() > 0, "the commit still waits at the gate");
        gate.open();
    });
    assert_eq!(synced.load(Ordering::SeqCst), fsyncers, "every fsync returned once the gate opened");
    for (t, &file) in files.iter().enumerate() {
        assert_eq!(fs.read_all(file).unwrap(), vec![t as u8 + 1; 4096]);
    }
    assert_eq!(fs.read_dir(dir).unwrap().len(), CREATES + 2);
}

#[test]
fn creates_elsewhere_never_wait_for_an_fsyncs_flush() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("storm.img");
    let base = mkfs(&image, 256, &[]);
    let mem = Arc::new(MemDevice::new(base));
    let gate = Arc::new(GatedFlushDevice::new(mem.clone(), None));
    let fs = Filesystem::open_device(gate.clone(), writable()).unwrap();
    for (round, fsyncers) in [(1, 1), (2, 2), (3, 4)] {
        creates_pass_waiting_fsyncs(&fs, &gate, round, fsyncers);
    }
    drop(fs);
    std::fs::write(&image, mem.contents()).unwrap();
    oracle::assert_e2fsck_clean(&image);
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
    let dev = Arc::new(BadSpotDevice::new(mem.clone(), BadSpot::Writes(0..u64::MAX), false));
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
    dev.arm(true);
    let err = fs.fsync(doomed).unwrap_err();
    assert_eq!(err.errno(), 5, "fsync after a failed commit: {err}");
    assert!(fs.has_failed() && fs.is_read_only(), "the filesystem is in its error state");
    let refused = fs.create(ROOT_INO, b"later", 0o644, ROOT).unwrap_err();
    assert_eq!(refused.errno(), 30, "writes after the error: {refused}");
    assert_eq!(fs.fsync(files[0]).unwrap_err().errno(), 5, "fsync in the error state");
    assert_eq!(fs.sync().unwrap_err().errno(), 5, "sync in the error state");
    dev.arm(false);
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
    let dev = Arc::new(BadSpotDevice::new(mem.clone(), BadSpot::Writes(journal_first * 4096..u64::MAX), false));
    let fs = Filesystem::open_device(dev.clone(), writable()).unwrap();
    let more = fs.create(kept, b"more", 0o644, ROOT).unwrap().ino;
    dev.arm(true);
    assert_eq!(fs.fsync(more).unwrap_err().errno(), 5);
    assert!(fs.has_failed());
    drop(fs);
    std::fs::write(&image, mem.contents()).unwrap();
    let state = oracle::dumpe2fs_field(&image, "Filesystem state").unwrap();
    assert!(state.contains("with errors"), "dumpe2fs says the state is {state}");
    let count: u32 = oracle::dumpe2fs_field(&image, "FS Error count").unwrap().parse().unwrap();
    assert!(count >= 1);
    // Where and what, as the kernel's record names its function and errno.
    assert_eq!(oracle::dumpe2fs_field(&image, "First error function").as_deref(), Some("journal_commit"));
    assert_eq!(oracle::dumpe2fs_field(&image, "First error err").as_deref(), Some("EIO"));
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

/// The first commit's log writes fail (a host disk that fills under a sparse
/// image: the journal superblock, written by mkfs, still takes its write).
/// The image is left as the kernel leaves an aborted journal, needs_recovery
/// set beside the journal's errno, which e2fsck -n can check; with the errno
/// alone it stopped ("e2fsck: aborted", exit 8) trying to clear it.
#[test]
fn an_abort_before_the_first_commit_leaves_an_image_e2fsck_n_can_check() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("abort.img");
    let base = mkfs(&image, 64, &[]);
    let journal_first = {
        let out = oracle::run(std::process::Command::new("debugfs").args(["-R", "bmap <8> 0"]).arg(&image));
        out.lines().filter_map(|l| l.trim().parse::<u64>().ok()).next().unwrap()
    };
    let mem = Arc::new(MemDevice::new(base));
    let dev = Arc::new(BadSpotDevice::new(mem.clone(), BadSpot::Writes((journal_first + 1) * 4096..u64::MAX), true));
    let fs = Filesystem::open_device(dev.clone(), writable()).unwrap();
    let f = fs.create(ROOT_INO, b"f", 0o644, ROOT).unwrap().ino;
    assert_eq!(fs.fsync(f).unwrap_err().errno(), 5);
    drop(fs);
    std::fs::write(&image, mem.contents()).unwrap();
    assert_eq!(oracle::dumpe2fs_field(&image, "Journal errno").as_deref(), Some("-5"));
    let out = Command::new("e2fsck").arg("-fn").arg(&image).output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        matches!(out.status.code(), Some(0) | Some(4)) && !report.contains("aborted"),
        "e2fsck -fn could not check the image ({:?}):\n{report}",
        out.status.code()
    );
    // The kernel mounts it (an empty log to replay) and leaves it clean.
    if oracle::require_loop() {
        let copy = work.path().join("kernel.img");
        std::fs::copy(&image, &copy).unwrap();
        let m = oracle::Mount::new(&copy, "");
        assert!(m.dir.join("lost+found").is_dir());
        drop(m);
        oracle::assert_e2fsck_clean(&copy);
    }
}

/// An inode-table block that cannot be read is an error the kernel records
/// ("unable to read itable block") and acts on by errors=: EIO to the stat,
/// the error and the inode in the superblock, and (remount-ro, the default)
/// writes refused from then on. It was an EIO and nothing more.
#[test]
fn an_unreadable_inode_table_block_is_recorded_and_errors_decides() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("itable.img");
    let base = mkfs(&image, 64, &[]);
    let table = {
        let out = oracle::run(std::process::Command::new("debugfs").args(["-R", "imap <100>"]).arg(&image));
        let at = out.split("located at block ").nth(1).unwrap();
        at.split(',').next().unwrap().trim().parse::<u64>().unwrap()
    };
    let mem = Arc::new(MemDevice::new(base));
    let dev = Arc::new(BadSpotDevice::new(mem.clone(), BadSpot::Reads(table * 4096..(table + 1) * 4096), false));
    // mkfs.ext4's images say errors=continue: that goes on after recording.
    let fs = Filesystem::open_device(dev.clone(), writable()).unwrap();
    fs.drop_caches();
    dev.arm(true);
    assert_eq!(fs.stat(100).unwrap_err().errno(), 5);
    assert!(fs.has_failed() && !fs.is_read_only(), "errors=continue records and goes on");
    fs.mkdir(ROOT_INO, b"meanwhile", 0o755, ROOT).unwrap();
    dev.arm(false);
    drop(fs);
    let errors = Some(uext4::Errors::RemountRo);
    let fs = Filesystem::open_device(dev.clone(), Options { errors, ..writable() }).unwrap();
    fs.drop_caches();
    dev.arm(true);
    assert_eq!(fs.stat(100).unwrap_err().errno(), 5);
    assert!(fs.has_failed() && fs.is_read_only(), "errors=remount-ro acts on the read error");
    assert_eq!(fs.mkdir(ROOT_INO, b"later", 0o755, ROOT).unwrap_err().errno(), 30);
    dev.arm(false);
    drop(fs);
    std::fs::write(&image, mem.contents()).unwrap();
    assert_eq!(oracle::dumpe2fs_field(&image, "FS Error count").as_deref(), Some("2"));
    assert_eq!(oracle::dumpe2fs_field(&image, "First error inode #").as_deref(), Some("100"));
    oracle::assert_e2fsck_clean(&image);
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
/// says so (dumpe2fs reads it). The error: an inode-table block that cannot be
/// read (a failed data write is no filesystem error, see below).
#[test]
fn errors_continue_and_remount_ro_without_a_journal() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    use uext4::fs::Errors;
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("nojournal.img");
    let base = mkfs(&image, 64, &["-O", "^has_journal"]);
    let table = {
        let out = oracle::run(Command::new("debugfs").args(["-R", "imap <100>"]).arg(&image));
        let at = out.split("located at block ").nth(1).unwrap();
        at.split(',').next().unwrap().trim().parse::<u64>().unwrap()
    };
    for (errors, read_only) in [(Errors::Continue, false), (Errors::RemountRo, true)] {
        let mem = Arc::new(MemDevice::new(base.clone()));
        let range = table * 4096..(table + 1) * 4096;
        let dev = Arc::new(BadSpotDevice::new(mem.clone(), BadSpot::Reads(range), false));
        let fs = Filesystem::open_device(dev.clone(), Options { errors: Some(errors), ..writable() }).unwrap();
        let ino = fs.create(ROOT_INO, b"f", 0o644, ROOT).unwrap().ino;
        fs.write(ino, 0, &[1u8; 8192]).unwrap();
        fs.sync().unwrap();
        fs.drop_caches();
        dev.arm(true);
        assert_eq!(fs.stat(100).unwrap_err().errno(), 5);
        dev.arm(false);
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
        assert_eq!(oracle::dumpe2fs_field(&image, "First error function").as_deref(), Some("read_inode_from_table"));
        assert_eq!(oracle::dumpe2fs_field(&image, "First error inode #").as_deref(), Some("100"));
        let listing = oracle::run(Command::new("debugfs").arg("-R").arg("ls -l /").arg(&image));
        assert!(listing.split_whitespace().any(|w| w == "f"), "{errors:?}: the created file is lost:\n{listing}");
        // A read error damages nothing: e2fsck finds only the recorded error.
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
                    || l.contains("WARNING: Filesystem still has errors"))
            })
            .collect();
        assert!(unexpected.is_empty(), "{errors:?}: e2fsck -fn finds damage:\n{report}");
    }
}

/// What a data write the device is to refuse begins with (see `doomed`).
const MARKER: &[u8] = b"uext4 test: this write fails";

/// `blocks` blocks of data whose first block is refused by a `BadSpot::WritesStartingWith(MARKER)` device.
fn doomed(blocks: usize) -> Vec<u8> {
    let mut data = vec![0x5a; blocks * 4096];
    data[..MARKER.len()].copy_from_slice(MARKER);
    data
}

/// A data write the device refuses is an EIO and nothing more, as on the
/// kernel's ext4 (a data I/O error is not a filesystem error). Written at
/// once (overwrites, runs of more than 16 blocks, preallocated space) it is
/// the writer's EIO: blocks taken for it go back, an unwritten extent stays
/// unwritten, what the call wrote before the failing run stands (a short
/// write). Waiting to be written (a small file's new blocks,
/// cache/write_behind.rs) it is the next fsync's EIO, once, as the kernel
/// reports a failed write-back; the blocks stay the file's. The superblock
/// records nothing, and under errors=remount-ro the filesystem goes on
/// writing. Extent-mapped and block-mapped files; e2fsck -fn judges the image
/// at the end.
#[test]
fn a_failed_data_write_is_an_eio_and_nothing_more() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    use uext4::space::FALLOC_FL_KEEP_SIZE;
    let work = tempfile::tempdir().unwrap();
    for (shape, extra) in [("extents", &[][..]), ("block map", &["-O", "^extents,^flex_bg", "-t", "ext3"][..])] {
        let image = work.path().join("data-eio.img");
        let mem = Arc::new(MemDevice::new(mkfs(&image, 64, extra)));
        let dev = Arc::new(BadSpotDevice::new(mem.clone(), BadSpot::WritesStartingWith(MARKER.to_vec()), true));
        let errors = Some(uext4::Errors::RemountRo);
        let fs = Filesystem::open_device(dev, Options { errors, ..writable() }).unwrap();
        let free = fs.free_blocks();
        let eio = |r: uext4::Result<usize>| r.map_err(|e| e.errno());

        // Into a hole, past an indirect block's reach for the block map (block
        // 20), a run too long to wait: the writer's EIO.
        let hole = fs.create(ROOT_INO, b"hole", 0o644, ROOT).unwrap().ino;
        assert_eq!(eio(fs.write(hole, 20 * 4096, &doomed(17))), Err(5), "{shape}: into a hole");
        let st = fs.stat(hole).unwrap();
        assert_eq!((st.size, st.blocks), (0, 0), "{shape}: the hole's blocks went back");
        assert_eq!(fs.free_blocks(), free, "{shape}: free blocks as before");

        // A small file's new block waits: the write succeeds, the fsync that
        // sends it reports the failure, once; the block stays the file's.
        let small = fs.create(ROOT_INO, b"small", 0o644, ROOT).unwrap().ino;
        assert_eq!(eio(fs.write(small, 0, &doomed(3))), Ok(3 * 4096), "{shape}: a small file's write waits");
        assert_eq!(fs.fsync(small).map_err(|e| e.errno()), Err(5), "{shape}: fsync reports the refused data");
        assert_eq!(fs.fsync(small).map_err(|e| e.errno()), Ok(()), "{shape}: reported once");
        assert_eq!(fs.stat(small).unwrap().size, 3 * 4096, "{shape}: the blocks stay the file's");

        // Over mapped blocks (still waiting to be written: sent first): the old bytes stay.
        let mapped = fs.create(ROOT_INO, b"mapped", 0o644, ROOT).unwrap().ino;
        fs.write(mapped, 0, &[7u8; 8192]).unwrap();
        assert_eq!(eio(fs.write(mapped, 0, &doomed(2))), Err(5), "{shape}: over mapped blocks");
        let mut back = vec![0u8; 8192];
        assert_eq!(fs.read(mapped, 0, &mut back).unwrap(), 8192);
        assert!(back.iter().all(|&b| b == 7), "{shape}: the old bytes stay");

        // A short write: the first run (mapped) is written, the second (a long
        // hole: past the block map's direct blocks, where one run can be 17) fails.
        fs.write(mapped, 30 * 4096, &[8u8; 4096]).unwrap();
        let mut data = vec![9u8; 4096];
        data.extend(doomed(17));
        assert_eq!(eio(fs.write(mapped, 30 * 4096, &data)), Ok(4096), "{shape}: a short write");
        assert_eq!(fs.stat(mapped).unwrap().size, 31 * 4096, "{shape}: the size covers what was written");

        if shape == "extents" {
            // Into preallocated space: the extent stays unwritten, reads give zeros.
            let prealloc = fs.create(ROOT_INO, b"prealloc", 0o644, ROOT).unwrap().ino;
            fs.fallocate(prealloc, 0, 64 * 4096, FALLOC_FL_KEEP_SIZE).unwrap();
            fs.write(prealloc, 0, &[3u8; 4096]).unwrap();
            assert_eq!(eio(fs.write(prealloc, 8 * 4096, &doomed(2))), Err(5), "into unwritten space");
            assert_eq!(fs.stat(prealloc).unwrap().size, 4096);
            fs.write(prealloc, 16 * 4096, &[4u8; 4096]).unwrap();
            let mut back = vec![1u8; 4096];
            fs.read(prealloc, 8 * 4096, &mut back).unwrap();
            assert!(back.iter().all(|&b| b == 0), "the failed range still reads as zeros");
        }

        assert!(!fs.has_failed() && !fs.is_read_only(), "{shape}: a data write error is not a filesystem error");
        fs.mkdir(ROOT_INO, b"afterwards", 0o755, ROOT).unwrap();
        fs.sync().unwrap();
        drop(fs);
        std::fs::write(&image, mem.contents()).unwrap();
        assert_eq!(oracle::dumpe2fs_field(&image, "FS Error count"), None, "{shape}: nothing recorded");
        oracle::assert_e2fsck_clean(&image);
    }
}

/// The journal superblock's errno says a previous mount aborted. The kernel's
/// mount (ext4_clear_journal_err) marks the filesystem as having errors, clears
/// the errno and adds no error record; uext4's writable open must leave the
/// same superblock behind (it used to add a record, counting the error twice).
#[test]
fn an_errno_from_a_previous_mount_marks_the_filesystem_as_the_kernel_does() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let base = work.path().join("base.img");
    // Without metadata_csum the journal superblock has no checksum to redo.
    mkfs(&base, 64, &["-O", "^metadata_csum"]);
    let journal_first = {
        let out = oracle::run(std::process::Command::new("debugfs").args(["-R", "bmap <8> 0"]).arg(&base));
        out.lines().filter_map(|l| l.trim().parse::<u64>().ok()).next().unwrap()
    };
    // jbd2's s_errno, big-endian at byte 0x20 of the journal superblock: -EIO.
    let mut bytes = std::fs::read(&base).unwrap();
    let at = (journal_first * 4096 + 0x20) as usize;
    bytes[at..at + 4].copy_from_slice(&(-5i32).to_be_bytes());
    let by_kernel = work.path().join("kernel.img");
    let by_uext4 = work.path().join("uext4.img");
    std::fs::write(&by_kernel, &bytes).unwrap();
    std::fs::write(&by_uext4, &bytes).unwrap();
    oracle::Mount::new(&by_kernel, "rw").unmount();
    drop(Filesystem::open(&by_uext4, writable()).unwrap());
    for field in ["Filesystem state", "FS Error count", "First error function", "Journal errno"] {
        assert_eq!(
            oracle::dumpe2fs_field(&by_uext4, field),
            oracle::dumpe2fs_field(&by_kernel, field),
            "dumpe2fs's {field:?} after uext4's open and after the kernel's mount"
        );
    }
    let state = oracle::dumpe2fs_field(&by_uext4, "Filesystem state").unwrap();
    assert!(state.contains("with errors"), "{state}");
}

/// errors=panic stops where the error is met, as the kernel's panic stops the
/// machine: the error is recorded, the call panics with a message frontends
/// recognize (`is_errors_panic`, so the CLI can say why it stopped instead of
/// reporting a bug), and nothing is written after it, the close included.
#[test]
fn errors_panic_stops_and_writes_nothing_more() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("panic.img");
    let base = mkfs(&image, 64, &["-O", "^has_journal"]);
    let table = {
        let out = oracle::run(Command::new("debugfs").args(["-R", "imap <100>"]).arg(&image));
        let at = out.split("located at block ").nth(1).unwrap();
        at.split(',').next().unwrap().trim().parse::<u64>().unwrap()
    };
    let mem = Arc::new(MemDevice::new(base));
    let range = table * 4096..(table + 1) * 4096;
    let dev = Arc::new(BadSpotDevice::new(mem.clone(), BadSpot::Reads(range), false));
    let errors = Some(uext4::Errors::Panic);
    let fs = Filesystem::open_device(dev.clone(), Options { errors, ..writable() }).unwrap();
    fs.sync().unwrap();
    // A change left in the cache (no journal): the stop must not write it.
    fs.mkdir(ROOT_INO, b"unwritten", 0o755, ROOT).unwrap();
    fs.drop_caches();
    dev.arm(true);
    let stopped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fs.stat(100)));
    dev.arm(false);
    let payload = stopped.expect_err("errors=panic panics");
    let message = payload.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(uext4::is_errors_panic(&message), "the panic says it is errors=panic: {message:?}");
    assert!(fs.is_read_only(), "nothing may change after the stop");
    let recorded = mem.contents();
    drop(fs);
    assert!(recorded == mem.contents(), "the close after an errors=panic stop wrote to the image");
    std::fs::write(&image, mem.contents()).unwrap();
    assert!(oracle::dumpe2fs_field(&image, "Filesystem state").unwrap().contains("with errors"));
    assert_eq!(oracle::dumpe2fs_field(&image, "First error function").as_deref(), Some("read_inode_from_table"));
}
