//! Running the oracles (programs nobody in this project wrote): e2fsck, dumpe2fs,
//! debugfs, mkfs.ext4 and the kernel through loop mounts.
//!
//! A test that needs something missing here skips with a message, unless
//! UEXT4_REQUIRE_ORACLES=1, in which case the skip is a failure.
#![allow(dead_code)]

use sha2::{Digest, Sha256};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use uext4::{FileType, Filesystem, Stat};

pub fn oracles_required() -> bool {
    std::env::var("UEXT4_REQUIRE_ORACLES").map(|v| v == "1").unwrap_or(false)
}

/// Returns false (after saying why) when the test should skip.
pub fn skip_unless(available: bool, why: &str) -> bool {
    if available {
        return true;
    }
    if oracles_required() {
        panic!("UEXT4_REQUIRE_ORACLES=1 but {why}");
    }
    eprintln!("SKIPPED: {why}");
    false
}

pub fn have_tool(name: &str) -> bool {
    Command::new("sh").arg("-c").arg(format!("command -v {name}")).output().map(|o| o.status.success()).unwrap_or(false)
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// True when loop mounts can work here: root, and the loop driver answers.
pub fn can_loop_mount() -> bool {
    is_root() && Command::new("losetup").arg("-f").output().map(|o| o.status.success()).unwrap_or(false)
}

pub fn require_e2fsprogs() -> bool {
    skip_unless(have_tool("e2fsck") && have_tool("mkfs.ext4") && have_tool("debugfs"), "e2fsprogs is not installed")
}

pub fn require_loop() -> bool {
    skip_unless(can_loop_mount(), "loop mounts need root and a loop device")
}

/// Runs a command, panicking with its output if it fails.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?} failed ({}):\n{text}", out.status);
    text
}

/// `e2fsck -fn` must exit 0 and print nothing beyond its pass headers and summary.
pub fn assert_e2fsck_clean(image: &Path) {
    let out = Command::new("e2fsck").arg("-fn").arg(image).output().expect("run e2fsck");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let unexpected: Vec<&str> = text
        .lines()
        .filter(|l| {
            !l.starts_with("Pass ") && !l.starts_with("e2fsck ") && !l.contains(" files (") && !l.trim().is_empty()
        })
        .collect();
    assert!(
        out.status.success() && unexpected.is_empty(),
        "e2fsck -fn {} exit {}:\n{text}",
        image.display(),
        out.status
    );
}

/// The value of a `dumpe2fs -h` field.
pub fn dumpe2fs_field(image: &Path, field: &str) -> Option<String> {
    let out = run(Command::new("dumpe2fs").arg("-h").arg(image));
    out.lines().find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')).map(|v| v.trim().to_string()))
}

/// A loop mount that is undone when dropped, even if the test panics. An unmount
/// that fails (after a few tries while another test thread's fork holds a
/// descriptor for a moment) panics: a mount left behind would make a later check
/// judge a live filesystem, and blame the wrong thing.
pub struct Mount {
    pub dir: PathBuf,
    mounted: bool,
    _holder: tempfile::TempDir,
}

impl Mount {
    pub fn new(image: &Path, options: &str) -> Mount {
        let holder = tempfile::tempdir().unwrap();
        let dir = holder.path().join("mnt");
        std::fs::create_dir(&dir).unwrap();
        let opts = if options.is_empty() { "loop".to_string() } else { format!("loop,{options}") };
        run(Command::new("mount").arg("-o").arg(opts).arg(image).arg(&dir));
        Mount { dir, mounted: true, _holder: holder }
    }

    /// Takes over a mount made elsewhere at `dir` (one whose failure the caller
    /// handles itself), to be undone the same way.
    pub fn adopt(dir: PathBuf) -> Mount {
        Mount { dir, mounted: true, _holder: tempfile::tempdir().unwrap() }
    }

    /// Unmounts now, panicking if the kernel will not let go.
    pub fn unmount(mut self) {
        self.mounted = false;
        if let Err(e) = umount_retrying(&self.dir) {
            panic!("{e}");
        }
    }
}

fn umount_retrying(dir: &Path) -> Result<(), String> {
    let mut last = None;
    for _ in 0..100 {
        let out = Command::new("umount").arg(dir).output().expect("run umount");
        if out.status.success() {
            return Ok(());
        }
        last = Some(out);
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Err(format!("cannot unmount the kernel's mount at {}: {last:?}", dir.display()))
}

impl Drop for Mount {
    fn drop(&mut self) {
        if !self.mounted {
            return;
        }
        match umount_retrying(&self.dir) {
            Ok(()) => {}
            Err(e) if std::thread::panicking() => eprintln!("{e}"),
            Err(e) => panic!("{e}"),
        }
    }
}

/// Extended attributes of a host path as the kernel reports them (llistxattr and
/// lgetxattr, so a symlink's own), sorted by name.
pub fn host_xattrs(p: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 65536];
    // SAFETY: the buffer is valid for its length; c is NUL-terminated.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr() as *mut libc::c_char, names.len()) };
    assert!(n >= 0, "llistxattr {}: {}", p.display(), std::io::Error::last_os_error());
    let mut out = Vec::new();
    for name in names[..n as usize].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let cname = CString::new(name).unwrap();
        let mut value = vec![0u8; 65536];
        // SAFETY: as above.
        let len = unsafe {
            libc::lgetxattr(c.as_ptr(), cname.as_ptr(), value.as_mut_ptr() as *mut libc::c_void, value.len())
        };
        assert!(len >= 0, "lgetxattr {} {:?}: {}", p.display(), cname, std::io::Error::last_os_error());
        value.truncate(len as usize);
        out.push((name.to_vec(), value));
    }
    out.sort();
    out
}

/// SHA-256 of what uext4 reads for an inode: a regular file's contents, a
/// symlink's target, nothing for other kinds.
pub fn content_digest(fs: &Filesystem, st: &Stat) -> uext4::Result<Vec<u8>> {
    let data = match st.file_type {
        FileType::Regular => fs.read_all(st.ino)?,
        FileType::Symlink => fs.read_link(st.ino)?,
        _ => Vec::new(),
    };
    Ok(Sha256::digest(&data).to_vec())
}

/// The image shapes the kernel writes besides mkfs.ext4's defaults that uext4
/// writes too (issue 15): (name, mkfs program, its arguments, upgraded afterwards
/// with `tune2fs -O extent`). Images of 128 MiB or less get 1 KiB blocks, so
/// block-mapped files reach their triple indirect blocks at 64 MiB.
pub const WRITE_SHAPES: &[(&str, &str, &[&str], bool)] = &[
    ("-O ^extent", "mkfs.ext4", &["-O", "^extent,^64bit"], false),
    ("-O ^filetype", "mkfs.ext4", &["-O", "^filetype"], false),
    ("-O ^dir_index", "mkfs.ext4", &["-O", "^dir_index"], false),
    ("-O ^has_journal", "mkfs.ext4", &["-O", "^has_journal"], false),
    ("mkfs.ext3", "mkfs.ext3", &[], false),
    ("mkfs.ext2", "mkfs.ext2", &[], false),
    ("mkfs.ext2 -O ^filetype,^dir_index", "mkfs.ext2", &["-O", "^filetype,^dir_index"], false),
    ("mkfs.ext3, tune2fs -O extent", "mkfs.ext3", &[], true),
];

/// Makes `image` of `size` in a shape of `WRITE_SHAPES` (without its upgrade).
pub fn make_shape(image: &Path, program: &str, args: &[&str], size: &str) {
    run(Command::new(program).args(["-q", "-F"]).args(args).arg(image).arg(size));
}

/// `tune2fs -O extent`: the upgrade that leaves the files already there block-mapped.
pub fn upgrade_to_extents(image: &Path) {
    run(Command::new("tune2fs").args(["-O", "extent"]).arg(image));
}

/// Whether the image has the extent feature (dumpe2fs -h).
pub fn has_extent_feature(image: &Path) -> bool {
    dumpe2fs_field(image, "Filesystem features").is_some_and(|f| f.split_whitespace().any(|w| w == "extent"))
}
