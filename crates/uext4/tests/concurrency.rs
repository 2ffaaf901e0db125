//! `Filesystem` is shared between threads by reference: several threads walking and
//! reading one image at once see exactly what one thread sees, and the bounded cache
//! serves a repeated walk without touching the device.

mod oracle;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use uext4::dev::{BlockDevice, FileDevice};
use uext4::{FileType, Filesystem, Options, ROOT_INO};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn filesystem_is_send_and_sync() {
    assert_send_sync::<Filesystem>();
}

/// path -> (ino, size, sha256 of contents or symlink target)
fn digest_tree(fs: &Filesystem) -> BTreeMap<Vec<u8>, (u32, u64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    fs.walk(ROOT_INO, &mut |path, st| {
        out.insert(path.to_vec(), (st.ino, st.size, oracle::content_digest(fs, st)?));
        Ok(())
    })
    .unwrap();
    out
}

#[test]
fn many_threads_read_one_image_consistently() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    for d in 0..8 {
        let sub = src.join(format!("dir{d}"));
        std::fs::create_dir_all(&sub).unwrap();
        for f in 0..200 {
            let body: Vec<u8> = (0..(f * 37 + d * 11) % 9000).map(|i| (i * 7 + f) as u8).collect();
            std::fs::write(sub.join(format!("file-{f:03}")), body).unwrap();
        }
    }
    let image = dir.path().join("fs.img");
    oracle::run(Command::new("mkfs.ext4").args(["-q", "-F", "-d"]).arg(&src).arg(&image).arg("64M"));

    let reference = {
        let fs = Filesystem::open(&image, Options::default()).unwrap();
        digest_tree(&fs)
    };
    assert_eq!(reference.len(), 1 + 1 + 8 + 8 * 200, "root, lost+found, dirs, files");

    // A small cache forces eviction while threads race.
    let fs = Arc::new(Filesystem::open(&image, Options { cache_mb: 1, ..Options::default() }).unwrap());
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let fs = fs.clone();
            std::thread::spawn(move || digest_tree(&fs))
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), reference);
    }
    assert!(fs.cache().len() <= fs.cache().capacity() + 64, "cache exceeded its bound");
}

#[test]
fn a_second_walk_is_served_from_the_cache() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    for f in 0..500 {
        std::fs::write(src.join("d").join(format!("f{f}")), b"x").unwrap();
    }
    let image = dir.path().join("fs.img");
    oracle::run(Command::new("mkfs.ext4").args(["-q", "-F", "-d"]).arg(&src).arg(&image).arg("64M"));
    let dev = Arc::new(FileDevice::open(&image, false).unwrap());
    let fs = Filesystem::open_device(dev.clone(), Options::default()).unwrap();
    let walk = |fs: &Filesystem| {
        fs.walk(ROOT_INO, &mut |_, st| {
            if st.file_type == FileType::Directory {
                fs.read_dir(st.ino)?;
            }
            Ok(())
        })
        .unwrap()
    };
    walk(&fs);
    let reads = dev.stats().reads;
    let verified = fs.cache().stats().checksum_verifications;
    walk(&fs);
    assert_eq!(dev.stats().reads, reads, "the second walk read from the device");
    assert_eq!(fs.cache().stats().checksum_verifications, verified, "a cached block was verified again");
}

/// The inode cache never hides a change another thread finished first, and
/// two filesystems open in one process never answer for each other. One thread
/// sets a directory's mtime to 1, 2, 3, ... and publishes each after setattr
/// returns; readers, looking up names in that directory and statting it, must
/// see at least the published value every time. Two images are open at once
/// with the same directory inode numbers (their mtimes differ by 10^9). A
/// per-thread copy of directory inodes was tried (and not kept, it measured no
/// faster); this held it to what the shared cache answers.
#[test]
fn a_threads_directory_copy_never_hides_a_finished_change() {
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    use uext4::format::inode::Timestamp;
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut filesystems = Vec::new();
    for n in 0..2 {
        let image = dir.path().join(format!("fs{n}.img"));
        oracle::run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image).arg("32M"));
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let d = fs.mkdir(ROOT_INO, b"d", 0o755, uext4::Owner { uid: 0, gid: 0 }).unwrap().ino;
        for i in 0..200 {
            fs.create(d, format!("f{i}").as_bytes(), 0o644, uext4::Owner { uid: 0, gid: 0 }).unwrap();
        }
        filesystems.push((Arc::new(fs), d));
    }
    assert_eq!(filesystems[0].1, filesystems[1].1, "the same directory number in both");
    let published = AtomicI64::new(0);
    let stop = AtomicBool::new(false);
    const BASE: [i64; 2] = [0, 1_000_000_000];
    // Value 0 (BASE) set before the readers start: until then a directory's mtime
    // is the time it was made, which no published value describes.
    for (n, (fs, d)) in filesystems.iter().enumerate() {
        let t = Timestamp { sec: BASE[n], nsec: 0 };
        fs.setattr(*d, &uext4::SetAttr { mtime: Some(t), ..Default::default() }).unwrap();
    }
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let seen = published.load(Ordering::Acquire);
                    for (n, (fs, d)) in filesystems.iter().enumerate() {
                        assert!(fs.lookup(*d, format!("f{}", i % 200).as_bytes()).unwrap().is_some());
                        let mtime = fs.stat(*d).unwrap().mtime.sec - BASE[n];
                        assert!(mtime >= seen, "filesystem {n}: directory mtime {mtime} after {seen} was set");
                        assert!(mtime < 1_000_000, "filesystem {n} saw the other's directory: {mtime}");
                    }
                    i += 1;
                }
            });
        }
        for k in 1..=3_000i64 {
            for (n, (fs, d)) in filesystems.iter().enumerate() {
                let t = Timestamp { sec: BASE[n] + k, nsec: 0 };
                fs.setattr(*d, &uext4::SetAttr { mtime: Some(t), ..Default::default() }).unwrap();
            }
            published.store(k, Ordering::Release);
        }
        stop.store(true, Ordering::Relaxed);
    });
}
