//! uext4's mkfs judged by e2fsprogs and the kernel: every shape and size passes
//! `e2fsck -fn` silently, `dumpe2fs -h` shows the features asked for, and the kernel
//! mounts the image read-write, takes 1,000 files, and leaves it e2fsck-clean.

mod oracle;

use std::path::Path;
use uext4::mkfs::{mkfs, MkfsOptions};
use uext4::{Filesystem, Options};

fn make(dir: &Path, size: u64, features: &[&str], block_size: Option<u32>, inode_size: u16) -> std::path::PathBuf {
    let image = dir.join("fs.img");
    let opts = MkfsOptions {
        size,
        block_size,
        inode_size,
        features: features.iter().map(|s| s.to_string()).collect(),
        label: "mkfs-test".into(),
        ..MkfsOptions::default()
    };
    mkfs(&image, &opts).unwrap_or_else(|e| panic!("mkfs {features:?} {size}: {e}"));
    image
}

const MIB: u64 = 1 << 20;

/// (features, block size, inode size, size)
fn shapes() -> Vec<(Vec<&'static str>, Option<u32>, u16, u64)> {
    vec![
        (vec![], None, 256, 64 * MIB),
        (vec![], Some(4096), 256, 300 * MIB),
        (vec![], Some(1024), 128, 100 * MIB),
        (vec!["inline_data"], None, 256, 64 * MIB),
        (vec!["^has_journal"], None, 256, 64 * MIB),
        (vec!["^metadata_csum"], None, 256, 64 * MIB),
        (vec!["^metadata_csum", "uninit_bg"], None, 256, 64 * MIB),
        (vec!["^64bit"], None, 256, 64 * MIB),
        (vec!["^flex_bg"], None, 256, 64 * MIB),
        (vec!["^extent"], None, 256, 64 * MIB),
        // The root's and lost+found's entries once carried a file type here.
        (vec!["^filetype"], Some(1024), 256, 64 * MIB),
        // Turning off what uext4 never makes is accepted, as mkfs.ext4 users write it.
        (vec!["^resize_inode", "^orphan_file", "^bigalloc"], None, 256, 64 * MIB),
        (vec!["large_dir", "metadata_csum_seed"], Some(4096), 256, 128 * MIB),
    ]
}

#[test]
fn every_shape_passes_e2fsck_and_shows_its_features() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    for (features, bs, isz, size) in shapes() {
        let dir = tempfile::tempdir().unwrap();
        let image = make(dir.path(), size, &features, bs, isz);
        oracle::assert_e2fsck_clean(&image);
        let shown = oracle::dumpe2fs_field(&image, "Filesystem features").unwrap();
        let shown: Vec<&str> = shown.split_whitespace().collect();
        let mut expected = vec!["ext_attr", "dir_index", "sparse_super", "large_file", "huge_file", "dir_nlink"];
        expected.push("extra_isize");
        for (name, default_on) in [
            ("has_journal", true),
            ("filetype", true),
            ("extent", true),
            ("64bit", true),
            ("flex_bg", true),
            ("metadata_csum", true),
            ("inline_data", false),
            ("uninit_bg", false),
            ("large_dir", false),
            ("metadata_csum_seed", false),
        ] {
            let off_by_extent = name == "64bit" && features.contains(&"^extent");
            let on = if features.contains(&format!("^{name}").as_str()) || off_by_extent {
                false
            } else {
                default_on || features.contains(&name)
            };
            if on {
                expected.push(name);
            } else {
                assert!(!shown.contains(&name), "{features:?}: {name} should be off, dumpe2fs shows {shown:?}");
            }
        }
        for f in expected {
            assert!(shown.contains(&f), "{features:?}: dumpe2fs does not show {f}: {shown:?}");
        }
        assert_eq!(oracle::dumpe2fs_field(&image, "Filesystem volume name").as_deref(), Some("mkfs-test"));
        let want_bs = bs.unwrap_or(if size < 512 * MIB { 1024 } else { 4096 });
        assert_eq!(oracle::dumpe2fs_field(&image, "Block size"), Some(want_bs.to_string()));
        assert_eq!(oracle::dumpe2fs_field(&image, "Inode size"), Some(isz.to_string()));
    }
}

#[test]
fn sizes_from_8_mib_to_1_tib_pass_e2fsck() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    for size in [8 * MIB, 9 * MIB, 33 * MIB, 513 * MIB, 4097 * MIB, 64 << 30, 1 << 40] {
        let dir = tempfile::tempdir().unwrap();
        let image = make(dir.path(), size, &[], None, 256);
        oracle::assert_e2fsck_clean(&image);
        // The image is sparse: making it writes only metadata.
        let used = std::fs::metadata(&image).map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512).unwrap();
        assert!(used < size / 8 + 64 * MIB, "{size}-byte image uses {used} bytes on the host");
        let blocks: u64 = oracle::dumpe2fs_field(&image, "Block count").unwrap().parse().unwrap();
        let bs: u64 = oracle::dumpe2fs_field(&image, "Block size").unwrap().parse().unwrap();
        // The last group may be trimmed, by less than one group.
        assert!(blocks * bs <= size && blocks * bs + 8 * bs * bs > size, "{size}: {blocks} x {bs}");
    }
}

#[test]
fn bad_requests_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("x.img");
    // Every refusal comes before the file is opened: what it held stays.
    std::fs::write(&image, b"precious bytes").unwrap();
    let try_make = |size: u64, features: &[&str], bs: Option<u32>| {
        let opts = MkfsOptions {
            size,
            block_size: bs,
            features: features.iter().map(|s| s.to_string()).collect(),
            ..MkfsOptions::default()
        };
        mkfs(&image, &opts).err().map(|e| e.to_string())
    };
    assert!(try_make(7 * MIB, &[], None).unwrap().contains("outside"));
    assert!(try_make((1 << 40) + 4096, &[], None).unwrap().contains("outside"));
    assert!(try_make(64 * MIB, &["bigalloc"], None).unwrap().contains("bigalloc"));
    assert!(try_make(64 * MIB, &["no_such_feature"], None).unwrap().contains("no_such_feature"));
    assert!(try_make(64 * MIB, &[], Some(3000)).unwrap().contains("block size"));
    assert!(try_make(64 * MIB, &["^extent", "64bit"], None).unwrap().contains("64bit needs"));
    let kept = std::fs::read(&image).unwrap();
    assert!(kept == b"precious bytes", "a refused mkfs changed the file ({} bytes now)", kept.len());
}

#[test]
fn the_kernel_mounts_our_image_takes_1000_files_and_stays_clean() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    for (features, bs, isz, size) in shapes() {
        let dir = tempfile::tempdir().unwrap();
        let image = make(dir.path(), size, &features, bs, isz);
        {
            let m = oracle::Mount::new(&image, "");
            let d = m.dir.join("many");
            std::fs::create_dir(&d).unwrap();
            for i in 0..1000 {
                std::fs::write(d.join(format!("file-{i:04}")), format!("contents of {i}\n")).unwrap();
            }
            std::fs::write(m.dir.join("big"), vec![7u8; 3 << 20]).unwrap();
        }
        oracle::assert_e2fsck_clean(&image);
        // And uext4 reads back what the kernel wrote into uext4's image.
        let fs = Filesystem::open(&image, Options::default()).unwrap();
        let many = fs.lookup_path(b"/many").unwrap();
        assert_eq!(fs.read_dir(many).unwrap().len(), 1002, "{features:?}");
        for i in (0..1000).step_by(37) {
            let ino = fs.lookup(many, format!("file-{i:04}").as_bytes()).unwrap().unwrap();
            assert_eq!(fs.read_all(ino).unwrap(), format!("contents of {i}\n").as_bytes());
        }
        let big = fs.lookup_path(b"/big").unwrap();
        assert_eq!(fs.read_all(big).unwrap(), vec![7u8; 3 << 20]);
    }
}
