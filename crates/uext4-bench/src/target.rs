//! The filesystems a workload runs on. Each run gets a fresh image made by
//! mkfs.ext4 with the same parameters for every target; a target that cannot run
//! on this machine says why instead of disappearing from the results.
//!
//! A session is one target attached to one image: the library opened on it, or
//! a mount of it. `restart` drops every cache the target keeps (close and reopen,
//! unmount and mount) so that a read phase starts cold on every target alike;
//! the image file itself stays in the host's page cache for all of them.

use crate::ops::{FsOps, PosixOps, Uext4Ops};
use crate::usage::{process_usage, Usage};
use crate::BenchError;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// uext4's library, called in this process.
    Uext4,
    /// uext4 mounted through FUSE, requests through /dev/fuse.
    Uext4Fuse,
    /// uext4 mounted through FUSE, requests through io_uring queues.
    #[serde(rename = "uext4-fuse-uring")]
    Uext4FuseUring,
    /// The kernel's ext4 on a loop device.
    Kernel,
    /// e2fsprogs' FUSE driver.
    Fuse2fs,
    /// uext4's library on an image made without a journal: against `Uext4`, the
    /// cost of journaling.
    #[serde(rename = "uext4-nojournal")]
    Uext4NoJournal,
    /// The kernel's ext4 on an image made without a journal.
    #[serde(rename = "kernel-nojournal")]
    KernelNoJournal,
}

pub const ALL_TARGETS: [Target; 7] = [
    Target::Uext4,
    Target::Uext4Fuse,
    Target::Uext4FuseUring,
    Target::Kernel,
    Target::Fuse2fs,
    Target::Uext4NoJournal,
    Target::KernelNoJournal,
];

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Uext4 => "uext4",
            Target::Uext4Fuse => "uext4-fuse",
            Target::Uext4FuseUring => "uext4-fuse-uring",
            Target::Kernel => "kernel",
            Target::Fuse2fs => "fuse2fs",
            Target::Uext4NoJournal => "uext4-nojournal",
            Target::KernelNoJournal => "kernel-nojournal",
        }
    }

    /// Whether its image is made with a journal (mkfs.ext4's default).
    pub fn has_journal(self) -> bool {
        !matches!(self, Target::Uext4NoJournal | Target::KernelNoJournal)
    }

    /// The same target on an image with a journal.
    pub fn with_journal(self) -> Target {
        match self {
            Target::Uext4NoJournal => Target::Uext4,
            Target::KernelNoJournal => Target::Kernel,
            t => t,
        }
    }

    pub fn parse(name: &str) -> Option<Target> {
        ALL_TARGETS.into_iter().find(|t| t.name() == name)
    }

    /// Why this target cannot run here, if it cannot.
    pub fn unavailable_because(self) -> Option<String> {
        match self {
            Target::Uext4 | Target::Uext4NoJournal => None,
            Target::Uext4Fuse | Target::Uext4FuseUring => {
                if uext4_binary().is_none() {
                    Some("the uext4 binary is not known (run as `uext4 bench`, or set UEXT4_BIN)".into())
                } else if !Path::new("/dev/fuse").exists() {
                    Some("/dev/fuse is missing".into())
                } else if !is_root() {
                    Some("mounting an image here needs root".into())
                } else if self == Target::Uext4FuseUring
                    && !Path::new("/sys/module/fuse/parameters/enable_uring").exists()
                {
                    Some("this kernel has no FUSE over io_uring (Linux 6.14+)".into())
                } else {
                    None
                }
            }
            Target::Kernel | Target::KernelNoJournal => {
                if !is_root() {
                    Some("loop-mounting an image needs root".into())
                } else if !std::fs::read_to_string("/proc/filesystems").unwrap_or_default().contains("ext4") {
                    Some("this kernel has no ext4 driver".into())
                } else if !Path::new("/dev/loop-control").exists() {
                    Some("no loop device support (/dev/loop-control is missing)".into())
                } else {
                    None
                }
            }
            Target::Fuse2fs => {
                if !on_path("fuse2fs") {
                    Some("fuse2fs is not installed (Debian package fuse2fs)".into())
                } else if !Path::new("/dev/fuse").exists() {
                    Some("/dev/fuse is missing".into())
                } else if !on_path("fusermount") && !on_path("fusermount3") {
                    Some("no fusermount to unmount with (package fuse3)".into())
                } else if !is_root() {
                    Some("mounting fuse2fs over an image here needs root".into())
                } else {
                    None
                }
            }
        }
    }

    /// Attaches the target to `image` (mounting at `mountpoint` if it mounts).
    pub fn attach(self, image: &Path, mountpoint: &Path) -> Result<Box<dyn Session>, BenchError> {
        match self {
            Target::Uext4 | Target::Uext4NoJournal => Ok(Box::new(Uext4Session::open(image)?)),
            Target::Kernel | Target::KernelNoJournal => Ok(Box::new(KernelSession::mount(image, mountpoint)?)),
            Target::Fuse2fs => Ok(Box::new(fuse2fs(image, mountpoint)?)),
            Target::Uext4Fuse => Ok(Box::new(uext4_mount(image, mountpoint, "io_uring=off")?)),
            Target::Uext4FuseUring => Ok(Box::new(uext4_mount(image, mountpoint, "io_uring=on")?)),
        }
    }
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}

/// One target attached to one image.
pub trait Session {
    fn ops(&self) -> &dyn FsOps;
    /// CPU and context switches spent outside this process (a FUSE daemon), so far.
    fn helper_usage(&self) -> Usage {
        Usage::default()
    }
    /// The device layer's counters, where the target exposes them.
    fn io_stats(&self) -> Option<uext4::dev::IoStats> {
        None
    }
    /// Drops every cache the target keeps, leaving the image as it is.
    fn restart(&mut self) -> Result<(), BenchError>;
    /// Flushes and detaches; the image is then complete on disk.
    fn finish(self: Box<Self>) -> Result<(), BenchError>;
}

pub fn run_tool(cmd: &mut Command) -> Result<String, BenchError> {
    let out = cmd.output().map_err(|e| BenchError(format!("{cmd:?}: {e}")))?;
    if !out.status.success() {
        return Err(BenchError(format!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

struct Uext4Session {
    image: PathBuf,
    /// None only inside `restart`, between closing the image and opening it again.
    ops: Option<Uext4Ops>,
    /// Counters of the device instances closed by restarts, so figures span the run.
    io_before: uext4::dev::IoStats,
}

impl Uext4Session {
    fn open(image: &Path) -> Result<Uext4Session, BenchError> {
        Ok(Uext4Session {
            image: image.to_path_buf(),
            ops: Some(Self::open_ops(image)?),
            io_before: Default::default(),
        })
    }

    fn open_ops(image: &Path) -> Result<Uext4Ops, BenchError> {
        let fs = uext4::Filesystem::open(image, uext4::Options { read_only: false, ..Default::default() })
            .map_err(|e| BenchError(format!("uext4 cannot open {}: {e}", image.display())))?;
        Ok(Uext4Ops { fs: Arc::new(fs) })
    }

    fn live(&self) -> &Uext4Ops {
        self.ops.as_ref().expect("the uext4 session is open")
    }
}

impl Session for Uext4Session {
    fn ops(&self) -> &dyn FsOps {
        self.live()
    }

    fn io_stats(&self) -> Option<uext4::dev::IoStats> {
        Some(self.io_before + self.live().fs.cache().device().stats())
    }

    fn restart(&mut self) -> Result<(), BenchError> {
        self.live().fs.sync().map_err(|e| BenchError(format!("uext4 sync: {e}")))?;
        let io = self.io_stats().unwrap_or_default();
        // The old filesystem lets go of the image (and its lock) before the new one opens it.
        self.ops = None;
        self.ops = Some(Self::open_ops(&self.image)?);
        self.io_before = io;
        Ok(())
    }

    fn finish(self: Box<Self>) -> Result<(), BenchError> {
        self.live().fs.sync().map_err(|e| BenchError(format!("uext4 sync: {e}")))
    }
}

struct KernelSession {
    image: PathBuf,
    ops: PosixOps,
    mounted: bool,
}

impl KernelSession {
    fn mount(image: &Path, mountpoint: &Path) -> Result<KernelSession, BenchError> {
        // noinit_itable: mkfs left inode tables for the kernel to zero lazily, and
        // that background thread would otherwise run during the measurement.
        run_tool(Command::new("mount").args(["-t", "ext4", "-o", "loop,noinit_itable"]).arg(image).arg(mountpoint))?;
        Ok(KernelSession {
            image: image.to_path_buf(),
            ops: PosixOps { root: mountpoint.to_path_buf(), sync_through_file: false },
            mounted: true,
        })
    }
}

impl Session for KernelSession {
    fn ops(&self) -> &dyn FsOps {
        &self.ops
    }

    fn restart(&mut self) -> Result<(), BenchError> {
        run_tool(Command::new("umount").arg(&self.ops.root))?;
        self.mounted = false;
        *self = KernelSession::mount(&self.image, &self.ops.root)?;
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<(), BenchError> {
        self.mounted = false;
        run_tool(Command::new("umount").arg(&self.ops.root)).map(drop)
    }
}

impl Drop for KernelSession {
    /// A run that failed halfway must not leave the image mounted.
    fn drop(&mut self) {
        if self.mounted {
            let _ = run_tool(Command::new("umount").arg(&self.ops.root));
        }
    }
}

/// Whether `dir` is a mount point now (its entry in /proc/self/mountinfo).
fn is_mounted(dir: &Path) -> bool {
    let Ok(dir) = dir.canonicalize() else { return false };
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines().any(|l| l.split(' ').nth(4) == Some(dir.to_string_lossy().as_ref()))
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Result<(), BenchError> {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > limit {
            return Err(BenchError(format!("timed out after {limit:?} waiting for {what}")));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// The uext4 binary that mounts: $UEXT4_BIN, or this program when it is uext4.
fn uext4_binary() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("UEXT4_BIN") {
        return Some(PathBuf::from(bin));
    }
    let exe = std::env::current_exe().ok()?;
    (exe.file_name()? == "uext4").then_some(exe)
}

/// A FUSE daemon run in the foreground as our child (fuse2fs, or uext4's
/// mount): its CPU time counts, and unmounting waits for it to have written
/// everything back.
struct DaemonSession {
    /// Who it is, for messages.
    name: &'static str,
    /// Its whole command line (program first).
    argv: Vec<OsString>,
    ops: PosixOps,
    daemon: Option<Child>,
}

impl DaemonSession {
    fn start(name: &'static str, argv: Vec<OsString>, mountpoint: &Path) -> Result<DaemonSession, BenchError> {
        let daemon = Command::new(&argv[0])
            .args(&argv[1..])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| BenchError(format!("starting {name}: {e}")))?;
        let mut session = DaemonSession {
            name,
            argv,
            // syncfs does not reach a FUSE daemon; an fsync of a file does.
            ops: PosixOps { root: mountpoint.to_path_buf(), sync_through_file: true },
            daemon: Some(daemon),
        };
        let up = wait_until(&format!("{name} to mount"), Duration::from_secs(20), || {
            is_mounted(mountpoint) || session.daemon.as_mut().is_some_and(|d| matches!(d.try_wait(), Ok(Some(_))))
        });
        if up.is_err() || !is_mounted(mountpoint) {
            let mut daemon = session.daemon.take().unwrap();
            let _ = daemon.kill();
            let out = daemon.wait_with_output().map(|o| String::from_utf8_lossy(&o.stderr).into_owned());
            return Err(BenchError(format!(
                "{name} did not mount on {}: {}",
                mountpoint.display(),
                out.unwrap_or_default()
            )));
        }
        Ok(session)
    }

    fn unmount(&mut self) -> Result<(), BenchError> {
        let fusermount = if on_path("fusermount3") { "fusermount3" } else { "fusermount" };
        run_tool(Command::new(fusermount).arg("-u").arg(&self.ops.root))?;
        if let Some(daemon) = self.daemon.take() {
            let name = self.name;
            let out = daemon.wait_with_output().map_err(|e| BenchError(format!("waiting for {name}: {e}")))?;
            if !out.status.success() {
                let said = String::from_utf8_lossy(&out.stderr);
                return Err(BenchError(format!("{name} exited with {}: {}", out.status, said.trim())));
            }
        }
        Ok(())
    }
}

impl Session for DaemonSession {
    fn ops(&self) -> &dyn FsOps {
        &self.ops
    }

    fn helper_usage(&self) -> Usage {
        self.daemon.as_ref().map(|d| process_usage(d.id())).unwrap_or_default()
    }

    fn restart(&mut self) -> Result<(), BenchError> {
        self.unmount()?;
        *self = DaemonSession::start(self.name, self.argv.clone(), &self.ops.root)?;
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<(), BenchError> {
        self.unmount()
    }
}

impl Drop for DaemonSession {
    fn drop(&mut self) {
        if self.daemon.is_some() {
            let _ = self.unmount();
        }
    }
}

/// fuse2fs in the foreground (-f).
fn fuse2fs(image: &Path, mountpoint: &Path) -> Result<DaemonSession, BenchError> {
    let argv = vec!["fuse2fs".into(), image.into(), mountpoint.into(), "-f".into()];
    DaemonSession::start("fuse2fs", argv, mountpoint)
}

/// `uext4 mount --foreground -o OPTIONS`.
fn uext4_mount(image: &Path, mountpoint: &Path, options: &str) -> Result<DaemonSession, BenchError> {
    let bin = uext4_binary().ok_or_else(|| BenchError("the uext4 binary is not known".into()))?;
    let argv = vec![
        bin.into(),
        "mount".into(),
        "--foreground".into(),
        "-o".into(),
        options.into(),
        image.into(),
        mountpoint.into(),
    ];
    DaemonSession::start("uext4 mount", argv, mountpoint)
}
