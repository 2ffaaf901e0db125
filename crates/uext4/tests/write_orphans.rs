//! An inode unlinked while open: readable until its last close and freed then;
//! if uext4 stops before the close, the orphan list it left lets the next writable
//! open free it. Judged by e2fsck (silent after the close, and after recovery) and
//! by the kernel, which must also accept an image with the orphan list pending.

mod oracle;

use uext4::{Filesystem, Options, Owner, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };

fn image(dir: &std::path::Path) -> std::path::PathBuf {
    let image = dir.join("fs.img");
    uext4::mkfs::mkfs(&image, &uext4::mkfs::MkfsOptions { size: 64 << 20, ..Default::default() }).unwrap();
    image
}

#[test]
fn unlinked_while_open_lives_until_close() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = image(dir.path());
    let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
    let free = fs.free_blocks();
    let a = fs.create(ROOT_INO, b"a", 0o644, ROOT).unwrap().ino;
    let b = fs.create(ROOT_INO, b"b", 0o644, ROOT).unwrap().ino;
    for ino in [a, b] {
        fs.write(ino, 0, &vec![9u8; 3 << 20]).unwrap();
        fs.open_inode(ino).unwrap();
    }
    fs.unlink(ROOT_INO, b"a").unwrap();
    fs.unlink(ROOT_INO, b"b").unwrap();
    assert_eq!(fs.read_all(a).unwrap(), vec![9u8; 3 << 20], "an open, unlinked file stays readable");
    assert!(fs.free_blocks() < free);
    assert_eq!(fs.superblock().s_last_orphan, b, "the last unlinked heads the orphan list");
    fs.close_inode(a).unwrap();
    fs.close_inode(b).unwrap();
    assert_eq!(fs.free_blocks(), free, "closing freed the blocks");
    assert_eq!(fs.superblock().s_last_orphan, 0);
    drop(fs);
    oracle::assert_e2fsck_clean(&image);
}

#[test]
fn orphans_left_by_a_stop_are_freed_at_the_next_open() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = image(dir.path());
    let free;
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        free = fs.free_blocks();
        for name in [&b"x"[..], b"y", b"z"] {
            let ino = fs.create(ROOT_INO, name, 0o644, ROOT).unwrap().ino;
            fs.write(ino, 0, &vec![1u8; 1 << 20]).unwrap();
            fs.open_inode(ino).unwrap();
            fs.unlink(ROOT_INO, name).unwrap();
        }
        // Dropped with the files still open: as if the process had stopped.
    }
    // The kernel accepts the image with its orphan list (and would clean it up).
    let copy = dir.path().join("copy.img");
    std::fs::copy(&image, &copy).unwrap();
    drop(oracle::Mount::new(&copy, ""));
    oracle::assert_e2fsck_clean(&copy);
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        assert_eq!(fs.superblock().s_last_orphan, 0);
        assert_eq!(fs.free_blocks(), free, "the orphans were not freed at open");
    }
    oracle::assert_e2fsck_clean(&image);
}
