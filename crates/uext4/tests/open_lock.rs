//! Who may open an image while someone else holds it: a writable open takes the
//! image's exclusive lock for the life of its `Filesystem` and is refused
//! (`Error::Busy`, naming the holder) while another uext4 open or the kernel
//! holds the image — by a loop mount, named through any path; a read-only open
//! goes ahead and says who else held it. e2fsck -fn and the kernel's own view
//! judge that a refused open changed nothing.

mod oracle;

use std::path::Path;
use std::process::Command;
use uext4::{Error, Filesystem, Options, Owner, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };

fn rw() -> Options {
    Options { read_only: false, ..Options::default() }
}

fn mkfs(image: &Path) {
    oracle::run(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096"]).arg(image).arg("32M"));
}

fn busy_message(result: uext4::Result<Filesystem>) -> String {
    match result {
        Err(Error::Busy(why)) => why,
        Err(e) => panic!("expected Busy, got {e}"),
        Ok(_) => panic!("expected Busy, the open succeeded"),
    }
}

#[test]
fn a_writable_open_holds_the_image_for_its_whole_life() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    mkfs(&image);
    let alias = dir.path().join("alias.img");
    std::os::unix::fs::symlink(&image, &alias).unwrap();

    let first = Filesystem::open(&image, rw()).unwrap();
    first.mkdir(ROOT_INO, b"by-the-holder", 0o755, ROOT).unwrap();
    // Refused by any name, before anything is written.
    for name in [&image, &alias] {
        let why = busy_message(Filesystem::open(name, rw()));
        assert!(why.contains("another uext4 process"), "{why}");
    }
    let mkfs_again = uext4::mkfs::mkfs(&image, &uext4::mkfs::MkfsOptions { size: 32 << 20, ..Default::default() });
    assert!(matches!(mkfs_again, Err(Error::Busy(_))), "mkfs over a held image: {:?}", mkfs_again.err());
    // A reader goes ahead, told who else holds the image.
    let reader = Filesystem::open(&alias, Options::default()).unwrap();
    assert!(reader.in_use().is_some_and(|w| w.contains("uext4")), "{:?}", reader.in_use());
    assert!(reader.lookup(ROOT_INO, b"lost+found").unwrap().is_some());
    // ... and does not keep a writer out.
    drop(first);
    let second = Filesystem::open(&image, rw()).expect("the lock goes with the filesystem");
    assert!(second.in_use().is_none());
    assert!(second.lookup(ROOT_INO, b"by-the-holder").unwrap().is_some(), "the first writer's change is there");
    drop(second);
    drop(reader);
    let fresh = Filesystem::open(&image, Options::default()).unwrap();
    assert!(fresh.in_use().is_none(), "nobody holds the image any more: {:?}", fresh.in_use());
    oracle::assert_e2fsck_clean(&image);
}

/// What e2fsprogs' ext2fs_check_if_mounted checks: the kernel holds the image
/// through a loop device backed by it.
#[test]
fn a_kernel_mount_refuses_writers_and_warns_readers() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    mkfs(&image);
    let alias = dir.path().join("alias.img");
    std::fs::hard_link(&image, &alias).unwrap();
    for options in ["", "ro"] {
        let m = oracle::Mount::new(&image, options);
        if options.is_empty() {
            std::fs::write(m.dir.join("kernels"), "written by the kernel").unwrap();
        }
        let loop_dev = oracle::run(Command::new("losetup").arg("-j").arg(&image));
        let loop_dev = loop_dev.split(':').next().unwrap().trim().to_string();
        // The hard link has another path but the same inode: refused all the same.
        for name in [&image, &alias] {
            let why = busy_message(Filesystem::open(name, rw()));
            assert!(
                why.contains("the kernel") && why.contains(&*m.dir.to_string_lossy()) && why.contains(&loop_dev),
                "{options:?}: {why}"
            );
        }
        let refused = uext4::mkfs::mkfs(&image, &uext4::mkfs::MkfsOptions { size: 32 << 20, ..Default::default() });
        assert!(matches!(refused, Err(Error::Busy(_))), "mkfs over a mounted image: {:?}", refused.err());
        let reader = Filesystem::open(&alias, Options::default()).unwrap();
        let who = reader.in_use().unwrap_or_default();
        assert!(who.contains("the kernel") && who.contains(&loop_dev), "{options:?}: {who}");
        drop(reader);
        assert!(std::fs::read(m.dir.join("kernels")).is_ok_and(|d| d == b"written by the kernel"));
    }
    // Unmounted, the image is free again, and nothing above touched it.
    oracle::assert_e2fsck_clean(&image);
    let fs = Filesystem::open(&image, rw()).unwrap();
    assert!(fs.in_use().is_none());
    assert!(fs.lookup(ROOT_INO, b"kernels").unwrap().is_some());
    drop(fs);
    oracle::assert_e2fsck_clean(&image);
}

/// A writable open of a block device is exclusive, as e2fsprogs' is: the kernel
/// refuses it while the device is mounted in a mount namespace this process
/// cannot see (so /proc/self/mounts cannot tell).
#[test]
fn a_mount_in_another_namespace_refuses_writers_of_its_device() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    mkfs(&image);
    /// Detached on drop, even when the test fails.
    struct LoopDevice(String);
    impl Drop for LoopDevice {
        fn drop(&mut self) {
            let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
        }
    }
    let attached = LoopDevice(oracle::run(Command::new("losetup").args(["-f", "--show"]).arg(&image)).trim().into());
    let loop_dev = attached.0.clone();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    // The mount lives in a private namespace for as long as its shell sleeps.
    let mut holder = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!("mount {loop_dev} {} && echo up && exec sleep 30", mnt.display()))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(holder.stdout.take().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "up", "the namespaced mount did not come up");
    let visible = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let shown = visible.lines().any(|l| l.split(' ').next() == Some(loop_dev.as_str()));
    assert!(!shown, "the mount was meant to be invisible here:\n{visible}");
    let result = Filesystem::open(&loop_dev, rw());
    let _ = holder.kill();
    let _ = holder.wait();
    let why = busy_message(result);
    assert!(why.contains("held by the kernel"), "{why}");
    // Once the namespace is gone the device is free.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let fs = loop {
        match Filesystem::open(&loop_dev, rw()) {
            Ok(fs) => break fs,
            Err(Error::Busy(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }
            Err(e) => panic!("{e}"),
        }
    };
    fs.mkdir(ROOT_INO, b"after", 0o755, ROOT).unwrap();
    drop(fs);
    drop(attached);
    oracle::assert_e2fsck_clean(&image);
}

/// Detached on drop, even when the test fails.
struct Attached(String);

impl Attached {
    fn new(image: &Path, read_only: bool) -> Attached {
        let mut cmd = Command::new("losetup");
        if read_only {
            cmd.arg("-r");
        }
        Attached(oracle::run(cmd.args(["-f", "--show"]).arg(image)).trim().into())
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

/// The same image named as a file and as a loop device over it is one image:
/// a writer through either name keeps a writer through the other out (both
/// took the lock of their own name, and 50 creates through the second were
/// lost), and a read-only loop device refuses a writable open before anything
/// is written.
#[test]
fn a_loop_device_and_its_file_are_one_image() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    mkfs(&image);
    let dev = Attached::new(&image, false);
    {
        let by_file = Filesystem::open(&image, rw()).unwrap();
        let why = busy_message(Filesystem::open(&dev.0, rw()));
        assert!(why.contains("uext4"), "{why}");
        by_file.mkdir(ROOT_INO, b"by-file", 0o755, ROOT).unwrap();
    }
    {
        let by_device = Filesystem::open(&dev.0, rw()).unwrap();
        let why = busy_message(Filesystem::open(&image, rw()));
        assert!(why.contains("uext4"), "{why}");
        by_device.mkdir(ROOT_INO, b"by-device", 0o755, ROOT).unwrap();
    }
    drop(dev);
    oracle::assert_e2fsck_clean(&image);
    let before = std::fs::read(&image).unwrap();
    let ro = Attached::new(&image, true);
    match Filesystem::open(&ro.0, rw()) {
        Err(Error::ReadOnly(why)) => assert!(why.contains("read-only block device"), "{why}"),
        Err(e) => panic!("expected ReadOnly, got {e}"),
        Ok(_) => panic!("a read-only device opened writable"),
    }
    let fs = Filesystem::open(&ro.0, Options::default()).unwrap();
    assert!(fs.lookup_path(b"/by-device").is_ok() && fs.lookup_path(b"/by-file").is_ok());
    drop(fs);
    drop(ro);
    assert!(std::fs::read(&image).unwrap() == before, "the refused open changed the image");
}
