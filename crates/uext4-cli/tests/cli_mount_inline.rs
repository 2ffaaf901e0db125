//! Inline data through `uext4 mount` (issue 19): files and directories a shell
//! makes through the mount of an inline_data image are kept in their inodes as
//! the kernel keeps them (debugfs), e2fsck finds the image clean and the kernel
//! reads the same tree; a directory listed with small getdents calls while
//! creates move it from inline to a block and on to an htree lists every name
//! it held when opened exactly once.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

fn inline_image(dir: &Path) -> std::path::PathBuf {
    let image = dir.join("inline.img");
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096", "-I", "256", "-O", "inline_data"])
        .arg(&image)
        .arg("64M"));
    image
}

fn debugfs_inline_size(image: &Path, path: &str) -> Option<usize> {
    let out = run(Command::new("debugfs").arg("-R").arg(format!("stat /{path}")).arg(image));
    out.lines().find_map(|l| l.trim().strip_prefix("Size of inline data: ").map(|n| n.trim().parse().unwrap()))
}

#[test]
fn inline_files_and_directories_through_the_mount() {
    if !fuse_oracles() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let image = inline_image(work.path());
    let listing = {
        let m = UextMount::new(&image, "");
        let root = &m.dir;
        for n in [1usize, 59, 60, 61, 100, 128, 129, 500] {
            std::fs::write(root.join(format!("f{n}")), vec![b'a' + (n % 26) as u8; n]).unwrap();
        }
        for k in 0..=12 {
            let d = root.join(format!("d{k}"));
            std::fs::create_dir(&d).unwrap();
            for i in 0..k {
                std::fs::write(d.join(format!("e{i}")), format!("{k}/{i}")).unwrap();
            }
        }
        // Grown by appends and cut back by truncate, through the mount.
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(root.join("f60")).unwrap();
        f.write_all(&[b'+'; 40]).unwrap();
        drop(f);
        std::fs::OpenOptions::new().write(true).open(root.join("f129")).unwrap().set_len(20).unwrap();
        std::fs::rename(root.join("d3/e0"), root.join("d4/from-d3")).unwrap();
        std::fs::remove_file(root.join("d2/e1")).unwrap();
        std::fs::create_dir(root.join("d1/gone")).unwrap();
        std::fs::remove_dir(root.join("d1/gone")).unwrap();
        let l = tree_listing(root);
        m.unmount();
        l
    };
    assert_e2fsck_clean(&image);
    for (path, size) in [("f1", Some(60)), ("f100", Some(100)), ("f128", Some(128)), ("f60", Some(100))] {
        assert_eq!(debugfs_inline_size(&image, path), size, "debugfs on {path}");
    }
    // Made past the capacity; converted and cut back stays a block file.
    assert_eq!(debugfs_inline_size(&image, "f129"), None);
    assert_eq!(debugfs_inline_size(&image, "f500"), None);
    assert_eq!(debugfs_inline_size(&image, "d0"), Some(60));
    assert_eq!(debugfs_inline_size(&image, "d9"), Some(128));
    assert_eq!(debugfs_inline_size(&image, "d12"), None);
    // uext4 stat shows the inline layout, uext4 stats the projection beside
    // what the image holds: d0..=d9 are inline, as the kernel's rules project
    // (which count the empty lost+found too; mkfs made it a block).
    let at = |p: &str| format!("{}:{p}", image.display());
    let stat = run(uext4().arg("stat").arg(at("/f100")));
    assert!(
        stat.contains("Inline data: 100 bytes in the inode (60 in i_block, system.data value of 40 bytes)"),
        "{stat}"
    );
    let stats = run(uext4().arg("stats").arg(&image));
    assert!(stats.contains("up to 128 bytes fit inline"), "{stats}");
    assert!(stats.contains("directories that would fit inline: 11 of 15"), "{stats}");
    assert!(stats.contains("inline in this image: 10\n"), "{stats}");
    let k = KernelMount::new(&image, "ro");
    assert_eq!(tree_listing(&k.dir), listing, "the kernel's view of what went through the mount");
}

/// Names from getdents64 calls of `buf` bytes each until the end.
fn getdents_names(fd: i32, buf: &mut [u8], out: &mut Vec<String>) -> bool {
    // SAFETY: the buffer is valid for its length; fd is an open directory.
    let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
    assert!(n >= 0, "getdents64: {}", std::io::Error::last_os_error());
    let n = n as usize;
    let mut off = 0;
    while off < n {
        // struct linux_dirent64: d_ino u64, d_off i64, d_reclen u16, d_type u8, d_name.
        let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
        let name = &buf[off + 19..off + reclen];
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        out.push(String::from_utf8(name[..end].to_vec()).unwrap());
        off += reclen;
    }
    n > 0
}

#[test]
fn getdents_goes_on_while_creates_move_a_directory_out_of_its_inode() {
    if !fuse_oracles() {
        return;
    }
    use std::os::fd::AsRawFd;
    let work = tempfile::tempdir().unwrap();
    let image = inline_image(work.path());
    let m = UextMount::new(&image, "");
    let dir = m.dir.join("growing");
    std::fs::create_dir(&dir).unwrap();
    let first: Vec<String> = (0..6).map(|i| format!("first-{i}")).collect();
    for n in &first {
        std::fs::write(dir.join(n), b"").unwrap();
    }
    let handle = std::fs::File::open(&dir).unwrap();
    let mut seen = Vec::new();
    // One small call, then enough creates to move the directory to a block and
    // on to an htree, a call after each burst.
    let mut buf = vec![0u8; 64];
    assert!(getdents_names(handle.as_raw_fd(), &mut buf, &mut seen));
    let mut more = true;
    for burst in 0..8 {
        for i in 0..60 {
            std::fs::write(dir.join(format!("burst-{burst}-name-of-some-length-{i:03}")), b"").unwrap();
        }
        if more {
            more = getdents_names(handle.as_raw_fd(), &mut buf, &mut seen);
        }
    }
    while getdents_names(handle.as_raw_fd(), &mut buf, &mut seen) {}
    drop(handle);
    let mut counts = std::collections::BTreeMap::new();
    for n in &seen {
        *counts.entry(n.clone()).or_insert(0) += 1;
    }
    for n in first.iter().map(String::as_str).chain([".", ".."]) {
        assert_eq!(counts.get(n), Some(&1), "{n} listed {:?} times in {seen:?}", counts.get(n));
    }
    assert!(counts.values().all(|&c| c == 1), "a name listed twice: {counts:?}");
    // A listing opened now sees all of them.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 6 + 8 * 60);
    m.unmount();
    assert_eq!(debugfs_inline_size(&image, "growing"), None);
    let htree = run(Command::new("debugfs").arg("-R").arg("htree /growing").arg(&image));
    assert!(htree.contains("Number of entries"), "/growing is not an htree:\n{htree}");
    assert_e2fsck_clean(&image);
}
