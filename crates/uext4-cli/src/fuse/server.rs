//! The filesystem behind a FUSE session: every request becomes a library call.
//!
//! Node ids are ext4 inode numbers, except that FUSE's root (1) is ext4's root
//! (2). Each lookup the kernel holds pins its inode as an open file does in the
//! library: an inode unlinked while the kernel still knows it (an open file
//! keeps it known) lives on, on the orphan list, until the kernel forgets it;
//! whatever the kernel still holds when the session ends is let go then. So
//! opens and closes need no message at all. Invariant: the kernel is given an
//! inode (an entry reply, a readdirplus entry) only after it is pinned; one
//! removed before it could be pinned is answered as gone. A directory's listing is taken whole at
//! opendir; readdir offsets index that snapshot, so they stay valid however the
//! directory changes meanwhile (POSIX leaves open whether entries added or
//! removed since opendir appear; readdirplus leaves out names removed or moved
//! away since, since the kernel makes a dentry of each entry it gives). Requests arrive on several threads at once;
//! the library's own locks order concurrent changes.
//!
//! Permissions are the kernel's to check (the mount has default_permissions).
//! The kernel leaves clearing setuid/setgid on write, truncate and chown to this
//! server (FUSE_HANDLE_KILLPRIV_V2), which saves it a getxattr of
//! security.capability before every write.
//!
//! A request that panics is contained (`serve`): its caller gets EIO, the
//! panic is logged with the opcode and node, and from then on every request
//! that would change the image gets EROFS — the library's state may be half
//! changed, so nothing more is built on it; reads and the unmount still work.
//! An errors=panic stop is the exception: its caller gets EIO and the mount's
//! panic hook ends the whole session (`cmd_mount::serve`).
//!
//! Runtime tuning uses two virtual xattrs of the mount's root, which never reach
//! the image: reading `trusted.uext4.tunables` lists every tunable, writing
//! `key=value` to `trusted.uext4.tune` changes a runtime one. Writing a name
//! to `trusted.uext4.remove_tree` on a directory runs the library's
//! `remove_tree` on that name there (`uext4 rm -r MOUNTPOINT/path`); after the
//! reply, a thread of its own tells the kernel to drop the name's dentries
//! (FUSE_NOTIFY_INVAL_ENTRY waits for the directory's lock, which the kernel
//! holds until the setxattr is answered).

use super::abi::{self, Attr, InHeader, Op, Payload, SetattrIn};
use super::channel::Device;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use uext4::format::inode::Timestamp;
use uext4::ns::change::now;
use uext4::{Filesystem, Owner, ReadPlan, SetAttr, Stat, ROOT_INO};

pub const TUNE_XATTR: &str = "trusted.uext4.tune";
pub const TUNABLES_XATTR: &str = "trusted.uext4.tunables";
pub const REMOVE_TREE_XATTR: &str = "trusted.uext4.remove_tree";

/// How long the kernel may trust attributes and names (seconds, nanoseconds).
/// uext4 is the image's only writer while mounted, so every change passes
/// through the kernel, which updates or drops what it cached itself.
const TTL: (u64, u32) = (1, 0);

const S_ISUID: u16 = 0o4000;
const S_ISGID: u16 = 0o2000;
const S_IXGRP: u16 = 0o0010;
/// fuse_setattr_in.valid: the caller lacks CAP_FSETID; clear setuid/setgid.
const FATTR_KILL_SUIDGID: u32 = 1 << 11;
const CAPABILITY_XATTR: &[u8] = b"security.capability";

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Who may use the mount, beyond what the kernel checks: with allow_root the
/// kernel lets everyone in (allow_other) and the server turns away all but
/// root and the mount's owner.
#[derive(Clone, Copy, Debug)]
pub enum Allowed {
    Everyone,
    RootAndOwner(u32),
}

/// What a handled request answers: nothing (FORGET), or an error number with
/// the payload written so far (0: success).
pub type Answer = Option<i32>;

const ACCESS_ACL: &str = "system.posix_acl_access";
const DEFAULT_ACL: &str = "system.posix_acl_default";

/// The ACLs a new inode takes from its directory's default ACL.
#[derive(Default)]
struct Inherited {
    /// Its access ACL, when it says more than the mode.
    access: Option<Vec<u8>>,
    /// A new directory's own default ACL.
    default: Option<Vec<u8>>,
}

/// A transport that can send a READ's reply from a plan of the read (the
/// image's pages passed on by reference) instead of a copy in the payload.
pub trait ReadReplier {
    /// Sends the reply to request `unique` holding the plan's bytes.
    /// `Ok(false)`: nothing was sent (the plan does not fit), reply by copy.
    ///
    /// # Errors
    /// The transport failed before sending anything; the caller replies by copy.
    fn reply_from_plan(&mut self, unique: u64, plan: &ReadPlan) -> std::io::Result<bool>;
}

struct Entry {
    ino: u32,
    /// d_type, as FUSE's dirent carries it.
    kind: u32,
    name: Vec<u8>,
}

pub struct Uext4Fuse {
    fs: Arc<Filesystem>,
    /// Lookups the kernel holds per inode (the root's are not counted).
    lookups: Mutex<HashMap<u32, u64>>,
    /// Directory listings of open directory handles.
    listings: Mutex<HashMap<u64, Arc<Vec<Entry>>>>,
    next_handle: AtomicU64,
    allowed: Allowed,
    /// Requests answered through the io_uring queues and through /dev/fuse.
    ring_requests: AtomicU64,
    /// READs answered by splice from the image, and by a copy.
    spliced_reads: AtomicU64,
    copied_reads: AtomicU64,
    device_requests: AtomicU64,
    /// Errors go here once the session runs (stderr, or syslog when detached).
    log: fn(&str),
    /// Set once a request panicked: changes are refused (EROFS) from then on.
    failed: AtomicBool,
    /// Inodes the kernel let go of that the library failed to release (each
    /// may leave the image needing e2fsck): how many, and the first error.
    release_failures: Mutex<(u64, Option<String>)>,
    /// Where notifications to the kernel go (a descriptor of the session).
    notify: OnceLock<Device>,
    /// Test hook (UEXT4_TEST_PANIC_OPCODE): the first request with this opcode
    /// panics after it has been served.
    panic_on: Option<u32>,
    panicked_once: AtomicBool,
    atime: AtimeMode,
    /// Whether the kernel agreed to hold writes in its page cache (reported
    /// by `uext4 tune`).
    writeback_cache: AtomicBool,
}

/// When reads and listings move atime (the atime mount options).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtimeMode {
    /// relatime, the kernel's default (`relatime`, `atime`).
    Relatime,
    /// Every read (`strictatime`).
    Strict,
    /// Never (`noatime`).
    Never,
}

/// Whether a request changes the image.
fn changes(op: &Op) -> bool {
    matches!(
        op,
        Op::Setattr(_)
            | Op::Symlink { .. }
            | Op::Mknod { .. }
            | Op::Mkdir { .. }
            | Op::Unlink { .. }
            | Op::Rmdir { .. }
            | Op::Rename { .. }
            | Op::Link { .. }
            | Op::Tmpfile { .. }
            | Op::Write { .. }
            | Op::Setxattr { .. }
            | Op::Removexattr { .. }
            | Op::Fallocate { .. }
    )
}

/// What a caught panic said.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

fn ext_ino(nodeid: u64) -> u32 {
    match nodeid {
        abi::FUSE_ROOT_ID => ROOT_INO,
        // ext4 numbers fit 32 bits; anything else names no inode (lookups fail).
        n => u32::try_from(n).unwrap_or(0),
    }
}

fn node_id(ino: u32) -> u64 {
    if ino == ROOT_INO {
        abi::FUSE_ROOT_ID
    } else {
        ino as u64
    }
}

fn errno(e: &uext4::Error) -> i32 {
    e.errno()
}

fn fuse_time(t: Timestamp) -> (u64, u32) {
    (t.sec as u64, t.nsec)
}

fn timestamp_of(sec: u64, nsec: u32) -> Timestamp {
    Timestamp { sec: sec as i64, nsec: nsec.min(999_999_999) }
}

/// d_type of an ext4 directory entry type (EXT4_FT_*).
fn dtype_of_dirent(ft: u8) -> u32 {
    match ft {
        1 => libc::DT_REG as u32,
        2 => libc::DT_DIR as u32,
        3 => libc::DT_CHR as u32,
        4 => libc::DT_BLK as u32,
        5 => libc::DT_FIFO as u32,
        6 => libc::DT_SOCK as u32,
        7 => libc::DT_LNK as u32,
        _ => libc::DT_UNKNOWN as u32,
    }
}

impl Uext4Fuse {
    pub fn new(fs: Arc<Filesystem>, allowed: Allowed, log: fn(&str)) -> Uext4Fuse {
        Uext4Fuse {
            fs,
            lookups: Mutex::new(HashMap::new()),
            listings: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            allowed,
            ring_requests: AtomicU64::new(0),
            spliced_reads: AtomicU64::new(0),
            copied_reads: AtomicU64::new(0),
            device_requests: AtomicU64::new(0),
            log,
            failed: AtomicBool::new(false),
            release_failures: Mutex::new((0, None)),
            notify: OnceLock::new(),
            panic_on: std::env::var("UEXT4_TEST_PANIC_OPCODE").ok().and_then(|v| v.parse().ok()),
            panicked_once: AtomicBool::new(false),
            writeback_cache: AtomicBool::new(false),
            atime: AtimeMode::Relatime,
        }
    }

    /// Reads move atime as `mode` says (relatime unless told).
    pub fn with_atime(mut self, mode: AtimeMode) -> Uext4Fuse {
        self.atime = mode;
        self
    }

    /// Records what the INIT handshake agreed about the write-back cache.
    pub fn set_writeback_cache(&self, granted: bool) {
        self.writeback_cache.store(granted, Ordering::Relaxed);
    }

    /// Gives the server a descriptor of its session for notifications.
    pub fn set_notifier(&self, dev: Device) {
        let _ = self.notify.set(dev);
    }

    /// Tells the kernel to drop what it cached of `ino`'s attributes: after a
    /// change it cannot see in a reply (privileges dropped by a write).
    fn invalidate_attributes(&self, ino: u32) {
        let Some(dev) = self.notify.get() else { return };
        let note = abi::inval_inode_notification(node_id(ino));
        if let Err(e) = dev.send(&[IoSlice::new(&note)]) {
            self.log(&format!("invalidating the attributes of inode {ino}: {e}"));
        }
    }

    /// Tells the kernel, from a thread of its own once the current request is
    /// answered, to drop its dentry for `name` in `parent` (and all below it)
    /// and the attributes of the parent (its link count and times changed)
    /// and of the `stale` inodes (a link fewer).
    fn forget_entry_later(&self, parent: u32, name: &[u8], stale: Vec<u32>) {
        let Some(dev) = self.notify.get() else { return };
        let dev = match dev.duplicate() {
            Ok(dev) => dev,
            Err(e) => return self.log(&format!("remove_tree: no descriptor to invalidate entries: {e}")),
        };
        let entry = abi::inval_entry_notification(node_id(parent), name);
        let attrs: Vec<_> =
            std::iter::once(parent).chain(stale).map(|ino| abi::inval_inode_notification(node_id(ino))).collect();
        let spawned = std::thread::Builder::new().name("uext4-notify".into()).spawn(move || {
            // ENOENT: the kernel had nothing cached; nothing to drop.
            let _ = dev.send(&[IoSlice::new(&entry)]);
            for note in &attrs {
                let _ = dev.send(&[IoSlice::new(note)]);
            }
        });
        if let Err(e) = spawned {
            self.log(&format!("remove_tree: cannot start the thread invalidating entries: {e}"));
        }
    }

    /// Whether a request panicked in this session (changes are refused since).
    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Answers one request as `handle` does, containing a panic: the caller
    /// gets EIO instead of waiting forever, and the image is changed no more.
    pub fn serve(&self, h: &InHeader, op: Op, out: &mut Payload, reads: Option<&mut dyn ReadReplier>) -> Answer {
        if self.has_failed() && changes(&op) {
            return Some(libc::EROFS);
        }
        let expects_reply = !matches!(op, Op::Forget { .. } | Op::BatchForget { .. } | Op::Interrupt);
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // The library judges who may take the reserved blocks by the caller,
            // as the kernel's ext4 judges the task behind a write.
            let _caller = self.fs.acting_as(Owner { uid: h.uid, gid: h.gid });
            let answer = self.handle(h, op, out, reads);
            if self.panic_on == Some(h.opcode) && !self.panicked_once.swap(true, Ordering::Relaxed) {
                panic!("test hook: opcode {} panics after it was served", h.opcode);
            }
            answer
        }));
        match served {
            Ok(answer) => answer,
            Err(payload) => {
                self.failed.store(true, Ordering::Relaxed);
                if uext4::is_errors_panic(panic_message(payload.as_ref())) {
                    // The image's errors=panic, not a bug: the mount's panic hook
                    // reported it and is ending the session.
                    return expects_reply.then_some(libc::EIO);
                }
                self.log(&format!(
                    "request {} (opcode {}) on node {} panicked: {}; it gets EIO, and the mount refuses \
                     changes from now on (EROFS); unmount and run e2fsck",
                    h.unique,
                    h.opcode,
                    h.nodeid,
                    panic_message(payload.as_ref())
                ));
                expects_reply.then_some(libc::EIO)
            }
        }
    }

    pub fn log(&self, message: &str) {
        (self.log)(message)
    }

    fn attr(&self, st: &Stat) -> Attr {
        let (major, minor) = st.rdev;
        Attr {
            ino: node_id(st.ino),
            size: st.size,
            blocks: st.blocks,
            atime: fuse_time(st.atime),
            mtime: fuse_time(st.mtime),
            ctime: fuse_time(st.ctime),
            mode: st.mode(),
            nlink: st.nlink,
            uid: st.uid,
            gid: st.gid,
            // The kernel's new_encode_dev for the FUSE attr's 32-bit rdev.
            rdev: (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12),
            blksize: self.fs.geometry().block_size as u32,
        }
    }

    /// One more kernel reference to `ino`: the first one pins the inode.
    ///
    /// # Errors
    /// The inode cannot be pinned (`NotFound` when it was removed since it was
    /// found, a race the caller answers as if the name were gone); nothing is
    /// counted then, so the kernel must not be given the inode.
    fn pin(&self, ino: u32) -> uext4::Result<()> {
        if ino == ROOT_INO {
            return Ok(());
        }
        let mut lookups = self.lookups.lock();
        let n = lookups.entry(ino).or_insert(0);
        if *n == 0 {
            if let Err(e) = self.fs.open_inode(ino) {
                lookups.remove(&ino);
                return Err(e);
            }
        }
        *n += 1;
        Ok(())
    }

    fn unpin(&self, ino: u32, count: u64) {
        let last = {
            let mut lookups = self.lookups.lock();
            let Some(n) = lookups.get_mut(&ino) else { return };
            *n = n.saturating_sub(count);
            *n == 0 && lookups.remove(&ino).is_some()
        };
        if last {
            self.release(ino);
        }
    }

    /// Closes the library's handle on `ino`; a failure is logged and counted,
    /// and makes the end of the session a failure (see `destroy`).
    fn release(&self, ino: u32) {
        if let Err(e) = self.fs.close_inode(ino) {
            let message = format!("releasing inode {ino}: {e}");
            self.log(&message);
            let mut failures = self.release_failures.lock();
            failures.0 += 1;
            failures.1.get_or_insert(message);
        }
    }

    /// An entry reply for a new or found inode, which the kernel now holds.
    fn entry(&self, st: uext4::Result<Stat>, out: &mut Payload) -> Answer {
        match st {
            Ok(st) => {
                if let Err(e) = self.pin(st.ino) {
                    return Some(errno(&e));
                }
                out.entry_out(&self.attr(&st), st.generation as u64, TTL);
                Some(0)
            }
            Err(e) => Some(errno(&e)),
        }
    }

    fn done(result: uext4::Result<()>) -> Answer {
        Some(result.err().map_or(0, |e| errno(&e)))
    }

    /// Owner of a new inode: the caller, with the group of a setgid parent.
    /// Returns it with the permission bits (and a new directory's inherited
    /// setgid bit), and what it inherits from the parent's default ACL. The
    /// kernel leaves the umask to us (FUSE_DONT_MASK): as in the kernel's
    /// posix_acl_create, a default ACL takes its place.
    fn new_owner(
        &self,
        h: &InHeader,
        parent_ino: u32,
        mode: u32,
        umask: u32,
        is_dir: bool,
    ) -> uext4::Result<(Owner, u16, Inherited)> {
        let parent = self.fs.stat(parent_ino)?;
        let default = self.fs.get_xattr(parent_ino, DEFAULT_ACL.as_bytes())?;
        let (mut perm, inherited) = match default {
            Some(default) => {
                // The ACL comes from the image: one it cannot be inherited from is damage.
                let (access, perm, extended) = uext4::format::acl::inherit(&default, (mode & 0o7777) as u16)
                    .map_err(|what| uext4::Error::corrupt(what, format!("default ACL of inode {parent_ino}")))?;
                let access = extended.then_some(access);
                (perm, Inherited { access, default: is_dir.then_some(default) })
            }
            None => ((mode & !umask & 0o7777) as u16, Inherited::default()),
        };
        if is_dir && parent.perm & S_ISGID != 0 {
            perm |= S_ISGID;
        }
        Ok((Self::owner_under(h, &parent), perm, inherited))
    }

    /// The caller, with the group of a setgid parent.
    fn owner_under(h: &InHeader, parent: &Stat) -> Owner {
        let gid = if parent.perm & S_ISGID != 0 { parent.gid } else { h.gid };
        Owner { uid: h.uid, gid }
    }

    /// Gives a new inode the ACLs it inherited; if that fails, the new name goes
    /// again (a file missing its ACL could grant its group more than asked).
    fn apply_inherited(
        &self,
        parent: u32,
        name: &[u8],
        made: uext4::Result<Stat>,
        acls: Inherited,
    ) -> uext4::Result<Stat> {
        let st = made?;
        if acls.access.is_none() && acls.default.is_none() {
            return Ok(st);
        }
        if let Err(e) = self.set_inherited(st.ino, &acls) {
            let undone = if st.file_type == uext4::FileType::Directory {
                self.fs.rmdir(parent, name)
            } else {
                self.fs.unlink(parent, name)
            };
            if let Err(u) = undone {
                self.log(&format!("removing a new inode whose inherited ACL failed ({e}): {u}"));
            }
            return Err(e);
        }
        self.fs.stat(st.ino)
    }

    /// Gives a new inode what it inherits from its parent's default ACL.
    fn set_inherited(&self, ino: u32, acls: &Inherited) -> uext4::Result<()> {
        if let Some(access) = &acls.access {
            self.fs.set_xattr(ino, ACCESS_ACL.as_bytes(), access, 0)?;
        }
        if let Some(default) = &acls.default {
            self.fs.set_xattr(ino, DEFAULT_ACL.as_bytes(), default, 0)?;
        }
        Ok(())
    }

    /// O_TMPFILE: a file without a name, open once here until the kernel's
    /// lookup reference (the entry reply) holds it; the kernel's FORGET after
    /// the last close frees it, unless a LINK named it meanwhile (the kernel
    /// allows that only without O_EXCL, and so does the library). The reply
    /// is an entry and an open, as for CREATE.
    fn tmpfile(&self, h: &InHeader, dir: u32, flags: u32, mode: u32, umask: u32, out: &mut Payload) -> Answer {
        let made = self.new_owner(h, dir, mode, umask, false).and_then(|(owner, perm, acls)| {
            let linkable = flags & libc::O_EXCL as u32 == 0;
            let st = self.fs.create_tmpfile(dir, perm, owner, linkable)?;
            match self.set_inherited(st.ino, &acls) {
                Ok(()) => self.fs.stat(st.ino),
                Err(e) => {
                    let _ = self.fs.close_inode(st.ino);
                    Err(e)
                }
            }
        });
        let st = match made {
            Ok(st) => st,
            Err(e) => return Some(errno(&e)),
        };
        let answer = self.entry(Ok(st.clone()), out);
        if answer == Some(0) {
            out.open_out(0, 0);
        }
        // The entry's pin holds it now (or, had the pin failed, nothing does).
        if let Err(e) = self.fs.close_inode(st.ino) {
            self.log(&format!("tmpfile: closing inode {}: {e}", st.ino));
        }
        answer
    }

    /// Whether the caller of `h` is root (taken for CAP_FSETID) or a member of
    /// group `gid`: its own group or a supplementary one (from /proc, as the
    /// request carries only the caller's pid).
    fn in_group_or_root(h: &InHeader, gid: u32) -> bool {
        if h.uid == 0 || h.gid == gid {
            return true;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", h.pid)) else { return false };
        status
            .lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .is_some_and(|groups| groups.split_whitespace().any(|g| g.parse() == Ok(gid)))
    }

    /// Drops setuid, and setgid where the kernel drops it, and file
    /// capabilities, as the kernel's VFS does (setattr_should_drop_suidgid and
    /// chown_common in fs/attr.c and fs/open.c): a write, truncate or fallocate
    /// by a caller without CAP_FSETID does so on regular files (`chown` false);
    /// a chown, by anyone, on every kind but directories. setuid always goes;
    /// setgid when it means "set group ID" (group-executable), or when the
    /// caller is not in the file's group.
    fn kill_privileges(&self, h: &InHeader, ino: u32, st: &Stat, chown: bool, attr: &mut SetAttr) -> uext4::Result<()> {
        let applies =
            if chown { st.file_type != uext4::FileType::Directory } else { st.file_type == uext4::FileType::Regular };
        if !applies {
            return Ok(());
        }
        let perm = attr.perm.unwrap_or(st.perm);
        let mut kill = S_ISUID;
        if perm & S_IXGRP != 0 || !Self::in_group_or_root(h, st.gid) {
            kill |= S_ISGID;
        }
        if perm & kill != 0 {
            attr.perm = Some(perm & !kill);
        }
        match self.fs.remove_xattr(ino, CAPABILITY_XATTR) {
            Ok(()) | Err(uext4::Error::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// A write or fallocate by a caller without CAP_FSETID drops privileges
    /// first; the reply carries no attributes, so the kernel is told to forget
    /// the mode it cached.
    fn kill_privileges_before_write(&self, h: &InHeader, ino: u32) -> uext4::Result<()> {
        let st = self.fs.stat(ino)?;
        let mut attr = SetAttr::default();
        self.kill_privileges(h, ino, &st, false, &mut attr)?;
        if attr.perm.is_some() {
            self.fs.setattr(ino, &attr)?;
            self.invalidate_attributes(ino);
        }
        Ok(())
    }

    fn listing(&self, ino: u32) -> uext4::Result<Vec<Entry>> {
        Ok(self
            .fs
            .read_dir(ino)?
            .into_iter()
            .map(|e| Entry { ino: e.ino, kind: dtype_of_dirent(e.file_type), name: e.name })
            .collect())
    }

    /// relatime, as the kernel's ext4 mounts by default: a read (or a listing)
    /// moves atime only when it is not newer than mtime or ctime, or is a day old.
    /// `strictatime` moves it on every read, `noatime` never.
    fn touch_atime(&self, ino: u32) {
        if self.fs.is_read_only() || self.has_failed() || self.atime == AtimeMode::Never {
            return;
        }
        let Ok(st) = self.fs.stat(ino) else { return };
        let now = now();
        let stale = self.atime == AtimeMode::Strict
            || st.atime <= st.mtime
            || st.atime <= st.ctime
            || now.sec - st.atime.sec >= 24 * 3600;
        if stale {
            let attr = SetAttr { atime: Some(now), ctime: Some(st.ctime), ..SetAttr::default() };
            if let Err(e) = self.fs.setattr(ino, &attr) {
                self.log(&format!("updating atime of inode {ino}: {e}"));
            }
        }
    }

    /// Counts a request by the way it came (for the session line of `uext4 tune`).
    pub fn count(&self, through_ring: bool) {
        let counter = if through_ring { &self.ring_requests } else { &self.device_requests };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn tunables_text(&self) -> String {
        let mut text: String = self
            .fs
            .tunables()
            .iter()
            .map(|t| format!("{}={}{}\n", t.name, t.value, if t.runtime { " (runtime)" } else { "" }))
            .collect();
        text.push_str(&format!(
            "# requests so far: {} through io_uring, {} through /dev/fuse\n",
            self.ring_requests.load(Ordering::Relaxed),
            self.device_requests.load(Ordering::Relaxed)
        ));
        text.push_str(&format!(
            "# reads so far: {} spliced from the image, {} copied\n",
            self.spliced_reads.load(Ordering::Relaxed),
            self.copied_reads.load(Ordering::Relaxed)
        ));
        let writeback = if self.writeback_cache.load(Ordering::Relaxed) { "on" } else { "off" };
        text.push_str(&format!("# write-back cache: {writeback}\n"));
        text
    }

    /// The session is over: let go of every inode the kernel held and write
    /// everything back. An error if that failed, or if releasing any inode the
    /// kernel let go of failed during the session.
    pub fn destroy(&self) -> uext4::Result<()> {
        let held: Vec<u32> = self.lookups.lock().drain().map(|(ino, _)| ino).collect();
        for ino in held {
            self.release(ino);
        }
        // Test hook: a write-back slow enough for a test to kill the daemon in it.
        if let Some(ms) = std::env::var("UEXT4_TEST_STALL_WRITEBACK_MS").ok().and_then(|v| v.parse().ok()) {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        self.fs.sync()?;
        match &*self.release_failures.lock() {
            (0, _) => Ok(()),
            (n, first) => Err(uext4::Error::Invalid(format!(
                "{n} inode(s) could not be released (first: {}); the image needs e2fsck -f",
                first.as_deref().unwrap_or("?")
            ))),
        }
    }

    /// Serves a READ through a transport that sends the plan's pieces itself.
    /// `None`: it could not (the read does not fit its pipe, or the plan
    /// names bytes it cannot pass on), and the caller replies by copy.
    fn read_by_plan(
        &self,
        h: &InHeader,
        ino: u32,
        offset: u64,
        want: usize,
        open_flags: u32,
        replier: &mut dyn ReadReplier,
    ) -> Option<Answer> {
        // The atime goes first, as the plan holds the inode's mapping lock
        // that setattr takes exclusive; a reader's next stat still sees it.
        if open_flags & libc::O_ACCMODE as u32 != libc::O_WRONLY as u32 {
            self.touch_atime(ino);
        }
        let plan = match self.fs.plan_read(ino, offset, want) {
            Ok(plan) => plan,
            Err(e) => return Some(Some(errno(&e))),
        };
        match replier.reply_from_plan(h.unique, &plan) {
            // Replied: nothing more to send.
            Ok(true) => {
                self.spliced_reads.fetch_add(1, Ordering::Relaxed);
                Some(None)
            }
            Ok(false) => None,
            Err(e) => {
                self.log(&format!("spliced reply to a read of inode {ino}: {e}; replying by copy"));
                None
            }
        }
    }

    /// Answers one request, writing the reply's payload into `out` (or, for a
    /// READ, sending it through `reads` when given: then the answer is `None`).
    fn handle(&self, h: &InHeader, op: Op, out: &mut Payload, reads: Option<&mut dyn ReadReplier>) -> Answer {
        let ino = ext_ino(h.nodeid);
        if let Allowed::RootAndOwner(owner) = self.allowed {
            // What the kernel sends on its own account (readahead, writeback,
            // forgets, closes) may carry any uid; everything else is turned away.
            let kernel_may_send = matches!(
                op,
                Op::Read { .. }
                    | Op::Readdir { .. }
                    | Op::Forget { .. }
                    | Op::BatchForget { .. }
                    | Op::Interrupt
                    | Op::Release
                    | Op::Releasedir { .. }
                    | Op::Destroy
            );
            if h.uid != owner && h.uid != 0 && !kernel_may_send {
                return Some(libc::EACCES);
            }
        }
        match op {
            // INIT is the session's own (a second one is an error); DESTROY
            // needs nothing, as the session writes everything back when it ends.
            Op::Init { .. } => Some(libc::EIO),
            Op::Destroy => Some(0),
            Op::Interrupt => None,
            Op::Forget { nlookup } => {
                self.unpin(ino, nlookup);
                None
            }
            Op::BatchForget { records } => {
                for (node, nlookup) in abi::forget_records(records) {
                    self.unpin(ext_ino(node), nlookup);
                }
                None
            }
            Op::Lookup { name } => match self.fs.lookup(ino, name) {
                Ok(Some(found)) => self.entry(self.fs.stat(found), out),
                Ok(None) => {
                    // Node id 0 with a lifetime: the kernel caches the miss.
                    out.entry_out(&Attr::default(), 0, TTL);
                    Some(0)
                }
                Err(e) => Some(errno(&e)),
            },
            Op::Getattr => match self.fs.stat(ino) {
                Ok(st) => {
                    out.attr_out(&self.attr(&st), TTL);
                    Some(0)
                }
                Err(e) => Some(errno(&e)),
            },
            Op::Setattr(s) => self.setattr(h, ino, &s, out),
            Op::Readlink => match self.fs.read_link(ino) {
                Ok(target) => Some(if out.put(&target) { 0 } else { libc::ENAMETOOLONG }),
                Err(e) => Some(errno(&e)),
            },
            Op::Mknod { mode, rdev, umask, name } => {
                let made = self.new_owner(h, ino, mode, umask, false).and_then(|(owner, perm, acls)| {
                    let kind = (mode & libc::S_IFMT) as u16;
                    let made = if kind == libc::S_IFREG as u16 || kind == 0 {
                        self.fs.create(ino, name, perm, owner)
                    } else {
                        // The request carries the kernel's new_encode_dev form.
                        let (major, minor) = ((rdev & 0xfff00) >> 8, (rdev & 0xff) | ((rdev >> 12) & 0xfff00));
                        self.fs.mknod(ino, name, kind | perm, (major, minor), owner)
                    };
                    self.apply_inherited(ino, name, made, acls)
                });
                self.entry(made, out)
            }
            Op::Mkdir { mode, umask, name } => {
                let made = self.new_owner(h, ino, mode, umask, true).and_then(|(owner, perm, acls)| {
                    self.apply_inherited(ino, name, self.fs.mkdir(ino, name, perm, owner), acls)
                });
                self.entry(made, out)
            }
            Op::Symlink { name, target } => {
                // A symlink, too, takes the group of a setgid parent (and no ACL).
                let made = self
                    .fs
                    .stat(ino)
                    .and_then(|parent| self.fs.symlink(ino, name, target, Self::owner_under(h, &parent)));
                self.entry(made, out)
            }
            Op::Unlink { name } => Self::done(self.fs.unlink(ino, name)),
            Op::Rmdir { name } => Self::done(self.fs.rmdir(ino, name)),
            Op::Rename { newdir, flags, name, newname } => {
                Self::done(self.fs.rename(ino, name, ext_ino(newdir), newname, flags))
            }
            Op::Link { oldnodeid, name } => self.entry(self.fs.link(ext_ino(oldnodeid), ino, name), out),
            Op::Tmpfile { flags, mode, umask } => self.tmpfile(h, ino, flags, mode, umask, out),
            // Opens need nothing from us: an open file keeps its inode in the
            // kernel, so the lookup pin already keeps an unlinked one alive.
            // ENOSYS makes the kernel stop sending OPEN, and RELEASE with it,
            // for good (zero-message opens). CREATE (create and open in one)
            // answered ENOSYS makes the kernel create with MKNOD and then open
            // - which is no message once OPEN has been refused - so the very
            // first create of a session already sheds the RELEASE of every
            // later one. O_EXCL stays exact: the kernel holds the directory's
            // lock across its lookup and the MKNOD.
            Op::Open | Op::Create => Some(libc::ENOSYS),
            Op::Release => Some(0),
            Op::Read { offset, size, open_flags } => {
                let want = (size as usize).min(out.capacity());
                if let Some(replier) = reads {
                    if let Some(answer) = self.read_by_plan(h, ino, offset, want, open_flags, replier) {
                        return answer;
                    }
                }
                self.copied_reads.fetch_add(1, Ordering::Relaxed);
                match self.fs.read(ino, offset, &mut out.spare()[..want]) {
                    Ok(n) => {
                        out.advance(n);
                        // Before the reply: a stat the reader makes next must see the new atime.
                        // A read through a file opened write-only is the kernel filling a
                        // page for a partial write (the write-back cache): no one read.
                        if open_flags & libc::O_ACCMODE as u32 != libc::O_WRONLY as u32 {
                            self.touch_atime(ino);
                        }
                        Some(0)
                    }
                    Err(e) => Some(errno(&e)),
                }
            }
            Op::Write { offset, write_flags, data } => {
                if write_flags & abi::FUSE_WRITE_KILL_SUIDGID != 0 {
                    if let Err(e) = self.kill_privileges_before_write(h, ino) {
                        return Some(errno(&e));
                    }
                }
                match self.fs.write(ino, offset, data) {
                    Ok(n) => {
                        out.size_out(n as u32);
                        Some(0)
                    }
                    Err(e) => Some(errno(&e)),
                }
            }
            Op::Statfs => {
                let s = self.fs.statfs();
                out.statfs_out(
                    s.blocks,
                    s.free_blocks,
                    s.available_blocks,
                    s.inodes,
                    s.free_inodes,
                    s.block_size,
                    s.name_max,
                );
                Some(0)
            }
            // Nothing is buffered here: data went to the image in `write`. ENOSYS
            // tells the kernel so once, and it stops sending a flush on every close.
            Op::Flush => Some(libc::ENOSYS),
            Op::Fsync | Op::Fsyncdir => Self::done(self.fs.fsync(ino)),
            // sync(2)/syncfs(2): everything so far becomes durable, as with an
            // fsync (both commit the running transaction, which holds every
            // change). Linux up to at least 6.18 sends this to virtiofs only,
            // so `uext4 sync` fsyncs the mount's root instead.
            Op::Syncfs => Self::done(self.fs.commit()),
            Op::Setxattr { flags, name, value } => self.setxattr(ino, flags, name, value),
            Op::Getxattr { size, name } => {
                let value = if name == TUNABLES_XATTR.as_bytes() && ino == ROOT_INO {
                    Ok(Some(self.tunables_text().into_bytes()))
                } else {
                    self.fs.get_xattr(ino, name)
                };
                match value {
                    Ok(Some(v)) => sized(out, size, &v),
                    Ok(None) => Some(libc::ENODATA),
                    Err(e) => Some(errno(&e)),
                }
            }
            Op::Listxattr { size } => match self.fs.xattrs(ino) {
                Ok(attrs) => {
                    let mut names = Vec::new();
                    // trusted.* names are listed to CAP_SYS_ADMIN only (ext4_xattr_trusted_list).
                    let hidden = |name: &[u8]| h.uid != 0 && name.starts_with(b"trusted.");
                    for (name, _) in attrs.into_iter().filter(|(name, _)| !hidden(name)) {
                        names.extend_from_slice(&name);
                        names.push(0);
                    }
                    sized(out, size, &names)
                }
                Err(e) => Some(errno(&e)),
            },
            Op::Removexattr { name } => match self.fs.remove_xattr(ino, name) {
                Ok(()) => Some(0),
                Err(uext4::Error::NotFound(_)) => Some(libc::ENODATA),
                Err(e) => Some(errno(&e)),
            },
            // A directory removed while the kernel still holds it (a shell's
            // working directory) opens as empty, as on the kernel's ext4.
            Op::Opendir => match self.listing(ino).or_else(|e| match self.fs.stat(ino) {
                Ok(st) if st.nlink == 0 => Ok(Vec::new()),
                _ => Err(e),
            }) {
                Ok(entries) => {
                    let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
                    self.listings.lock().insert(fh, Arc::new(entries));
                    out.open_out(fh, 0);
                    Some(0)
                }
                Err(e) => Some(errno(&e)),
            },
            Op::Readdir { fh, offset, size, plus } => self.readdir(ino, fh, offset, size, plus, out),
            Op::Releasedir { fh } => {
                self.listings.lock().remove(&fh);
                Some(0)
            }
            // Permission checks are the kernel's (default_permissions); this only
            // answers whether the inode exists.
            Op::Access => Self::done(self.fs.stat(ino).map(|_| ())),
            Op::Fallocate { offset, length, mode } => {
                // The kernel's ext4 drops privileges in fallocate (file_modified),
                // but FUSE leaves it to the server and sends no flag for it: the
                // caller's uid stands in for CAP_FSETID.
                if h.uid != 0 {
                    if let Err(e) = self.kill_privileges_before_write(h, ino) {
                        return Some(errno(&e));
                    }
                }
                Self::done(self.fs.fallocate(ino, offset, length, mode))
            }
            // Under the write-back cache the kernel may hold data (and size) this
            // server has not seen, and it does not write them back before asking:
            // ENOSYS makes it answer SEEK_DATA/SEEK_HOLE itself from its own size
            // (all data, one hole at the end), which is never wrong.
            Op::Ioctl { cmd, input, out_size } => self.ioctl(ino, cmd, input, out_size, out),
            Op::Lseek { .. } if self.writeback_cache.load(Ordering::Relaxed) => Some(libc::ENOSYS),
            Op::Lseek { offset, whence } => {
                let data = match whence as i32 {
                    libc::SEEK_DATA => true,
                    libc::SEEK_HOLE => false,
                    _ => return Some(libc::EINVAL),
                };
                match self.fs.seek_data_or_hole(ino, offset, data) {
                    Ok(Some(at)) => {
                        out.lseek_out(at);
                        Some(0)
                    }
                    Ok(None) => Some(libc::ENXIO),
                    Err(e) => Some(errno(&e)),
                }
            }
            Op::Other => Some(libc::ENOSYS),
        }
    }

    fn setattr(&self, h: &InHeader, ino: u32, s: &SetattrIn, out: &mut Payload) -> Answer {
        let time = |set: u32, now_flag: u32, (sec, nsec): (u64, u32)| {
            if s.valid & now_flag != 0 {
                Some(now())
            } else if s.valid & set != 0 {
                Some(timestamp_of(sec, nsec))
            } else {
                None
            }
        };
        let mut attr = SetAttr {
            perm: (s.valid & abi::FATTR_MODE != 0).then_some((s.mode & 0o7777) as u16),
            uid: (s.valid & abi::FATTR_UID != 0).then_some(s.uid),
            gid: (s.valid & abi::FATTR_GID != 0).then_some(s.gid),
            size: (s.valid & abi::FATTR_SIZE != 0).then_some(s.size),
            atime: time(abi::FATTR_ATIME, abi::FATTR_ATIME_NOW, s.atime),
            mtime: time(abi::FATTR_MTIME, abi::FATTR_MTIME_NOW, s.mtime),
            ctime: (s.valid & abi::FATTR_CTIME != 0).then_some(timestamp_of(s.ctime.0, s.ctime.1)),
        };
        // The kernel asks (FATTR_KILL_SUIDGID) on a chown of anything but a
        // directory, by anyone, and on a truncate by a caller without
        // CAP_FSETID. A chmod in the same request sets the mode outright.
        // chown(f, -1, -1) arrives as a SETATTR that sets nothing (ctime at most,
        // with the write-back cache): the kernel drops its kill bits under
        // HANDLE_KILLPRIV_V2, and utimensat with both times omitted never gets
        // here. The kernel's ext4 drops privileges for it, so this does too.
        let changes = abi::FATTR_MODE
            | abi::FATTR_UID
            | abi::FATTR_GID
            | abi::FATTR_SIZE
            | abi::FATTR_ATIME
            | abi::FATTR_MTIME
            | abi::FATTR_ATIME_NOW
            | abi::FATTR_MTIME_NOW;
        let null_chown = s.valid & changes == 0;
        // As notify_change: times set outright need an inode neither immutable
        // nor append-only; times set to now, one that is not immutable (the
        // library refuses the rest, and lets atime alone move for reads).
        let any_times = abi::FATTR_ATIME | abi::FATTR_MTIME | abi::FATTR_ATIME_NOW | abi::FATTR_MTIME_NOW;
        if s.valid & any_times != 0 {
            use uext4::format::inode::{EXT4_APPEND_FL, EXT4_IMMUTABLE_FL};
            let flags = match self.fs.stat(ino) {
                Ok(st) => st.flags,
                Err(e) => return Some(errno(&e)),
            };
            // The kernel sends FATTR_ATIME with FATTR_ATIME_NOW for "now".
            let set_outright = |time: u32, now: u32| s.valid & time != 0 && s.valid & now == 0;
            let now_only = !set_outright(abi::FATTR_ATIME, abi::FATTR_ATIME_NOW)
                && !set_outright(abi::FATTR_MTIME, abi::FATTR_MTIME_NOW);
            if flags & EXT4_IMMUTABLE_FL != 0 || flags & EXT4_APPEND_FL != 0 && !now_only {
                return Some(libc::EPERM);
            }
        }
        let chown = attr.uid.is_some() || attr.gid.is_some() || null_chown;
        if (s.valid & FATTR_KILL_SUIDGID != 0 || null_chown) && attr.perm.is_none() {
            let killed = self.fs.stat(ino).and_then(|st| self.kill_privileges(h, ino, &st, chown, &mut attr));
            if let Err(e) = killed {
                return Some(errno(&e));
            }
        }
        match self.fs.setattr(ino, &attr) {
            Ok(st) => {
                out.attr_out(&self.attr(&st), TTL);
                Some(0)
            }
            Err(e) => Some(errno(&e)),
        }
    }

    /// lsattr and chattr: FS_IOC_GETFLAGS and FS_IOC_SETFLAGS (the kernel's
    /// VFS has checked the caller: the owner, and CAP_LINUX_IMMUTABLE to change
    /// immutable or append-only). Every other ioctl is not one ext4's files take
    /// here: ENOTTY.
    fn ioctl(&self, ino: u32, cmd: u32, input: &[u8], out_size: u32, out: &mut Payload) -> Answer {
        // _IOR('f', 1, long) and _IOW('f', 2, long), and their 32-bit forms.
        const GETFLAGS: [u32; 2] = [0x8008_6601, 0x8004_6601];
        const SETFLAGS: [u32; 2] = [0x4008_6602, 0x4004_6602];
        // _IOR('X', 31, struct fsxattr): what the VFS asks first when it sets flags.
        const FSGETXATTR: u32 = 0x801c_581f;
        if cmd == FSGETXATTR {
            return match self.fs.flags(ino) {
                Ok(flags) => {
                    // ext4's flags as the fsxattr bits (ext4_iflags_to_xflags).
                    let xflags = [(0x8, 0x20), (0x10, 0x8), (0x20, 0x10), (0x40, 0x80), (0x80, 0x40)]
                        .iter()
                        .filter(|&&(fl, _)| flags & fl != 0)
                        .fold(0u32, |x, &(_, xf)| x | xf);
                    let mut fsxattr = [0u8; 28];
                    fsxattr[..4].copy_from_slice(&xflags.to_ne_bytes());
                    out.ioctl_out(0, &fsxattr[..(out_size as usize).min(28)]);
                    Some(0)
                }
                Err(e) => Some(errno(&e)),
            };
        }
        let width = (out_size as usize).min(8);
        if GETFLAGS.contains(&cmd) {
            return match self.fs.flags(ino) {
                Ok(flags) => {
                    // A long for the ioctl's own size, an int for the VFS's fileattr path.
                    match width {
                        8 => out.ioctl_out(0, &(flags as u64).to_ne_bytes()),
                        _ => out.ioctl_out(0, &flags.to_ne_bytes()[..width.min(4)]),
                    }
                    Some(0)
                }
                Err(e) => Some(errno(&e)),
            };
        }
        if SETFLAGS.contains(&cmd) {
            let Some(bytes) = input.get(..4) else { return Some(libc::EINVAL) };
            let flags = u32::from_ne_bytes(bytes.try_into().unwrap_or_default());
            return match self.fs.set_flags(ino, flags) {
                Ok(()) => {
                    out.ioctl_out(0, &[]);
                    Some(0)
                }
                Err(e) => Some(errno(&e)),
            };
        }
        Some(libc::ENOTTY)
    }

    fn setxattr(&self, ino: u32, flags: u32, name: &[u8], value: &[u8]) -> Answer {
        if name == TUNE_XATTR.as_bytes() && ino == ROOT_INO {
            let text = String::from_utf8_lossy(value);
            let result = match text.trim().split_once('=') {
                Some((key, value)) => self.fs.set_tunable(key.trim(), value.trim()),
                None => Err(uext4::Error::Invalid(format!("'{text}' is not key=value"))),
            };
            if let Err(e) = &result {
                self.log(&format!("tune: {e}"));
            }
            return Self::done(result);
        }
        if name == REMOVE_TREE_XATTR.as_bytes() {
            // Inodes the kernel holds that lost a link and live on (a hard link
            // from outside the tree): their cached link counts are stale.
            let mut stale = Vec::new();
            let result =
                self.fs.remove_tree_with(ino, value, &mut |_| std::ops::ControlFlow::Continue(()), &mut |kept| {
                    if self.lookups.lock().contains_key(&kept) {
                        stale.push(kept);
                    }
                });
            match &result {
                Ok(_) => self.forget_entry_later(ino, value, stale),
                Err(e) => self.log(&format!("remove_tree: {e}")),
            }
            return Self::done(result.map(|_| ()));
        }
        match self.fs.set_xattr(ino, name, value, flags) {
            Ok(()) => Some(0),
            Err(uext4::Error::NotFound(_)) => Some(libc::ENODATA),
            Err(e) => Some(errno(&e)),
        }
    }

    fn readdir(&self, ino: u32, fh: u64, offset: u64, size: u32, plus: bool, out: &mut Payload) -> Answer {
        let Some(entries) = self.listings.lock().get(&fh).cloned() else {
            return Some(libc::EBADF);
        };
        if offset == 0 {
            self.touch_atime(ino);
        }
        let spare = out.spare();
        let room_len = (size as usize).min(spare.len());
        let mut room = Payload::new(&mut spare[..room_len]);
        for (i, e) in entries.iter().enumerate().skip(offset as usize) {
            let next = i as u64 + 1;
            if !plus {
                if !room.dirent(node_id(e.ino), next, e.kind, &e.name) {
                    break;
                }
                continue;
            }
            // The kernel makes a dentry of every attributed entry, so one whose
            // name has left this directory since opendir (renamed away, or
            // replaced) is left out: offered, it would give the name back for
            // its TTL, and for a directory (one name only) would move the
            // kernel's dentry of it here from where it now is, or fail the
            // listing with ESTALE while a rename runs. The kernel holds this
            // directory shared while it reads, so what the lookup finds stands.
            let counted = e.name != b"." && e.name != b"..";
            if counted {
                match self.fs.lookup(ino, &e.name) {
                    Ok(Some(now)) if now == e.ino => {}
                    Ok(_) => continue,
                    // Damage or an I/O error: the stat below says what it is.
                    Err(_) => {}
                }
            }
            let st = match self.fs.stat(e.ino) {
                Ok(st) => st,
                // Removed since opendir: leave it out rather than fail the listing.
                Err(uext4::Error::NotFound(_)) => continue,
                // Unreadable (a damaged inode, an I/O error): the name is listed
                // without attributes, as the kernel's ext4 lists it, and the
                // lookup that follows reports the error; leaving it out would let
                // ls or cp -a end with exit 0 and a file missing.
                Err(err) => {
                    self.log(&format!("readdirplus: inode {} of {:?}: {err}", e.ino, String::from_utf8_lossy(&e.name)));
                    if !room.direntplus_unattributed(node_id(e.ino), next, e.kind, &e.name) {
                        break;
                    }
                    continue;
                }
            };
            // The kernel takes a lookup reference for every entry but . and ..,
            // so each is pinned before it is offered (and one removed in the
            // meantime is left out too).
            if counted {
                match self.pin(e.ino) {
                    Ok(()) => {}
                    Err(uext4::Error::NotFound(_)) => continue,
                    Err(err) => {
                        self.log(&format!("readdirplus: pinning inode {}: {err}", e.ino));
                        continue;
                    }
                }
            }
            if !room.direntplus(&self.attr(&st), st.generation as u64, TTL, next, e.kind, &e.name) {
                if counted {
                    self.unpin(e.ino, 1);
                }
                break;
            }
        }
        let n = room.len();
        out.advance(n);
        Some(0)
    }
}

/// getxattr/listxattr: size 0 asks how big; too small a buffer is ERANGE.
fn sized(out: &mut Payload, size: u32, value: &[u8]) -> Answer {
    if size == 0 {
        out.size_out(value.len() as u32);
        Some(0)
    } else if value.len() > size as usize || !out.put(value) {
        Some(libc::ERANGE)
    } else {
        Some(0)
    }
}
