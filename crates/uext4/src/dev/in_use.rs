//! Who else is using an image: another uext4 process (its lock), or the kernel
//! (a mount of the device itself, or of a loop device backed by the file), as
//! e2fsprogs' `ext2fs_check_if_mounted` asks before it writes.
//!
//! Invariants: a writable open holds an exclusive lock on the bytes its
//! filesystem lies in (an OFD byte-range lock, `fcntl(F_OFD_SETLK)`: the whole
//! image, or one partition's or offset's range, so two partitions of one disk
//! image are two images) for its whole life, and refuses, before any write, a
//! range someone else holds any of; closing the file releases the lock (never
//! an explicit unlock, so a copy of the descriptor in a forked child keeps it).
//! A mount open read-only holds a read lock instead (a read-only descriptor
//! cannot hold a write lock), which keeps writers out, and refuses a range
//! anyone else holds any lock on, so it too is its range's only user. Both also
//! hold a shared flock on the whole file, which conflicts with no other uext4
//! process: `flock -n IMAGE true` (an exclusive flock) succeeds only once no
//! uext4 process has any part of the image, as scripts wait for a mount's
//! daemon to finish; a tool holding an exclusive flock keeps uext4 out. The
//! probes see any OFD or POSIX lock on the range, uext4's or another program's
//! (QEMU locks bytes of the images it runs).
//! A read-only open holds nothing — a reader neither changes the image nor
//! stops a writer, as with debugfs — and only notes who else held its range, so
//! its caller can warn that what it reads may be stale. A kernel mount through
//! a loop device counts only where the loop device's bytes (its offset and
//! size limit, and a partition's place on it) meet the range.
//!
//! Files are compared by device and inode number, never by path alone: the same
//! image is often named through symlinks, bind mounts or relative paths. A loop
//! device and the file it reads from are one image too: the lock of each other
//! name (the backing file of a loop device, the loop devices over a file) is
//! probed as well, over the whole of that name.

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

/// The bytes of an image a filesystem lies in: `len` bytes from `start`, or
/// with `len` 0 from `start` to the end and past it (the whole image, however
/// it grows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRange {
    pub start: u64,
    pub len: u64,
}

impl ByteRange {
    pub const WHOLE: ByteRange = ByteRange { start: 0, len: 0 };

    fn end(self) -> Option<u64> {
        (self.len != 0).then(|| self.start.saturating_add(self.len))
    }

    /// Whether the `len` bytes at `offset` lie wholly inside the range.
    pub fn holds(self, offset: u64, len: u64) -> bool {
        offset >= self.start && self.end().is_none_or(|end| offset.checked_add(len).is_some_and(|e| e <= end))
    }

    fn overlaps(self, other: ByteRange) -> bool {
        let wholly_before = |a: ByteRange, b: ByteRange| a.end().is_some_and(|end| end <= b.start);
        !wholly_before(self, other) && !wholly_before(other, self)
    }
}

fn sysfs_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn backing_file_of(sysfs: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(sysfs.join("loop/backing_file")).ok()?;
    let text = text.trim_end_matches('\n');
    Some(PathBuf::from(text.strip_suffix(" (deleted)").unwrap_or(text)))
}

/// The file under the loop device (or partition of one) whose sysfs directory
/// is `sysfs`, and the bytes of it the device shows: the loop device's offset
/// and size limit, a partition's place added. A figure sysfs does not give
/// makes it the whole file: a refusal may be too wide, never missed. None for
/// other devices.
fn loop_file_range(sysfs: &Path) -> Option<(PathBuf, ByteRange)> {
    // The loop device's bytes of its file; None when sysfs does not say.
    let of_loop = |dir: &Path| -> Option<(PathBuf, Option<ByteRange>)> {
        let backing = backing_file_of(dir)?;
        let shown = match (sysfs_u64(&dir.join("loop/offset")), sysfs_u64(&dir.join("loop/sizelimit"))) {
            (Some(start), Some(len)) => Some(ByteRange { start, len }),
            _ => None,
        };
        Some((backing, shown))
    };
    if !sysfs.join("partition").exists() {
        return of_loop(sysfs).map(|(backing, shown)| (backing, shown.unwrap_or(ByteRange::WHOLE)));
    }
    // A partition's node sits in its disk's sysfs directory; start and size in 512-byte sectors.
    let disk = sysfs.canonicalize().ok()?.parent()?.to_path_buf();
    let (backing, outer) = of_loop(&disk)?;
    let sectors = |name: &str| sysfs_u64(&sysfs.join(name)).and_then(|n| n.checked_mul(512));
    let shown = match (outer, sectors("start"), sectors("size")) {
        (Some(outer), Some(first), Some(len)) => ByteRange { start: outer.start.saturating_add(first), len },
        _ => ByteRange::WHOLE,
    };
    Some((backing, shown))
}

fn sysfs_of(rdev: u64) -> PathBuf {
    PathBuf::from(format!("/sys/dev/block/{}:{}", libc::major(rdev), libc::minor(rdev)))
}

/// The other names of `range` of the image whose metadata is `me`, through
/// loop devices, each with the range of that name to probe: for a loop device
/// (or a partition of one), its file, over the bytes the device shows; for a
/// file, every loop device and loop partition over it whose bytes meet
/// `range`, whole. A uext4 process holding the image by one name holds its
/// lock on that name only, so the others are probed too.
fn loop_aliases(me: &Metadata, range: ByteRange) -> Vec<(PathBuf, ByteRange)> {
    if me.file_type().is_block_device() {
        let Some((backing, shown)) = loop_file_range(&sysfs_of(me.rdev())) else { return Vec::new() };
        let start = shown.start.saturating_add(range.start);
        let len = match (range.len, shown.end()) {
            (0, None) => 0,
            (0, Some(end)) => end.saturating_sub(start).max(1),
            (len, _) => len,
        };
        return vec![(backing, ByteRange { start, len })];
    }
    if !me.is_file() {
        return Vec::new();
    }
    let Ok(devices) = std::fs::read_dir("/sys/block") else { return Vec::new() };
    let mut aliases = Vec::new();
    for device in devices.filter_map(|d| d.ok()) {
        let name = device.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        // The loop device, then its partitions (loopNpM, from losetup -P).
        let partitions =
            std::fs::read_dir(device.path()).into_iter().flatten().filter_map(|d| d.ok()).filter_map(|d| {
                let part = d.file_name().to_string_lossy().into_owned();
                part.starts_with(&format!("{name}p")).then_some((part, d.path()))
            });
        for (node, sysfs) in std::iter::once((name.clone(), device.path())).chain(partitions) {
            let Some((backing, shown)) = loop_file_range(&sysfs) else { continue };
            if shown.overlaps(range) && std::fs::metadata(&backing).is_ok_and(|b| same_file(&b, me)) {
                aliases.push((Path::new("/dev").join(node), ByteRange::WHOLE));
            }
        }
    }
    aliases
}

/// Whether a uext4 process holds any of `range` of `alias`, probed without
/// taking any lock.
fn alias_locked(alias: &Path, range: ByteRange) -> bool {
    let Ok(file) = File::open(alias) else { return false };
    lock_seen(&file, range).unwrap_or(false)
}

/// Who has the image whose metadata is `me` mounted over bytes of `range`:
/// (mounts to refuse for: "the kernel (ext4) at /mnt through /dev/loop3",
/// "fuse2fs at /mnt"; uext4's own mounts of the file, whose ranges their
/// locks tell).
fn mounted_by(me: &Metadata, range: ByteRange) -> (Vec<String>, Vec<String>) {
    let (mut found, mut uext4) = (Vec::new(), Vec::new());
    for m in mounts() {
        // Only absolute sources can name a file or device ("proc", "tmpfs" do not).
        if !m.source.is_absolute() {
            continue;
        }
        let Ok(source) = std::fs::metadata(&m.source) else { continue };
        let (at, kind) = (m.target.display(), &m.fstype);
        if source.file_type().is_block_device() {
            let through = if me.file_type().is_block_device() && source.rdev() == me.rdev() {
                Some(String::new())
            } else {
                loop_file_range(&sysfs_of(source.rdev()))
                    .filter(|(backing, shown)| {
                        shown.overlaps(range) && std::fs::metadata(backing).is_ok_and(|b| same_file(&b, me))
                    })
                    .map(|_| format!(" through {}", m.source.display()))
            };
            // uext4's own mounts of a device are told by their locks, as of a file.
            match (through, kind.as_str()) {
                (Some(through), "fuse.uext4") => uext4.push(format!("uext4 at {at}{through}")),
                (Some(through), _) => found.push(format!("the kernel ({kind}) at {at}{through}")),
                (None, _) => {}
            }
        } else if source.is_file() && same_file(&source, me) {
            // A FUSE server (uext4's own mount, fuse2fs) names its image as the source.
            match kind.strip_prefix("fuse.") {
                Some("uext4") => uext4.push(format!("uext4 at {at}")),
                Some(server) => found.push(format!("{server} at {at}")),
                None => found.push(format!("{kind} at {at}")),
            }
        }
    }
    (found, uext4)
}

/// Tries (10 ms apart) to take a lock whose holder shows no mount: a second at most.
const LOCK_RETRIES: u32 = 100;

/// An OFD lock request (`cmd` F_OFD_SETLK or F_OFD_GETLK) of `kind` over `range`.
fn ofd_lock(file: &File, cmd: libc::c_int, kind: libc::c_int, range: ByteRange) -> std::io::Result<libc::flock> {
    let too_far = || std::io::Error::new(std::io::ErrorKind::InvalidInput, "lock range past the largest file offset");
    // SAFETY: a plain C struct, for which all zeroes is valid (l_pid must be 0 for OFD locks).
    let mut request: libc::flock = unsafe { std::mem::zeroed() };
    request.l_type = kind as libc::c_short;
    request.l_whence = libc::SEEK_SET as libc::c_short;
    request.l_start = libc::off_t::try_from(range.start).map_err(|_| too_far())?;
    request.l_len = libc::off_t::try_from(range.len).map_err(|_| too_far())?;
    // SAFETY: fcntl on a descriptor we own, with a request that outlives the call.
    match unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut request) } {
        0 => Ok(request),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Takes the exclusive lock of `range` (and the shared flock of the file);
/// true (and the range not held) when someone else holds any of it. A file
/// open read-only (a read-only mount) cannot hold a write lock: it holds a read
/// lock, which keeps every writer out, and counts any other lock on the range
/// as taken, so it is the range's only user all the same.
fn lock_taken(file: &File, range: ByteRange, writable: bool) -> Result<bool> {
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => Ok(true),
            _ => Err(Error::Io(e)),
        };
    }
    let kind = if writable { libc::F_WRLCK } else { libc::F_RDLCK };
    match ofd_lock(file, libc::F_OFD_SETLK, kind, range) {
        Ok(_) if writable => Ok(false),
        Ok(_) => {
            let shared = lock_seen(file, range)?;
            if shared {
                // Let go at once: a read lock kept would hold writers out
                // (and the other reader) while this open gives up.
                ofd_lock(file, libc::F_OFD_SETLK, libc::F_UNLCK, range).map_err(Error::Io)?;
            }
            Ok(shared)
        }
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => Ok(true),
        Err(e) => Err(Error::Io(e)),
    }
}

/// Whether another open file holds a lock (read or write) on any of `range`;
/// takes nothing.
fn lock_seen(file: &File, range: ByteRange) -> Result<bool> {
    let found = ofd_lock(file, libc::F_OFD_GETLK, libc::F_WRLCK, range)?;
    Ok(found.l_type != libc::F_UNLCK as libc::c_short)
}

/// What a writable open must be refused for, or (read-only) warned about.
pub(crate) struct Users {
    /// Another process holds the uext4 lock on some of the range.
    pub locked: bool,
    /// Mounts over the range, the kernel's or another FUSE server's.
    pub mounts: Vec<String>,
    /// uext4's mounts of the file (of this range or another: the lock says).
    uext4_mounts: Vec<String>,
}

impl Users {
    pub fn any(&self) -> bool {
        self.locked || !self.mounts.is_empty()
    }

    /// "uext4 at /mnt", "another uext4 process", "the kernel (ext4) at /mnt through /dev/loop0", ...
    pub fn describe(&self) -> String {
        let mut who = Vec::new();
        // Which of the file's uext4 mounts holds these bytes the mount table
        // does not say (each serves its own region); one alone is the holder.
        if self.locked {
            if let [only] = self.uext4_mounts.as_slice() {
                who.push(only.clone());
            } else if self.uext4_mounts.is_empty() {
                who.push("another uext4 process".into());
            } else {
                who.push(format!("one of {}", self.uext4_mounts.join(", ")));
            }
        }
        who.extend(self.mounts.iter().cloned());
        who.join(", and ")
    }
}

/// Takes the lock of `range` of the image (`exclusive`: a write lock, or a
/// read lock held alone when `file` is not open for writing) or only looks
/// whether someone holds any of it, and lists the mounts over it.
pub(crate) fn examine(file: &File, range: ByteRange, exclusive: bool, writable: bool) -> Result<Users> {
    let me = file.metadata()?;
    // A process that forks while holding the image open (a test harness, a
    // shell) shares our lock with the child until the child execs and its
    // close-on-exec descriptors go: a holder with no mount to show for it may
    // be that, for a moment, so it gets a short while to let go.
    let held = || match exclusive {
        true => lock_taken(file, range, writable),
        false => lock_seen(file, range),
    };
    let mut locked = held()?;
    let mut tries = 0;
    while locked && tries < LOCK_RETRIES && mounted_by(&me, range) == (Vec::new(), Vec::new()) {
        std::thread::sleep(std::time::Duration::from_millis(10));
        locked = held()?;
        tries += 1;
    }
    let locked = locked || loop_aliases(&me, range).iter().any(|(alias, part)| alias_locked(alias, *part));
    let (mounts, uext4_mounts) = mounted_by(&me, range);
    Ok(Users { locked, mounts, uext4_mounts })
}

/// Refuses (`Error::Busy`) an image whose `range` a uext4 process or the kernel
/// holds, without keeping any lock: for callers about to replace the file
/// (mkfs) or checking before a writable open.
pub(crate) fn check_range_unused(what: &str, file: &File, range: ByteRange) -> Result<()> {
    let users = examine(file, range, false, false)?;
    if users.any() {
        return Err(busy(what, &users, true));
    }
    Ok(())
}

/// Whether a lock is held on byte `at` of the image `file` by another open
/// file (a mount's daemon, until it has exited; any other program's lock too).
pub fn held_at(file: &File, at: u64) -> Result<bool> {
    lock_seen(file, ByteRange { start: at, len: 1 })
}

/// The refusal of `what` ("/tmp/disk.img", "partition 2 of /tmp/disk.img")
/// for an open that would write (`writing`) or a read-only mount, which must
/// be its bytes' only user: what it showed would change underneath it.
pub(crate) fn busy(what: &str, users: &Users, writing: bool) -> Error {
    let why = match writing {
        true => "writing to it now would corrupt it",
        false => {
            "a read-only mount of it now would show a filesystem changing underneath it \
                  (`uext4 ls`, `cat` and `info` read it with a warning)"
        }
    };
    Error::Busy(format!("{what} is held by {}; {why}", users.describe()))
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
        assert!(!examine(&first, ByteRange::WHOLE, true, false).unwrap().locked);
        let second = File::open(&dir).unwrap();
        assert!(examine(&second, ByteRange::WHOLE, true, false).unwrap().locked, "a second exclusive lock");
        let users = examine(&second, ByteRange::WHOLE, false, false).unwrap();
        assert!(users.locked && users.describe().contains("uext4"), "{}", users.describe());
        drop(first);
        assert!(!examine(&second, ByteRange::WHOLE, true, false).unwrap().locked, "closing the file released the lock");
        std::fs::remove_file(&dir).unwrap();
    }

    #[test]
    fn ranges_of_one_file_lock_apart_and_meet_where_they_overlap() {
        let path = std::env::temp_dir().join(format!("uext4-ranges-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let (first, second) = (ByteRange { start: 4096, len: 65536 }, ByteRange { start: 69632, len: 65536 });
        let open_rw = || std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let a = open_rw();
        assert!(!examine(&a, first, true, true).unwrap().locked);
        let b = open_rw();
        assert!(!examine(&b, second, true, true).unwrap().locked, "the next range is free");
        let c = open_rw();
        let overlapping = ByteRange { start: 65536, len: 8192 };
        assert!(examine(&c, overlapping, false, false).unwrap().locked, "a probe sees the range it meets");
        assert!(examine(&c, overlapping, true, true).unwrap().locked);
        assert!(examine(&c, ByteRange::WHOLE, true, true).unwrap().locked, "the whole file meets both");
        assert!(!examine(&c, ByteRange { start: 1 << 19, len: 0 }, true, true).unwrap().locked, "past both");
        assert!(held_at(&c, 4096).unwrap() && held_at(&c, 69632).unwrap() && !held_at(&c, 0).unwrap());
        drop((a, b));
        assert!(!held_at(&c, 4096).unwrap(), "closing released the lock");
        assert!(ByteRange::WHOLE.overlaps(first) && !first.overlaps(second) && first.overlaps(overlapping));
        assert!(first.holds(4096, 65536) && !first.holds(4095, 2) && !first.holds(65536, 8193));
        assert!(ByteRange::WHOLE.holds(u64::MAX - 1, 1) && !first.holds(u64::MAX, 1));
        std::fs::remove_file(&path).unwrap();
    }
}
