//! Indexed directories written by uext4: a one-block directory turns into an htree
//! when it fills, leaves split, index nodes split, and the root gains a level; then
//! names are removed again. e2fsck -fn must stay silent, debugfs must report the
//! index depth, and the kernel must list exactly the names left.

mod oracle;

use std::collections::BTreeSet;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;
use uext4::{Filesystem, Options, Owner, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };

fn name(i: usize, len: usize) -> Vec<u8> {
    let mut n = format!("{i:07}-").into_bytes();
    if i.is_multiple_of(3) {
        n.extend_from_slice(b"\xc3\xa9");
    }
    n.resize(len.max(n.len()), b'z');
    n
}

fn levels(image: &std::path::Path) -> Option<u32> {
    let out = oracle::run(Command::new("debugfs").arg("-R").arg("htree /big").arg(image));
    out.lines().find_map(|l| l.trim().strip_prefix("Indirect levels:").map(|v| v.trim().parse().unwrap()))
}

/// The kernel lists an indexed directory in hash order (`ext4_dx_readdir`), and
/// uext4's `read_dir` must list it in the same order, name for name: what a
/// program walking either sees, and what `hash_goal` lines inode numbers up with.
fn assert_kernel_listing_order(image: &std::path::Path, dir: &str) {
    let m = oracle::Mount::new(image, "ro");
    let kernel: Vec<Vec<u8>> =
        std::fs::read_dir(m.dir.join(dir)).unwrap().map(|e| e.unwrap().file_name().as_bytes().to_vec()).collect();
    m.unmount();
    let fs = Filesystem::open(image, Options::default()).unwrap();
    let ino = fs.lookup_path(format!("/{dir}").as_bytes()).unwrap();
    let ours: Vec<Vec<u8>> = fs.read_dir(ino).unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(&ours[..2], &[b".".to_vec(), b"..".to_vec()], "the dots come first");
    assert_eq!(ours.len() - 2, kernel.len());
    let first_difference = ours[2..].iter().zip(&kernel).position(|(a, b)| a != b);
    assert_eq!(first_difference, None, "uext4's listing departs from the kernel's readdir order");
}

/// `count` names of `len` bytes into one new directory, then every third removed.
fn fill_and_thin(mkfs_args: &[&str], size: &str, count: usize, len: usize, want_levels: u32) {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    oracle::run(Command::new("mkfs.ext4").args(["-q", "-F"]).args(mkfs_args).arg(&image).arg(size));
    let mut expect = BTreeSet::new();
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let big = fs.mkdir(ROOT_INO, b"big", 0o755, ROOT).unwrap().ino;
        for i in 0..count {
            fs.create(big, &name(i, len), 0o644, ROOT).unwrap();
            expect.insert(name(i, len));
        }
        // Every name is found through the index uext4 built.
        for i in (0..count).step_by(7) {
            assert!(fs.lookup(big, &name(i, len)).unwrap().is_some(), "lookup {i}");
        }
        fs.sync().unwrap();
    }
    oracle::assert_e2fsck_clean(&image);
    let got = levels(&image);
    assert!(got.is_some_and(|l| l >= want_levels), "{mkfs_args:?}: index levels {got:?}, wanted {want_levels}");
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let big = fs.lookup_path(b"/big").unwrap();
        for i in (0..count).step_by(3) {
            fs.unlink(big, &name(i, len)).unwrap();
            expect.remove(&name(i, len));
        }
        // And new names still go in after removals.
        for i in count..count + 500 {
            fs.create(big, &name(i, len), 0o644, ROOT).unwrap();
            expect.insert(name(i, len));
        }
    }
    oracle::assert_e2fsck_clean(&image);
    let m = oracle::Mount::new(&image, "ro");
    let seen: BTreeSet<Vec<u8>> =
        std::fs::read_dir(m.dir.join("big")).unwrap().map(|e| e.unwrap().file_name().as_bytes().to_vec()).collect();
    assert_eq!(seen.len(), expect.len(), "{mkfs_args:?}");
    assert!(seen == expect, "{mkfs_args:?}: the kernel lists different names");
    // The kernel's own lookups through our index.
    for n in expect.iter().step_by(101) {
        assert!(m.dir.join("big").join(std::ffi::OsStr::from_bytes(n)).exists());
    }
    m.unmount();
    assert_kernel_listing_order(&image, "big");
}

#[test]
fn one_level_index_4k() {
    fill_and_thin(&["-b", "4096"], "256M", 5000, 60, 0);
}

#[test]
fn two_level_index_1k() {
    // 1 KiB blocks and 100-byte names: about 8 names a leaf, so 20,000 names need
    // more leaves than one root (123 entries) can index.
    fill_and_thin(&["-b", "1024"], "256M", 20_000, 100, 1);
}

#[test]
fn two_level_index_without_metadata_csum() {
    fill_and_thin(&["-b", "1024", "-O", "^metadata_csum"], "256M", 20_000, 100, 1);
}

#[test]
fn unsigned_hash_and_tea() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    // The same on an image whose directories hash with unsigned TEA.
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    oracle::run(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "1024"]).arg(&image).arg("64M"));
    for r in ["ssv def_hash_version tea", "ssv flags 2"] {
        oracle::run(Command::new("debugfs").arg("-w").arg("-R").arg(r).arg(&image));
    }
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let big = fs.mkdir(ROOT_INO, b"big", 0o755, ROOT).unwrap().ino;
        for i in 0..3000 {
            fs.create(big, &name(i, 40), 0o644, ROOT).unwrap();
        }
    }
    oracle::assert_e2fsck_clean(&image);
    if oracle::require_loop() {
        assert_kernel_listing_order(&image, "big");
    }
}

#[test]
fn one_million_entries() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    oracle::run(Command::new("mkfs.ext4").args(["-q", "-F", "-N", "1100000"]).arg(&image).arg("2G"));
    let count = 1_000_000;
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let big = fs.mkdir(ROOT_INO, b"big", 0o755, ROOT).unwrap().ino;
        for i in 0..count {
            fs.create(big, format!("entry-{i:07}").as_bytes(), 0o644, ROOT).unwrap();
        }
        for i in (0..count).step_by(9973) {
            assert!(fs.lookup(big, format!("entry-{i:07}").as_bytes()).unwrap().is_some());
        }
    }
    oracle::assert_e2fsck_clean(&image);
    let m = oracle::Mount::new(&image, "ro");
    assert_eq!(std::fs::read_dir(m.dir.join("big")).unwrap().count(), count);
    assert!(m.dir.join("big/entry-0765432").exists());
}

#[test]
fn three_levels_with_large_dir() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    // 1 KiB blocks and 250-byte names: 3 names a leaf, so ~40,000 names need more
    // leaves than two levels (123 x 126) can index.
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    oracle::run(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", "1024", "-N", "60000", "-O", "large_dir"])
            .arg(&image)
            .arg("512M"),
    );
    let count = 45_000;
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let big = fs.mkdir(ROOT_INO, b"big", 0o755, ROOT).unwrap().ino;
        for i in 0..count {
            fs.create(big, &name(i, 250), 0o644, ROOT).unwrap_or_else(|e| panic!("name {i}: {e}"));
        }
    }
    oracle::assert_e2fsck_clean(&image);
    let got = levels(&image);
    assert_eq!(got, Some(2), "index levels below the root");
    let m = oracle::Mount::new(&image, "ro");
    assert_eq!(std::fs::read_dir(m.dir.join("big")).unwrap().count(), count);
}
