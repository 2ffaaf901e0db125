//! The filesystems a workload runs on. Each run gets a fresh image made by
//! mkfs.ext4 with the same parameters for every target; a target that cannot run
//! on this machine says why instead of disappearing from the results.
//!
//! A session is one target attached to one image: the library opened on it, or
//! a mount of it. `restart` drops every cache the target keeps (close and reopen,
//! unmount and mount) so that a read phase starts cold on every target alike;
//! the image file itself stays in the host's page cache for all of them.

use crate::kernel_trace::{self, KernelTrace};
use crate::ops::{FsOps, PosixOps, Uext4Ops};
use crate::usage::{process_usage, Usage};
use crate::BenchError;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uext4::dev::{IoModel, IoReport, IoStats};

/// What runs a workload: one of the kinds, with tunables for uext4's kinds
/// (`uext4:dir_ireserve=low,cache_mb=16`: open options for the library,
/// mount options for the mount).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub kind: TargetKind,
    pub tunables: Vec<(String, String)>,
}

impl serde::Serialize for Target {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetKind {
    /// uext4's library, called in this process.
    Uext4,
    /// uext4 mounted through FUSE, requests through /dev/fuse.
    Uext4Fuse,
    /// uext4 mounted through FUSE, requests through io_uring queues.
    Uext4FuseUring,
    /// The kernel's ext4 on a loop device.
    Kernel,
    /// e2fsprogs' FUSE driver.
    Fuse2fs,
    /// uext4's library on an image made without a journal: against `Uext4`, the
    /// cost of journaling.
    Uext4NoJournal,
    /// The kernel's ext4 on an image made without a journal.
    KernelNoJournal,
}

pub const ALL_KINDS: [TargetKind; 7] = [
    TargetKind::Uext4,
    TargetKind::Uext4Fuse,
    TargetKind::Uext4FuseUring,
    TargetKind::Kernel,
    TargetKind::Fuse2fs,
    TargetKind::Uext4NoJournal,
    TargetKind::KernelNoJournal,
];

impl TargetKind {
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Uext4 => "uext4",
            TargetKind::Uext4Fuse => "uext4-fuse",
            TargetKind::Uext4FuseUring => "uext4-fuse-uring",
            TargetKind::Kernel => "kernel",
            TargetKind::Fuse2fs => "fuse2fs",
            TargetKind::Uext4NoJournal => "uext4-nojournal",
            TargetKind::KernelNoJournal => "kernel-nojournal",
        }
    }

    /// uext4's own kinds, which take tunables.
    pub fn is_uext4(self) -> bool {
        matches!(
            self,
            TargetKind::Uext4 | TargetKind::Uext4Fuse | TargetKind::Uext4FuseUring | TargetKind::Uext4NoJournal
        )
    }
}

impl Target {
    pub fn plain(kind: TargetKind) -> Target {
        Target { kind, tunables: Vec::new() }
    }

    /// The kind's name, then `:key=value,...` for its tunables.
    pub fn name(&self) -> String {
        let mut name = self.kind.name().to_string();
        if !self.tunables.is_empty() {
            let pairs: Vec<String> = self.tunables.iter().map(|(k, v)| format!("{k}={v}")).collect();
            name = format!("{name}:{}", pairs.join(","));
        }
        name
    }

    /// The plain uext4 library target, which ratios are taken against.
    pub fn is_base(&self) -> bool {
        self.kind == TargetKind::Uext4 && self.tunables.is_empty()
    }

    /// Whether its image is made with a journal (mkfs.ext4's default).
    pub fn has_journal(&self) -> bool {
        !matches!(self.kind, TargetKind::Uext4NoJournal | TargetKind::KernelNoJournal)
    }

    /// The same target on an image with a journal.
    pub fn with_journal(&self) -> Target {
        let kind = match self.kind {
            TargetKind::Uext4NoJournal => TargetKind::Uext4,
            TargetKind::KernelNoJournal => TargetKind::Kernel,
            k => k,
        };
        Target { kind, tunables: self.tunables.clone() }
    }

    /// `kind` or `kind:key=value,key=value` (tunables for uext4's kinds only,
    /// checked as uext4 checks them).
    ///
    /// # Errors
    /// A message naming what is wrong.
    pub fn parse(name: &str) -> Result<Target, String> {
        let (kind_name, rest) = name.split_once(':').unwrap_or((name, ""));
        let kind = ALL_KINDS.into_iter().find(|k| k.name() == kind_name).ok_or_else(|| {
            let known: Vec<&str> = ALL_KINDS.iter().map(|k| k.name()).collect();
            format!("unknown target '{kind_name}' (known: {})", known.join(", "))
        })?;
        let mut tunables = Vec::new();
        for pair in rest.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').ok_or_else(|| format!("target {name}: '{pair}' is not key=value"))?;
            if k == FEATURES {
                check_features(v).map_err(|e| format!("target {name}: {e}"))?;
                tunables.push((k.to_string(), v.to_string()));
                continue;
            }
            if !kind.is_uext4() {
                return Err(format!("target {name}: only uext4's targets take tunables"));
            }
            if k == WRITEBACK_CACHE {
                if !matches!(kind, TargetKind::Uext4Fuse | TargetKind::Uext4FuseUring) {
                    return Err(format!("target {name}: {k} is an option of uext4's mounts"));
                }
                if !matches!(v, "on" | "off") {
                    return Err(format!("target {name}: {k}={v}: want on or off"));
                }
                tunables.push((k.to_string(), v.to_string()));
                continue;
            }
            if k == SPLICE_READ {
                if kind != TargetKind::Uext4Fuse {
                    return Err(format!("target {name}: {k} is an option of the /dev/fuse mount (uext4-fuse)"));
                }
                if !matches!(v, "on" | "off") {
                    return Err(format!("target {name}: {k}={v}: want on or off"));
                }
                tunables.push((k.to_string(), v.to_string()));
                continue;
            }
            if k == THREADS {
                if kind != TargetKind::Uext4Fuse {
                    return Err(format!("target {name}: {k} is an option of the /dev/fuse mount (uext4-fuse)"));
                }
                if !v.parse::<u32>().is_ok_and(|n| (1..=64).contains(&n)) {
                    return Err(format!("target {name}: {k}={v}: want a number of worker threads from 1 to 64"));
                }
                tunables.push((k.to_string(), v.to_string()));
                continue;
            }
            uext4::Options::default().set(k, v).map_err(|e| format!("target {name}: {e}"))?;
            tunables.push((k.to_string(), v.to_string()));
        }
        Ok(Target { kind, tunables })
    }

    /// `features=LIST` as mkfs.ext4's `-O` takes it (`+` in the target's name
    /// separates features, since `,` separates tunables), if the target has it.
    pub fn mkfs_features(&self) -> Option<String> {
        self.tunables.iter().find(|(k, _)| k == FEATURES).map(|(_, v)| v.replace('+', ","))
    }

    /// Why this target cannot run here, if it cannot.
    pub fn unavailable_because(&self) -> Option<String> {
        match self.kind {
            TargetKind::Uext4 | TargetKind::Uext4NoJournal => None,
            TargetKind::Uext4Fuse | TargetKind::Uext4FuseUring => {
                if uext4_binary().is_none() {
                    Some("the uext4 binary is not known (run as `uext4 bench`, or set UEXT4_BIN)".into())
                } else if !Path::new("/dev/fuse").exists() {
                    Some("/dev/fuse is missing".into())
                } else if !is_root() {
                    Some("mounting an image here needs root".into())
                } else if self.kind == TargetKind::Uext4FuseUring
                    && !Path::new("/sys/module/fuse/parameters/enable_uring").exists()
                {
                    Some("this kernel has no FUSE over io_uring (Linux 6.14+)".into())
                } else {
                    None
                }
            }
            TargetKind::Kernel | TargetKind::KernelNoJournal => {
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
            TargetKind::Fuse2fs => {
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

    /// Attaches the target to `image` (mounting at `mountpoint` if it mounts);
    /// `defaults` are tunables for uext4's kinds that the target's own override;
    /// `kernel_options` are mount options the kernel's kinds add to their own.
    pub fn attach(
        &self,
        image: &Path,
        mountpoint: &Path,
        defaults: &[(String, String)],
        kernel_options: &[&str],
    ) -> Result<Box<dyn Session>, BenchError> {
        let mut tunables: Vec<(String, String)> =
            defaults.iter().filter(|(k, _)| !self.tunables.iter().any(|(o, _)| o == k)).cloned().collect();
        // features= is the image's (mkfs), not an option of uext4's.
        tunables.extend(self.tunables.iter().filter(|(k, _)| k != FEATURES).cloned());
        let options = |transport: &str| {
            let mut all = vec![transport.to_string()];
            all.extend(tunables.iter().map(|(k, v)| format!("{k}={v}")));
            all.join(",")
        };
        match self.kind {
            TargetKind::Uext4 | TargetKind::Uext4NoJournal => Ok(Box::new(Uext4Session::open(image, tunables)?)),
            TargetKind::Kernel | TargetKind::KernelNoJournal => {
                Ok(Box::new(KernelSession::mount(image, mountpoint, kernel_options)?))
            }
            TargetKind::Fuse2fs => Ok(Box::new(fuse2fs(image, mountpoint)?)),
            TargetKind::Uext4Fuse => Ok(Box::new(uext4_mount(image, mountpoint, &options("io_uring=off"))?)),
            TargetKind::Uext4FuseUring => Ok(Box::new(uext4_mount(image, mountpoint, &options("io_uring=on"))?)),
        }
    }
}

/// The mount option of uext4's mounts (not the library's) that a target may
/// set: `uext4-fuse-uring:writeback_cache=on`.
const WRITEBACK_CACHE: &str = "writeback_cache";

/// The /dev/fuse mount's worker threads: `uext4-fuse:threads=2`.
const THREADS: &str = "threads";

/// Whether the /dev/fuse mount splices read replies from the image (default
/// on): `uext4-fuse:splice_read=off` measures the copy it saves.
const SPLICE_READ: &str = "splice_read";

/// The tunable every target takes: features for the image's mkfs.ext4 -O
/// (`kernel:features=^inline_data`, `uext4:features=inline_data+^metadata_csum`).
pub const FEATURES: &str = "features";

/// A feature list is names, each perhaps preceded by `^`, joined by `+`.
fn check_features(list: &str) -> Result<(), String> {
    let ok = !list.is_empty()
        && list.split('+').all(|f| {
            let name = f.strip_prefix('^').unwrap_or(f);
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
    if ok {
        Ok(())
    } else {
        Err(format!("features={list}: expected feature names, each maybe with ^, joined by +"))
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
    /// What the target's device has done so far: uext4's device counters and
    /// I/O model; for the kernel, its block requests priced by the same model.
    fn device(&self) -> DeviceSnapshot {
        DeviceSnapshot::default()
    }
    /// A phase begins: distinct inode-table blocks are counted afresh.
    fn begin_phase(&self) {}
    /// Drops every cache the target keeps, leaving the image as it is.
    fn restart(&mut self) -> Result<(), BenchError>;
    /// Closes the target and opens it again with `tunables` set (on top of
    /// its own), for the rest of the run. Ok(false): this target takes no
    /// such tunables (the kernel, fuse2fs) and nothing happened.
    fn reopen_with(&mut self, _tunables: &[(String, String)]) -> Result<bool, BenchError> {
        Ok(false)
    }
    /// Flushes and detaches; the image is then complete on disk.
    fn finish(self: Box<Self>) -> Result<(), BenchError>;
    /// Sets the zero-out length for writes into unwritten extents, in blocks:
    /// uext4's extent_zeroout_len, the kernel's extent_max_zeroout_kb (sysfs).
    ///
    /// # Errors
    /// Targets without such a setting refuse.
    fn set_zeroout(&mut self, _blocks: u32) -> Result<(), BenchError> {
        Err(BenchError("this target has no zero-out length to set".into()))
    }
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

/// A device's figures at one moment.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeviceSnapshot {
    pub stats: Option<IoStats>,
    pub model: Option<IoReport>,
}

struct Uext4Session {
    image: PathBuf,
    tunables: Vec<(String, String)>,
    /// None only inside `restart`, between closing the image and opening it again.
    ops: Option<Uext4Ops>,
    /// Counters of the device instances closed by restarts, so figures span the run.
    io_before: IoStats,
    /// One model for the whole run: a reopen keeps counting (and the head stays).
    model: Arc<IoModel>,
}

impl Uext4Session {
    fn open(image: &Path, tunables: Vec<(String, String)>) -> Result<Uext4Session, BenchError> {
        let model = Arc::new(IoModel::default());
        Ok(Uext4Session {
            image: image.to_path_buf(),
            ops: Some(Self::open_ops(image, &tunables, &model)?),
            tunables,
            io_before: Default::default(),
            model,
        })
    }

    fn open_ops(image: &Path, tunables: &[(String, String)], model: &Arc<IoModel>) -> Result<Uext4Ops, BenchError> {
        let mut opts = uext4::Options { read_only: false, io_model: Some(model.clone()), ..Default::default() };
        for (k, v) in tunables {
            opts.set(k, v).map_err(|e| BenchError(format!("uext4 option {k}={v}: {e}")))?;
        }
        let fs = uext4::Filesystem::open(image, opts)
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

    fn device(&self) -> DeviceSnapshot {
        DeviceSnapshot {
            stats: Some(self.io_before + self.live().fs.cache().device().stats()),
            model: Some(self.model.report()),
        }
    }

    fn begin_phase(&self) {
        self.model.new_epoch();
    }

    fn restart(&mut self) -> Result<(), BenchError> {
        self.live().fs.sync().map_err(|e| BenchError(format!("uext4 sync: {e}")))?;
        let io = self.device().stats.unwrap_or_default();
        // The old filesystem lets go of the image (and its lock) before the new one opens it.
        self.ops = None;
        self.ops = Some(Self::open_ops(&self.image, &self.tunables, &self.model)?);
        self.io_before = io;
        Ok(())
    }

    fn reopen_with(&mut self, tunables: &[(String, String)]) -> Result<bool, BenchError> {
        self.tunables.retain(|(k, _)| !tunables.iter().any(|(t, _)| t == k));
        self.tunables.extend(tunables.iter().cloned());
        self.restart()?;
        Ok(true)
    }

    fn finish(self: Box<Self>) -> Result<(), BenchError> {
        self.live().fs.sync().map_err(|e| BenchError(format!("uext4 sync: {e}")))
    }

    fn set_zeroout(&mut self, blocks: u32) -> Result<(), BenchError> {
        let value = blocks.to_string();
        self.live().fs.set_tunable("extent_zeroout_len", &value).map_err(|e| BenchError(e.to_string()))?;
        // A restart (cold cache) must keep it.
        self.tunables.retain(|(k, _)| k != "extent_zeroout_len");
        self.tunables.push(("extent_zeroout_len".into(), value));
        Ok(())
    }
}

struct KernelSession {
    image: PathBuf,
    ops: PosixOps,
    mounted: bool,
    /// The kernel's block requests, from its tracepoint, priced by uext4's model
    /// (None when tracing is not possible here; then only /sys/block counts).
    trace: Option<KernelTrace>,
    /// The loop device's /sys/block counters at mount, and those of devices
    /// left behind by restarts.
    loop_stat: Option<(PathBuf, IoStats)>,
    io_before: IoStats,
    /// The loop device's name (loopN), which names its /sys/fs/ext4 directory.
    device_name: String,
    /// extent_max_zeroout_kb to set again after a restart, if a workload set it.
    zeroout_kb: Option<u32>,
    /// The mount options: loop, noinit_itable and the workload's own.
    options: String,
}

impl KernelSession {
    fn mount(image: &Path, mountpoint: &Path, extra_options: &[&str]) -> Result<KernelSession, BenchError> {
        // The model learns the image's fixed blocks (superblocks, bitmaps, inode
        // tables, journal) from a read-only open before the kernel mounts it.
        let trace = match kernel_trace::KernelTrace::start(image) {
            Ok(t) => Some(t),
            Err(why) => {
                eprintln!("kernel requests are not traced ({why}); counting them from /sys/block");
                None
            }
        };
        let mut session = KernelSession {
            image: image.to_path_buf(),
            ops: PosixOps { root: mountpoint.to_path_buf(), sync_through_file: false, uext4_rm: None },
            mounted: false,
            trace,
            loop_stat: None,
            io_before: IoStats::default(),
            device_name: String::new(),
            zeroout_kb: None,
            options: ["loop", "noinit_itable"].iter().chain(extra_options).copied().collect::<Vec<_>>().join(","),
        };
        session.mount_again()?;
        Ok(session)
    }

    fn mount_again(&mut self) -> Result<(), BenchError> {
        // noinit_itable: mkfs left inode tables for the kernel to zero lazily, and
        // that background thread would otherwise run during the measurement.
        run_tool(Command::new("mount").args(["-t", "ext4", "-o", &self.options]).arg(&self.image).arg(&self.ops.root))?;
        self.mounted = true;
        let device = run_tool(Command::new("findmnt").args(["-no", "SOURCE"]).arg(&self.ops.root))?.trim().to_string();
        let name = device.rsplit('/').next().unwrap_or_default().to_string();
        let stat = PathBuf::from(format!("/sys/block/{name}/stat"));
        self.loop_stat = loop_stat(&stat).map(|s| (stat, s));
        self.device_name = name;
        if let Some(kb) = self.zeroout_kb {
            self.write_zeroout_kb(kb)?;
        }
        if let Some(trace) = &self.trace {
            trace.follow_device(&device).map_err(BenchError)?;
        }
        Ok(())
    }

    fn write_zeroout_kb(&self, kb: u32) -> Result<(), BenchError> {
        let knob = format!("/sys/fs/ext4/{}/extent_max_zeroout_kb", self.device_name);
        std::fs::write(&knob, kb.to_string()).map_err(|e| BenchError(format!("{knob}: {e}")))
    }

    fn loop_io(&self) -> IoStats {
        let now = self.loop_stat.as_ref().and_then(|(path, at_mount)| loop_stat(path).map(|s| s - *at_mount));
        self.io_before + now.unwrap_or_default()
    }
}

/// A block device's counters from /sys/block/NAME/stat (requests, sectors).
fn loop_stat(path: &Path) -> Option<IoStats> {
    let text = std::fs::read_to_string(path).ok()?;
    let f: Vec<u64> = text.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    Some(IoStats {
        reads: *f.first()?,
        read_bytes: f.get(2)? * 512,
        writes: *f.get(4)?,
        write_bytes: f.get(6)? * 512,
        flushes: f.get(15).copied().unwrap_or(0),
    })
}

impl Session for KernelSession {
    fn ops(&self) -> &dyn FsOps {
        &self.ops
    }

    fn device(&self) -> DeviceSnapshot {
        DeviceSnapshot { stats: Some(self.loop_io()), model: self.trace.as_ref().map(|t| t.report()) }
    }

    fn begin_phase(&self) {
        if let Some(t) = &self.trace {
            t.new_epoch();
        }
    }

    fn restart(&mut self) -> Result<(), BenchError> {
        let io = self.loop_io();
        run_tool(Command::new("umount").arg(&self.ops.root))?;
        self.mounted = false;
        self.io_before = io;
        self.loop_stat = None;
        self.mount_again()
    }

    fn finish(mut self: Box<Self>) -> Result<(), BenchError> {
        self.mounted = false;
        run_tool(Command::new("umount").arg(&self.ops.root)).map(drop)
    }

    fn set_zeroout(&mut self, blocks: u32) -> Result<(), BenchError> {
        // The benchmark's images have 4 KiB blocks (MKFS_ARGS).
        let kb = blocks * 4;
        self.write_zeroout_kb(kb)?;
        self.zeroout_kb = Some(kb);
        Ok(())
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
        let uext4_rm = (Some(argv[0].as_os_str()) == uext4_binary().as_ref().map(|p| p.as_os_str()))
            .then(|| PathBuf::from(&argv[0]));
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
            ops: PosixOps { root: mountpoint.to_path_buf(), sync_through_file: true, uext4_rm },
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_takes_mkfs_features_and_only_uext4s_take_options() {
        let kernel = Target::parse("kernel:features=^inline_data").unwrap();
        assert_eq!(kernel.mkfs_features().as_deref(), Some("^inline_data"));
        assert_eq!(kernel.name(), "kernel:features=^inline_data");
        let uext4 = Target::parse("uext4:features=inline_data+^metadata_csum,hash_goal=on").unwrap();
        assert_eq!(uext4.mkfs_features().as_deref(), Some("inline_data,^metadata_csum"));
        assert!(!uext4.is_base());
        assert_eq!(Target::parse("uext4").unwrap().mkfs_features(), None);
        assert!(Target::parse("uext4-fuse-uring:writeback_cache=on").is_ok());
        assert!(Target::parse("uext4-fuse:threads=2").is_ok());
        assert!(Target::parse("uext4-fuse:splice_read=off").is_ok());
        assert!(Target::parse("uext4-fuse-uring:splice_read=off").is_err());
        assert!(Target::parse("uext4-fuse:splice_read=maybe").is_err());
        assert!(Target::parse("uext4-fuse-uring:threads=2").is_err());
        assert!(Target::parse("uext4-fuse:threads=0").is_err());
        for bad in [
            "kernel:features=",
            "kernel:features=in,line",
            "kernel:features=a+",
            "kernel:features=^",
            "kernel:hash_goal=on",
            "uext4:writeback_cache=on",
            "kernel:writeback_cache=on",
            "uext4-fuse:writeback_cache=maybe",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }
}
