//! `uext4 mount`, `uext4 umount`, `uext4 sync` and `uext4 tune`.
//!
//! A mount holds the exclusive lock of its region of the image (the library's,
//! see `uext4::dev`) for as long as its daemon lives, so a second mount and
//! every writable open of that region are refused. `umount` succeeds only when the
//! daemon tells it, over an abstract Unix socket named by the image, that it
//! wrote everything back, and the image then needs no journal recovery; a
//! daemon that is gone or dies first makes it fail. SIGTERM, SIGINT and SIGHUP
//! unmount the same way. Without `--foreground` the daemon detaches once the
//! mount is up and reports errors to syslog; before that, errors reach the
//! terminal.

use crate::fuse::server::{Allowed, AtimeMode, Uext4Fuse};
use crate::fuse::{SessionConfig, UringMode, TUNABLES_XATTR, TUNE_XATTR};
use clap::Args;
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uext4::dev::{BlockDevice, FileDevice};
use uext4::{Error, Filesystem, Options, Result};

#[derive(Args)]
#[command(after_help = "Options (-o, comma-separated):\n  \
ro, rw                 read-only or read-write (default rw)\n  \
allow_other            let every user use the mount (permissions still apply)\n  \
allow_root             let root use the mount as well as its owner\n  \
default_permissions    the kernel checks permissions by mode and owner (always on)\n  \
threads=N              /dev/fuse worker threads (default 4)\n  \
io_uring[=auto|on|off] requests through an io_uring queue per CPU (Linux 6.14+): auto (the\n                         \
default) when the fuse module allows it (/sys/module/fuse/parameters/enable_uring),\n                         \
on: always, switching that parameter on if needed (root), off: never\n  \
writeback_cache=on|off the kernel's page cache holds writes and sends them in page runs;\n                         \
it keeps files' size and mtime (default off)\n  \
splice_read=on|off     /dev/fuse replies to reads spliced from the image: one copy of the\n                         \
data instead of two (default on; io_uring replies are copied)\n  \
commit=SECS            journal commit interval (default 5)\n  \
cache_mb=N             buffer cache bound (default 256)\n  \
errors=continue|remount-ro|panic   what an I/O error or inconsistency does, as the kernel's\n                         \
(default: the superblock's, else remount-ro); a journal abort is always read-only;\n                         \
panic ends the session at the first error (the mount goes away)\n  \
extent_zeroout_len=N   zero out unwritten extents of up to N blocks instead of splitting\n                         \
them (default 256; extent_max_zeroout_kb=KIB is the same in KiB); runtime: see `uext4 tune`\n  \
dir_ireserve=off|low|normal|high|N   keep windows of 16, 64, 128 or N inode slots for each\n                         \
new directory's files (seed 000; default off)\n  \
hash_goal=on|off       in indexed directories, place inodes in name-hash order (seed 003; default off)\n  \
pdirops=on|off         changes in one indexed directory lock their names, not the directory\n                         \
(seed 002; default on)\n  \
inline_data=on|off     on images with the inline_data feature, keep new small files and\n                         \
directories in their inodes as the kernel does (seed 004; default on)\n  \
suid, dev, exec / nosuid, nodev, noexec   as mount(8)'s (default nosuid,nodev)\n  \
relatime, strictatime, noatime   when reads move atime (default relatime)\n  \
defaults, auto, noauto, user, users, nofail, _netdev, x-*, comment=   fstab's own: accepted, ignored\n\n\
As a mount helper: `mount -t fuse.uext4 IMAGE DIR -o OPTS` and fstab lines of type fuse.uext4 run\n\
mount.fuse3, which runs `uext4 IMAGE DIR -o OPTS` (scripts/install puts uext4 where it looks).")]
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
pub struct SyncArgs {
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
    uring: UringMode,
    writeback_cache: bool,
    splice_reads: bool,
    /// mount(2) flags beyond ro: nosuid and nodev unless `suid`/`dev` ask
    /// otherwise (as libfuse's defaults), noexec when asked.
    flags: libc::c_ulong,
    atime: AtimeMode,
}

/// Options mount(8) and fstab hand to every helper that only say how the
/// line is mounted (at boot or not, by whom, whether failing stops boot), or
/// are comments: mount(8) acts on them itself, so a helper accepts and ignores
/// them when they reach it (as mount.fuse3 passes some through).
fn is_fstab_only(item: &str) -> bool {
    matches!(
        item,
        "defaults"
            | "auto"
            | "noauto"
            | "user"
            | "nouser"
            | "users"
            | "owner"
            | "group"
            | "nofail"
            | "_netdev"
            | "async"
            | "lazytime"
            | "nolazytime"
            | "loud"
            | "silent"
    ) || item.starts_with("x-")
        || item.starts_with("comment=")
}

fn parse_options(list: &[String]) -> Result<MountConfig> {
    let mut c = MountConfig {
        opts: crate::target::options(false),
        allow_other: false,
        allow_root: false,
        threads: 4,
        uring: UringMode::Auto,
        writeback_cache: false,
        splice_reads: true,
        flags: libc::MS_NOSUID | libc::MS_NODEV,
        atime: AtimeMode::Relatime,
    };
    for item in list.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        if is_fstab_only(item) {
            continue;
        }
        match item.split_once('=') {
            None => match item {
                "ro" => c.opts.read_only = true,
                "rw" => c.opts.read_only = false,
                "suid" => c.flags &= !libc::MS_NOSUID,
                "nosuid" => c.flags |= libc::MS_NOSUID,
                "dev" => c.flags &= !libc::MS_NODEV,
                "nodev" => c.flags |= libc::MS_NODEV,
                "exec" => c.flags &= !libc::MS_NOEXEC,
                "noexec" => c.flags |= libc::MS_NOEXEC,
                "relatime" | "atime" | "diratime" | "nodiratime" => c.atime = AtimeMode::Relatime,
                "strictatime" | "norelatime" => c.atime = AtimeMode::Strict,
                "noatime" => c.atime = AtimeMode::Never,
                "sync" | "dirsync" => {
                    return Err(Error::unsupported(format!(
                        "mount option {item} (writes are journaled; fsync or `uext4 sync` makes them durable)"
                    )))
                }
                "allow_other" => c.allow_other = true,
                "allow_root" => c.allow_root = true,
                "default_permissions" => {}
                "io_uring" => c.uring = UringMode::On,
                _ => return Err(Error::Invalid(format!("unknown mount option {item}"))),
            },
            Some(("threads", n)) => {
                c.threads = n.parse().ok().filter(|&n| (1..=64).contains(&n)).ok_or_else(|| {
                    Error::Invalid(format!("threads={n}: want a number of worker threads from 1 to 64"))
                })?
            }
            Some(("writeback_cache", mode)) => {
                c.writeback_cache = match mode {
                    "on" => true,
                    "off" => false,
                    _ => return Err(Error::Invalid(format!("writeback_cache={mode}: want on or off"))),
                }
            }
            Some(("splice_read", mode)) => {
                c.splice_reads = match mode {
                    "on" => true,
                    "off" => false,
                    _ => return Err(Error::Invalid(format!("splice_read={mode}: want on or off"))),
                }
            }
            Some(("io_uring", mode)) => {
                c.uring = match mode {
                    "on" => UringMode::On,
                    "off" => UringMode::Off,
                    "auto" => UringMode::Auto,
                    _ => return Err(Error::Invalid(format!("io_uring={mode}: want on, off or auto"))),
                }
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

/// Opens the image for a mount: with the exclusive lock of its region (a
/// second mount of it, and every writable open, is refused while the mount
/// lives; other partitions of the image stay free), refused while the kernel
/// has that region mounted unless this mount is read-only.
fn open_image(image: &Path, read_only: bool, region: uext4::dev::Region) -> Result<FileDevice> {
    let dev = FileDevice::open_locked(image, !read_only, region)?;
    if let Some(who) = dev.in_use() {
        eprintln!("uext4: warning: {} is in use by {who}; this read-only mount may see it change", image.display());
    }
    Ok(dev)
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
    let dev = open_image(&image, config.opts.read_only, config.opts.region)?;
    if a.foreground {
        return serve(&image, dev, &mountpoint, config, &mut None);
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
            let result = serve(&image, dev, &mountpoint, config, &mut status);
            if let Err(e) = &result {
                match status.as_mut() {
                    Some(told) => drop(writeln!(told, "{e}")),
                    None => report(&e.to_string()),
                }
            }
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
            // The lock stays with the child: it shares this open file, and
            // closing our descriptor of it releases nothing.
            drop(dev);
            if said.starts_with("mounted") {
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

/// The abstract Unix socket on which the daemon serving a mount tells `uext4
/// umount` how it ended, named by the mount's device number (mountinfo's
/// major:minor): the mount, not the image path, which may since have been
/// renamed, removed or replaced by another image.
fn ending_socket(mount: &MountEntry) -> std::io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(format!("uext4-mount-{}", mount.device))
}

/// Those waiting to hear how the daemon ended: `umount` connects before it
/// unmounts, and reads "clean" once everything is written back and the image
/// let go, "failed: why" if not, and nothing (end of file) if the daemon died.
#[derive(Clone, Default)]
struct Listeners(Arc<parking_lot::Mutex<Vec<std::os::unix::net::UnixStream>>>);

impl Listeners {
    /// Accepts listeners on the socket of the mount at `mountpoint`, once it is
    /// up, for as long as the daemon lives.
    fn start(&self, mountpoint: &Path) {
        let mount = match mounted_here(mountpoint) {
            Ok(m) => m,
            Err(e) => {
                report(&format!("umount will not hear how this mount ends: {e}"));
                return;
            }
        };
        // A device number is reused once its mount is gone: the daemon of an
        // earlier mount may be a moment from exiting.
        let bind = || ending_socket(&mount).and_then(|a| std::os::unix::net::UnixListener::bind_addr(&a));
        let mut bound = bind();
        let deadline = Instant::now() + Duration::from_secs(5);
        while bound.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::AddrInUse) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            bound = bind();
        }
        let socket = match bound {
            Ok(s) => s,
            Err(e) => {
                report(&format!("umount will not hear how this mount ends: {e}"));
                return;
            }
        };
        let list = self.clone();
        let spawned = std::thread::Builder::new().name("uext4-ending".into()).spawn(move || {
            for stream in socket.incoming().flatten() {
                let mut waiting = list.0.lock();
                // Anyone may connect: a bound on what they can make us hold.
                if waiting.len() >= 64 {
                    waiting.remove(0);
                }
                waiting.push(stream);
            }
        });
        if let Err(e) = spawned {
            report(&format!("umount will not hear how this mount ends: {e}"));
        }
    }

    /// `offset`: where the filesystem starts in the image, and `image`: the
    /// image's device and inode, for umount's check of it.
    fn tell(&self, ended: &Result<()>, offset: u64, image: (u64, u64)) {
        let text = match ended {
            Ok(()) => format!("clean offset={offset} image={}:{}\n", image.0, image.1),
            Err(e) => format!("failed: {e}\n"),
        };
        for mut stream in self.0.lock().drain(..) {
            let _ = stream.write_all(text.as_bytes());
        }
    }
}

/// Mounts and serves until unmounted; `status` hears "mounted" once it is up,
/// and `uext4 umount` how it ended.
fn serve(
    image: &Path,
    dev: FileDevice,
    mountpoint: &Path,
    config: MountConfig,
    status: &mut Option<File>,
) -> Result<()> {
    // Termination signals are taken by one thread (see serve_session); every thread started
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
    // A panic is contained where it happens (see the server); this only makes
    // sure its message and place reach the log once detached. An errors=panic
    // stop is not a bug but the image's choice: as the kernel's panic stops the
    // machine, the daemon ends the session at once, from whichever thread met the
    // error (a request, the journal's commit): every waiting and later request
    // fails, and the library, read-only since the error, writes nothing more.
    let stop_target = mountpoint.to_path_buf();
    let stopped = std::sync::Once::new();
    std::panic::set_hook(Box::new(move |info| {
        let message = crate::panic_text(info.payload());
        if !uext4::is_errors_panic(&message) {
            report(&format!("panic: {info}"));
            return;
        }
        stopped.call_once(|| {
            report(&format!(
                "{}; ending the session on {} (errors=panic)",
                message.trim_start_matches("uext4: "),
                stop_target.display()
            ));
            abort_connection(&stop_target);
        });
    }));
    let listeners = Listeners::default();
    let offset = config.opts.region.locate(&dev).map_or(0, |(start, _)| start);
    let identity = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(image).map_or((0, 0), |m| (m.dev(), m.ino()))
    };
    let ended = serve_session(image, dev, mountpoint, config, status, signals, &listeners);
    listeners.tell(&ended, offset, identity);
    ended
}

fn serve_session(
    image: &Path,
    dev: FileDevice,
    mountpoint: &Path,
    config: MountConfig,
    status: &mut Option<File>,
    signals: libc::sigset_t,
    listeners: &Listeners,
) -> Result<()> {
    let read_only = config.opts.read_only;
    let dev: Arc<dyn BlockDevice> = match std::env::var_os("UEXT4_TEST_FLUSH_GATE") {
        // Test hook: the device's flushes wait while this file exists.
        Some(gate) => Arc::new(uext4::dev::GatedFlushDevice::new(Arc::new(dev), Some(gate.into()))),
        None => Arc::new(dev),
    };
    let dev = match std::env::var("UEXT4_TEST_UNREADABLE").ok().and_then(|v| byte_range(&v)) {
        // Test hook: reads of these bytes fail with EIO, as on a bad sector.
        Some(bytes) => Arc::new(uext4::dev::BadSpotDevice::new(dev, uext4::dev::BadSpot::Reads(bytes), true)),
        None => dev,
    };
    let fs = Arc::new(Filesystem::open_device(dev, config.opts)?);
    if !read_only && fs.is_read_only() {
        return Err(Error::ReadOnly(format!(
            "{} can only be mounted read-only: {}",
            image.display(),
            fs.read_only_reason()
        )));
    }
    fs.start_commit_timer()?;
    if config.uring == UringMode::On && !crate::fuse::uring::kernel_allows() {
        crate::fuse::uring::kernel_allow().map_err(|e| {
            io_error("io_uring=on: cannot switch on /sys/module/fuse/parameters/enable_uring".into(), e)
        })?;
    }
    // Spliced replies go through /dev/fuse only, and carry reads that fit the
    // pipe this process may make: the kernel is told that limit (max_read).
    let through_ring =
        config.uring == UringMode::On || config.uring == UringMode::Auto && crate::fuse::uring::kernel_allows();
    let spliced_read_max = match config.splice_reads && !through_ring {
        true => crate::fuse::channel::spliced_read_max(crate::fuse::MAX_WRITE),
        false => None,
    };
    let dev = mount_fuse(
        image,
        mountpoint,
        read_only,
        config.flags,
        config.allow_other || config.allow_root,
        spliced_read_max,
    )
    .map_err(|e| io_error(format!("cannot mount on {}", mountpoint.display()), e))?;
    let allowed = match (config.allow_other, config.allow_root) {
        (false, true) => Allowed::RootAndOwner(effective_ids().0),
        _ => Allowed::Everyone,
    };
    let server = Arc::new(Uext4Fuse::new(fs.clone(), allowed, report).with_atime(config.atime));
    let target = mountpoint.to_path_buf();
    let abort_target = target.clone();
    let session = SessionConfig {
        threads: config.threads,
        uring: config.uring,
        writeback_cache: config.writeback_cache,
        splice_reads: spliced_read_max.is_some(),
        abort: Arc::new(move || abort_connection(&abort_target)),
    };
    let signal_target = target.clone();
    let served = crate::fuse::run(server.clone(), dev, &session, || {
        raise_readahead(&target, spliced_read_max.unwrap_or(crate::fuse::MAX_WRITE));
        listeners.start(&target);
        if let Some(mut told) = status.take() {
            let _ = writeln!(told, "mounted");
            detach_stdio();
        }
        let spawned = std::thread::Builder::new().name("uext4-signals".into()).spawn(move || {
            let mut signal = 0;
            // SAFETY: waits on the set blocked above.
            unsafe { libc::sigwait(&signals, &mut signal) };
            report(&format!("signal {signal}: unmounting {}", signal_target.display()));
            if let Err(e) = unmount(&signal_target, true) {
                report(&format!("unmounting after signal {signal}: {e}"));
            }
        });
        if let Err(e) = spawned {
            report(&format!("cannot watch for signals: {e}"));
        }
    });
    if uext4::errors_panicked() {
        // The hook above ended the session; whatever the workers then met is its echo.
        drop(server);
        drop(fs);
        return Err(Error::Io(std::io::Error::other(format!(
            "the mount of {} stopped by errors=panic (the error is recorded in the superblock); run e2fsck -f",
            image.display()
        ))));
    }
    if let Err(e) = served {
        // Unmount what we mounted, so no dead mount is left behind.
        let _ = unmount(mountpoint, true);
        return Err(io_error("FUSE session".into(), e));
    }
    let panicked = server.has_failed();
    drop(server);
    // The session wrote everything back when it ended (destroy); this is the last
    // reference, and its close finds nothing left to do.
    drop(fs);
    if panicked {
        return Err(Error::Invalid(format!(
            "a request panicked while {} was mounted (see the log): what it was doing may be half done; \
             check the image with e2fsck -f",
            image.display()
        )));
    }
    Ok(())
}

/// `START:LEN` in bytes, as the test hooks take a range.
fn byte_range(text: &str) -> Option<std::ops::Range<u64>> {
    let (start, len) = text.split_once(':')?;
    let start: u64 = start.parse().ok()?;
    Some(start..start.checked_add(len.parse().ok()?)?)
}

/// Mounts a new FUSE session at `mountpoint` and returns its /dev/fuse
/// descriptor: with mount(2) as root, so that the mount shows as fuse.uext4,
/// and otherwise through the setuid fusermount3, as libfuse does.
/// allow_root reaches the kernel as allow_other; the server then refuses
/// everyone else (see `Allowed`).
fn mount_fuse(
    image: &Path,
    mountpoint: &Path,
    read_only: bool,
    flags: libc::c_ulong,
    others: bool,
    max_read: Option<u32>,
) -> std::io::Result<OwnedFd> {
    let max_read = max_read.map(|n| format!(",max_read={n}")).unwrap_or_default();
    if crate::fuse::server::is_root() {
        if let Some(dev) = mount_directly(image, mountpoint, read_only, flags, others, &max_read)? {
            return Ok(dev);
        }
    }
    // fusermount3 makes a user's mount nosuid and nodev whatever it is told.
    let mut options = format!(
        "{},nosuid,nodev,{},default_permissions,fsname={},subtype=uext4",
        if read_only { "ro" } else { "rw" },
        if flags & libc::MS_NOEXEC != 0 { "noexec" } else { "exec" },
        image.display().to_string().replace(',', "\\,")
    );
    if others {
        options.push_str(",allow_other");
    }
    options.push_str(&max_read);
    mount_with_fusermount(mountpoint, &options)
}

/// mount(2) of /dev/fuse; None when not permitted.
fn mount_directly(
    image: &Path,
    mountpoint: &Path,
    read_only: bool,
    flags: libc::c_ulong,
    allow_other: bool,
    max_read: &str,
) -> std::io::Result<Option<OwnedFd>> {
    let dev = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse")?;
    let (uid, gid) = effective_ids();
    let mut data = format!("fd={},rootmode=40000,user_id={uid},group_id={gid},default_permissions", dev.as_raw_fd());
    if allow_other {
        data.push_str(",allow_other");
    }
    data.push_str(max_read);
    let mut flags = flags;
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

/// fusermount3's protocol: it mounts, then passes the /dev/fuse descriptor back
/// over the Unix socket named by _FUSE_COMMFD (one byte of data, the descriptor
/// in an SCM_RIGHTS message).
fn mount_with_fusermount(mountpoint: &Path, options: &str) -> std::io::Result<OwnedFd> {
    let mut pair = [0; 2];
    // SAFETY: socketpair fills two descriptors.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, pair.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and owned here alone.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) };
    // SAFETY: fcntl on our own descriptor: ours must not leak into the helper.
    unsafe { libc::fcntl(ours.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    let tool = if Command::new("fusermount3").arg("-V").output().is_ok() { "fusermount3" } else { "fusermount" };
    let child = Command::new(tool)
        .arg("-o")
        .arg(options)
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot run {tool}: {e}")))?;
    drop(theirs);
    let received = receive_fd(&ours);
    let out = child.wait_with_output()?;
    match received {
        Ok(fd) => Ok(fd),
        Err(e) => {
            let said = String::from_utf8_lossy(&out.stderr).trim().to_string();
            Err(std::io::Error::other(if said.is_empty() { format!("{tool}: {e}") } else { said }))
        }
    }
}

fn receive_fd(socket: &OwnedFd) -> std::io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    // Room for one cmsghdr carrying one int, aligned as the kernel wants.
    let mut control = [0u64; 4];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    // SAFETY: a zeroed msghdr pointing at our buffers, read by recvmsg and then
    // walked with the CMSG macros within the control length it reports.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control);
        let n = libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if n == 0 || cmsg.is_null() || (*cmsg).cmsg_type != libc::SCM_RIGHTS {
            return Err(std::io::Error::other("the mount helper sent no descriptor"));
        }
        let fd = (libc::CMSG_DATA(cmsg) as *const i32).read_unaligned();
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// The mount's "major:minor" device, from mountinfo (a stat would be a FUSE
/// request to this very daemon).
fn mount_device(mountpoint: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mountpoint.as_os_str().as_bytes();
    info.lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find_map(|f| (f.len() > 4 && unescape(f[4]) == want).then(|| f[2].to_string()))
}

/// Aborts the FUSE connection (every waiting request fails with ECONNABORTED)
/// through the fuse control filesystem, mounting it first if need be (as
/// systemd does at boot), and detaches the mount.
fn abort_connection(mountpoint: &Path) {
    let minor = mount_device(mountpoint).and_then(|d| d.split(':').nth(1).map(str::to_string));
    if let Some(minor) = minor {
        let abort = format!("/sys/fs/fuse/connections/{minor}/abort");
        if !Path::new(&abort).exists() {
            // SAFETY: NUL-terminated strings; a failure is seen below.
            unsafe {
                libc::mount(
                    c"fusectl".as_ptr(),
                    c"/sys/fs/fuse/connections".as_ptr(),
                    c"fusectl".as_ptr(),
                    0,
                    std::ptr::null(),
                )
            };
        }
        if std::fs::write(&abort, "1").is_err() {
            report(&format!("cannot abort the FUSE connection {minor} of {}", mountpoint.display()));
        }
    }
    // Detached, the dead mount goes away as soon as nothing uses it.
    if let Err(e) = unmount(mountpoint, true) {
        report(&format!("cannot end the session on {}: {e}", mountpoint.display()));
    }
}

/// FUSE mounts start with the kernel's default 128 KiB readahead, so a
/// sequential read becomes a request per 128 KiB. A larger window (as root,
/// through the mount's backing-device entry in sysfs) means fewer, larger
/// reads: one request's worth, `max_read` bytes.
///
/// The device number comes from mountinfo: a stat of the mount point would be a
/// FUSE request to this very daemon, which does not serve yet.
fn raise_readahead(mountpoint: &Path, max_read: u32) {
    let Some(device) = mount_device(mountpoint) else { return };
    let knob = format!("/sys/class/bdi/{device}/read_ahead_kb");
    if let Err(e) = std::fs::write(&knob, (max_read / 1024).to_string()) {
        if crate::fuse::server::is_root() {
            report(&format!("cannot raise readahead ({knob}): {e}"));
        }
    }
}

/// This process's effective user and group.
fn effective_ids() -> (u32, u32) {
    // SAFETY: geteuid/getegid have no preconditions.
    unsafe { (libc::geteuid(), libc::getegid()) }
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

/// The mount on top at a mount point, from /proc/self/mountinfo.
struct MountEntry {
    /// The mount's device, "major:minor".
    device: String,
    fstype: String,
    /// For a uext4 mount, the image as it was named when mounted.
    source: PathBuf,
    read_only: bool,
}

/// The mount on top at `mountpoint`: of several stacked there, the last one
/// mountinfo lists (a later mount covers an earlier one), the one umount(2) takes.
fn top_mount(mountpoint: &Path) -> Result<MountEntry> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let want = mountpoint.as_os_str().as_bytes();
    let mut top = None;
    for line in info.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let fields: Vec<&str> = left.split(' ').collect();
        if fields.len() < 6 || unescape(fields[4]) != want {
            continue;
        }
        let mut rest = right.split(' ');
        let (fstype, source) = (rest.next().unwrap_or(""), rest.next().map(unescape).unwrap_or_default());
        top = Some(MountEntry {
            device: fields[2].to_string(),
            fstype: fstype.to_string(),
            source: PathBuf::from(std::ffi::OsStr::from_bytes(&source)),
            read_only: fields[5].split(',').any(|o| o == "ro"),
        });
    }
    top.ok_or_else(|| Error::NotFound(format!("{} is not a mount point", mountpoint.display())))
}

/// The uext4 mount on top at `mountpoint`; another filesystem mounted over it is
/// refused by name, so that nothing but a uext4 mount is ever unmounted here.
fn mounted_here(mountpoint: &Path) -> Result<MountEntry> {
    let top =
        top_mount(mountpoint).map_err(|_| Error::NotFound(format!("{} is not a uext4 mount", mountpoint.display())))?;
    if top.fstype != "fuse.uext4" {
        return Err(Error::Invalid(format!(
            "the mount on top at {} is {} ({}), not uext4's; unmount it first",
            mountpoint.display(),
            top.fstype,
            top.source.display()
        )));
    }
    Ok(top)
}

/// The uext4 mount holding host path `path` (its deepest mount point above
/// the path's parent, from mountinfo), if that mount is one of uext4's.
pub(crate) fn uext4_mount_holding(path: &Path) -> Option<PathBuf> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let parent = std::fs::canonicalize(parent).ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut best: Option<(PathBuf, bool)> = None;
    for line in info.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let Some(at) = left.split(' ').nth(4).map(unescape) else { continue };
        let at = PathBuf::from(std::ffi::OsStr::from_bytes(&at));
        if parent.starts_with(&at) && best.as_ref().is_none_or(|(b, _)| at.as_os_str().len() >= b.as_os_str().len()) {
            best = Some((at, right.split(' ').next() == Some("fuse.uext4")));
        }
    }
    best.and_then(|(at, ours)| ours.then_some(at))
}

/// Asks the uext4 mount holding `parent` to remove `name` there and everything
/// below it (the daemon runs the library's remove_tree and drops the kernel's
/// cached names): the name written to the directory's `REMOVE_TREE_XATTR`.
pub(crate) fn remove_tree_in_mount(parent: &Path, name: &[u8]) -> std::io::Result<()> {
    set_xattr(parent, crate::fuse::REMOVE_TREE_XATTR, name)
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

/// Unmounts, then waits for the daemon to say it wrote everything back and let
/// go of the image, and checks the image needs no journal recovery: success
/// means every change made through the mount is in the image. A daemon that
/// is gone, dies before it is done, or fails to write back makes this fail.
pub fn umount(a: UmountArgs) -> crate::show::CliResult<()> {
    let mountpoint =
        a.mountpoint.canonicalize().map_err(|e| io_error(format!("cannot find {}", a.mountpoint.display()), e))?;
    let mount = mounted_here(&mountpoint)?;
    let image = mount.source.clone();
    let daemon = ending_socket(&mount).and_then(|a| std::os::unix::net::UnixStream::connect_addr(&a));
    let Ok(mut daemon) = daemon else {
        // Nobody serves the mount: take the dead mount away, and say what it cost.
        let _ = unmount(&mountpoint, true);
        return Err(crate::show::Failure::refused(format!(
            "umount: {} is detached, but no uext4 daemon served it any more (killed or crashed?): changes it \
             had not committed to the journal are lost; the next writable open of {} recovers the journal",
            mountpoint.display(),
            image.display()
        )));
    };
    let daemon_pid = peer_pid(&daemon);
    unmount(&mountpoint, false)?;
    let started = Instant::now();
    let mut ending = String::new();
    let waited = Arc::new(AtomicBool::new(false));
    let notice = {
        let (waited, image) = (waited.clone(), image.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(2));
            if !waited.load(Ordering::Relaxed) {
                eprintln!("uext4: waiting for the daemon to finish writing {} back", image.display());
            }
        })
    };
    let heard = daemon.read_to_string(&mut ending);
    waited.store(true, Ordering::Relaxed);
    drop(notice);
    let ending = ending.trim();
    if heard.is_err() || ending.is_empty() {
        return Err(crate::show::Failure::refused(format!(
            "umount: the uext4 daemon serving {} ended before it had written everything back (killed or crashed?) \
             after {:.1}s: changes it had not committed to the journal are lost; the next writable open \
             replays the journal",
            image.display(),
            started.elapsed().as_secs_f64()
        )));
    }
    if let Some(why) = ending.strip_prefix("failed: ") {
        return Err(crate::show::Failure::refused(format!(
            "umount: the uext4 daemon serving {} failed: {why}",
            image.display()
        )));
    }
    // The daemon holds the image until its process ends.
    if let Some(pid) = daemon_pid {
        wait_for_exit(pid);
    }
    if mount.read_only {
        // A read-only mount wrote nothing: the image is as it found it.
        return Ok(());
    }
    // The image is checked where it still is: a path renamed, removed or
    // replaced since the mount names another file or none, and the daemon's
    // "clean" is then all there is to go on.
    let served = ending_field(ending, "image");
    let here = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&image).ok().map(|m| format!("{}:{}", m.dev(), m.ino()))
    };
    if served.is_none_or(|id| here.as_deref() != Some(id)) {
        eprintln!(
            "uext4: {} no longer names the image this mount served (renamed or removed since): not checked",
            image.display()
        );
        return Ok(());
    }
    // The daemon said where in the image the filesystem lies (-o offset, partition).
    let offset = ending_field(ending, "offset").and_then(|n| n.parse().ok()).unwrap_or(0);
    if daemon_pid.is_none() {
        // No peer process known: wait for the daemon's lock on its region instead.
        let file = File::open(&image).map_err(|e| io_error(format!("cannot open {}", image.display()), e))?;
        while uext4::dev::held_at(&file, offset)? {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let region = if offset == 0 { uext4::dev::Region::Whole } else { uext4::dev::Region::Offset(offset) };
    let sb = Filesystem::open(&image, Options { region, ..Options::default() })?.superblock();
    if sb.has_incompat(uext4::format::superblock::INCOMPAT_RECOVER) {
        return Err(crate::show::Failure::refused(format!(
            "umount: {} was left needing journal recovery: the daemon did not write everything back",
            image.display()
        )));
    }
    // Once the kernel has let go of every inode, none is open: none may stay an orphan.
    if sb.s_last_orphan != 0 {
        return Err(crate::show::Failure::refused(format!(
            "umount: {} was left with inode {} on its orphan list: the daemon did not release every inode; run e2fsck -f",
            image.display(),
            sb.s_last_orphan
        )));
    }
    Ok(())
}

/// The value of `key=value` in the daemon's ending line ("clean offset=0 image=2049:12").
fn ending_field<'a>(ending: &'a str, key: &str) -> Option<&'a str> {
    ending.split_whitespace().find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
}

/// Returns once process `pid` has exited (reaped or not: a daemon started by a
/// parent that waits for this command first stays a zombie until then).
fn wait_for_exit(pid: libc::pid_t) {
    // SAFETY: pidfd_open takes a pid and flags, and returns a descriptor we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return; // gone already (ESRCH)
    }
    let fd = fd as libc::c_int;
    let mut poll = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // A pidfd turns readable when its process exits.
    // SAFETY: one pollfd, as given; the descriptor is closed once, after.
    unsafe {
        while libc::poll(&mut poll, 1, -1) < 0
            && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {}
        libc::close(fd);
    }
}

/// The process at the other end of a Unix socket, as the kernel saw it connect.
fn peer_pid(stream: &std::os::unix::net::UnixStream) -> Option<libc::pid_t> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt into a ucred of the length given.
    let got = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (got == 0 && cred.pid > 0).then_some(cred.pid)
}

/// Makes everything written through the mount durable: once this returns, a
/// crash of the daemon (or of the machine) loses none of it. sync(2) and
/// syncfs(2) cannot promise that on a FUSE mount: Linux (up to at least 6.18)
/// sends FUSE_SYNCFS to virtiofs servers only, so a /dev/fuse server never
/// hears of them. An fsync of the mount's root reaches the daemon, and commits
/// the running transaction, which holds every change made so far.
pub fn sync(a: SyncArgs) -> Result<()> {
    let mountpoint =
        a.mountpoint.canonicalize().map_err(|e| io_error(format!("cannot find {}", a.mountpoint.display()), e))?;
    mounted_here(&mountpoint)?;
    let root = File::open(&mountpoint).map_err(|e| io_error(format!("cannot open {}", mountpoint.display()), e))?;
    // On a kernel that sends FUSE_SYNCFS this alone would do; elsewhere it is harmless.
    // SAFETY: syncfs on a descriptor we own.
    unsafe { libc::syncfs(root.as_raw_fd()) };
    root.sync_all().map_err(|e| io_error(format!("committing {}", mountpoint.display()), e))
}

pub fn tune(a: TuneArgs) -> Result<()> {
    let mountpoint =
        a.mountpoint.canonicalize().map_err(|e| io_error(format!("cannot find {}", a.mountpoint.display()), e))?;
    mounted_here(&mountpoint)?;
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
        let settings = || current.lines().filter(|l| !l.starts_with('#'));
        let Some(line) = settings().find(|l| l.split('=').next() == Some(key)) else {
            let known: Vec<&str> = settings().filter_map(|l| l.split('=').next()).collect();
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
        assert!(parse_options(&[]).unwrap().opts.pdirops, "pdirops is on by default");
        assert!(!parse_options(&["pdirops=off".into()]).unwrap().opts.pdirops);
        assert!(parse_options(&["pdirops=on".into()]).unwrap().opts.pdirops);
        let e = parse_options(&["pdirops=maybe".into()]).err().unwrap().to_string();
        assert!(e.contains("pdirops=maybe"), "{e}");
        assert!(parse_options(&[]).unwrap().opts.inline_data, "inline_data is on by default");
        assert!(!parse_options(&["inline_data=off".into()]).unwrap().opts.inline_data);
        assert!(parse_options(&["inline_data=on".into()]).unwrap().opts.inline_data);
        let e = parse_options(&["inline_data=maybe".into()]).err().unwrap().to_string();
        assert!(e.contains("inline_data=maybe"), "{e}");
        assert!(!parse_options(&[]).unwrap().writeback_cache, "the write-back cache is off by default");
        assert!(parse_options(&["writeback_cache=on".into()]).unwrap().writeback_cache);
        let e = parse_options(&["writeback_cache=yes".into()]).err().unwrap().to_string();
        assert!(e.contains("writeback_cache=yes"), "{e}");
        assert!(parse_options(&["nosuchoption".into()]).err().unwrap().to_string().contains("nosuchoption"));
        assert!(parse_options(&["threads=0".into()]).is_err());
        assert_eq!(parse_options(&[]).unwrap().uring, UringMode::Auto);
        assert_eq!(parse_options(&["io_uring".into()]).unwrap().uring, UringMode::On);
        assert_eq!(parse_options(&["io_uring=off".into()]).unwrap().uring, UringMode::Off);
        assert!(parse_options(&["io_uring=fast".into()]).err().unwrap().to_string().contains("io_uring=fast"));
        let fstab: Vec<String> =
            "defaults,noauto,user,nofail,_netdev,x-systemd.automount,comment=x,dev,suid,noexec,noatime"
                .split(',')
                .map(Into::into)
                .collect();
        let c = parse_options(&fstab).unwrap();
        assert_eq!((c.flags, c.atime), (libc::MS_NOEXEC, AtimeMode::Never));
        assert_eq!(parse_options(&[]).unwrap().flags, libc::MS_NOSUID | libc::MS_NODEV);
        assert!(parse_options(&["sync".into()]).is_err());
        use uext4::dev::Region;
        assert_eq!(parse_options(&["offset=1M".into()]).unwrap().opts.region, Region::Offset(1 << 20));
        assert_eq!(
            parse_options(&["partition=2".into(), "partition=2".into()]).unwrap().opts.region,
            Region::Partition(2)
        );
        let e = parse_options(&["partition=2".into(), "offset=1M".into()]).err().unwrap().to_string();
        assert!(e.contains("offset=1M") && e.contains("partition 2"), "{e}");
        let e = parse_options(&["offset=1X".into()]).err().unwrap().to_string();
        assert!(e.contains("offset=1X"), "{e}");
    }

    #[test]
    fn mountinfo_fields_unescape() {
        assert_eq!(unescape(r"/tmp/a\040b"), b"/tmp/a b");
        assert_eq!(unescape(r"plain"), b"plain");
    }
}
