//! What the CLI tests share: running the oracles (e2fsck, the kernel's loop
//! mount) and uext4's own FUSE mount, and skipping with a message when the
//! machine lacks something (a failure under UEXT4_REQUIRE_ORACLES=1).
#![allow(dead_code)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

pub fn required() -> bool {
    std::env::var("UEXT4_REQUIRE_ORACLES").as_deref() == Ok("1")
}

/// Returns true (after saying why) when the test should skip.
pub fn skip(why: &str) -> bool {
    assert!(!required(), "UEXT4_REQUIRE_ORACLES=1 but {why}");
    eprintln!("SKIPPED: {why}");
    true
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs a command, panicking with its output if it fails.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?}: {text}");
    text
}

pub fn uext4() -> Command {
    Command::new(env!("CARGO_BIN_EXE_uext4"))
}

pub fn mkfs(image: &Path, size: &str) {
    run(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096"]).arg(image).arg(size));
}

/// `e2fsck -fn` exits 0 and says nothing beyond its pass headers and summary.
pub fn assert_e2fsck_clean(image: &Path) {
    let out = Command::new("e2fsck").arg("-fn").arg(image).output().expect("run e2fsck");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let noise: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("Pass ") && !l.starts_with("e2fsck ") && !l.contains(" files (") && !l.is_empty())
        .collect();
    assert!(out.status.success() && noise.is_empty(), "e2fsck -fn {}:\n{text}", image.display());
}

/// The kernel's ext4 on a loop device, unmounted on drop.
pub struct KernelMount {
    pub dir: PathBuf,
    _holder: tempfile::TempDir,
}

impl KernelMount {
    pub fn new(image: &Path, options: &str) -> KernelMount {
        let holder = tempfile::tempdir().unwrap();
        let dir = holder.path().join("mnt");
        std::fs::create_dir(&dir).unwrap();
        let opts = if options.is_empty() { "loop".to_string() } else { format!("loop,{options}") };
        run(Command::new("mount").args(["-t", "ext4", "-o", &opts]).arg(image).arg(&dir));
        KernelMount { dir, _holder: holder }
    }
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        // A child another test thread is starting holds copies of this thread's
        // descriptors until it execs: "busy" for a moment, so tries for up to
        // 10 s (a loaded machine stretches the moment past a second).
        let mut out = Command::new("umount").arg(&self.dir).output();
        for _ in 0..500 {
            if out.as_ref().is_ok_and(|o| o.status.success()) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            out = Command::new("umount").arg(&self.dir).output();
        }
        // A mount left behind would hide the real failure of a later test: say so.
        if !out.as_ref().is_ok_and(|o| o.status.success()) && !std::thread::panicking() {
            panic!("cannot unmount the kernel's mount at {}: {out:?}", self.dir.display());
        }
    }
}

/// Whether uext4 can FUSE-mount here (root and /dev/fuse); skips otherwise.
pub fn fuse_available() -> bool {
    if !Path::new("/dev/fuse").exists() {
        return !skip("/dev/fuse is missing");
    }
    if !is_root() {
        return !skip("the FUSE mount tests run as root (they also act as other users)");
    }
    true
}

/// A fresh image of `size` (mkfs.ext4 -b 4096) in a new temporary directory,
/// mounted by uext4 over io_uring or /dev/fuse (`transport`); None, after the
/// skip message, when the machine lacks the FUSE oracles or the transport. The
/// directory goes with the second half, which the caller keeps to the end.
pub fn fresh_mount(size: &str, uring: bool) -> Option<(UextMount, tempfile::TempDir)> {
    if !fuse_oracles() {
        return None;
    }
    let options = transport(uring)?;
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("img");
    mkfs(&image, size);
    Some((UextMount::new(&image, options), work))
}

/// `uext4 mount` of an image, unmounted (with `uext4 umount`) on drop.
pub struct UextMount {
    pub dir: PathBuf,
    pub image: PathBuf,
    mounted: bool,
    _holder: tempfile::TempDir,
}

impl UextMount {
    pub fn new(image: &Path, options: &str) -> UextMount {
        UextMount::with_env(image, options, &[])
    }

    /// As `new`, with environment variables for the daemon (its test hooks).
    pub fn with_env(image: &Path, options: &str, env: &[(&str, &std::ffi::OsStr)]) -> UextMount {
        let holder = tempfile::tempdir().unwrap();
        let dir = holder.path().join("mnt");
        std::fs::create_dir(&dir).unwrap();
        let mut cmd = uext4();
        cmd.envs(env.iter().copied());
        cmd.arg("mount").arg(image).arg(&dir);
        if !options.is_empty() {
            cmd.args(["-o", options]);
        }
        run(&mut cmd);
        // Others may reach the mount through this directory too (allow_other tests).
        std::fs::set_permissions(holder.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        UextMount { dir, image: image.to_path_buf(), mounted: true, _holder: holder }
    }

    /// Unmounts; returns once the daemon has written everything back.
    pub fn unmount(mut self) {
        self.mounted = false;
        run(uext4().arg("umount").arg(&self.dir));
    }
}

impl Drop for UextMount {
    fn drop(&mut self) {
        if !self.mounted {
            return;
        }
        let out = uext4().arg("umount").arg(&self.dir).output();
        if std::thread::panicking() {
            return;
        }
        match out {
            Ok(out) if out.status.success() => {}
            Ok(out) => panic!("uext4 umount {} failed: {}", self.dir.display(), String::from_utf8_lossy(&out.stderr)),
            Err(e) => panic!("cannot run uext4 umount: {e}"),
        }
    }
}

/// Every path under `root` with what a copy must preserve: type and mode,
/// owner, size, mtime (ns), link count, symlink target and content digest.
pub fn tree_listing(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let path = root.join(&rel);
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let detail = if meta.file_type().is_symlink() {
            std::fs::read_link(&path).unwrap().display().to_string()
        } else if meta.is_file() {
            use sha2::Digest;
            format!("{:x}", sha2::Sha256::digest(std::fs::read(&path).unwrap()))
        } else {
            String::new()
        };
        // A directory's size and mtime, and a new symlink's mtime, say when and
        // where it was made, not what it holds.
        let plain = !meta.is_dir() && !meta.file_type().is_symlink();
        let nlink = if meta.is_dir() { 0 } else { meta.nlink() };
        let size = if meta.is_dir() { 0 } else { meta.size() };
        let mtime = if plain { format!("{}.{:09}", meta.mtime(), meta.mtime_nsec()) } else { "-".into() };
        out.push(format!(
            "{} {:o} {}:{} {size} {mtime} {nlink} {detail}",
            rel.display(),
            meta.mode(),
            meta.uid(),
            meta.gid()
        ));
        if meta.is_dir() {
            for e in std::fs::read_dir(&path).unwrap() {
                stack.push(rel.join(e.unwrap().file_name()));
            }
        }
    }
    out.sort();
    out
}

/// e2fsprogs and a FUSE mount (root, /dev/fuse): what the mount tests need.
pub fn fuse_oracles() -> bool {
    let have = |t: &str| {
        Command::new("sh").arg("-c").arg(format!("command -v {t}")).output().is_ok_and(|o| o.status.success())
    };
    if !(have("mkfs.ext4") && have("e2fsck") && have("debugfs")) {
        return !skip("e2fsprogs is not installed");
    }
    fuse_available()
}

/// Mount options for one of the two ways requests travel: through /dev/fuse,
/// or through io_uring queues (Linux 6.14+; `io_uring=on` switches on the fuse
/// module's enable_uring). None: this kernel has no FUSE over io_uring.
pub fn transport(uring: bool) -> Option<&'static str> {
    if !uring {
        return Some("io_uring=off");
    }
    if !Path::new("/sys/module/fuse/parameters/enable_uring").exists() {
        skip("this kernel has no FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING)");
        return None;
    }
    Some("io_uring=on")
}

/// Checks, through `uext4 tune`'s session line, that more than `at_least`
/// requests came the way `uring` says: through the ring (more of them than
/// through /dev/fuse, which still carries FORGETs), or never through it.
/// `options` with the kernel's write-back cache asked for, or not.
pub fn with_writeback_cache(options: &str, on: bool) -> String {
    format!("{options},writeback_cache={}", if on { "on" } else { "off" })
}

/// The mount's session agreed to the kernel's write-back cache, or did not.
pub fn assert_writeback_cache(mount: &Path, on: bool) {
    let listed = run(uext4().arg("tune").arg(mount));
    let state = if on { "on" } else { "off" };
    assert!(listed.contains(&format!("# write-back cache: {state}\n")), "{listed}");
}

pub fn assert_transport(mount: &Path, uring: bool, at_least: u64) {
    let listed = run(uext4().arg("tune").arg(mount));

    let line = listed.lines().find(|l| l.starts_with("# requests so far")).unwrap_or_else(|| panic!("{listed}"));
    let numbers: Vec<u64> = line.split(' ').filter_map(|w| w.parse().ok()).collect();
    let (ring, device) = (numbers[0], numbers[1]);
    if uring {
        assert!(ring > at_least && ring > device, "io_uring=on, yet: {line}");
    } else {
        assert!(ring == 0 && device > at_least, "io_uring=off, yet: {line}");
    }
}

/// READs answered so far (`uext4 tune`'s session line): spliced from the
/// image, and copied.
pub fn reads_by_kind(mount: &Path) -> (u64, u64) {
    let listed = run(uext4().arg("tune").arg(mount));
    let line = listed.lines().find(|l| l.starts_with("# reads so far")).unwrap_or_else(|| panic!("{listed}"));
    let numbers: Vec<u64> = line.split(' ').filter_map(|w| w.parse().ok()).collect();
    (numbers[0], numbers[1])
}
