//! Crash matrix: power cuts and torn writes across a workload with fsyncs.
//!
//! One deterministic workload of 2,000 mixed operations (files created, written,
//! overwritten, appended to, truncated, renamed over each other, hard- and
//! symlinked, unlinked; directories made and removed; xattrs set; fsync of files
//! and of directories) runs on a `FaultDevice` that loses every write from the
//! N-th on (a power cut), or lets only a part of the N-th through and nothing
//! after it (a torn write). The image left behind is opened by uext4, which
//! recovers its journal; then `e2fsck -fn` must be silent, and every file whose
//! fsync returned before the cut, and which no later operation touched, must
//! hold exactly the content it had when that fsync returned. The kernel
//! recovers a copy of the same cut (a read-write loop mount reads the promised
//! files, unmounts, e2fsck -fn): in every phase, every N-th cut in the CI-sized
//! run and every cut with UEXT4_CRASH_KERNEL_EVERY=1 (the longer run).
//!
//! Tears keep whole 4 KiB units: the device modelled is a disk that writes 4 KiB
//! atomically (4Kn, or 512e with 4 KiB physical sectors). Smaller tears would cut
//! the 1 KiB superblock in two, which no ext4 implementation survives without a
//! backup superblock (its checksum covers both halves), the kernel included.
//!
//! The workload runs once in full to count its writes; the cut points are spread
//! evenly over them. Each cut is a fresh run from the same starting image, which
//! stops after the operation during which the cut fell (the process dies there).
//!
//! Further phases below: files held open while unlinked, renamed over and
//! truncated; I/O errors in the middle of every kind of operation; ext3 and an
//! upgraded ext3; and shapes that change shape (inline data moving to blocks,
//! directories turning into htrees, shared xattr blocks copied on write).

mod oracle;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use uext4::dev::{BlockDevice, Fault, FaultDevice, IoStats, MemDevice};
use uext4::format::superblock::{Superblock, EXT4_ERROR_FS};
use uext4::{Filesystem, Options, Owner, SetAttr, ROOT_INO};

const OPS: usize = 2000;
const POWER_CUTS: usize = 1000;
const MAX_TEARS: usize = 400;
const ATOMIC_UNIT: usize = 4096;
const ROOT: Owner = Owner { uid: 0, gid: 0 };

fn options() -> Options {
    // No commits by the clock: the run is the same every time, so its writes are too.
    Options { read_only: false, commit_interval_secs: 3600, ..Options::default() }
}

#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(len);
        v
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    File,
    Dir,
    Symlink,
}

#[derive(Clone)]
struct Entry {
    parent: u32,
    name: String,
    kind: Kind,
    ino: u32,
}

/// What an fsync of a path promised: this content, once it returned.
#[derive(Clone)]
struct Synced {
    op: usize,
    ino: u32,
    content: Vec<u8>,
    /// Device writes issued when the fsync returned.
    writes_at_return: u64,
}

/// The workload's view of the tree, and what each operation touched.
#[derive(Clone, Default)]
struct Model {
    entries: BTreeMap<String, Entry>,
    dir_paths: HashMap<u32, String>,
    children: HashMap<u32, usize>,
    contents: HashMap<u32, Vec<u8>>,
    synced: BTreeMap<String, Synced>,
    last_touch_path: HashMap<String, usize>,
    last_touch_ino: HashMap<u32, usize>,
    next_name: u32,
    total_bytes: usize,
    /// The I/O-error phase's workload: fallocate's modes and unlinks of open
    /// files as well (`one_extended_op`).
    extended: bool,
    /// How many of each of `one_extended_op`'s operations ran.
    extended_done: [usize; 6],
}

impl Model {
    fn pick(&self, rng: &mut Rng, kind: Kind) -> Option<(String, Entry)> {
        let all: Vec<(&String, &Entry)> = self.entries.iter().filter(|(_, e)| e.kind == kind).collect();
        if all.is_empty() {
            return None;
        }
        let (p, e) = all[rng.below(all.len())];
        Some((p.clone(), e.clone()))
    }

    fn pick_dir(&self, rng: &mut Rng) -> u32 {
        let dirs: Vec<u32> = self.dir_paths.keys().copied().collect();
        let mut dirs = dirs;
        dirs.sort_unstable();
        dirs[rng.below(dirs.len())]
    }

    fn new_name(&mut self, prefix: &str) -> String {
        self.next_name += 1;
        format!("{prefix}{}", self.next_name)
    }

    fn path_in(&self, dir: u32, name: &str) -> String {
        let parent = &self.dir_paths[&dir];
        if parent.is_empty() {
            format!("/{name}")
        } else {
            format!("{parent}/{name}")
        }
    }

    fn touch(&mut self, op: usize, path: &str, ino: Option<u32>) {
        self.last_touch_path.insert(path.to_string(), op);
        if let Some(ino) = ino {
            self.last_touch_ino.insert(ino, op);
        }
    }

    fn add(&mut self, path: String, entry: Entry) {
        *self.children.entry(entry.parent).or_default() += 1;
        if entry.kind == Kind::Dir {
            self.dir_paths.insert(entry.ino, path.clone());
        }
        self.entries.insert(path, entry);
    }

    fn remove(&mut self, path: &str) -> Entry {
        let e = self.entries.remove(path).unwrap();
        *self.children.get_mut(&e.parent).unwrap() -= 1;
        if e.kind == Kind::Dir {
            self.dir_paths.remove(&e.ino);
        }
        if e.kind == Kind::File && !self.entries.values().any(|o| o.ino == e.ino) {
            self.total_bytes -= self.contents.remove(&e.ino).map_or(0, |c| c.len());
        }
        e
    }

    fn set_content(&mut self, ino: u32, content: Vec<u8>) {
        let old = self.contents.insert(ino, content).map_or(0, |c| c.len());
        self.total_bytes = self.total_bytes - old + self.contents[&ino].len();
    }

    /// Files a cut before write `first_lost` must have kept exactly.
    fn promised(&self, first_lost: u64) -> Vec<(String, Vec<u8>)> {
        promised_files(&self.synced, &self.last_touch_path, &self.last_touch_ino, first_lost)
    }
}

/// What the I/O-error phase adds to the workload: preallocation (keep-size),
/// punched holes, zeroed ranges, collapsed and inserted ranges (4 KiB-aligned,
/// as the kernel requires), and a file unlinked while open (an orphan until
/// the filesystem's close releases it, or, after an error, recovery frees it).
fn one_extended_op(fs: &Filesystem, m: &mut Model, rng: &mut Rng, op: usize) -> uext4::Result<()> {
    use uext4::space::*;
    const BLOCK: usize = 4096;
    let Some((path, e)) = m.pick(rng, Kind::File) else { return Ok(()) };
    let mut content = m.contents[&e.ino].clone();
    let size = content.len();
    let off = rng.below(size + 2 * BLOCK);
    let len = 1 + rng.below(6 * BLOCK);
    let only_name = m.entries.values().filter(|o| o.ino == e.ino).count() == 1;
    m.touch(op, &path, Some(e.ino));
    let kind = rng.below(6);
    match kind {
        0 => fs.fallocate(e.ino, off as u64, len as u64, FALLOC_FL_KEEP_SIZE)?,
        1 => {
            fs.fallocate(e.ino, off as u64, len as u64, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)?;
            let end = (off + len).min(size);
            if off < end {
                content[off..end].fill(0);
            }
        }
        2 => {
            fs.fallocate(e.ino, off as u64, len as u64, FALLOC_FL_ZERO_RANGE)?;
            if content.len() < off + len {
                content.resize(off + len, 0);
            }
            content[off..off + len].fill(0);
        }
        // Collapse: whole blocks, ending before the end of the file.
        3 if size > 2 * BLOCK => {
            let blocks = size / BLOCK;
            let at = rng.below(blocks - 1) * BLOCK;
            let n = (1 + rng.below(blocks - 1 - at / BLOCK)) * BLOCK;
            fs.fallocate(e.ino, at as u64, n as u64, FALLOC_FL_COLLAPSE_RANGE)?;
            content.drain(at..at + n);
        }
        // Insert: whole blocks, starting before the end of the file.
        4 if size > BLOCK => {
            let at = rng.below(size / BLOCK) * BLOCK;
            let n = (1 + rng.below(4)) * BLOCK;
            fs.fallocate(e.ino, at as u64, n as u64, FALLOC_FL_INSERT_RANGE)?;
            content.splice(at..at, std::iter::repeat_n(0u8, n));
        }
        // Unlink a file held open, its only name: an orphan until it is closed.
        5 if only_name => {
            fs.open_inode(e.ino)?;
            fs.write(e.ino, size as u64, b"written while open")?;
            fs.unlink(e.parent, e.name.as_bytes())?;
            m.remove(&path);
            m.extended_done[kind] += 1;
            return Ok(());
        }
        _ => return Ok(()),
    }
    m.set_content(e.ino, content);
    m.extended_done[kind] += 1;
    Ok(())
}

/// Runs the workload until it ends or the device has been cut; returns the model.
fn run_workload(fs: &Filesystem, writes: &dyn Fn() -> u64, is_cut: &dyn Fn() -> bool) -> Model {
    run_workload_then(fs, writes, is_cut, &|| {})
}

/// `run_workload`, calling `after_op` after every operation.
fn run_workload_then(
    fs: &Filesystem,
    writes: &dyn Fn() -> u64,
    is_cut: &dyn Fn() -> bool,
    after_op: &dyn Fn(),
) -> Model {
    run_workload_with(fs, writes, is_cut, after_op, false)
}

/// `run_workload_then`, with `one_extended_op`'s operations mixed in when `extended`.
fn run_workload_with(
    fs: &Filesystem,
    writes: &dyn Fn() -> u64,
    is_cut: &dyn Fn() -> bool,
    after_op: &dyn Fn(),
    extended: bool,
) -> Model {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut m = Model { extended, ..Model::default() };
    m.dir_paths.insert(ROOT_INO, String::new());
    for op in 0..OPS {
        let result = one_op(fs, &mut m, &mut rng, op, writes);
        if is_cut() {
            break;
        }
        if let Err(e) = result {
            panic!("operation {op} failed before any write was lost: {e}");
        }
        after_op();
    }
    m
}

fn one_op(fs: &Filesystem, m: &mut Model, rng: &mut Rng, op: usize, writes: &dyn Fn() -> u64) -> uext4::Result<()> {
    if m.extended && rng.below(4) == 0 {
        return one_extended_op(fs, m, rng, op);
    }
    let crowded = m.entries.len() > 300 || m.total_bytes > 8 << 20;
    let roll = rng.below(100);
    match roll {
        // Create a file with content.
        0..=14 if !crowded => {
            let dir = m.pick_dir(rng);
            let name = m.new_name("f");
            let len = [0, 100, 3000, 9000, 40_000][rng.below(5)] + rng.below(200);
            let body = rng.bytes(len);
            let path = m.path_in(dir, &name);
            let ino = fs.create(dir, name.as_bytes(), 0o644, ROOT)?.ino;
            m.touch(op, &path, Some(ino));
            m.add(path, Entry { parent: dir, name, kind: Kind::File, ino });
            m.set_content(ino, Vec::new());
            fs.write(ino, 0, &body)?;
            m.set_content(ino, body);
        }
        // Overwrite a range, perhaps past the end.
        15..=29 => {
            let Some((path, e)) = m.pick(rng, Kind::File) else { return Ok(()) };
            let mut content = m.contents[&e.ino].clone();
            let off = rng.below(content.len() + 1);
            let len = 1 + rng.below(12_000);
            let data = rng.bytes(len);
            m.touch(op, &path, Some(e.ino));
            fs.write(e.ino, off as u64, &data)?;
            if content.len() < off + data.len() {
                content.resize(off + data.len(), 0);
            }
            content[off..off + data.len()].copy_from_slice(&data);
            m.set_content(e.ino, content);
        }
        // Append.
        30..=39 if !crowded => {
            let Some((path, e)) = m.pick(rng, Kind::File) else { return Ok(()) };
            let mut content = m.contents[&e.ino].clone();
            let len = 1 + rng.below(9000);
            let data = rng.bytes(len);
            m.touch(op, &path, Some(e.ino));
            fs.write(e.ino, content.len() as u64, &data)?;
            content.extend_from_slice(&data);
            m.set_content(e.ino, content);
        }
        // Truncate, shrinking or growing.
        40..=46 => {
            let Some((path, e)) = m.pick(rng, Kind::File) else { return Ok(()) };
            let mut content = m.contents[&e.ino].clone();
            let size = rng.below(content.len() * 3 / 2 + 2);
            m.touch(op, &path, Some(e.ino));
            fs.setattr(e.ino, &SetAttr { size: Some(size as u64), ..SetAttr::default() })?;
            content.resize(size, 0);
            m.set_content(e.ino, content);
        }
        // Unlink a file or symlink.
        47..=56 => {
            let kind = if rng.below(4) == 0 { Kind::Symlink } else { Kind::File };
            let Some((path, e)) = m.pick(rng, kind) else { return Ok(()) };
            m.touch(op, &path, Some(e.ino));
            fs.unlink(e.parent, e.name.as_bytes())?;
            m.remove(&path);
        }
        // Rename a file to a new name or over another file.
        57..=63 => {
            let Some((src, e)) = m.pick(rng, Kind::File) else { return Ok(()) };
            let (dst_dir, dst_name, replaced) = match m.pick(rng, Kind::File) {
                Some((p, victim)) if rng.below(2) == 0 && p != src && victim.ino != e.ino => {
                    (victim.parent, victim.name.clone(), Some((p, victim.ino)))
                }
                _ => {
                    let dir = m.pick_dir(rng);
                    (dir, m.new_name("r"), None)
                }
            };
            let dst = m.path_in(dst_dir, &dst_name);
            m.touch(op, &src, Some(e.ino));
            m.touch(op, &dst, replaced.as_ref().map(|r| r.1));
            fs.rename(e.parent, e.name.as_bytes(), dst_dir, dst_name.as_bytes(), 0)?;
            if let Some((p, _)) = replaced {
                m.remove(&p);
            }
            m.add(dst, Entry { parent: dst_dir, name: dst_name, kind: Kind::File, ino: e.ino });
            m.remove(&src);
        }
        // A hard link.
        64..=66 if !crowded => {
            let Some((_, e)) = m.pick(rng, Kind::File) else { return Ok(()) };
            let dir = m.pick_dir(rng);
            let name = m.new_name("h");
            let path = m.path_in(dir, &name);
            m.touch(op, &path, Some(e.ino));
            fs.link(e.ino, dir, name.as_bytes())?;
            m.add(path, Entry { parent: dir, name, kind: Kind::File, ino: e.ino });
        }
        // A symlink.
        67..=69 if !crowded => {
            let dir = m.pick_dir(rng);
            let name = m.new_name("s");
            let target = format!("target-{}", "x".repeat(rng.below(120)));
            let path = m.path_in(dir, &name);
            let ino = fs.symlink(dir, name.as_bytes(), target.as_bytes(), ROOT)?.ino;
            m.touch(op, &path, Some(ino));
            m.add(path, Entry { parent: dir, name, kind: Kind::Symlink, ino });
        }
        // A directory.
        70..=73 if !crowded && m.dir_paths.len() < 40 => {
            let dir = m.pick_dir(rng);
            let name = m.new_name("d");
            let path = m.path_in(dir, &name);
            let ino = fs.mkdir(dir, name.as_bytes(), 0o755, ROOT)?.ino;
            m.touch(op, &path, Some(ino));
            m.add(path, Entry { parent: dir, name, kind: Kind::Dir, ino });
        }
        // Remove an empty directory.
        74..=76 => {
            let empty: Vec<String> = m
                .entries
                .iter()
                .filter(|(_, e)| e.kind == Kind::Dir && m.children.get(&e.ino).copied().unwrap_or(0) == 0)
                .map(|(p, _)| p.clone())
                .collect();
            if empty.is_empty() {
                return Ok(());
            }
            let path = empty[rng.below(empty.len())].clone();
            let e = m.entries[&path].clone();
            m.touch(op, &path, Some(e.ino));
            fs.rmdir(e.parent, e.name.as_bytes())?;
            m.remove(&path);
        }
        // An extended attribute (inode body or xattr block).
        77..=80 => {
            let Some((_, e)) = m.pick(rng, Kind::File) else { return Ok(()) };
            let len = rng.below(300);
            let value = rng.bytes(len);
            fs.set_xattr(e.ino, format!("user.k{}", rng.below(6)).as_bytes(), &value, 0)?;
        }
        // fsync of a directory.
        81..=84 => {
            let dir = m.pick_dir(rng);
            fs.fsync(dir)?;
        }
        // fsync of a file: from its return on, its content is promised.
        _ => {
            let Some((path, e)) = m.pick(rng, Kind::File) else { return Ok(()) };
            fs.fsync(e.ino)?;
            let content = m.contents[&e.ino].clone();
            m.synced.insert(path, Synced { op, ino: e.ino, content, writes_at_return: writes() });
        }
    }
    Ok(())
}

/// Counts writes and their sizes: the reference run, which chooses the cuts.
struct Recorder {
    inner: Arc<dyn BlockDevice>,
    sizes: Mutex<Vec<usize>>,
}

/// The fsync'd files a cut before write `first_lost` must have kept exactly:
/// those whose fsync returned before it, with no change to their path or inode
/// since.
fn promised_files(
    synced: &BTreeMap<String, Synced>,
    last_touch_path: &HashMap<String, usize>,
    last_touch_ino: &HashMap<u32, usize>,
    first_lost: u64,
) -> Vec<(String, Vec<u8>)> {
    synced
        .iter()
        .filter(|(path, s)| {
            s.writes_at_return < first_lost
                && last_touch_path.get(*path).is_none_or(|&t| t < s.op)
                && last_touch_ino.get(&s.ino).is_none_or(|&t| t < s.op)
        })
        .map(|(p, s)| (p.clone(), s.content.clone()))
        .collect()
}

impl BlockDevice for Recorder {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> uext4::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> uext4::Result<()> {
        self.sizes.lock().unwrap().push(buf.len());
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> uext4::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn stats(&self) -> IoStats {
        self.inner.stats()
    }
}

/// The first write lost by a fault.
fn first_lost(fault: Fault) -> u64 {
    match fault {
        Fault::DropAfter(n) => n + 1,
        Fault::Tear { write, .. } => write,
        Fault::FailWrite(n) => n,
        Fault::None | Fault::FailRead(_) => u64::MAX,
    }
}

struct Outcome {
    promised_files: usize,
    replayed: bool,
    /// The run ended before the cut point (nothing to judge).
    ended_early: bool,
}

/// One cut: run until it, recover, and judge the image left behind.
fn crash_and_recover(base: &[u8], fault: Fault, scratch: &Path, debugfs_too: bool, kernel: bool) -> Outcome {
    let mem = Arc::new(MemDevice::new(base.to_vec()));
    let dev = Arc::new(FaultDevice::new(mem.clone(), fault));
    let fs = Filesystem::open_device(dev.clone(), options()).unwrap();
    let model = run_workload(&fs, &|| dev.writes(), &|| dev.is_cut());
    if !dev.is_cut() {
        // The cut falls in the writes of closing.
        fs.sync().unwrap();
    }
    if !dev.is_cut() {
        // Commits run on the journal thread, so a run's writes vary a little in
        // number: this one ended before the cut (counted, and bounded below).
        drop(fs);
        return Outcome { promised_files: 0, replayed: false, ended_early: true };
    }
    fs.abandon();

    if let Ok(dir) = std::env::var("UEXT4_CRASH_KEEP_DIR") {
        std::fs::write(Path::new(&dir).join("before.img"), mem.contents()).unwrap();
    }
    let cut = mem.contents();
    let left = Arc::new(MemDevice::new(cut.clone()));
    let needed_recovery = needs_recovery(&cut);
    let fs = Filesystem::open_device(left.clone(), options())
        .unwrap_or_else(|e| panic!("{fault:?}: reopening after the cut failed: {e}"));
    let promised = model.promised(first_lost(fault));
    for (path, content) in &promised {
        let ino = fs
            .lookup_path(path.as_bytes())
            .unwrap_or_else(|e| panic!("{fault:?}: {path}, fsync'd before the cut, is gone: {e}"));
        let got = fs.read_all(ino).unwrap();
        assert!(
            got == *content,
            "{fault:?}: {path} holds {} bytes, not the {} it held at its fsync",
            got.len(),
            content.len()
        );
    }
    drop(fs);
    std::fs::write(scratch, left.contents()).unwrap();
    check_e2fsck(scratch, fault);
    if debugfs_too {
        check_with_debugfs(scratch, &promised, fault);
    }
    if kernel {
        kernel_recovers(scratch, &cut, &promised, fault);
    }
    Outcome { promised_files: promised.len(), replayed: needed_recovery, ended_early: false }
}

/// The superblock's needs_recovery flag (s_feature_incompat at byte 0x60, bit 0x4).
fn needs_recovery(image: &[u8]) -> bool {
    let incompat = u32::from_le_bytes(image[1024 + 0x60..1024 + 0x64].try_into().unwrap());
    incompat & 0x4 != 0
}

fn check_e2fsck(image: &Path, fault: Fault) {
    let out = std::process::Command::new("e2fsck").arg("-fn").arg(image).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let noise: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("Pass ") && !l.starts_with("e2fsck ") && !l.contains(" files (") && !l.is_empty())
        .collect();
    assert!(out.status.success() && noise.is_empty(), "{fault:?}: e2fsck -fn after recovery:\n{text}");
}

/// debugfs reads the promised files itself: our reader is not the only judge.
fn check_with_debugfs(image: &Path, promised: &[(String, Vec<u8>)], fault: Fault) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmds = String::new();
    for (i, (path, _)) in promised.iter().enumerate() {
        cmds += &format!("dump {path} {}\n", dir.path().join(i.to_string()).display());
    }
    let cmd_file = dir.path().join("cmds");
    std::fs::write(&cmd_file, cmds).unwrap();
    oracle::run(std::process::Command::new("debugfs").arg("-f").arg(&cmd_file).arg(image));
    for (i, (path, content)) in promised.iter().enumerate() {
        let got = std::fs::read(dir.path().join(i.to_string())).unwrap_or_default();
        assert!(got == *content, "{fault:?}: debugfs reads {path} as {} bytes, not {}", got.len(), content.len());
    }
}

/// The kernel's recovery of what a cut left, on a copy at `scratch`: a
/// read-write loop mount replays the journal and handles the orphans, every
/// promised file reads back as promised through it, it unmounts (loudly, or
/// the test fails) and e2fsck -fn is silent.
fn kernel_recovers(scratch: &Path, left: &[u8], promised: &[(String, Vec<u8>)], fault: Fault) {
    std::fs::write(scratch, left).unwrap();
    // An image whose superblock records an error: the kernel's mount clears
    // the orphan list without freeing its inodes ("Errors on filesystem,
    // clearing orphan list"), which e2fsck then finds.
    let with_errors = Superblock::parse(&left[1024..2048], false).is_ok_and(|sb| sb.s_state & EXT4_ERROR_FS != 0);
    let mount = oracle::Mount::new(scratch, "");
    for (path, content) in promised {
        let got = std::fs::read(mount.dir.join(path.trim_start_matches('/')))
            .unwrap_or_else(|e| panic!("{fault:?}: the kernel cannot read {path}: {e}"));
        assert!(
            got == *content,
            "{fault:?}: the kernel reads {path} as {} bytes changed after its recovery, not the {} promised",
            got.len(),
            content.len()
        );
    }
    mount.unmount();
    match with_errors {
        true => check_e2fsck_after_the_kernels_error_handling(scratch, fault),
        false => check_e2fsck(scratch, fault),
    }
}

/// e2fsck -fn after the kernel mounted an image with an error recorded: it may
/// report the orphans the kernel's mount dropped from the list (each "part of
/// the orphaned inode list", or the list's last with a zero dtime) and the
/// inodes and blocks those still hold in the bitmaps and counts, and nothing
/// else: every inode the bitmaps hold too many is one of those orphans.
fn check_e2fsck_after_the_kernels_error_handling(image: &Path, fault: Fault) {
    let out = std::process::Command::new("e2fsck").arg("-fn").arg(image).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let number = |l: &str, after: &str| -> Option<u32> {
        l.split(after).nth(1)?.split_whitespace().next()?.trim_end_matches('.').parse().ok()
    };
    let mut orphans = HashSet::new();
    let mut leaked = Vec::new();
    for l in text.lines().map(str::trim) {
        if let Some(ino) = number(l, "Inode ").filter(|_| l.ends_with("was part of the orphaned inode list.  IGNORED."))
        {
            orphans.insert(ino);
        } else if let Some(ino) = number(l, "Deleted inode ").filter(|_| l.contains("has zero dtime")) {
            orphans.insert(ino);
        } else if let Some(list) = l.strip_prefix("Inode bitmap differences:") {
            for part in list.split_whitespace() {
                let range = part.strip_prefix('-').unwrap_or_else(|| panic!("{fault:?}: an inode in use is free: {l}"));
                let range = range.trim_start_matches('(').trim_end_matches(')');
                let (a, b) = range.split_once("--").unwrap_or((range, range));
                leaked.extend(a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap());
            }
        } else if let Some(list) = l.strip_prefix("Block bitmap differences:") {
            assert!(list.split_whitespace().all(|p| p.starts_with('-')), "{fault:?}: a block in use is free: {l}");
        } else {
            let expected = l.is_empty()
                || l.starts_with("Pass ")
                || l.starts_with("e2fsck ")
                || l.contains(" files (")
                || l.starts_with("Inodes that were part of a corrupted orphan linked list found")
                || l.starts_with("Fix? no")
                || l.starts_with("Free blocks count wrong")
                || l.starts_with("Free inodes count wrong")
                || l.contains("WARNING: Filesystem still has errors");
            assert!(expected, "{fault:?}: e2fsck -fn after the kernel's recovery says {l:?}:\n{text}");
        }
    }
    for ino in &leaked {
        assert!(orphans.contains(ino), "{fault:?}: inode {ino} is held but was no orphan:\n{text}");
    }
}

/// Whether cut `i` of a phase is also recovered by the kernel: every
/// `default_every`-th in the CI-sized run (each kernel mount costs about half a
/// second), every cut with UEXT4_CRASH_KERNEL_EVERY=1 (the longer run), never
/// without loop devices (a skip the oracle helpers already report).
fn kernel_cut(i: usize, default_every: usize) -> bool {
    let every = std::env::var("UEXT4_CRASH_KERNEL_EVERY").ok().and_then(|v| v.parse().ok()).unwrap_or(default_every);
    every > 0 && i.is_multiple_of(every) && oracle::require_loop()
}

#[test]
fn power_cuts_and_torn_writes_across_a_workload() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("base.img");
    std::fs::write(&image, vec![0u8; 32 << 20]).unwrap();
    oracle::run(std::process::Command::new("mkfs.ext4").args(["-F", "-q", "-b", "4096", "-N", "1024"]).arg(&image));
    let base = std::fs::read(&image).unwrap();

    // The reference run: every write, and how big.
    let mem = Arc::new(MemDevice::new(base.clone()));
    let recorder = Arc::new(Recorder { inner: mem.clone(), sizes: Mutex::new(Vec::new()) });
    let fs = Filesystem::open_device(recorder.clone(), options()).unwrap();
    let count = || recorder.sizes.lock().unwrap().len() as u64;
    let model = run_workload(&fs, &count, &|| false);
    let stats = fs.journal_stats().unwrap();
    drop(fs);
    std::fs::write(&image, mem.contents()).unwrap();
    oracle::assert_e2fsck_clean(&image);
    let sizes = recorder.sizes.lock().unwrap().clone();
    let total = sizes.len() as u64;
    eprintln!(
        "reference run: {OPS} operations, {} fsyncs, {} entries left, {total} writes, journal {stats:?}",
        model.synced.len(),
        model.entries.len()
    );
    assert!(
        stats.wraps >= 1 && stats.checkpoints >= 1 && stats.revokes_logged >= 1 && stats.blocks_kept_in_log >= 1,
        "the log must wrap, revoke and checkpoint, and a checkpoint must leave hot blocks in the log: {stats:?}"
    );

    // Power cuts spread evenly; tears of the writes spanning several units.
    let mut faults: Vec<Fault> =
        (0..POWER_CUTS as u64).map(|i| Fault::DropAfter(i * (total - 1) / POWER_CUTS as u64)).collect();
    faults.dedup();
    let multi: Vec<u64> = (1..=total).filter(|&n| sizes[n as usize - 1] > ATOMIC_UNIT).collect();
    let step = multi.len().div_ceil(MAX_TEARS).max(1);
    let mut rng = Rng(42);
    for &n in multi.iter().step_by(step) {
        let units = sizes[n as usize - 1].div_ceil(ATOMIC_UNIT);
        faults.push(Fault::Tear { write: n, keep: (1 + rng.below(units - 1)) * ATOMIC_UNIT });
    }
    // UEXT4_CRASH_ONLY=drop:N or tear:N:KEEP replays one cut, keeping its images
    // (before and after recovery) in UEXT4_CRASH_KEEP, for debugging.
    if let Ok(only) = std::env::var("UEXT4_CRASH_ONLY") {
        let f: Vec<u64> = only.split(':').skip(1).map(|v| v.parse().unwrap()).collect();
        let fault = match only.split(':').next() {
            Some("tear") => Fault::Tear { write: f[0], keep: f[1] as usize },
            _ => Fault::DropAfter(f[0]),
        };
        let keep = std::env::var("UEXT4_CRASH_KEEP").unwrap_or_else(|_| "/tmp".into());
        std::env::set_var("UEXT4_CRASH_KEEP_DIR", &keep);
        crash_and_recover(&base, fault, &Path::new(&keep).join("after.img"), true, false);
        return;
    }
    let cuts = faults.iter().filter(|f| matches!(f, Fault::DropAfter(_))).count();
    assert!(cuts >= POWER_CUTS * 9 / 10, "only {cuts} distinct power cuts over {total} writes");

    let next = AtomicUsize::new(0);
    let promised = AtomicU64::new(0);
    let replayed = AtomicUsize::new(0);
    let early = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..2 {
            let (faults, base, next, promised, replayed, early) = (&faults, &base, &next, &promised, &replayed, &early);
            let scratch = work.path().join(format!("cut{t}.img"));
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&fault) = faults.get(i) else { break };
                let outcome = crash_and_recover(base, fault, &scratch, i % 40 == 0, kernel_cut(i, 20));
                promised.fetch_add(outcome.promised_files as u64, Ordering::Relaxed);
                replayed.fetch_add(outcome.replayed as usize, Ordering::Relaxed);
                early.fetch_add(outcome.ended_early as usize, Ordering::Relaxed);
            });
        }
    });
    let (promised, replayed, early) = (promised.into_inner(), replayed.into_inner(), early.into_inner());
    eprintln!(
        "{} crashes ({cuts} power cuts, {} torn writes): {replayed} left a journal to recover; {promised} fsync'd files verified; {early} runs ended before their cut",
        faults.len(),
        faults.len() - cuts
    );
    assert!(early <= faults.len() / 20, "{early} of {} runs ended before their cut", faults.len());
    assert!(replayed >= faults.len() / 2, "most cuts should fall where the journal is live");
    assert!(promised >= faults.len() as u64, "too few fsync'd files were checked to mean anything");
}

// ---------------------------------------------------------------------------
// Phase: files held open while unlinked, renamed over and truncated; closed
// files unlinked or renamed over, then their directory fsync'd (issue 13, issue
// 12 item 6). Every cut is judged twice: by uext4's recovery, and on a copy by
// the kernel's (loop mount read-write, the promised files read through it, then
// umount), each followed by a silent e2fsck -fn. The same workload runs on an
// image with the chain only and on one with an orphan file.
//
// UEXT4_CRASH_OPEN_CUTS=N sets the cuts per image (default 64, which keeps this
// phase under a minute on two cores; 500 is a thorough run).

const OPEN_OPS: usize = 400;
const OPEN_CUTS_DEFAULT: usize = 64;

/// The open-files workload's view: files by path (one name each), what each inode
/// holds, which inodes this "process" holds open, and fsync promises.
#[derive(Default)]
struct OpenModel {
    files: BTreeMap<String, (u32, u32)>,
    contents: HashMap<u32, Vec<u8>>,
    held: BTreeMap<u32, u32>,
    synced: BTreeMap<String, Synced>,
    last_touch_path: HashMap<String, usize>,
    last_touch_ino: HashMap<u32, usize>,
    next_name: u32,
}

impl OpenModel {
    fn touch(&mut self, op: usize, path: &str, ino: u32) {
        self.last_touch_path.insert(path.to_string(), op);
        self.last_touch_ino.insert(ino, op);
    }

    fn pick_file(&self, rng: &mut Rng) -> Option<(String, u32, u32)> {
        if self.files.is_empty() {
            return None;
        }
        let (p, &(dir, ino)) = self.files.iter().nth(rng.below(self.files.len()))?;
        Some((p.clone(), dir, ino))
    }

    /// Any inode this run can still reach: linked, or unlinked but held open.
    fn pick_inode(&self, rng: &mut Rng) -> Option<u32> {
        let all: Vec<u32> =
            self.contents.keys().copied().collect::<std::collections::BTreeSet<_>>().into_iter().collect();
        (!all.is_empty()).then(|| all[rng.below(all.len())])
    }

    fn is_linked(&self, ino: u32) -> bool {
        self.files.values().any(|&(_, i)| i == ino)
    }

    /// `ino` lost its name: its content goes with it unless it is held open.
    fn drop_name(&mut self, path: &str) {
        let (_, ino) = self.files.remove(path).unwrap();
        if !self.held.contains_key(&ino) {
            self.contents.remove(&ino);
        }
    }

    fn promised(&self, first_lost: u64) -> Vec<(String, Vec<u8>)> {
        promised_files(&self.synced, &self.last_touch_path, &self.last_touch_ino, first_lost)
    }
}

fn name_in(dir: u32, sub: u32, name: &str) -> String {
    if dir == sub {
        format!("/d/{name}")
    } else {
        format!("/{name}")
    }
}

fn run_open_workload(fs: &Filesystem, writes: &dyn Fn() -> u64, is_cut: &dyn Fn() -> bool) -> OpenModel {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut m = OpenModel::default();
    let sub = match fs.mkdir(ROOT_INO, b"d", 0o755, ROOT) {
        Ok(st) => st.ino,
        Err(e) => panic!("mkdir /d: {e}"),
    };
    for op in 0..OPEN_OPS {
        let result = open_op(fs, &mut m, &mut rng, op, sub, writes);
        if is_cut() {
            break;
        }
        if let Err(e) = result {
            panic!("open-files operation {op} failed before any write was lost: {e}");
        }
    }
    m
}

fn open_op(
    fs: &Filesystem,
    m: &mut OpenModel,
    rng: &mut Rng,
    op: usize,
    sub: u32,
    writes: &dyn Fn() -> u64,
) -> uext4::Result<()> {
    let crowded = m.contents.len() > 60;
    let total: usize = m.contents.values().map(Vec::len).sum();
    match rng.below(100) {
        // Create a file with content, in the root or in /d.
        0..=24 if !crowded && total < 6 << 20 => {
            let dir = if rng.below(2) == 0 { ROOT_INO } else { sub };
            m.next_name += 1;
            let name = format!("f{}", m.next_name);
            let path = name_in(dir, sub, &name);
            let len = [0, 900, 5000, 70_000][rng.below(4)] + rng.below(300);
            let body = rng.bytes(len);
            let ino = fs.create(dir, name.as_bytes(), 0o644, ROOT)?.ino;
            m.touch(op, &path, ino);
            m.files.insert(path.clone(), (dir, ino));
            m.contents.insert(ino, Vec::new());
            fs.write(ino, 0, &body)?;
            m.contents.insert(ino, body.clone());
            // Half the new files are fsync'd at once: promises that later cuts can check.
            if rng.below(2) == 0 {
                fs.fsync(ino)?;
                m.synced.insert(path, Synced { op, ino, content: body, writes_at_return: writes() });
            }
        }
        // Write into any reachable file, linked or unlinked-but-open.
        25..=34 => {
            let Some(ino) = m.pick_inode(rng) else { return Ok(()) };
            let mut content = m.contents[&ino].clone();
            let off = rng.below(content.len() + 1);
            let len = 1 + rng.below(20_000);
            let data = rng.bytes(len);
            m.last_touch_ino.insert(ino, op);
            fs.write(ino, off as u64, &data)?;
            content.resize(content.len().max(off + data.len()), 0);
            content[off..off + data.len()].copy_from_slice(&data);
            m.contents.insert(ino, content);
        }
        // Open a linked file (and keep it open).
        35..=44 => {
            let Some((_, _, ino)) = m.pick_file(rng) else { return Ok(()) };
            fs.open_inode(ino)?;
            *m.held.entry(ino).or_insert(0) += 1;
        }
        // Close a held file: the last close of an unlinked one frees it.
        45..=53 => {
            if m.held.is_empty() {
                return Ok(());
            }
            let ino = *m.held.keys().nth(rng.below(m.held.len())).unwrap();
            m.last_touch_ino.insert(ino, op);
            fs.close_inode(ino)?;
            let n = m.held.get_mut(&ino).unwrap();
            *n -= 1;
            if *n == 0 {
                m.held.remove(&ino);
                if !m.is_linked(ino) {
                    m.contents.remove(&ino);
                }
            }
        }
        // Unlink (open or closed); often the directory is fsync'd right after.
        54..=62 => {
            let Some((path, dir, ino)) = m.pick_file(rng) else { return Ok(()) };
            m.touch(op, &path, ino);
            let name = path.rsplit('/').next().unwrap().to_string();
            fs.unlink(dir, name.as_bytes())?;
            m.drop_name(&path);
            if rng.below(2) == 0 {
                fs.fsync(dir)?;
            }
        }
        // Rename a file over another (open or closed), then often fsync the directory.
        63..=71 => {
            let Some((src, src_dir, src_ino)) = m.pick_file(rng) else { return Ok(()) };
            let Some((dst, dst_dir, dst_ino)) = m.pick_file(rng) else { return Ok(()) };
            if src == dst {
                return Ok(());
            }
            m.touch(op, &src, src_ino);
            m.touch(op, &dst, dst_ino);
            let src_name = src.rsplit('/').next().unwrap().to_string();
            let dst_name = dst.rsplit('/').next().unwrap().to_string();
            fs.rename(src_dir, src_name.as_bytes(), dst_dir, dst_name.as_bytes(), 0)?;
            m.drop_name(&dst);
            m.files.remove(&src);
            m.files.insert(dst, (dst_dir, src_ino));
            if rng.below(2) == 0 {
                fs.fsync(dst_dir)?;
            }
        }
        // Truncate any reachable file, open or not, shrinking or growing.
        72..=79 => {
            let Some(ino) = m.pick_inode(rng) else { return Ok(()) };
            let mut content = m.contents[&ino].clone();
            let size = rng.below(content.len() * 3 / 2 + 2);
            m.last_touch_ino.insert(ino, op);
            fs.setattr(ino, &SetAttr { size: Some(size as u64), ..SetAttr::default() })?;
            content.resize(size, 0);
            m.contents.insert(ino, content);
        }
        // fsync of a directory.
        80..=84 => {
            fs.fsync(if rng.below(2) == 0 { ROOT_INO } else { sub })?;
        }
        // fsync of a linked file: its content is promised from the return on.
        _ => {
            let Some((path, _, ino)) = m.pick_file(rng) else { return Ok(()) };
            fs.fsync(ino)?;
            let content = m.contents[&ino].clone();
            m.synced.insert(path, Synced { op, ino, content, writes_at_return: writes() });
        }
    }
    Ok(())
}

/// One cut of the open-files workload, judged by uext4's recovery and by the
/// kernel's; returns how many promised files were checked (by each), or None
/// when the run ended before its cut (as phase 1 counts them: small files'
/// data written behind makes the count of writes depend a little on where the
/// journal thread's size-triggered commits fall).
fn open_files_cut(base: &[u8], fault: Fault, scratch: &Path, kernel: bool) -> Option<usize> {
    let mem = Arc::new(MemDevice::new(base.to_vec()));
    let dev = Arc::new(FaultDevice::new(mem.clone(), fault));
    let fs = Filesystem::open_device(dev.clone(), options()).unwrap();
    let model = run_open_workload(&fs, &|| dev.writes(), &|| dev.is_cut());
    if !dev.is_cut() {
        fs.sync().unwrap();
    }
    if !dev.is_cut() {
        return None;
    }
    // The process dies holding its open files.
    fs.abandon();
    let left = mem.contents();
    let promised = model.promised(first_lost(fault));

    // uext4's recovery: journal, then the orphans the crash left.
    let ours = Arc::new(MemDevice::new(left.clone()));
    let fs = Filesystem::open_device(ours.clone(), options())
        .unwrap_or_else(|e| panic!("{fault:?}: uext4's writable open after the cut failed: {e}"));
    for (path, content) in &promised {
        let ino = fs.lookup_path(path.as_bytes()).unwrap_or_else(|e| panic!("{fault:?}: {path} is gone: {e}"));
        assert!(fs.read_all(ino).unwrap() == *content, "{fault:?}: uext4 reads {path} changed after recovery");
    }
    drop(fs);
    std::fs::write(scratch, ours.contents()).unwrap();
    check_e2fsck(scratch, fault);

    // The kernel's recovery, on a copy of what the cut left.
    if kernel {
        kernel_recovers(scratch, &left, &promised, fault);
    }
    Some(promised.len())
}

#[test]
fn power_cuts_with_files_held_open() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let kernel = oracle::require_loop();
    let cuts: usize =
        std::env::var("UEXT4_CRASH_OPEN_CUTS").ok().and_then(|v| v.parse().ok()).unwrap_or(OPEN_CUTS_DEFAULT);
    let work = tempfile::tempdir().unwrap();
    for features in ["^orphan_file", "orphan_file"] {
        let image = work.path().join("base.img");
        std::fs::write(&image, vec![0u8; 32 << 20]).unwrap();
        oracle::run(
            std::process::Command::new("mkfs.ext4")
                .args(["-F", "-q", "-b", "4096", "-N", "1024", "-O", features])
                .arg(&image),
        );
        let base = std::fs::read(&image).unwrap();

        // The reference run counts the writes; the cuts are spread over them.
        let mem = Arc::new(MemDevice::new(base.clone()));
        let recorder = Arc::new(Recorder { inner: mem.clone(), sizes: Mutex::new(Vec::new()) });
        let fs = Filesystem::open_device(recorder.clone(), options()).unwrap();
        let count = || recorder.sizes.lock().unwrap().len() as u64;
        let model = run_open_workload(&fs, &count, &|| false);
        let orphans_left = model.held.keys().filter(|&&i| !model.is_linked(i)).count();
        drop(fs);
        let total = recorder.sizes.lock().unwrap().len() as u64;
        // The run ends holding unlinked files: the next writable open frees them.
        let reopened = Arc::new(MemDevice::new(mem.contents()));
        drop(Filesystem::open_device(reopened.clone(), options()).unwrap());
        std::fs::write(&image, reopened.contents()).unwrap();
        oracle::assert_e2fsck_clean(&image);
        eprintln!(
            "open-files workload ({features}): {OPEN_OPS} operations, {} fsyncs, {} files held open at the end ({orphans_left} unlinked), {total} writes",
            model.synced.len(),
            model.held.len(),
        );
        assert!(orphans_left > 0, "the workload should end holding unlinked files");

        let mut faults: Vec<Fault> =
            (0..cuts as u64).map(|i| Fault::DropAfter(1 + i * (total - 2) / cuts as u64)).collect();
        faults.dedup();
        let next = AtomicUsize::new(0);
        let (promised, early) = (AtomicU64::new(0), AtomicUsize::new(0));
        std::thread::scope(|s| {
            for t in 0..2 {
                let (faults, base, next, promised, early) = (&faults, &base, &next, &promised, &early);
                let scratch = work.path().join(format!("open{t}.img"));
                s.spawn(move || loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&fault) = faults.get(i) else { break };
                    match open_files_cut(base, fault, &scratch, kernel) {
                        Some(n) => promised.fetch_add(n as u64, Ordering::Relaxed),
                        None => early.fetch_add(1, Ordering::Relaxed) as u64,
                    };
                });
            }
        });
        let (promised, early) = (promised.into_inner(), early.into_inner());
        assert!(early <= faults.len() / 20, "{early} of {} runs ended before their cut", faults.len());
        eprintln!(
            "open-files cuts ({features}): {} power cuts, each recovered by uext4{}; {promised} fsync'd files verified",
            faults.len(),
            if kernel { " and by the kernel" } else { "" }
        );
        assert!(promised >= faults.len() as u64, "too few fsync'd files were checked to mean anything");
    }
}

// --- I/O errors in the middle of operations -------------------------------------
//
// The same workload runs on a device that fails one request: the N-th write or
// the N-th read answers EIO, everything else works. Whatever the operation was
// doing, it must commit whole or not at all: afterwards the filesystem is in its
// error state (the journal aborted; nothing half-done commits) or the operation
// failed cleanly and the filesystem goes on and closes normally. The image left
// behind is recovered by uext4 (and, on a copy, every 25th by the kernel); e2fsck
// -fn must be silent and every fsync'd file intact. UEXT4_CRASH_IO_ERRORS sets
// how many faults (500 by default: every read the run makes, the rest on writes).

const IO_ERRORS: usize = 500;

/// A 1 MiB cache, so that metadata is evicted and read again: reads to fail.
fn io_options() -> Options {
    // remount-ro, so that every error the phase records (a failed metadata read
    // as well as an abort) leaves the state it checks: writes refused.
    Options { cache_mb: 1, errors: Some(uext4::Errors::RemountRo), ..options() }
}

/// The workload of the I/O phase: after every operation the clean cached
/// blocks are dropped, so the next operation reads its metadata from the
/// device (bitmaps, inode tables, directory and tree blocks), and read faults
/// land in the middle of operations as often as write faults do.
fn run_io_workload(fs: &Filesystem, writes: &dyn Fn() -> u64, is_cut: &dyn Fn() -> bool) -> Model {
    run_workload_with(
        fs,
        writes,
        is_cut,
        &|| {
            fs.drop_caches();
        },
        true,
    )
}

fn io_error_and_recover(base: &[u8], fault: Fault, scratch: &Path, kernel_too: bool) -> (usize, bool, bool) {
    let mem = Arc::new(MemDevice::new(base.to_vec()));
    let dev = Arc::new(FaultDevice::new(mem.clone(), fault));
    let fs = match Filesystem::open_device(dev.clone(), io_options()) {
        Ok(fs) => fs,
        // A read failing during the open refuses it: nothing was changed.
        Err(e) if dev.is_cut() => {
            assert_eq!(e.errno(), 5, "{fault:?}: open failed with {e}");
            return (0, false, false);
        }
        Err(e) => panic!("{fault:?}: open failed without the fault: {e}"),
    };
    let model = run_io_workload(&fs, &|| dev.writes(), &|| dev.is_cut());
    if !dev.is_cut() {
        let _ = fs.sync();
    }
    if !dev.is_cut() {
        return (0, false, true);
    }
    // A failed commit may put the filesystem in its error state a moment after
    // the operation returned (the journal thread writes): sync settles it.
    let synced = if fs.has_failed() { None } else { Some(fs.sync()) };
    let failed = fs.has_failed();
    if failed {
        assert!(fs.is_read_only(), "{fault:?}: the error state refuses writes");
        assert_eq!(fs.create(ROOT_INO, b"after", 0o644, ROOT).unwrap_err().errno(), 30, "{fault:?}: EROFS");
    } else if let Some(Err(e)) = synced {
        // The failure was clean: the filesystem goes on and closes normally. A
        // small file's new data that waited for the commit (cache/write_behind.rs)
        // and was refused is this sync's EIO, once, as the kernel's syncfs
        // reports a failed write-back; the next sync succeeds.
        assert!(e.to_string().contains("refused file data"), "{fault:?}: sync after a clean failure: {e}");
        fs.sync().unwrap_or_else(|e| panic!("{fault:?}: a second sync after a refused data write: {e}"));
    }
    drop(fs);
    let left = mem.contents();
    let promised = model.promised(first_lost(fault));
    if kernel_too {
        kernel_recovers(&scratch.with_extension("kernel.img"), &left, &promised, fault);
    }
    let reopened = Arc::new(MemDevice::new(left));
    let fs = Filesystem::open_device(reopened.clone(), options())
        .unwrap_or_else(|e| panic!("{fault:?}: reopening after the I/O error failed: {e}"));
    for (path, content) in &promised {
        let ino = fs
            .lookup_path(path.as_bytes())
            .unwrap_or_else(|e| panic!("{fault:?}: {path}, fsync'd before the error, is gone: {e}"));
        let got = fs.read_all(ino).unwrap();
        assert!(got == *content, "{fault:?}: {path} holds {} bytes, not {}", got.len(), content.len());
    }
    drop(fs);
    std::fs::write(scratch, reopened.contents()).unwrap();
    check_e2fsck(scratch, fault);
    (promised.len(), failed, false)
}

#[test]
fn io_errors_in_the_middle_of_operations() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("base.img");
    std::fs::write(&image, vec![0u8; 32 << 20]).unwrap();
    oracle::run(std::process::Command::new("mkfs.ext4").args(["-F", "-q", "-b", "4096", "-N", "1024"]).arg(&image));
    let base = std::fs::read(&image).unwrap();

    // The reference run: how many reads and writes the open and the workload make.
    let dev = Arc::new(FaultDevice::new(Arc::new(MemDevice::new(base.clone())), Fault::None));
    let fs = Filesystem::open_device(dev.clone(), io_options()).unwrap();
    let (reads_open, writes_open) = (dev.reads(), dev.writes());
    let model = run_io_workload(&fs, &|| dev.writes(), &|| false);
    fs.sync().unwrap();
    let (reads, writes) = (dev.reads(), dev.writes());
    // keep-size preallocation, punch, zero range, collapse, insert, unlink while open
    eprintln!("extended operations in the reference run: {:?}", model.extended_done);
    assert!(model.extended_done.iter().all(|&n| n >= 3), "{:?}", model.extended_done);
    drop(fs);
    let total: usize = std::env::var("UEXT4_CRASH_IO_ERRORS").ok().and_then(|v| v.parse().ok()).unwrap_or(IO_ERRORS);
    let spread = |from: u64, to: u64, n: usize| -> Vec<u64> {
        let mut v: Vec<u64> = (0..n as u64).map(|i| from + i * (to - from) / n as u64).collect();
        v.dedup();
        v
    };
    // Half the faults on reads (those of the open too), the rest on writes.
    let mut faults: Vec<Fault> =
        spread(1, reads + 1, (total / 2).min(reads as usize)).into_iter().map(Fault::FailRead).collect();
    let on_writes = total - faults.len();
    faults.extend(spread(writes_open + 1, writes, on_writes).into_iter().map(Fault::FailWrite));
    eprintln!("reference run: {reads} reads ({reads_open} at open), {writes} writes ({writes_open} at open)");

    let next = AtomicUsize::new(0);
    let (promised, errored, early) = (AtomicU64::new(0), AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|s| {
        for t in 0..2 {
            let (faults, base, next, promised, errored, early) = (&faults, &base, &next, &promised, &errored, &early);
            let scratch = work.path().join(format!("io{t}.img"));
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&fault) = faults.get(i) else { break };
                let (p, failed, ended_early) = io_error_and_recover(base, fault, &scratch, kernel_cut(i, 25));
                promised.fetch_add(p as u64, Ordering::Relaxed);
                errored.fetch_add(failed as usize, Ordering::Relaxed);
                early.fetch_add(ended_early as usize, Ordering::Relaxed);
            });
        }
    });
    let (promised, errored, early) = (promised.into_inner(), errored.into_inner(), early.into_inner());
    let on_reads = faults.iter().filter(|f| matches!(f, Fault::FailRead(_))).count();
    eprintln!(
        "{} injected I/O errors ({on_reads} on reads): {errored} put the filesystem in its error state, the rest \
         failed cleanly; {promised} fsync'd files verified; {early} runs ended before their fault",
        faults.len()
    );
    // The workload makes 90 to 210 read requests (inode-table walks read 32
    // blocks in one; how many depends on when commits and checkpoints fall
    // between its cache drops), and each gets a fault of its own. Fewer than 50
    // would mean it no longer reads its metadata from the device.
    assert!(on_reads >= 50, "only {on_reads} faults fall on reads");
    assert!(faults.len() >= total * 9 / 10, "only {} distinct faults", faults.len());
    assert!(early <= faults.len() / 20, "{early} runs ended before their fault");
    assert!(errored > 0, "no fault reached the error state: the phase tests nothing");
}

// ---------------------------------------------------------------------------
// Phase (issue 15): ext3, and an ext3 upgraded with `tune2fs -O extent`. The
// first EXT3_PREFILL_OPS operations of the workload run uncut on a fresh
// mkfs.ext3 image (block-mapped files, directories and symlinks, written by
// uext4 through the ext3 journal); for the upgraded image `tune2fs -O extent`
// then runs, so the rest of the workload changes old block-mapped files beside
// new extent-mapped ones. The rest of the workload is then cut: power cuts spread
// evenly and torn writes. After each cut, uext4's recovery (and on every 10th
// cut, on a copy, the kernel's: loop mount, promised files read, umount) must
// leave e2fsck -fn silent and every promised file intact: those fsync'd before
// the cut, and every file the prefill left that no later operation touched.
//
// UEXT4_CRASH_EXT3_CUTS=N sets the power cuts per image (default 60).

const EXT3_PREFILL_OPS: usize = 300;
const EXT3_OPS: usize = 900;
const EXT3_CUTS_DEFAULT: usize = 60;

/// The base image after the prefill, the model and generator as the prefill left
/// them, and every file the prefill left promised as of the image.
fn ext3_base(work: &Path, upgrade: bool) -> (Vec<u8>, Model, Rng) {
    let image = work.join(if upgrade { "ext3-upgraded.img" } else { "ext3.img" });
    std::fs::write(&image, vec![0u8; 32 << 20]).unwrap();
    oracle::run(std::process::Command::new("mkfs.ext3").args(["-F", "-q", "-b", "4096", "-N", "1024"]).arg(&image));
    let mem = Arc::new(MemDevice::new(std::fs::read(&image).unwrap()));
    let fs = Filesystem::open_device(mem.clone(), options()).unwrap();
    let mut rng = Rng(0x5eed_e3e3_0000_0001 ^ upgrade as u64);
    let mut m = Model::default();
    m.dir_paths.insert(ROOT_INO, String::new());
    for op in 0..EXT3_PREFILL_OPS {
        one_op(&fs, &mut m, &mut rng, op, &|| 0).unwrap_or_else(|e| panic!("ext3 prefill operation {op}: {e}"));
    }
    fs.sync().unwrap();
    drop(fs);
    std::fs::write(&image, mem.contents()).unwrap();
    oracle::assert_e2fsck_clean(&image);
    let stat = oracle::run(std::process::Command::new("debugfs").arg("-R").arg("stat <2>").arg(&image));
    assert!(!stat.contains("EXTENTS"), "the ext3 prefill made extent-mapped directories:\n{stat}");
    if upgrade {
        oracle::upgrade_to_extents(&image);
        oracle::assert_e2fsck_clean(&image);
    }
    // Everything the prefill left is on the image: promised until touched again.
    m.synced.clear();
    let files: Vec<(String, u32)> =
        m.entries.iter().filter(|(_, e)| e.kind == Kind::File).map(|(p, e)| (p.clone(), e.ino)).collect();
    for (path, ino) in files {
        let content = m.contents[&ino].clone();
        m.synced.insert(path, Synced { op: EXT3_PREFILL_OPS, ino, content, writes_at_return: 0 });
    }
    (std::fs::read(&image).unwrap(), m, rng)
}

/// The rest of the workload on `base`, from the prefill's model, until it ends or
/// the device is cut.
fn ext3_rest(fs: &Filesystem, m: &mut Model, rng: &mut Rng, writes: &dyn Fn() -> u64, is_cut: &dyn Fn() -> bool) {
    for op in EXT3_PREFILL_OPS..EXT3_OPS {
        let result = one_op(fs, m, rng, op, writes);
        if is_cut() {
            return;
        }
        if let Err(e) = result {
            panic!("operation {op} failed before any write was lost: {e}");
        }
    }
}

/// One cut of the ext3 phase; returns the promised files checked, or None when
/// the run ended before its cut.
fn ext3_cut(base: &[u8], m0: &Model, rng0: &Rng, fault: Fault, scratch: &Path, kernel: bool) -> Option<usize> {
    let mem = Arc::new(MemDevice::new(base.to_vec()));
    let dev = Arc::new(FaultDevice::new(mem.clone(), fault));
    let fs = Filesystem::open_device(dev.clone(), options()).unwrap();
    let (mut m, mut rng) = (m0.clone(), rng0.clone());
    ext3_rest(&fs, &mut m, &mut rng, &|| dev.writes(), &|| dev.is_cut());
    if !dev.is_cut() {
        fs.sync().unwrap();
    }
    if !dev.is_cut() {
        drop(fs);
        return None;
    }
    fs.abandon();
    let left = mem.contents();
    let promised = m.promised(first_lost(fault));
    let ours = Arc::new(MemDevice::new(left.clone()));
    let fs = Filesystem::open_device(ours.clone(), options())
        .unwrap_or_else(|e| panic!("{fault:?}: reopening the ext3 image after the cut failed: {e}"));
    for (path, content) in &promised {
        let ino = fs.lookup_path(path.as_bytes()).unwrap_or_else(|e| panic!("{fault:?}: {path} is gone: {e}"));
        assert!(fs.read_all(ino).unwrap() == *content, "{fault:?}: uext4 reads {path} changed after recovery");
    }
    drop(fs);
    std::fs::write(scratch, ours.contents()).unwrap();
    check_e2fsck(scratch, fault);
    if kernel {
        kernel_recovers(scratch, &left, &promised, fault);
    }
    Some(promised.len())
}

fn ext3_phase(upgrade: bool) {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (base, m0, rng0) = ext3_base(work.path(), upgrade);
    // The reference run: its writes, and how big.
    let mem = Arc::new(MemDevice::new(base.clone()));
    let recorder = Arc::new(Recorder { inner: mem.clone(), sizes: Mutex::new(Vec::new()) });
    let fs = Filesystem::open_device(recorder.clone(), options()).unwrap();
    let (mut m, mut rng) = (m0.clone(), rng0.clone());
    let count = || recorder.sizes.lock().unwrap().len() as u64;
    ext3_rest(&fs, &mut m, &mut rng, &count, &|| false);
    drop(fs);
    let reference = work.path().join("reference.img");
    std::fs::write(&reference, mem.contents()).unwrap();
    oracle::assert_e2fsck_clean(&reference);
    let sizes = recorder.sizes.lock().unwrap().clone();
    let total = sizes.len() as u64;
    let cuts = std::env::var("UEXT4_CRASH_EXT3_CUTS").ok().and_then(|v| v.parse().ok()).unwrap_or(EXT3_CUTS_DEFAULT);
    let mut faults: Vec<Fault> = (0..cuts as u64).map(|i| Fault::DropAfter(i * (total - 1) / cuts as u64)).collect();
    faults.dedup();
    let multi: Vec<u64> = (1..=total).filter(|&n| sizes[n as usize - 1] > ATOMIC_UNIT).collect();
    let mut tear_rng = Rng(7);
    for &n in multi.iter().step_by(multi.len().div_ceil(cuts / 4 + 1).max(1)) {
        let units = sizes[n as usize - 1].div_ceil(ATOMIC_UNIT);
        faults.push(Fault::Tear { write: n, keep: (1 + tear_rng.below(units - 1)) * ATOMIC_UNIT });
    }
    let next = AtomicUsize::new(0);
    let (promised, early) = (AtomicU64::new(0), AtomicUsize::new(0));
    std::thread::scope(|s| {
        for t in 0..2 {
            let (faults, base, m0, rng0, next, promised, early) =
                (&faults, &base, &m0, &rng0, &next, &promised, &early);
            let scratch = work.path().join(format!("cut{t}.img"));
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&fault) = faults.get(i) else { break };
                match ext3_cut(base, m0, rng0, fault, &scratch, kernel_cut(i, 10)) {
                    Some(n) => promised.fetch_add(n as u64, Ordering::Relaxed),
                    None => early.fetch_add(1, Ordering::Relaxed) as u64,
                };
            });
        }
    });
    let (promised, early) = (promised.into_inner(), early.into_inner());
    let what = if upgrade { "upgraded ext3" } else { "ext3" };
    eprintln!(
        "{what}: {} cuts over {total} writes after a {EXT3_PREFILL_OPS}-operation prefill: {promised} promised files \
         verified, {early} runs ended before their cut",
        faults.len()
    );
    assert!(early <= faults.len() / 10, "{early} of {} runs ended before their cut", faults.len());
    assert!(promised >= faults.len() as u64, "too few promised files were checked to mean anything");
}

#[test]
fn power_cuts_on_ext3() {
    ext3_phase(false);
}

#[test]
fn power_cuts_on_an_ext3_upgraded_with_tune2fs() {
    ext3_phase(true);
}

// ---------------------------------------------------------------------------
// Phase: shapes that change shape. The kernel makes the base image (inline_data):
// small files and directories stored in their inodes, files whose identical
// xattrs the kernel puts in one shared xattr block (refcount above 1), and a
// directory a few bursts of creates away from turning into an htree. uext4 then
// runs the workload on it, with bursts of creates in that directory (linear to
// htree, then leaf splits) and changes of the shared xattrs (each copied before
// it changes) beside the ordinary operations (appends move inline files to
// extents; creates in inline directories move them to blocks). Power cuts and
// torn writes are spread over its writes; after each, uext4's recovery (and on
// every 8th cut, on a copy, the kernel's) must leave e2fsck -fn silent and every
// promised file intact: those fsync'd before the cut, and every file of the base
// that no later operation touched.
//
// UEXT4_CRASH_SHAPES_CUTS=N sets the power cuts (default 400).

const SHAPES_OPS: usize = 700;
const SHAPES_CUTS_DEFAULT: usize = 400;
const BIG_DIR_BASE: usize = 90;
const SHARED_XATTR_FILES: usize = 10;

/// A name of 24 bytes: about 150 fit a 4 KiB directory block.
fn big_name(i: usize) -> String {
    format!("entry-of-big-dir-{i:07}")
}

/// The kernel's base image, and the model of what it holds (every file promised).
fn shapes_base(work: &Path) -> (Vec<u8>, Model) {
    let image = work.join("shapes.img");
    std::fs::write(&image, vec![0u8; 48 << 20]).unwrap();
    oracle::run(
        std::process::Command::new("mkfs.ext4")
            .args(["-F", "-q", "-b", "4096", "-I", "256", "-N", "4096", "-O", "inline_data"])
            .arg(&image),
    );
    {
        let m = oracle::Mount::new(&image, "");
        let root = &m.dir;
        std::fs::create_dir(root.join("inl")).unwrap();
        for i in 0..40usize {
            // 10 to 166 bytes: in i_block alone, or spilling into system.data.
            let body: Vec<u8> = (0..10 + i * 4).map(|k| (k * 7 + i) as u8).collect();
            std::fs::write(root.join(format!("inl/i{i}")), body).unwrap();
        }
        for d in 0..10 {
            let dir = root.join(format!("idir{d}"));
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join("a"), format!("small {d}")).unwrap();
        }
        std::fs::create_dir(root.join("xa")).unwrap();
        for i in 0..SHARED_XATTR_FILES {
            let f = root.join(format!("xa/x{i}"));
            std::fs::write(&f, format!("shared xattrs {i}")).unwrap();
            for (name, fill) in [("user.a", "A"), ("user.b", "B")] {
                oracle::run(
                    std::process::Command::new("setfattr").args(["-n", name, "-v", &fill.repeat(1500)]).arg(&f),
                );
            }
        }
        std::fs::create_dir(root.join("big")).unwrap();
        for i in 0..BIG_DIR_BASE {
            std::fs::write(root.join("big").join(big_name(i)), b"").unwrap();
        }
        m.unmount();
    }
    oracle::assert_e2fsck_clean(&image);
    // The kernel shared one xattr block among the files (mbcache).
    let x0 = oracle::run(std::process::Command::new("debugfs").args(["-R", "stat /xa/x0"]).arg(&image));
    let x1 = oracle::run(std::process::Command::new("debugfs").args(["-R", "stat /xa/x1"]).arg(&image));
    let acl = |s: &str| s.lines().find(|l| l.contains("File ACL:")).map(str::to_string);
    assert!(acl(&x0).is_some() && acl(&x0) == acl(&x1), "the kernel did not share the xattr block:\n{x0}\n{x1}");

    // The model of the base, read through uext4; every file promised as of the image.
    let base = std::fs::read(&image).unwrap();
    let fs = Filesystem::open_device(Arc::new(MemDevice::new(base.clone())), Options::default()).unwrap();
    let mut m = Model::default();
    m.dir_paths.insert(ROOT_INO, String::new());
    let mut dirs = vec![ROOT_INO];
    while let Some(dir) = dirs.pop() {
        for e in fs.read_dir(dir).unwrap() {
            if e.name == b"." || e.name == b".." || e.name == b"lost+found" {
                continue;
            }
            let name = String::from_utf8(e.name.clone()).unwrap();
            let path = m.path_in(dir, &name);
            let st = fs.stat(e.ino).unwrap();
            let kind = if st.file_type == uext4::FileType::Directory { Kind::Dir } else { Kind::File };
            m.add(path.clone(), Entry { parent: dir, name, kind, ino: e.ino });
            if kind == Kind::Dir {
                dirs.push(e.ino);
            } else {
                let content = fs.read_all(e.ino).unwrap();
                m.set_content(e.ino, content.clone());
                m.synced.insert(path, Synced { op: 0, ino: e.ino, content, writes_at_return: 0 });
            }
        }
    }
    (base, m)
}

/// One operation of the shapes workload: a burst of creates in /big, a change
/// of a shared xattr, or one of the ordinary workload's.
fn shapes_op(fs: &Filesystem, m: &mut Model, rng: &mut Rng, op: usize, writes: &dyn Fn() -> u64) -> uext4::Result<()> {
    match rng.below(100) {
        0..=14 => {
            let big = m.entries["/big"].ino;
            for _ in 0..20 {
                m.next_name += 1;
                let name = big_name(100_000 + m.next_name as usize);
                let path = m.path_in(big, &name);
                let ino = fs.create(big, name.as_bytes(), 0o644, ROOT)?.ino;
                m.touch(op, &path, Some(ino));
                m.add(path, Entry { parent: big, name, kind: Kind::File, ino });
                m.set_content(ino, Vec::new());
            }
        }
        15..=22 => {
            let i = rng.below(SHARED_XATTR_FILES);
            let Some(e) = m.entries.get(&format!("/xa/x{i}")).cloned() else { return Ok(()) };
            match rng.below(3) {
                // Removed already: the library says NotFound (the mount, ENODATA).
                0 => match fs.remove_xattr(e.ino, b"user.b") {
                    Err(uext4::Error::NotFound(_)) => {}
                    other => other?,
                },
                _ => {
                    let len = 200 + rng.below(1500);
                    fs.set_xattr(e.ino, b"user.a", &rng.bytes(len), 0)?
                }
            }
        }
        // Inline churn (issue 19): uext4's own inline files and directories.
        23..=34 => match rng.below(4) {
            // A new small file in /inl, written inline, then grown past the
            // capacity (128 bytes) or cut back.
            0 => {
                let inl = m.entries["/inl"].ino;
                let name = m.new_name("c");
                let path = m.path_in(inl, &name);
                let ino = fs.create(inl, name.as_bytes(), 0o644, ROOT)?.ino;
                m.touch(op, &path, Some(ino));
                m.add(path.clone(), Entry { parent: inl, name, kind: Kind::File, ino });
                m.set_content(ino, Vec::new());
                let len = 1 + rng.below(128);
                let mut content = rng.bytes(len);
                fs.write(ino, 0, &content)?;
                m.set_content(ino, content.clone());
                match rng.below(3) {
                    0 => {
                        let len = 1 + rng.below(300);
                        let more = rng.bytes(len);
                        fs.write(ino, content.len() as u64, &more)?;
                        content.extend_from_slice(&more);
                    }
                    1 => {
                        let size = rng.below(content.len() + 1);
                        fs.setattr(ino, &SetAttr { size: Some(size as u64), ..SetAttr::default() })?;
                        content.truncate(size);
                    }
                    _ => {}
                }
                m.set_content(ino, content);
            }
            // A new directory at the root with 0 to 14 names: inline, grown into
            // system.data, or moved to a block.
            1 if m.dir_paths.len() < 40 => {
                let name = m.new_name("cd");
                let path = m.path_in(ROOT_INO, &name);
                let dir = fs.mkdir(ROOT_INO, name.as_bytes(), 0o755, ROOT)?.ino;
                m.touch(op, &path, Some(dir));
                m.add(path, Entry { parent: ROOT_INO, name, kind: Kind::Dir, ino: dir });
                for _ in 0..rng.below(15) {
                    let name = m.new_name("e");
                    let path = m.path_in(dir, &name);
                    let ino = fs.create(dir, name.as_bytes(), 0o644, ROOT)?.ino;
                    m.touch(op, &path, Some(ino));
                    m.add(path, Entry { parent: dir, name, kind: Kind::File, ino });
                    m.set_content(ino, Vec::new());
                }
            }
            // Names join one of the kernel's inline directories, which fills up
            // and moves to a block.
            2 => {
                let Some(d) = m.entries.get(&format!("/idir{}", rng.below(10))).cloned() else { return Ok(()) };
                for _ in 0..6 {
                    let name = m.new_name("j");
                    let path = m.path_in(d.ino, &name);
                    let ino = fs.create(d.ino, name.as_bytes(), 0o644, ROOT)?.ino;
                    m.touch(op, &path, Some(ino));
                    m.add(path, Entry { parent: d.ino, name, kind: Kind::File, ino });
                    m.set_content(ino, Vec::new());
                }
            }
            // Names leave a churn directory (inline or block), which may empty.
            _ => {
                let victims: Vec<(String, Entry)> = m
                    .entries
                    .iter()
                    .filter(|(p, e)| p.starts_with("/cd") && p.matches('/').count() == 2 && e.kind == Kind::File)
                    .take(3)
                    .map(|(p, e)| (p.clone(), e.clone()))
                    .collect();
                for (path, e) in victims {
                    m.touch(op, &path, Some(e.ino));
                    fs.unlink(e.parent, e.name.as_bytes())?;
                    m.remove(&path);
                }
            }
        },
        _ => one_op(fs, m, rng, op, writes)?,
    }
    Ok(())
}

fn run_shapes(fs: &Filesystem, m: &mut Model, writes: &dyn Fn() -> u64, is_cut: &dyn Fn() -> bool) {
    let mut rng = Rng(0x0bad_5eed_1234_5678);
    for op in 1..=SHAPES_OPS {
        let result = shapes_op(fs, m, &mut rng, op, writes);
        if is_cut() {
            return;
        }
        if let Err(e) = result {
            panic!("shapes operation {op} failed before any write was lost: {e}");
        }
    }
}

/// One cut of the shapes phase; the promised files checked, or None when the
/// run ended before its cut.
fn shapes_cut(base: &[u8], m0: &Model, fault: Fault, scratch: &Path, kernel: bool) -> Option<usize> {
    let mem = Arc::new(MemDevice::new(base.to_vec()));
    let dev = Arc::new(FaultDevice::new(mem.clone(), fault));
    let fs = Filesystem::open_device(dev.clone(), options()).unwrap();
    let mut m = m0.clone();
    run_shapes(&fs, &mut m, &|| dev.writes(), &|| dev.is_cut());
    if !dev.is_cut() {
        fs.sync().unwrap();
    }
    if !dev.is_cut() {
        drop(fs);
        return None;
    }
    fs.abandon();
    let left = mem.contents();
    let promised = m.promised(first_lost(fault));
    let ours = Arc::new(MemDevice::new(left.clone()));
    let fs = Filesystem::open_device(ours.clone(), options())
        .unwrap_or_else(|e| panic!("{fault:?}: reopening the shapes image after the cut failed: {e}"));
    for (path, content) in &promised {
        let ino = fs.lookup_path(path.as_bytes()).unwrap_or_else(|e| panic!("{fault:?}: {path} is gone: {e}"));
        assert!(fs.read_all(ino).unwrap() == *content, "{fault:?}: uext4 reads {path} changed after recovery");
    }
    drop(fs);
    std::fs::write(scratch, ours.contents()).unwrap();
    check_e2fsck(scratch, fault);
    if kernel {
        kernel_recovers(scratch, &left, &promised, fault);
    }
    Some(promised.len())
}

#[test]
fn power_cuts_while_inline_data_xattr_blocks_and_directories_change_shape() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (base, m0) = shapes_base(work.path());
    // The reference run: its writes, and what the workload made of the shapes.
    let mem = Arc::new(MemDevice::new(base.clone()));
    let recorder = Arc::new(Recorder { inner: mem.clone(), sizes: Mutex::new(Vec::new()) });
    let fs = Filesystem::open_device(recorder.clone(), options()).unwrap();
    let mut m = m0.clone();
    let count = || recorder.sizes.lock().unwrap().len() as u64;
    run_shapes(&fs, &mut m, &count, &|| false);
    drop(fs);
    let reference = work.path().join("reference.img");
    std::fs::write(&reference, mem.contents()).unwrap();
    oracle::assert_e2fsck_clean(&reference);
    let debugfs = |cmd: &str| oracle::run(std::process::Command::new("debugfs").args(["-R", cmd]).arg(&reference));
    assert!(debugfs("htree /big").contains("Number of entries"), "/big never became an htree");
    let inline_left = m0
        .entries
        .iter()
        .filter(|(p, e)| p.starts_with("/inl/") && m.entries.contains_key(*p) && e.kind == Kind::File)
        .filter(|(p, _)| debugfs(&format!("stat {p}")).contains("Size of inline data"))
        .count();
    let moved =
        m0.entries.keys().filter(|p| p.starts_with("/inl/") && m.entries.contains_key(*p)).count() - inline_left;
    assert!(moved > 0, "no inline file moved to blocks");
    let idirs_moved = (0..10).filter(|d| !debugfs(&format!("stat /idir{d}")).contains("Size of inline data")).count();
    assert!(idirs_moved > 0, "no inline directory moved to a block");
    // uext4's own directories: some still inline, some moved to a block.
    let churn: Vec<&String> =
        m.entries.iter().filter(|(p, e)| p.starts_with("/cd") && e.kind == Kind::Dir).map(|(p, _)| p).collect();
    let churn_inline = churn.iter().filter(|p| debugfs(&format!("stat {p}")).contains("Size of inline data")).count();
    assert!(
        0 < churn_inline && churn_inline < churn.len(),
        "{churn_inline} of {} churn directories inline",
        churn.len()
    );
    let small_inline = m
        .entries
        .iter()
        .filter(|(p, _)| p.starts_with("/inl/c"))
        .filter(|(p, _)| debugfs(&format!("stat {p}")).contains("Size of inline data"))
        .count();
    assert!(small_inline > 0, "uext4 made no inline file");
    let acl_blocks: std::collections::BTreeSet<String> = (0..SHARED_XATTR_FILES)
        .filter(|i| m.entries.contains_key(&format!("/xa/x{i}")))
        .filter_map(|i| {
            let stat = debugfs(&format!("stat /xa/x{i}"));
            stat.lines().find(|l| l.contains("File ACL:")).map(str::to_string)
        })
        .collect();
    assert!(acl_blocks.len() > 1, "the shared xattr block was never copied: {acl_blocks:?}");
    let sizes = recorder.sizes.lock().unwrap().clone();
    let total = sizes.len() as u64;
    let cuts =
        std::env::var("UEXT4_CRASH_SHAPES_CUTS").ok().and_then(|v| v.parse().ok()).unwrap_or(SHAPES_CUTS_DEFAULT);
    let mut faults: Vec<Fault> = (0..cuts as u64).map(|i| Fault::DropAfter(i * (total - 1) / cuts as u64)).collect();
    faults.dedup();
    let multi: Vec<u64> = (1..=total).filter(|&n| sizes[n as usize - 1] > ATOMIC_UNIT).collect();
    let mut tear_rng = Rng(11);
    for &n in multi.iter().step_by(multi.len().div_ceil(cuts / 4 + 1).max(1)) {
        let units = sizes[n as usize - 1].div_ceil(ATOMIC_UNIT);
        faults.push(Fault::Tear { write: n, keep: (1 + tear_rng.below(units - 1)) * ATOMIC_UNIT });
    }
    let next = AtomicUsize::new(0);
    let (promised, early) = (AtomicU64::new(0), AtomicUsize::new(0));
    std::thread::scope(|s| {
        for t in 0..2 {
            let (faults, base, m0, next, promised, early) = (&faults, &base, &m0, &next, &promised, &early);
            let scratch = work.path().join(format!("cut{t}.img"));
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&fault) = faults.get(i) else { break };
                match shapes_cut(base, m0, fault, &scratch, kernel_cut(i, 8)) {
                    Some(n) => promised.fetch_add(n as u64, Ordering::Relaxed),
                    None => early.fetch_add(1, Ordering::Relaxed) as u64,
                };
            });
        }
    });
    let (promised, early) = (promised.into_inner(), early.into_inner());
    eprintln!(
        "shapes: {} cuts over {total} writes ({moved} inline files and {idirs_moved} inline directories moved to \
         blocks, /big an htree of {} names, the shared xattr block copied into {} blocks): {promised} promised \
         files verified, {early} runs ended before their cut",
        faults.len(),
        m.children[&m.entries["/big"].ino],
        acl_blocks.len()
    );
    assert!(early <= faults.len() / 10, "{early} of {} runs ended before their cut", faults.len());
    assert!(promised >= faults.len() as u64, "too few promised files were checked to mean anything");
}

// remove_tree (issue 18): power cuts inside the removal of a tree of about
// 20,000 entries (an htree directory, ten linear ones, a chain of
// subdirectories, data files, symlinks, a hard link to a file outside). After
// each cut uext4 recovers the image (and, every 10th cut, the kernel a copy of
// it): e2fsck -fn must be silent, every file outside the tree intact, and what
// is left of the tree a part of it (each name left is one of the tree's, of the
// same kind and content); a second remove_tree then finishes it, leaving the
// free block and inode counts of before the tree existed.
//
// UEXT4_CRASH_RMTREE_CUTS=N sets the cuts (default 500, the issue's figure,
// about three and a half minutes on two cores: each cut runs, recovers, walks,
// checks and removes again a 20,000-entry tree): power cuts after each of the
// removal's writes (about 60 with its 4 MiB cache), the rest torn multi-block
// writes, each tear a different point inside one (about 2,900 to choose
// from), so that every cut leaves a different image. e2fsck also judges the
// finished image of every third cut.

const RMTREE_CUTS_DEFAULT: usize = 500;

fn rmtree_options() -> Options {
    // A small cache: the removal commits many transactions, so cuts fall
    // between and inside them.
    Options { cache_mb: 4, ..options() }
}

struct RmtreeBase {
    image: Vec<u8>,
    /// Files outside the tree: path → content.
    outside: Vec<(String, Vec<u8>)>,
    /// The tree: path → content (None for a directory).
    tree: BTreeMap<String, Option<Vec<u8>>>,
    /// Free (blocks, inodes) before the tree existed.
    counts: (u64, u64),
}

fn free_counts_of(image: &[u8]) -> (u64, u64) {
    let fs = Filesystem::open_device(Arc::new(MemDevice::new(image.to_vec())), Options::default()).unwrap();
    (fs.free_blocks(), fs.free_inodes())
}

fn rmtree_base(work: &Path) -> RmtreeBase {
    let file = work.join("rmtree.img");
    std::fs::write(&file, vec![0u8; 64 << 20]).unwrap();
    oracle::run(std::process::Command::new("mkfs.ext4").args(["-F", "-q", "-b", "4096", "-N", "32768"]).arg(&file));
    let mem = Arc::new(MemDevice::new(std::fs::read(&file).unwrap()));
    let mut outside = Vec::new();
    {
        let fs = Filesystem::open_device(mem.clone(), options()).unwrap();
        let keep = fs.mkdir(ROOT_INO, b"keep", 0o755, ROOT).unwrap().ino;
        let mut rng = Rng(0x5eed_0018);
        for i in 0..20 {
            let ino = fs.create(keep, format!("k{i}").as_bytes(), 0o644, ROOT).unwrap().ino;
            let body = rng.bytes(i * 3000);
            fs.write(ino, 0, &body).unwrap();
            outside.push((format!("/keep/k{i}"), body));
        }
        drop(fs);
    }
    let counts = free_counts_of(&mem.contents());
    let mut tree = BTreeMap::new();
    {
        let fs = Filesystem::open_device(mem.clone(), options()).unwrap();
        let mut rng = Rng(0x5eed_1018);
        let t = fs.mkdir(ROOT_INO, b"t", 0o755, ROOT).unwrap().ino;
        tree.insert("/t".to_string(), None);
        let big = fs.mkdir(t, b"big", 0o755, ROOT).unwrap().ino;
        tree.insert("/t/big".to_string(), None);
        // 9,917 here and 10,083 below: a tree of 20,000 names.
        for i in 0..9_917 {
            let name = big_name(i);
            fs.create(big, name.as_bytes(), 0o644, ROOT).unwrap();
            tree.insert(format!("/t/big/{name}"), Some(Vec::new()));
        }
        for d in 0..10 {
            let dir = fs.mkdir(t, format!("d{d}").as_bytes(), 0o755, ROOT).unwrap().ino;
            tree.insert(format!("/t/d{d}"), None);
            for f in 0..1_000 {
                let ino = fs.create(dir, format!("f{f}").as_bytes(), 0o644, ROOT).unwrap().ino;
                let len = 1 + rng.below(3 * 4096);
                let body = if f % 50 == 0 { rng.bytes(len) } else { Vec::new() };
                fs.write(ino, 0, &body).unwrap();
                tree.insert(format!("/t/d{d}/f{f}"), Some(body));
            }
            fs.symlink(dir, b"s", b"f1", ROOT).unwrap();
            tree.insert(format!("/t/d{d}/s"), Some(b"f1".to_vec()));
        }
        let mut dir = t;
        let mut path = "/t".to_string();
        for level in 0..30 {
            dir = fs.mkdir(dir, b"c", 0o755, ROOT).unwrap().ino;
            path += "/c";
            tree.insert(path.clone(), None);
            let ino = fs.create(dir, b"f", 0o644, ROOT).unwrap().ino;
            let body = format!("level {level}").into_bytes();
            fs.write(ino, 0, &body).unwrap();
            tree.insert(format!("{path}/f"), Some(body));
        }
        let k3 = fs.lookup_path(b"/keep/k3").unwrap();
        fs.link(k3, t, b"to-outside").unwrap();
        tree.insert("/t/to-outside".to_string(), Some(outside[3].1.clone()));
        drop(fs);
    }
    assert_eq!(tree.len(), 20_000);
    RmtreeBase { image: mem.contents(), outside, tree, counts }
}

/// The paths left under /t (sorted; empty once /t is gone), as the walk in
/// `rmtree_cut` names them.
fn paths_left(fs: &Filesystem) -> Vec<String> {
    let mut left = Vec::new();
    if let Some(t) = fs.lookup(ROOT_INO, b"t").unwrap() {
        fs.walk(t, &mut |rel, _| {
            left.push(if rel == b"/" { "/t".to_string() } else { format!("/t{}", String::from_utf8_lossy(rel)) });
            Ok(())
        })
        .unwrap();
    }
    left.sort();
    left
}

fn digest_of(paths: &[String]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    paths.hash(&mut h);
    h.finish()
}

/// One cut: remove_tree until the cut, recover, judge, finish. None when the
/// run ended before its cut.
fn rmtree_cut(
    b: &RmtreeBase,
    states: &HashSet<u64>,
    fault: Fault,
    scratch: &Path,
    kernel: bool,
    fsck_after: bool,
) -> Option<usize> {
    let mem = Arc::new(MemDevice::new(b.image.clone()));
    let dev = Arc::new(FaultDevice::new(mem.clone(), fault));
    let fs = Filesystem::open_device(dev.clone(), rmtree_options()).unwrap();
    // The process dies at the cut: nothing after it counts.
    let result = fs.remove_tree_with_progress(ROOT_INO, b"t", &mut |_| match dev.is_cut() {
        true => std::ops::ControlFlow::Break(()),
        false => std::ops::ControlFlow::Continue(()),
    });
    if !dev.is_cut() {
        result.unwrap_or_else(|e| panic!("{fault:?}: remove_tree failed before any write was lost: {e}"));
        fs.sync().unwrap();
    }
    if !dev.is_cut() {
        drop(fs);
        return None;
    }
    fs.abandon();
    let left = mem.contents();
    let ours = Arc::new(MemDevice::new(left.clone()));
    let fs = Filesystem::open_device(ours.clone(), rmtree_options())
        .unwrap_or_else(|e| panic!("{fault:?}: reopening after a cut inside remove_tree failed: {e}"));
    for (path, content) in &b.outside {
        let ino = fs.lookup_path(path.as_bytes()).unwrap_or_else(|e| panic!("{fault:?}: {path} is gone: {e}"));
        assert!(fs.read_all(ino).unwrap() == *content, "{fault:?}: {path} changed");
    }
    let mut left_names = 0;
    if let Some(t) = fs.lookup(ROOT_INO, b"t").unwrap() {
        fs.walk(t, &mut |rel, st| {
            let path = if rel == b"/" { "/t".to_string() } else { format!("/t{}", String::from_utf8_lossy(rel)) };
            let Some(expected) = b.tree.get(&path) else { panic!("{fault:?}: {path} was never in the tree") };
            match expected {
                None => assert_eq!(st.file_type, uext4::FileType::Directory, "{fault:?}: {path}"),
                Some(content) => {
                    let got = if st.file_type == uext4::FileType::Symlink {
                        fs.read_link(st.ino)?
                    } else {
                        fs.read_all(st.ino)?
                    };
                    assert!(got == *content, "{fault:?}: {path} changed");
                }
            }
            left_names += 1;
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{fault:?}: walking what is left of the tree: {e}"));
    }
    // What is left is what the uncut removal left after one of its steps: a
    // prefix of the removal is gone, nothing else.
    let names_left = paths_left(&fs);
    assert!(
        states.contains(&digest_of(&names_left)),
        "{fault:?}: the {} names left are not what the removal left after any of its steps",
        names_left.len()
    );
    drop(fs);
    std::fs::write(scratch, ours.contents()).unwrap();
    check_e2fsck(scratch, fault);
    if kernel {
        kernel_recovers(scratch, &left, &b.outside, fault);
    }
    // Another remove_tree finishes what the cut left.
    let fs = Filesystem::open_device(ours.clone(), rmtree_options()).unwrap();
    match fs.remove_tree(ROOT_INO, b"t") {
        Ok(_) | Err(uext4::Error::NotFound(_)) => {}
        Err(e) => panic!("{fault:?}: the second remove_tree failed: {e}"),
    }
    drop(fs);
    assert_eq!(free_counts_of(&ours.contents()), b.counts, "{fault:?}: free counts not back to before the tree");
    if fsck_after {
        std::fs::write(scratch, ours.contents()).unwrap();
        check_e2fsck(scratch, fault);
    }
    Some(left_names)
}

#[test]
fn power_cuts_inside_remove_tree() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let b = rmtree_base(work.path());
    // The reference run counts the writes.
    let mem = Arc::new(MemDevice::new(b.image.clone()));
    let recorder = Arc::new(Recorder { inner: mem.clone(), sizes: Mutex::new(Vec::new()) });
    let fs = Filesystem::open_device(recorder.clone(), rmtree_options()).unwrap();
    // The names left after every step of the removal (each handle ends one),
    // and before it began.
    let mut states = HashSet::from([digest_of(&paths_left(&fs))]);
    let removed = fs
        .remove_tree_with_progress(ROOT_INO, b"t", &mut |_| {
            states.insert(digest_of(&paths_left(&fs)));
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(removed.names as usize, b.tree.len(), "{removed:?}");
    states.insert(digest_of(&paths_left(&fs)));
    eprintln!("remove_tree: {} distinct states of the tree in the uncut removal", states.len());
    drop(fs);
    assert_eq!(free_counts_of(&mem.contents()), b.counts);
    let sizes = recorder.sizes.lock().unwrap().clone();
    let total = sizes.len() as u64;
    let cuts =
        std::env::var("UEXT4_CRASH_RMTREE_CUTS").ok().and_then(|v| v.parse().ok()).unwrap_or(RMTREE_CUTS_DEFAULT);
    // Every cut a different image: power cuts after distinct writes (at most
    // one per write), and the rest of the cuts asked for as tears, each a
    // different (write, whole units kept) of the writes of more than one unit,
    // spread evenly over all such pairs.
    assert!(total >= 2, "the reference removal made {total} writes: nothing to cut between");
    let drops = ((cuts * 4 / 5).max(1) as u64).min(total - 1);
    let mut faults: Vec<Fault> = (0..drops).map(|i| Fault::DropAfter(1 + i * (total - 1) / drops)).collect();
    faults.dedup();
    let tear_points: Vec<(u64, usize)> = (1..=total)
        .flat_map(|n| (1..sizes[n as usize - 1].div_ceil(ATOMIC_UNIT)).map(move |u| (n, u * ATOMIC_UNIT)))
        .collect();
    let tears = cuts.saturating_sub(faults.len()).min(tear_points.len());
    faults.extend((0..tears).map(|k| {
        let (write, keep) = tear_points[k * tear_points.len() / tears];
        Fault::Tear { write, keep }
    }));
    let next = AtomicUsize::new(0);
    let (left, early) = (AtomicU64::new(0), AtomicUsize::new(0));
    let partial = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..2 {
            let (faults, b, next, left, early, partial, states) =
                (&faults, &b, &next, &left, &early, &partial, &states);
            let scratch = work.path().join(format!("rmtree-cut{t}.img"));
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&fault) = faults.get(i) else { break };
                let kernel = kernel_cut(i, 1);
                match rmtree_cut(b, states, fault, &scratch, kernel, i % 3 == 0) {
                    Some(n) => {
                        left.fetch_add(n as u64, Ordering::Relaxed);
                        if n > 0 && n < b.tree.len() {
                            partial.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    None => {
                        early.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let (left, early, partial) = (left.into_inner(), early.into_inner(), partial.into_inner());
    eprintln!(
        "remove_tree: {} distinct cuts ({drops} power cuts, {tears} tears of {} possible) over {total} writes of \
         removing {} names: {partial} left the tree part-removed ({left} names left in all), {early} runs ended \
         before their cut",
        faults.len(),
        tear_points.len(),
        b.tree.len()
    );
    assert!(faults.len() >= cuts * 9 / 10, "only {} distinct cuts of the {cuts} asked for", faults.len());
    assert!(early <= faults.len() / 10, "{early} of {} runs ended before their cut", faults.len());
    assert!(partial >= faults.len() / 4, "only {partial} cuts fell inside the removal");
}
