//! The engine behind a FUSE session: every request becomes a library call.
//!
//! Inode numbers are ext4's, except that FUSE's root (1) is ext4's root (2).
//! Each lookup the kernel holds pins its inode as an open handle does in the
//! library: an inode unlinked while the kernel still knows it lives on (on the
//! orphan list) until the kernel forgets it, and whatever the kernel still holds
//! at unmount is let go then. A directory's listing is taken whole at opendir;
//! readdir offsets index that snapshot, so they stay valid however the directory
//! changes meanwhile (POSIX leaves open whether entries added or removed since
//! opendir appear). The session runs several worker threads; the library's own
//! locks order concurrent changes.
//!
//! Runtime tuning uses two virtual xattrs of the mount's root, which never reach
//! the image: reading `trusted.uext4.tunables` lists every tunable, writing
//! `key=value` to `trusted.uext4.tune` changes a runtime one.

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use uext4::format::inode::Timestamp;
use uext4::{Filesystem, Owner, SetAttr, Stat, ROOT_INO};

pub const TUNE_XATTR: &str = "trusted.uext4.tune";
pub const TUNABLES_XATTR: &str = "trusted.uext4.tunables";

/// How long the kernel may trust attributes and names it was given. uext4 is the
/// image's only writer while mounted, so every change passes through here.
const TTL: Duration = Duration::from_secs(1);

const S_ISUID: u16 = 0o4000;
const S_ISGID: u16 = 0o2000;
const S_IXGRP: u16 = 0o0010;

struct Entry {
    ino: u32,
    kind: FileType,
    name: Vec<u8>,
}

pub struct Uext4Fuse {
    fs: Arc<Filesystem>,
    /// Lookups the kernel holds per inode (the root's are not counted).
    lookups: Mutex<HashMap<u32, u64>>,
    /// Directory listings of open directory handles.
    listings: Mutex<HashMap<u64, Arc<Vec<Entry>>>>,
    next_handle: AtomicU64,
    /// Errors go here once the session runs (stderr, or syslog when detached).
    log: fn(&str),
}

fn ext_ino(ino: INodeNo) -> u32 {
    match ino.0 {
        1 => ROOT_INO,
        // ext4 numbers fit 32 bits; anything else names no inode (lookups fail).
        n => u32::try_from(n).unwrap_or(0),
    }
}

fn fuse_ino(ino: u32) -> INodeNo {
    INodeNo(if ino == ROOT_INO { 1 } else { ino as u64 })
}

fn errno(e: &uext4::Error) -> Errno {
    Errno::from_i32(e.errno())
}

fn time_of(t: Timestamp) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + Duration::from_nanos(t.nsec as u64)
    }
}

fn timestamp_of(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp { sec: d.as_secs() as i64, nsec: d.subsec_nanos() },
        Err(e) => {
            let d = e.duration();
            let (sec, nsec) = (d.as_secs() as i64, d.subsec_nanos());
            if nsec == 0 {
                Timestamp { sec: -sec, nsec: 0 }
            } else {
                Timestamp { sec: -sec - 1, nsec: 1_000_000_000 - nsec }
            }
        }
    }
}

fn kind_of(t: uext4::FileType) -> FileType {
    match t {
        uext4::FileType::Regular => FileType::RegularFile,
        uext4::FileType::Directory => FileType::Directory,
        uext4::FileType::Symlink => FileType::Symlink,
        uext4::FileType::CharDevice => FileType::CharDevice,
        uext4::FileType::BlockDevice => FileType::BlockDevice,
        uext4::FileType::Fifo => FileType::NamedPipe,
        uext4::FileType::Socket => FileType::Socket,
    }
}

/// Directory-entry file types as ext4 stores them (EXT4_FT_*).
fn kind_of_dirent(ft: u8) -> FileType {
    match ft {
        2 => FileType::Directory,
        3 => FileType::CharDevice,
        4 => FileType::BlockDevice,
        5 => FileType::NamedPipe,
        6 => FileType::Socket,
        7 => FileType::Symlink,
        _ => FileType::RegularFile,
    }
}

impl Uext4Fuse {
    pub fn new(fs: Arc<Filesystem>, log: fn(&str)) -> Uext4Fuse {
        Uext4Fuse {
            fs,
            lookups: Mutex::new(HashMap::new()),
            listings: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            log,
        }
    }

    fn attr(&self, st: &Stat) -> FileAttr {
        let (major, minor) = st.rdev;
        FileAttr {
            ino: fuse_ino(st.ino),
            size: st.size,
            blocks: st.blocks,
            atime: time_of(st.atime),
            mtime: time_of(st.mtime),
            ctime: time_of(st.ctime),
            crtime: st.crtime.map(time_of).unwrap_or(UNIX_EPOCH),
            kind: kind_of(st.file_type),
            perm: st.perm,
            nlink: st.nlink,
            uid: st.uid,
            gid: st.gid,
            // The kernel's old_encode_dev for the FUSE attr's 32-bit rdev.
            rdev: (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12),
            blksize: self.fs.geometry().block_size as u32,
            flags: 0,
        }
    }

    /// One more kernel reference to `ino`: the first one pins the inode.
    fn pin(&self, ino: u32) {
        if ino == ROOT_INO {
            return;
        }
        let mut lookups = self.lookups.lock();
        let n = lookups.entry(ino).or_insert(0);
        if *n == 0 {
            if let Err(e) = self.fs.open_inode(ino) {
                (self.log)(&format!("pinning inode {ino}: {e}"));
            }
        }
        *n += 1;
    }

    fn unpin(&self, ino: u32, count: u64) {
        let last = {
            let mut lookups = self.lookups.lock();
            let Some(n) = lookups.get_mut(&ino) else { return };
            *n = n.saturating_sub(count);
            *n == 0 && lookups.remove(&ino).is_some()
        };
        if last {
            if let Err(e) = self.fs.close_inode(ino) {
                (self.log)(&format!("releasing inode {ino}: {e}"));
            }
        }
    }

    fn reply_entry(&self, st: uext4::Result<Stat>, reply: ReplyEntry) {
        match st {
            Ok(st) => {
                self.pin(st.ino);
                reply.entry(&TTL, &self.attr(&st), Generation(st.generation as u64));
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Owner of a new inode: the caller, with the group of a setgid parent.
    /// Returns it with the permission bits after the umask (and a new
    /// directory's inherited setgid bit).
    fn new_owner(
        &self,
        req: &Request,
        parent: u32,
        mode: u32,
        umask: u32,
        is_dir: bool,
    ) -> uext4::Result<(Owner, u16)> {
        let parent = self.fs.stat(parent)?;
        let mut perm = (mode & !umask & 0o7777) as u16;
        let mut gid = req.gid();
        if parent.perm & S_ISGID != 0 {
            gid = parent.gid;
            if is_dir {
                perm |= S_ISGID;
            }
        }
        Ok((Owner { uid: req.uid(), gid }, perm))
    }

    fn listing(&self, ino: u32) -> uext4::Result<Vec<Entry>> {
        Ok(self
            .fs
            .read_dir(ino)?
            .into_iter()
            .map(|e| Entry { ino: e.ino, kind: kind_of_dirent(e.file_type), name: e.name })
            .collect())
    }

    /// relatime, as the kernel's ext4 mounts by default: a read (or a listing) moves atime only
    /// when it is not newer than mtime or ctime, or is a day old.
    fn touch_atime(&self, ino: u32) {
        if self.fs.is_read_only() {
            return;
        }
        let Ok(st) = self.fs.stat(ino) else { return };
        let now = timestamp_of(SystemTime::now());
        let stale = st.atime <= st.mtime || st.atime <= st.ctime || now.sec - st.atime.sec >= 24 * 3600;
        if stale {
            let attr = SetAttr { atime: Some(now), ctime: Some(st.ctime), ..SetAttr::default() };
            if let Err(e) = self.fs.setattr(ino, &attr) {
                (self.log)(&format!("updating atime of inode {ino}: {e}"));
            }
        }
    }

    fn tunables_text(&self) -> String {
        self.fs
            .tunables()
            .iter()
            .map(|t| format!("{}={}{}\n", t.name, t.value, if t.runtime { " (runtime)" } else { "" }))
            .collect()
    }
}

impl fuser::Filesystem for Uext4Fuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Several lookups and readdirs in one directory at once: the library's
        // directory locks order them, not the kernel's per-directory mutex.
        // POSIX ACLs: the kernel then keeps mode and access ACL in step (a
        // setfacl that a mode can express changes the mode instead), and checks them.
        let wanted = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_POSIX_ACL;
        let _ = config.add_capabilities(wanted & config.capabilities());
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn destroy(&mut self) {
        let held: Vec<u32> = self.lookups.lock().drain().map(|(ino, _)| ino).collect();
        for ino in held {
            if let Err(e) = self.fs.close_inode(ino) {
                (self.log)(&format!("releasing inode {ino} at unmount: {e}"));
            }
        }
        if let Err(e) = self.fs.sync() {
            (self.log)(&format!("writing back at unmount failed: {e}"));
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = self.fs.lookup(ext_ino(parent), name.as_bytes());
        match found {
            Ok(Some(ino)) => self.reply_entry(self.fs.stat(ino), reply),
            Ok(None) => reply.error(Errno::ENOENT),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.unpin(ext_ino(ino), nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.stat(ext_ino(ino)) {
            Ok(st) => reply.attr(&TTL, &self.attr(&st)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let ino = ext_ino(ino);
        let at = |t: TimeOrNow| match t {
            TimeOrNow::Now => timestamp_of(SystemTime::now()),
            TimeOrNow::SpecificTime(t) => timestamp_of(t),
        };
        let mut perm = mode.map(|m| (m & 0o7777) as u16);
        // A chown by anyone but root drops setuid and setgid, as the kernel's does.
        if (uid.is_some() || gid.is_some()) && perm.is_none() && req.uid() != 0 {
            if let Ok(st) = self.fs.stat(ino) {
                if st.file_type == uext4::FileType::Regular && st.perm & (S_ISUID | S_ISGID) != 0 {
                    perm = Some(st.perm & !(S_ISUID | S_ISGID));
                }
            }
        }
        let attr = SetAttr {
            perm,
            uid,
            gid,
            size,
            atime: atime.map(at),
            mtime: mtime.map(at),
            ctime: ctime.map(timestamp_of),
        };
        match self.fs.setattr(ino, &attr) {
            Ok(st) => reply.attr(&TTL, &self.attr(&st)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.read_link(ext_ino(ino)) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        let parent = ext_ino(parent);
        let made = self.new_owner(req, parent, mode, umask, false).and_then(|(owner, perm)| {
            let kind = (mode & libc::S_IFMT) as u16;
            if kind == libc::S_IFREG as u16 || kind == 0 {
                return self.fs.create(parent, name.as_bytes(), perm, owner);
            }
            // The FUSE request carries the kernel's new_encode_dev form.
            let (major, minor) = ((rdev & 0xfff00) >> 8, (rdev & 0xff) | ((rdev >> 12) & 0xfff00));
            self.fs.mknod(parent, name.as_bytes(), kind | perm, (major, minor), owner)
        });
        self.reply_entry(made, reply);
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let parent = ext_ino(parent);
        let made = self
            .new_owner(req, parent, mode, umask, true)
            .and_then(|(owner, perm)| self.fs.mkdir(parent, name.as_bytes(), perm, owner));
        self.reply_entry(made, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.fs.unlink(ext_ino(parent), name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.fs.rmdir(ext_ino(parent), name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let owner = Owner { uid: req.uid(), gid: req.gid() };
        let made = self.fs.symlink(ext_ino(parent), link_name.as_bytes(), target.as_os_str().as_bytes(), owner);
        self.reply_entry(made, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let done =
            self.fs.rename(ext_ino(parent), name.as_bytes(), ext_ino(newparent), newname.as_bytes(), flags.bits());
        match done {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let made = self.fs.link(ext_ino(ino), ext_ino(newparent), newname.as_bytes());
        self.reply_entry(made, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.open_inode(ext_ino(ino)) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let ino = ext_ino(ino);
        let mut buf = vec![0u8; size as usize];
        match self.fs.read(ino, offset, &mut buf) {
            Ok(n) => {
                // Before the reply: a stat the reader makes next must see the new atime.
                self.touch_atime(ino);
                reply.data(&buf[..n]);
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let ino = ext_ino(ino);
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            // A write by someone other than root clears setuid, and setgid where it
            // means "set group ID" (group-executable), as the kernel's does.
            if let Ok(st) = self.fs.stat(ino) {
                let mut kill = S_ISUID;
                if st.perm & S_IXGRP != 0 {
                    kill |= S_ISGID;
                }
                if st.perm & kill != 0 {
                    let attr = SetAttr { perm: Some(st.perm & !kill), ..SetAttr::default() };
                    if let Err(e) = self.fs.setattr(ino, &attr) {
                        return reply.error(errno(&e));
                    }
                }
            }
        }
        match self.fs.write(ino, offset, data) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // Nothing is buffered here: data went to the image in `write`.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        match self.fs.close_inode(ext_ino(ino)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.fs.fsync(ext_ino(ino)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.listing(ext_ino(ino)) {
            Ok(entries) => {
                let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
                self.listings.lock().insert(fh, Arc::new(entries));
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let Some(entries) = self.listings.lock().get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        if offset == 0 {
            self.touch_atime(ext_ino(ino));
        }
        for (i, e) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(fuse_ino(e.ino), i as u64 + 1, e.kind, OsStr::from_bytes(&e.name)) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let Some(entries) = self.listings.lock().get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        if offset == 0 {
            self.touch_atime(ext_ino(ino));
        }
        for (i, e) in entries.iter().enumerate().skip(offset as usize) {
            // Removed since opendir: leave it out rather than fail the listing.
            let Ok(st) = self.fs.stat(e.ino) else { continue };
            let name = OsStr::from_bytes(&e.name);
            let attr = self.attr(&st);
            if reply.add(fuse_ino(e.ino), i as u64 + 1, name, &TTL, &attr, Generation(st.generation as u64)) {
                break;
            }
            // The kernel takes a lookup reference for every entry but . and ..
            if e.name != b"." && e.name != b".." {
                self.pin(e.ino);
            }
        }
        reply.ok();
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.listings.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.fs.fsync(ext_ino(ino)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.fs.statfs();
        reply.statfs(
            s.blocks,
            s.free_blocks,
            s.available_blocks,
            s.inodes,
            s.free_inodes,
            s.block_size,
            s.name_max,
            s.block_size,
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let ino = ext_ino(ino);
        if name.as_bytes() == TUNE_XATTR.as_bytes() && ino == ROOT_INO {
            let text = String::from_utf8_lossy(value);
            let result = match text.trim().split_once('=') {
                Some((key, value)) => self.fs.set_tunable(key.trim(), value.trim()),
                None => Err(uext4::Error::Invalid(format!("'{text}' is not key=value"))),
            };
            return match result {
                Ok(()) => reply.ok(),
                Err(e) => {
                    (self.log)(&format!("tune: {e}"));
                    reply.error(errno(&e))
                }
            };
        }
        match self.fs.set_xattr(ino, name.as_bytes(), value, flags as u32) {
            Ok(()) => reply.ok(),
            Err(uext4::Error::NotFound(_)) => reply.error(Errno::NO_XATTR),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let ino = ext_ino(ino);
        let value = if name.as_bytes() == TUNABLES_XATTR.as_bytes() && ino == ROOT_INO {
            Ok(Some(self.tunables_text().into_bytes()))
        } else {
            self.fs.get_xattr(ino, name.as_bytes())
        };
        match value {
            Ok(Some(v)) => sized_reply(reply, size, &v),
            Ok(None) => reply.error(Errno::NO_XATTR),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.fs.xattrs(ext_ino(ino)) {
            Ok(attrs) => {
                let mut names = Vec::new();
                for (name, _) in attrs {
                    names.extend_from_slice(&name);
                    names.push(0);
                }
                sized_reply(reply, size, &names)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.fs.remove_xattr(ext_ino(ino), name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(uext4::Error::NotFound(_)) => reply.error(Errno::NO_XATTR),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Permission checks are the kernel's (default_permissions); this only
        // answers whether the inode exists.
        match self.fs.stat(ext_ino(ino)) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let parent = ext_ino(parent);
        let made = self
            .new_owner(req, parent, mode, umask, false)
            .and_then(|(owner, perm)| self.fs.create(parent, name.as_bytes(), perm, owner))
            .and_then(|st| self.fs.open_inode(st.ino).map(|()| st));
        match made {
            Ok(st) => {
                self.pin(st.ino);
                let gen = Generation(st.generation as u64);
                reply.created(&TTL, &self.attr(&st), gen, FileHandle(0), FopenFlags::empty());
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self.fs.fallocate(ext_ino(ino), offset, length, mode as u32) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn lseek(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        let data = match whence {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return reply.error(Errno::EINVAL),
        };
        if offset < 0 {
            return reply.error(Errno::ENXIO);
        }
        match self.fs.seek_data_or_hole(ext_ino(ino), offset as u64, data) {
            Ok(Some(at)) => reply.offset(at as i64),
            Ok(None) => reply.error(Errno::ENXIO),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

/// getxattr/listxattr: size 0 asks how big; too small a buffer is ERANGE.
fn sized_reply(reply: ReplyXattr, size: u32, value: &[u8]) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(value);
    }
}
