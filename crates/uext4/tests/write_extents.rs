//! Extent trees under writes, judged by debugfs, e2fsck and the kernel: 100,000
//! random 4 KiB writes into a 10 GiB sparse file grow a tree of depth >= 2 and read
//! back exactly through the kernel; truncating it to 0 frees every block, tree
//! blocks included; a partial truncate keeps exactly the bytes below the cut; a file
//! written sequentially gets one extent per 32,768 blocks.

mod oracle;

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::process::Command;
use uext4::{Filesystem, Options, Owner, SetAttr, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };
const BS: u64 = 4096;

fn depth(image: &std::path::Path, path: &str) -> u32 {
    let out = oracle::run(Command::new("debugfs").arg("-R").arg(format!("ex {path}")).arg(image));
    out.lines()
        .filter_map(|l| l.trim().split_once('/').and_then(|(_, r)| r.split_whitespace().next()?.parse().ok()))
        .max()
        .unwrap_or(0)
}

fn block_content(lblk: u64, round: u32) -> Vec<u8> {
    let mut v = vec![0u8; BS as usize];
    for (i, b) in v.iter_mut().enumerate() {
        *b = (lblk as usize * 7 + i * 13 + round as usize) as u8 | 1;
    }
    v
}

#[test]
fn random_writes_grow_a_deep_tree_and_truncate_frees_it() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    uext4::mkfs::mkfs(&image, &uext4::mkfs::MkfsOptions { size: 2 << 30, ..Default::default() }).unwrap();
    let file_blocks: u64 = (10u64 << 30) / BS;
    let mut written: BTreeMap<u64, u32> = BTreeMap::new();
    let free_before;
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        free_before = fs.free_blocks();
        let ino = fs.create(ROOT_INO, b"sparse", 0o644, ROOT).unwrap().ino;
        fs.setattr(ino, &SetAttr { size: Some(10 << 30), ..Default::default() }).unwrap();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for round in 0..100_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let lblk = x % file_blocks;
            fs.write(ino, lblk * BS, &block_content(lblk, round)).unwrap();
            written.insert(lblk, round);
        }
    }
    oracle::assert_e2fsck_clean(&image);
    let d = depth(&image, "/sparse");
    assert!(d >= 2, "extent tree depth {d} after 100,000 random writes");
    {
        let m = oracle::Mount::new(&image, "ro");
        let f = std::fs::File::open(m.dir.join("sparse")).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 10 << 30);
        let mut buf = vec![0u8; BS as usize];
        for (&lblk, &round) in written.iter().step_by(7) {
            f.read_exact_at(&mut buf, lblk * BS).unwrap();
            assert!(buf == block_content(lblk, round), "block {lblk} differs through the kernel");
        }
        // A block never written reads as zeros.
        let hole = (0..file_blocks).find(|b| !written.contains_key(b)).unwrap();
        f.read_exact_at(&mut buf, hole * BS).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
    }
    {
        // Cut in the middle of a written block: everything above goes, the rest stays.
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let ino = fs.lookup_path(b"/sparse").unwrap();
        let (&cut_block, _) = written.iter().nth(written.len() / 2).unwrap();
        let cut = cut_block * BS + 100;
        fs.setattr(ino, &SetAttr { size: Some(cut), ..Default::default() }).unwrap();
        drop(fs);
        oracle::assert_e2fsck_clean(&image);
        let m = oracle::Mount::new(&image, "ro");
        let f = std::fs::File::open(m.dir.join("sparse")).unwrap();
        assert_eq!(f.metadata().unwrap().len(), cut);
        let mut buf = vec![0u8; BS as usize];
        for (&lblk, &round) in written.range(..cut_block).step_by(5) {
            f.read_exact_at(&mut buf, lblk * BS).unwrap();
            assert!(buf == block_content(lblk, round), "block {lblk} lost by the truncate");
        }
    }
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let ino = fs.lookup_path(b"/sparse").unwrap();
        fs.setattr(ino, &SetAttr { size: Some(0), ..Default::default() }).unwrap();
        assert_eq!(fs.stat(ino).unwrap().blocks, 0);
        assert_eq!(fs.free_blocks(), free_before, "truncate to 0 left blocks allocated");
    }
    oracle::assert_e2fsck_clean(&image);
}

#[test]
fn sequential_writes_make_one_extent_per_32768_blocks() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    uext4::mkfs::mkfs(&image, &uext4::mkfs::MkfsOptions { size: 1 << 30, ..Default::default() }).unwrap();
    let chunk: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 31) as u8).collect();
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let ino = fs.create(ROOT_INO, b"seq", 0o644, ROOT).unwrap().ino;
        for i in 0..300u64 {
            fs.write(ino, i << 20, &chunk).unwrap();
        }
    }
    oracle::assert_e2fsck_clean(&image);
    let out = oracle::run(Command::new("debugfs").arg("-R").arg("ex /seq").arg(&image));
    let extents = out.lines().filter(|l| l.trim_start().starts_with("0/")).count();
    // 300 MiB = 76,800 blocks: 32,768 + 32,768 + 11,264 (allocation may add a break).
    assert!((3..=4).contains(&extents), "{extents} extents for 76,800 blocks:\n{out}");
    let m = oracle::Mount::new(&image, "ro");
    let data = std::fs::read(m.dir.join("seq")).unwrap();
    assert_eq!(data.len(), 300 << 20);
    assert!(data.chunks(1 << 20).all(|c| c == chunk.as_slice()));
}

#[test]
fn writes_into_preallocated_space() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    uext4::mkfs::mkfs(&image, &uext4::mkfs::MkfsOptions { size: 256 << 20, ..Default::default() }).unwrap();
    // The kernel preallocates (unwritten extents); stale bytes sit in those blocks.
    {
        let m = oracle::Mount::new(&image, "");
        std::fs::write(m.dir.join("junk"), vec![0xEEu8; 8 << 20]).unwrap();
        std::fs::remove_file(m.dir.join("junk")).unwrap();
        oracle::run(Command::new("fallocate").args(["-l", "4M"]).arg(m.dir.join("pre")));
    }
    let mut expect = vec![0u8; 4 << 20];
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let ino = fs.lookup_path(b"/pre").unwrap();
        for (off, len) in [(0usize, 10usize), (4096 * 3 + 100, 5000), (2 << 20, 4096), ((4 << 20) - 7, 7), (777_777, 1)]
        {
            let data: Vec<u8> = (0..len).map(|i| (i % 250) as u8 + 1).collect();
            assert_eq!(fs.write(ino, off as u64, &data).unwrap(), len);
            expect[off..off + len].copy_from_slice(&data);
        }
        assert_eq!(fs.read_all(ino).unwrap(), expect, "uext4's own view");
    }
    oracle::assert_e2fsck_clean(&image);
    let m = oracle::Mount::new(&image, "ro");
    assert!(std::fs::read(m.dir.join("pre")).unwrap() == expect, "the kernel sees stale bytes or lost writes");
}
