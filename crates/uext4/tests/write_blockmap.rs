//! Block-mapped files through every level of the map, judged by debugfs, e2fsck,
//! dumpe2fs and the kernel: on 1 KiB-block images without extents (ext2, ext3 and
//! ext4 -O ^extent), uext4 writes past block 12 (a single indirect block), past
//! 12 + 256 (double) and past 12 + 256 + 65536 (triple); debugfs `stat` must show
//! (IND), (DIND) and (TIND) appear in turn, the indirect block before the data it
//! maps (the kernel's ext4_alloc_branch order), the kernel must read every byte,
//! then truncation back through each level must drop them again, in reverse, and
//! leave the free block count (uext4's and dumpe2fs's) where it started. A punch
//! and an unlink of a file spanning all levels give back everything too.

mod oracle;

use std::path::Path;
use std::process::Command;
use uext4::file::space::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE};
use uext4::{Error, Filesystem, Options, Owner, SetAttr, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };
const BS: u64 = 1024;
const PER: u64 = BS / 4;
const IND_START: u64 = 12;
const DIND_START: u64 = IND_START + PER;
const TIND_START: u64 = DIND_START + PER * PER;
/// The spanning file's runs (start, blocks): across the direct, single and
/// double indirect ranges, inside the double, and into the triple.
const RUNS: [(u64, u64); 3] = [(0, 300), (DIND_START + 200, 600), (TIND_START - 300, 600)];

fn debugfs_stat(image: &Path, path: &str) -> String {
    oracle::run(Command::new("debugfs").arg("-R").arg(format!("stat {path}")).arg(image))
}

fn free_blocks_dumpe2fs(image: &Path) -> u64 {
    oracle::dumpe2fs_field(image, "Free blocks").unwrap().parse().unwrap()
}

/// Which of (IND), (DIND), (TIND) debugfs shows for `path`.
fn levels_shown(image: &Path, path: &str) -> [bool; 3] {
    let stat = debugfs_stat(image, path);
    assert!(!stat.contains("EXTENTS"), "{path} is extent-mapped:\n{stat}");
    ["(IND)", "(DIND)", "(TIND)"].map(|l| stat.contains(l))
}

fn block_of(lblk: u64) -> Vec<u8> {
    (0..BS).map(|i| ((lblk * 7 + i) % 251) as u8).collect()
}

/// The kernel's read of the file equals `expect` (a sparse map of written blocks).
fn kernel_reads(image: &Path, path: &str, size: u64, written: &[u64]) {
    let m = oracle::Mount::new(image, "ro");
    let data = std::fs::read(m.dir.join(path.trim_start_matches('/'))).unwrap();
    assert_eq!(data.len() as u64, size, "kernel size of {path}");
    for (lblk, chunk) in data.chunks(BS as usize).enumerate() {
        let lblk = lblk as u64;
        if written.contains(&lblk) {
            assert!(chunk == &block_of(lblk)[..chunk.len()], "kernel reads block {lblk} of {path} wrong");
        } else {
            assert!(chunk.iter().all(|&b| b == 0), "kernel reads a hole at block {lblk} of {path} as data");
        }
    }
}

fn levels_on(program: &str, args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    oracle::run(Command::new(program).args(["-q", "-F", "-b", "1024"]).args(args).arg(&image).arg("128M"));
    let start_free = free_blocks_dumpe2fs(&image);
    let ino;
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        assert_eq!(fs.free_blocks(), start_free);
        ino = fs.create(ROOT_INO, b"levels", 0o644, ROOT).unwrap().ino;
        // Direct blocks only.
        fs.write(ino, 0, &block_of(0)).unwrap();
        fs.write(ino, 5 * BS, &block_of(5)).unwrap();
    }
    oracle::assert_e2fsck_clean(&image);
    assert_eq!(levels_shown(&image, "/levels"), [false, false, false]);
    let mut written = vec![0, 5];
    // Past each boundary in turn: the level appears, everything before stays.
    for (step, lblk) in [IND_START, DIND_START + 3, TIND_START + 2].into_iter().enumerate() {
        {
            let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
            fs.write(ino, lblk * BS, &block_of(lblk)).unwrap();
        }
        written.push(lblk);
        oracle::assert_e2fsck_clean(&image);
        let shown = levels_shown(&image, "/levels");
        let want: [bool; 3] = std::array::from_fn(|i| i <= step);
        assert_eq!(shown, want, "after a write at block {lblk}");
        kernel_reads(&image, "/levels", (lblk + 1) * BS, &written);
    }
    // A new block-mapped file's indirect block comes right before the data it maps.
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let seq = fs.create(ROOT_INO, b"sequential", 0o644, ROOT).unwrap().ino;
        let data: Vec<u8> = (0..20).flat_map(block_of).collect();
        fs.write(seq, 0, &data).unwrap();
    }
    oracle::assert_e2fsck_clean(&image);
    let stat = debugfs_stat(&image, "/sequential");
    let blocks = stat.split("BLOCKS:").nth(1).unwrap_or_default().to_string();
    let ind: u64 = blocks.split("(IND):").nth(1).and_then(|r| r.split(',').next()).unwrap().trim().parse().unwrap();
    let after: u64 = blocks
        .split("(12-19):")
        .nth(1)
        .and_then(|r| r.split('-').next())
        .unwrap_or_else(|| panic!("blocks 12-19 not one run:\n{blocks}"))
        .trim()
        .parse()
        .unwrap();
    assert_eq!(after, ind + 1, "the indirect block should precede block 12's data:\n{blocks}");

    // Back through each level: the deepest goes first.
    let cuts = [(TIND_START, [true, true, false]), (DIND_START, [true, false, false]), (IND_START, [false; 3])];
    for (size_blocks, want) in cuts {
        {
            let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
            fs.setattr(ino, &SetAttr { size: Some(size_blocks * BS), ..Default::default() }).unwrap();
        }
        oracle::assert_e2fsck_clean(&image);
        assert_eq!(levels_shown(&image, "/levels"), want, "after truncating to block {size_blocks}");
        written.retain(|&b| b < size_blocks);
        kernel_reads(&image, "/levels", size_blocks * BS, &written);
    }
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        fs.setattr(ino, &SetAttr { size: Some(0), ..Default::default() }).unwrap();
        fs.unlink(ROOT_INO, b"sequential").unwrap();
        assert_eq!(fs.free_blocks(), start_free, "uext4's free count after truncating to 0");
    }
    oracle::assert_e2fsck_clean(&image);
    assert_eq!(free_blocks_dumpe2fs(&image), start_free, "free blocks after truncating back");
    assert!(debugfs_stat(&image, "/levels").contains("Blockcount: 0"));

    // A file across every level, punched in its double-indirect range, then unlinked.
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let f = fs.create(ROOT_INO, b"spanning", 0o644, ROOT).unwrap().ino;
        for (start, len) in RUNS {
            let run: Vec<u8> = (0..len).flat_map(block_of).collect();
            fs.write(f, start * BS, &run).unwrap();
        }
        // Block maps hold no unwritten blocks: preallocation is refused, unchanged.
        let before = fs.free_blocks();
        assert!(matches!(fs.fallocate(f, 0, 10 * BS, 0), Err(Error::Unsupported { .. })));
        assert_eq!(fs.free_blocks(), before);
        let (punch_from, punch_to) = (DIND_START + PER, DIND_START + 4 * PER);
        fs.fallocate(f, punch_from * BS, (punch_to - punch_from) * BS, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)
            .unwrap();
        // The data there (the second run's blocks from the punch on) goes, and the
        // three single indirect blocks that mapped only them, emptied, go with it.
        let punched_data = DIND_START + 200 + 600 - punch_from;
        assert_eq!(fs.free_blocks(), before + punched_data + 3);
    }
    oracle::assert_e2fsck_clean(&image);
    {
        // Each run was written with block_of(offset in the run).
        let m = oracle::Mount::new(&image, "ro");
        let data = std::fs::read(m.dir.join("spanning")).unwrap();
        for (start, len) in RUNS {
            for i in 0..len {
                let lblk = start + i;
                let chunk = &data[(lblk * BS) as usize..((lblk + 1) * BS) as usize];
                let punched = (DIND_START + PER..DIND_START + 4 * PER).contains(&lblk);
                let want = if punched { vec![0u8; BS as usize] } else { block_of(i) };
                assert!(chunk == &want[..], "kernel reads block {lblk} of the punched file wrong");
            }
        }
    }
    assert_eq!(levels_shown(&image, "/spanning"), [true, true, true]);
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        fs.unlink(ROOT_INO, b"spanning").unwrap();
        fs.unlink(ROOT_INO, b"levels").unwrap();
    }
    oracle::assert_e2fsck_clean(&image);
    assert_eq!(free_blocks_dumpe2fs(&image), start_free, "free blocks after the unlinks");
    eprintln!("{program} {args:?}: every level written, read by the kernel and given back");
}

#[test]
fn files_through_every_block_map_level() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    levels_on("mkfs.ext2", &[]);
    levels_on("mkfs.ext3", &[]);
    levels_on("mkfs.ext4", &["-O", "^extent,^64bit"]);
}
