//! Copying a real source tree into an image with `uext4 cp -r`, judged by e2fsck
//! and the kernel: the loop-mounted image must equal the tree (diff -r, plus
//! modes, owners, mtimes with nanoseconds, hard-link structure, xattrs); and
//! out of one, where the host copy must equal the kernel's view of the image.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

fn required() -> bool {
    std::env::var("UEXT4_REQUIRE_ORACLES").as_deref() == Ok("1")
}

fn skip(why: &str) -> bool {
    assert!(!required(), "UEXT4_REQUIRE_ORACLES=1 but {why}");
    eprintln!("SKIPPED: {why}");
    true
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?}: {text}");
    text
}

/// A loop mount undone when dropped; an unmount that fails fails the test
/// (unless it is failing already), so no later check judges a live mount.
struct Mount(std::path::PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        // Another test thread's fork may hold a descriptor into the mount for
        // a moment: a few tries before calling it a failure.
        let ok = (0..20).any(|_| {
            let done = Command::new("umount").arg(&self.0).status().is_ok_and(|s| s.success());
            if !done {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            done
        });
        if !ok && !std::thread::panicking() {
            panic!("umount {} failed", self.0.display());
        }
    }
}

/// e2fsck -fn finds nothing to say about `image` beyond its passes and summary
/// (`what` says which copy, when a test makes several).
fn assert_e2fsck_clean(image: &Path, what: &str) {
    let fsck = run(Command::new("e2fsck").arg("-fn").arg(image));
    assert!(
        fsck.lines()
            .all(|l| l.starts_with("Pass ") || l.starts_with("e2fsck ") || l.contains(" files (") || l.is_empty()),
        "{what}: {fsck}"
    );
}

/// Compares metadata of every path under `a` with the same path under `b`.
fn compare_metadata(a: &Path, b: &Path) -> usize {
    let mut stack = vec![std::path::PathBuf::new()];
    let mut inode_map: HashMap<u64, u64> = HashMap::new();
    let mut n = 0;
    while let Some(rel) = stack.pop() {
        let (pa, pb) = (a.join(&rel), b.join(&rel));
        let (ma, mb) = (std::fs::symlink_metadata(&pa).unwrap(), std::fs::symlink_metadata(&pb).unwrap());
        n += 1;
        assert_eq!(ma.file_type(), mb.file_type(), "{rel:?}");
        if !ma.file_type().is_symlink() {
            assert_eq!(ma.mode(), mb.mode(), "mode of {rel:?}");
        }
        assert_eq!((ma.uid(), ma.gid()), (mb.uid(), mb.gid()), "owner of {rel:?}");
        if !ma.is_dir() {
            assert_eq!((ma.mtime(), ma.mtime_nsec()), (mb.mtime(), mb.mtime_nsec()), "mtime of {rel:?}");
            assert_eq!(ma.nlink(), mb.nlink(), "links of {rel:?}");
            if let Some(prev) = inode_map.insert(ma.ino(), mb.ino()) {
                assert_eq!(prev, mb.ino(), "hard-link structure at {rel:?}");
            }
        }
        if ma.is_dir() {
            for e in std::fs::read_dir(&pa).unwrap() {
                stack.push(rel.join(e.unwrap().file_name()));
            }
        }
    }
    n
}

#[test]
fn a_real_tree_copied_in_equals_the_source() {
    if unsafe { libc::geteuid() } != 0 && skip("loop mounts need root") {
        return;
    }
    let source = Path::new("/usr/share");
    let count = walkdir_count(source);
    if count < 20_000 && skip("/usr/share has fewer than 20,000 entries here") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    let bin = env!("CARGO_BIN_EXE_uext4");
    run(Command::new(bin).args(["mkfs", "-q"]).arg(&image).args(["--size", "4G"]));
    // A hard-linked pair and xattrs, which /usr/share may lack.
    let extra = dir.path().join("extra");
    std::fs::create_dir(&extra).unwrap();
    std::fs::write(extra.join("one"), b"linked").unwrap();
    std::fs::hard_link(extra.join("one"), extra.join("two")).unwrap();
    let _ = Command::new("setfattr").args(["-n", "user.note", "-v", "kept"]).arg(extra.join("one")).status();
    run(Command::new(bin).args(["cp", "-r"]).arg(source).arg(&extra).arg(format!("{}:/", image.display())));
    assert_e2fsck_clean(&image, "");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    run(Command::new("mount").args(["-o", "ro,loop"]).arg(&image).arg(&mnt));
    let _guard = Mount(mnt.clone());
    let diff =
        Command::new("diff").args(["-r", "--no-dereference"]).arg(source).arg(mnt.join("share")).output().unwrap();
    assert!(
        diff.status.success(),
        "diff -r: {}",
        String::from_utf8_lossy(&diff.stdout).lines().take(10).collect::<Vec<_>>().join("\n")
    );
    let compared = compare_metadata(source, &mnt.join("share")) + compare_metadata(&extra, &mnt.join("extra"));
    assert!(compared >= 20_000, "only {compared} paths compared");
    let xattr = Command::new("getfattr").args(["-n", "user.note", "--only-values"]).arg(mnt.join("extra/one")).output();
    if let Ok(out) = xattr {
        if out.status.success() {
            assert_eq!(out.stdout, b"kept");
        }
    }
}

fn walkdir_count(p: &Path) -> usize {
    let mut n = 0;
    let mut stack = vec![p.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                n += 1;
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    stack.push(e.path());
                }
            }
        }
    }
    n
}

/// A sparse host file larger than the image's largest file (1 KiB blocks: 2^32 - 1
/// KiB) is refused with a message saying so and leaves no name behind; one just
/// under the limit copies in (its holes skipped, not read) and the kernel reads
/// its last bytes.
#[test]
fn a_sparse_file_past_the_largest_file_size_is_refused_whole() {
    if unsafe { libc::geteuid() } != 0 && skip("loop mounts need root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    run(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "1024"]).arg(&image).arg("64M"));
    let max = ((1u64 << 32) - 1) * 1024;
    let (big, near) = (dir.path().join("big"), dir.path().join("near"));
    for (path, size) in [(&big, 5u64 << 40), (&near, max)] {
        let f = std::fs::File::create(path).unwrap();
        f.set_len(size).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"the end", size - 7).unwrap();
    }
    let bin = env!("CARGO_BIN_EXE_uext4");
    let out = Command::new(bin).arg("cp").arg(&big).arg(format!("{}:/big", image.display())).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "cp of a 5 TiB file exited 0");
    assert!(err.contains("largest file"), "unclear message: {err}");
    run(Command::new(bin).arg("cp").arg(&near).arg(format!("{}:/near", image.display())));
    assert_e2fsck_clean(&image, "");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    run(Command::new("mount").args(["-o", "ro,loop"]).arg(&image).arg(&mnt));
    let _guard = Mount(mnt.clone());
    assert!(!mnt.join("big").exists(), "the refused copy left a name behind");
    let f = std::fs::File::open(mnt.join("near")).unwrap();
    assert_eq!(f.metadata().unwrap().len(), max);
    let mut tail = [0u8; 7];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut tail, max - 7).unwrap();
    assert_eq!(&tail, b"the end");
}

/// What a copy must carry over, per path, as the kernel's loop mount shows it:
/// type and mode, owner, size (not a directory's: its blocks follow the order
/// names were added), mtime in ns (directories too), link count, hard-link
/// partners, symlink target, device number, xattrs and a content digest.
fn kernel_view(root: &Path) -> Vec<String> {
    use sha2::Digest;
    let mut out = Vec::new();
    let mut partners: HashMap<u64, String> = HashMap::new();
    let mut stack = vec![std::path::PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let path = root.join(&rel);
        let m = std::fs::symlink_metadata(&path).unwrap();
        let detail = if m.file_type().is_symlink() {
            std::fs::read_link(&path).unwrap().display().to_string()
        } else if m.is_file() {
            format!("{:x}", sha2::Sha256::digest(std::fs::read(&path).unwrap()))
        } else {
            String::new()
        };
        let first = if m.nlink() > 1 && !m.is_dir() {
            partners.entry(m.ino()).or_insert_with(|| rel.display().to_string()).clone()
        } else {
            String::new()
        };
        let xattrs = Command::new("getfattr").args(["-h", "-d", "-m", "-", "--absolute-names"]).arg(&path).output();
        let xattrs = xattrs.map(|o| String::from_utf8_lossy(&o.stdout).lines().skip(1).collect::<Vec<_>>().join(";"));
        out.push(format!(
            "{} {:o} {}:{} {} {}.{:09} {} {} {} {first} {}",
            rel.display(),
            m.mode(),
            m.uid(),
            m.gid(),
            if m.is_dir() { 0 } else { m.size() },
            m.mtime(),
            m.mtime_nsec(),
            m.nlink(),
            m.rdev(),
            detail,
            xattrs.unwrap_or_default()
        ));
        if m.is_dir() {
            let mut names: Vec<_> = std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().file_name()).collect();
            names.sort();
            stack.extend(names.into_iter().map(|n| rel.join(n)));
        }
    }
    out.sort();
    out
}

/// `cp -r -j 4` leaves what `-j 1` leaves (inode numbers aside): a tree with an
/// indexed directory of 3,000 files, nested directories, hard links across
/// directories, symlinks, a fifo, a device node, a sparse file and xattrs, both
/// copies judged by e2fsck -fn and compared through the kernel's loop mount,
/// and each equal to the host tree by diff -r.
#[test]
fn copy_in_with_four_threads_equals_one_thread() {
    if unsafe { libc::geteuid() } != 0 && skip("loop mounts need root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("tree");
    let big = src.join("big");
    std::fs::create_dir_all(&big).unwrap();
    for i in 0..3_000 {
        std::fs::write(big.join(format!("file-{i:05}")), format!("content of file {i}\n").repeat(i % 7)).unwrap();
    }
    for d in 0..20 {
        let sub = src.join(format!("sub-{d:02}/deeper"));
        std::fs::create_dir_all(&sub).unwrap();
        for i in 0..30 {
            std::fs::write(sub.join(format!("f{i}")), vec![d as u8; 5_000 * (i % 3)]).unwrap();
        }
        std::os::unix::fs::symlink(format!("../sub-{d:02}/deeper/f1"), src.join(format!("sub-{d:02}/link"))).unwrap();
        std::fs::hard_link(big.join(format!("file-{:05}", d * 100)), src.join(format!("sub-{d:02}/hard"))).unwrap();
    }
    let sparse = std::fs::File::create(src.join("sparse")).unwrap();
    sparse.set_len(10 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&sparse, b"middle", 5 << 20).unwrap();
    run(Command::new("mkfifo").arg(src.join("fifo")));
    run(Command::new("mknod").arg(src.join("null")).args(["c", "1", "3"]));
    let _ = Command::new("setfattr").args(["-n", "user.note", "-v", "kept"]).arg(big.join("file-00042")).status();
    let _ = Command::new("setfattr").args(["-n", "user.dir", "-v", "also"]).arg(src.join("sub-03")).status();

    let bin = env!("CARGO_BIN_EXE_uext4");
    let mut views = Vec::new();
    for jobs in ["1", "4"] {
        let image = dir.path().join(format!("j{jobs}.img"));
        run(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096"]).arg(&image).arg("256M"));
        run(Command::new(bin).args(["cp", "-r", "-j", jobs]).arg(&src).arg(format!("{}:/", image.display())));
        assert_e2fsck_clean(&image, &format!("-j {jobs}"));
        let mnt = dir.path().join(format!("mnt{jobs}"));
        std::fs::create_dir(&mnt).unwrap();
        run(Command::new("mount").args(["-o", "ro,loop"]).arg(&image).arg(&mnt));
        let _guard = Mount(mnt.clone());
        // diff -r cannot compare special files; kernel_view does.
        let diff = Command::new("diff")
            .args(["-r", "--no-dereference", "--exclude=fifo", "--exclude=null"])
            .arg(&src)
            .arg(mnt.join("tree"))
            .output();
        let diff = diff.unwrap();
        assert!(diff.status.success(), "-j {jobs}: diff -r: {}", String::from_utf8_lossy(&diff.stdout));
        views.push(kernel_view(&mnt.join("tree")));
    }
    assert!(views[0].len() > 3_600, "{} paths", views[0].len());
    for (one, four) in views[0].iter().zip(&views[1]) {
        assert_eq!(one, four, "-j 1 and -j 4 differ");
    }
    assert_eq!(views[0].len(), views[1].len());
    assert!(views[0].iter().any(|l| l.contains("user.note=\"kept\"")), "the xattr was not seen");
}

/// A parallel copy into an image too small for the tree: the copier that meets
/// the full image stops the walk and the other copiers, the command fails
/// naming the cause (not a hang, not a panic), and what was copied before is a
/// consistent filesystem (e2fsck -fn). A missing source directory inside the
/// walk stops it the same way.
#[test]
fn a_parallel_copy_that_fills_the_image_stops_whole() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("tree");
    for d in 0..6 {
        let sub = src.join(format!("d{d}"));
        std::fs::create_dir_all(&sub).unwrap();
        for i in 0..150 {
            std::fs::write(sub.join(format!("f{i:03}")), vec![(i % 251) as u8 + 1; 40_000]).unwrap();
        }
    }
    let image = dir.path().join("small.img");
    run(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096"]).arg(&image).arg("16M"));
    let bin = env!("CARGO_BIN_EXE_uext4");
    let mut child = Command::new(bin)
        .args(["cp", "-r", "-j", "2"])
        .arg(&src)
        .arg(format!("{}:/", image.display()))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > std::time::Duration::from_secs(120) {
            let _ = child.kill();
            panic!("cp -r -j 2 into a full image did not end in 120 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "a 36 MB tree copied into a 16 MB image");
    assert!(err.contains("full") || err.contains("No space"), "unclear message: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_e2fsck_clean(&image, "");
}

/// Files whose size says nothing of their contents, as /proc and /sys have
/// them (0 bytes that hold text; 4096 bytes that hold a line), are read to
/// their end, as GNU cp reads them: the kernel's mount of the image shows the
/// bytes a read of the host file gives, no more, no fewer.
#[test]
fn pseudo_files_are_copied_to_their_end_not_their_stated_size() {
    if unsafe { libc::geteuid() } != 0 && skip("loop mounts need root") {
        return;
    }
    let sources: Vec<&Path> = [
        "/proc/version",
        "/proc/sys/kernel/ostype",
        "/sys/devices/system/cpu/online",
        "/sys/kernel/mm/transparent_hugepage/enabled",
    ]
    .iter()
    .map(Path::new)
    .filter(|p| p.exists())
    .collect();
    assert!(sources.len() >= 2, "neither /proc nor /sys is here");
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    run(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096"]).arg(&image).arg("32M"));
    let bin = env!("CARGO_BIN_EXE_uext4");
    for (k, src) in sources.iter().enumerate() {
        run(Command::new(bin).arg("cp").arg(src).arg(format!("{}:/f{k}", image.display())));
    }
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    run(Command::new("mount").args(["-o", "ro,loop"]).arg(&image).arg(&mnt));
    let guard = Mount(mnt.clone());
    for (k, src) in sources.iter().enumerate() {
        let host = std::fs::read(src).unwrap();
        assert!(!host.is_empty(), "{} reads empty", src.display());
        assert_eq!(std::fs::read(mnt.join(format!("f{k}"))).unwrap(), host, "{}", src.display());
    }
    drop(guard);
}

/// Without -r a symlink named on the command line is followed and a pipe or
/// device is read to its end into a regular file, as GNU cp does (`uext4 cp
/// /dev/stdin IMG:/x` stored a symlink to /proc/self/fd/0); with -r a symlink
/// stays one. Judged by the kernel's mount of the image beside GNU cp's copy.
#[test]
fn command_line_symlinks_and_pipes_are_followed_as_gnu_cp_follows_them() {
    if unsafe { libc::geteuid() } != 0 && skip("loop mounts need root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    run(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096"]).arg(&image).arg("32M"));
    let (file, link) = (dir.path().join("file"), dir.path().join("link"));
    std::fs::write(&file, b"the file's bytes\n".repeat(1000)).unwrap();
    std::os::unix::fs::symlink("file", &link).unwrap();
    let at = |name: &str| format!("{}:/{name}", image.display());
    let bin = env!("CARGO_BIN_EXE_uext4");
    let piped = b"through a pipe\n".repeat(100_000);
    let mut cp = Command::new(bin)
        .arg("cp")
        .arg("/dev/stdin")
        .arg(at("from-stdin"))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut cp.stdin.take().unwrap(), &piped).unwrap();
    assert!(cp.wait().unwrap().success());
    run(Command::new(bin).arg("cp").arg(&link).arg(at("followed")));
    run(Command::new(bin).arg("cp").arg("/dev/null").arg(at("null")));
    run(Command::new(bin).arg("cp").arg("-r").arg(&link).arg(at("kept")));
    assert_e2fsck_clean(&image, "");
    // GNU cp's own copies, for the file types.
    let gnu = dir.path().join("gnu");
    std::fs::create_dir(&gnu).unwrap();
    run(Command::new("cp").arg(&link).arg(gnu.join("followed")));
    run(Command::new("cp").arg("/dev/null").arg(gnu.join("null")));
    run(Command::new("cp").arg("-r").arg(&link).arg(gnu.join("kept")));
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    run(Command::new("mount").args(["-o", "ro,loop"]).arg(&image).arg(&mnt));
    let guard = Mount(mnt.clone());
    assert_eq!(std::fs::read(mnt.join("from-stdin")).unwrap(), piped);
    assert_eq!(std::fs::read(mnt.join("followed")).unwrap(), std::fs::read(&file).unwrap());
    for name in ["followed", "null", "kept"] {
        let (ours, theirs) = (std::fs::symlink_metadata(mnt.join(name)), std::fs::symlink_metadata(gnu.join(name)));
        assert_eq!(ours.unwrap().file_type(), theirs.unwrap().file_type(), "{name}");
    }
    assert!(std::fs::symlink_metadata(mnt.join("from-stdin")).unwrap().is_file());
    assert_eq!(std::fs::read_link(mnt.join("kept")).unwrap(), Path::new("file"));
    drop(guard);
}

/// `cp -r DIR/. IMG:/dest` copies what DIR holds into an existing dest, as GNU
/// cp does (not DIR under its own name); into a new dest, DIR itself as dest.
#[test]
fn a_source_ending_in_dot_copies_its_contents() {
    if unsafe { libc::geteuid() } != 0 && skip("loop mounts need root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("a"), b"one\n").unwrap();
    std::fs::write(src.join("sub/b"), b"two\n").unwrap();
    let image = dir.path().join("fs.img");
    run(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096"]).arg(&image).arg("32M"));
    let bin = env!("CARGO_BIN_EXE_uext4");
    let img = image.display().to_string();
    run(Command::new(bin).args(["mkdir", &format!("{img}:/dest")]));
    let dotted = format!("{}/.", src.display());
    run(Command::new(bin).args(["cp", "-r", &dotted, &format!("{img}:/dest")]));
    run(Command::new(bin).args(["cp", "-r", &dotted, &format!("{img}:/fresh")]));
    // A second copy into dest would overwrite: refused, as uext4's copy-in never overwrites.
    let again = Command::new(bin).args(["cp", "-r", &dotted, &format!("{img}:/dest")]).output().unwrap();
    assert!(!again.status.success());
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    run(Command::new("mount").args(["-o", "ro,loop"]).arg(&image).arg(&mnt));
    let guard = Mount(mnt.clone());
    for top in ["dest", "fresh"] {
        let mut names: Vec<String> = walkdir_names(&mnt.join(top));
        names.sort();
        assert_eq!(names, ["a", "sub", "sub/b"], "{top}");
        assert_eq!(std::fs::read(mnt.join(top).join("sub/b")).unwrap(), b"two\n");
    }
    drop(guard);
}

/// Paths under `root`, relative to it.
fn walkdir_names(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(root).unwrap().display().to_string());
            if p.is_dir() && !p.is_symlink() {
                stack.push(p);
            }
        }
    }
    out
}

/// An extended attribute the image cannot take (3,000 bytes with 1 KiB blocks)
/// is named on stderr and the copy goes on, and the exit status says so, as
/// GNU cp -a ends when it cannot preserve an attribute; it ended with 0.
#[test]
fn an_attribute_the_image_cannot_take_fails_the_copy() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("f"), b"data").unwrap();
    std::fs::write(src.join("g"), b"more").unwrap();
    let set = Command::new("setfattr").args(["-n", "user.big", "-v", &"B".repeat(3000)]).arg(src.join("f")).status();
    if !set.is_ok_and(|s| s.success()) {
        skip("the host directory takes no 3,000-byte user xattr");
        return;
    }
    let image = dir.path().join("fs.img");
    run(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "1024"]).arg(&image).arg("64M"));
    let out = Command::new(env!("CARGO_BIN_EXE_uext4"))
        .args(["cp", "-r"])
        .arg(&src)
        .arg(format!("{}:/s", image.display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("user.big") && stderr.contains("1 extended attribute"), "{stderr}");
    let cat = Command::new(env!("CARGO_BIN_EXE_uext4")).arg("cat").arg(format!("{}:/s/g", image.display())).output();
    assert_eq!(cat.unwrap().stdout, b"more", "the rest of the tree was copied");
    run(Command::new("e2fsck").arg("-fn").arg(&image));
}

/// Copy-out keeps extended attributes as GNU cp -a does: user.*, trusted.*,
/// security.* and POSIX ACLs (access and default) on files, directories and
/// symlinks, written by the kernel into the image, come out on the host as the
/// kernel's mount shows them (it copied none before), and a capability
/// survives the chown that restores the owner.
#[test]
fn copy_out_keeps_extended_attributes_and_acls() {
    if unsafe { libc::geteuid() } != 0 && skip("loop mounts need root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    run(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096"]).arg(&image).arg("64M"));
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    run(Command::new("mount").args(["-o", "loop"]).arg(&image).arg(&mnt));
    let kernel_side = {
        let guard = Mount(mnt.clone());
        let tree = mnt.join("tree");
        std::fs::create_dir_all(tree.join("sub")).unwrap();
        std::fs::write(tree.join("file"), b"data").unwrap();
        std::fs::write(tree.join("tool"), b"#!/bin/sh\n").unwrap();
        std::os::unix::fs::symlink("file", tree.join("link")).unwrap();
        run(Command::new("chown").args(["1234:5678"]).arg(tree.join("tool")));
        for (name, value, path) in [
            ("user.note", "kept", "file"),
            ("user.dir", "also", "sub"),
            ("trusted.secret", "root only", "file"),
            ("trusted.on_link", "a symlink's", "link"),
            ("security.test", "labelled", "sub"),
        ] {
            run(Command::new("setfattr").args(["-h", "-n", name, "-v", value]).arg(tree.join(path)));
        }
        run(Command::new("setcap").arg("cap_net_raw+ep").arg(tree.join("tool")));
        run(Command::new("setfacl").args(["-m", "u:1000:rw,g:100:r"]).arg(tree.join("file")));
        run(Command::new("setfacl").args(["-d", "-m", "u:1000:rwx"]).arg(tree.join("sub")));
        let view = kernel_view(&tree);
        drop(guard);
        view
    };
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let bin = env!("CARGO_BIN_EXE_uext4");
    run(Command::new(bin).args(["cp", "-r"]).arg(format!("{}:/tree", image.display())).arg(&out));
    let host_side = kernel_view(&out.join("tree"));
    assert_eq!(kernel_side, host_side, "the copy's attributes differ from what the kernel shows");
    for expected in ["user.note=\"kept\"", "trusted.on_link", "security.capability", "system.posix_acl_default"] {
        assert!(host_side.iter().any(|l| l.contains(expected)), "{expected} is missing: {host_side:#?}");
    }
}
