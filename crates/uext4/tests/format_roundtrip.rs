//! The format layer against bytes e2fsprogs and the kernel wrote: every structure
//! parsed and serialized again (checksum recomputed by our code) must equal the
//! original byte for byte. mkfs.ext4 -d fills the images; when root, the kernel adds
//! a fragmented file so extent index blocks exist too.

mod oracle;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use uext4::dev::{BlockDevice, FileDevice};
use uext4::extent::MapKind;
use uext4::format::extent::{self as fext, ExtentNode};
use uext4::format::group_desc::GroupDesc;
use uext4::format::inode::{inode_csum_seed, Inode, EXT4_EXTENTS_FL, EXT4_INDEX_FL, EXT4_INLINE_DATA_FL};
use uext4::format::superblock::{Superblock, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE};
use uext4::format::{bitmap, dirent, htree, xattr};
use uext4::{FileType, Filesystem, Options, ROOT_INO};

fn build_tree(root: &Path) {
    let d = root.join("big-dir");
    std::fs::create_dir_all(&d).unwrap();
    for i in 0..400 {
        std::fs::write(d.join(format!("a-fairly-long-file-name-number-{i:04}")), format!("{i}")).unwrap();
    }
    std::fs::write(root.join("small"), b"tiny").unwrap();
    std::fs::write(root.join("medium"), vec![3u8; 150]).unwrap();
    std::fs::write(root.join("large"), vec![9u8; 200_000]).unwrap();
    std::os::unix::fs::symlink("t".repeat(200), root.join("slow-link")).unwrap();
    // Large values spill into an xattr block; not every host filesystem takes them.
    let attrs = root.join("attrs");
    std::fs::write(&attrs, b"x").unwrap();
    for (k, v) in [("user.small", "1".to_string()), ("user.big", "v".repeat(400)), ("user.big2", "w".repeat(300))] {
        let _ = Command::new("setfattr").arg("-n").arg(k).arg("-v").arg(v).arg(&attrs).status();
    }
}

fn make_image(dir: &Path, args: &[&str]) -> std::path::PathBuf {
    let src = dir.join("src");
    build_tree(&src);
    let image = dir.join("fs.img");
    oracle::run(Command::new("mkfs.ext4").args(["-q", "-F"]).args(args).arg("-d").arg(&src).arg(&image).arg("64M"));
    // mkfs.ext4 -d writes linear directories; e2fsck -D indexes the big one. Exit 1
    // means "filesystem changed", which is the point.
    let st = Command::new("e2fsck").args(["-fyD"]).arg(&image).output().unwrap().status;
    assert!(matches!(st.code(), Some(0 | 1)), "e2fsck -fyD: {st}");
    if oracle::can_loop_mount() {
        let m = oracle::Mount::new(&image, "");
        let d = m.dir.join("kernel-dir");
        std::fs::create_dir(&d).unwrap();
        for i in 0..600 {
            std::fs::write(d.join(format!("entry-made-by-the-kernel-{i:05}")), b"k").unwrap();
        }
        // Every other block of a sparse file: hundreds of extents, so index blocks.
        let f =
            std::fs::OpenOptions::new().create(true).truncate(true).write(true).open(m.dir.join("fragmented")).unwrap();
        use std::os::unix::fs::FileExt;
        for i in 0..2000u64 {
            f.write_all_at(&[1u8; 1024], i * 2048).unwrap();
        }
    }
    image
}

fn read(dev: &FileDevice, offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    dev.read_at(offset, &mut v).unwrap();
    v
}

/// Counts what was compared, so the test can insist each kind was seen.
#[derive(Default, Debug)]
struct Seen {
    inodes: usize,
    extent_blocks: usize,
    dir_blocks: usize,
    dx_nodes: usize,
    xattr_blocks: usize,
    bitmaps: usize,
}

fn check_image(image: &Path, expect_dx: bool) -> Seen {
    let dev = FileDevice::open(image, false).unwrap();
    let raw_sb = read(&dev, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE);
    let sb = Superblock::parse(&raw_sb, true).unwrap();
    assert_eq!(sb.to_bytes().to_vec(), raw_sb, "superblock round trip");
    let fs = Filesystem::open_device(Arc::new(FileDevice::open(image, false).unwrap()), Options::default()).unwrap();
    let g = fs.geometry().clone();
    let bs = g.block_size;
    let seed = g.csum_seed;
    let mut seen = Seen::default();

    for group in 0..g.group_count {
        let (blk, off) = Filesystem::group_desc_location(&sb, group);
        let raw = read(&dev, blk * bs as u64 + off as u64, g.desc_size);
        let gd = GroupDesc::parse(&raw, g.desc_size);
        let mut again = raw.clone();
        gd.write(&mut again, g.desc_size, group, g.gd_csum);
        assert_eq!(again, raw, "group descriptor {group}");
        if g.metadata_csum && gd.bg_flags & 1 == 0 {
            let ib = read(&dev, gd.bg_inode_bitmap * bs as u64, bs);
            assert!(bitmap::matches(
                gd.bg_inode_bitmap_csum,
                bitmap::checksum(&ib, g.inodes_per_group, seed),
                g.desc_size
            ));
            seen.bitmaps += 1;
        }
        if g.metadata_csum && gd.bg_flags & 2 == 0 {
            let bb = read(&dev, gd.bg_block_bitmap * bs as u64, bs);
            assert!(bitmap::matches(
                gd.bg_block_bitmap_csum,
                bitmap::checksum(&bb, g.blocks_per_group, seed),
                g.desc_size
            ));
            seen.bitmaps += 1;
        }
    }

    let mut inos = vec![2u32, 7, 8, 11];
    fs.walk(ROOT_INO, &mut |_, st| {
        inos.push(st.ino);
        Ok(())
    })
    .unwrap();
    inos.sort();
    inos.dedup();
    for &ino in &inos {
        let group = (ino - 1) / g.inodes_per_group;
        let index = (ino - 1) % g.inodes_per_group;
        let gd = fs.group_desc(group).unwrap();
        let raw = read(&dev, gd.bg_inode_table * bs as u64 + index as u64 * g.inode_size as u64, g.inode_size);
        let inode = Inode::parse(&raw).unwrap();
        if inode.i_mode == 0 && inode.i_links_count == 0 {
            continue;
        }
        let fs_seed = if g.metadata_csum { Some(seed) } else { None };
        assert_eq!(inode.to_bytes(ino, fs_seed), raw, "inode {ino} round trip");
        seen.inodes += 1;
        let iseed = inode_csum_seed(seed, ino, inode.i_generation);

        // Extent nodes below the root.
        if inode.has_flag(EXT4_EXTENTS_FL) {
            let mut stack = vec![ExtentNode::parse(&inode.i_block, None, "root").unwrap()];
            let mut again = inode.i_block;
            stack[0].write(&mut again);
            assert_eq!(again, inode.i_block, "extent root of inode {ino}");
            while let Some(node) = stack.pop() {
                if let ExtentNode::Index(_, idx) = node {
                    for e in idx {
                        let raw = read(&dev, e.leaf * bs as u64, bs);
                        let child = ExtentNode::parse(&raw, None, "node").unwrap();
                        let mut again = raw.clone();
                        child.write(&mut again);
                        if g.metadata_csum {
                            fext::set_block_checksum(&mut again, iseed);
                        }
                        assert_eq!(again, raw, "extent block {} of inode {ino}", e.leaf);
                        seen.extent_blocks += 1;
                        stack.push(child);
                    }
                }
            }
        }

        // Directory blocks: dirent tails, htree nodes.
        let is_dir = FileType::from_mode(inode.i_mode) == Some(FileType::Directory);
        if is_dir && !inode.has_flag(EXT4_INLINE_DATA_FL) && g.metadata_csum {
            for m in fs.file_mappings(ino, &inode).unwrap() {
                let MapKind::Mapped(p) = m.kind else { panic!("directory {ino} has a hole") };
                for k in 0..m.len {
                    let lblk = m.lblk + k;
                    let raw = read(&dev, (p + k) * bs as u64, bs);
                    let mut again = raw.clone();
                    let dx_root = inode.has_flag(EXT4_INDEX_FL) && lblk == 0;
                    let dx_node = inode.has_flag(EXT4_INDEX_FL) && lblk > 0 && raw[..4] == [0; 4] && {
                        dirent::rec_len_from_disk(u16::from_le_bytes([raw[4], raw[5]]), bs) == bs
                    };
                    if dx_root || dx_node {
                        let off = if dx_root { 0x20 } else { 8 };
                        let limit = htree::dx_limit(bs, off, true);
                        let node = htree::parse_node(&raw, off, limit, "dx").unwrap();
                        htree::write_node(&mut again, &node);
                        htree::set_checksum(&mut again, off, iseed).unwrap();
                        seen.dx_nodes += 1;
                    } else {
                        dirent::set_tail(&mut again, iseed);
                        seen.dir_blocks += 1;
                    }
                    assert_eq!(again, raw, "directory {ino} block {lblk}");
                }
            }
        }

        // The xattr block: checksum, entry hashes, block hash.
        if inode.i_file_acl != 0 {
            let blk = inode.i_file_acl;
            let raw = read(&dev, blk * bs as u64, bs);
            let (h, entries) = xattr::parse_block(&raw, blk).unwrap();
            for (e, v) in &entries {
                assert_eq!(xattr::entry_hash(&e.name, v), e.e_hash, "xattr entry hash in block {blk}");
            }
            let hashes: Vec<u32> = entries.iter().map(|(e, _)| e.e_hash).collect();
            // e2fsprogs leaves h_hash 0 (only the kernel's block-sharing cache uses it).
            if h.h_hash != 0 {
                assert_eq!(xattr::block_hash(&hashes), h.h_hash, "xattr block hash {blk}");
            }
            if g.metadata_csum {
                let mut again = raw.clone();
                xattr::set_block_checksum(&mut again, blk, seed);
                assert_eq!(again, raw, "xattr block {blk}");
            }
            seen.xattr_blocks += 1;
        }
    }
    assert!(seen.inodes > 400);
    if g.metadata_csum {
        assert!(seen.dir_blocks > 0 && seen.bitmaps > 0, "{seen:?}");
        if expect_dx {
            assert!(seen.dx_nodes > 0, "no htree nodes compared: {seen:?}");
        }
    }
    if oracle::can_loop_mount() && g.has_extents {
        assert!(seen.extent_blocks > 0, "no extent blocks compared: {seen:?}");
    }
    seen
}

#[test]
fn structures_round_trip_byte_for_byte() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    for args in [
        &[][..],
        &["-b", "4096"][..],
        &["-I", "128"][..],
        &["-O", "inline_data"][..],
        &["-O", "^metadata_csum"][..],
        &["-O", "^metadata_csum,uninit_bg"][..],
        &["-O", "^64bit"][..],
        &["-O", "^flex_bg"][..],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let image = make_image(dir.path(), args);
        let seen = check_image(&image, true);
        eprintln!("{args:?}: {seen:?}");
    }
}
