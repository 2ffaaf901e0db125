//! Taking turns with the kernel: the kernel writes, uext4 changes what it wrote,
//! the kernel changes what uext4 wrote, and uext4 reads the result; e2fsck -fn is
//! silent between every turn and each side sees exactly what the other left.

mod oracle;

use std::path::Path;
use uext4::{Filesystem, Options, Owner, SetAttr, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };

fn turns(mkfs_args: &[&str]) {
    turns_on("mkfs.ext4", mkfs_args, false);
}

/// Block-mapped files through every level with 1 KiB blocks: a block in each of
/// the direct, single, double and triple indirect ranges (logical block, byte).
const LEVEL_BLOCKS: [u64; 4] = [3, 12 + 100, 12 + 256 + 300, 12 + 256 + 65536 + 5];

fn level_byte(lblk: u64) -> u8 {
    (lblk % 251) as u8 + 1
}

/// The turns on an image made by `program` (mkfs.ext4, mkfs.ext3, mkfs.ext2) with
/// `args`; with `upgrade`, `tune2fs -O extent` runs after the kernel's first
/// turn, so uext4 changes the kernel's block-mapped files on an extent image.
fn turns_on(program: &str, args: &[&str], upgrade: bool) {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    oracle::make_shape(&image, program, args, "128M");
    let block_size: u64 = oracle::dumpe2fs_field(&image, "Block size").unwrap().parse().unwrap();

    // Turn 1: the kernel makes a tree, with a big (indexed) directory.
    {
        let m = oracle::Mount::new(&image, "");
        std::fs::create_dir_all(m.dir.join("k/big")).unwrap();
        for i in 0..3000 {
            std::fs::write(m.dir.join(format!("k/big/kernel-{i:05}")), format!("k{i}")).unwrap();
        }
        std::fs::write(m.dir.join("k/file"), vec![5u8; 200_000]).unwrap();
        std::os::unix::fs::symlink("file", m.dir.join("k/link")).unwrap();
        // A sparse file with a block at every level of a block map (1 KiB blocks).
        let levels = std::fs::File::create(m.dir.join("k/levels")).unwrap();
        for lblk in LEVEL_BLOCKS {
            let block = vec![level_byte(lblk); block_size as usize];
            std::os::unix::fs::FileExt::write_all_at(&levels, &block, lblk * block_size).unwrap();
        }
    }
    oracle::assert_e2fsck_clean(&image);
    if upgrade {
        oracle::upgrade_to_extents(&image);
        oracle::assert_e2fsck_clean(&image);
    }
    let levels_len = (LEVEL_BLOCKS[3] + 1) * block_size;
    // uext4 cuts the levels file back into its double-indirect range and writes
    // past its direct blocks again: what remains, as (logical block, byte).
    let cut_at = LEVEL_BLOCKS[2] + 1;

    // Turn 2: uext4 changes the kernel's tree.
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let big = fs.lookup_path(b"/k/big").unwrap();
        for i in (0..3000).step_by(2) {
            fs.unlink(big, format!("kernel-{i:05}").as_bytes()).unwrap();
        }
        for i in 0..1000 {
            let ino = fs.create(big, format!("uext4-{i:05}").as_bytes(), 0o640, ROOT).unwrap().ino;
            fs.write(ino, 0, format!("u{i}").as_bytes()).unwrap();
        }
        let file = fs.lookup_path(b"/k/file").unwrap();
        fs.write(file, 150_000, &[6u8; 100_000]).unwrap();
        fs.setattr(file, &SetAttr { perm: Some(0o600), ..Default::default() }).unwrap();
        let k = fs.lookup_path(b"/k").unwrap();
        fs.rename(k, b"link", ROOT_INO, b"moved-link", 0).unwrap();
        let u = fs.mkdir(ROOT_INO, b"u", 0o755, ROOT).unwrap().ino;
        fs.set_xattr(u, b"user.by", b"uext4", 0).unwrap();
        let levels = fs.lookup_path(b"/k/levels").unwrap();
        let mut buf = vec![0u8; block_size as usize];
        for lblk in LEVEL_BLOCKS {
            assert_eq!(fs.read(levels, lblk * block_size, &mut buf).unwrap(), block_size as usize);
            assert!(buf.iter().all(|&b| b == level_byte(lblk)), "uext4 reads the kernel's block {lblk}");
        }
        fs.setattr(levels, &SetAttr { size: Some(cut_at * block_size), ..Default::default() }).unwrap();
        fs.write(levels, 20 * block_size, &vec![0xEE; block_size as usize]).unwrap();
    }
    oracle::assert_e2fsck_clean(&image);

    // Turn 3: the kernel checks uext4's changes and changes them in turn.
    {
        let m = oracle::Mount::new(&image, "");
        let p = |s: &str| m.dir.join(s);
        let names: Vec<String> =
            std::fs::read_dir(p("k/big")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names.len(), 1500 + 1000);
        assert_eq!(std::fs::read_to_string(p("k/big/uext4-00777")).unwrap(), "u777");
        assert!(!p("k/big/kernel-00010").exists() && p("k/big/kernel-00011").exists());
        let file = std::fs::read(p("k/file")).unwrap();
        assert_eq!(file.len(), 250_000);
        assert!(file[..150_000].iter().all(|&b| b == 5) && file[150_000..].iter().all(|&b| b == 6));
        assert_eq!(std::fs::read_link(p("moved-link")).unwrap(), Path::new("file"));
        for i in 0..500 {
            std::fs::remove_file(p(&format!("k/big/uext4-{i:05}"))).unwrap();
            std::fs::write(p(&format!("u/kernel-in-u-{i}")), b"from the kernel").unwrap();
        }
        std::fs::rename(p("u"), p("k/u")).unwrap();
        let levels = std::fs::read(p("k/levels")).unwrap();
        assert_eq!(levels.len() as u64, cut_at * block_size);
        for (lblk, chunk) in levels.chunks(block_size as usize).enumerate() {
            let lblk = lblk as u64;
            let want = match lblk {
                20 => 0xEE,
                _ if LEVEL_BLOCKS.contains(&lblk) => level_byte(lblk),
                _ => 0,
            };
            assert!(chunk.iter().all(|&b| b == want), "the kernel reads block {lblk} of uext4's levels file");
        }
        // The kernel grows it back past the cut, into the triple indirect range.
        let f = std::fs::OpenOptions::new().write(true).open(p("k/levels")).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"kernel", levels_len).unwrap();
    }
    oracle::assert_e2fsck_clean(&image);

    // Turn 4: uext4 reads what the kernel did.
    let fs = Filesystem::open(&image, Options::default()).unwrap();
    let big = fs.lookup_path(b"/k/big").unwrap();
    assert_eq!(fs.read_dir(big).unwrap().len(), 2 + 1500 + 500);
    assert!(fs.lookup(big, b"uext4-00100").unwrap().is_none());
    assert!(fs.lookup(big, b"uext4-00900").unwrap().is_some());
    let u = fs.lookup_path(b"/k/u").unwrap();
    assert_eq!(fs.read_dir(u).unwrap().len(), 2 + 500);
    assert_eq!(fs.get_xattr(u, b"user.by").unwrap().as_deref(), Some(&b"uext4"[..]));
    assert_eq!(fs.lookup(u, b"..").unwrap(), Some(fs.lookup_path(b"/k").unwrap()));
    let levels = fs.read_all(fs.lookup_path(b"/k/levels").unwrap()).unwrap();
    assert_eq!(levels.len() as u64, levels_len + 6);
    assert_eq!(&levels[levels_len as usize..], b"kernel");
    assert!(levels[(cut_at * block_size) as usize..levels_len as usize].iter().all(|&b| b == 0));
    drop(fs);
    // Turn 5: uext4 removes the whole tree the two of them made.
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let k = fs.lookup_path(b"/k").unwrap();
        for name in [&b"file"[..], b"levels"] {
            fs.unlink(k, name).unwrap();
        }
    }
    oracle::assert_e2fsck_clean(&image);
}

#[test]
fn taking_turns_with_the_kernel() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    turns(&[]);
    turns(&["-b", "4096"]);
    turns(&["-O", "^metadata_csum"]);
}

/// Issue 15's shapes, each taking turns with the kernel: block maps (the kernel's
/// and uext4's files through every level), no filetype, no dir_index, no journal,
/// ext2, ext3, and an ext3 upgraded between the kernel's turn and uext4's.
#[test]
fn taking_turns_with_the_kernel_on_every_kernel_shape() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    for &(shape, program, args, upgrade) in oracle::WRITE_SHAPES {
        eprintln!("shape {shape}");
        turns_on(program, args, upgrade);
    }
}
