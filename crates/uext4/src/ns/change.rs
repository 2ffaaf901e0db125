//! Changing the namespace: create, mknod, mkdir, symlink, link, unlink, rmdir and
//! setattr — the inode-level API a FUSE low-level frontend calls. File data
//! (write, truncate, fallocate) is the file layer's (`file`).
//!
//! Locks, in docs/ARCHITECTURE.md's order: the parent directory's lock and, under
//! pdirops, the name's slot (`ns::pdirops`), then the inode locks in ascending
//! inode number (the parent's shared, every inode changed exclusive), then the
//! transaction handle, then the structure lock of every directory whose blocks
//! change (read for a change inside one leaf under pdirops, else write until its
//! inode is written), the parent's attribute lock last. A directory takes a new
//! name only while linked, checked under its inode lock. Every change runs in one handle and checks everything that
//! can refuse it (names, limits, space, what it will free) before its first
//! `tx.dirty`: a handle that fails after that aborts the journal (see
//! journal/handle.rs). Directories of every kind are changed through `dir`
//! (linear and htree) and `inline` (in place while they fit, else moved to a block).

use crate::error::{Error, Result};
use crate::format::dirent::{self, file_type_from_mode, EXT4_FT_DIR};
use crate::format::inode::*;
use crate::fs::Filesystem;
use crate::journal::handle::Handle;
use crate::locks::Mode;
use crate::ns::inode_flags;
use crate::ns::Stat;
use std::sync::Arc;

/// Worst-case new blocks for one name: a directory block or leaf split, index
/// splits and a root push-down, and extent-tree node splits for the new block.
pub(crate) const NAME_SPACE_BLOCKS: u64 = 16;

/// More links than this and a directory's count is parked at 1 (dir_nlink).
pub(crate) const EXT4_LINK_MAX: u16 = 65000;

/// A directory gains a subdirectory: its link count goes up, and past
/// `EXT4_LINK_MAX` (or from a count already parked at 1) it is parked at 1, as
/// the kernel's ext4_inc_count does; e2fsck then wants 1 for a directory with
/// more than 65,000 links.
pub(crate) fn inc_dir_links(dir: &mut Inode) {
    dir.i_links_count = match dir.i_links_count {
        1 => 1,
        n if n >= EXT4_LINK_MAX => 1,
        n => n + 1,
    };
}

/// A new device node's one link and its numbers, (major, minor): they live in
/// i_block (old 16-bit form in the first word, new form in the second), which
/// holds no extent root.
pub(crate) fn init_device_inode(i: &mut Inode, (major, minor): (u32, u32)) {
    i.i_links_count = 1;
    i.i_flags = 0;
    i.i_block = [0; 60];
    let new = (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12);
    if major < 256 && minor < 256 {
        i.i_block[..4].copy_from_slice(&((major << 8) | minor).to_le_bytes());
    } else {
        i.i_block[4..8].copy_from_slice(&new.to_le_bytes());
    }
}

/// The time the library stamps changes with (the precise wall clock, or the
/// time `clock::set_fixed_time` fixed).
pub fn now() -> Timestamp {
    let (sec, nsec) = crate::clock::precise();
    Timestamp { sec, nsec }
}

pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    // As the kernel's path walk answers: an empty name names nothing, and '.'
    // and '..' always exist.
    if name.is_empty() {
        return Err(Error::NotFound("an empty name".into()));
    }
    if name == b"." || name == b".." {
        return Err(Error::Exists(format!("'{}' cannot be created", String::from_utf8_lossy(name))));
    }
    if name.len() > dirent::EXT4_NAME_LEN {
        return Err(Error::NameTooLong(format!("name of {} bytes is longer than 255", name.len())));
    }
    if name.contains(&b'/') || name.contains(&0) {
        return Err(Error::Invalid("a name may not contain '/' or NUL".into()));
    }
    Ok(())
}

impl Filesystem {
    #[doc(hidden)]
    /// A time as this filesystem stores it, as the kernel's timestamp_truncate
    /// gives it: inodes big enough for the `_extra` words (the kernel asks the
    /// inode size, not each inode's i_extra_isize) range to 2446 in nanoseconds,
    /// smaller ones to 2038 in whole seconds.
    pub fn timestamp_truncate(&self, t: Timestamp) -> Timestamp {
        const ATIME_EXTRA_END: usize = 0x90;
        t.clamp(self.vol.geo.inode_size >= ATIME_EXTRA_END)
    }
}

pub use crate::alloc::Owner;

impl Filesystem {
    pub(crate) fn new_inode(&self, mode: u16, owner: Owner) -> Inode {
        let extra = if self.vol.geo.inode_size > 128 { 32 } else { 0 };
        let mut i = Inode::new(self.vol.geo.inode_size, extra);
        // From the clock that stamps its directory (`touch_dir`), so a new
        // name is never newer than the change of its directory that made it.
        let (sec, nsec) = crate::clock::coarse();
        let t = Timestamp { sec, nsec };
        let (_, precise_nsec) = crate::clock::precise();
        i.i_mode = mode;
        i.i_uid = owner.uid;
        i.i_gid = owner.gid;
        (i.i_atime, i.i_ctime, i.i_mtime) = (t, t, t);
        if extra > 0 {
            i.i_crtime = Some(t);
        }
        i.i_generation = (precise_nsec ^ (t.sec as u32).rotate_left(13)).wrapping_mul(2_654_435_761);
        // As the kernel's ext4_new_inode: extent-mapped where the filesystem has
        // extents, else an empty block map (extent/indirect.rs).
        if self.vol.geo.has_extents {
            i.i_block = Self::empty_extent_root();
            i.i_flags = EXT4_EXTENTS_FL;
        }
        i
    }

    /// A directory that an rmdir or a rename over it removed while the caller
    /// waited for its locks takes no new names (the kernel's IS_DEADDIR check:
    /// ENOENT). The caller holds the directory's inode lock, which every removal
    /// holds while it checks that the directory is empty and unlinks it, so the
    /// answer stays true until the caller's change is made.
    ///
    /// A caller holding a stale number may find it reused by then: the directory
    /// was removed and freed, and the number handed to a new file, which has
    /// links. That is the same removed directory (ENOENT), never a place for a
    /// name (remove_tree's racing creates put entries into such a file).
    /// Returns the directory's inode as it is under that lock.
    pub(crate) fn require_live_dir(&self, dir: u32) -> Result<Arc<Inode>> {
        let inode = self.inode(dir)?;
        if inode.i_links_count == 0 || !inode.is_dir() {
            return Err(Self::removed_dir_error(dir));
        }
        Ok(inode)
    }

    /// Stamps a directory whose names changed. From the coarse clock, as the
    /// kernel's `current_time` does: many changes within one tick then find
    /// the directory's times already right, and `update_dir_attrs` leaves its
    /// inode alone instead of writing it again (under pdirops the directory
    /// inode was the one block that every change of names wrote).
    ///
    /// Never backwards: a ctime stamped from the precise clock (a setattr, the
    /// directory's own rename) may lie inside the current tick, and then the
    /// precise clock stamps it, as the kernel's multigrain ctime does.
    pub(crate) fn touch_dir(inode: &mut Inode) {
        let (sec, nsec) = crate::clock::coarse();
        let mut t = Timestamp { sec, nsec };
        if t < inode.i_ctime {
            t = now();
            if t < inode.i_ctime {
                t = inode.i_ctime;
            }
        }
        inode.i_mtime = t;
        inode.i_ctime = t;
    }

    /// Creates a name in `parent` for a new inode built by `init` (which allocates
    /// at most `init_blocks` blocks); returns the new inode's attributes. A caller
    /// that has not said who it is (`acting_as`) acts as the new inode's owner.
    fn create_node(
        &self,
        parent: u32,
        name: &[u8],
        mode: u16,
        owner: Owner,
        init_blocks: u64,
        init: &dyn Fn(&Self, &mut Handle, u32, &mut Inode) -> Result<()>,
    ) -> Result<Stat> {
        check_name(name)?;
        let _caller = crate::alloc::acting_as_unless_set(owner);
        let is_dir = mode & S_IFMT == S_IFDIR;
        let names = self.lock_names(&[(parent, name)])?;
        let _subdir_links = is_dir.then(|| self.lock_subdir_links(parent)).flatten();
        // The lookup refuses a parent that is no directory (NotADirectory).
        if self.lookup_held(parent, name)?.is_some() {
            return Err(Error::Exists(String::from_utf8_lossy(name).into_owned()));
        }
        // The parent's inode lock, shared, comes before the handle (see
        // journal/handle.rs); its removal holds it exclusive.
        let _parent_lock = self.inode_locks.read(parent as u64);
        // One look at the parent for every check (its inode is shared by every
        // change of its names: each look meets the others' on one cache line).
        let parent_inode = self.require_live_dir(parent)?;
        inode_flags::refuse_if_immutable(parent, &parent_inode, "creating a name")?;
        if is_dir {
            self.refuse_at_dir_link_max(parent)?;
        }
        let _space = self.ensure_space_for_name(parent, name, init_blocks)?;
        let request = self.inode_request(parent, &parent_inode, name, is_dir)?;
        let mut tx = self.begin(8)?;
        let (ino, _inode_lock) = self.alloc_inode_locked(&mut tx, &request)?;
        let mut inode = self.new_inode(mode, owner);
        init(self, &mut tx, ino, &mut inode)?;
        self.write_inode(&mut tx, ino, &inode)?;
        let entry = (name, ino, file_type_from_mode(mode));
        self.add_name(&mut tx, parent, names.parallel(parent), entry, &|dir| {
            Self::touch_dir(dir);
            if is_dir {
                inc_dir_links(dir);
            }
        })?;
        tx.finish()?;
        self.stat(ino)
    }

    /// Allocates an inode for a new file under `tx` and takes its lock. That lock
    /// comes after the handle, against the lock order, so it is never waited for:
    /// the lock of an inode that was free is held only by a caller with a stale
    /// inode number, who may be waiting to begin a handle — that is, for this
    /// handle's transaction to close — or by a `remove_tree` batch that freed
    /// it in a handle still open (up to `BATCH_NAMES` at once). Such an inode is
    /// passed over (kept taken until another is found, then given back).
    ///
    /// # Errors
    /// `NoSpace` without a free inode; `Busy` when many in a row are locked.
    pub(crate) fn alloc_inode_locked(
        &self,
        tx: &mut Handle,
        request: &crate::alloc::InodeRequest,
    ) -> Result<(u32, crate::locks::RwHeld<'_>)> {
        const TRIES: usize = 16 + crate::ns::remove_tree::BATCH_NAMES;
        let is_dir = request.is_dir;
        let mut passed_over = Vec::new();
        let mut found = None;
        for _ in 0..TRIES {
            let ino = self.alloc.alloc_inode_for(tx, request)?;
            match self.inode_locks.try_write(ino as u64) {
                Some(held) => {
                    found = Some((ino, held));
                    break;
                }
                None => passed_over.push(ino),
            }
        }
        for ino in passed_over {
            self.alloc.free_inode(tx, ino, is_dir)?;
        }
        found.ok_or_else(|| Error::Busy(format!("{TRIES} free inodes in a row are locked by callers")))
    }

    /// Refuses, before any change, a new `name` in `dir` plus `blocks` more that the
    /// disk cannot hold: the name's worst case while space is plentiful; on a
    /// nearly full disk only what it needs (nothing when it fits in the directory
    /// as it is, so an empty file can still be made, as with the kernel).
    /// The blocks are promised to the caller while the returned guard lives.
    pub(crate) fn ensure_space_for_name(
        &self,
        dir: u32,
        name: &[u8],
        blocks: u64,
    ) -> Result<Option<crate::alloc::Reservation<'_>>> {
        if let Ok(promise) = self.alloc.ensure_space(NAME_SPACE_BLOCKS + blocks) {
            return Ok(Some(promise));
        }
        let dir_inode = self.inode(dir)?;
        let needed = match self.entry_needs_block(dir, &dir_inode, name)? {
            true => NAME_SPACE_BLOCKS + blocks,
            false => blocks,
        };
        if needed > 0 {
            return Ok(Some(self.alloc.ensure_space(needed)?));
        }
        Ok(None)
    }

    /// Creates an empty regular file.
    ///
    /// # Errors
    /// `Exists` when `name` is taken; `NotFound` when `parent` is gone; `NotADirectory` when `parent`
    /// is not a directory; `NameTooLong` past 255 bytes; `NoSpace` when no inode or block is left;
    /// `ReadOnly` on a read-only or failed filesystem; `Corrupt` when what it reads is damaged.
    pub fn create(&self, parent: u32, name: &[u8], perm: u16, owner: Owner) -> Result<Stat> {
        self.create_node(parent, name, S_IFREG | (perm & 0o7777), owner, 0, &|fs, _, ino, i| {
            i.i_links_count = 1;
            fs.may_inline_mark(ino);
            Ok(())
        })
    }

    /// Creates a regular file with no name (the kernel's O_TMPFILE): it starts
    /// with no links, on the orphan list, and open once for the caller, who
    /// closes it with [`Filesystem::close_inode`]; the last close frees it, and
    /// so does the next open after a crash. While it is open and `linkable`
    /// (O_TMPFILE without O_EXCL), [`Filesystem::link`] may give it a name,
    /// which takes it off the orphan list. `dir` only says where it is placed;
    /// its times do not change.
    ///
    /// # Errors
    /// `NotFound` when `dir` is gone; `NotADirectory`; `NoSpace` without a free
    /// inode; `ReadOnly`, `Corrupt` as for [`Filesystem::create`].
    pub fn create_tmpfile(&self, dir: u32, perm: u16, owner: Owner, linkable: bool) -> Result<Stat> {
        let _caller = crate::alloc::acting_as_unless_set(owner);
        self.require_dir(dir)?;
        let _dir_lock = self.inode_locks.read(dir as u64);
        let dir_inode = self.require_live_dir(dir)?;
        let _space = self.alloc.ensure_space(0)?;
        let request = self.inode_request(dir, &dir_inode, b"", false)?;
        let mut tx = self.begin(6)?;
        let (ino, _inode_lock) = self.alloc_inode_locked(&mut tx, &request)?;
        let mut inode = self.new_inode(S_IFREG | (perm & 0o7777), owner);
        inode.i_links_count = 0;
        self.orphan_add(&mut tx, ino, &mut inode)?;
        self.write_inode(&mut tx, ino, &inode)?;
        tx.finish()?;
        // Open before the inode lock goes: nothing may see it unlinked and unheld.
        *self.open_files.shard(ino).entry(ino).or_insert(0) += 1;
        if linkable {
            self.linkable.lock().insert(ino);
        }
        self.stat(ino)
    }

    /// Creates a fifo, socket or device node; `rdev` is (major, minor).
    ///
    /// # Errors
    /// As [`Filesystem::create`].
    pub fn mknod(&self, parent: u32, name: &[u8], mode: u16, rdev: (u32, u32), owner: Owner) -> Result<Stat> {
        let kind = mode & S_IFMT;
        // The kernel's may_mknod: a directory is EPERM, a regular file is made.
        if kind == S_IFDIR {
            return Err(Error::NotPermitted("mknod cannot make a directory (use mkdir)".into()));
        }
        if kind == S_IFREG {
            return self.create(parent, name, mode & 0o7777, owner);
        }
        if ![S_IFIFO, S_IFSOCK, S_IFCHR, S_IFBLK].contains(&kind) {
            return Err(Error::Invalid(format!("mknod of mode {mode:#o}")));
        }
        self.create_node(parent, name, mode, owner, 0, &|_, _, _, i| {
            init_device_inode(i, rdev);
            Ok(())
        })
    }

    /// The lock that keeps `dir`'s link limit whole while a subdirectory comes
    /// in (level 2c): without dir_nlink, a change holding `dir` only shared
    /// (pdirops) would check the limit beside another that then takes the last
    /// link, and both would get in. With dir_nlink the limit applies only to an
    /// unindexed directory, whose changes hold it exclusive already.
    pub(crate) fn lock_subdir_links(&self, dir: u32) -> Option<crate::locks::Held<'_>> {
        let dir_nlink = self.vol.sb.read().has_ro_compat(crate::format::superblock::RO_COMPAT_DIR_NLINK);
        (!dir_nlink).then(|| self.subdir_link_locks.lock(dir as u64))
    }

    /// EMLINK when `dir` cannot take another subdirectory: at 65,000 links,
    /// unless the image has dir_nlink and `dir` is indexed (then its count
    /// parks at 1), as the kernel's EXT4_DIR_LINK_MAX says.
    pub(crate) fn refuse_at_dir_link_max(&self, dir: u32) -> Result<()> {
        let inode = self.inode(dir)?;
        let parks =
            self.vol.sb.read().has_ro_compat(crate::format::superblock::RO_COMPAT_DIR_NLINK) && self.is_indexed(&inode);
        match inode.i_links_count >= EXT4_LINK_MAX && !parks {
            true => Err(Error::TooManyLinks(format!("directory inode {dir} has {} links", inode.i_links_count))),
            false => Ok(()),
        }
    }

    /// Creates a directory holding `.` and `..`.
    ///
    /// # Errors
    /// As [`Filesystem::create`]; `TooManyLinks` when `parent` is at ext4's link limit.
    pub fn mkdir(&self, parent: u32, name: &[u8], perm: u16, owner: Owner) -> Result<Stat> {
        self.create_node(parent, name, S_IFDIR | (perm & 0o7777), owner, 1, &|fs, tx, ino, i| {
            i.i_links_count = 2;
            if fs.init_inline_dir(ino, i, parent)? {
                return Ok(());
            }
            let bs = fs.vol.geo.block_size;
            let (blk, _) = fs.alloc.alloc_blocks(tx, fs.inode_goal(ino, false), 1)?;
            fs.vol.cache.classify(blk, crate::dev::IoClass::Directory);
            let buf = fs.vol.cache.get_new(blk);
            {
                let mut data = buf.write();
                let tail = if fs.vol.geo.metadata_csum { dirent::DIRENT_TAIL_LEN } else { 0 };
                let ft = if fs.vol.geo.has_filetype { EXT4_FT_DIR } else { 0 };
                dirent::write_entry(&mut data, 0, ino, 12, ft, b".", bs);
                dirent::write_entry(&mut data, 12, parent, bs - 12 - tail, ft, b"..", bs);
                if fs.vol.geo.metadata_csum {
                    dirent::set_tail(&mut data, fs.inode_seed(ino, i));
                }
            }
            tx.dirty(&buf);
            fs.extent_append(tx, ino, i, 0, blk, 1)?;
            i.i_size = bs as u64;
            Ok(())
        })
    }

    /// A symlink: the target in i_block when shorter than 60 bytes, else in a block.
    /// Never inline on inline_data images, though issue 19 asked for it: the kernel
    /// (6.18) makes no inline symlinks either (an 80-byte target gets a block), and
    /// uext4 follows the kernel. e2fsprogs' inline symlinks are read (`read_link`).
    ///
    /// # Errors
    /// As [`Filesystem::create`].
    pub fn symlink(&self, parent: u32, name: &[u8], target: &[u8], owner: Owner) -> Result<Stat> {
        if target.is_empty() {
            return Err(Error::NotFound("an empty symlink target".into()));
        }
        // The target and its NUL must fit in one block (the kernel's ext4_symlink).
        if target.len() >= self.vol.geo.block_size {
            return Err(Error::NameTooLong(format!("symlink target of {} bytes", target.len())));
        }
        let blocks = (target.len() >= 60) as u64;
        self.create_node(parent, name, S_IFLNK | 0o777, owner, blocks, &|fs, tx, ino, i| {
            i.i_links_count = 1;
            i.i_size = target.len() as u64;
            if target.len() < 60 {
                i.i_flags = 0;
                i.i_block = [0; 60];
                i.i_block[..target.len()].copy_from_slice(target);
                return Ok(());
            }
            let (blk, _) = fs.alloc.alloc_blocks(tx, fs.inode_goal(ino, false), 1)?;
            let mut data = vec![0u8; fs.vol.geo.block_size];
            data[..target.len()].copy_from_slice(target);
            fs.vol.cache.write_data_at(blk * fs.vol.geo.block_size as u64, &data)?;
            fs.extent_append(tx, ino, i, 0, blk, 1)
        })
    }

    /// A new name for an existing non-directory inode.
    ///
    /// # Errors
    /// `Exists` when `name` is taken; `NotPermitted` for a directory; `TooManyLinks` at ext4's link
    /// limit; `NotFound`, `NotADirectory`, `NameTooLong`, `NoSpace`, `ReadOnly`, `Corrupt` as for
    /// [`Filesystem::create`].
    pub fn link(&self, ino: u32, parent: u32, name: &[u8]) -> Result<Stat> {
        check_name(name)?;
        let names = self.lock_names(&[(parent, name)])?;
        self.require_dir(parent)?;
        if self.lookup_held(parent, name)?.is_some() {
            return Err(Error::Exists(String::from_utf8_lossy(name).into_owned()));
        }
        let _inode_locks = self.inode_locks.lock_modes(&[(parent as u64, Mode::Shared), (ino as u64, Mode::Exclusive)]);
        let mut inode = (*self.inode(ino)?).clone();
        if inode.is_dir() {
            return Err(Error::NotPermitted("hard links to directories are not allowed".into()));
        }
        // Unlinked but still open: it is an orphan and stays one (the kernel's
        // vfs_link refuses it the same way), unless it was made without a name
        // to be given one (O_TMPFILE, I_LINKABLE).
        let from_tmpfile = inode.i_links_count == 0 && self.is_open(ino) && self.linkable.lock().contains(&ino);
        if inode.i_links_count == 0 && !from_tmpfile {
            return Err(Error::NotFound(format!("inode {ino} has been unlinked")));
        }
        self.require_changeable(ino, &inode)?;
        if inode.i_links_count >= EXT4_LINK_MAX {
            return Err(Error::TooManyLinks(format!("inode {ino} already has {} links", inode.i_links_count)));
        }
        inode_flags::refuse_if_pinned(ino, &inode, "linking")?;
        self.require_live_dir(parent)?;
        inode_flags::refuse_if_immutable(parent, &*self.inode(parent)?, "linking into")?;
        let _space = self.ensure_space_for_name(parent, name, 0)?;
        let mut tx = self.begin(6)?;
        let entry = (name, ino, file_type_from_mode(inode.i_mode));
        self.add_name(&mut tx, parent, names.parallel(parent), entry, &Self::touch_dir)?;
        if from_tmpfile {
            self.orphan_remove(&mut tx, ino, &mut inode)?;
        }
        inode.i_links_count += 1;
        inode.i_ctime = now();
        self.write_inode(&mut tx, ino, &inode)?;
        tx.finish()?;
        if from_tmpfile {
            self.linkable.lock().remove(&ino);
        }
        self.stat(ino)
    }

    /// Removes a name of a non-directory; the inode is freed with its last link.
    ///
    /// # Errors
    /// `NotFound` when there is no such name; `IsADirectory` for a directory (use
    /// [`Filesystem::rmdir`]); `ReadOnly`, `Corrupt` as for [`Filesystem::create`].
    pub fn unlink(&self, parent: u32, name: &[u8]) -> Result<()> {
        self.remove_name(parent, name, false, None)
    }

    /// Removes an empty directory.
    ///
    /// # Errors
    /// `NotFound` when there is no such name; `NotADirectory` for a non-directory; `NotEmpty` when it
    /// holds entries; `Busy` for `.` or `..`; `ReadOnly`, `Corrupt` as for [`Filesystem::create`].
    pub fn rmdir(&self, parent: u32, name: &[u8]) -> Result<()> {
        self.remove_name(parent, name, true, None)
    }

    /// Unlink or rmdir of `name`; with `expect`, only while the name still names
    /// that inode (else `NotFound`: remove_tree never removes what replaced it).
    pub(crate) fn remove_name(&self, parent: u32, name: &[u8], want_dir: bool, expect: Option<u32>) -> Result<()> {
        // The errno the kernel's do_unlinkat and do_rmdir give for these names.
        if name == b"." || name == b".." {
            let what = format!("cannot remove '{}'", String::from_utf8_lossy(name));
            return Err(match (want_dir, name) {
                (false, _) => Error::IsADirectory(what),
                (true, b".") => Error::Invalid(what),
                (true, _) => Error::NotEmpty(what),
            });
        }
        let names = self.lock_names(&[(parent, name)])?;
        let shown = || String::from_utf8_lossy(name).into_owned();
        // The lookup refuses a parent that is no directory (NotADirectory).
        let (ino, at) = self.lookup_held_at(parent, name, None)?.ok_or_else(|| Error::NotFound(shown()))?;
        if expect.is_some_and(|e| e != ino) {
            return Err(Error::NotFound(format!("{} now names another inode", shown())));
        }
        // The removed inode exclusive: for a directory, creates in it hold it
        // shared, so it stays empty from the check below to its removal.
        let _inode_locks = self.inode_locks.lock_modes(&[(parent as u64, Mode::Shared), (ino as u64, Mode::Exclusive)]);
        let mut inode = (*self.inode(ino)?).clone();
        match (want_dir, inode.is_dir()) {
            (true, false) => return Err(Error::NotADirectory(shown())),
            (false, true) => return Err(Error::IsADirectory(format!("{} (use rmdir)", shown()))),
            _ => {}
        }
        inode_flags::refuse_if_pinned(parent, &*self.inode(parent)?, &format!("removing {}", shown()))?;
        inode_flags::refuse_if_pinned(ino, &inode, &format!("removing {}", shown()))?;
        // As the kernel's ext4_empty_dir: a directory shorter than one block cannot
        // be shown empty (its entries may lie past i_size); it is corrupt.
        if want_dir && !inode.has_flag(EXT4_INLINE_DATA_FL) && inode.i_size < self.vol.geo.block_size as u64 {
            return Err(Error::corrupt(
                format!("directory of {} bytes is shorter than one block", inode.i_size),
                format!("directory inode {ino}"),
            ));
        }
        if want_dir {
            let entries = self.read_dir(ino)?;
            if !Self::only_dot_entries(ino, &entries) {
                return Err(Error::NotEmpty(shown()));
            }
            // A directory named from elsewhere than its parent (a hard link to a
            // directory, which the kernel never makes) would leave that parent's
            // link count wrong and the other name dangling.
            let dotdot = entries.iter().find(|e| e.name == b"..").map_or(0, |e| e.ino);
            if dotdot != parent {
                return Err(Error::corrupt(
                    format!("'..' names inode {dotdot}, not the parent {parent} it is removed from"),
                    format!("directory inode {ino}"),
                ));
            }
        }
        if want_dir || inode.i_links_count <= 1 {
            self.check_releasable(ino, &inode)?;
        }
        let mut tx = self.begin(10)?;
        // The parent's blocks change (under pdirops only its leaf: a read hold);
        // a removed directory's are freed: readers of either wait, then find the
        // name gone or the directory removed.
        let parallel = names.parallel(parent);
        let mut structure = vec![(parent as u64, if parallel { Mode::Shared } else { Mode::Exclusive })];
        if want_dir {
            structure.push((ino as u64, Mode::Exclusive));
        }
        let _structure = self.dir_structure.lock_modes(&structure);
        let parent_inode = self.inode(parent)?;
        self.remove_entry_near(&mut tx, parent, &parent_inode, name, at)?;
        self.update_dir_attrs(&mut tx, parent, None, &|dir| {
            Self::touch_dir(dir);
            if want_dir && dir.i_links_count > 2 {
                dir.i_links_count -= 1;
            }
        })?;
        inode.i_ctime = now();
        inode.i_links_count = if want_dir { 0 } else { inode.i_links_count.saturating_sub(1) };
        if inode.i_links_count == 0 {
            if !self.is_open(ino) {
                // release_inode writes the slot itself.
                self.release_inode(&mut tx, ino, &mut inode)?;
                return tx.finish();
            }
            // Still open: freed on the last close, or after a crash at the next
            // open, from the orphan record this handle makes with the unlink.
            self.orphan_add(&mut tx, ino, &mut inode)?;
        }
        self.write_inode(&mut tx, ino, &inode)?;
        tx.finish()
    }

    /// Reads and checks everything `release_inode` would free (extent tree or block
    /// map, xattr block), so that damage there refuses the change before any name
    /// is removed.
    pub(crate) fn check_releasable(&self, ino: u32, inode: &Inode) -> Result<()> {
        if inode.has_flag(EXT4_EXTENTS_FL) {
            self.collect_extents(ino, inode)?;
        } else if self.has_block_map(inode) {
            self.ind_check_releasable(ino, inode)?;
        }
        if inode.i_file_acl != 0 {
            self.xattr_block(ino, inode.i_file_acl)?;
            self.alloc.check_blocks_in_use(&[(inode.i_file_acl, 1)], &|| format!("xattr block of inode {ino}"))?;
        }
        Ok(())
    }

    /// Frees an unlinked inode's blocks and its number, and writes its slot
    /// (no links, dtime set): callers need not write it again.
    pub(crate) fn release_inode(&self, tx: &mut Handle, ino: u32, inode: &mut Inode) -> Result<()> {
        self.may_inline_forget(ino);
        if inode.has_flag(EXT4_EXTENTS_FL) || self.has_block_map(inode) {
            self.free_all_extents(tx, ino, inode)?;
        }
        self.release_xattr_block(tx, ino, inode)?;
        inode.i_dtime = now().sec as u32;
        inode.i_size = 0;
        // The slot says "no links" before its bit says "free": an allocation in
        // another thread that takes the bit at once must find a dead slot
        // (allocation refuses a free bit over a live slot as corruption).
        self.write_inode(tx, ino, inode)?;
        self.alloc.free_inode(tx, ino, inode.is_dir())
    }
}

/// Attribute changes for `setattr`; `None` leaves a field as it is.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    /// Permission bits (mode & 0o7777).
    pub perm: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Timestamp>,
    pub mtime: Option<Timestamp>,
    /// Set explicitly; otherwise any change sets ctime to now, as the kernel does.
    pub ctime: Option<Timestamp>,
}

impl Filesystem {
    /// Changes mode, owner, size or times. Shrinking frees the blocks past the new
    /// end; growing only moves i_size (the new range reads as a hole).
    ///
    /// # Errors
    /// `NotFound` for an inode not in use; `FileTooLarge` for a size past ext4's largest file;
    /// `NoSpace` when shrinking needs an extent-tree block none is left for; `ReadOnly`, `Corrupt` as
    /// for [`Filesystem::create`].
    pub fn setattr(&self, ino: u32, attr: &SetAttr) -> Result<Stat> {
        let st = self.setattr_keeping_acl(ino, attr)?;
        // As ext4_setattr, after the inode's own change: an access ACL follows
        // the new mode, or a chmod would leave named entries their old reach.
        if attr.perm.is_some() {
            self.chmod_access_acl(ino, st.perm)?;
        }
        Ok(st)
    }

    /// `setattr` without bringing an access ACL in line with a new mode: for
    /// setting the ACL itself, which sets the mode from it.
    pub(crate) fn setattr_keeping_acl(&self, ino: u32, attr: &SetAttr) -> Result<Stat> {
        // utimensat(2)'s rule: nanoseconds are below a second.
        if let Some(t) = [attr.atime, attr.mtime, attr.ctime].into_iter().flatten().find(|t| t.nsec >= 1_000_000_000) {
            return Err(Error::Invalid(format!("a time of {} s and {} ns: nanoseconds past a second", t.sec, t.nsec)));
        }
        let _lock = self.inode_locks.write(ino as u64);
        {
            let inode = self.inode(ino)?;
            self.require_changeable(ino, &inode)?;
            if attr.perm.is_some() || attr.uid.is_some() || attr.gid.is_some() || attr.size.is_some() {
                inode_flags::refuse_if_pinned(ino, &inode, "setattr")?;
            }
            if attr.mtime.is_some() {
                inode_flags::refuse_if_immutable(ino, &inode, "setting mtime")?;
            }
        }
        if let Some(size) = attr.size {
            // Refused before anything changes.
            self.check_truncate(ino, size)?;
        }
        let mut tx = self.begin(8)?;
        let mut inode = (*self.inode(ino)?).clone();
        // An inline file keeps its size change in place while it fits (inline/file.rs).
        let size_done = match attr.size {
            Some(size) => self.truncate_inline(ino, &mut inode, size)?,
            None => true,
        };
        if !size_done {
            self.uninline(&mut tx, ino)?;
            inode = (*self.inode(ino)?).clone();
        }
        if let Some(p) = attr.perm {
            inode.i_mode = (inode.i_mode & S_IFMT) | (p & 0o7777);
        }
        if let Some(u) = attr.uid {
            inode.i_uid = u;
        }
        if let Some(g) = attr.gid {
            inode.i_gid = g;
        }
        if let (Some(size), false) = (attr.size, size_done) {
            self.truncate_data(&mut tx, ino, &mut inode, size)?;
        }
        if attr.size.is_some() && size_done {
            inode.i_mtime = now();
        }
        if let Some(t) = attr.atime {
            inode.i_atime = self.timestamp_truncate(t);
        }
        if let Some(t) = attr.mtime {
            inode.i_mtime = self.timestamp_truncate(t);
        }
        inode.i_ctime = self.timestamp_truncate(attr.ctime.unwrap_or_else(now));
        self.write_inode(&mut tx, ino, &inode)?;
        tx.finish()?;
        self.stat(ino)
    }
}

#[cfg(test)]
mod tests {
    use crate::dev::MemDevice;
    use crate::mkfs::{make, MkfsOptions};
    use crate::{Filesystem, Options, Owner, ROOT_INO};
    use std::sync::Arc;
    use std::time::Duration;

    /// A directory's times never go back, and a new name is never newer than
    /// the change of its directory that made it (the kernel's, seen from
    /// user space: the helper's `mkdir d; stat; touch d/f; stat` went back
    /// 199 times in 200 when new inodes took the precise clock and
    /// directories the coarse one).
    #[test]
    fn directory_times_never_go_back_and_are_never_older_than_a_new_child() {
        let dev = Arc::new(MemDevice::new(vec![0u8; 16 << 20]));
        make(dev.as_ref(), &MkfsOptions { size: 16 << 20, ..MkfsOptions::default() }, true).unwrap();
        let fs = Filesystem::open_device(dev, Options { read_only: false, ..Options::default() }).unwrap();
        let root = Owner { uid: 0, gid: 0 };
        for i in 0..200 {
            let d = fs.mkdir(ROOT_INO, format!("d{i}").as_bytes(), 0o755, root).unwrap();
            // A chmod stamps ctime from the precise clock, inside the current tick.
            let d = fs.setattr(d.ino, &crate::SetAttr { perm: Some(0o700), ..Default::default() }).unwrap();
            let f = fs.create(d.ino, b"f", 0o644, root).unwrap();
            let after = fs.stat(d.ino).unwrap();
            assert!(after.ctime >= d.ctime, "round {i}: directory ctime went back: {:?} -> {:?}", d.ctime, after.ctime);
            assert!(
                after.mtime >= f.mtime,
                "round {i}: directory mtime {:?} older than its new file's {:?}",
                after.mtime,
                f.mtime
            );
        }
    }

    /// A library caller holding the lock of a stale (free) inode number, perhaps
    /// waiting to begin a handle, must not stall a create that draws that number:
    /// the create would hold its handle open while waiting for the lock.
    #[test]
    fn a_create_passes_over_a_free_inode_whose_lock_a_stale_caller_holds() {
        let dev = Arc::new(MemDevice::new(vec![0u8; 16 << 20]));
        make(dev.as_ref(), &MkfsOptions { size: 16 << 20, ..MkfsOptions::default() }, true).unwrap();
        let fs = Arc::new(Filesystem::open_device(dev, Options { read_only: false, ..Options::default() }).unwrap());
        let owner = Owner { uid: 0, gid: 0 };
        let first = fs.create(ROOT_INO, b"first", 0o644, owner).unwrap().ino;
        // Inodes are handed out in order from the parent's group: the next is free.
        let next = first + 1;
        let stale = fs.inode_locks.write(next as u64);
        let (done, result) = std::sync::mpsc::channel();
        let creator = fs.clone();
        std::thread::spawn(move || done.send(creator.create(ROOT_INO, b"second", 0o644, owner)).unwrap());
        let second = result
            .recv_timeout(Duration::from_secs(20))
            .expect("the create waited for the lock of a free inode")
            .unwrap();
        assert_ne!(second.ino, next);
        drop(stale);
        let third = fs.create(ROOT_INO, b"third", 0o644, owner).unwrap();
        assert_eq!(third.ino, next, "the inode passed over was given back");
        assert_eq!(fs.lookup(ROOT_INO, b"second").unwrap(), Some(second.ino));
    }
}
