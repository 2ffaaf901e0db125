//! Who else is using an image: another uext4 process (its flock), or the kernel
//! (a mount of the device itself, or of a loop device backed by the file), as
//! e2fsprogs' `ext2fs_check_if_mounted` asks before it writes.
//!
//! Invariants: a writable open holds an exclusive flock (LOCK_EX) on its open
//! file for its whole life and refuses, before any write, an image someone else
//! holds; closing the file releases the lock (never an explicit unlock, so a
//! copy of the descriptor in a forked child keeps it). A read-only open holds
//! nothing — a reader neither changes the image nor stops a writer, as with
//! debugfs — and only notes who else held the image, so its caller can warn
//! that what it reads may be stale.
//!
//! Files are compared by device and inode number, never by path alone: the same
//! image is often named through symlinks, bind mounts or relative paths. A loop
//! device and the file it reads from are one image too: the lock of each other
//! name (the backing file of a loop device, the loop devices over a file) is
//! probed as well.

use crate::error::{Error, Result};
use std::fs::{File, Metadata};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// One line of /proc/self/mounts.
struct MountEntry {
    source: PathBuf,
    target: PathBuf,
    fstype: String,
}

/// /proc/self/mounts escapes space, tab, newline and backslash as \ooo.
fn unescape(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                let value = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(value as u8);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

fn mounts() -> Vec<MountEntry> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mounts") else { return Vec::new() };
    text.lines()
        .filter_map(|line| {
            let mut f = line.split(' ');
            let (source, target, fstype) = (f.next()?, f.next()?, f.next()?);
            Some(MountEntry { source: unescape(source), target: unescape(target), fstype: fstype.to_string() })
        })
        .collect()
}

fn same_file(a: &Metadata, b: &Metadata) -> bool {
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// The file a loop device reads from, as its sysfs entry names it.
fn loop_backing_file(rdev: u64) -> Option<PathBuf> {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let text = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/loop/backing_file")).ok()?;
    let text = text.trim_end_matches('\n');
    Some(PathBuf::from(text.strip_suffix(" (deleted)").unwrap_or(text)))
}

/// The other names of the image whose metadata is `me` through loop devices:
/// for a loop device, the file it reads from; for a file, the loop devices
/// reading from it. A uext4 process holding the image by one name holds its
/// lock on that name only, so the others are probed too.
fn loop_aliases(me: &Metadata) -> Vec<PathBuf> {
    if me.file_type().is_block_device() {
        return loop_backing_file(me.rdev()).into_iter().collect();
    }
    if !me.is_file() {
        return Vec::new();
    }
    let Ok(devices) = std::fs::read_dir("/sys/block") else { return Vec::new() };
    devices
        .filter_map(|d| d.ok())
        .filter(|d| d.file_name().to_string_lossy().starts_with("loop"))
        .filter_map(|d| {
            let text = std::fs::read_to_string(d.path().join("loop/backing_file")).ok()?;
            let backing = text.trim_end_matches('\n');
            std::fs::metadata(backing).ok().filter(|b| same_file(b, me))?;
            Some(Path::new("/dev").join(d.file_name()))
        })
        .collect()
}

/// Whether a uext4 process holds `alias` (its exclusive lock), probed
/// without keeping any lock.
fn alias_locked(alias: &Path) -> bool {
    let Ok(file) = File::open(alias) else { return false };
    match lock_taken(&file, libc::LOCK_SH) {
        Ok(false) => {
            // SAFETY: flock on a descriptor we own.
            unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
            false
        }
        Ok(true) => true,
        Err(_) => false,
    }
}

/// Who has the image whose metadata is `me` mounted: "the kernel (ext4) at
/// /mnt through /dev/loop3", "uext4 at /mnt", ... Empty when nobody.
fn mounted_by(me: &Metadata) -> Vec<String> {
    let mut found = Vec::new();
    for m in mounts() {
        // Only absolute sources can name a file or device ("proc", "tmpfs" do not).
        if !m.source.is_absolute() {
            continue;
        }
        let Ok(source) = std::fs::metadata(&m.source) else { continue };
        let (at, kind) = (m.target.display(), &m.fstype);
        if source.file_type().is_block_device() {
            if me.file_type().is_block_device() && source.rdev() == me.rdev() {
                found.push(format!("the kernel ({kind}) at {at}"));
            } else if let Some(backing) = loop_backing_file(source.rdev()) {
                if std::fs::metadata(&backing).is_ok_and(|b| same_file(&b, me)) {
                    found.push(format!("the kernel ({kind}) at {at} through {}", m.source.display()));
                }
            }
        } else if source.is_file() && same_file(&source, me) {
            // A FUSE server (uext4's own mount, fuse2fs) names its image as the source.
            match kind.strip_prefix("fuse.") {
                Some("uext4") => found.push(format!("uext4 at {at}")),
                Some(server) => found.push(format!("{server} at {at}")),
                None => found.push(format!("{kind} at {at}")),
            }
        }
    }
    found
}

/// The flock request failed because someone else holds a conflicting lock.
/// Tries (10 ms apart) to take a lock whose holder shows no mount: a second at most.
const LOCK_RETRIES: u32 = 100;

fn lock_taken(file: &File, how: i32) -> Result<bool> {
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) } == 0 {
        return Ok(false);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(true);
    }
    Err(Error::Io(e))
}

/// What a writable open must be refused for, or (read-only) warned about.
pub(crate) struct Users {
    /// Another process holds the uext4 lock.
    pub locked: bool,
    /// Mounts of the image, the kernel's or a FUSE server's.
    pub mounts: Vec<String>,
}

impl Users {
    pub fn any(&self) -> bool {
        self.locked || !self.mounts.is_empty()
    }

    /// "uext4 at /mnt", "another uext4 process", "the kernel (ext4) at /mnt through /dev/loop0", ...
    pub fn describe(&self) -> String {
        let mut who = self.mounts.clone();
        if self.locked && !who.iter().any(|w| w.starts_with("uext4 at")) {
            who.insert(0, "another uext4 process".into());
        }
        who.join(", and ")
    }
}

/// Takes the image's exclusive lock (`exclusive`) or only looks whether someone
/// holds it, and lists the mounts of the image.
pub(crate) fn examine(file: &File, exclusive: bool) -> Result<Users> {
    let me = file.metadata()?;
    // A process that forks while holding the image open (a test harness, a
    // shell) shares our lock with the child until the child execs and its
    // close-on-exec descriptors go: a holder with no mount to show for it may
    // be that, for a moment, so it gets a short while to let go.
    let taken_after_grace = |op: libc::c_int| -> Result<bool> {
        let mut taken = lock_taken(file, op)?;
        let mut tries = 0;
        while taken && tries < LOCK_RETRIES && mounted_by(&me).is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(10));
            taken = lock_taken(file, op)?;
            tries += 1;
        }
        Ok(taken)
    };
    let locked = if exclusive {
        taken_after_grace(libc::LOCK_EX)?
    } else {
        let taken = taken_after_grace(libc::LOCK_SH)?;
        if !taken {
            // Only a probe: a reader must not keep a writer out.
            // SAFETY: flock on a descriptor we own.
            unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
        }
        taken
    };
    let locked = locked || loop_aliases(&me).iter().any(|alias| alias_locked(alias));
    Ok(Users { locked, mounts: mounted_by(&me) })
}

/// Refuses (`Error::Busy`) an image that a uext4 process or the kernel holds,
/// without keeping any lock: for callers about to replace the file (mkfs).
pub fn check_unused(path: &Path) -> Result<()> {
    let Ok(file) = File::open(path) else { return Ok(()) };
    let users = examine(&file, false)?;
    if users.any() {
        return Err(busy(path, &users));
    }
    Ok(())
}

pub(crate) fn busy(path: &Path, users: &Users) -> Error {
    Error::Busy(format!("{} is held by {}; writing to it now would corrupt it", path.display(), users.describe()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_table_fields_unescape() {
        assert_eq!(unescape(r"/tmp/a\040b"), PathBuf::from("/tmp/a b"));
        assert_eq!(unescape(r"/x\134y"), PathBuf::from("/x\\y"));
        assert_eq!(unescape(r"plain\04"), PathBuf::from(r"plain\04"));
    }

    #[test]
    fn a_second_exclusive_lock_is_refused_and_a_probe_sees_it() {
        let dir = std::env::temp_dir().join(format!("uext4-lock-{}", std::process::id()));
        std::fs::write(&dir, b"x").unwrap();
        let first = File::open(&dir).unwrap();
        assert!(!examine(&first, true).unwrap().locked);
        let second = File::open(&dir).unwrap();
        assert!(examine(&second, true).unwrap().locked, "a second exclusive lock");
        let users = examine(&second, false).unwrap();
        assert!(users.locked && users.describe().contains("uext4"), "{}", users.describe());
        drop(first);
        assert!(!examine(&second, true).unwrap().locked, "closing the file released the lock");
        std::fs::remove_file(&dir).unwrap();
    }
}
