//! `uext4 mount`, `uext4 umount` and `uext4 tune`.
//!
//! A mount holds an exclusive flock on the image for as long as its daemon
//! lives, so a second uext4 mount of the same image is refused, and `umount`
//! returns only once the daemon has written everything back and let go (the
//! image is then e2fsck-clean). SIGTERM, SIGINT and SIGHUP unmount the same
//! way. Without `--foreground` the daemon detaches once the mount is up and
//! reports errors to syslog; before that, errors reach the terminal.

use crate::fuse::{Uext4Fuse, TUNABLES_XATTR, TUNE_XATTR};
use clap::Args;
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uext4::{Error, Filesystem, Options, Result};

#[derive(Args)]
#[command(after_help = "Options (-o, comma-separated):\n  \
ro, rw                 read-only or read-write (default rw)\n  \
allow_other            let every user use the mount (permissions still apply)\n  \
allow_root             let root use the mount as well as its owner\n  \
default_permissions    the kernel checks permissions by mode and owner (always on)\n  \
threads=N              FUSE worker threads (default 4)\n  \
commit=SECS            journal commit interval (default 5)\n  \
cache_mb=N             buffer cache bound (default 256)\n  \
extent_zeroout_len=N   zero out unwritten extents of up to N blocks instead of splitting\n                         \
them (default 256; extent_max_zeroout_kb=KIB is the same in KiB); runtime: see `uext4 tune`\n  \
dir_ireserve, hash_goal, pdirops, inline_data   not implemented yet: only =off is accepted")]
pub struct MountArgs {
    /// Image file (or block device) holding the ext4 filesystem
    pub image: PathBuf,
    /// Directory to mount it on
    pub mountpoint: PathBuf,
    /// Mount options, comma-separated (see below)
    #[arg(short = 'o', value_delimiter = ',')]
    pub options: Vec<String>,
    /// Stay in the foreground, errors on stderr (otherwise detach once mounted)
    #[arg(short = 'f', long)]
    pub foreground: bool,
}

#[derive(Args)]
pub struct UmountArgs {
    /// Where a uext4 image is mounted
    pub mountpoint: PathBuf,
}

#[derive(Args)]
pub struct TuneArgs {
    /// Where a uext4 image is mounted
    pub mountpoint: PathBuf,
    /// key=value settings of runtime tunables; none: print every tunable
    pub settings: Vec<String>,
}

/// What `-o` asked for.
struct MountConfig {
    opts: Options,
    allow_other: bool,
    allow_root: bool,
    threads: usize,
}

fn parse_options(list: &[String]) -> Result<MountConfig> {
    let mut c = MountConfig {
        opts: Options { read_only: false, ..Options::default() },
        allow_other: false,
        allow_root: false,
        threads: 4,
    };
    for item in list.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        match item.split_once('=') {
            None => match item {
                "ro" => c.opts.read_only = true,
                "rw" => c.opts.read_only = false,
                "allow_other" => c.allow_other = true,
                "allow_root" => c.allow_root = true,
                "default_permissions" => {}
                _ => return Err(Error::Invalid(format!("unknown mount option {item}"))),
            },
            Some(("threads", n)) => {
                c.threads = n.parse().ok().filter(|&n| (1..=64).contains(&n)).ok_or_else(|| {
                    Error::Invalid(format!("threads={n}: want a number of worker threads from 1 to 64"))
                })?
            }
            Some((key, value)) => c.opts.set(key, value)?,
        }
    }
    Ok(c)
}

static DETACHED: AtomicBool = AtomicBool::new(false);

/// Errors of a running mount: stderr in the foreground, syslog once detached.
fn report(message: &str) {
    if DETACHED.load(Ordering::Relaxed) {
        if let Ok(text) = CString::new(message) {
            // SAFETY: both strings are NUL-terminated; "%s" consumes exactly one.
            unsafe { libc::syslog(libc::LOG_ERR, c"%s".as_ptr(), text.as_ptr()) };
        }
    } else {
        eprintln!("uext4: {message}");
    }
}

fn io_error(what: String, e: std::io::Error) -> Error {
    Error::Io(std::io::Error::new(e.kind(), format!("{what}: {e}")))
}

/// The image's mount lock: taken without waiting, or a clear refusal.
fn lock_image(image: &Path) -> Result<File> {
    let file = File::open(image).map_err(|e| io_error(format!("cannot open {}", image.display()), e))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(Error::Invalid(format!("{} is already mounted by uext4", image.display())));
    }
    Ok(file)
}

pub fn mount(a: MountArgs) -> Result<()> {
    let config = parse_options(&a.options)?;
    let image = a.image.canonicalize().map_err(|e| io_error(format!("cannot find {}", a.image.display()), e))?;
    let mountpoint =
        a.mountpoint.canonicalize().map_err(|e| io_error(format!("cannot find {}", a.mountpoint.display()), e))?;
    if !mountpoint.is_dir() {
        return Err(Error::Invalid(format!("{} is not a directory", mountpoint.display())));
    }
    if !Path::new("/dev/fuse").exists() {
        return Err(Error::unsupported("FUSE (/dev/fuse is missing; load the fuse module)"));
    }
    let lock = lock_image(&image)?;
    if a.foreground {
        return serve(&image, &mountpoint, config, &mut None).map(|()| drop(lock));
    }
    // Detach: the child mounts and serves; the parent waits to hear whether the
    // mount came up, so that errors still reach the terminal.
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors; close-on-exec keeps them from the
    // helpers the child runs, whose copies would hold the pipe open.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Error::Io(std::io::Error::last_os_error()));
    }
    // SAFETY: no other thread exists yet in this process.
    match unsafe { libc::fork() } {
        -1 => Err(Error::Io(std::io::Error::last_os_error())),
        0 => {
            // SAFETY: the read end belongs to the parent; the write end is ours alone.
            let mut status = Some(unsafe {
                libc::close(fds[0]);
                File::from_raw_fd(fds[1])
            });
            // SAFETY: setsid in the fresh child.
            unsafe { libc::setsid() };
            let result = serve(&image, &mountpoint, config, &mut status);
            if let Err(e) = &result {
                match status.as_mut() {
                    Some(told) => drop(writeln!(told, "{e}")),
                    None => report(&e.to_string()),
                }
            }
            drop(lock);
            std::process::exit(i32::from(result.is_err()));
        }
        _ => {
            // SAFETY: the write end belongs to the child.
            let mut status = unsafe {
                libc::close(fds[1]);
                File::from_raw_fd(fds[0])
            };
            let mut said = String::new();
            let _ = status.read_to_string(&mut said);
            let said = said.trim();
            if said.starts_with("mounted") {
                // The lock stays with the child (it shares this open file).
                std::mem::forget(lock);
                return Ok(());
            }
            Err(Error::Invalid(if said.is_empty() {
                "the mount daemon exited before mounting".into()
            } else {
                said.into()
            }))
        }
    }
}

/// Mounts and serves until unmounted; `status` hears "mounted" once it is up.
fn serve(image: &Path, mountpoint: &Path, config: MountConfig, status: &mut Option<File>) -> Result<()> {
    // Termination signals are taken by one thread (below); every thread started
    // from here on inherits the mask.
    // SAFETY: sigset operations on a local set.
    let signals = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let read_only = config.opts.read_only;
    let fs = Arc::new(Filesystem::open(image, config.opts)?);
    if !read_only && fs.is_read_only() {
        return Err(Error::ReadOnly(format!(
            "{} can only be mounted read-only: {}",
            image.display(),
            fs.read_only_reason()
        )));
    }
    fs.start_commit_timer()?;
    // allow_other and allow_root reach the kernel through the session's ACL.
    let options = vec![
        fuser::MountOption::FSName(image.display().to_string()),
        fuser::MountOption::Subtype("uext4".into()),
        fuser::MountOption::DefaultPermissions,
        if read_only { fuser::MountOption::RO } else { fuser::MountOption::RW },
    ];
    let mut fuse_config = fuser::Config::default();
    fuse_config.mount_options = options;
    fuse_config.acl = match (config.allow_other, config.allow_root) {
        (true, _) => fuser::SessionACL::All,
        (false, true) => fuser::SessionACL::RootAndOwner,
        _ => fuser::SessionACL::Owner,
    };
    fuse_config.n_threads = Some(config.threads);
    fuse_config.clone_fd = true;
    let adapter = Uext4Fuse::new(fs.clone(), report);
    let mounted = mount_directly(image, mountpoint, read_only, config.allow_other)
        .map_err(|e| io_error(format!("cannot mount on {}", mountpoint.display()), e))?;
    let session = match mounted {
        Some(dev) => fuser::Session::from_fd(adapter, dev, fuse_config.acl, fuse_config),
        // Not root: fuser goes through the setuid fusermount3.
        None => fuser::Session::new(adapter, mountpoint, &fuse_config),
    }
    .map_err(|e| io_error(format!("cannot mount on {}", mountpoint.display()), e))?;
    if let Some(mut told) = status.take() {
        let _ = writeln!(told, "mounted");
        detach_stdio();
    }
    let target = mountpoint.to_path_buf();
    std::thread::Builder::new().name("uext4-signals".into()).spawn(move || {
        let mut signal = 0;
        // SAFETY: waits on the set blocked above.
        unsafe { libc::sigwait(&signals, &mut signal) };
        report(&format!("signal {signal}: unmounting {}", target.display()));
        if let Err(e) = unmount(&target, true) {
            report(&format!("unmounting after signal {signal}: {e}"));
        }
    })?;
    session.run().map_err(|e| io_error("FUSE session".into(), e))?;
    // The session wrote everything back when it ended (destroy); this is the last
    // reference, and its close finds nothing left to do.
    drop(fs);
    Ok(())
}

/// As root, mounts /dev/fuse at `mountpoint` with mount(2), so that the mount
/// shows as fuse.uext4 (fuser's own direct mount says only "fuse"); None when
/// not permitted, leaving the mount to fusermount3.
fn mount_directly(
    image: &Path,
    mountpoint: &Path,
    read_only: bool,
    allow_other: bool,
) -> std::io::Result<Option<std::os::fd::OwnedFd>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let dev = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse")?;
    // SAFETY: geteuid/getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let mut data = format!("fd={},rootmode=40000,user_id={uid},group_id={gid},default_permissions", dev.as_raw_fd());
    if allow_other {
        data.push_str(",allow_other");
    }
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
    if read_only {
        flags |= libc::MS_RDONLY;
    }
    let (source, target) =
        (c_path(image).map_err(std::io::Error::other)?, c_path(mountpoint).map_err(std::io::Error::other)?);
    let data = CString::new(data).map_err(std::io::Error::other)?;
    // SAFETY: NUL-terminated strings that outlive the call.
    let r =
        unsafe { libc::mount(source.as_ptr(), target.as_ptr(), c"fuse.uext4".as_ptr(), flags, data.as_ptr().cast()) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::EPERM) { Ok(None) } else { Err(e) };
    }
    Ok(Some(dev.into()))
}

fn detach_stdio() {
    DETACHED.store(true, Ordering::Relaxed);
    // SAFETY: opening /dev/null and duplicating it over the standard descriptors.
    unsafe {
        libc::openlog(c"uext4".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON);
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
            if null > 2 {
                libc::close(null);
            }
        }
    }
}

/// Unmounts with fusermount (which anyone who mounted may use), or umount(2) as
/// root. `lazy` detaches even while files are open (for signals).
fn unmount(mountpoint: &Path, lazy: bool) -> Result<()> {
    let flags = if lazy { "-uz" } else { "-u" };
    let mut last = String::new();
    for tool in ["fusermount3", "fusermount"] {
        match Command::new(tool).arg(flags).arg(mountpoint).output() {
            Ok(out) if out.status.success() => return Ok(()),
            Ok(out) => last = String::from_utf8_lossy(&out.stderr).trim().to_string(),
            Err(_) => continue,
        }
    }
    let path = CString::new(mountpoint.as_os_str().as_bytes()).map_err(|_| Error::Invalid("NUL in path".into()))?;
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::umount2(path.as_ptr(), if lazy { libc::MNT_DETACH } else { 0 }) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    Err(Error::Invalid(format!(
        "cannot unmount {}: {}",
        mountpoint.display(),
        if last.is_empty() { e.to_string() } else { last }
    )))
}

/// The image behind a uext4 mount at `mountpoint`, from /proc/self/mountinfo.
fn mounted_image(mountpoint: &Path) -> Result<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let want = mountpoint.as_os_str().as_bytes();
    for line in info.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let at = left.split(' ').nth(4).map(unescape);
        let mut rest = right.split(' ');
        let (fstype, source) = (rest.next(), rest.next().map(unescape));
        if at.as_deref() == Some(want) && fstype == Some("fuse.uext4") {
            if let Some(source) = source {
                return Ok(PathBuf::from(std::ffi::OsStr::from_bytes(&source)));
            }
        }
    }
    Err(Error::NotFound(format!("{} is not a uext4 mount", mountpoint.display())))
}

/// mountinfo escapes space, tab, newline and backslash as \ooo.
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

pub fn umount(a: UmountArgs) -> Result<()> {
    let mountpoint =
        a.mountpoint.canonicalize().map_err(|e| io_error(format!("cannot find {}", a.mountpoint.display()), e))?;
    let image = mounted_image(&mountpoint)?;
    unmount(&mountpoint, false)?;
    // The daemon holds the image's lock until it has written everything back.
    let file = File::open(&image).map_err(|e| io_error(format!("cannot open {}", image.display()), e))?;
    let started = Instant::now();
    let mut told = false;
    // SAFETY: flock on a descriptor we own.
    while unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        if !told && started.elapsed() > Duration::from_secs(2) {
            eprintln!("uext4: waiting for the daemon to finish writing {} back", image.display());
            told = true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

pub fn tune(a: TuneArgs) -> Result<()> {
    let mountpoint =
        a.mountpoint.canonicalize().map_err(|e| io_error(format!("cannot find {}", a.mountpoint.display()), e))?;
    mounted_image(&mountpoint)?;
    let current = get_xattr(&mountpoint, TUNABLES_XATTR)?;
    if a.settings.is_empty() {
        print!("{current}");
        return Ok(());
    }
    for setting in &a.settings {
        let Some((key, _)) = setting.split_once('=') else {
            return Err(Error::Invalid(format!("'{setting}' is not key=value")));
        };
        // The kernel's name for the zero-out length, in KiB.
        let key = if key == "extent_max_zeroout_kb" { "extent_zeroout_len" } else { key };
        let Some(line) = current.lines().find(|l| l.split('=').next() == Some(key)) else {
            let known: Vec<&str> = current.lines().filter_map(|l| l.split('=').next()).collect();
            return Err(Error::Invalid(format!("unknown tunable {key} (known: {})", known.join(", "))));
        };
        if !line.ends_with("(runtime)") {
            return Err(Error::Invalid(format!("{key} is set when mounting (-o {key}=...), not while mounted")));
        }
        set_xattr(&mountpoint, TUNE_XATTR, setting.as_bytes())
            .map_err(|e| Error::Invalid(format!("{setting}: {e}")))?;
    }
    Ok(())
}

fn c_path(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Error::Invalid("NUL in path".into()))
}

fn get_xattr(path: &Path, name: &str) -> Result<String> {
    let (cpath, cname) = (c_path(path)?, CString::new(name).unwrap());
    let mut buf = vec![0u8; 4096];
    // SAFETY: buffer and its length are ours; strings are NUL-terminated.
    let n = unsafe { libc::getxattr(cpath.as_ptr(), cname.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io_error(format!("reading the tunables of {}", path.display()), std::io::Error::last_os_error()));
    }
    buf.truncate(n as usize);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let (cpath, cname) = (c_path(path).map_err(std::io::Error::other)?, CString::new(name).unwrap());
    // SAFETY: value and its length are ours; strings are NUL-terminated.
    let r = unsafe { libc::setxattr(cpath.as_ptr(), cname.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_options_parse_and_refuse_by_name() {
        let c = parse_options(&["ro".into(), "threads=8".into(), "commit=30".into(), "extent_zeroout_len=16".into()])
            .unwrap();
        assert!(c.opts.read_only);
        assert_eq!((c.threads, c.opts.commit_interval_secs, c.opts.extent_zeroout_len), (8, 30, 16));
        assert_eq!(parse_options(&["extent_max_zeroout_kb=32".into()]).unwrap().opts.extent_zeroout_len, 8);
        assert!(parse_options(&["pdirops=off".into()]).is_ok());
        let e = parse_options(&["pdirops=on".into()]).err().unwrap().to_string();
        assert!(e.contains("pdirops=on") && e.contains("not implemented"), "{e}");
        assert!(parse_options(&["nosuchoption".into()]).err().unwrap().to_string().contains("nosuchoption"));
        assert!(parse_options(&["threads=0".into()]).is_err());
    }

    #[test]
    fn mountinfo_fields_unescape() {
        assert_eq!(unescape(r"/tmp/a\040b"), b"/tmp/a b");
        assert_eq!(unescape(r"plain"), b"plain");
    }
}
