//! Copying host files into an image (`uext4 cp [-r] HOSTPATH... IMAGE:/path`).
//!
//! Keeps modes, owners, access and modification times (with nanoseconds),
//! symlinks, hard links (by host device and inode), fifos and device nodes, and
//! extended attributes; file data streams in 1 MiB pieces, the host file's holes
//! (SEEK_DATA/SEEK_HOLE) and all-zero 4 KiB pieces are left as holes. A file
//! larger than the image's largest file is refused before its name is made.
//! A file is read to its end whatever its stated size (files of /proc say 0
//! bytes, files of /sys 4096), as GNU cp reads it; `DIR/.` copies what DIR
//! holds into an existing destination directory.
//! Sockets are skipped with a warning, as tar does. Every source and the
//! destination are checked before anything is copied.

use crate::show::{escape, host_reason, CliResult, Context, Failure};
use crate::target::{check_then_apply, dir_behind, resolve, Pass, Target};
use std::collections::HashMap;
use std::ffi::CString;
use std::io::{IsTerminal, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::Path;
use std::time::{Duration, Instant};
use uext4::format::inode::{Timestamp, S_IFBLK, S_IFCHR, S_IFIFO};
use uext4::{Error, Filesystem, Owner, Result, SetAttr};

pub(crate) struct Importer<'a> {
    pub(crate) fs: &'a Filesystem,
    pub(crate) recursive: bool,
    /// Host (device, inode) of multiply-linked files -> their inode in the image.
    pub(crate) links: HashMap<(u64, u64), u32>,
    pub(crate) files: u64,
    pub(crate) bytes: u64,
    pub(crate) progress: Option<Instant>,
    /// The copy buffer, reused from file to file.
    pub(crate) buf: Vec<u8>,
    /// Host extended attributes the image did not take (each named on stderr).
    pub(crate) lost_attributes: u64,
}

pub(crate) fn host_error(path: &Path, e: std::io::Error) -> Error {
    Error::Io(std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// Extended attributes of a host path, without following a symlink.
fn host_xattrs(path: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else { return Vec::new() };
    // SAFETY: valid NUL-terminated path and a buffer of the given length.
    let Some(names) = sized_read(|buf| unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let Ok(cn) = CString::new(name) else { continue };
        // SAFETY: as above.
        let value =
            sized_read(|buf| unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) });
        if let Some(value) = value {
            out.push((name.to_vec(), value));
        }
    }
    out
}

/// The bytes a list/get-xattr style call returns: asked for their size first
/// (most files have no attributes, and zeroing 64 KiB for each of a hundred
/// thousand files cost a tenth of a copy's time), then read, again if they grew
/// in between; after a few such races, once into the largest buffer an
/// attribute list or value can need (XATTR_SIZE_MAX). None when the call fails
/// (no such attribute, none supported).
fn sized_read(call: impl Fn(&mut [u8]) -> isize) -> Option<Vec<u8>> {
    const XATTR_SIZE_MAX: usize = 65536;
    const RACES: usize = 4;
    for _ in 0..RACES {
        let size = call(&mut []);
        if size <= 0 {
            return (size == 0).then(Vec::new);
        }
        let mut buf = vec![0u8; size as usize];
        let n = call(&mut buf);
        if n >= 0 {
            buf.truncate(n as usize);
            return Some(buf);
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::ERANGE) {
            return None;
        }
    }
    let mut buf = vec![0u8; XATTR_SIZE_MAX];
    let n = call(&mut buf);
    (n >= 0).then(|| {
        buf.truncate(n as usize);
        buf
    })
}

/// A host file's atime and mtime for its copy. With a fixed time
/// (SOURCE_DATE_EPOCH) both are clamped to it, as reproducible builds clamp
/// mtimes, and atime, which reading the tree moves between runs, is the
/// clamped mtime; ctime is the fixed time itself (the library stamps it).
fn host_times(md: &std::fs::Metadata) -> SetAttr {
    let t = |sec: i64, nsec: i64| Timestamp { sec, nsec: nsec as u32 };
    let (atime, mtime) = (t(md.atime(), md.atime_nsec()), t(md.mtime(), md.mtime_nsec()));
    let (atime, mtime) = match uext4::clock::fixed_time() {
        None => (atime, mtime),
        Some(fixed) => {
            let mtime = if (mtime.sec, mtime.nsec) > (fixed, 0) { t(fixed, 0) } else { mtime };
            (mtime, mtime)
        }
    };
    SetAttr { atime: Some(atime), mtime: Some(mtime), ..Default::default() }
}

/// Fills the root of a new filesystem with the contents of host directory
/// `src`, as mkfs.ext4 -d does: the root takes `src`'s mode, owner and times,
/// and an empty `lost+found` in `src` is the one mkfs made.
pub fn populate(fs: &Filesystem, src: &Path) -> Result<()> {
    let md = std::fs::metadata(src).map_err(|e| host_error(src, e))?;
    if !md.is_dir() {
        return Err(Error::NotADirectory(format!("{} (mkfs -d wants a directory)", src.display())));
    }
    let mut im = Importer::new(fs, true);
    let mut entries: Vec<_> = std::fs::read_dir(src)
        .map_err(|e| host_error(src, e))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()
        .map_err(|e| host_error(src, e))?;
    entries.sort();
    for child in entries {
        let path = src.join(&child);
        if child == "lost+found" && std::fs::read_dir(&path).is_ok_and(|mut d| d.next().is_none()) {
            continue;
        }
        im.copy(&path, uext4::ROOT_INO, child.as_bytes())?;
    }
    let root = SetAttr {
        perm: Some((md.mode() & 0o7777) as u16),
        uid: Some(md.uid()),
        gid: Some(md.gid()),
        ..host_times(&md)
    };
    fs.setattr(uext4::ROOT_INO, &root)?;
    if im.progress.is_some() {
        eprintln!("\r{} files, {} MiB copied", im.files, im.bytes >> 20);
    }
    Ok(())
}

impl<'a> Importer<'a> {
    /// An importer that shows its progress when stderr is a terminal.
    pub(crate) fn new(fs: &'a Filesystem, recursive: bool) -> Importer<'a> {
        Importer {
            fs,
            recursive,
            links: HashMap::new(),
            files: 0,
            bytes: 0,
            progress: std::io::stderr().is_terminal().then(Instant::now),
            buf: Vec::new(),
            lost_attributes: 0,
        }
    }

    /// One without progress (the parallel copy's threads: the caller reports).
    pub(crate) fn quiet(fs: &'a Filesystem) -> Importer<'a> {
        Importer { progress: None, ..Importer::new(fs, true) }
    }

    fn tick(&mut self) {
        self.files += 1;
        if let Some(last) = self.progress.as_mut() {
            if last.elapsed() > Duration::from_millis(100) {
                eprint!("\r{} files, {} MiB copied", self.files, self.bytes >> 20);
                let _ = std::io::stderr().flush();
                *last = Instant::now();
            }
        }
    }

    /// Copies host `src` to `name` in image directory `parent`.
    /// Without -r a symlink named on the command line is followed, as GNU cp
    /// follows it (`uext4 cp /dev/stdin IMG:/x` copies what stdin holds).
    pub(crate) fn copy(&mut self, src: &Path, parent: u32, name: &[u8]) -> Result<()> {
        let md = host_metadata(src, self.recursive).map_err(|e| host_error(src, e))?;
        self.copy_with(src, &md, parent, name)
    }

    /// `copy` of a host path whose `lstat` the caller already has.
    pub(crate) fn copy_with(&mut self, src: &Path, md: &std::fs::Metadata, parent: u32, name: &[u8]) -> Result<()> {
        let owner = Owner { uid: md.uid(), gid: md.gid() };
        let perm = (md.mode() & 0o7777) as u16;
        let ft = md.file_type();
        let key = (md.dev(), md.ino());
        if !ft.is_dir() && md.nlink() > 1 {
            if let Some(&ino) = self.links.get(&key) {
                self.fs.link(ino, parent, name)?;
                self.tick();
                return Ok(());
            }
        }
        let ino = if ft.is_dir() {
            if !self.recursive {
                return Err(Error::Invalid(format!("{} is a directory (use -r)", src.display())));
            }
            let ino = self.fs.mkdir(parent, name, perm, owner)?.ino;
            for child in host_children(src)? {
                self.copy(&src.join(&child), ino, child.as_bytes())?;
            }
            ino
        } else if ft.is_symlink() {
            let target = std::fs::read_link(src).map_err(|e| host_error(src, e))?;
            self.fs.symlink(parent, name, target.as_os_str().as_bytes(), owner)?.ino
        } else if ft.is_file() {
            // Refused before the name exists: nothing half-copied stays behind.
            if md.len() > self.fs.max_file_size() {
                return Err(Error::FileTooLarge(format!(
                    "{} is {} bytes; the largest file this image can hold is {} bytes",
                    src.display(),
                    md.len(),
                    self.fs.max_file_size()
                )));
            }
            let ino = self.fs.create(parent, name, perm, owner)?.ino;
            self.copy_data(src, ino, md.len())?;
            ino
        } else if !self.recursive && (ft.is_fifo() || ft.is_char_device() || ft.is_block_device()) {
            // GNU cp without -r copies what a pipe or device yields into a
            // regular file, to its end (/dev/stdin, a fifo, /dev/null).
            let ino = self.fs.create(parent, name, perm, owner)?.ino;
            self.copy_stream(src, ino)?;
            ino
        } else if ft.is_fifo() || ft.is_char_device() || ft.is_block_device() {
            let kind = if ft.is_fifo() {
                S_IFIFO
            } else if ft.is_char_device() {
                S_IFCHR
            } else {
                S_IFBLK
            };
            let rdev = (libc::major(md.rdev()), libc::minor(md.rdev()));
            self.fs.mknod(parent, name, kind | perm, rdev, owner)?.ino
        } else {
            eprintln!("uext4: skipping socket {}", escape(src.as_os_str().as_bytes()));
            return Ok(());
        };
        if !ft.is_dir() && md.nlink() > 1 {
            self.links.insert(key, ino);
        }
        self.finish(src, md, ino)
    }

    /// A copied node's extended attributes, permission bits and times (after a
    /// directory's contents, since writing into it changes them).
    pub(crate) fn finish(&mut self, src: &Path, md: &std::fs::Metadata, ino: u32) -> Result<()> {
        let ft = md.file_type();
        let perm = (md.mode() & 0o7777) as u16;
        for (xname, value) in host_xattrs(src) {
            if let Err(e) = self.fs.set_xattr(ino, &xname, &value, 0) {
                self.lost_attributes += 1;
                eprintln!(
                    "uext4: {}: attribute {}: {}",
                    escape(src.as_os_str().as_bytes()),
                    escape(&xname),
                    escape(e.to_string().as_bytes())
                );
            }
        }
        let times = SetAttr { perm: if ft.is_symlink() { None } else { Some(perm) }, ..host_times(md) };
        self.fs.setattr(ino, &times)?;
        self.tick();
        Ok(())
    }

    fn copy_data(&mut self, src: &Path, ino: u32, len: u64) -> Result<()> {
        let f = std::fs::File::open(src).map_err(|e| host_error(src, e))?;
        // One buffer for the whole copy: a fresh zeroed MiB per file cost more
        // than copying a small file does.
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(1 << 20, 0);
        let copied = self.copy_runs(src, &f, ino, len, &mut buf);
        self.buf = buf;
        let end = copied?;
        // Trailing zeros stay a hole: only the size moves.
        if self.fs.stat(ino)?.size < end {
            self.fs.setattr(ino, &SetAttr { size: Some(end), ..Default::default() })?;
        }
        Ok(())
    }

    /// Copies what reading `src` from its start yields, to its end: a pipe
    /// or device, which has neither a size nor offsets to read at.
    fn copy_stream(&mut self, src: &Path, ino: u32) -> Result<()> {
        use std::io::Read;
        let mut f = std::fs::File::open(src).map_err(|e| host_error(src, e))?;
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(1 << 20, 0);
        let mut copy = || -> Result<u64> {
            let mut off = 0u64;
            loop {
                let n = match f.read(&mut buf) {
                    Ok(0) => return Ok(off),
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(host_error(src, e)),
                };
                self.copy_unsized_piece(src, ino, off, &buf[..n], "yielded more than")?;
                off += n as u64;
            }
        };
        let copied = copy();
        self.buf = buf;
        let end = copied?;
        if self.fs.stat(ino)?.size < end {
            self.fs.setattr(ino, &SetAttr { size: Some(end), ..Default::default() })?;
        }
        Ok(())
    }

    /// Copies the data runs of `f` (holes skipped) through `buf`; returns where
    /// the file ended. `len` (its size when stat'ed) is where that is expected,
    /// but it is read to its end as GNU cp reads it: a file of /proc says 0
    /// bytes and holds more, one of /sys says 4096 and holds fewer, and a file
    /// may grow or shrink while it is copied.
    fn copy_runs(&mut self, src: &Path, f: &std::fs::File, ino: u32, len: u64, buf: &mut [u8]) -> Result<u64> {
        let mut off = 0u64;
        while off < len {
            // The host's holes are skipped whole (a sparse file of terabytes is
            // not read as zeros); a host without SEEK_DATA reads everything.
            let Some((data, hole)) = next_data(f, off, len).map_err(|e| host_error(src, e))? else {
                off = len;
                break;
            };
            off = data;
            while off < hole {
                let want = ((hole - off) as usize).min(buf.len());
                let n = f.read_at(&mut buf[..want], off).map_err(|e| host_error(src, e))?;
                if n == 0 {
                    // The end came early.
                    return Ok(off);
                }
                self.copy_piece(src, ino, off, &buf[..n])?;
                off += n as u64;
                self.bytes += n as u64;
            }
        }
        // Whatever lies past the size it had when stat'ed.
        loop {
            let n = f.read_at(buf, off).map_err(|e| host_error(src, e))?;
            if n == 0 {
                return Ok(off);
            }
            self.copy_unsized_piece(src, ino, off, &buf[..n], "grew past")?;
            off += n as u64;
        }
    }

    /// `copy_piece` of bytes read past any size known beforehand (a pipe's, or
    /// a file's past its stat'ed size): refused whole past the largest file,
    /// saying the source `went` past it ("grew past", "yielded more than").
    fn copy_unsized_piece(&mut self, src: &Path, ino: u32, off: u64, piece: &[u8], went: &str) -> Result<()> {
        if off + piece.len() as u64 > self.fs.max_file_size() {
            return Err(Error::FileTooLarge(format!(
                "{} {went} {} bytes, the largest file this image can hold",
                src.display(),
                self.fs.max_file_size()
            )));
        }
        self.copy_piece(src, ino, off, piece)?;
        self.bytes += piece.len() as u64;
        Ok(())
    }

    /// Writes `buf` (read from `off`): runs of 4 KiB pieces holding data go in one
    /// write each; zero pieces stay holes.
    fn copy_piece(&mut self, src: &Path, ino: u32, off: u64, buf: &[u8]) -> Result<()> {
        let pieces: Vec<bool> = buf.chunks(4096).map(|p| p.iter().any(|&b| b != 0)).collect();
        let mut i = 0;
        while i < pieces.len() {
            if !pieces[i] {
                i += 1;
                continue;
            }
            let start = i;
            while i < pieces.len() && pieces[i] {
                i += 1;
            }
            let run = &buf[start * 4096..(i * 4096).min(buf.len())];
            if self.fs.write(ino, off + (start * 4096) as u64, run)? != run.len() {
                return Err(Error::NoSpace(format!("image is full while copying {}", src.display())));
            }
        }
        Ok(())
    }
}

/// Whether host path `src` is a directory named with a final "." (`DIR/.`):
/// cp copies what is in it, not the directory under its name.
fn copies_contents(src: &Path) -> bool {
    let bytes = src.as_os_str().as_bytes();
    let dotted = bytes == b"." || bytes.ends_with(b"/.") || bytes.ends_with(b"/./");
    dotted && std::fs::symlink_metadata(src).is_ok_and(|m| m.is_dir())
}

/// The names in host directory `src`, sorted (the order the copy makes them in).
pub(crate) fn host_children(src: &Path) -> Result<Vec<std::ffi::OsString>> {
    let mut entries: Vec<_> = std::fs::read_dir(src)
        .map_err(|e| host_error(src, e))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()
        .map_err(|e| host_error(src, e))?;
    entries.sort();
    Ok(entries)
}

/// The next stretch of `f` that may hold data at or after `off`: (start, end),
/// or None when only a hole remains before `len`.
fn next_data(f: &std::fs::File, off: u64, len: u64) -> std::io::Result<Option<(u64, u64)>> {
    use std::os::fd::AsRawFd;
    // SAFETY: lseek on an open descriptor.
    let data = unsafe { libc::lseek(f.as_raw_fd(), off as libc::off_t, libc::SEEK_DATA) };
    if data < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => Ok(Some((off, len))),
            _ => Err(e),
        };
    }
    // SAFETY: as above.
    let hole = unsafe { libc::lseek(f.as_raw_fd(), data, libc::SEEK_HOLE) };
    if hole < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Some((data as u64, (hole as u64).min(len))))
}

/// A source's metadata as cp sees it: its own with -r (a symlink is copied
/// as one), what it points to without (GNU cp follows command-line links then).
fn host_metadata(src: &Path, recursive: bool) -> std::io::Result<std::fs::Metadata> {
    match recursive {
        true => std::fs::symlink_metadata(src),
        false => std::fs::metadata(src),
    }
}

/// cp's rule for the destination: into an existing directory under each source's
/// own name, else (one source) as the destination name itself. Every source and the
/// destination are checked before the first file is copied.
pub fn copy_in(sources: &[std::path::PathBuf], dest: &Target, recursive: bool, jobs: usize) -> CliResult<()> {
    check_then_apply("cp", &[dest], |fs, pass| copy_in_pass(fs, pass, sources, dest, recursive, jobs))
}

fn copy_in_pass(
    fs: &Filesystem,
    pass: Pass,
    sources: &[std::path::PathBuf],
    dest: &Target,
    recursive: bool,
    jobs: usize,
) -> CliResult<()> {
    let cannot = || format!("cp: cannot copy into {}", dest.quoted());
    let resolved = resolve(fs, dest).context(cannot)?;
    let into_dir = dir_behind(fs, dest, &resolved).context(cannot)?;
    let mut refused = Vec::new();
    for src in sources {
        let shown = crate::show::quoted(&src.display().to_string());
        match host_metadata(src, recursive) {
            Err(e) => refused.push(Failure::refused(format!("cp: cannot stat {shown}: {}", host_reason(&e)))),
            Ok(m) if m.is_dir() && !recursive => {
                refused.push(Failure::refused(format!("cp: -r not specified; omitting directory {shown}")))
            }
            Ok(_) => match (into_dir, src.file_name()) {
                // `DIR/.` into a directory: its contents, as GNU cp copies them
                // (each a new entry: one already there is refused now).
                (Some(dir), _) if copies_contents(src) => {
                    for child in host_children(src).context(cannot)? {
                        if fs.lookup(dir, child.as_bytes()).context(cannot)?.is_some() {
                            let e = Error::Exists(String::from_utf8_lossy(child.as_bytes()).into_owned());
                            refused.push(Failure::about(&format!("cp: cannot copy {shown} into {}", dest.quoted()), &e))
                        }
                    }
                }
                (Some(_), None) => refused.push(Failure::refused(format!(
                    "cp: cannot copy {shown} into {}: it has no name of its own",
                    dest.quoted()
                ))),
                // uext4's copy-in makes new entries only: one already there is refused now.
                (Some(dir), Some(name)) if fs.lookup(dir, name.as_bytes()).context(cannot)?.is_some() => {
                    let e = Error::Exists(String::from_utf8_lossy(name.as_bytes()).into_owned());
                    refused.push(Failure::about(&format!("cp: cannot copy {shown} into {}", dest.quoted()), &e))
                }
                _ => {}
            },
        }
    }
    let place = match into_dir {
        Some(dir) => Some((dir, None)),
        None if sources.len() != 1 => {
            let e = if resolved.ino.is_some() {
                Error::NotADirectory(String::new())
            } else {
                Error::NotFound(String::new())
            };
            refused.push(Failure::about(&format!("cp: target {}", dest.quoted()), &e));
            None
        }
        // cp would overwrite an existing file; uext4's copy-in makes new entries only.
        None if resolved.ino.is_some() => {
            refused.push(Failure::about(&cannot(), &Error::Exists("uext4 cp does not overwrite".into())));
            None
        }
        None if resolved.trailing_slash => {
            refused.push(Failure::about(&cannot(), &Error::NotADirectory(String::new())));
            None
        }
        None => resolved.entry().map(|(parent, name)| (parent, Some(name.to_vec()))),
    };
    if !refused.is_empty() {
        return Err(Failure::all(refused));
    }
    let Some((dir, name)) = place else { unreachable!("a missing destination has a name") };
    if pass == Pass::Check {
        return Ok(());
    }
    // The copy acts with the caller's own credentials (root may use the reserved
    // blocks), not those of the files' owners.
    // SAFETY: geteuid and getegid have no preconditions.
    let _caller = fs.acting_as(unsafe { Owner { uid: libc::geteuid(), gid: libc::getegid() } });
    let mut im = Importer::new(fs, recursive);
    let copy_one = |im: &mut Importer, src: &Path, name: &[u8]| -> CliResult<()> {
        let context =
            || format!("cp: cannot copy {} to {}", crate::show::quoted(&src.display().to_string()), dest.quoted());
        if jobs > 1 && recursive && std::fs::symlink_metadata(src).is_ok_and(|m| m.is_dir()) {
            let (files, bytes, lost) = crate::put_parallel::copy_tree(fs, src, dir, name, jobs).context(context)?;
            im.files += files;
            im.bytes += bytes;
            im.lost_attributes += lost;
        } else {
            im.copy(src, dir, name).context(context)?;
        }
        Ok(())
    };
    for src in sources {
        if name.is_none() && copies_contents(src) {
            for child in host_children(src).context(cannot)? {
                copy_one(&mut im, &src.join(&child), child.as_bytes())?;
            }
            continue;
        }
        let name = match &name {
            Some(n) => n.as_slice(),
            None => src.file_name().map(|n| n.as_bytes()).expect("checked above"),
        };
        copy_one(&mut im, src, name)?;
    }
    if im.progress.is_some() {
        eprintln!("\r{} files, {} MiB copied", im.files, im.bytes >> 20);
    }
    // As GNU cp -a ends when it cannot preserve an attribute: the copy is
    // whole otherwise, and the exit status says something was left out.
    if im.lost_attributes > 0 {
        return Err(Failure::refused(format!(
            "cp: {} extended attribute(s) could not be copied (named above)",
            im.lost_attributes
        )));
    }
    Ok(())
}
