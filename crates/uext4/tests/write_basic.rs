//! The first write operations, judged by e2fsck and the kernel: on images made by
//! uext4's mkfs and by mkfs.ext4 (whose groups start BLOCK_UNINIT/INODE_UNINIT),
//! uext4 makes directories, files of many sizes, interleaved appends (extent trees
//! that grow to depth 1), fast and slow symlinks, hard links, device nodes, and
//! removes some of them; then `e2fsck -fn` must be silent and the kernel's view of
//! the tree must equal what was done.

mod oracle;

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::Command;
use uext4::format::inode::{S_IFCHR, S_IFIFO};
use uext4::ns::change::Owner;
use uext4::{Error, Filesystem, Options, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };

/// What the kernel should see: path -> (kind, content or target).
type Model = BTreeMap<String, (char, Vec<u8>)>;

fn content(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| ((i * 31 + seed * 7) % 251) as u8).collect()
}

fn exercise(image: &Path) -> Model {
    let mut model = Model::new();
    let fs = Filesystem::open(image, Options { read_only: false, ..Options::default() }).unwrap();
    let free_before = (fs.free_blocks(), fs.free_inodes());
    let d1 = fs.mkdir(ROOT_INO, b"d1", 0o755, ROOT).unwrap().ino;
    model.insert("/d1".into(), ('d', vec![]));
    let sub = fs.mkdir(d1, b"sub", 0o700, Owner { uid: 1000, gid: 1000 }).unwrap().ino;
    model.insert("/d1/sub".into(), ('d', vec![]));
    // Enough names to spill a linear directory over several blocks.
    for i in 0..150 {
        let name = format!("file-{i:03}-{}", "x".repeat(i % 40));
        let ino = fs.create(d1, name.as_bytes(), 0o644, ROOT).unwrap().ino;
        let data = content([0, 1, 100, 1024, 4097, 70_000][i % 6], i);
        fs.write(ino, 0, &data).unwrap();
        model.insert(format!("/d1/{name}"), ('-', data));
    }
    // Two files appended in turn: their blocks interleave, so each gets many extents.
    let a = fs.create(sub, b"a", 0o600, ROOT).unwrap().ino;
    let b = fs.create(sub, b"b", 0o600, ROOT).unwrap().ino;
    let (mut da, mut db) = (Vec::new(), Vec::new());
    let bs = fs.geometry().block_size;
    for i in 0..40 {
        let ca = content(bs, i);
        let cb = content(bs, i + 100);
        fs.write(a, da.len() as u64, &ca).unwrap();
        fs.write(b, db.len() as u64, &cb).unwrap();
        da.extend(ca);
        db.extend(cb);
    }
    // Overwrite in place, across a block boundary.
    let patch = vec![0xAB; 300];
    fs.write(a, bs as u64 - 100, &patch).unwrap();
    da[bs - 100..bs + 200].copy_from_slice(&patch);
    model.insert("/d1/sub/a".into(), ('-', da));
    model.insert("/d1/sub/b".into(), ('-', db));

    fs.symlink(ROOT_INO, b"short", b"d1/sub/a", ROOT).unwrap();
    model.insert("/short".into(), ('l', b"d1/sub/a".to_vec()));
    let long = vec![b'L'; 300];
    fs.symlink(ROOT_INO, b"long", &long, ROOT).unwrap();
    model.insert("/long".into(), ('l', long));
    let target = fs.lookup(d1, b"file-005-xxxxx").unwrap().unwrap();
    fs.link(target, ROOT_INO, b"hard").unwrap();
    let linked = model["/d1/file-005-xxxxx"].clone();
    model.insert("/hard".into(), linked);
    fs.mknod(ROOT_INO, b"fifo", S_IFIFO | 0o644, (0, 0), ROOT).unwrap();
    model.insert("/fifo".into(), ('p', vec![]));
    fs.mknod(ROOT_INO, b"null", S_IFCHR | 0o666, (1, 3), ROOT).unwrap();
    model.insert("/null".into(), ('c', b"1:3".to_vec()));

    // Removals: files (freeing their blocks), a hard link's first name, a directory.
    for i in (0..150).step_by(3) {
        let name = format!("file-{i:03}-{}", "x".repeat(i % 40));
        fs.unlink(d1, name.as_bytes()).unwrap();
        model.remove(&format!("/d1/{name}"));
    }
    let tmp = fs.mkdir(ROOT_INO, b"gone", 0o755, ROOT).unwrap().ino;
    fs.create(tmp, b"x", 0o644, ROOT).unwrap();
    assert!(matches!(fs.rmdir(ROOT_INO, b"gone"), Err(Error::NotEmpty(_))));
    fs.unlink(tmp, b"x").unwrap();
    fs.rmdir(ROOT_INO, b"gone").unwrap();

    // Errors that must change nothing.
    assert!(matches!(fs.mkdir(ROOT_INO, b"d1", 0o755, ROOT), Err(Error::Exists(_))));
    assert!(matches!(fs.unlink(ROOT_INO, b"nope"), Err(Error::NotFound(_))));
    assert!(matches!(fs.unlink(ROOT_INO, b"d1"), Err(Error::IsADirectory(_))));
    assert!(matches!(fs.create(ROOT_INO, b"a/b", 0o644, ROOT), Err(Error::Invalid(_))));
    assert!(fs.free_blocks() < free_before.0 && fs.free_inodes() < free_before.1);
    fs.sync().unwrap();
    model
}

fn kernel_view(root: &Path) -> Model {
    let mut out = Model::new();
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(root.join(rel.trim_start_matches('/'))).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            if rel.is_empty() && name == "lost+found" {
                continue;
            }
            let path = format!("{rel}/{name}");
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            let ft = m.file_type();
            let entry = if ft.is_dir() {
                stack.push(path.clone());
                ('d', vec![])
            } else if ft.is_symlink() {
                ('l', std::fs::read_link(e.path()).unwrap().into_os_string().into_encoded_bytes())
            } else if ft.is_fifo() {
                ('p', vec![])
            } else if ft.is_char_device() {
                ('c', format!("{}:{}", libc::major(m.rdev()), libc::minor(m.rdev())).into_bytes())
            } else {
                ('-', std::fs::read(e.path()).unwrap())
            };
            out.insert(path, entry);
        }
    }
    out
}

fn check(image: &Path) {
    let model = exercise(image);
    oracle::assert_e2fsck_clean(image);
    if oracle::has_extent_feature(image) {
        // 40 interleaved blocks cannot fit the root's 4 extents: debugfs must show an index level.
        let ex = oracle::run(Command::new("debugfs").arg("-R").arg("ex /d1/sub/a").arg(image));
        assert!(ex.lines().any(|l| l.trim_start().starts_with("0/ 1")), "no depth-1 tree:\n{ex}");
    } else {
        // Block-mapped: 40 blocks go past the 12 direct pointers into an indirect block.
        let stat = oracle::run(Command::new("debugfs").arg("-R").arg("stat /d1/sub/a").arg(image));
        assert!(stat.contains("(IND)") && !stat.contains("EXTENTS"), "no indirect block:\n{stat}");
    }
    let m = oracle::Mount::new(image, "ro");
    let seen = kernel_view(&m.dir);
    let differ: Vec<&String> =
        model.keys().chain(seen.keys()).filter(|k| model.get(*k) != seen.get(*k)).take(5).collect();
    assert!(differ.is_empty(), "{}: kernel and model differ at {differ:?}", image.display());
    eprintln!("{}: {} paths as modelled", image.display(), seen.len());
}

#[test]
fn writes_on_our_own_images() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    for features in [vec![], vec!["^metadata_csum"], vec!["^flex_bg"], vec!["^has_journal"]] {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("fs.img");
        let opts = uext4::mkfs::MkfsOptions {
            size: 64 << 20,
            features: features.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        uext4::mkfs::mkfs(&image, &opts).unwrap();
        check(&image);
    }
}

#[test]
fn writes_on_mkfs_ext4_images() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    for args in [&[][..], &["-b", "4096"][..], &["-O", "^metadata_csum,uninit_bg"][..], &["-I", "128"][..]] {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("fs.img");
        oracle::run(Command::new("mkfs.ext4").args(["-q", "-F"]).args(args).arg(&image).arg("128M"));
        check(&image);
    }
}

/// Issue 15's shapes: block maps (ext2, ext3, ext4 without extents), no filetype,
/// no dir_index, no journal, and an ext3 upgraded with tune2fs -O extent.
#[test]
fn writes_on_every_kernel_shape() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    for &(shape, program, args, upgrade) in oracle::WRITE_SHAPES {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("fs.img");
        oracle::make_shape(&image, program, args, "128M");
        if upgrade {
            oracle::upgrade_to_extents(&image);
        }
        eprintln!("shape {shape}");
        check(&image);
    }
}

#[test]
fn read_only_opens_refuse_changes() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    oracle::run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image).arg("16M"));
    let fs = Filesystem::open(&image, Options::default()).unwrap();
    assert!(matches!(fs.mkdir(ROOT_INO, b"x", 0o755, ROOT), Err(Error::ReadOnly(_))));
    // Clusters are not allocated: a bigalloc image is refused for writing, by name,
    // and opens read-only with the reason.
    let bigalloc = dir.path().join("bigalloc.img");
    oracle::run(
        Command::new("mkfs.ext4").args(["-q", "-F", "-O", "bigalloc", "-C", "16384"]).arg(&bigalloc).arg("32M"),
    );
    match Filesystem::open(&bigalloc, Options { read_only: false, ..Options::default() }) {
        Err(Error::Unsupported { feature }) => assert!(feature.contains("bigalloc"), "{feature}"),
        Err(e) => panic!("expected Unsupported naming bigalloc, got {e}"),
        Ok(_) => panic!("a bigalloc image opened writable"),
    }
    let before = std::fs::read(&bigalloc).unwrap();
    let fs = Filesystem::open(&bigalloc, Options::default()).unwrap();
    assert!(fs.read_only_reason().contains("bigalloc"), "{}", fs.read_only_reason());
    match fs.mkdir(ROOT_INO, b"x", 0o755, ROOT) {
        Err(Error::ReadOnly(why)) => assert!(why.contains("bigalloc"), "{why}"),
        other => panic!("expected ReadOnly, got {other:?}"),
    }
    drop(fs);
    assert!(std::fs::read(&bigalloc).unwrap() == before, "a read-only open changed the image");
}
