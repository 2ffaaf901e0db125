//! Debian's stress-ng and postmark through `uext4 mount`: programs nobody here
//! wrote hammer the mount with their own mixes (directories made and removed
//! while listed, links, renames, dentries, xattrs, preallocation, seeks, and
//! data written and read back with stress-ng's own verification; postmark's
//! small-file transactions), with and without the kernel's write-back cache.
//! Each must finish without an error, the daemon must let go of every inode at
//! unmount (`uext4 umount` fails otherwise), and e2fsck -fn must be silent.

mod common;

use common::*;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

fn have(tool: &str) -> bool {
    let found = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output();
    if found.is_ok_and(|o| o.status.success()) {
        return true;
    }
    skip(&format!("{tool} is not installed (scripts/setup installs it)"));
    false
}

/// A fresh 1 GiB image mounted over io_uring (with the write-back cache or
/// not), in a temporary directory: None when `tool` or the mount's oracles are
/// missing (a skip, said so).
fn fresh_mount(tool: &str, writeback_cache: bool) -> Option<(tempfile::TempDir, PathBuf, UextMount)> {
    if !fuse_oracles() || !have(tool) {
        return None;
    }
    let options = with_writeback_cache(transport(true)?, writeback_cache);
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("img");
    mkfs(&image, "1G");
    let m = UextMount::new(&image, &options);
    Some((work, image, m))
}

fn stress_ng_through_the_mount(writeback_cache: bool) {
    let Some((_work, image, m)) = fresh_mount("stress-ng", writeback_cache) else { return };
    let dir = m.dir.join("stress");
    fs::create_dir(&dir).unwrap();
    let out = Command::new("stress-ng")
        .arg("--temp-path")
        .arg(&dir)
        .args(["--timeout", "8", "--verify", "--metrics-brief"])
        .args(["--hdd", "2", "--hdd-bytes", "16M"])
        .args(["--dir", "2", "--dentry", "1", "--rename", "1", "--link", "1", "--filename", "1"])
        .args(["--fallocate", "1", "--xattr", "1", "--seek", "1", "--seek-size", "16M"])
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.contains("successful run completed"), "stress-ng: {said}");
    assert!(!said.contains("fail"), "stress-ng: {said}");
    assert_writeback_cache(&m.dir, writeback_cache);
    // Fails if the daemon could not release an inode the kernel held.
    m.unmount();
    assert_e2fsck_clean(&image);
}

/// The `dir` stressor lists directories while others are removed: entries of
/// a listing taken before a removal once reached the kernel unpinned, and the
/// unmount then failed to release thousands of inodes.
#[test]
fn stress_ng_through_the_mount_ends_clean() {
    stress_ng_through_the_mount(false);
}

#[test]
fn stress_ng_through_the_mount_with_the_writeback_cache_ends_clean() {
    stress_ng_through_the_mount(true);
}

#[test]
fn postmark_through_the_mount_ends_clean() {
    postmark_through_the_mount(false);
}

#[test]
fn postmark_through_the_mount_with_the_writeback_cache_ends_clean() {
    postmark_through_the_mount(true);
}

fn postmark_through_the_mount(writeback_cache: bool) {
    let Some((work, image, m)) = fresh_mount("postmark", writeback_cache) else { return };
    let config = work.path().join("postmark.cfg");
    let script = format!(
        "set location {}\nset number 3000\nset transactions 10000\nset size 500 20000\n\
         set subdirectories 10\nset seed 42\nrun\nquit\n",
        m.dir.display()
    );
    fs::write(&config, script).unwrap();
    let said = run(Command::new("postmark").arg(&config));
    assert!(said.contains("Deleting files...Done") && said.contains("deleted"), "postmark: {said}");
    // postmark removes what it made: only lost+found is left.
    let left: Vec<_> = fs::read_dir(&m.dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("lost+found")], "left behind");
    assert_writeback_cache(&m.dir, writeback_cache);
    m.unmount();
    assert_e2fsck_clean(&image);
}
