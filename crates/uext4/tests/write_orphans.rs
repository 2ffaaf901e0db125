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
    // An orphan cannot get a name back (ENOENT, as the kernel's link(2) says).
    assert!(matches!(fs.link(a, ROOT_INO, b"again"), Err(uext4::Error::NotFound(_))));
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
    let stopped = dir.path().join("stopped.img");
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
        // The image as a process stopped now, with the files still open, leaves it.
        fs.sync().unwrap();
        std::fs::copy(&image, &stopped).unwrap();
        assert_ne!(fs.superblock().s_last_orphan, 0);
        // Closed with the files still open: as the kernel's last iputs before an
        // unmount, the close releases them, and nothing is left on the list.
    }
    oracle::assert_e2fsck_clean(&image);
    {
        let fs = Filesystem::open(&image, Options { read_only: true, ..Options::default() }).unwrap();
        assert_eq!(fs.superblock().s_last_orphan, 0, "the close released the open orphans");
        assert_eq!(fs.free_blocks(), free);
    }
    // The kernel accepts the stopped image with its orphan list (and would clean it up).
    let copy = dir.path().join("copy.img");
    std::fs::copy(&stopped, &copy).unwrap();
    drop(oracle::Mount::new(&copy, ""));
    oracle::assert_e2fsck_clean(&copy);
    {
        let fs = Filesystem::open(&stopped, Options { read_only: false, ..Options::default() }).unwrap();
        assert_eq!(fs.superblock().s_last_orphan, 0);
        assert_eq!(fs.free_blocks(), free, "the orphans were not freed at open");
    }
    oracle::assert_e2fsck_clean(&stopped);
}

/// A real mkfs.ext4 image (journal, metadata_csum) with `features` added.
fn kernel_image(dir: &std::path::Path, features: &str) -> std::path::PathBuf {
    let image = dir.join("k.img");
    std::fs::write(&image, vec![0u8; 64 << 20]).unwrap();
    let mut cmd = std::process::Command::new("mkfs.ext4");
    cmd.args(["-F", "-q", "-b", "4096"]);
    if !features.is_empty() {
        cmd.args(["-O", features]);
    }
    oracle::run(cmd.arg(&image));
    image
}

/// `image` copied into memory and opened writable there (so a test can take
/// the device's contents at any moment as a power cut would leave them), with
/// its free block and inode counts.
fn open_in_memory(image: &std::path::Path) -> (std::sync::Arc<uext4::dev::MemDevice>, Filesystem, (u64, u64)) {
    let mem = std::sync::Arc::new(uext4::dev::MemDevice::new(std::fs::read(image).unwrap()));
    let fs = Filesystem::open_device(mem.clone(), Options { read_only: false, ..Options::default() }).unwrap();
    let free = (fs.free_blocks(), fs.free_inodes());
    (mem, fs, free)
}

/// The image after a power cut at `snapshot`, judged three ways: uext4's recovery
/// (its writable open) gives back every block and inode the workload took and
/// leaves e2fsck silent; on a copy, the kernel's replay and orphan cleanup (a
/// loop mount, then umount) leaves e2fsck silent too.
fn judge_cut(dir: &std::path::Path, snapshot: &[u8], free: (u64, u64), why: &str) {
    let ours = dir.join("ours.img");
    std::fs::write(&ours, snapshot).unwrap();
    {
        let fs = Filesystem::open(&ours, Options { read_only: false, ..Options::default() })
            .unwrap_or_else(|e| panic!("{why}: uext4's writable open after the cut: {e}"));
        assert_eq!(fs.superblock().s_last_orphan, 0, "{why}: the chain was processed");
        assert_eq!((fs.free_blocks(), fs.free_inodes()), free, "{why}: uext4's recovery leaked");
    }
    oracle::assert_e2fsck_clean(&ours);
    if oracle::can_loop_mount() {
        let theirs = dir.join("theirs.img");
        std::fs::write(&theirs, snapshot).unwrap();
        drop(oracle::Mount::new(&theirs, ""));
        oracle::assert_e2fsck_clean(&theirs);
    }
}

#[derive(Clone, Copy, Debug)]
enum LastLink {
    Unlink,
    RenameOver,
}

/// Drops the last link of "victim" (1 MiB of data), held open or not, then
/// fsyncs the directory and cuts the power: the commit holds the unlink and,
/// for an open file, its orphan record (issue 13); for a closed one, its freeing
/// (issue 12 item 6). Either way nothing leaks after recovery.
#[test]
fn last_link_dropped_then_directory_fsync_then_power_cut() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    for features in ["", "orphan_file"] {
        for how in [LastLink::Unlink, LastLink::RenameOver] {
            for held_open in [false, true] {
                let why = format!("{how:?}, held open {held_open}, features '{features}'");
                let dir = tempfile::tempdir().unwrap();
                let image = kernel_image(dir.path(), features);
                let mem = std::sync::Arc::new(uext4::dev::MemDevice::new(std::fs::read(&image).unwrap()));
                let fs =
                    Filesystem::open_device(mem.clone(), Options { read_only: false, ..Options::default() }).unwrap();
                let keep = fs.create(ROOT_INO, b"keep", 0o644, ROOT).unwrap().ino;
                fs.write(keep, 0, b"fsync'd before the cut").unwrap();
                fs.fsync(keep).unwrap();
                let free = (fs.free_blocks(), fs.free_inodes());
                let victim = fs.create(ROOT_INO, b"victim", 0o644, ROOT).unwrap().ino;
                fs.write(victim, 0, &vec![7u8; 1 << 20]).unwrap();
                fs.create(ROOT_INO, b"other", 0o644, ROOT).unwrap();
                if held_open {
                    fs.open_inode(victim).unwrap();
                }
                match how {
                    LastLink::Unlink => {
                        fs.unlink(ROOT_INO, b"victim").unwrap();
                        fs.unlink(ROOT_INO, b"other").unwrap();
                    }
                    LastLink::RenameOver => fs.rename(ROOT_INO, b"other", ROOT_INO, b"victim", 0).unwrap(),
                }
                let free = match how {
                    LastLink::Unlink => free,
                    LastLink::RenameOver => (free.0, free.1 - 1),
                };
                if held_open {
                    assert_eq!(fs.read_all(victim).unwrap(), vec![7u8; 1 << 20], "{why}: open file readable");
                    let sb = fs.superblock();
                    let in_file = sb.s_feature_ro_compat & uext4::format::superblock::RO_COMPAT_ORPHAN_PRESENT != 0;
                    if features.is_empty() {
                        assert_eq!(sb.s_last_orphan, victim, "{why}: on the chain");
                    } else {
                        assert!(sb.s_last_orphan == 0 && in_file, "{why}: in the orphan file, not the chain");
                    }
                }
                fs.fsync(ROOT_INO).unwrap();
                let snapshot = mem.contents();
                fs.abandon();
                judge_cut(dir.path(), &snapshot, free, &why);
            }
        }
    }
}

/// O_TMPFILE (`create_tmpfile`): a file made without a name is an orphan from
/// its first commit (on the chain, or in the orphan file); a link gives it a
/// name and takes it off; without one its last close frees it; one made not
/// linkable (O_EXCL) refuses a name as an unlinked file does. A power cut
/// while one is open and nameless leaves nothing behind after uext4's recovery
/// or the kernel's; a named one keeps its data.
#[test]
fn tmpfiles_are_orphans_until_linked() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    for features in ["", "orphan_file"] {
        let dir = tempfile::tempdir().unwrap();
        let (mem, fs, free) = open_in_memory(&kernel_image(dir.path(), features));

        let named = fs.create_tmpfile(ROOT_INO, 0o640, ROOT, true).unwrap();
        assert_eq!((named.nlink, named.perm), (0, 0o640), "{features}");
        fs.write(named.ino, 0, b"kept by its link").unwrap();
        let sb = fs.superblock();
        let in_file = sb.s_feature_ro_compat & uext4::format::superblock::RO_COMPAT_ORPHAN_PRESENT != 0;
        assert!(sb.s_last_orphan == named.ino || in_file, "{features}: recorded as an orphan");
        assert_eq!(fs.link(named.ino, ROOT_INO, b"named").unwrap().nlink, 1);
        assert_eq!(fs.superblock().s_last_orphan, 0, "{features}: the link took it off the chain");
        fs.close_inode(named.ino).unwrap();

        let gone = fs.create_tmpfile(ROOT_INO, 0o600, ROOT, true).unwrap().ino;
        fs.write(gone, 0, &vec![3u8; 1 << 20]).unwrap();
        fs.close_inode(gone).unwrap();
        let excl = fs.create_tmpfile(ROOT_INO, 0o600, ROOT, false).unwrap().ino;
        assert!(matches!(fs.link(excl, ROOT_INO, b"nope"), Err(uext4::Error::NotFound(_))), "{features}");
        fs.close_inode(excl).unwrap();
        assert!(matches!(fs.link(gone, ROOT_INO, b"late"), Err(uext4::Error::NotFound(_))), "{features}");
        let with_named = (free.0 - 1, free.1 - 1);
        assert_eq!((fs.free_blocks(), fs.free_inodes()), with_named, "{features}: the nameless ones were freed");

        // Open and nameless at a power cut.
        let open = fs.create_tmpfile(ROOT_INO, 0o600, ROOT, true).unwrap().ino;
        fs.write(open, 0, &vec![5u8; 1 << 20]).unwrap();
        fs.fsync(open).unwrap();
        let snapshot = mem.contents();
        fs.abandon();
        judge_cut(dir.path(), &snapshot, with_named, features);
        let ours = dir.path().join("ours.img");
        let back = Filesystem::open(&ours, Options::default()).unwrap();
        let ino = back.lookup(ROOT_INO, b"named").unwrap().expect("the linked tmpfile keeps its name");
        assert_eq!(back.read_all(ino).unwrap(), b"kept by its link");
    }
}

/// Orphans on the chain leave it from the middle, the head and the tail, each
/// close committed and cut after: the chain on disk stays whole every time.
#[test]
fn chain_members_closed_in_any_order_across_cuts() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = kernel_image(dir.path(), "");
    let mem = std::sync::Arc::new(uext4::dev::MemDevice::new(std::fs::read(&image).unwrap()));
    let fs = Filesystem::open_device(mem.clone(), Options { read_only: false, ..Options::default() }).unwrap();
    let free = (fs.free_blocks(), fs.free_inodes());
    let mut inos = Vec::new();
    for name in [&b"a"[..], b"b", b"c", b"d"] {
        let ino = fs.create(ROOT_INO, name, 0o644, ROOT).unwrap().ino;
        fs.write(ino, 0, &vec![3u8; 100_000]).unwrap();
        fs.open_inode(ino).unwrap();
        fs.unlink(ROOT_INO, name).unwrap();
        inos.push(ino);
    }
    // Chain: d c b a. Close b (middle), then d (head), then a (tail).
    for &i in &[1usize, 3, 0] {
        fs.close_inode(inos[i]).unwrap();
        // A write to a member that stays: its older copy must not undo the chain.
        fs.write(inos[2], 0, b"still open").unwrap();
        fs.fsync(inos[2]).unwrap();
        let snapshot = mem.contents();
        let why = format!("after closing inode {}", inos[i]);
        // Each cut: nothing of the four must be left allocated after recovery.
        let sub = tempfile::tempdir().unwrap();
        let ours = sub.path().join("ours.img");
        std::fs::write(&ours, &snapshot).unwrap();
        {
            let fs = Filesystem::open(&ours, Options { read_only: false, ..Options::default() }).unwrap();
            assert_eq!((fs.free_blocks(), fs.free_inodes()), free, "{why}: leaked");
        }
        oracle::assert_e2fsck_clean(&ours);
    }
    fs.close_inode(inos[2]).unwrap();
    assert_eq!(fs.superblock().s_last_orphan, 0);
    assert_eq!((fs.free_blocks(), fs.free_inodes()), free);
    drop(fs);
    let done = dir.path().join("done.img");
    std::fs::write(&done, mem.contents()).unwrap();
    oracle::assert_e2fsck_clean(&done);
}

/// The kernel records an open, unlinked file in its orphan file; the image is
/// copied while the file is still open (as after a crash). uext4's writable open
/// replays the journal and frees the orphan, and e2fsck has nothing to say.
#[test]
fn orphans_the_kernel_left_in_its_orphan_file_are_freed() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = kernel_image(dir.path(), "orphan_file");
    let copy = dir.path().join("copy.img");
    let free_before;
    {
        let fs = Filesystem::open(&image, Options::default()).unwrap();
        free_before = (fs.free_blocks(), fs.free_inodes());
    }
    {
        let m = oracle::Mount::new(&image, "");
        let path = m.dir.join("held");
        std::fs::write(&path, vec![5u8; 3 << 20]).unwrap();
        oracle::run(&mut std::process::Command::new("sync"));
        let held = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        oracle::run(&mut std::process::Command::new("sync"));
        std::fs::copy(&image, &copy).unwrap();
        drop(held);
    }
    // The copy does hold an orphan: e2fsck -fn complains about it.
    let out = std::process::Command::new("e2fsck").arg("-fn").arg(&copy).output().unwrap();
    assert_ne!(out.status.code(), Some(0), "the copy should hold the kernel's orphan");
    {
        let fs = Filesystem::open(&copy, Options { read_only: false, ..Options::default() }).unwrap();
        assert_eq!((fs.free_blocks(), fs.free_inodes()), free_before, "the kernel's orphan was not freed");
    }
    oracle::assert_e2fsck_clean(&copy);
    let features = oracle::dumpe2fs_field(&copy, "Filesystem features").unwrap();
    assert!(!features.contains("orphan_present"), "orphan_present stays after a clean close: {features}");
    // And the kernel agrees.
    drop(oracle::Mount::new(&copy, ""));
    oracle::assert_e2fsck_clean(&copy);
}

/// uext4's own orphans on an orphan_file image are recorded in the orphan file
/// and survive a crash: the kernel's mount frees them, and so does e2fsck -fy.
#[test]
fn uext4_orphans_in_the_orphan_file_survive_a_crash() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = kernel_image(dir.path(), "orphan_file");
    let mem = std::sync::Arc::new(uext4::dev::MemDevice::new(std::fs::read(&image).unwrap()));
    let fs = Filesystem::open_device(mem.clone(), Options { read_only: false, ..Options::default() }).unwrap();
    let free = (fs.free_blocks(), fs.free_inodes());
    for name in [&b"x"[..], b"y", b"z"] {
        let ino = fs.create(ROOT_INO, name, 0o644, ROOT).unwrap().ino;
        fs.write(ino, 0, &vec![1u8; 1 << 20]).unwrap();
        fs.open_inode(ino).unwrap();
        fs.unlink(ROOT_INO, name).unwrap();
    }
    assert_eq!(fs.superblock().s_last_orphan, 0, "the orphan file, not the chain");
    fs.sync().unwrap();
    let snapshot = mem.contents();
    fs.abandon();
    let crashed = dir.path().join("crashed.img");
    std::fs::write(&crashed, &snapshot).unwrap();
    let features = oracle::dumpe2fs_field(&crashed, "Filesystem features").unwrap();
    assert!(features.contains("orphan_present"), "{features}");
    let out = std::process::Command::new("e2fsck").arg("-fn").arg(&crashed).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Orphan file (inode 12) block 0 is not clean"), "e2fsck sees the records:\n{text}");

    // The kernel frees them at mount.
    let kernel = dir.path().join("kernel.img");
    std::fs::write(&kernel, &snapshot).unwrap();
    drop(oracle::Mount::new(&kernel, ""));
    oracle::assert_e2fsck_clean(&kernel);
    // e2fsck -fy frees them (exit 1: fixed), after which -fn is silent.
    let fixed = dir.path().join("fixed.img");
    std::fs::write(&fixed, &snapshot).unwrap();
    let out = std::process::Command::new("e2fsck").arg("-fy").arg(&fixed).output().unwrap();
    assert!(out.status.code().is_some_and(|c| c <= 1), "e2fsck -fy: {out:?}");
    oracle::assert_e2fsck_clean(&fixed);
    // And uext4's next writable open frees them.
    judge_cut(dir.path(), &snapshot, free, "uext4 orphans in the orphan file");
}

/// Multi-mount protection: uext4 does not run the kernel's kmmpd heartbeat, so a
/// writable open is refused, naming MMP, before anything is written; a read-only
/// open works.
#[test]
fn mmp_images_open_read_only_only() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = kernel_image(dir.path(), "mmp");
    let before = std::fs::read(&image).unwrap();
    let err = match Filesystem::open(&image, Options { read_only: false, ..Options::default() }) {
        Ok(_) => panic!("a writable open of an MMP image must be refused"),
        Err(e) => e,
    };
    assert!(matches!(err, uext4::Error::Unsupported { .. }), "{err:?}");
    assert!(err.to_string().contains("mmp"), "the refusal names MMP: {err}");
    assert!(std::fs::read(&image).unwrap() == before, "the refused open changed the image");
    let fs = Filesystem::open(&image, Options::default()).unwrap();
    assert!(fs.is_read_only());
    assert!(fs.lookup_path(b"/lost+found").is_ok());
    drop(fs);
    oracle::assert_e2fsck_clean(&image);
}

/// An orphan file of one 1 KiB block holds 254 entries; the orphans past that go
/// on the chain, as in the kernel. After a crash with 300 recorded, uext4, the
/// kernel and e2fsck -fy each free all of them.
#[test]
fn a_full_orphan_file_overflows_to_the_chain() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("small.img");
    std::fs::write(&image, vec![0u8; 32 << 20]).unwrap();
    oracle::run(
        std::process::Command::new("mkfs.ext4")
            .args(["-F", "-q", "-b", "1024", "-O", "orphan_file", "-E", "orphan_file_size=1"])
            .arg(&image),
    );
    let mem = std::sync::Arc::new(uext4::dev::MemDevice::new(std::fs::read(&image).unwrap()));
    let fs = Filesystem::open_device(mem.clone(), Options { read_only: false, ..Options::default() }).unwrap();
    let free = (fs.free_blocks(), fs.free_inodes());
    let mut inos = Vec::new();
    for n in 0..300 {
        let name = format!("o{n}");
        let ino = fs.create(ROOT_INO, name.as_bytes(), 0o644, ROOT).unwrap().ino;
        fs.write(ino, 0, &[n as u8; 1500]).unwrap();
        fs.open_inode(ino).unwrap();
        fs.unlink(ROOT_INO, name.as_bytes()).unwrap();
        inos.push(ino);
    }
    let head = fs.superblock().s_last_orphan;
    assert_eq!(head, inos[299], "the 255th orphan on is on the chain");
    // Close some from both places: the records stay consistent.
    for &i in [0usize, 100, 260, 280, 299].iter() {
        fs.close_inode(inos[i]).unwrap();
    }
    fs.fsync(ROOT_INO).unwrap();
    let snapshot = mem.contents();
    fs.abandon();
    let fixed = dir.path().join("fixed.img");
    std::fs::write(&fixed, &snapshot).unwrap();
    let out = std::process::Command::new("e2fsck").arg("-fy").arg(&fixed).output().unwrap();
    assert!(out.status.code().is_some_and(|c| c <= 1), "e2fsck -fy: {out:?}");
    oracle::assert_e2fsck_clean(&fixed);
    judge_cut(dir.path(), &snapshot, free, "a full orphan file");
}

/// Four threads unlink open files, write to and truncate them while other
/// threads' closes take neighbours off the chain, then the power goes with some
/// still open. Every chain change must reach the disk intact: after the cut,
/// uext4's recovery and the kernel's leave e2fsck silent and nothing leaked.
#[test]
fn concurrent_orphans_then_a_power_cut() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    for features in ["", "orphan_file"] {
        let dir = tempfile::tempdir().unwrap();
        let (mem, fs, free) = open_in_memory(&kernel_image(dir.path(), features));
        std::thread::scope(|s| {
            for t in 0..4u32 {
                let fs = &fs;
                s.spawn(move || {
                    let mut held = Vec::new();
                    for n in 0..150u32 {
                        let name = format!("t{t}-{n}");
                        let ino = fs.create(ROOT_INO, name.as_bytes(), 0o644, ROOT).unwrap().ino;
                        fs.write(ino, 0, &vec![n as u8; 5000 + n as usize * 10]).unwrap();
                        fs.open_inode(ino).unwrap();
                        fs.unlink(ROOT_INO, name.as_bytes()).unwrap();
                        held.push(ino);
                        // Older copies of orphans must not undo chain changes made meanwhile.
                        let poke = held[(n as usize * 7) % held.len()];
                        fs.write(poke, 100, &[t as u8; 256 << 10]).unwrap();
                        let size = uext4::SetAttr { size: Some(3000), ..Default::default() };
                        fs.setattr(held[(n as usize * 3) % held.len()], &size).unwrap();
                        if n % 3 == 0 {
                            let i = held.remove((n as usize * 5) % held.len());
                            fs.close_inode(i).unwrap();
                        }
                        if n % 25 == 0 {
                            fs.fsync(ROOT_INO).unwrap();
                        }
                    }
                });
            }
        });
        fs.fsync(ROOT_INO).unwrap();
        let snapshot = mem.contents();
        fs.abandon();
        judge_cut(dir.path(), &snapshot, free, &format!("concurrent orphans, features '{features}'"));
    }
}

/// Orphan records that cannot be right refuse a writable open, naming what is
/// wrong, before anything is written; a read-only open still works.
#[test]
fn bad_orphan_records_refuse_a_writable_open_before_any_change() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let refused = |image: &std::path::Path, says: &str| {
        let before = std::fs::read(image).unwrap();
        match Filesystem::open(image, Options { read_only: false, ..Options::default() }) {
            Ok(_) => panic!("a writable open with {says} must be refused"),
            Err(e) => {
                assert!(matches!(e, uext4::Error::Corrupt { .. }), "{e:?}");
                assert!(e.to_string().contains(says), "the refusal says '{says}': {e}");
            }
        }
        assert!(std::fs::read(image).unwrap() == before, "the refused open changed the image");
        let fs = Filesystem::open(image, Options::default()).unwrap();
        assert!(fs.lookup_path(b"/lost+found").is_ok());
    };
    // The chain's head names an inode nobody uses.
    let image = kernel_image(dir.path(), "");
    oracle::run(std::process::Command::new("debugfs").args(["-w", "-R", "ssv last_orphan 40"]).arg(&image));
    refused(&image, "not in use");
    // ... or one below s_first_ino.
    oracle::run(std::process::Command::new("debugfs").args(["-w", "-R", "ssv last_orphan 7"]).arg(&image));
    refused(&image, "cannot be an orphan");
    // The orphan file's block lost its magic.
    let image = kernel_image(dir.path(), "orphan_file");
    let out = oracle::run(std::process::Command::new("debugfs").args(["-R", "blocks <12>"]).arg(&image));
    let first: u64 = out.split_whitespace().find_map(|w| w.parse().ok()).expect("the orphan file's blocks");
    let f = std::fs::OpenOptions::new().write(true).open(&image).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0u8; 4], first * 4096 + 4096 - 8).unwrap();
    drop(f);
    refused(&image, "bad magic");
}

/// Block-mapped orphans (issue 15): on ext3 and on an ext3 upgraded with tune2fs
/// -O extent, the kernel leaves a block-mapped file (through its double indirect
/// blocks) unlinked while open on its orphan chain, and uext4's writable open
/// frees it; uext4 leaves its own block-mapped orphans by stopping with them open,
/// and both its next open and, on a copy, the kernel's mount free them.
#[test]
fn block_mapped_orphans_on_ext3_are_freed_by_uext4_and_the_kernel() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    for upgrade in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("ext3.img");
        oracle::make_shape(&image, "mkfs.ext3", &["-b", "1024"], "64M");
        if upgrade {
            oracle::upgrade_to_extents(&image);
        }
        let free_before = {
            let fs = Filesystem::open(&image, Options::default()).unwrap();
            (fs.free_blocks(), fs.free_inodes())
        };
        // The kernel's orphan. On the upgraded image the file is made before the
        // upgrade, so that it is block-mapped there too.
        let held_image = dir.path().join("held.img");
        let copy = dir.path().join("copy.img");
        oracle::make_shape(&held_image, "mkfs.ext3", &["-b", "1024"], "64M");
        let fresh = {
            let fs = Filesystem::open(&held_image, Options::default()).unwrap();
            (fs.free_blocks(), fs.free_inodes())
        };
        {
            let m = oracle::Mount::new(&held_image, "");
            std::fs::write(m.dir.join("held"), vec![5u8; 3 << 20]).unwrap();
        }
        if upgrade {
            oracle::upgrade_to_extents(&held_image);
        }
        let stat = oracle::run(std::process::Command::new("debugfs").arg("-R").arg("stat /held").arg(&held_image));
        assert!(stat.contains("(DIND)"), "the kernel's file should reach its double indirect block:\n{stat}");
        {
            let m = oracle::Mount::new(&held_image, "");
            let path = m.dir.join("held");
            let held = std::fs::File::open(&path).unwrap();
            std::fs::remove_file(&path).unwrap();
            oracle::run(&mut std::process::Command::new("sync"));
            std::fs::copy(&held_image, &copy).unwrap();
            drop(held);
        }
        let out = std::process::Command::new("e2fsck").arg("-fn").arg(&copy).output().unwrap();
        assert_ne!(out.status.code(), Some(0), "the copy should hold the kernel's orphan");
        {
            let fs = Filesystem::open(&copy, Options { read_only: false, ..Options::default() })
                .unwrap_or_else(|e| panic!("writable open with the kernel's block-mapped orphan: {e}"));
            assert_eq!(fs.superblock().s_last_orphan, 0);
            // Its 3,072 data blocks and 14 indirect blocks (one single, one double
            // and the 12 single ones under it) all came back.
            assert_eq!((fs.free_blocks(), fs.free_inodes()), fresh, "the kernel's orphan was not freed");
        }
        oracle::assert_e2fsck_clean(&copy);

        // uext4's own block-mapped orphans, left by a stop.
        {
            let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
            for name in [&b"x"[..], b"y"] {
                let ino = fs.create(ROOT_INO, name, 0o644, ROOT).unwrap().ino;
                fs.write(ino, 0, &vec![1u8; 2 << 20]).unwrap();
                fs.open_inode(ino).unwrap();
                fs.unlink(ROOT_INO, name).unwrap();
            }
        }
        let copy = dir.path().join("uext4-copy.img");
        std::fs::copy(&image, &copy).unwrap();
        drop(oracle::Mount::new(&copy, ""));
        oracle::assert_e2fsck_clean(&copy);
        {
            let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
            assert_eq!(fs.superblock().s_last_orphan, 0);
            assert_eq!((fs.free_blocks(), fs.free_inodes()), free_before, "uext4's orphans were not freed");
        }
        oracle::assert_e2fsck_clean(&image);
    }
}
