//! uext4 among the system's tools: mount(8) through mount.fuse3 and fstab
//! lines, whole-disk images with partition tables, and reproducible images.
//! Judged by e2fsck -fn, the kernel's loop mount (with `-P` for partitions)
//! and sfdisk, never by uext4 alone.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

fn have(tool: &str) -> bool {
    Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().is_ok_and(|o| o.status.success())
}

/// Waits until no process holds the image's lock: a FUSE daemon writes back
/// after the kernel's unmount returns, as every FUSE filesystem does.
fn wait_for_daemon(image: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let free = Command::new("flock").arg("-n").arg(image).arg("true").status().is_ok_and(|s| s.success());
        if free {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the daemon of {} never let go of it", image.display());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// mount(8) runs helpers with a PATH of its own, so the binary under test is
/// put where it looks (/usr/local/sbin) in a private mount namespace, and the
/// script runs there; nothing of the host's /usr/local changes.
fn in_private_namespace(script: &str) -> String {
    let bin = env!("CARGO_BIN_EXE_uext4");
    let full =
        format!("set -eu\nmount -t tmpfs uext4-test /usr/local/sbin\ncp '{bin}' /usr/local/sbin/uext4\n{script}");
    run(Command::new("unshare").args(["-m", "--propagation", "private", "sh", "-c", &full]))
}

#[test]
fn mount_t_fuse_uext4_and_an_fstab_line_mount_through_mount_fuse3() {
    if !fuse_oracles() {
        return;
    }
    for tool in ["mount.fuse3", "unshare", "flock"] {
        if !have(tool) && skip(&format!("{tool} is not installed (fuse3, util-linux)")) {
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("img");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    run(uext4().arg("mkfs").arg(&image).args(["--size", "64M", "-q"]));
    let fstab = dir.path().join("fstab");
    std::fs::write(
        &fstab,
        format!("{} {} fuse.uext4 defaults,allow_other,noauto,user,nofail 0 0\n", image.display(), mnt.display()),
    )
    .unwrap();
    let (img, mnt_s, fstab_s) = (image.display(), mnt.display(), fstab.display());
    // Each mount: a write, the mount table's type and options, umount(8), and
    // the daemon's end (the image's lock let go) before the next step.
    let wait = format!("i=0; while ! flock -n '{img}' true; do i=$((i+1)); [ $i -lt 600 ] || exit 9; sleep 0.05; done");
    let said = in_private_namespace(&format!(
        "mount -t fuse.uext4 '{img}' '{mnt_s}' -o allow_other,noatime,nofail\n\
         grep ' {mnt_s} ' /proc/self/mounts\n\
         echo first > '{mnt_s}/by-mount-t'\n\
         umount '{mnt_s}'\n{wait}\n\
         mount -T '{fstab_s}' '{mnt_s}'\n\
         grep ' {mnt_s} ' /proc/self/mounts\n\
         cat '{mnt_s}/by-mount-t' > '{mnt_s}/by-fstab'\n\
         umount '{mnt_s}'\n{wait}\n"
    ));
    let lines: Vec<&str> = said.lines().filter(|l| l.contains(" fuse.uext4 ")).collect();
    assert_eq!(lines.len(), 2, "two mounts in the mount table:\n{said}");
    assert!(lines[0].contains("allow_other") && !lines[0].contains("nosuid"), "mount -t passes dev,suid: {said}");
    assert!(lines[1].contains("noexec") && lines[1].contains("nosuid"), "`user` implies noexec,nosuid: {said}");
    wait_for_daemon(&image);
    assert_e2fsck_clean(&image);
    let kernel = KernelMount::new(&image, "ro");
    assert_eq!(std::fs::read_to_string(kernel.dir.join("by-mount-t")).unwrap(), "first\n");
    assert_eq!(std::fs::read_to_string(kernel.dir.join("by-fstab")).unwrap(), "first\n");
}

#[test]
fn helper_options_mount_fuse3_passes_are_accepted_and_unknown_ones_refused() {
    if !fuse_oracles() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("img");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    run(uext4().arg("mkfs").arg(&image).args(["--size", "32M", "-q"]));
    // As mount.fuse3 runs it: IMAGE DIR -o OPTS, with what fstab lines carry.
    run(uext4()
        .arg(&image)
        .arg(&mnt)
        .args(["-o", "rw,noauto,user,nofail,_netdev,x-systemd.automount,noexec,nosuid,nodev"]));
    std::fs::write(mnt.join("f"), b"x").unwrap();
    run(uext4().arg("umount").arg(&mnt));
    let out = uext4().arg(&image).arg(&mnt).args(["-o", "frobnicate"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("frobnicate"), "{out:?}");
    // A typo of a subcommand is still clap's error, not a mount.
    let out = uext4().args(["lss", "x"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("unrecognized subcommand"), "{out:?}");
    assert_e2fsck_clean(&image);
}
