//! Debian's fio through the mount (issue 14): random 4 KiB writes with a crc32c
//! header in every block, verified by fio itself as it goes (`verify_backlog`)
//! and at the end, then again by a `verify_only` pass after the image was
//! unmounted and mounted again; the image must then pass e2fsck -fn. fio is
//! the oracle here: it decides what each block must hold, not uext4.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

/// fio's job: two processes, each with a 48 MiB file, random 4 KiB writes over
/// all of it (every block once, in random order) mixed with reads of what was
/// written, fsync every 64 writes.
fn fio(dir: &Path, verify_only: bool) -> String {
    let mut cmd = Command::new("fio");
    cmd.args([
        "--name=uext4-verify",
        "--rw=randwrite",
        "--bs=4k",
        "--size=48m",
        "--numjobs=2",
        "--ioengine=psync",
        "--fsync=64",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--verify_backlog=256",
        "--do_verify=1",
        "--randrepeat=1",
        "--group_reporting",
    ])
    .arg(format!("--directory={}", dir.display()));
    if verify_only {
        cmd.arg("--verify_only");
    }
    run(&mut cmd)
}

fn fio_verifies_random_writes(uring: bool, writeback_cache: bool) {
    if !fuse_oracles() {
        return;
    }
    if !Command::new("sh").arg("-c").arg("command -v fio").output().is_ok_and(|o| o.status.success()) {
        skip("fio is not installed (scripts/setup installs it)");
        return;
    }
    let Some(options) = transport(uring) else { return };
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("img");
    mkfs(&image, "256M");
    // With the write-back cache fio's own checks read the kernel's page
    // cache; the verify_only pass after the remount reads what reached uext4.
    let first = with_writeback_cache(options, writeback_cache);
    let m = UextMount::new(&image, &first);
    let said = fio(&m.dir, false);
    assert!(said.contains("err= 0"), "fio: {said}");
    assert_transport(&m.dir, uring, 1_000);
    assert_writeback_cache(&m.dir, writeback_cache);
    m.unmount();
    assert_e2fsck_clean(&image);

    // What fio wrote is still there after an unmount: it reads every block back
    // and checks its header and crc32c.
    let m = UextMount::new(&image, options);
    let said = fio(&m.dir, true);
    assert!(said.contains("err= 0"), "fio --verify_only: {said}");
    m.unmount();
    assert_e2fsck_clean(&image);
}

#[test]
fn fio_verifies_random_writes_over_dev_fuse() {
    fio_verifies_random_writes(false, false);
}

#[test]
fn fio_verifies_random_writes_over_io_uring() {
    fio_verifies_random_writes(true, false);
}

#[test]
fn fio_verifies_random_writes_with_the_writeback_cache() {
    fio_verifies_random_writes(true, true);
}
