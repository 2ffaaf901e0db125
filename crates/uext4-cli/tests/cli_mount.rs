//! `uext4 mount`, judged from outside: what a shell does through the mount must
//! leave an image that e2fsck finds clean and the kernel reads back as the same
//! tree the shell made on the host; random I/O on one file must match an
//! in-memory copy; POSIX behaviour at the mount (permissions, sticky
//! directories, O_EXCL, renames over directories, unlinked open files, link
//! counts, timestamps) must be the kernel's ext4's, which runs the same steps
//! side by side.

mod common;

use common::*;
use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// A source tree with files of many sizes, subdirectories, symlinks, a hard
/// link and a fifo.
fn make_source(root: &Path) {
    for d in 0..8 {
        let dir = root.join(format!("d{d}"));
        fs::create_dir_all(dir.join("sub")).unwrap();
        for f in 0..25u64 {
            let len = ((d * 25 + f) * 7919 % 90_000) as usize;
            let body: Vec<u8> = (0..len).map(|i| (i as u64 * 31 + f + d) as u8).collect();
            fs::write(dir.join(format!("f{f}")), body).unwrap();
        }
        fs::write(dir.join("sub/deep"), format!("deep {d}")).unwrap();
        std::os::unix::fs::symlink(format!("../d{d}/f1"), dir.join("link")).unwrap();
    }
    fs::hard_link(root.join("d0/f2"), root.join("d0/f2-again")).unwrap();
    run(Command::new("mkfifo").arg(root.join("d1/fifo")));
    fs::set_permissions(root.join("d2/f3"), fs::Permissions::from_mode(0o640)).unwrap();
}

const SHELL_WORK: &str = r#"set -e
cp -a "$SRC" copy
mkdir unpacked
tar -C unpacked -xf "$TAR"
mv copy/d3 moved
mv unpacked/d1/f1 unpacked/renamed
ln copy/d1/f0 hardlink
ln -s copy/d1/f0 symlink
chmod 600 copy/d2/f1
chmod -R g-r,o-r unpacked/d2
rm -rf copy/d4 unpacked/d5
"#;

#[test]
fn a_shell_workload_through_the_mount_equals_the_same_on_the_host() {
    shell_workload(false, false);
}

#[test]
fn a_shell_workload_through_the_mount_over_io_uring() {
    shell_workload(true, false);
}

/// With the kernel's write-back cache, tar's and cp's mtimes must survive the
/// data reaching the server after them.
#[test]
fn a_shell_workload_through_the_mount_with_the_writeback_cache() {
    shell_workload(true, true);
}

fn shell_workload(uring: bool, writeback_cache: bool) {
    if !fuse_oracles() {
        return;
    }
    let Some(options) = transport(uring) else { return };
    let options = with_writeback_cache(options, writeback_cache);
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    make_source(&src);
    let tar = work.path().join("src.tar");
    run(Command::new("tar").arg("-C").arg(&src).arg("-cf").arg(&tar).arg("."));
    let host = work.path().join("host");
    fs::create_dir(&host).unwrap();
    let shell = |dir: &Path| {
        run(Command::new("sh").arg("-c").arg(SHELL_WORK).current_dir(dir).env("SRC", &src).env("TAR", &tar));
    };
    shell(&host);

    let image = work.path().join("img");
    mkfs(&image, "1G");
    let m = UextMount::new(&image, &options);
    fs::create_dir(m.dir.join("work")).unwrap();
    shell(&m.dir.join("work"));
    assert_eq!(tree_listing(&m.dir.join("work")), tree_listing(&host), "the mount's own view");
    assert_transport(&m.dir, uring, 100);
    assert_writeback_cache(&m.dir, writeback_cache);
    m.unmount();
    assert_e2fsck_clean(&image);
    let k = KernelMount::new(&image, "ro");
    let (theirs, ours) = (tree_listing(&k.dir.join("work")), tree_listing(&host));
    assert!(theirs.len() > 300, "{} entries", theirs.len());
    assert_eq!(theirs, ours, "the kernel's view of what the shell did through uext4");
}

/// fsx-style: random writes, reads, truncates, preallocations, punched holes and
/// zeroed ranges on one file, every read checked against an in-memory copy.
#[test]
fn random_io_on_one_file_matches_an_in_memory_copy() {
    random_io(false, false);
}

#[test]
fn random_io_on_one_file_over_io_uring() {
    random_io(true, false);
}

/// The same with the kernel's write-back cache: writes sit in its page cache
/// while truncates, preallocations, punches and zeroed ranges go to the server.
#[test]
fn random_io_on_one_file_with_the_writeback_cache() {
    random_io(true, true);
}

/// With the write-back cache a partial-page write makes the kernel read the
/// page first; that read is not a reader's, so atime stays (as the kernel's
/// ext4 leaves it on a write), while a real read still moves it (relatime,
/// atime older than a day). Judged by debugfs on the image.
#[test]
fn a_partial_write_with_the_writeback_cache_leaves_atime() {
    if !fuse_oracles() {
        return;
    }
    let Some(options) = transport(true) else { return };
    let options = with_writeback_cache(options, true);
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("img");
    mkfs(&image, "64M");
    let atime = || {
        let out = run(Command::new("debugfs").arg("-R").arg("stat /f").arg(&image));
        let line = out.lines().find(|l| l.trim_start().starts_with("atime:")).unwrap_or_else(|| panic!("{out}"));
        line.trim().to_string()
    };
    let m = UextMount::new(&image, &options);
    fs::write(m.dir.join("f"), vec![7u8; 10_000]).unwrap();
    run(Command::new("touch").args(["-a", "-d", "2000-01-01"]).arg(m.dir.join("f")));
    m.unmount();
    let old = atime();
    assert!(old.contains("2000"), "{old}");

    // A fresh mount: the page is not cached, so the kernel reads it before
    // the 5-byte write lands in it.
    let m = UextMount::new(&image, &options);
    let f = OpenOptions::new().write(true).open(m.dir.join("f")).unwrap();
    f.write_all_at(b"hello", 100).unwrap();
    drop(f);
    m.unmount();
    assert_eq!(atime(), old, "a write moved atime");

    let m = UextMount::new(&image, &options);
    let _ = fs::read(m.dir.join("f")).unwrap();
    m.unmount();
    assert_ne!(atime(), old, "a read did not move atime");
}

fn random_io(uring: bool, writeback_cache: bool) {
    if !fuse_oracles() {
        return;
    }
    let Some(options) = transport(uring) else { return };
    let options = with_writeback_cache(options, writeback_cache);
    const OPS: usize = 100_000;
    const MAX_SIZE: u64 = 2 << 20;
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("img");
    mkfs(&image, "256M");
    let m = UextMount::new(&image, &options);
    let path = m.dir.join("fsx");
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    let mut model: Vec<u8> = Vec::new();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rand = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n.max(1)
    };
    let mut counts = [0usize; 6];
    for op in 0..OPS {
        let size = model.len() as u64;
        let off = rand(MAX_SIZE);
        let len = 1 + rand(64 * 1024).min(MAX_SIZE - off - 1);
        let kind = rand(100) as usize;
        let what = match kind {
            0..=34 => {
                let data: Vec<u8> = (0..len).map(|i| (i ^ op as u64 ^ off) as u8 | 1).collect();
                file.write_all_at(&data, off).unwrap();
                let end = (off + len) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&data);
                0
            }
            35..=69 => {
                let at = rand(size + 1);
                let mut buf = vec![0u8; len as usize];
                let n = file.read_at(&mut buf, at).unwrap();
                let expect = &model[(at as usize).min(model.len())..(at + len).min(size) as usize];
                assert_eq!(n, expect.len(), "op {op}: read of {len} at {at} in a {size}-byte file");
                assert!(buf[..n] == *expect, "op {op}: read of {len} at {at} differs");
                1
            }
            70..=79 => {
                let new = rand(MAX_SIZE);
                file.set_len(new).unwrap();
                model.resize(new as usize, 0);
                2
            }
            80..=87 => {
                // Preallocate; without KEEP_SIZE the size grows over the range.
                let keep = rand(2) == 0;
                let r = unsafe {
                    libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&file), keep as i32, off as i64, len as i64)
                };
                assert_eq!(r, 0, "op {op}: fallocate: {}", std::io::Error::last_os_error());
                if !keep && (off + len) as usize > model.len() {
                    model.resize((off + len) as usize, 0);
                }
                3
            }
            88..=95 => {
                let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                let r =
                    unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&file), mode, off as i64, len as i64) };
                assert_eq!(r, 0, "op {op}: punch: {}", std::io::Error::last_os_error());
                let end = ((off + len) as usize).min(model.len());
                if (off as usize) < end {
                    model[off as usize..end].fill(0);
                }
                4
            }
            _ => {
                let r = unsafe {
                    libc::fallocate(
                        std::os::fd::AsRawFd::as_raw_fd(&file),
                        libc::FALLOC_FL_ZERO_RANGE,
                        off as i64,
                        len as i64,
                    )
                };
                assert_eq!(r, 0, "op {op}: zero range: {}", std::io::Error::last_os_error());
                let end = (off + len) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].fill(0);
                5
            }
        };
        counts[what] += 1;
        if op % 10_000 == 9_999 {
            assert_eq!(file.metadata().unwrap().len(), model.len() as u64, "op {op}: size");
            assert!(fs::read(&path).unwrap() == model, "op {op}: whole-file comparison");
        }
    }
    eprintln!("fsx: {OPS} operations (write, read, truncate, fallocate, punch, zero): {counts:?}");
    file.sync_all().unwrap();
    drop(file);
    assert_transport(&m.dir, uring, 100);
    assert_writeback_cache(&m.dir, writeback_cache);
    // Through /dev/fuse every read was spliced from the image (splice_read's default).
    let (spliced, copied) = reads_by_kind(&m.dir);
    eprintln!("reads: {spliced} spliced, {copied} copied");
    if !uring {
        assert!(spliced > 100 && copied == 0, "{spliced} reads spliced, {copied} copied");
    }
    m.unmount();
    assert_e2fsck_clean(&image);
    let k = KernelMount::new(&image, "ro");
    assert!(fs::read(k.dir.join("fsx")).unwrap() == model, "the kernel reads the file differently");
}

/// Runs `script` with sh as user and group 65534 (nobody), returning its status.
fn as_nobody(script: &str) -> bool {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", script])
        .output()
        .expect("setpriv")
        .status
        .success()
}

#[test]
fn permissions_sticky_directories_and_excl_create() {
    permissions(false);
}

#[test]
fn permissions_sticky_directories_and_excl_create_over_io_uring() {
    permissions(true);
}

fn permissions(uring: bool) {
    if !fuse_oracles() {
        return;
    }
    let Some(options) = transport(uring) else { return };
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("img");
    mkfs(&image, "128M");
    let m = UextMount::new(&image, &format!("allow_other,{options}"));
    let d = &m.dir;
    fs::write(d.join("rootfile"), "root's").unwrap();
    fs::set_permissions(d.join("rootfile"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(d.join("private"), "secret").unwrap();
    fs::set_permissions(d.join("private"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::create_dir(d.join("rootdir")).unwrap();
    fs::create_dir(d.join("sticky")).unwrap();
    fs::set_permissions(d.join("sticky"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::write(d.join("sticky/roots"), "x").unwrap();
    fs::set_permissions(d.join("sticky/roots"), fs::Permissions::from_mode(0o666)).unwrap();
    let p = |rel: &str| d.join(rel).display().to_string();

    assert!(as_nobody(&format!("cat {}", p("rootfile"))), "others may read a 0644 file");
    assert!(!as_nobody(&format!("echo x >> {}", p("rootfile"))), "others may not write a 0644 file");
    assert!(!as_nobody(&format!("cat {}", p("private"))), "others may not read a 0600 file");
    assert!(!as_nobody(&format!("touch {}/new", p("rootdir"))), "others may not create in a 0755 directory");
    assert!(as_nobody(&format!("echo mine > {}/mine", p("sticky"))), "anyone may create in a 1777 directory");
    assert_eq!(fs::metadata(d.join("sticky/mine")).unwrap().uid(), 65534, "a new file belongs to its creator");
    assert!(as_nobody(&format!("echo more >> {}", p("sticky/roots"))), "a 0666 file is writable by others");
    assert!(!as_nobody(&format!("rm -f {}", p("sticky/roots"))), "sticky: others' files cannot be removed");
    assert!(!as_nobody(&format!("mv {} {}/moved", p("sticky/roots"), p("sticky"))), "sticky: nor renamed");
    assert!(as_nobody(&format!("rm {}", p("sticky/mine"))), "one's own file in a sticky directory can go");
    assert!(d.join("sticky/roots").exists());

    // O_EXCL on an existing name fails; on a new one creates exactly once.
    let excl = |rel: &str| OpenOptions::new().write(true).create_new(true).open(d.join(rel));
    assert_eq!(excl("rootfile").unwrap_err().kind(), ErrorKind::AlreadyExists);
    excl("fresh").unwrap();
    assert_eq!(excl("fresh").unwrap_err().kind(), ErrorKind::AlreadyExists);
    m.unmount();
    assert_e2fsck_clean(&image);
}

/// Free bytes of the filesystem mounted at `dir` (statvfs).
fn free_bytes(dir: &Path) -> u64 {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs into a zeroed struct, on a NUL-terminated path.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
    s.f_bfree as u64 * s.f_frsize as u64
}

/// Waits until `dir`'s filesystem has `at_least` bytes free: the kernel forgets
/// an inode asynchronously after its last close. The 20 s bound is a hang guard.
fn wait_until_free(dir: &Path, at_least: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while free_bytes(dir) < at_least {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn renames_over_directories_link_counts_and_unlinked_open_files() {
    renames_and_unlinked_files(false);
}

#[test]
fn renames_over_directories_link_counts_and_unlinked_open_files_over_io_uring() {
    renames_and_unlinked_files(true);
}

fn renames_and_unlinked_files(uring: bool) {
    let Some((m, _work)) = fresh_mount("128M", uring) else { return };
    let image = m.image.clone();
    let d = &m.dir;
    let nlink = |rel: &str| fs::symlink_metadata(d.join(rel)).unwrap().nlink();

    // Link counts: a directory has 2 plus one per subdirectory; a hard link adds one.
    fs::create_dir(d.join("a")).unwrap();
    assert_eq!(nlink("a"), 2);
    fs::create_dir_all(d.join("a/x/y")).unwrap();
    fs::create_dir(d.join("a/z")).unwrap();
    assert_eq!((nlink("a"), nlink("a/x")), (4, 3));
    fs::write(d.join("a/file"), "f").unwrap();
    fs::hard_link(d.join("a/file"), d.join("a/file2")).unwrap();
    assert_eq!(nlink("a/file"), 2);

    // Renames over directories: onto an empty one replaces it; onto a non-empty
    // one fails; a file cannot replace a directory nor a directory a file.
    fs::create_dir(d.join("empty")).unwrap();
    fs::rename(d.join("a/z"), d.join("empty")).unwrap();
    assert!(!d.join("a/z").exists() && d.join("empty").is_dir());
    assert_eq!(nlink("a"), 3, "a lost its subdirectory z");
    let err = fs::rename(d.join("empty"), d.join("a")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTEMPTY), "{err}");
    let err = fs::rename(d.join("a/file"), d.join("empty")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EISDIR), "{err}");
    let err = fs::rename(d.join("empty"), d.join("a/file")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR), "{err}");
    let err = fs::rename(d.join("a"), d.join("a/x/inside")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "a directory cannot move into itself: {err}");

    // An unlinked open file stays readable until closed; then its blocks are free.
    let statvfs_free = || free_bytes(d);
    let body: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
    fs::write(d.join("doomed"), &body).unwrap();
    let before = statvfs_free();
    let f = File::open(d.join("doomed")).unwrap();
    fs::remove_file(d.join("doomed")).unwrap();
    assert!(!d.join("doomed").exists());
    let mut back = vec![0u8; body.len()];
    f.read_exact_at(&mut back, 0).unwrap();
    assert!(back == body, "the unlinked file reads back whole while open");
    assert!(statvfs_free() < before + (4 << 20), "its blocks stay in use while it is open");
    drop(f);
    wait_until_free(d, before + (8 << 20), "the unlinked file's 8 MiB were not freed after its close");
    m.unmount();
    assert_e2fsck_clean(&image);
}

#[test]
fn a_listing_opened_before_a_rename_does_not_give_the_old_name_back() {
    listing_opened_before_a_rename(false);
}

#[test]
fn a_listing_opened_before_a_rename_does_not_give_the_old_name_back_over_io_uring() {
    listing_opened_before_a_rename(true);
}

/// A listing is taken whole at opendir, and the kernel makes a dentry of every
/// entry readdirplus gives. A name renamed away between the opendir and the
/// read was given back with its inode: for its TTL the file answered at its old
/// name too, and a directory's one dentry moved to the old name (or the read
/// failed with ESTALE while another rename ran: `mv` racing `rm -rf` saw
/// "Stale file handle"). The kernel's ext4 never shows a renamed name at its
/// old place, and never answers ESTALE there.
fn listing_opened_before_a_rename(uring: bool) {
    let Some((m, _work)) = fresh_mount("64M", uring) else { return };
    let image = m.image.clone();
    let (a, b) = (m.dir.join("a"), m.dir.join("b"));
    fs::create_dir_all(a.join("x")).unwrap();
    fs::create_dir(&b).unwrap();
    fs::write(a.join("f"), "moved").unwrap();
    fs::write(a.join("stays"), "kept").unwrap();

    let listing = fs::read_dir(&a).unwrap(); // opendir: the listing is taken here
    fs::rename(a.join("f"), b.join("f")).unwrap();
    fs::rename(a.join("x"), b.join("x")).unwrap();
    let names: Vec<String> = listing.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.contains(&"stays".to_string()), "{names:?}");
    for gone in ["f", "x"] {
        let err = fs::symlink_metadata(a.join(gone)).expect_err(&format!("a/{gone} answers after its rename"));
        assert_eq!(err.kind(), ErrorKind::NotFound, "a/{gone}: {err}");
    }
    assert_eq!(fs::read_to_string(b.join("f")).unwrap(), "moved");
    assert!(b.join("x").is_dir());
    let listed_b: Vec<String> =
        fs::read_dir(&b).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert!(listed_b.contains(&"x".to_string()) && listed_b.contains(&"f".to_string()), "{listed_b:?}");

    // The race the tryout found: a directory moved in and out of a directory
    // that another process lists and removes. ENOENT is the kernel's answer
    // when the removal wins; ESTALE never.
    fs::create_dir(b.join("m")).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let remover = {
        let (a, stop) = (a.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let d = a.join("d");
                let _ = fs::create_dir(&d);
                let _ = fs::write(d.join("f"), "");
                let _ = fs::remove_dir_all(&d);
            }
        })
    };
    let mut stale = 0;
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        for (from, to) in [(b.join("m"), a.join("d/m")), (a.join("d/m"), b.join("m"))] {
            if let Err(e) = fs::rename(from, to) {
                stale += usize::from(e.raw_os_error() == Some(libc::ESTALE));
            }
        }
        if !b.join("m").exists() {
            let _ = fs::create_dir(b.join("m"));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    remover.join().unwrap();
    assert_eq!(stale, 0, "renames answered ESTALE");
    m.unmount();
    assert_e2fsck_clean(&image);
}

#[test]
fn o_tmpfile_makes_a_nameless_file_that_linkat_can_name() {
    o_tmpfile(false);
}

#[test]
fn o_tmpfile_over_io_uring() {
    o_tmpfile(true);
}

/// O_TMPFILE through the mount (FUSE_TMPFILE), as on the kernel's ext4: the
/// file has no links and no name; linkat(AT_EMPTY_PATH) names it, unless it was
/// opened with O_EXCL (ENOENT); one closed without a name gives its space back.
/// It was EOPNOTSUPP.
fn o_tmpfile(uring: bool) {
    let Some((m, _work)) = fresh_mount("64M", uring) else { return };
    let image = m.image.clone();
    let cstr = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // O_CLOEXEC: a child another test spawns meanwhile (a daemon) must not
    // inherit the file and keep the mount busy at its unmount.
    let tmpfile = |extra: i32| {
        let fd = unsafe {
            libc::open(cstr(&m.dir).as_ptr(), libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC | extra, 0o640)
        };
        assert!(fd >= 0, "O_TMPFILE: {}", std::io::Error::last_os_error());
        unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) }
    };
    let link = |f: &File, to: &Path| {
        let fd = std::os::fd::AsRawFd::as_raw_fd(f);
        match unsafe { libc::linkat(fd, c"".as_ptr(), libc::AT_FDCWD, cstr(to).as_ptr(), libc::AT_EMPTY_PATH) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    };
    let f = tmpfile(0);
    f.write_all_at(b"named later", 0).unwrap();
    let st = f.metadata().unwrap();
    assert_eq!((st.nlink(), st.mode() & 0o7777), (0, 0o640));
    link(&f, &m.dir.join("named")).unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 1);
    drop(f);
    assert_eq!(fs::read_to_string(m.dir.join("named")).unwrap(), "named later");

    let excl = tmpfile(libc::O_EXCL);
    let err = link(&excl, &m.dir.join("nope")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{err}");
    drop(excl);

    let before = free_bytes(&m.dir);
    let gone = tmpfile(0);
    gone.write_all_at(&vec![7u8; 4 << 20], 0).unwrap();
    assert!(free_bytes(&m.dir) < before, "the nameless file's blocks are in use while it is open");
    drop(gone);
    wait_until_free(&m.dir, before, "the nameless file's space was not given back");
    let names: Vec<String> =
        fs::read_dir(&m.dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names.len(), 2, "{names:?}"); // lost+found, named
    m.unmount();
    assert_e2fsck_clean(&image);
    let out = Command::new("debugfs").args(["-R", "cat /named"]).arg(&image).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "named later");
}

/// RENAME_WHITEOUT (overlayfs asks it of its upper layer), side by side with
/// the kernel's ext4: the old name is left naming a character device 0:0, for
/// a file and for a directory (whose old parent loses a link); with
/// RENAME_EXCHANGE it is EINVAL. It was EINVAL always.
#[test]
fn rename_whiteout_leaves_what_the_kernels_ext4_leaves() {
    if !fuse_oracles() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (kimg, uimg) = (work.path().join("k.img"), work.path().join("u.img"));
    mkfs(&kimg, "64M");
    mkfs(&uimg, "64M");
    let steps = |root: &Path| -> Vec<String> {
        let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        let rename = |a: &str, b: &str, flags: u32| {
            let (a, b) = (c(&root.join(a)), c(&root.join(b)));
            match unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), flags) } {
                0 => "ok".to_string(),
                _ => std::io::Error::last_os_error().to_string(),
            }
        };
        fs::create_dir_all(root.join("w/sub")).unwrap();
        fs::write(root.join("w/a"), "A").unwrap();
        let mut seen = vec![
            rename("w/a", "w/b", libc::RENAME_WHITEOUT),
            rename("w/sub", "sub2", libc::RENAME_WHITEOUT),
            rename("w/b", "w/a", libc::RENAME_WHITEOUT | libc::RENAME_EXCHANGE),
        ];
        let mut names: Vec<_> = fs::read_dir(root.join("w")).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        for n in names {
            let st = fs::symlink_metadata(root.join("w").join(&n)).unwrap();
            seen.push(format!("{n:?} {:o} {} {} {}", st.mode(), st.rdev(), st.nlink(), st.uid()));
        }
        seen.push(format!("w links {}", fs::symlink_metadata(root.join("w")).unwrap().nlink()));
        seen.push(fs::read_to_string(root.join("w/b")).unwrap());
        seen
    };
    let kernel = {
        let k = KernelMount::new(&kimg, "");
        steps(&k.dir)
    };
    let ours = {
        let m = UextMount::new(&uimg, "");
        let seen = steps(&m.dir);
        m.unmount();
        seen
    };
    assert_eq!(ours, kernel);
    assert!(kernel[0] == "ok" && kernel.iter().any(|l| l.starts_with("\"a\" 20000 0 1")), "{kernel:?}");
    assert_e2fsck_clean(&kimg);
    assert_e2fsck_clean(&uimg);
}

/// readdir through the mount lists a directory in the order the kernel's ext4
/// lists the same image: hash order for a one-block directory and an inline
/// one ("." and ".." among the names, as `ext4_htree_fill_tree` hashes them
/// too), hash order after the dots for an indexed one. One-block and inline
/// directories were listed in on-disk order, so tar and find walked them
/// differently.
#[test]
fn readdir_order_is_the_kernels() {
    if !fuse_oracles() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    for features in ["^inline_data", "inline_data"] {
        let image = work.path().join(format!("{features}.img"));
        run(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096", "-O", features]).arg(&image).arg("64M"));
        let listing = |root: &Path| -> Vec<Vec<String>> {
            ["one", "small", "big"]
                .iter()
                .map(|d| {
                    // libc's readdir, which keeps "." and ".." where they come.
                    let out = Command::new("ls").arg("-f").arg(root.join(d)).output().unwrap();
                    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
                })
                .collect()
        };
        let kernel = {
            let k = KernelMount::new(&image, "");
            for (dir, names) in [("one", 40), ("small", 3), ("big", 2000)] {
                fs::create_dir(k.dir.join(dir)).unwrap();
                for i in 0..names {
                    fs::write(k.dir.join(dir).join(format!("name-{i}")), "").unwrap();
                }
            }
            fs::remove_file(k.dir.join("one/name-7")).unwrap();
            listing(&k.dir)
        };
        let m = UextMount::new(&image, "");
        let ours = listing(&m.dir);
        m.unmount();
        assert_eq!(ours, kernel, "{features}");
        assert_ne!(kernel[0][..2], [".".to_string(), "..".to_string()], "{features}: the one-block listing is hashed");
        assert_e2fsck_clean(&image);
    }
}

/// atime, mtime and ctime (seconds and nanoseconds) of a path, if it exists.
type Times = Option<[i64; 6]>;

fn times(dir: &Path, paths: &[&str]) -> Vec<Times> {
    paths
        .iter()
        .map(|p| {
            fs::symlink_metadata(dir.join(p))
                .ok()
                .map(|m| [m.atime(), m.atime_nsec(), m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()])
        })
        .collect()
}

/// Which of atime, mtime and ctime of each path changed over one step.
fn changed(before: &[Times], after: &[Times]) -> String {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| match (b, a) {
            (Some(b), Some(a)) => format!(
                "{}{}{}",
                if b[0..2] != a[0..2] { "a" } else { "-" },
                if b[2..4] != a[2..4] { "m" } else { "-" },
                if b[4..6] != a[4..6] { "c" } else { "-" }
            ),
            (None, Some(_)) => "new".into(),
            (Some(_), None) => "gone".into(),
            (None, None) => "none".into(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn fallocate(path: &Path, mode: i32, offset: i64, len: i64) {
    let file = OpenOptions::new().write(true).open(path).unwrap();
    // SAFETY: fallocate on a descriptor we hold; the result is checked.
    let r = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&file), mode, offset, len) };
    assert_eq!(r, 0, "fallocate mode {mode:#x}: {}", std::io::Error::last_os_error());
}

/// The same steps on the kernel's ext4 and on uext4's mount must touch the same
/// timestamps (of the object and of its directories).
#[test]
fn timestamps_change_where_the_kernels_ext4_changes_them() {
    if !fuse_oracles() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (kimg, uimg) = (work.path().join("k.img"), work.path().join("u.img"));
    mkfs(&kimg, "64M");
    mkfs(&uimg, "64M");
    let k = KernelMount::new(&kimg, "");
    let u = UextMount::new(&uimg, "");
    type Step = (&'static str, fn(&Path));
    let steps: Vec<Step> = vec![
        ("mkdir", |d| fs::create_dir(d.join("dir")).unwrap()),
        ("create", |d| drop(File::create(d.join("dir/f")).unwrap())),
        ("write", |d| fs::write(d.join("dir/f"), "some bytes").unwrap()),
        ("read after write", |d| drop(fs::read(d.join("dir/f")).unwrap())),
        ("read again", |d| drop(fs::read(d.join("dir/f")).unwrap())),
        ("chmod", |d| fs::set_permissions(d.join("dir/f"), fs::Permissions::from_mode(0o600)).unwrap()),
        ("chown", |d| std::os::unix::fs::chown(d.join("dir/f"), Some(1), Some(1)).unwrap()),
        ("truncate", |d| OpenOptions::new().write(true).open(d.join("dir/f")).unwrap().set_len(3).unwrap()),
        ("fallocate, keep size", |d| fallocate(&d.join("dir/f"), libc::FALLOC_FL_KEEP_SIZE, 0, 65536)),
        ("fallocate inside the size", |d| fallocate(&d.join("dir/f"), 0, 0, 2)),
        ("chown -1 -1", |d| std::os::unix::fs::chown(d.join("dir/f"), None, None).unwrap()),
        ("link", |d| fs::hard_link(d.join("dir/f"), d.join("dir/g")).unwrap()),
        ("rename", |d| fs::rename(d.join("dir/g"), d.join("dir/h")).unwrap()),
        ("symlink", |d| std::os::unix::fs::symlink("f", d.join("dir/s")).unwrap()),
        ("setxattr", |d| run(Command::new("setfattr").args(["-n", "user.k", "-v", "v"]).arg(d.join("dir/f"))).clear()),
        ("unlink", |d| fs::remove_file(d.join("dir/h")).unwrap()),
        ("list", |d| assert!(fs::read_dir(d.join("dir")).unwrap().count() > 0)),
        ("rmdir", |d| {
            fs::create_dir(d.join("dir/sub")).unwrap();
            fs::remove_dir(d.join("dir/sub")).unwrap()
        }),
    ];
    let watched = [".", "dir", "dir/f", "dir/h", "dir/s"];
    let mut differ = Vec::new();
    for (name, step) in &steps {
        let mut seen = Vec::new();
        for root in [&k.dir, &u.dir] {
            let before = times(root, &watched);
            // The kernel stamps times from a coarse clock: let it tick.
            std::thread::sleep(Duration::from_millis(30));
            step(root);
            seen.push(changed(&before, &times(root, &watched)));
        }
        if seen[0] != seen[1] {
            differ.push(format!("{name}: kernel [{}] uext4 [{}]", seen[0], seen[1]));
        }
    }
    assert!(differ.is_empty(), "timestamps differ from the kernel's ext4 (paths {watched:?}):\n{}", differ.join("\n"));
    drop(k);
    u.unmount();
    assert_e2fsck_clean(&uimg);
}

#[test]
fn tune_second_mounts_signals_and_bad_input() {
    if !fuse_oracles() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("img");
    mkfs(&image, "128M");
    // mkfs.ext4 leaves errors=continue in the superblock; the option overrides it.
    let bogus = uext4().arg("mount").args(["-o", "errors=bogus"]).arg(&image).arg(work.path()).output().unwrap();
    assert!(String::from_utf8_lossy(&bogus.stderr).contains("errors=bogus"), "{bogus:?}");
    let m = UextMount::new(&image, "threads=2,errors=remount-ro");
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(mounts.lines().any(|l| l.contains(&*m.dir.to_string_lossy()) && l.contains(" fuse.uext4 ")), "{mounts}");

    // A second mount of the same image is refused, by name.
    let other = work.path().join("other");
    fs::create_dir(&other).unwrap();
    let out = uext4().arg("mount").arg(&image).arg(&other).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains(&format!("held by uext4 at {}", m.dir.display())), "{out:?}");

    // Tunables: listed, changed at runtime, refused by name when unknown or not runtime.
    let listed = run(uext4().arg("tune").arg(&m.dir));
    assert!(listed.contains("extent_zeroout_len=256 (runtime)") && listed.contains("commit=5"), "{listed}");
    assert!(listed.contains("errors=remount-ro"), "{listed}");
    let refused = uext4().arg("tune").arg(&m.dir).arg("commit=9").output().unwrap();
    assert!(String::from_utf8_lossy(&refused.stderr).contains("set when mounting"), "{refused:?}");
    let refused = uext4().arg("tune").arg(&m.dir).arg("nosuch=1").output().unwrap();
    assert!(String::from_utf8_lossy(&refused.stderr).contains("unknown tunable"), "{refused:?}");

    // The zero-out length at work: a 64-block preallocation written in its middle
    // splits into three extents with zero-out off, and stays one with it on.
    let prealloc_and_poke = |name: &str| {
        let f = OpenOptions::new().write(true).create(true).truncate(true).open(m.dir.join(name)).unwrap();
        assert_eq!(unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, 64 * 4096) }, 0);
        f.write_all_at(b"middle", 32 * 4096).unwrap();
    };
    run(uext4().arg("tune").arg(&m.dir).arg("extent_zeroout_len=0"));
    assert!(run(uext4().arg("tune").arg(&m.dir)).contains("extent_zeroout_len=0 (runtime)"));
    prealloc_and_poke("split");
    run(uext4().arg("tune").arg(&m.dir).arg("extent_max_zeroout_kb=1024"));
    assert!(run(uext4().arg("tune").arg(&m.dir)).contains("extent_zeroout_len=256 (runtime)"));
    prealloc_and_poke("whole");
    m.unmount();
    assert_e2fsck_clean(&image);
    let extents = |name: &str| {
        let out = run(Command::new("debugfs").arg("-R").arg(format!("ex /{name}")).arg(&image));
        out.lines().filter(|l| l.trim_start().starts_with("0/")).map(str::to_string).collect::<Vec<_>>()
    };
    let (split, whole) = (extents("split"), extents("whole"));
    assert_eq!(split.len(), 3, "zero-out off: {split:?}");
    assert!(split[0].contains("Uninit") && !split[1].contains("Uninit") && split[2].contains("Uninit"), "{split:?}");
    assert_eq!(whole.len(), 1, "zero-out on: {whole:?}");
    assert!(!whole[0].contains("Uninit"), "{whole:?}");

    // SIGTERM to a foreground mount unmounts it and leaves the image clean.
    let mnt = work.path().join("fg");
    fs::create_dir(&mnt).unwrap();
    let mut daemon = uext4().arg("mount").arg("--foreground").arg(&image).arg(&mnt).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !fs::read_to_string("/proc/self/mounts").unwrap().contains(&*mnt.to_string_lossy()) {
        assert!(Instant::now() < deadline, "the foreground mount never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
    fs::write(mnt.join("before-signal"), "kept").unwrap();
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let status = daemon.wait().unwrap();
    assert!(status.success(), "the daemon exits cleanly on SIGTERM: {status}");
    assert!(!fs::read_to_string("/proc/self/mounts").unwrap().contains(&*mnt.to_string_lossy()));
    assert_e2fsck_clean(&image);
    let out = run(Command::new("debugfs").arg("-R").arg("cat /before-signal").arg(&image));
    assert!(out.contains("kept"), "{out}");

    // Bad input: clear errors, no mount left behind.
    let bad = uext4().arg("mount").arg(work.path().join("nosuch.img")).arg(&other).output().unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("nosuch.img"), "{bad:?}");
    let junk = work.path().join("junk.img");
    fs::write(&junk, vec![0u8; 4 << 20]).unwrap();
    let bad = uext4().arg("mount").arg(&junk).arg(&other).output().unwrap();
    assert!(!bad.status.success() && !String::from_utf8_lossy(&bad.stderr).is_empty(), "{bad:?}");
    let bad = uext4().arg("mount").arg(&image).arg(&image).output().unwrap();
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a directory"), "{bad:?}");
    let bad = uext4().arg("umount").arg(&other).output().unwrap();
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a uext4 mount"), "{bad:?}");
    assert!(!fs::read_to_string("/proc/self/mounts").unwrap().contains(&*other.to_string_lossy()));
}

/// Without root, `uext4 mount` goes through the setuid fusermount3 (which
/// hands back the /dev/fuse descriptor over a socket), and `uext4 umount`
/// through `fusermount3 -u`.
#[test]
fn a_user_mounts_through_fusermount3() {
    if !fuse_oracles() {
        return;
    }
    if Command::new("fusermount3").arg("-V").output().is_err() {
        skip("fusermount3 is not installed");
        return;
    }
    let mode = fs::metadata("/dev/fuse").unwrap().permissions().mode();
    if mode & 0o006 != 0o006 {
        skip(&format!("/dev/fuse is closed to users (mode {:o}; scripts/setup opens it)", mode & 0o777));
        return;
    }
    let work = tempfile::tempdir().unwrap();
    fs::set_permissions(work.path(), fs::Permissions::from_mode(0o755)).unwrap();
    // The test binary's directory may be closed to others: a copy they can run.
    let bin = work.path().join("uext4");
    fs::copy(env!("CARGO_BIN_EXE_uext4"), &bin).unwrap();
    let image = work.path().join("img");
    // The filesystem's root belongs to the user, as their own image's would.
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096", "-E", "root_owner=65534:65534"])
        .arg(&image)
        .arg("64M"));
    let mnt = work.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    for p in [&image, &mnt] {
        std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
    }
    let (b, i, m) = (bin.display(), image.display(), mnt.display());
    assert!(as_nobody(&format!("{b} mount {i} {m}")), "a user's mount through fusermount3");
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(mounts.lines().any(|l| l.contains(&*m.to_string()) && l.contains(" fuse.uext4 ")), "{mounts}");
    let script = format!(
        "set -e; mkdir {m}/dir; echo 'by nobody' > {m}/dir/file; test \"$(cat {m}/dir/file)\" = 'by nobody'; \
         test \"$(stat -c %u {m}/dir/file)\" = 65534; ln -s file {m}/dir/link; rm {m}/dir/link"
    );
    assert!(as_nobody(&script), "work through a user's mount");
    assert!(as_nobody(&format!("{b} umount {m}")), "a user unmounts with fusermount3 -u");
    assert!(!fs::read_to_string("/proc/self/mounts").unwrap().contains(&*m.to_string()));
    assert_e2fsck_clean(&image);
    let out = run(Command::new("debugfs").arg("-R").arg("cat /dir/file").arg(&image));
    assert!(out.contains("by nobody"), "{out}");
}

/// A failing io_uring queue must not leave its CPU's callers waiting forever
/// (the kernel never moves a request to another queue): the session is
/// aborted, callers get an error, the mount goes away and the image is clean.
#[test]
fn a_failing_io_uring_queue_ends_the_session_instead_of_hanging() {
    if !fuse_oracles() {
        return;
    }
    let Some(options) = transport(true) else { return };
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("img");
    mkfs(&image, "128M");
    let mnt = work.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    run(uext4().env("UEXT4_TEST_RING_FAIL_AFTER", "100").arg("mount").args(["-o", options]).arg(&image).arg(&mnt));
    let dir = mnt.clone();
    // Requests go to the queue of the caller's CPU: stay on CPU 0, whose queue fails.
    let caller = std::thread::spawn(move || {
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
        for i in 0..10_000 {
            if let Err(e) = fs::write(dir.join(format!("f{i}")), "data") {
                return e;
            }
        }
        panic!("10,000 files written: the injected failure never came");
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while !caller.is_finished() {
        assert!(Instant::now() < deadline, "the caller hangs after its queue failed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let err = caller.join().unwrap();
    assert!(
        matches!(err.raw_os_error(), Some(libc::ECONNABORTED) | Some(libc::ENOTCONN)),
        "the caller sees the session end: {err}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while fs::read_to_string("/proc/self/mounts").unwrap().contains(&*mnt.to_string_lossy()) {
        assert!(Instant::now() < deadline, "the aborted mount stays");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The daemon lets go of the image (its lock) once it has written everything back.
    let file = File::open(&image).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        assert!(Instant::now() < deadline, "the daemon never finished");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_e2fsck_clean(&image);
}

/// Issue 12 item 6 and issue 13 through the mount: every name the kernel has
/// looked up pins its inode, so an unlinked or renamed-over file lives on as an
/// orphan until the kernel forgets it. Files unlinked or renamed over (closed,
/// and one held open), the directory fsync'd, then the daemon killed (with and
/// without an orphan file): after
/// uext4's recovery and, on a copy, after the kernel's, e2fsck -fn is silent and
/// the fsync'd file survives.
#[test]
fn unlink_and_rename_over_then_directory_fsync_then_kill() {
    if !fuse_oracles() || !is_root() {
        return;
    }
    // Rounds 2 and 3 on an image with an orphan file, where the orphans go.
    for round in 0..4 {
        let work = tempfile::tempdir().unwrap();
        let image = work.path().join("img");
        if round < 2 {
            mkfs(&image, "64M");
        } else {
            run(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096", "-O", "orphan_file"]).arg(&image).arg("64M"));
        }
        let mnt = work.path().join("mnt");
        fs::create_dir(&mnt).unwrap();
        let mut daemon = uext4()
            .arg("mount")
            .arg("--foreground")
            .arg(&image)
            .arg(&mnt)
            .args(["-o", "io_uring=off"])
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !fs::read_to_string("/proc/self/mounts").unwrap().contains(&*mnt.to_string_lossy()) {
            assert!(Instant::now() < deadline, "the foreground mount never came up");
            std::thread::sleep(Duration::from_millis(20));
        }
        for name in ["keep", "a", "b", "c", "held"] {
            let mut f = File::create(mnt.join(name)).unwrap();
            std::io::Write::write_all(&mut f, &vec![name.as_bytes()[0]; 300_000]).unwrap();
            f.sync_all().unwrap();
        }
        File::open(&mnt).unwrap().sync_all().unwrap();
        let held = File::open(mnt.join("held")).unwrap();
        fs::remove_file(mnt.join("a")).unwrap();
        fs::rename(mnt.join("b"), mnt.join("c")).unwrap();
        fs::remove_file(mnt.join("held")).unwrap();
        File::open(&mnt).unwrap().sync_all().unwrap();
        unsafe { libc::kill(daemon.id() as i32, libc::SIGKILL) };
        daemon.wait().unwrap();
        drop(held);
        let _ = Command::new("umount").arg("-l").arg(&mnt).status();

        let ours = work.path().join("ours.img");
        fs::copy(&image, &ours).unwrap();
        let theirs = work.path().join("theirs.img");
        fs::copy(&image, &theirs).unwrap();
        // uext4's recovery: any writable open replays the journal and frees orphans.
        run(uext4().arg("mkdir").arg(format!("{}:/after", ours.display())));
        assert_e2fsck_clean(&ours);
        let kept = run(uext4().arg("cat").arg(format!("{}:/keep", ours.display())));
        assert_eq!(kept.len(), 300_000, "round {round}: /keep after uext4's recovery");
        // The kernel's recovery.
        {
            let m = KernelMount::new(&theirs, "");
            assert_eq!(fs::read(m.dir.join("keep")).unwrap(), vec![b'k'; 300_000], "round {round}");
            assert_eq!(fs::read(m.dir.join("c")).unwrap(), vec![b'b'; 300_000], "round {round}");
            assert!(!m.dir.join("a").exists() && !m.dir.join("b").exists() && !m.dir.join("held").exists());
        }
        assert_e2fsck_clean(&theirs);
    }
}

#[test]
fn creates_go_on_while_fsyncs_wait_for_a_flush() {
    creates_beside_waiting_fsyncs(false);
}

#[test]
fn creates_go_on_while_fsyncs_wait_for_a_flush_over_io_uring() {
    creates_beside_waiting_fsyncs(true);
}

/// Four processes' fsyncs wait in the daemon, their commit's device flush held
/// shut (the daemon's `UEXT4_TEST_FLUSH_GATE` hook: flushes wait while the gate
/// file exists); meanwhile creates, writes and stats in another directory must
/// all be answered. Before fsyncs were served off the transports' threads, four
/// of them held every /dev/fuse worker (or a CPU's io_uring queue) and the
/// creates waited with them.
fn creates_beside_waiting_fsyncs(uring: bool) {
    if !fuse_oracles() {
        return;
    }
    let Some(options) = transport(uring) else { return };
    // Two fsyncers on every CPU: over io_uring each CPU has its own queue,
    // and every queue must have fsyncs waiting in it.
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let fsyncers = 2 * cpus;
    const CREATES: usize = 300;
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("gate.img");
    mkfs(&image, "256M");
    let gate = work.path().join("gate");
    let m = UextMount::with_env(&image, options, &[("UEXT4_TEST_FLUSH_GATE", gate.as_os_str())]);
    for t in 0..fsyncers {
        fs::create_dir(m.dir.join(format!("sync{t}"))).unwrap();
    }
    fs::create_dir(m.dir.join("creates")).unwrap();
    fs::write(&gate, b"").unwrap();
    let fsyncing: Vec<_> = (0..fsyncers)
        .map(|t| {
            let path = m.dir.join(format!("sync{t}/file"));
            std::thread::spawn(move || {
                pin_to_cpu(t % cpus);
                let f = File::create(&path).unwrap();
                f.write_all_at(&[t as u8 + 1; 4096], 0).unwrap();
                f.sync_all().unwrap();
            })
        })
        .collect();
    // Give the fsyncs time to reach the daemon (a settle, not a measurement:
    // if they arrive later, they hold the transports all the same).
    std::thread::sleep(Duration::from_millis(500));
    let dir = m.dir.join("creates");
    let creator = std::thread::spawn(move || {
        for i in 0..CREATES {
            let p = dir.join(format!("f{i:04}"));
            fs::write(&p, i.to_le_bytes()).unwrap();
            assert_eq!(fs::metadata(&p).unwrap().len(), 8);
        }
    });
    // A hang detector, minutes beyond what the creates need.
    let start = Instant::now();
    while !creator.is_finished() && start.elapsed() < Duration::from_secs(300) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let stalled = !creator.is_finished();
    let fsync_returned = fsyncing.iter().any(|f| f.is_finished());
    // Open the gate before judging, so a failure still unmounts cleanly.
    fs::remove_file(&gate).unwrap();
    for f in fsyncing {
        f.join().unwrap();
    }
    creator.join().unwrap();
    assert!(!stalled, "creates stalled behind fsyncs waiting for a flush");
    assert!(!fsync_returned, "an fsync returned while its commit's flush was held");
    assert_transport(&m.dir, uring, CREATES as u64);
    m.unmount();
    assert_e2fsck_clean(&image);
    let listing = run(Command::new("debugfs").args(["-R", "ls -l /creates"]).arg(&image));
    assert_eq!(listing.lines().filter(|l| l.contains(" f0")).count(), CREATES, "{listing}");
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, applied to this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// `uext4 rm -r MOUNTPOINT/path` asks the mount's daemon to run remove_tree:
/// the tree goes (its names cached by the kernel too, which the daemon tells
/// it to drop), a file outside linked from inside keeps its content with one
/// link less, the mount's root and '.' are refused, and e2fsck is silent
/// after the unmount.
#[test]
fn rm_r_inside_a_mount_runs_remove_tree_in_the_daemon() {
    if !fuse_oracles() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    mkfs(&img, "64M");
    let m = UextMount::new(&img, "io_uring=off");
    let t = m.dir.join("t");
    fs::write(m.dir.join("outside"), b"kept").unwrap();
    fs::create_dir_all(t.join("many")).unwrap();
    for n in 0..3_000 {
        fs::write(t.join(format!("many/file-{n:05}")), b"").unwrap();
    }
    for d in 0..10 {
        fs::create_dir_all(t.join(format!("sub{d}/inner"))).unwrap();
        fs::write(t.join(format!("sub{d}/inner/data")), vec![d as u8; 10_000]).unwrap();
    }
    fs::hard_link(m.dir.join("outside"), t.join("link")).unwrap();
    // The kernel caches every name of the tree.
    for d in 0..10 {
        assert_eq!(fs::read(t.join(format!("sub{d}/inner/data"))).unwrap().len(), 10_000);
    }
    assert_eq!(fs::read_dir(t.join("many")).unwrap().count(), 3_000);
    for refused in [m.dir.clone(), t.join("."), t.join("..")] {
        let out = uext4().args(["rm", "-r"]).arg(&refused).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "rm -r {} was not refused", refused.display());
    }
    let out = uext4().arg("rm").arg(&t).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "rm of a directory without -r");
    run(uext4().args(["rm", "-r"]).arg(&t));
    // Gone at once when the daemon's notification has arrived, at the latest
    // when the kernel's 1 s of trust in the names runs out.
    let deadline = Instant::now() + Duration::from_secs(20);
    while t.join("sub3/inner/data").exists() || t.exists() {
        assert!(Instant::now() < deadline, "the removed tree is still visible through the mount");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(fs::read(m.dir.join("outside")).unwrap(), b"kept");
    // Its attributes dropped by the daemon too (or, at the latest, once the
    // kernel's 1 s of trust runs out).
    while fs::metadata(m.dir.join("outside")).unwrap().nlink() != 1 {
        assert!(Instant::now() < deadline, "outside keeps its link from the removed tree");
        std::thread::sleep(Duration::from_millis(20));
    }
    run(uext4().args(["rm", "-r", "-f"]).arg(&t));
    // Plain rm -rf through the mount keeps working.
    fs::create_dir_all(m.dir.join("u/v")).unwrap();
    run(Command::new("rm").arg("-rf").arg(m.dir.join("u")));
    m.unmount();
    assert_e2fsck_clean(&img);
}

/// Reads through /dev/fuse are spliced from the image (`splice_read`, on by
/// default): every kind of byte a read can return — a file's data at odd
/// offsets and lengths, holes, preallocated (unwritten) space, the tail of an
/// inline file, the end of file — must be what the kernel's ext4 reads from
/// the same image, spliced or copied, and the session must say which it did.
#[test]
fn spliced_reads_return_what_the_kernel_reads() {
    if !fuse_oracles() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("img");
    run(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096", "-O", "inline_data"]).arg(&image).arg("64M"));
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    };
    let names = ["big", "sparse", "prealloc", "inline", "ragged"];
    {
        let k = KernelMount::new(&image, "");
        fs::write(k.dir.join("big"), noise(3 << 20)).unwrap();
        let sparse = File::create(k.dir.join("sparse")).unwrap();
        sparse.write_all_at(&noise(5000), 4096 * 3 + 100).unwrap();
        sparse.write_all_at(&noise(70_000), 1 << 20).unwrap();
        sparse.set_len((2 << 20) + 123).unwrap();
        let prealloc = File::create(k.dir.join("prealloc")).unwrap();
        // SAFETY: fallocate on a descriptor we hold; the result is checked.
        let r = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&prealloc), 0, 0, 1 << 20) };
        assert_eq!(r, 0, "fallocate: {}", std::io::Error::last_os_error());
        prealloc.write_all_at(&noise(9000), 300_000).unwrap();
        fs::write(k.dir.join("inline"), noise(45)).unwrap();
        fs::write(k.dir.join("ragged"), noise(3 * 4096 + 7)).unwrap();
    }
    let expected: Vec<Vec<u8>> = {
        let k = KernelMount::new(&image, "ro");
        names.iter().map(|n| fs::read(k.dir.join(n)).unwrap()).collect()
    };
    assert_e2fsck_clean(&image);
    for splice in ["on", "off"] {
        let m = UextMount::new(&image, &format!("io_uring=off,splice_read={splice}"));
        for (name, want) in names.iter().zip(&expected) {
            let path = m.dir.join(name);
            assert!(fs::read(&path).unwrap() == *want, "splice_read={splice}: {name} read whole");
            // O_DIRECT sends the reader's own offsets and lengths to the daemon.
            let direct = OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&path).unwrap();
            let size = want.len() as u64;
            for (at, len) in [(0, 1), (1, 4095), (4095, 2), (12_345, 100_000), (size.saturating_sub(3), 10), (size, 5)]
            {
                let mut buf = vec![0xa5u8; len];
                let n = direct.read_at(&mut buf, at).unwrap();
                let expect = &want[(at as usize).min(want.len())..((at as usize) + len).min(want.len())];
                assert_eq!(n, expect.len(), "splice_read={splice}: {name}: {len} bytes at {at}");
                assert!(buf[..n] == *expect, "splice_read={splice}: {name}: {len} bytes at {at} differ");
            }
        }
        let (spliced, copied) = reads_by_kind(&m.dir);
        match splice {
            "on" => assert!(spliced >= 20 && copied == 0, "splice_read=on: {spliced} reads spliced, {copied} copied"),
            _ => assert!(spliced == 0 && copied >= 20, "splice_read=off: {spliced} spliced, {copied} copied"),
        }
        m.unmount();
    }
    assert_e2fsck_clean(&image);
}

/// One shell script, run in the kernel's ext4 and in uext4's mount of copies
/// of one image, must print the same: immutable and append-only files and
/// directories (set with chattr through the kernel before the copy) refuse
/// what the kernel refuses; a chmod brings an access ACL along (so a named
/// user loses what the mode takes away); a symlink in a setgid directory takes
/// its group; trusted.* names are not listed to an unprivileged user;
/// chown(f, -1, -1) drops setuid and setgid; a removed working directory still
/// opens; a default ACL is inherited (in place of the umask) by files, fifos
/// and directories, and the umask applies without one; chattr and lsattr work
/// through the mount (FS_IOC_GETFLAGS, FS_IOC_FSGETXATTR, FS_IOC_SETFLAGS).
/// e2fsck -fn silent on both images afterwards.
#[test]
fn flags_acls_and_ownership_rules_match_the_kernels_ext4() {
    if !fuse_oracles() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (kimg, uimg) = (work.path().join("k.img"), work.path().join("u.img"));
    mkfs(&kimg, "64M");
    {
        let k = KernelMount::new(&kimg, "");
        let setup = "echo a > imm; echo a > app; mkdir imm_d app_d; echo f > imm_d/f; echo f > app_d/f; \
                     chattr +i imm imm_d; chattr +a app app_d";
        run(Command::new("sh").arg("-c").arg(setup).current_dir(&k.dir));
    }
    fs::copy(&kimg, &uimg).unwrap();
    let script = r#"
        t() { name=$1; shift; if "$@" >/dev/null 2>&1; then echo "$name: ok"; else echo "$name: refused"; fi; }
        nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
        t write_imm sh -c 'echo x > imm'
        t append_imm sh -c 'echo x >> imm'
        t truncate_imm truncate -s 0 imm
        t rm_imm rm -f imm
        t mv_imm mv imm imm2
        t ln_imm ln imm imm_link
        t chmod_imm chmod 600 imm
        t chown_imm chown 1 imm
        t touch_imm touch imm
        t touch_at_imm touch -d @1000000 imm
        t setfattr_imm setfattr -n user.a -v 1 imm
        t create_in_imm_d touch imm_d/new
        t rm_in_imm_d rm -f imm_d/f
        t mv_into_imm_d mv app_d/f imm_d/g
        t append_app sh -c 'echo x >> app'
        t overwrite_app sh -c 'echo x > app'
        t write_into_app dd if=/dev/zero of=app bs=1 count=1 conv=notrunc status=none
        t truncate_app truncate -s 0 app
        t rm_app rm -f app
        t mv_app mv app app2
        t ln_app ln app app_link
        t chmod_app chmod 600 app
        t touch_app touch app
        t touch_at_app touch -d @1000000 app
        t setfattr_app setfattr -n user.a -v 1 app
        t create_in_app_d touch app_d/new
        t rm_in_app_d rm -f app_d/f
        t read_both cat imm app
        echo "sizes: $(stat -c %s imm app | tr '\n' ' ')"
        echo c > ca; t chattr_i chattr +i ca; echo "lsattr: $(lsattr ca)"; t write_ca sh -c 'echo x > ca'
        t chattr_minus_i chattr -i ca; t write_ca_again sh -c 'echo x > ca'; t nobody_chattr nobody chattr +a ca
        mkdir cd; t chattr_a_dir chattr +a cd; echo "lsattr: $(lsattr -d cd)"; t create_in_cd touch cd/n; t rm_in_cd rm cd/n
        t chattr_minus_a_dir chattr -a cd
        echo data > acl; chmod 644 acl; setfacl -m u:1000:rw acl; chmod 640 acl
        echo "acl: $(getfacl -cp acl | tr '\n' ' ')"
        t nobody_reads_acl nobody cat acl
        mkdir sg; chgrp 1234 sg; chmod 2775 sg; ln -s x sg/s; mkdir sg/d; touch sg/f
        echo "setgid groups: $(stat -c %g sg/s sg/d sg/f | tr '\n' ' ')"
        touch tr; setfattr -n trusted.t -v 1 tr; setfattr -n user.u -v 1 tr; chmod 666 tr
        echo "listed to nobody: $(nobody getfattr --absolute-names -m - tr 2>/dev/null | grep -v '^#' | tr '\n' ' ')"
        touch su; chmod 6755 su; python3 -c 'import os; os.chown("su", -1, -1)'
        echo "after chown -1 -1: $(stat -c %a su)"
        mkdir gone; (cd gone && rmdir ../gone && ls . > /dev/null 2>&1; echo "ls in a removed directory: $?")
        mkdir dacl; chmod 750 dacl; setfacl -d -m u:1000:rx,o::- dacl
        (umask 077; touch dacl/f; mkdir dacl/sub; mknod dacl/p p)
        echo "inherited: $(stat -c %a dacl/f dacl/sub dacl/p | tr '\n' ' ')"
        echo "inherited: $(getfacl -cp dacl/f dacl/sub dacl/p 2>/dev/null | tr '\n' ' ')"
        (umask 027; touch um; mkdir umd; mknod ump p)
        echo "umask 027: $(stat -c %a um umd ump | tr '\n' ' ')"
    "#;
    let run_in = |root: &Path| {
        let out = Command::new("sh").arg("-c").arg(script).current_dir(root).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let kernel = {
        let k = KernelMount::new(&kimg, "");
        run_in(&k.dir)
    };
    let m = UextMount::new(&uimg, "allow_other");
    let mounted = run_in(&m.dir);
    m.unmount();
    let differ: Vec<String> = kernel
        .lines()
        .zip(mounted.lines())
        .filter(|(k, u)| k != u)
        .map(|(k, u)| format!("kernel: {k}\n uext4: {u}"))
        .collect();
    assert!(
        differ.is_empty() && kernel.lines().count() == mounted.lines().count(),
        "uext4's mount differs from the kernel's ext4:\n{}\n(kernel's whole output:\n{kernel})",
        differ.join("\n")
    );
    assert!(kernel.contains("write_imm: refused") && kernel.contains("append_app: ok"), "{kernel}");
    assert_e2fsck_clean(&kimg);
    assert_e2fsck_clean(&uimg);
    // The CLI, and remove_tree under `rm -r`, refuse the same (EPERM, exit 1),
    // and what they refused is still there.
    let target = |path: &str| format!("{}:{path}", uimg.display());
    for args in [vec!["rm", "-r"], vec!["rm"]] {
        let path = if args.len() == 2 { "/imm_d" } else { "/app" };
        let out = uext4().args(&args).arg(target(path)).output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.code() == Some(1) && said.contains("ermitted"), "uext4 {args:?} {path}: {out:?}");
    }
    let listed = run(Command::new("debugfs").args(["-R", "ls -l /imm_d"]).arg(&uimg));
    assert!(listed.contains(" f\n") || listed.lines().any(|l| l.ends_with(" f")), "{listed}");
    assert_e2fsck_clean(&uimg);
}
