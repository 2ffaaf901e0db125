//! The library's API used as a careless caller would: inode numbers that went
//! stale, the filesystem's own reserved inodes, directories past the link
//! limit, a rename into a directory removed meanwhile. Each is refused with the
//! error the kernel's ext4 would give (ESTALE-like NotFound, EPERM, EMLINK,
//! ENOENT), and e2fsck -fn stays silent on what is left.

mod oracle;

use uext4::{Error, Filesystem, Options, Owner, SetAttr, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };

fn mkfs_ext4(image: &std::path::Path, args: &[&str], size: &str) {
    oracle::run(std::process::Command::new("mkfs.ext4").args(["-F", "-q"]).args(args).arg(image).arg(size));
}

fn writable() -> Options {
    Options { read_only: false, ..Options::default() }
}

#[test]
fn a_stale_inode_number_takes_no_change() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    mkfs_ext4(&image, &["-b", "4096"], "64M");
    {
        let fs = Filesystem::open(&image, writable()).unwrap();
        let free = fs.free_blocks();
        let f = fs.create(ROOT_INO, b"f", 0o644, ROOT).unwrap().ino;
        fs.unlink(ROOT_INO, b"f").unwrap();
        // The inode is free now: its number no longer names a file.
        let stale = |r: uext4::Result<()>, what: &str| {
            assert!(matches!(r, Err(Error::NotFound(_))), "{what} through a freed inode: {r:?}");
        };
        stale(fs.write(f, 0, &[7u8; 8192]).map(drop), "write");
        stale(fs.set_xattr(f, b"user.big", &[1; 900], 0), "set_xattr");
        stale(fs.fallocate(f, 0, 1 << 20, 0), "fallocate");
        stale(fs.setattr(f, &SetAttr { size: Some(1 << 20), ..Default::default() }).map(drop), "setattr");
        stale(fs.set_flags(f, 0), "set_flags");
        assert_eq!(fs.free_blocks(), free, "nothing was allocated to the free inode");
        // Open and unlinked, it still takes writes until the last close.
        let g = fs.create(ROOT_INO, b"g", 0o644, ROOT).unwrap().ino;
        fs.open_inode(g).unwrap();
        fs.unlink(ROOT_INO, b"g").unwrap();
        assert_eq!(fs.write(g, 0, b"still mine").unwrap(), 10);
        fs.close_inode(g).unwrap();
        stale(fs.write(g, 0, b"not any more").map(drop), "write after the last close");
    }
    oracle::assert_e2fsck_clean(&image);
}

#[test]
fn reserved_inodes_take_no_change() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    mkfs_ext4(&image, &["-b", "4096"], "64M");
    {
        let fs = Filesystem::open(&image, writable()).unwrap();
        let refused = |r: uext4::Result<()>, what: &str| {
            assert!(matches!(r, Err(Error::NotPermitted(_))), "{what}: {r:?}");
        };
        // 8 is the journal, 7 the resize inode, 1 the bad-block list.
        refused(fs.setattr(8, &SetAttr { size: Some(0), ..Default::default() }).map(drop), "truncating the journal");
        refused(fs.link(8, ROOT_INO, b"journal").map(drop), "linking the journal");
        refused(fs.write(7, 0, b"x").map(drop), "writing the resize inode");
        refused(fs.write(8, 0, &[0u8; 4096]).map(drop), "writing the journal");
        refused(fs.set_xattr(8, b"user.x", b"1", 0), "an xattr on the journal");
        refused(fs.setattr(1, &SetAttr { perm: Some(0o600), ..Default::default() }).map(drop), "chmod of inode 1");
        // The root is reserved too, and changes as any directory does.
        fs.setattr(ROOT_INO, &SetAttr { perm: Some(0o700), ..Default::default() }).unwrap();
        fs.mkdir(ROOT_INO, b"d", 0o755, ROOT).unwrap();
    }
    oracle::assert_e2fsck_clean(&image);
}

/// 65,000 subdirectories and one more: with dir_nlink an indexed parent's
/// count parks at 1 (and stays there), as the kernel's ext4_inc_count has it;
/// without dir_nlink the next mkdir is EMLINK.
#[test]
fn subdirectories_past_the_link_limit() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    const LIMIT: u32 = 65_000;
    let dir = tempfile::tempdir().unwrap();
    for (features, parks) in [("dir_nlink", true), ("^dir_nlink", false)] {
        let image = dir.path().join(format!("{features}.img"));
        mkfs_ext4(&image, &["-b", "1024", "-N", "70000", "-O", features], "160M");
        {
            let fs = Filesystem::open(&image, writable()).unwrap();
            let parent = fs.mkdir(ROOT_INO, b"p", 0o755, ROOT).unwrap().ino;
            // "." and the parent's entry are two links: LIMIT - 2 subdirectories reach the limit.
            for i in 0..LIMIT - 2 {
                fs.mkdir(parent, format!("d{i}").as_bytes(), 0o755, ROOT).unwrap();
            }
            assert_eq!(fs.stat(parent).unwrap().nlink, LIMIT, "{features}");
            let next = fs.mkdir(parent, b"one-more", 0o755, ROOT);
            if parks {
                next.unwrap();
                assert_eq!(fs.stat(parent).unwrap().nlink, 1, "{features}: parked");
                fs.mkdir(parent, b"and-another", 0o755, ROOT).unwrap();
                assert_eq!(fs.stat(parent).unwrap().nlink, 1, "{features}: stays parked");
            } else {
                assert!(matches!(next, Err(Error::TooManyLinks(_))), "{features}: {next:?}");
                // A directory moved in from elsewhere is refused the same way.
                fs.mkdir(ROOT_INO, b"elsewhere", 0o755, ROOT).unwrap();
                let moved = fs.rename(ROOT_INO, b"elsewhere", parent, b"moved", 0);
                assert!(matches!(moved, Err(Error::TooManyLinks(_))), "{features}: {moved:?}");
                // Files still go in.
                fs.create(parent, b"a-file", 0o644, ROOT).unwrap();
            }
        }
        oracle::assert_e2fsck_clean(&image);
    }
}

/// Without dir_nlink, two subdirectories racing for the last link of an
/// indexed parent (pdirops lets both in at once): one gets it, the other
/// EMLINK, every round. The check and the count's change were made under a
/// shared hold, so both could pass the check and the second increment parked
/// the count at 1, which only dir_nlink allows (e2fsck: wrong link count).
/// Mkdir against mkdir and a directory moved in against a mkdir.
#[test]
fn two_subdirectories_racing_for_the_last_link() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    const LIMIT: u32 = 65_000;
    const ROUNDS: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("race.img");
    mkfs_ext4(&image, &["-b", "1024", "-N", "70000", "-O", "^dir_nlink"], "160M");
    {
        let fs = Filesystem::open(&image, writable()).unwrap();
        let parent = fs.mkdir(ROOT_INO, b"p", 0o755, ROOT).unwrap().ino;
        // One link short of the limit.
        for i in 0..LIMIT - 3 {
            fs.mkdir(parent, format!("d{i}").as_bytes(), 0o755, ROOT).unwrap();
        }
        let elsewhere = fs.mkdir(ROOT_INO, b"elsewhere", 0o755, ROOT).unwrap().ino;
        for round in 0..ROUNDS {
            assert_eq!(fs.stat(parent).unwrap().nlink, LIMIT - 1, "round {round}");
            let by_rename = round % 2 == 1;
            if by_rename {
                fs.mkdir(elsewhere, b"mover", 0o755, ROOT).unwrap();
            }
            let start = std::sync::Barrier::new(2);
            let (a, b) = std::thread::scope(|s| {
                let a = s.spawn(|| {
                    start.wait();
                    fs.mkdir(parent, b"racer-a", 0o755, ROOT).map(drop)
                });
                let b = s.spawn(|| {
                    start.wait();
                    match by_rename {
                        true => fs.rename(elsewhere, b"mover", parent, b"racer-b", 0),
                        false => fs.mkdir(parent, b"racer-b", 0o755, ROOT).map(drop),
                    }
                });
                (a.join().unwrap(), b.join().unwrap())
            });
            let won = [&a, &b].iter().filter(|r| r.is_ok()).count();
            let refused = [&a, &b].iter().filter(|r| matches!(r, Err(Error::TooManyLinks(_)))).count();
            assert_eq!((won, refused), (1, 1), "round {round}: {a:?} and {b:?}");
            assert_eq!(fs.stat(parent).unwrap().nlink, LIMIT, "round {round}");
            // Back to one short: the winner goes (home, if it was moved in).
            match (a.is_ok(), by_rename) {
                (true, _) => fs.rmdir(parent, b"racer-a").unwrap(),
                (false, true) => fs.rename(parent, b"racer-b", elsewhere, b"mover", 0).unwrap(),
                (false, false) => fs.rmdir(parent, b"racer-b").unwrap(),
            }
            if by_rename {
                fs.rmdir(elsewhere, b"mover").unwrap();
            }
        }
    }
    oracle::assert_e2fsck_clean(&image);
}

#[test]
fn a_rename_into_a_removed_directory_is_enoent() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    mkfs_ext4(&image, &["-b", "4096"], "64M");
    {
        let fs = Filesystem::open(&image, writable()).unwrap();
        let gone = fs.mkdir(ROOT_INO, b"gone", 0o755, ROOT).unwrap().ino;
        fs.open_inode(gone).unwrap();
        fs.rmdir(ROOT_INO, b"gone").unwrap();
        fs.mkdir(ROOT_INO, b"x", 0o755, ROOT).unwrap();
        fs.create(ROOT_INO, b"f", 0o644, ROOT).unwrap();
        for name in [&b"x"[..], b"f"] {
            let r = fs.rename(ROOT_INO, name, gone, b"y", 0);
            assert!(matches!(r, Err(Error::NotFound(_))), "moving {:?} into a removed directory: {r:?}", name);
        }
        fs.close_inode(gone).unwrap();
        let r = fs.rename(ROOT_INO, b"x", gone, b"y", 0);
        assert!(matches!(r, Err(Error::NotFound(_))), "into a freed directory: {r:?}");
    }
    oracle::assert_e2fsck_clean(&image);
}

/// Smaller rules the kernel's VFS applies, each with its errno: a trailing
/// slash asks for a directory (ENOTDIR), setxattr's flags and value size
/// (EINVAL, E2BIG), user.* only on files and directories (EPERM), a default
/// ACL only on a directory (EACCES), nanoseconds below a second (EINVAL).
#[test]
fn the_vfs_rules_of_paths_xattrs_and_times() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    mkfs_ext4(&image, &["-b", "4096"], "64M");
    {
        let fs = Filesystem::open(&image, writable()).unwrap();
        let f = fs.create(ROOT_INO, b"f", 0o644, ROOT).unwrap().ino;
        let d = fs.mkdir(ROOT_INO, b"d", 0o755, ROOT).unwrap().ino;
        let l = fs.symlink(ROOT_INO, b"l", b"d", ROOT).unwrap().ino;
        let errno = |r: uext4::Result<()>| r.map_err(|e| e.errno()).err();
        assert_eq!(errno(fs.lookup_path(b"/f/").map(drop)), Some(20));
        assert_eq!(fs.lookup_path(b"/d/").unwrap(), d);
        assert_eq!(fs.lookup_path(b"/l/").unwrap(), d, "a trailing slash follows the last symlink");
        assert_eq!(errno(fs.set_xattr(f, b"user.a", b"1", 0x100)), Some(22));
        assert_eq!(errno(fs.set_xattr(f, b"user.a", &vec![0u8; 65537], 0)), Some(7));
        assert_eq!(errno(fs.set_xattr(l, b"user.a", b"1", 0)), Some(1));
        // A minimal default ACL: user::rwx, group::r-x, other::r-x.
        let mut acl = 2u32.to_le_bytes().to_vec();
        for (tag, perm) in [(1u16, 7u16), (4, 5), (0x20, 5)] {
            acl.extend_from_slice(&tag.to_le_bytes());
            acl.extend_from_slice(&perm.to_le_bytes());
            acl.extend_from_slice(&u32::MAX.to_le_bytes());
        }
        assert_eq!(errno(fs.set_xattr(f, b"system.posix_acl_default", &acl, 0)), Some(13));
        fs.set_xattr(d, b"system.posix_acl_default", &acl, 0).unwrap();
        let late = uext4::Timestamp { sec: 1, nsec: 1_000_000_000 };
        assert_eq!(errno(fs.setattr(f, &SetAttr { mtime: Some(late), ..Default::default() }).map(drop)), Some(22));
    }
    oracle::assert_e2fsck_clean(&image);
}
