//! rename in all its shapes, judged by e2fsck and the kernel: the names left, file
//! contents, link counts of parents and files, and where each directory's ".."
//! points (the kernel's stat of dir/.. gives its parent's inode).

mod oracle;

use std::os::unix::fs::MetadataExt;
use uext4::ns::rename::{RENAME_EXCHANGE, RENAME_NOREPLACE};
use uext4::{Error, Filesystem, Options, Owner, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };

fn file(fs: &Filesystem, dir: u32, name: &str, body: &str) -> u32 {
    let ino = fs.create(dir, name.as_bytes(), 0o644, ROOT).unwrap().ino;
    fs.write(ino, 0, body.as_bytes()).unwrap();
    ino
}

#[test]
fn rename_shapes() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    for block_size in [1024, 4096] {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("fs.img");
        uext4::mkfs::mkfs(
            &image,
            &uext4::mkfs::MkfsOptions { size: 64 << 20, block_size: Some(block_size), ..Default::default() },
        )
        .unwrap();
        {
            let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
            let a = fs.mkdir(ROOT_INO, b"a", 0o755, ROOT).unwrap().ino;
            let b = fs.mkdir(ROOT_INO, b"b", 0o755, ROOT).unwrap().ino;
            // Within a directory, and over an existing file whose blocks are freed.
            file(&fs, a, "one", "first");
            fs.rename(a, b"one", a, b"uno", 0).unwrap();
            file(&fs, a, "victim", &"v".repeat(5000));
            let free = fs.free_blocks();
            fs.rename(a, b"uno", a, b"victim", 0).unwrap();
            assert!(fs.free_blocks() > free, "the replaced file's blocks were not freed");
            // Over a file that has another link: that link keeps it alive.
            let kept = file(&fs, a, "kept", "still here");
            fs.link(kept, b, b"kept-link").unwrap();
            file(&fs, a, "newcomer", "replaces kept");
            fs.rename(a, b"newcomer", a, b"kept", 0).unwrap();
            // A directory across directories, with contents.
            let moving = fs.mkdir(a, b"moving", 0o755, ROOT).unwrap().ino;
            file(&fs, moving, "inside", "inside moving");
            fs.rename(a, b"moving", b, b"moved", 0).unwrap();
            // A directory over an empty directory elsewhere.
            fs.mkdir(b, b"empty", 0o755, ROOT).unwrap();
            let d2 = fs.mkdir(a, b"d2", 0o700, ROOT).unwrap().ino;
            file(&fs, d2, "x", "x");
            fs.rename(a, b"d2", b, b"empty", 0).unwrap();
            // Refusals.
            let full = fs.mkdir(ROOT_INO, b"full", 0o755, ROOT).unwrap().ino;
            file(&fs, full, "f", "f");
            fs.mkdir(ROOT_INO, b"src-dir", 0o755, ROOT).unwrap();
            assert!(matches!(fs.rename(ROOT_INO, b"src-dir", ROOT_INO, b"full", 0), Err(Error::NotEmpty(_))));
            assert!(matches!(fs.rename(ROOT_INO, b"full", b, b"kept-link", 0), Err(Error::NotADirectory(_))));
            assert!(matches!(fs.rename(a, b"kept", ROOT_INO, b"full", 0), Err(Error::IsADirectory(_))));
            assert!(matches!(fs.rename(ROOT_INO, b"b", moving, b"loop", 0), Err(Error::Invalid(_))));
            assert!(matches!(fs.rename(a, b"victim", a, b"kept", RENAME_NOREPLACE), Err(Error::Exists(_))));
            assert!(matches!(fs.rename(a, b"nothing", a, b"x", 0), Err(Error::NotFound(_))));
            fs.rename(a, b"victim", a, b"fresh", RENAME_NOREPLACE).unwrap();
            // Exchange a file and a directory across directories.
            let swap_dir = fs.mkdir(a, b"swap-dir", 0o755, ROOT).unwrap().ino;
            file(&fs, swap_dir, "y", "y");
            file(&fs, b, "swap-file", "a file");
            fs.rename(a, b"swap-dir", b, b"swap-file", RENAME_EXCHANGE).unwrap();
            // Two names of one inode: nothing happens.
            fs.link(kept, a, b"kept-2").unwrap();
            fs.rename(a, b"kept-2", b, b"kept-link", 0).unwrap();
            fs.sync().unwrap();
        }
        oracle::assert_e2fsck_clean(&image);
        let m = oracle::Mount::new(&image, "ro");
        let p = |s: &str| m.dir.join(s);
        let read = |s: &str| std::fs::read_to_string(p(s)).unwrap();
        let ino = |s: &str| std::fs::symlink_metadata(p(s)).unwrap().ino();
        let nlink = |s: &str| std::fs::symlink_metadata(p(s)).unwrap().nlink();
        let names = |s: &str| {
            let mut v: Vec<String> =
                std::fs::read_dir(p(s)).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
            v.sort();
            v
        };
        assert_eq!(names("a"), ["fresh", "kept", "kept-2", "swap-dir"]);
        assert_eq!(names("b"), ["empty", "kept-link", "moved", "swap-file"]);
        assert_eq!(read("a/fresh"), "first");
        assert_eq!(read("a/kept"), "replaces kept");
        assert_eq!(read("b/kept-link"), "still here");
        assert_eq!(nlink("b/kept-link"), 2);
        assert_eq!(read("b/moved/inside"), "inside moving");
        assert_eq!(read("b/empty/x"), "x");
        assert_eq!(read("a/swap-dir"), "a file");
        assert_eq!(read("b/swap-file/y"), "y");
        // ".." of moved directories points at their new parents.
        assert_eq!(ino("b/moved/.."), ino("b"));
        assert_eq!(ino("b/empty/.."), ino("b"));
        assert_eq!(ino("b/swap-file/.."), ino("b"));
        // Link counts: a has no subdirectories left; b has moved, empty, swap-file.
        assert_eq!(nlink("a"), 2);
        assert_eq!(nlink("b"), 5);
        assert_eq!(nlink("."), 2 + 5); // lost+found, a, b, full, src-dir
        drop(m);
    }
}

/// A rename whose new name fills a one-block directory turns it into an htree
/// before the old name is removed: the old name was found in block 0, which is
/// the root now. (The removal looked there first and read the root as a leaf:
/// "rec_len 1012 runs past the end of the block", found by dir_races.)
#[test]
fn rename_that_makes_the_directory_an_htree() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    let mkfs = uext4::mkfs::MkfsOptions { size: 16 << 20, block_size: Some(1024), ..Default::default() };
    uext4::mkfs::mkfs(&image, &mkfs).unwrap();
    let name = |i: usize| format!("name-{i:03}-{}", "x".repeat(40));
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        // How many names one block holds: the create that converts says.
        let probe = fs.mkdir(ROOT_INO, b"probe", 0o755, ROOT).unwrap().ino;
        let fits = (0..100)
            .find(|&i| {
                file(&fs, probe, &name(i), "p");
                fs.stat(probe).unwrap().size > 1024
            })
            .expect("a 1 KiB block holds fewer than 100 such names");
        let d = fs.mkdir(ROOT_INO, b"d", 0o755, ROOT).unwrap().ino;
        for i in 0..fits {
            file(&fs, d, &name(i), &format!("body {i}"));
        }
        assert_eq!(fs.stat(d).unwrap().size, 1024, "still one linear block");
        fs.rename(d, name(0).as_bytes(), d, name(500).as_bytes(), 0).unwrap();
        assert!(fs.stat(d).unwrap().size > 1024, "the new name made the directory an htree");
        assert_eq!(fs.lookup(d, name(0).as_bytes()).unwrap(), None);
        let moved = fs.lookup(d, name(500).as_bytes()).unwrap().expect("the new name");
        let mut body = [0u8; 16];
        let n = fs.read(moved, 0, &mut body).unwrap();
        assert_eq!(&body[..n], b"body 0");
        fs.sync().unwrap();
    }
    oracle::assert_e2fsck_clean(&image);
}
