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
