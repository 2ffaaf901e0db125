//! rename(2) with its flags: over a file, over an empty directory, across
//! directories (moving ".." and the parents' link counts), RENAME_NOREPLACE,
//! RENAME_EXCHANGE and RENAME_WHITEOUT (the old name left pointing at a new
//! character device 0:0, in the same handle, as overlayfs asks of its upper
//! layer and the kernel's ext4 does).
//!
//! Locks, in docs/ARCHITECTURE.md's order: the filesystem-wide rename lock for a
//! cross-directory rename (it keeps the ancestor check true until the move is
//! done), both directories' locks in inode order and, under pdirops, both
//! names' slots (`ns::pdirops`), then the inode locks of every inode involved
//! in ascending order (the parents shared), the handle, the structure locks, and
//! each parent's attribute lock last.

use super::change::{check_name, inc_dir_links, init_device_inode, now};
use crate::error::{Error, Result};
use crate::format::dirent::{file_type_from_mode, EXT4_FT_CHRDEV};
use crate::format::inode::{Inode, S_IFCHR};
use crate::fs::Filesystem;
use crate::locks::Mode;
use crate::ns::{inode_flags, ROOT_INO};

/// The setgid bit of a mode.
const S_ISGID: u16 = 0o2000;

pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;
pub const RENAME_WHITEOUT: u32 = 4;

fn dec_links(i: &mut Inode) {
    // A count parked at 1 (dir_nlink) stays there.
    if i.i_links_count > 2 {
        i.i_links_count -= 1;
    }
}

impl Filesystem {
    /// Is `dir` the directory `ancestor` or below it? Walks ".." up to the root;
    /// ext4 has no depth limit, so only a chain longer than there are inodes
    /// (a loop in a damaged tree) is corrupt.
    fn is_within(&self, dir: u32, ancestor: u32) -> Result<bool> {
        let mut at = dir;
        for _ in 0..=self.vol.geo.inodes_count {
            if at == ancestor {
                return Ok(true);
            }
            if at == ROOT_INO {
                return Ok(false);
            }
            at = self
                .lookup_held(at, b"..")?
                .ok_or_else(|| Error::corrupt("directory has no '..'", format!("inode {at}")))?;
        }
        Err(Error::corrupt("'..' chain does not reach the root", format!("inode {dir}")))
    }

    /// Renames `src_name` in `src_dir` to `dst_name` in `dst_dir`, replacing what is there as rename(2)
    /// does; `flags` are renameat2's (`RENAME_NOREPLACE` 1, `RENAME_EXCHANGE` 2,
    /// `RENAME_WHITEOUT` 4: the old name then names a new character device 0:0,
    /// owned by the caller).
    ///
    /// # Errors
    /// `NotFound` when the source is missing; `Exists` (NOREPLACE) or `NotEmpty` (a non-empty
    /// directory) at the destination; `IsADirectory`/`NotADirectory` when the two kinds differ;
    /// `Invalid` when a directory would move into itself or for unknown flags; `Busy` for `.` or `..`;
    /// `NameTooLong`, `NoSpace`, `ReadOnly`, `Corrupt` as for [`Filesystem::create`].
    pub fn rename(&self, src_dir: u32, src_name: &[u8], dst_dir: u32, dst_name: &[u8], flags: u32) -> Result<()> {
        // As the kernel's do_renameat2: '.' or '..' on either side is EBUSY (EEXIST
        // as a destination under NOREPLACE).
        let dot = |n: &[u8]| n == b"." || n == b"..";
        if dot(src_name) {
            return Err(Error::Busy("cannot rename '.' or '..'".into()));
        }
        if dot(dst_name) {
            if flags & RENAME_NOREPLACE != 0 {
                return Err(Error::Exists(String::from_utf8_lossy(dst_name).into_owned()));
            }
            return Err(Error::Busy("cannot rename over '.' or '..'".into()));
        }
        check_name(dst_name)?;
        let known = RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT;
        if flags & !known != 0 || flags & RENAME_EXCHANGE != 0 && flags & (RENAME_NOREPLACE | RENAME_WHITEOUT) != 0 {
            return Err(Error::Invalid(format!("rename flags {flags:#x}")));
        }
        let whiteout = flags & RENAME_WHITEOUT != 0;
        let exchange = flags & RENAME_EXCHANGE != 0;
        let cross = src_dir != dst_dir;
        let _rename_lock = cross.then(|| self.rename_lock.lock());
        let names = self.lock_names(&[(src_dir, src_name), (dst_dir, dst_name)])?;
        self.require_dir(src_dir)?;
        self.require_dir(dst_dir)?;
        let shown = |n: &[u8]| String::from_utf8_lossy(n).into_owned();
        let (src, src_at) =
            self.lookup_held_at(src_dir, src_name, None)?.ok_or_else(|| Error::NotFound(shown(src_name)))?;
        let dst = self.lookup_held(dst_dir, dst_name)?;
        if flags & RENAME_NOREPLACE != 0 && dst.is_some() {
            return Err(Error::Exists(shown(dst_name)));
        }
        if exchange && dst.is_none() {
            return Err(Error::NotFound(shown(dst_name)));
        }
        if dst == Some(src) {
            // Two names of one inode: POSIX says rename does nothing.
            return Ok(());
        }
        let src_is_dir = self.inode(src)?.is_dir();
        let dst_is_dir = match dst {
            Some(d) => self.inode(d)?.is_dir(),
            None => false,
        };
        // A removed destination is ENOENT, before its missing '..' could be
        // taken for damage by the walk below (checked again under the locks).
        self.require_live_dir(dst_dir)?;
        if cross && src_is_dir && self.is_within(dst_dir, src)? {
            return Err(Error::Invalid(format!("cannot move directory {} into itself", shown(src_name))));
        }
        if cross && exchange && dst_is_dir && self.is_within(src_dir, dst.unwrap())? {
            return Err(Error::Invalid(format!("cannot move directory {} into itself", shown(dst_name))));
        }
        // Held to the end: the limit checked here stays true until the move.
        let _subdir_links = (cross && src_is_dir && dst.is_none()).then(|| self.lock_subdir_links(dst_dir)).flatten();
        if cross && src_is_dir && dst.is_none() {
            self.refuse_at_dir_link_max(dst_dir)?;
        }
        if !exchange && dst.is_some() {
            match (src_is_dir, dst_is_dir) {
                (false, true) => return Err(Error::IsADirectory(shown(dst_name))),
                (true, false) => return Err(Error::NotADirectory(shown(dst_name))),
                _ => {}
            }
        }
        // The parents shared (their names change, not they), the inodes moved or
        // replaced exclusive: a directory replaced holds no new name meanwhile.
        let mut keys =
            vec![(src_dir as u64, Mode::Shared), (dst_dir as u64, Mode::Shared), (src as u64, Mode::Exclusive)];
        keys.extend(dst.map(|d| (d as u64, Mode::Exclusive)));
        let _inode_locks = self.inode_locks.lock_modes(&keys);
        // Under the inode locks: a create into the directory being replaced holds
        // its inode lock while adding the name, so it is empty now stays true, and
        // one waiting behind us finds it removed (`require_live_dir`).
        self.require_live_dir(dst_dir)?;
        // As the kernel's may_delete and may_create: the moved and the replaced
        // inodes are neither immutable nor append-only, the source directory
        // loses a name and the target gains one (and loses one when replacing).
        inode_flags::refuse_if_pinned(src, &*self.inode(src)?, &format!("renaming {}", shown(src_name)))?;
        inode_flags::refuse_if_pinned(src_dir, &*self.inode(src_dir)?, &format!("renaming {}", shown(src_name)))?;
        inode_flags::refuse_if_immutable(dst_dir, &*self.inode(dst_dir)?, &format!("renaming to {}", shown(dst_name)))?;
        if let Some(d) = dst {
            inode_flags::refuse_if_pinned(d, &*self.inode(d)?, &format!("replacing {}", shown(dst_name)))?;
            inode_flags::refuse_if_pinned(dst_dir, &*self.inode(dst_dir)?, &format!("replacing {}", shown(dst_name)))?;
        }
        if let (false, Some(d), true) = (exchange, dst, dst_is_dir) {
            if !Self::only_dot_entries(d, &self.read_dir(d)?) {
                return Err(Error::NotEmpty(shown(dst_name)));
            }
        }
        // A replaced inode may be freed: damage in what that frees refuses the rename first.
        if let (false, Some(d)) = (exchange, dst) {
            self.check_releasable(d, &*self.inode(d)?)?;
        }

        // Only a new name can need a block (an existing one is repointed in place),
        // unless an inline directory must first move to a block.
        let dirs = [src_dir, dst_dir].into_iter().chain(src_is_dir.then_some(src)).chain(dst.filter(|_| dst_is_dir));
        let mut inline = false;
        for ino in dirs {
            inline |= self.inode(ino)?.has_flag(crate::format::inode::EXT4_INLINE_DATA_FL);
        }
        let _space = if inline {
            Some(self.alloc.ensure_space(super::change::NAME_SPACE_BLOCKS)?)
        } else if dst.is_none() {
            self.ensure_space_for_name(dst_dir, dst_name, 0)?
        } else {
            None
        };
        // The whiteout's placement is asked before any structure lock is held
        // (the policy may read the directory).
        let whiteout_request = match whiteout {
            true => Some(self.inode_request(src_dir, &*self.inode(src_dir)?, src_name, false)?),
            false => None,
        };
        let mut tx = self.begin(24)?;
        let whiteout = match &whiteout_request {
            Some(request) => Some(self.make_whiteout(&mut tx, src_dir, request)?),
            None => None,
        };
        // Structure locks, ascending (dir/mod.rs): moved or replaced directories
        // (their ".." and inline conversion) for writing until their inodes are
        // written; each parent for reading when pdirops holds it by name (its
        // leaves change, not its index), else for writing. A new name that finds
        // its leaf full retries with its parent held for writing.
        let parent_mode = |d: u32| if names.parallel(d) { Mode::Shared } else { Mode::Exclusive };
        let moved: Vec<u32> = src_is_dir.then_some(src).into_iter().chain(dst.filter(|_| dst_is_dir)).collect();
        let adds = !exchange && dst.is_none();
        let src_ft = file_type_from_mode(self.inode(src)?.i_mode);
        let mut dst_mode = parent_mode(dst_dir);
        let (_structure, added) = loop {
            let mut modes = vec![(src_dir as u64, parent_mode(src_dir)), (dst_dir as u64, dst_mode)];
            modes.extend(moved.iter().map(|&d| (d as u64, Mode::Exclusive)));
            let held = self.dir_structure.lock_modes(&modes);
            if !(adds && dst_mode == Mode::Shared) {
                break (held, false);
            }
            let dst_inode = self.inode(dst_dir)?;
            if self.is_indexed(&dst_inode)
                && self.dx_add_to_leaf(&mut tx, dst_dir, &dst_inode, dst_name, src, src_ft)?
            {
                break (held, true);
            }
            drop(held);
            dst_mode = Mode::Exclusive;
        };
        // Inline directories change in place (inline/dir.rs); one that fills up
        // moves to a block inside add_entry.
        // Link count changes of each parent, applied under its attribute lock.
        let mut links: Vec<(u32, i32)> = vec![(src_dir, 0)];
        if cross {
            links.push((dst_dir, 0));
        }
        let mut link = |dir: u32, by: i32| {
            if let Some(l) = links.iter_mut().find(|(d, _)| *d == dir) {
                l.1 += by;
            }
        };
        let mut src_inode = (*self.inode(src)?).clone();
        let t = now();
        let mut dst_inode = match dst {
            Some(d) => Some((*self.inode(d)?).clone()),
            None => None,
        };

        if exchange {
            let d = dst.unwrap();
            let d_inode = dst_inode.as_mut().unwrap();
            let d_ft = file_type_from_mode(d_inode.i_mode);
            self.retarget_entry(&mut tx, src_dir, &*self.inode(src_dir)?, src_name, d, d_ft)?;
            self.retarget_entry(&mut tx, dst_dir, &*self.inode(dst_dir)?, dst_name, src, src_ft)?;
            if cross {
                if src_is_dir {
                    self.set_dotdot(&mut tx, src, &mut src_inode, dst_dir)?;
                }
                if dst_is_dir {
                    self.set_dotdot(&mut tx, d, d_inode, src_dir)?;
                }
                if src_is_dir != dst_is_dir {
                    let (from, to) = if src_is_dir { (src_dir, dst_dir) } else { (dst_dir, src_dir) };
                    link(from, -1);
                    link(to, 1);
                }
            }
            d_inode.i_ctime = t;
        } else {
            if let Some(d) = dst {
                self.retarget_entry(&mut tx, dst_dir, &*self.inode(dst_dir)?, dst_name, src, src_ft)?;
                let d_inode = dst_inode.as_mut().unwrap();
                d_inode.i_ctime = t;
                if dst_is_dir {
                    d_inode.i_links_count = 0;
                    link(dst_dir, -1);
                } else {
                    d_inode.i_links_count = d_inode.i_links_count.saturating_sub(1);
                }
                if d_inode.i_links_count == 0 {
                    if self.is_open(d) {
                        self.orphan_add(&mut tx, d, d_inode)?;
                    } else {
                        self.release_inode(&mut tx, d, d_inode)?;
                    }
                }
            } else if !added {
                // The grown directory is written at once: the removal below (of the
                // same directory, perhaps) maps its blocks through the cached inode.
                let parent = (*self.inode(dst_dir)?).clone();
                let grown = self.add_entry(&mut tx, dst_dir, parent, dst_name, src, src_ft)?;
                self.update_dir_attrs(&mut tx, dst_dir, Some(grown), &|_| {})?;
            }
            match &whiteout {
                Some((w, _)) => {
                    self.retarget_entry(&mut tx, src_dir, &*self.inode(src_dir)?, src_name, *w, EXT4_FT_CHRDEV)?
                }
                None => {
                    self.remove_entry_near(&mut tx, src_dir, &*self.inode(src_dir)?, src_name, src_at)?;
                }
            }
            if cross && src_is_dir {
                self.set_dotdot(&mut tx, src, &mut src_inode, dst_dir)?;
                link(src_dir, -1);
                link(dst_dir, 1);
            }
        }
        src_inode.i_ctime = t;
        for (ino, by) in links {
            self.update_dir_attrs(&mut tx, ino, None, &|dir| {
                (dir.i_mtime, dir.i_ctime) = (t, t);
                for _ in 0..by.unsigned_abs() {
                    if by > 0 {
                        inc_dir_links(dir);
                    } else {
                        dec_links(dir);
                    }
                }
            })?;
        }
        self.write_inode(&mut tx, src, &src_inode)?;
        if let (Some(d), Some(d_inode)) = (dst, dst_inode.as_ref()) {
            self.write_inode(&mut tx, d, d_inode)?;
        }
        tx.finish()
    }

    /// A whiteout for RENAME_WHITEOUT: a character device 0:0 with no
    /// permission bits, owned by the caller (the group of a setgid `dir`),
    /// written under `tx`; returned with its inode lock.
    fn make_whiteout(
        &self,
        tx: &mut crate::journal::handle::Handle,
        dir: u32,
        request: &crate::alloc::InodeRequest,
    ) -> Result<(u32, crate::locks::RwHeld<'_>)> {
        let mut owner = crate::alloc::caller().unwrap_or(crate::alloc::Owner { uid: 0, gid: 0 });
        let parent = self.inode(dir)?;
        if parent.i_mode & S_ISGID != 0 {
            owner.gid = parent.i_gid;
        }
        let (ino, lock) = self.alloc_inode_locked(tx, request)?;
        let mut inode = self.new_inode(S_IFCHR, owner);
        init_device_inode(&mut inode, (0, 0));
        self.write_inode(tx, ino, &inode)?;
        Ok((ino, lock))
    }
}
