//! The filesystem operations a workload may use, and two ways to carry them out:
//! through uext4's library calls, or through POSIX calls on a mounted directory
//! (the kernel's ext4, fuse2fs, uext4's own FUSE mount).
//!
//! Workloads are written once against `FsOps`, so every target runs exactly the
//! same sequence of operations. Paths are relative to the filesystem's root and
//! use '/' separators.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use uext4::format::inode::Timestamp;
use uext4::{Filesystem, Owner, SetAttr};

pub trait FsOps: Send + Sync {
    fn mkdir(&self, path: &str, perm: u32) -> io::Result<()>;
    /// Creates a new file (failing if it exists) and opens it for writing.
    fn create(&self, path: &str, perm: u32) -> io::Result<Box<dyn FileOps>>;
    fn open(&self, path: &str) -> io::Result<Box<dyn FileOps>>;
    /// lstat; returns the size.
    fn stat(&self, path: &str) -> io::Result<u64>;
    fn unlink(&self, path: &str) -> io::Result<()>;
    fn rmdir(&self, path: &str) -> io::Result<()>;
    /// rename(2) within the filesystem, replacing `to` if it exists.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    /// The names in a directory (no "." or ".."), in the order readdir gives them.
    fn read_dir(&self, path: &str) -> io::Result<Vec<String>>;
    /// The same, each name with its inode number (readdir's d_ino).
    fn read_dir_inodes(&self, path: &str) -> io::Result<Vec<(String, u64)>>;
    /// Removes the directory `path` and everything below it, as the target
    /// does it best: for the library `Filesystem::remove_tree`, on uext4's
    /// mount `uext4 rm -r` (the daemon runs it), elsewhere GNU `rm -rf` (which
    /// sorts a large directory's entries by inode number before unlinking them).
    /// Returns how many names it removed, as far as the target counts them (the
    /// programs do not say: 0).
    fn remove_tree(&self, path: &str) -> io::Result<u64>;
    /// Whether `path` is a directory (lstat).
    fn is_dir(&self, path: &str) -> io::Result<bool>;
    fn symlink(&self, target: &str, path: &str) -> io::Result<()>;
    fn set_mtime(&self, path: &str, secs: i64) -> io::Result<()>;
    /// Makes everything written so far durable on the image.
    fn sync(&self) -> io::Result<()>;
    /// Opens directory `path` for the calls of `DirOps`, which take names in it.
    fn open_dir(&self, path: &str) -> io::Result<Box<dyn DirOps>>;
}

/// A directory opened once, whose names are then created, renamed and removed
/// relative to it, as a program that changed into the directory does (seed
/// 002's crunl and rndrename `chdir` there and use bare names): no walk from
/// the root for each call. The library keeps the directory's inode number, a
/// mount a descriptor for `openat`, `unlinkat` and `renameat`.
pub trait DirOps: Send + Sync {
    /// As `FsOps::create`, for a name in this directory.
    fn create(&self, name: &str, perm: u32) -> io::Result<Box<dyn FileOps>>;
    fn unlink(&self, name: &str) -> io::Result<()>;
    /// rename(2) of one name in this directory to another, replacing it if it exists.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
}

pub trait FileOps: Send {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()>;
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
    fn set_len(&mut self, len: u64) -> io::Result<()>;
    fn fsync(&mut self) -> io::Result<()>;
    /// fallocate(2) preallocating [offset, offset + len): unwritten extents,
    /// the size grown over them unless `keep_size`.
    fn fallocate(&mut self, offset: u64, len: u64, keep_size: bool) -> io::Result<()>;
}

/// Keeps uext4's message and gives the error the kind its errno maps to.
fn to_io(e: uext4::Error) -> io::Error {
    io::Error::new(io::Error::from_raw_os_error(e.errno()).kind(), e.to_string())
}

/// uext4's library, called directly in this process.
pub struct Uext4Ops {
    pub fs: Arc<Filesystem>,
}

const ROOT: Owner = Owner { uid: 0, gid: 0 };

impl Uext4Ops {
    fn parent_and_name<'a>(&self, path: &'a str) -> io::Result<(u32, &'a str)> {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        Ok((self.fs.lookup_path(format!("/{dir}").as_bytes()).map_err(to_io)?, name))
    }

    fn ino(&self, path: &str) -> io::Result<u32> {
        self.fs.lookup_path(format!("/{path}").as_bytes()).map_err(to_io)
    }

    fn handle(&self, ino: u32) -> io::Result<Box<dyn FileOps>> {
        self.fs.open_inode(ino).map_err(to_io)?;
        Ok(Box::new(Uext4File { fs: self.fs.clone(), ino }))
    }
}

impl FsOps for Uext4Ops {
    fn mkdir(&self, path: &str, perm: u32) -> io::Result<()> {
        let (parent, name) = self.parent_and_name(path)?;
        self.fs.mkdir(parent, name.as_bytes(), perm as u16, ROOT).map_err(to_io).map(drop)
    }

    fn create(&self, path: &str, perm: u32) -> io::Result<Box<dyn FileOps>> {
        let (parent, name) = self.parent_and_name(path)?;
        let st = self.fs.create(parent, name.as_bytes(), perm as u16, ROOT).map_err(to_io)?;
        self.handle(st.ino)
    }

    fn open(&self, path: &str) -> io::Result<Box<dyn FileOps>> {
        let ino = self.ino(path)?;
        self.handle(ino)
    }

    fn stat(&self, path: &str) -> io::Result<u64> {
        Ok(self.fs.stat(self.ino(path)?).map_err(to_io)?.size)
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        let (parent, name) = self.parent_and_name(path)?;
        self.fs.unlink(parent, name.as_bytes()).map_err(to_io)
    }

    fn rmdir(&self, path: &str) -> io::Result<()> {
        let (parent, name) = self.parent_and_name(path)?;
        self.fs.rmdir(parent, name.as_bytes()).map_err(to_io)
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let (src_dir, src) = self.parent_and_name(from)?;
        let (dst_dir, dst) = self.parent_and_name(to)?;
        self.fs.rename(src_dir, src.as_bytes(), dst_dir, dst.as_bytes(), 0).map_err(to_io)
    }

    fn read_dir(&self, path: &str) -> io::Result<Vec<String>> {
        let ino = if path.is_empty() { uext4::ROOT_INO } else { self.ino(path)? };
        let entries = self.fs.read_dir(ino).map_err(to_io)?;
        Ok(entries
            .into_iter()
            .filter(|e| e.name != b"." && e.name != b"..")
            .map(|e| String::from_utf8_lossy(&e.name).into_owned())
            .collect())
    }

    fn read_dir_inodes(&self, path: &str) -> io::Result<Vec<(String, u64)>> {
        let ino = if path.is_empty() { uext4::ROOT_INO } else { self.ino(path)? };
        let entries = self.fs.read_dir(ino).map_err(to_io)?;
        Ok(entries
            .into_iter()
            .filter(|e| e.name != b"." && e.name != b"..")
            .map(|e| (String::from_utf8_lossy(&e.name).into_owned(), u64::from(e.ino)))
            .collect())
    }

    fn remove_tree(&self, path: &str) -> io::Result<u64> {
        // The library's own removal in inode order (ns/remove_tree.rs, seed 003).
        let (parent, name) = self.parent_and_name(path)?;
        let removed = self.fs.remove_tree(parent, name.as_bytes()).map_err(to_io)?;
        Ok(removed.names)
    }

    fn is_dir(&self, path: &str) -> io::Result<bool> {
        Ok(self.fs.stat(self.ino(path)?).map_err(to_io)?.file_type == uext4::FileType::Directory)
    }

    fn symlink(&self, target: &str, path: &str) -> io::Result<()> {
        let (parent, name) = self.parent_and_name(path)?;
        self.fs.symlink(parent, name.as_bytes(), target.as_bytes(), ROOT).map_err(to_io).map(drop)
    }

    fn set_mtime(&self, path: &str, secs: i64) -> io::Result<()> {
        let attr = SetAttr { mtime: Some(Timestamp { sec: secs, nsec: 0 }), ..Default::default() };
        self.fs.setattr(self.ino(path)?, &attr).map_err(to_io).map(drop)
    }

    fn sync(&self) -> io::Result<()> {
        self.fs.sync().map_err(to_io)
    }

    fn open_dir(&self, path: &str) -> io::Result<Box<dyn DirOps>> {
        let ino = self.ino(path)?;
        if self.fs.stat(ino).map_err(to_io)?.file_type != uext4::FileType::Directory {
            return Err(io::Error::other(format!("{path} is not a directory")));
        }
        Ok(Box::new(Uext4Dir { fs: self.fs.clone(), ino }))
    }
}

/// A directory of the library's, by inode number.
struct Uext4Dir {
    fs: Arc<Filesystem>,
    ino: u32,
}

impl DirOps for Uext4Dir {
    fn create(&self, name: &str, perm: u32) -> io::Result<Box<dyn FileOps>> {
        let st = self.fs.create(self.ino, name.as_bytes(), perm as u16, ROOT).map_err(to_io)?;
        self.fs.open_inode(st.ino).map_err(to_io)?;
        Ok(Box::new(Uext4File { fs: self.fs.clone(), ino: st.ino }))
    }

    fn unlink(&self, name: &str) -> io::Result<()> {
        self.fs.unlink(self.ino, name.as_bytes()).map_err(to_io)
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.fs.rename(self.ino, from.as_bytes(), self.ino, to.as_bytes(), 0).map_err(to_io)
    }
}

struct Uext4File {
    fs: Arc<Filesystem>,
    ino: u32,
}

impl FileOps for Uext4File {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut done = 0;
        while done < data.len() {
            done += self.fs.write(self.ino, offset + done as u64, &data[done..]).map_err(to_io)?;
        }
        Ok(())
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.fs.read(self.ino, offset, buf).map_err(to_io)
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.fs.setattr(self.ino, &SetAttr { size: Some(len), ..Default::default() }).map_err(to_io).map(drop)
    }

    fn fsync(&mut self) -> io::Result<()> {
        self.fs.fsync(self.ino).map_err(to_io)
    }

    fn fallocate(&mut self, offset: u64, len: u64, keep_size: bool) -> io::Result<()> {
        let mode = if keep_size { uext4::space::FALLOC_FL_KEEP_SIZE } else { 0 };
        self.fs.fallocate(self.ino, offset, len, mode).map_err(to_io)
    }
}

impl Drop for Uext4File {
    fn drop(&mut self) {
        let _ = self.fs.close_inode(self.ino);
    }
}

/// POSIX calls below a mount point.
pub struct PosixOps {
    pub root: PathBuf,
    /// A FUSE daemon may ignore syncfs (fuse2fs does); fsync of a file reaches it.
    pub sync_through_file: bool,
    /// On uext4's own mount, the `uext4` binary: `remove_tree` then runs
    /// `uext4 rm -r MOUNTPOINT/path`, which has the daemon remove the tree in
    /// inode order (issue 18), in place of GNU `rm -rf`.
    pub uext4_rm: Option<PathBuf>,
}

impl PosixOps {
    fn at(&self, path: &str) -> PathBuf {
        self.root.join(path)
    }
}

impl FsOps for PosixOps {
    fn mkdir(&self, path: &str, perm: u32) -> io::Result<()> {
        std::fs::create_dir(self.at(path))?;
        std::fs::set_permissions(self.at(path), std::fs::Permissions::from_mode(perm))
    }

    fn create(&self, path: &str, perm: u32) -> io::Result<Box<dyn FileOps>> {
        let file =
            std::fs::OpenOptions::new().read(true).write(true).create_new(true).mode(perm).open(self.at(path))?;
        Ok(Box::new(PosixFile(file)))
    }

    fn open(&self, path: &str) -> io::Result<Box<dyn FileOps>> {
        Ok(Box::new(PosixFile(std::fs::OpenOptions::new().read(true).write(true).open(self.at(path))?)))
    }

    fn stat(&self, path: &str) -> io::Result<u64> {
        Ok(std::fs::symlink_metadata(self.at(path))?.len())
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        std::fs::remove_file(self.at(path))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        std::fs::rename(self.at(from), self.at(to))
    }

    fn rmdir(&self, path: &str) -> io::Result<()> {
        std::fs::remove_dir(self.at(path))
    }

    fn read_dir(&self, path: &str) -> io::Result<Vec<String>> {
        std::fs::read_dir(self.at(path))?.map(|e| Ok(e?.file_name().to_string_lossy().into_owned())).collect()
    }

    fn read_dir_inodes(&self, path: &str) -> io::Result<Vec<(String, u64)>> {
        use std::os::unix::fs::DirEntryExt;
        std::fs::read_dir(self.at(path))?
            .map(|e| {
                let e = e?;
                Ok((e.file_name().to_string_lossy().into_owned(), e.ino()))
            })
            .collect()
    }

    fn remove_tree(&self, path: &str) -> io::Result<u64> {
        let mut rm = match &self.uext4_rm {
            Some(uext4) => {
                let mut c = std::process::Command::new(uext4);
                c.arg("rm");
                c
            }
            None => std::process::Command::new("rm"),
        };
        let status = rm.arg("-rf").arg("--").arg(self.at(path)).status()?;
        if !status.success() {
            return Err(io::Error::other(format!("{rm:?}: {status}")));
        }
        if self.at(path).exists() {
            return Err(io::Error::other(format!("rm -rf {path} left it in place")));
        }
        Ok(0)
    }

    fn is_dir(&self, path: &str) -> io::Result<bool> {
        Ok(std::fs::symlink_metadata(self.at(path))?.is_dir())
    }

    fn symlink(&self, target: &str, path: &str) -> io::Result<()> {
        std::os::unix::fs::symlink(target, self.at(path))
    }

    fn set_mtime(&self, path: &str, secs: i64) -> io::Result<()> {
        let c_path = std::ffi::CString::new(self.at(path).into_os_string().into_encoded_bytes())
            .map_err(|_| io::Error::other("a path holds a NUL byte"))?;
        let times = [
            libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
            libc::timespec { tv_sec: secs as libc::time_t, tv_nsec: 0 },
        ];
        // SAFETY: a NUL-terminated path and an array of two timespecs.
        libc_result(unsafe {
            libc::utimensat(libc::AT_FDCWD, c_path.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW)
        })
        .map(drop)
    }

    fn sync(&self) -> io::Result<()> {
        let dir = File::open(&self.root)?;
        // SAFETY: a valid open descriptor.
        libc_result(unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) })?;
        if self.sync_through_file {
            let marker = self.root.join(".bench-sync");
            File::options().write(true).create(true).truncate(false).open(marker)?.sync_all()?;
        }
        Ok(())
    }

    fn open_dir(&self, path: &str) -> io::Result<Box<dyn DirOps>> {
        let dir = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY).open(self.at(path))?;
        Ok(Box::new(PosixDir(dir)))
    }
}

/// A directory below a mount point, by descriptor.
struct PosixDir(File);

impl PosixDir {
    fn fd(&self) -> libc::c_int {
        std::os::fd::AsRawFd::as_raw_fd(&self.0)
    }
}

fn c_name(name: &str) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(name).map_err(|_| io::Error::other("a name holds a NUL byte"))
}

/// The result of a libc call that returns -1 and sets errno on failure.
fn libc_result(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

impl DirOps for PosixDir {
    fn create(&self, name: &str, perm: u32) -> io::Result<Box<dyn FileOps>> {
        let name = c_name(name)?;
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC;
        // SAFETY: a valid directory descriptor and a NUL-terminated name.
        let fd = libc_result(unsafe { libc::openat(self.fd(), name.as_ptr(), flags, perm as libc::c_uint) })?;
        // SAFETY: openat returned a new descriptor that nothing else owns.
        let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(Box::new(PosixFile(file)))
    }

    fn unlink(&self, name: &str) -> io::Result<()> {
        let name = c_name(name)?;
        // SAFETY: a valid directory descriptor and a NUL-terminated name.
        libc_result(unsafe { libc::unlinkat(self.fd(), name.as_ptr(), 0) }).map(drop)
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let (from, to) = (c_name(from)?, c_name(to)?);
        // SAFETY: valid directory descriptors and NUL-terminated names.
        libc_result(unsafe { libc::renameat(self.fd(), from.as_ptr(), self.fd(), to.as_ptr()) }).map(drop)
    }
}

struct PosixFile(File);

impl FileOps for PosixFile {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write_all_at(data, offset)
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        FileExt::read_at(&self.0, buf, offset)
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn fsync(&mut self) -> io::Result<()> {
        self.0.sync_all()
    }

    fn fallocate(&mut self, offset: u64, len: u64, keep_size: bool) -> io::Result<()> {
        use std::os::unix::io::AsRawFd;
        let mode = if keep_size { libc::FALLOC_FL_KEEP_SIZE } else { 0 };
        // SAFETY: the descriptor is open for as long as self.0 lives.
        libc_result(unsafe { libc::fallocate(self.0.as_raw_fd(), mode, offset as libc::off_t, len as libc::off_t) })
            .map(drop)
    }
}
