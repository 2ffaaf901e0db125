//! The namespace as callers see it: inode attributes (`stat`), path resolution and
//! tree walks. Paths are byte strings, as ext4 names are bytes, not UTF-8.

use crate::error::{Error, Result};
use crate::format::inode::*;
use crate::fs::Filesystem;

pub mod change;
pub(crate) mod inode_flags;
pub mod orphan;
pub(crate) mod pdirops;
pub mod remove_tree;
pub mod rename;
use std::collections::HashSet;

pub const ROOT_INO: u32 = 2;
/// Symlinks followed while resolving one path, as Linux's MAXSYMLINKS.
const MAX_SYMLINK_FOLLOWS: usize = 40;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    /// Regular file.
    Regular,
    /// Directory.
    Directory,
    /// Symbolic link.
    Symlink,
    /// Character device node.
    CharDevice,
    /// Block device node.
    BlockDevice,
    /// Named pipe.
    Fifo,
    /// Unix socket.
    Socket,
}

impl FileType {
    /// The type of an inode's i_mode; None for a type ext4 does not know.
    pub fn from_mode(mode: u16) -> Option<FileType> {
        Some(match mode & S_IFMT {
            S_IFREG => FileType::Regular,
            S_IFDIR => FileType::Directory,
            S_IFLNK => FileType::Symlink,
            S_IFCHR => FileType::CharDevice,
            S_IFBLK => FileType::BlockDevice,
            S_IFIFO => FileType::Fifo,
            S_IFSOCK => FileType::Socket,
            _ => return None,
        })
    }

    /// The letter `ls -l` shows.
    pub fn letter(self) -> char {
        match self {
            FileType::Regular => '-',
            FileType::Directory => 'd',
            FileType::Symlink => 'l',
            FileType::CharDevice => 'c',
            FileType::BlockDevice => 'b',
            FileType::Fifo => 'p',
            FileType::Socket => 's',
        }
    }
}

/// Inode attributes, as `stat(2)` reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Inode number.
    pub ino: u32,
    /// What kind of file.
    pub file_type: FileType,
    /// Permission bits and setuid/setgid/sticky (mode & 0o7777).
    pub perm: u16,
    /// Hard links (directories: 2 plus subdirectories, or 1 past ext4's link limit).
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte units, as st_blocks.
    /// Blocks, less the metadata overhead (as the kernel's f_blocks).
    pub blocks: u64,
    /// Last access.
    pub atime: Timestamp,
    /// Last change of content.
    pub mtime: Timestamp,
    /// Last change of the inode.
    pub ctime: Timestamp,
    /// Creation (256-byte inodes only).
    pub crtime: Option<Timestamp>,
    /// (major, minor) for device inodes.
    pub rdev: (u32, u32),
    /// The inode's flags (EXT4_*_FL).
    pub flags: u32,
    /// i_generation (NFS file handles).
    pub generation: u32,
}

impl Stat {
    /// st_mode: the type bits and the permission bits.
    pub fn mode(&self) -> u32 {
        let t = match self.file_type {
            FileType::Regular => S_IFREG,
            FileType::Directory => S_IFDIR,
            FileType::Symlink => S_IFLNK,
            FileType::CharDevice => S_IFCHR,
            FileType::BlockDevice => S_IFBLK,
            FileType::Fifo => S_IFIFO,
            FileType::Socket => S_IFSOCK,
        };
        (t | self.perm) as u32
    }
}

impl Filesystem {
    /// The attributes of inode `ino`, as stat(2) shows them. Inode numbers come
    /// from names (lookups, listings): a number that names no inode in use is
    /// the caller's to avoid — a freed inode reads as it was left (nlink 0).
    ///
    /// # Errors
    /// `Corrupt` for a number out of range, or an inode that fails its checks
    /// (one never used fails its checksum on metadata_csum images); `Io`.
    pub fn stat(&self, ino: u32) -> Result<Stat> {
        let i = self.inode(ino)?;
        let file_type = FileType::from_mode(i.i_mode).ok_or_else(|| {
            Error::corrupt(format!("inode has no valid file type (mode {:#o})", i.i_mode), format!("inode {ino}"))
        })?;
        let rdev = match file_type {
            FileType::CharDevice | FileType::BlockDevice => i.device_number(),
            _ => (0, 0),
        };
        // With dir_nlink, a directory with too many subdirectories stores 1.
        Ok(Stat {
            ino,
            file_type,
            perm: i.i_mode & 0o7777,
            nlink: i.i_links_count as u32,
            uid: i.i_uid,
            gid: i.i_gid,
            size: i.i_size,
            blocks: i.blocks_512(self.vol.geo.huge_file, self.vol.geo.block_size as u32),
            atime: i.i_atime,
            mtime: i.i_mtime,
            ctime: i.i_ctime,
            crtime: i.i_crtime,
            rdev,
            flags: i.i_flags,
            generation: i.i_generation,
        })
    }

    /// Resolves an absolute path to an inode. Symlinks in the middle of the path are
    /// followed; the last component is not (lstat semantics).
    ///
    /// # Errors
    /// `NotFound` for a missing component; `NotADirectory` when a component before the last is not a
    /// directory; `SymlinkLoop` after too many symlinks; `NameTooLong`; `Corrupt`.
    pub fn lookup_path(&self, path: &[u8]) -> Result<u32> {
        let shown = String::from_utf8_lossy(path).into_owned();
        let mut pending: Vec<Vec<u8>> = split_path(path);
        // A trailing slash asks for a directory, as the kernel's path walk
        // does (following a last symlink): "f/" of a file is ENOTDIR.
        let must_be_dir = path.ends_with(b"/") && !pending.is_empty();
        if must_be_dir {
            pending.push(b".".to_vec());
        }
        pending.reverse();
        let mut stack: Vec<u32> = vec![ROOT_INO];
        let mut follows = 0;
        while let Some(comp) = pending.pop() {
            let dir = *stack.last().unwrap();
            if comp == b"." {
                continue;
            }
            if comp == b".." {
                if stack.len() > 1 {
                    stack.pop();
                }
                continue;
            }
            let dir_inode = self.inode(dir)?;
            if !dir_inode.is_dir() {
                return Err(Error::NotADirectory(format!("{shown}: a path component is not a directory")));
            }
            let ino = self.lookup(dir, &comp)?.ok_or_else(|| Error::NotFound(shown.clone()))?;
            let inode = self.inode(ino)?;
            if inode.is_symlink() && !pending.is_empty() {
                follows += 1;
                if follows > MAX_SYMLINK_FOLLOWS {
                    return Err(Error::SymlinkLoop(shown.clone()));
                }
                let target = self.read_link(ino)?;
                if target.starts_with(b"/") {
                    stack.truncate(1);
                }
                for c in split_path(&target).into_iter().rev() {
                    pending.push(c);
                }
                continue;
            }
            stack.push(ino);
        }
        let found = *stack.last().unwrap();
        if must_be_dir && !self.inode(found)?.is_dir() {
            return Err(Error::NotADirectory(format!("{shown}: not a directory")));
        }
        Ok(found)
    }

    /// Walks the tree under `start` depth-first, calling `visit(path, stat)` for
    /// every inode reached (the start included, with path "/" relative to it).
    /// Directories are visited before their contents. A directory reached twice (a
    /// loop or a second link to a directory, both corrupt) ends the walk with an
    /// error, so a damaged tree costs at most one pass over each directory.
    ///
    /// # Errors
    /// What `visit` returns, and `Corrupt` for a damaged or looping tree.
    pub fn walk(&self, start: u32, visit: &mut dyn FnMut(&[u8], &Stat) -> Result<()>) -> Result<()> {
        let st = self.stat(start)?;
        visit(b"/", &st)?;
        if st.file_type != FileType::Directory {
            return Ok(());
        }
        // Any depth (the kernel and e2fsck walk a chain of 16,000 directories):
        // a directory reached twice ends the walk, so a loop cannot run on, and a
        // directory waiting on the stack keeps only its name and a link to its
        // parent's, so memory grows with the directories waiting, not with
        // their depth times their number.
        struct Waiting {
            parent: Option<std::rc::Rc<Waiting>>,
            name: Vec<u8>,
        }
        impl Drop for Waiting {
            // Ancestors freed in a loop, not by recursion as deep as the tree.
            fn drop(&mut self) {
                let mut parent = self.parent.take();
                while let Some(rc) = parent {
                    parent = std::rc::Rc::try_unwrap(rc).ok().and_then(|mut w| w.parent.take());
                }
            }
        }
        fn path_of(node: &Waiting) -> Vec<u8> {
            let mut names = Vec::new();
            let mut at = Some(node);
            while let Some(n) = at {
                names.push(n.name.as_slice());
                at = n.parent.as_deref();
            }
            names.iter().rev().fold(Vec::new(), |mut path, name| {
                if !name.is_empty() {
                    path.push(b'/');
                    path.extend_from_slice(name);
                }
                path
            })
        }
        let mut dirs_seen: HashSet<u32> = HashSet::from([start]);
        let root = std::rc::Rc::new(Waiting { parent: None, name: Vec::new() });
        let mut stack: Vec<(std::rc::Rc<Waiting>, u32)> = vec![(root, start)];
        while let Some((node, dir)) = stack.pop() {
            let prefix = path_of(&node);
            for e in self.read_dir(dir)? {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let mut path = prefix.clone();
                path.push(b'/');
                path.extend_from_slice(&e.name);
                let st = self.stat(e.ino)?;
                visit(&path, &st)?;
                if st.file_type == FileType::Directory {
                    if !dirs_seen.insert(e.ino) {
                        return Err(Error::corrupt(
                            format!("directory inode {} is linked twice (a directory loop?)", e.ino),
                            format!("entry {} in directory inode {dir}", String::from_utf8_lossy(&path)),
                        ));
                    }
                    stack.push((std::rc::Rc::new(Waiting { parent: Some(node.clone()), name: e.name }), e.ino));
                }
            }
        }
        Ok(())
    }
}

fn split_path(path: &[u8]) -> Vec<Vec<u8>> {
    path.split(|&c| c == b'/').filter(|c| !c.is_empty()).map(|c| c.to_vec()).collect()
}

/// Filesystem-wide figures, as statfs(2) reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFs {
    /// Block size in bytes.
    pub block_size: u32,
    pub blocks: u64,
    /// Free blocks.
    pub free_blocks: u64,
    /// Free blocks an unprivileged user may take (less the reserved ones and
    /// the emergency pool).
    pub available_blocks: u64,
    /// Inodes.
    pub inodes: u64,
    /// Free inodes.
    pub free_inodes: u64,
    /// Longest name (255).
    pub name_max: u32,
}

impl Filesystem {
    /// statfs(2) as the kernel's ext4_statfs answers it: `blocks` leaves out the
    /// metadata overhead, so `df` on a uext4 mount agrees with the kernel's.
    pub fn statfs(&self) -> StatFs {
        // As the kernel's ext4_statfs: blocks promised to operations in flight
        // are not free, and the emergency pool (s_resv_clusters) is not
        // available, like the reserved blocks.
        let free = self.free_blocks().saturating_sub(self.alloc.promised_blocks());
        StatFs {
            block_size: self.vol.geo.block_size as u32,
            blocks: self.vol.geo.blocks_count.saturating_sub(self.overhead_blocks()),
            free_blocks: free,
            available_blocks: self.alloc.available_blocks(),
            inodes: self.vol.geo.inodes_count as u64,
            free_inodes: self.free_inodes(),
            name_max: crate::format::dirent::EXT4_NAME_LEN as u32,
        }
    }
}

impl Filesystem {
    #[doc(hidden)]
    /// Blocks ext4 counts as overhead (the kernel's ext4_calculate_overhead):
    /// those before s_first_data_block; per group its superblock backup with the
    /// group descriptor and reserved GDT blocks next to it, its inode table and two
    /// bitmaps (counted for the group they describe wherever flex_bg placed them);
    /// and an internal journal. As in the kernel, s_overhead_clusters counts only
    /// with bigalloc (opened read-only here); otherwise the figure is recomputed.
    pub fn overhead_blocks(&self) -> u64 {
        use crate::format::superblock::{COMPAT_HAS_JOURNAL, INCOMPAT_META_BG};
        let sb = self.vol.sb.read();
        let stored = sb.s_overhead_clusters as u64;
        if sb.has_ro_compat(crate::format::superblock::RO_COMPAT_BIGALLOC) && stored != 0 {
            let per_cluster = 1u64 << sb.s_log_cluster_size.saturating_sub(sb.s_log_block_size).min(31);
            let blocks = stored.saturating_mul(per_cluster);
            if blocks <= self.vol.geo.blocks_count {
                return blocks;
            }
        }
        let bs = self.vol.geo.block_size as u64;
        let descs_per_block = (bs / self.vol.geo.desc_size as u64).max(1);
        let groups = self.vol.geo.group_count as u64;
        let gdt_blocks = groups.div_ceil(descs_per_block);
        let meta_bg = sb.has_incompat(INCOMPAT_META_BG);
        let itable_blocks = (self.vol.geo.inodes_per_group as u64 * self.vol.geo.inode_size as u64).div_ceil(bs);
        let mut overhead = self.vol.geo.first_data_block as u64;
        for g in 0..self.vol.geo.group_count {
            let has_super = crate::fs::group_has_superblock(&sb, g);
            let metagroup = g as u64 / descs_per_block;
            let descriptors = if !meta_bg || metagroup < sb.s_first_meta_bg as u64 {
                match (has_super, meta_bg) {
                    (false, _) => 0,
                    (true, true) => sb.s_first_meta_bg as u64,
                    (true, false) => gdt_blocks,
                }
            } else {
                let first = metagroup * descs_per_block;
                let g = g as u64;
                (g == first || g == first + 1 || g == first + descs_per_block - 1) as u64
            };
            let reserved_gdt = if has_super { sb.s_reserved_gdt_blocks as u64 } else { 0 };
            overhead += has_super as u64 + descriptors + reserved_gdt + itable_blocks + 2;
        }
        let journal = sb.s_journal_inum;
        let internal_journal = sb.has_compat(COMPAT_HAS_JOURNAL) && journal != 0;
        drop(sb);
        if internal_journal {
            if let Ok(j) = self.inode(journal) {
                overhead += j.i_size / bs;
            }
        }
        overhead
    }
}
