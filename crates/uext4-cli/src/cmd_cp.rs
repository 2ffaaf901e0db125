//! `uext4 cp -r IMAGE:/path HOSTDIR`: extraction.
//!
//! The image is untrusted. Host paths are built only from single, validated name
//! components under HOSTDIR; a name holding '/' or NUL, an extra "." or "..", or a
//! host path that already exists as a symlink is refused, so nothing is ever written
//! outside HOSTDIR. Files are created with O_EXCL (which never follows a symlink),
//! directories are checked to be real directories before entering them, and
//! ownership and times are set without following links. Only a file's data
//! runs are read (SEEK_DATA/SEEK_HOLE in the image); its holes stay holes.
//! Extended attributes (ACLs included) are copied as GNU cp -a copies them,
//! after the owner (a chown drops security.capability) and before the mode.

use crate::show::{escape, CliResult, Context, Failure};
use crate::target::{open_ro, resolve, Last, OpenArgs, Target};
use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs::{self, OpenOptions};
use std::io::{IsTerminal, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use uext4::format::inode::Timestamp;
use uext4::{Error, FileType, Filesystem, Result, Stat};

#[derive(clap::Args)]
pub struct CpArgs {
    /// Copy directories recursively
    #[arg(short = 'r', short_alias = 'R', long = "recursive")]
    recursive: bool,
    /// Copy-in: the same tree and image give the same bytes (with SOURCE_DATE_EPOCH
    /// for the times): written home directly, not through the journal, as
    /// mkfs.ext4 -d writes (a crash mid-copy leaves the image to be made again),
    /// on one thread in name order (it overrides -j), so no allocation depends on
    /// scheduling
    #[arg(long)]
    pub reproducible: bool,
    /// Accepted for cp's sake: modes, owners (as root), times and extended attributes are always kept
    #[arg(short = 'p', long = "preserve")]
    _preserve: bool,
    /// Copy in with N threads (default: the number of CPUs); the result equals -j 1's
    #[arg(short = 'j', long = "jobs", value_name = "N")]
    jobs: Option<usize>,
    /// SOURCE... DEST: either IMAGE:/path HOSTDIR (copy out) or HOSTPATH... IMAGE:/path (copy in)
    #[arg(required = true, num_args = 2..)]
    paths: Vec<String>,
    #[command(flatten)]
    open: OpenArgs,
}

struct OutArgs {
    recursive: bool,
    source: Target,
    dest: PathBuf,
    open: OpenArgs,
}

struct Extractor<'a> {
    fs: &'a Filesystem,
    /// First host path of each multiply-linked inode, to recreate hard links.
    links: HashMap<u32, PathBuf>,
    /// Directories whose times are set after their contents are written.
    dir_times: Vec<(PathBuf, Stat)>,
    /// Directory inodes entered so far: a second link to one is a loop in a damaged image.
    dirs_entered: std::collections::HashSet<u32>,
    is_root: bool,
    copied: u64,
    progress: bool,
    /// Entries of a recursive copy that could not be copied: reported as they
    /// happen, and the copy goes on with the rest, as GNU cp -r does.
    failures: u64,
    /// Extended attributes the host refused (reported as they happen); the
    /// copy ends with exit 1 and their count, as copy-in does.
    lost_attributes: u64,
    /// trusted.* and security.* attributes left out because only root may set
    /// them on the host (said once at the end, as device nodes are skipped).
    privileged_attributes_skipped: u64,
}

fn host_error(path: &Path, e: std::io::Error) -> Error {
    Error::Io(std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// A name from the image that is safe to use as one host path component.
fn safe_component(name: &[u8], where_: &str) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err(Error::corrupt(
            format!("refusing unsafe file name {:?} in the image", String::from_utf8_lossy(name)),
            where_.to_string(),
        ));
    }
    Ok(())
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("host paths built here contain no NUL")
}

fn timespec(t: Timestamp) -> libc::timespec {
    libc::timespec { tv_sec: t.sec as libc::time_t, tv_nsec: t.nsec.min(999_999_999) as libc::c_long }
}

/// Sets atime and mtime without following a symlink.
fn set_times(path: &Path, st: &Stat) -> Result<()> {
    let ts = [timespec(st.atime), timespec(st.mtime)];
    let c = cstr(path);
    // SAFETY: c is a valid NUL-terminated path and ts a two-element array, as utimensat requires.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) };
    if r != 0 {
        return Err(host_error(path, std::io::Error::last_os_error()));
    }
    Ok(())
}

/// lsetxattr: the attribute goes on `path` itself, a symlink included.
fn set_host_xattr(path: &Path, name: &[u8], value: &[u8]) -> std::io::Result<()> {
    let c = cstr(path);
    let n = CString::new(name).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: both strings are NUL-terminated; value and its length are ours.
    let r = unsafe { libc::lsetxattr(c.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn set_owner(path: &Path, st: &Stat) -> Result<()> {
    let c = cstr(path);
    // SAFETY: c is a valid NUL-terminated path.
    let r = unsafe { libc::lchown(c.as_ptr(), st.uid, st.gid) };
    if r != 0 {
        return Err(host_error(path, std::io::Error::last_os_error()));
    }
    Ok(())
}

impl Extractor<'_> {
    fn tick(&mut self) {
        self.copied += 1;
        if self.progress && self.copied.is_multiple_of(1000) {
            eprint!("\r{} files copied", self.copied);
            let _ = std::io::stderr().flush();
        }
    }

    /// Copies inode `ino` (named by `st`) to the host path `dst`, which does not exist yet.
    fn copy(&mut self, ino: u32, st: &Stat, dst: &Path, recursive: bool) -> Result<()> {
        if st.file_type != FileType::Directory && st.nlink > 1 {
            if let Some(first) = self.links.get(&ino) {
                fs::hard_link(first, dst).map_err(|e| host_error(dst, e))?;
                self.tick();
                return Ok(());
            }
            self.links.insert(ino, dst.to_path_buf());
        }
        match st.file_type {
            FileType::Directory => {
                if !recursive {
                    return Err(Error::Invalid(format!("{} is a directory (use -r)", dst.display())));
                }
                if !self.dirs_entered.insert(ino) {
                    return Err(Error::corrupt(
                        format!("directory inode {ino} is linked twice (a directory loop?)"),
                        dst.display().to_string(),
                    ));
                }
                self.make_dir(dst)?;
                self.copy_dir_contents(ino, dst)?;
                self.dir_times.push((dst.to_path_buf(), st.clone()));
            }
            FileType::Regular => self.copy_file(ino, st, dst)?,
            FileType::Symlink => {
                let target = self.fs.read_link(ino)?;
                // No host symlink holds these; the image's inode is what is wrong.
                if target.is_empty() || target.contains(&0) {
                    let what = if target.is_empty() { "an empty target" } else { "a NUL byte in its target" };
                    return Err(Error::corrupt(format!("symlink with {what}"), format!("inode {ino}")));
                }
                std::os::unix::fs::symlink(OsStr::from_bytes(&target), dst).map_err(|e| host_error(dst, e))?;
            }
            FileType::Fifo | FileType::CharDevice | FileType::BlockDevice => self.make_node(st, dst)?,
            FileType::Socket => {
                eprintln!("uext4: skipping socket {}", escape(dst.as_os_str().as_bytes()));
                return Ok(());
            }
        }
        if self.is_root {
            set_owner(dst, st)?;
        }
        self.copy_xattrs(ino, dst)?;
        if st.file_type != FileType::Symlink {
            fs::set_permissions(dst, fs::Permissions::from_mode(st.perm as u32)).map_err(|e| host_error(dst, e))?;
        }
        if st.file_type != FileType::Directory {
            set_times(dst, st)?;
        }
        self.tick();
        Ok(())
    }

    /// Sets `ino`'s extended attributes on `dst` (not following a symlink). The
    /// host may refuse one (a filesystem without xattrs, user.* on a symlink):
    /// that is reported and counted, and the copy goes on.
    fn copy_xattrs(&mut self, ino: u32, dst: &Path) -> Result<()> {
        for (name, value) in self.fs.xattrs(ino)? {
            let privileged = name.starts_with(b"trusted.") || name.starts_with(b"security.");
            if privileged && !self.is_root {
                self.privileged_attributes_skipped += 1;
                continue;
            }
            if let Err(e) = set_host_xattr(dst, &name, &value) {
                self.lost_attributes += 1;
                eprintln!("uext4: cp: {}: attribute {}: {e}", escape(dst.as_os_str().as_bytes()), escape(&name));
            }
        }
        Ok(())
    }

    /// Creates `dst` as a directory, or accepts an existing real directory; a symlink
    /// or file in its place is refused (it could lead outside the destination).
    fn make_dir(&self, dst: &Path) -> Result<()> {
        match fs::create_dir(dst) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let m = fs::symlink_metadata(dst).map_err(|e| host_error(dst, e))?;
                if m.file_type().is_dir() {
                    Ok(())
                } else {
                    Err(Error::Exists(format!(
                        "{} exists and is not a directory; refusing to write through it",
                        dst.display()
                    )))
                }
            }
            Err(e) => Err(host_error(dst, e)),
        }
    }

    fn copy_dir_contents(&mut self, dir: u32, dst: &Path) -> Result<()> {
        let entries = self.fs.read_dir(dir)?;
        let where_ = format!("directory inode {dir}");
        let (mut dot, mut dotdot) = (false, false);
        for e in &entries {
            // The genuine "." and ".." are the first of each name in the listing
            // (first on disk; in a hashed listing equal names keep their disk
            // order); any later one is hostile, and refused below.
            let first = match &e.name[..] {
                b"." => !std::mem::replace(&mut dot, true),
                b".." => !std::mem::replace(&mut dotdot, true),
                _ => false,
            };
            if first {
                continue;
            }
            let child = dst.join(OsStr::from_bytes(&e.name));
            let copied = safe_component(&e.name, &where_)
                .and_then(|()| self.fs.stat(e.ino))
                .and_then(|st| self.copy(e.ino, &st, &child, true));
            if let Err(err) = copied {
                // The host is out of room or gone: nothing later can succeed.
                if matches!(&err, Error::Io(io) if io.kind() == std::io::ErrorKind::StorageFull) {
                    return Err(err);
                }
                eprintln!("uext4: cp: cannot copy to {}: {err}", escape(child.as_os_str().as_bytes()));
                self.failures += 1;
            }
        }
        Ok(())
    }

    fn copy_file(&mut self, ino: u32, st: &Stat, dst: &Path) -> Result<()> {
        // create_new is O_CREAT|O_EXCL: it fails on anything already there, symlinks included.
        let f =
            OpenOptions::new().write(true).create_new(true).mode(0o600).open(dst).map_err(|e| host_error(dst, e))?;
        let mut buf = vec![0u8; 1 << 20];
        // Only the file's data runs are read (SEEK_DATA / SEEK_HOLE in the
        // image): a sparse file of terabytes takes the time of its data.
        let mut off = 0u64;
        while let Some(data) = self.fs.seek_data_or_hole(ino, off, true)? {
            let hole = self.fs.seek_data_or_hole(ino, data, false)?.unwrap_or(st.size).min(st.size);
            off = data;
            while off < hole {
                let want = ((hole - off) as usize).min(buf.len());
                let n = self.fs.read(ino, off, &mut buf[..want])?;
                if n == 0 {
                    break;
                }
                // Keep holes as holes: write only the 4 KiB pieces that hold data; set_len
                // below extends the file over a trailing hole.
                use std::os::unix::fs::FileExt;
                for (i, piece) in buf[..n].chunks(4096).enumerate() {
                    if piece.iter().any(|&b| b != 0) {
                        f.write_all_at(piece, off + (i * 4096) as u64).map_err(|e| host_error(dst, e))?;
                    }
                }
                off += n as u64;
            }
            if off >= st.size || off < hole {
                break;
            }
        }
        f.set_len(st.size).map_err(|e| host_error(dst, e))?;
        Ok(())
    }

    fn make_node(&self, st: &Stat, dst: &Path) -> Result<()> {
        let c = cstr(dst);
        let (kind, dev) = match st.file_type {
            FileType::Fifo => (libc::S_IFIFO, 0),
            FileType::CharDevice => (libc::S_IFCHR, libc::makedev(st.rdev.0, st.rdev.1)),
            _ => (libc::S_IFBLK, libc::makedev(st.rdev.0, st.rdev.1)),
        };
        // SAFETY: c is a valid NUL-terminated path.
        let r = unsafe { libc::mknod(c.as_ptr(), kind | 0o600, dev) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            if st.file_type != FileType::Fifo && e.raw_os_error() == Some(libc::EPERM) {
                eprintln!("uext4: skipping device node {} (needs root)", escape(dst.as_os_str().as_bytes()));
                return Ok(());
            }
            return Err(host_error(dst, e));
        }
        Ok(())
    }
}

impl CpArgs {
    /// A recursive copy out of an image, as the demo uses it.
    pub fn new(source: Target, dest: PathBuf, open: OpenArgs) -> CpArgs {
        let src = format!("{}:{}", source.image.display(), String::from_utf8_lossy(&source.path));
        CpArgs {
            recursive: true,
            reproducible: false,
            _preserve: true,
            jobs: None,
            paths: vec![src, dest.display().to_string()],
            open,
        }
    }
}

pub fn run(a: CpArgs) -> CliResult<()> {
    let last = a.paths.last().expect("clap requires two paths");
    if Target::names_image(last) {
        if a.reproducible {
            crate::target::set_bypass_journal();
        }
        let dest = Target::parse(last).map_err(Failure::refused)?;
        // A source in an image (and not a host path that merely looks like one).
        if let Some(src) =
            a.paths[..a.paths.len() - 1].iter().find(|p| Target::names_image(p) && !Path::new(p).exists())
        {
            return Err(Failure::refused(format!(
                "cp: cannot copy '{src}' into an image: copying from an image into an image is not supported \
                 (copy it out to a host directory, then in)"
            )));
        }
        let sources: Vec<PathBuf> = a.paths[..a.paths.len() - 1].iter().map(PathBuf::from).collect();
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        // Threads allocate inodes and blocks in whatever order they run.
        let jobs = if a.reproducible { 1 } else { a.jobs.unwrap_or(cpus).max(1) };
        return crate::cmd_put::copy_in(&sources, &dest, a.recursive, jobs);
    }
    if a.paths.len() != 2 || !Target::names_image(&a.paths[0]) {
        return Err(Failure::refused("cp needs IMAGE:/path HOSTDIR (copy out) or HOSTPATH... IMAGE:/path (copy in)"));
    }
    let source = Target::parse(&a.paths[0]).map_err(Failure::refused)?;
    copy_out(source, PathBuf::from(&a.paths[1]), a.recursive, &a.open)
}

fn copy_out(source: Target, dest: PathBuf, recursive: bool, open: &OpenArgs) -> CliResult<()> {
    let a = OutArgs { recursive, source, dest, open: open.clone() };
    let fs = open_ro(&a.source.image, &a.open).map_err(|e| Failure::refused(format!("cp: {e}")))?;
    let cannot = || format!("cp: cannot stat {}", a.source.quoted());
    let resolved = resolve(&fs, &a.source).context(cannot)?;
    let ino = resolved.existing(&a.source).context(cannot)?;
    let st = fs.stat(ino).context(cannot)?;
    // GNU cp's words, naming the source (not the host path it would have made).
    if st.file_type == FileType::Directory && !a.recursive {
        return Err(Failure::refused(format!("cp: -r not specified; omitting directory {}", a.source.quoted())));
    }
    let mut ex = Extractor {
        fs: &fs,
        links: HashMap::new(),
        dir_times: Vec::new(),
        dirs_entered: std::collections::HashSet::new(),
        // SAFETY: geteuid has no preconditions.
        is_root: unsafe { libc::geteuid() } == 0,
        copied: 0,
        progress: std::io::stderr().is_terminal(),
        failures: 0,
        lost_attributes: 0,
        privileged_attributes_skipped: 0,
    };
    // As cp does: into an existing directory under the source's own name, else as DEST.
    // The root or a final '.' (`cp -r IMG:/dir/. HOSTDIR`): the contents go straight
    // into an existing HOSTDIR. A final '..' has no name to take there.
    let dest_is_dir = fs::symlink_metadata(&a.dest).map(|m| m.is_dir()).unwrap_or(false);
    match (dest_is_dir, resolved.last) {
        (true, Last::Root | Last::Dot) => {
            if !a.recursive {
                return Err(Failure::about(
                    &format!("cp: {}", a.source.quoted()),
                    &Error::IsADirectory("use -r".into()),
                ));
            }
            ex.dirs_entered.insert(ino);
            ex.copy_dir_contents(ino, &a.dest)?;
        }
        (true, Last::DotDot) => {
            return Err(Failure::refused(format!(
                "cp: refusing to copy {} into {}: '..' names no entry there (name the directory instead)",
                a.source.quoted(),
                crate::show::quoted(&a.dest.display().to_string())
            )))
        }
        (true, Last::Name(name)) => {
            safe_component(&name, "source path")?;
            let dst = a.dest.join(OsStr::from_bytes(&name));
            ex.copy(ino, &st, &dst, a.recursive)?;
        }
        (false, _) => ex.copy(ino, &st, &a.dest, a.recursive)?,
    }
    // Directory times last, deepest first, since writing into a directory changes them.
    for (path, st) in ex.dir_times.iter().rev() {
        set_times(path, st)?;
    }
    if ex.progress && ex.copied >= 1000 {
        eprintln!("\r{} files copied", ex.copied);
    }
    if ex.privileged_attributes_skipped > 0 {
        eprintln!(
            "uext4: cp: {} trusted.* or security.* attribute(s) left out (only root may set them)",
            ex.privileged_attributes_skipped
        );
    }
    match (ex.failures, ex.lost_attributes) {
        (0, 0) => Ok(()),
        (0, lost) => {
            Err(Failure::refused(format!("cp: {lost} extended attribute(s) could not be copied (named above)")))
        }
        (n, _) => Err(Failure::refused(format!(
            "cp: {n} {} could not be copied (named above); the rest were",
            if n == 1 { "entry" } else { "entries" }
        ))),
    }
}
