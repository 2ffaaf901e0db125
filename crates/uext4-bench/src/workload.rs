//! The workloads. Each is written once against `FsOps`, so every target runs
//! the same operations in the same order; each has a full size and a `--quick`
//! size. A workload is a sequence of timed phases, and between them untimed
//! steps (making the file a phase overwrites, restarting the target so a read
//! phase starts cold).

use crate::ops::{FileOps, FsOps};
use crate::BenchError;
use std::io;
use std::path::Path;

/// What a workload gives the harness while it runs: timed phases and untimed steps.
pub trait Phases {
    /// Runs `body` as the timed phase `name`, counting `ops` operations; the
    /// phase ends when the target has made its work durable (`FsOps::sync`).
    fn timed(
        &mut self,
        name: &str,
        ops: u64,
        body: &mut dyn FnMut(&dyn FsOps) -> io::Result<()>,
    ) -> Result<(), BenchError>;
    /// As `timed`, for a phase whose operations are timed one by one: `body`
    /// returns their latencies and the sample carries the 99th percentile.
    fn timed_latencies(
        &mut self,
        name: &str,
        ops: u64,
        body: &mut dyn FnMut(&dyn FsOps) -> io::Result<Vec<std::time::Duration>>,
    ) -> Result<(), BenchError>;
    /// Runs `body` outside the timing.
    fn untimed(&mut self, body: &mut dyn FnMut(&dyn FsOps) -> io::Result<()>) -> Result<(), BenchError>;
    /// Drops the target's caches (unmount and mount, or close and reopen).
    fn restart(&mut self) -> Result<(), BenchError>;
    /// Sets the target's zero-out length for unwritten extents, in blocks.
    fn set_zeroout(&mut self, blocks: u32) -> Result<(), BenchError>;
    /// The number of threads the next timed phase runs (recorded in its
    /// sample as `threads`; 1 unless said).
    fn threads(&mut self, _threads: u64) {}
    /// Closes the target and opens it again with these tunables for the rest
    /// of the run (`hash_goal=on` for a directory made under it). Ok(false):
    /// the target takes no tunables (the kernel, fuse2fs, uext4's mounts) and
    /// the workload leaves out what needed them.
    fn reopen_with(&mut self, _tunables: &[(&str, &str)]) -> Result<bool, BenchError> {
        Ok(false)
    }
}

/// `UEXT4_BENCH_TINY=1`: the workloads that honour it (seeds 003 and 004's)
/// shrink to a size that runs in seconds, for the CLI's tests; the figures
/// then mean nothing.
pub fn tiny() -> bool {
    std::env::var("UEXT4_BENCH_TINY").as_deref() == Ok("1")
}

pub trait Workload: Sync {
    fn name(&self) -> &'static str;
    fn about(&self) -> &'static str;
    /// The size this run uses, in words.
    fn size(&self, quick: bool) -> String;
    /// Image size in MiB.
    fn image_mb(&self, quick: bool) -> u64 {
        if quick {
            512
        } else {
            4096
        }
    }
    /// mkfs.ext4 arguments beyond the harness's own (`-i` for more inodes).
    fn mkfs_args(&self, _quick: bool) -> Vec<String> {
        Vec::new()
    }
    /// Tunables every uext4 target gets unless it names its own (a cache bound
    /// smaller than what the workload touches).
    fn uext4_defaults(&self, _quick: bool) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Makes input files (a host tree, an archive) under `input`, once per bench run.
    fn prepare(&self, _quick: bool, _input: &Path) -> Result<(), BenchError> {
        Ok(())
    }
    fn run(&self, quick: bool, input: &Path, phases: &mut dyn Phases) -> Result<(), BenchError>;
    /// Mount options the kernel's targets add for this workload.
    fn kernel_mount_options(&self) -> Vec<&'static str> {
        Vec::new()
    }
    /// Files whose extents the harness counts after the run, as debugfs `ex`
    /// lists them (seed 001's measure), by the phase they belong to.
    fn extent_files(&self, _quick: bool) -> Vec<(String, String)> {
        Vec::new()
    }
    /// The phase whose samples carry the image's used bytes after the run
    /// (`Sample::used_bytes`, read with dumpe2fs once the target has let go
    /// of the image), for workloads that measure space.
    fn space_phase(&self) -> Option<&'static str> {
        None
    }
}

pub fn all() -> Vec<&'static dyn Workload> {
    vec![
        &SmallFiles,
        &Tree,
        &SequentialIo,
        &RandomWrites { fsync: false },
        &RandomWrites { fsync: true },
        &Untar,
        &Populate,
        &FsyncFiles,
        &ParallelWriters,
        &FsyncStorm,
        &Crunl,
        &RndRename,
    ]
}

/// Workloads run only by name: too long for `all --quick` (seed 000's
/// experiment creates 300,000 files at its quick size, seed 003's 200,000
/// five times over), or meant for targets of their own (seed 004's, on
/// images with inline_data, against `features=^inline_data` and
/// `inline_data=off`).
pub fn by_name_only() -> Vec<&'static dyn Workload> {
    vec![
        &IReserve { toy: true },
        &IReserve { toy: false },
        &Zeroout,
        &crate::rmtree::RmTree,
        &crate::inline_data::InlineFind(crate::inline_data::TreeShape::SeedHistogram),
        &crate::inline_data::InlineFind(crate::inline_data::TreeShape::AllInline),
        &crate::inline_data::InlinePostmark,
        &crate::inline_data::InlineFsmark,
        &crate::inline_data::InlineSpace,
    ]
}

/// Removes everything below `path` the way `rm -rf` does, in readdir order:
/// each directory's entries as readdir lists them, a directory after its
/// contents. Returns how many names it removed.
pub fn remove_tree(fs: &dyn FsOps, path: &str) -> io::Result<u64> {
    let mut removed = 0;
    for name in fs.read_dir(path)? {
        let child = if path.is_empty() { name } else { format!("{path}/{name}") };
        if fs.is_dir(&child)? {
            removed += remove_tree(fs, &child)?;
            fs.rmdir(&child)?;
        } else {
            fs.unlink(&child)?;
        }
        removed += 1;
    }
    Ok(removed)
}

/// `find PATH` with a stat of every name (readdir order); returns the count.
pub fn walk_tree(fs: &dyn FsOps, path: &str) -> io::Result<u64> {
    let mut seen = 0;
    for name in fs.read_dir(path)? {
        let child = if path.is_empty() { name } else { format!("{path}/{name}") };
        fs.stat(&child)?;
        seen += 1;
        if fs.is_dir(&child)? {
            seen += walk_tree(fs, &child)?;
        }
    }
    Ok(seen)
}

pub fn by_name(name: &str) -> Option<&'static dyn Workload> {
    all().into_iter().chain(by_name_only()).find(|w| w.name() == name)
}

/// Deterministic pseudo-random numbers (xorshift64*), so every target sees the same offsets.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Contents that differ per file and per block, stamped with `tag` every 4 KiB so
/// a read can tell a misplaced block.
pub fn pattern(tag: u64, len: usize) -> Vec<u8> {
    let mut data: Vec<u8> = (0..len).map(|i| (i as u64).wrapping_mul(31).wrapping_add(tag) as u8).collect();
    for (k, block) in data.chunks_mut(4096).enumerate() {
        let stamp = (tag + k as u64).to_le_bytes();
        let n = block.len().min(8);
        block[..n].copy_from_slice(&stamp[..n]);
    }
    data
}

fn write_whole(file: &mut dyn FileOps, data: &[u8]) -> io::Result<()> {
    for (k, chunk) in data.chunks(1 << 20).enumerate() {
        file.write_at((k << 20) as u64, chunk)?;
    }
    Ok(())
}

/// Seed 001's experiment (Zheng Liu's fio job from Ted Ts'o): 4 KiB random
/// writes with an fsync after each into a preallocated file, once per zero-out
/// length (7, 16, 32, 64, 128 and 256 blocks; the kernel's
/// extent_max_zeroout_kb at 4x that), and once into a file written with zeros
/// first (the seed's "flg" row: no unwritten extents at all). Each length gets a
/// file of its own, whose extents the harness counts with debugfs afterwards.
/// Offsets never repeat within a phase, as fio's random map.
struct Zeroout;

/// Seed 001's lengths, in blocks.
const ZEROOUT_LENGTHS: [u32; 6] = [7, 16, 32, 64, 128, 256];

impl Zeroout {
    /// (writes, file size in MiB)
    fn shape(quick: bool) -> (u64, u64) {
        if quick {
            (8192, 256)
        } else {
            (32768, 1024)
        }
    }

    /// Phase names with their zero-out length (None: the zero-filled file).
    fn phases() -> Vec<(String, Option<u32>)> {
        let mut out: Vec<(String, Option<u32>)> =
            ZEROOUT_LENGTHS.iter().map(|&n| (format!("len={n}"), Some(n))).collect();
        out.push(("flg".into(), None));
        out
    }

    fn file_of(phase: &str) -> String {
        format!("zeroout-{}", phase.replace('=', ""))
    }
}

impl Workload for Zeroout {
    fn name(&self) -> &'static str {
        "zeroout"
    }
    fn about(&self) -> &'static str {
        "seed 001: 4 KiB random writes + fsync each into a preallocated file, per zero-out length \
         (7..256 blocks; the kernel's extent_max_zeroout_kb = 4x) and into a zero-filled file (flg)"
    }
    fn size(&self, quick: bool) -> String {
        let (writes, mib) = Self::shape(quick);
        format!("{writes} writes ({} MiB) into a {mib} MiB file per phase", writes * 4 / 1024)
    }
    fn image_mb(&self, quick: bool) -> u64 {
        let (_, mib) = Self::shape(quick);
        mib * (ZEROOUT_LENGTHS.len() as u64 + 1) + if quick { 512 } else { 2048 }
    }
    /// dioread_lock: since Linux 5.6 ext4 mounts with dioread_nolock, and its
    /// write-back then converts unwritten extents by splitting before the I/O
    /// and marking after it, never zeroing out (13,577 extents at every
    /// extent_max_zeroout_kb in this workload's quick size). The seed's path,
    /// ext4_ext_convert_to_initialized with its zero-out, is the dioread_lock one.
    fn kernel_mount_options(&self) -> Vec<&'static str> {
        vec!["dioread_lock"]
    }
    fn extent_files(&self, _quick: bool) -> Vec<(String, String)> {
        Self::phases().into_iter().map(|(phase, _)| (phase.clone(), Self::file_of(&phase))).collect()
    }
    fn run(&self, quick: bool, _input: &Path, phases: &mut dyn Phases) -> Result<(), BenchError> {
        let (writes, mib) = Self::shape(quick);
        let blocks = mib * 256;
        let block = pattern(1, 4096);
        for (phase, length) in Self::phases() {
            let file = Self::file_of(&phase);
            if let Some(n) = length {
                phases.set_zeroout(n)?;
            }
            phases.untimed(&mut |fs| {
                let mut f = fs.create(&file, 0o644)?;
                match length {
                    // fio's fallocate=1: posix_fallocate, the size grows over the space.
                    Some(_) => f.fallocate(0, mib << 20, false),
                    // dd if=/dev/zero: every block written, nothing left to convert.
                    None => write_whole(f.as_mut(), &vec![0u8; (mib << 20) as usize]),
                }
            })?;
            phases.timed(&phase, writes, &mut |fs| {
                let mut rng = Rng::new(0x001_5eed);
                let mut written = vec![false; blocks as usize];
                let mut f = fs.open(&file)?;
                for _ in 0..writes {
                    let mut b = rng.below(blocks);
                    while written[b as usize] {
                        b = (b + 1) % blocks;
                    }
                    written[b as usize] = true;
                    f.write_at(b * 4096, &block)?;
                    f.fsync()?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }
}

/// Create, stat and unlink N small files in one directory.
struct SmallFiles;

impl SmallFiles {
    fn count(quick: bool) -> u64 {
        if quick {
            4_000
        } else {
            20_000
        }
    }
}

const SMALL_FILE: usize = 1024;

impl Workload for SmallFiles {
    fn name(&self) -> &'static str {
        "smallfiles"
    }
    fn about(&self) -> &'static str {
        "create, stat and unlink many 1 KiB files in one directory (an htree once it grows)"
    }
    fn size(&self, quick: bool) -> String {
        format!("{} files of {} bytes", Self::count(quick), SMALL_FILE)
    }
    fn run(&self, quick: bool, _input: &Path, phases: &mut dyn Phases) -> Result<(), BenchError> {
        let n = Self::count(quick);
        let name = |i: u64| format!("small/file-{i:07}");
        phases.untimed(&mut |fs| fs.mkdir("small", 0o755))?;
        let body = pattern(7, SMALL_FILE);
        phases.timed("create", n, &mut |fs| {
            for i in 0..n {
                fs.create(&name(i), 0o644)?.write_at(0, &body)?;
            }
            Ok(())
        })?;
        phases.restart()?;
        phases.timed("stat", n, &mut |fs| {
            for i in 0..n {
                if fs.stat(&name(i))? != SMALL_FILE as u64 {
                    return Err(io::Error::other(format!("{} has the wrong size", name(i))));
                }
            }
            Ok(())
        })?;
        phases.timed("unlink", n, &mut |fs| (0..n).try_for_each(|i| fs.unlink(&name(i))))
    }
}

/// A two-level directory tree, then files spread over its leaves round-robin.
struct Tree;

impl Tree {
    fn shape(quick: bool) -> (u64, u64) {
        if quick {
            (10, 4_000)
        } else {
            (20, 20_000)
        }
    }
}

impl Workload for Tree {
    fn name(&self) -> &'static str {
        "tree"
    }
    fn about(&self) -> &'static str {
        "mkdir a two-level tree, create 4 KiB files in its leaf directories round-robin, then (cold) rm -rf it"
    }
    fn size(&self, quick: bool) -> String {
        let (fanout, files) = Self::shape(quick);
        format!("{} directories ({fanout} x {fanout} leaves), {files} files of 4 KiB", fanout + fanout * fanout)
    }
    fn run(&self, quick: bool, _input: &Path, phases: &mut dyn Phases) -> Result<(), BenchError> {
        let (fanout, files) = Self::shape(quick);
        phases.timed("mkdir", fanout + fanout * fanout, &mut |fs| {
            for a in 0..fanout {
                fs.mkdir(&format!("d{a:02}"), 0o755)?;
                for b in 0..fanout {
                    fs.mkdir(&format!("d{a:02}/e{b:02}"), 0o755)?;
                }
            }
            Ok(())
        })?;
        let leaves = fanout * fanout;
        phases.timed("files", files, &mut |fs| {
            for i in 0..files {
                let leaf = i % leaves;
                let path = format!("d{:02}/e{:02}/f{i:07}", leaf / fanout, leaf % fanout);
                fs.create(&path, 0o644)?.write_at(0, &pattern(i, 4096))?;
            }
            Ok(())
        })?;
        phases.restart()?;
        let names = fanout + fanout * fanout + files;
        phases.timed("rm -rf", names, &mut |fs| {
            (0..fanout).try_for_each(|a| {
                let top = format!("d{a:02}");
                remove_tree(fs, &top)?;
                fs.rmdir(&top)
            })
        })
    }
}

/// One big file written and read sequentially in 1 MiB requests.
struct SequentialIo;

impl SequentialIo {
    fn mib(quick: bool) -> u64 {
        if quick {
            128
        } else {
            1024
        }
    }
}

impl Workload for SequentialIo {
    fn name(&self) -> &'static str {
        "seqio"
    }
    fn about(&self) -> &'static str {
        "write one file sequentially in 1 MiB requests, then (caches dropped) read it back, then overwrite it in place"
    }
    fn size(&self, quick: bool) -> String {
        format!("{} MiB", Self::mib(quick))
    }
    fn run(&self, quick: bool, _input: &Path, phases: &mut dyn Phases) -> Result<(), BenchError> {
        let chunks = Self::mib(quick);
        let chunk = |k: u64| pattern(k * 256, 1 << 20);
        // The data is made before the timing, so the phase measures the filesystem.
        let first = chunk(0);
        phases.timed("write", chunks, &mut |fs| {
            let mut file = fs.create("big", 0o644)?;
            for k in 0..chunks {
                // Only the 4 KiB stamps differ between chunks; rewrite them in place.
                let mut data = first.clone();
                for (b, block) in data.chunks_mut(4096).enumerate() {
                    block[..8].copy_from_slice(&(k * 256 + b as u64).to_le_bytes());
                }
                file.write_at(k << 20, &data)?;
            }
            file.fsync()
        })?;
        phases.restart()?;
        phases.timed("read", chunks, &mut |fs| {
            let mut file = fs.open("big")?;
            let mut buf = vec![0u8; 1 << 20];
            for k in 0..chunks {
                let mut got = 0;
                while got < buf.len() {
                    let n = file.read_at((k << 20) + got as u64, &mut buf[got..])?;
                    if n == 0 {
                        return Err(io::Error::other("big file ends early"));
                    }
                    got += n;
                }
                if buf[..8] != (k * 256).to_le_bytes() {
                    return Err(io::Error::other(format!("big file: MiB {k} holds the wrong data")));
                }
            }
            Ok(())
        })?;
        // Over blocks already mapped: issue 14's data path maps and writes each
        // 1 MiB request as one run.
        phases.timed("overwrite", chunks, &mut |fs| {
            let mut file = fs.open("big")?;
            for k in 0..chunks {
                file.write_at(k << 20, &first)?;
            }
            file.fsync()
        })
    }
}

/// 4 KiB writes at random aligned offsets of a sparse file, optionally each followed by fsync.
struct RandomWrites {
    fsync: bool,
}

impl RandomWrites {
    fn shape(&self, quick: bool) -> (u64, u64) {
        match (self.fsync, quick) {
            (false, true) => (4_000, 256),
            (false, false) => (20_000, 1024),
            (true, true) => (300, 256),
            (true, false) => (2_000, 1024),
        }
    }
}

impl Workload for RandomWrites {
    fn name(&self) -> &'static str {
        if self.fsync {
            "randwrite-fsync"
        } else {
            "randwrite"
        }
    }
    fn about(&self) -> &'static str {
        if self.fsync {
            "4 KiB writes at random offsets of a sparse file, fsync after each"
        } else {
            "4 KiB writes at random offsets of a sparse file, one sync at the end"
        }
    }
    fn size(&self, quick: bool) -> String {
        let (writes, mib) = self.shape(quick);
        format!("{writes} writes into a {mib} MiB sparse file")
    }
    fn run(&self, quick: bool, _input: &Path, phases: &mut dyn Phases) -> Result<(), BenchError> {
        let (writes, mib) = self.shape(quick);
        let blocks = mib * 256;
        phases.untimed(&mut |fs| fs.create("sparse", 0o644)?.set_len(mib << 20))?;
        let fsync = self.fsync;
        let block = pattern(3, 4096);
        phases.timed("write", writes, &mut |fs| {
            let mut rng = Rng::new(0x5eed);
            let mut file = fs.open("sparse")?;
            for _ in 0..writes {
                file.write_at(rng.below(blocks) * 4096, &block)?;
                if fsync {
                    file.fsync()?;
                }
            }
            Ok(())
        })
    }
}

/// A source-like tree: directories, mostly small files with a long tail, a few
/// symlinks. The same generator feeds the archive and the host tree.
struct SourceTree {
    dirs: u64,
    files: u64,
}

enum SourceEntry {
    Dir(String),
    File(String, usize),
    Symlink(String, String),
}

impl SourceTree {
    fn entries(&self) -> Vec<SourceEntry> {
        let mut rng = Rng::new(0x7a5);
        let mut out = Vec::new();
        let mut dirs = vec![String::from("src")];
        out.push(SourceEntry::Dir("src".into()));
        for d in 1..self.dirs {
            let parent = dirs[rng.below(dirs.len() as u64) as usize].clone();
            let dir = format!("{parent}/dir{d:04}");
            out.push(SourceEntry::Dir(dir.clone()));
            dirs.push(dir);
        }
        for f in 0..self.files {
            let dir = &dirs[rng.below(dirs.len() as u64) as usize];
            if f % 50 == 49 {
                out.push(SourceEntry::Symlink(format!("{dir}/link{f:05}"), "../Makefile".into()));
                continue;
            }
            // Mostly a few KiB, one file in 20 up to 256 KiB: the shape of a source tree.
            let len = if rng.below(20) == 0 { rng.below(256 << 10) } else { 200 + rng.below(12 << 10) };
            out.push(SourceEntry::File(format!("{dir}/file{f:05}.c"), len as usize));
        }
        out
    }
}

const SOURCE_MTIME: i64 = 1_700_000_000;

/// Unpack a tar archive of a source-like tree.
struct Untar;

impl Untar {
    fn tree(quick: bool) -> SourceTree {
        if quick {
            SourceTree { dirs: 120, files: 2_400 }
        } else {
            SourceTree { dirs: 800, files: 12_000 }
        }
    }
}

impl Workload for Untar {
    fn name(&self) -> &'static str {
        "untar"
    }
    fn about(&self) -> &'static str {
        "unpack a tar archive of a source-like tree (files, directories, symlinks, mtimes); then, cold, find with a stat of every name, and rm -rf"
    }
    fn size(&self, quick: bool) -> String {
        let t = Self::tree(quick);
        format!("{} directories, {} files and symlinks", t.dirs, t.files)
    }
    fn prepare(&self, quick: bool, input: &Path) -> Result<(), BenchError> {
        let io_err = |e: io::Error| BenchError(format!("making the source archive: {e}"));
        let file = std::fs::File::create(input.join("source.tar")).map_err(io_err)?;
        let mut archive = tar::Builder::new(io::BufWriter::new(file));
        for (i, entry) in Self::tree(quick).entries().into_iter().enumerate() {
            let mut header = tar::Header::new_ustar();
            header.set_mtime(SOURCE_MTIME as u64);
            match entry {
                SourceEntry::Dir(path) => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(0o755);
                    header.set_size(0);
                    archive.append_data(&mut header, path, io::empty()).map_err(io_err)?;
                }
                SourceEntry::File(path, len) => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(0o644);
                    header.set_size(len as u64);
                    archive.append_data(&mut header, path, &pattern(i as u64, len)[..]).map_err(io_err)?;
                }
                SourceEntry::Symlink(path, target) => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_size(0);
                    archive.append_link(&mut header, path, target).map_err(io_err)?;
                }
            }
        }
        archive.into_inner().and_then(|mut w| io::Write::flush(&mut w)).map_err(io_err)
    }
    fn run(&self, quick: bool, input: &Path, phases: &mut dyn Phases) -> Result<(), BenchError> {
        let count = Self::tree(quick).dirs + Self::tree(quick).files;
        let archive_path = input.join("source.tar");
        phases.timed("untar", count, &mut |fs| {
            let mut archive = tar::Archive::new(io::BufReader::new(std::fs::File::open(&archive_path)?));
            let mut data = Vec::new();
            for entry in archive.entries()? {
                let mut entry = entry?;
                let path = entry.path()?.to_string_lossy().trim_end_matches('/').to_string();
                let mode = entry.header().mode()?;
                match entry.header().entry_type() {
                    tar::EntryType::Directory => fs.mkdir(&path, mode)?,
                    tar::EntryType::Symlink => {
                        let target = entry.link_name()?.unwrap_or_default().to_string_lossy().into_owned();
                        fs.symlink(&target, &path)?;
                        continue;
                    }
                    _ => {
                        data.clear();
                        io::Read::read_to_end(&mut entry, &mut data)?;
                        write_whole(&mut *fs.create(&path, mode)?, &data)?;
                    }
                }
                fs.set_mtime(&path, entry.header().mtime()? as i64)?;
            }
            Ok(())
        })?;
        // Jan Kara's list for seed 000: untar, then find through the tree and its removal.
        phases.restart()?;
        phases.timed("find", count, &mut |fs| walk_tree(fs, "src").map(drop))?;
        phases.restart()?;
        phases.timed("rm -rf", count, &mut |fs| {
            remove_tree(fs, "src")?;
            fs.rmdir("src")
        })
    }
}

/// Copy a host directory tree into the image (the write path's benchmark).
struct Populate;

impl Populate {
    fn tree(quick: bool) -> SourceTree {
        if quick {
            SourceTree { dirs: 100, files: 2_400 }
        } else {
            SourceTree { dirs: 400, files: 20_000 }
        }
    }
}

impl Workload for Populate {
    fn name(&self) -> &'static str {
        "populate"
    }
    fn about(&self) -> &'static str {
        "copy a host directory tree into the image (read host files, mkdir, create, write)"
    }
    fn size(&self, quick: bool) -> String {
        let t = Self::tree(quick);
        format!("{} directories, {} files and symlinks", t.dirs, t.files)
    }
    fn prepare(&self, quick: bool, input: &Path) -> Result<(), BenchError> {
        let io_err = |e: io::Error| BenchError(format!("making the host tree: {e}"));
        let root = input.join("tree");
        for (i, entry) in Self::tree(quick).entries().into_iter().enumerate() {
            match entry {
                SourceEntry::Dir(path) => std::fs::create_dir_all(root.join(path)).map_err(io_err)?,
                SourceEntry::File(path, len) => {
                    std::fs::write(root.join(path), pattern(i as u64, len)).map_err(io_err)?
                }
                SourceEntry::Symlink(path, target) => {
                    std::os::unix::fs::symlink(target, root.join(path)).map_err(io_err)?
                }
            }
        }
        Ok(())
    }
    fn run(&self, quick: bool, input: &Path, phases: &mut dyn Phases) -> Result<(), BenchError> {
        let t = Self::tree(quick);
        let root = input.join("tree");
        phases.timed("copy", t.dirs + t.files, &mut |fs| copy_tree(fs, &root, "src"))
    }
}

fn copy_tree(fs: &dyn FsOps, host: &Path, to: &str) -> io::Result<()> {
    fs.mkdir(to, 0o755)?;
    let mut entries: Vec<_> = std::fs::read_dir(host.join(to))?.collect::<io::Result<_>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = format!("{to}/{}", entry.file_name().to_string_lossy());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(fs, host, &name)?;
        } else if kind.is_symlink() {
            fs.symlink(&std::fs::read_link(entry.path())?.to_string_lossy(), &name)?;
        } else {
            write_whole(&mut *fs.create(&name, 0o644)?, &std::fs::read(entry.path())?)?;
        }
    }
    Ok(())
}

/// fs_mark -S 1: every file is created, written and fsync'd before the next, so
/// each one costs a journal commit (or, without a journal, its own flushes).
struct FsyncFiles;

impl FsyncFiles {
    fn count(quick: bool) -> u64 {
        if quick {
            300
        } else {
            3_000
        }
    }
}

const FSYNC_FILE: usize = 16 * 1024;

impl Workload for FsyncFiles {
    fn name(&self) -> &'static str {
        "fsync-files"
    }
    fn about(&self) -> &'static str {
        "create, write and fsync one 16 KiB file after another in one directory (fs_mark -S 1)"
    }
    fn size(&self, quick: bool) -> String {
        format!("{} files of {} KiB, each fsync'd", Self::count(quick), FSYNC_FILE / 1024)
    }
    fn image_mb(&self, _quick: bool) -> u64 {
        512
    }
    fn run(&self, quick: bool, _input: &Path, phases: &mut dyn Phases) -> Result<(), BenchError> {
        let n = Self::count(quick);
        phases.untimed(&mut |fs| fs.mkdir("fsync", 0o755))?;
        phases.timed("create+fsync", n, &mut |fs| {
            for i in 0..n {
                let mut file = fs.create(&format!("fsync/file-{i:06}"), 0o644)?;
                file.write_at(0, &pattern(i, FSYNC_FILE))?;
                file.fsync()?;
            }
            Ok(())
        })
    }
}

/// Several threads creating files in one shared directory at once: what the
/// directory's locking lets through (the kernel's ext4 serialises creates in one
/// directory on its inode lock; fuse2fs serialises everything).
struct ParallelWriters;

impl ParallelWriters {
    fn files(quick: bool) -> u64 {
        if quick {
            2_000
        } else {
            16_000
        }
    }
}

impl Workload for ParallelWriters {
    fn name(&self) -> &'static str {
        "parallel"
    }
    fn about(&self) -> &'static str {
        "2, then 4 threads creating 4 KiB files in one shared directory"
    }
    fn size(&self, quick: bool) -> String {
        format!("{} files per phase, split between the threads", Self::files(quick))
    }
    fn run(&self, quick: bool, _input: &Path, phases: &mut dyn Phases) -> Result<(), BenchError> {
        let n = Self::files(quick);
        phases.untimed(&mut |fs| fs.mkdir("shared", 0o755))?;
        for threads in [2u64, 4] {
            phases.threads(threads);
            phases.timed(&format!("{threads} writers"), n, &mut |fs| {
                std::thread::scope(|s| {
                    let workers: Vec<_> = (0..threads)
                        .map(|t| {
                            s.spawn(move || -> io::Result<()> {
                                let body = pattern(t, 4096);
                                for i in 0..n / threads {
                                    fs.create(&format!("shared/w{threads}-{t}-{i:06}"), 0o644)?.write_at(0, &body)?;
                                }
                                Ok(())
                            })
                        })
                        .collect();
                    workers
                        .into_iter()
                        .try_for_each(|w| w.join().unwrap_or_else(|_| Err(io::Error::other("a writer panicked"))))
                })
            })?;
        }
        Ok(())
    }
}

/// Creates in one directory while N = 0, 1, 2, 4 other threads each rewrite and
/// fsync a file of their own in directories of their own: whether one caller's
/// fsync stalls everybody else's changes (issue 13). The phase's ops/s is the
/// creates', and the sample carries their 99th-percentile latency.
struct FsyncStorm;

impl FsyncStorm {
    /// Four phases of this must fit the inodes mkfs gives the image (32,768
    /// in 512 MiB, 131,072 in 2 GiB). The full size keeps each phase over a
    /// second through the mount: shorter phases measured mostly the machine's
    /// noise (7,000 creates took 0.2 to 1.3 s from run to run).
    fn creates(quick: bool) -> u64 {
        if quick {
            1_500
        } else {
            25_000
        }
    }
}

impl Workload for FsyncStorm {
    fn name(&self) -> &'static str {
        "fsync-storm"
    }
    fn about(&self) -> &'static str {
        "empty-file creates in one directory while 0, 1, 2, 4 other threads fsync their own files elsewhere"
    }
    fn size(&self, quick: bool) -> String {
        format!("{} creates per phase", Self::creates(quick))
    }
    fn image_mb(&self, quick: bool) -> u64 {
        if quick {
            512
        } else {
            2048
        }
    }
    fn run(&self, quick: bool, _input: &Path, phases: &mut dyn Phases) -> Result<(), BenchError> {
        let n = Self::creates(quick);
        for fsyncers in [0u64, 1, 2, 4] {
            phases.untimed(&mut |fs| {
                fs.mkdir(&format!("creates-{fsyncers}"), 0o755)?;
                (0..fsyncers).try_for_each(|t| fs.mkdir(&format!("sync-{fsyncers}-{t}"), 0o755))
            })?;
            phases.timed_latencies(&format!("N={fsyncers}"), n, &mut |fs| {
                let stop = std::sync::atomic::AtomicBool::new(false);
                std::thread::scope(|s| {
                    let stop = &stop;
                    let syncers: Vec<_> = (0..fsyncers)
                        .map(|t| {
                            s.spawn(move || -> io::Result<()> {
                                let mut file = fs.create(&format!("sync-{fsyncers}-{t}/file"), 0o644)?;
                                let block = pattern(t, 4096);
                                let mut i = 0u64;
                                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                                    file.write_at((i % 64) * 4096, &block)?;
                                    file.fsync()?;
                                    i += 1;
                                }
                                Ok(())
                            })
                        })
                        .collect();
                    let mut latencies = Vec::with_capacity(n as usize);
                    let created = (0..n).try_for_each(|i| {
                        let t = std::time::Instant::now();
                        fs.create(&format!("creates-{fsyncers}/f{i:07}"), 0o644)?;
                        latencies.push(t.elapsed());
                        Ok(())
                    });
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    syncers
                        .into_iter()
                        .try_for_each(|w| w.join().unwrap_or_else(|_| Err(io::Error::other("an fsyncer panicked"))))
                        .and(created)
                        .map(|()| latencies)
                })
            })?;
        }
        Ok(())
    }
}

/// Seed 000's experiment (Coly Li's dir_ireserve benchmark), run on targets
/// that carry the policy (`uext4:dir_ireserve=low`, ...).
///
/// `ireserve-toy`: 8 directories of 2 files, made round-robin inside one
/// directory, then removed directory by directory, once writing every
/// operation's dirty blocks at its end (a sync after each), once after each
/// directory; the device figures count the inode-table block writes (the seed:
/// 32 without reservation, 8 with). Its image has 512-byte inodes, 8 to a
/// 4 KiB block, as the seed's picture has them.
///
/// `ireserve`: N directories, then 15 files of 1 KiB in each, round-robin
/// (file k of every directory before file k + 1 of any), the image reopened
/// with a cold cache, then rm -rf in readdir order. uext4 runs with a cache
/// bound below the inode tables this touches (`uext4_defaults`); the kernel
/// has this machine's page cache.
struct IReserve {
    toy: bool,
}

impl IReserve {
    fn dirs(quick: bool) -> u64 {
        if quick {
            20_000
        } else {
            50_000
        }
    }
}

const IRESERVE_FILES: u64 = 15;
const IRESERVE_FILE: usize = 1024;
const TOY_DIRS: u64 = 8;
const TOY_FILES: u64 = 2;

impl Workload for IReserve {
    fn name(&self) -> &'static str {
        if self.toy {
            "ireserve-toy"
        } else {
            "ireserve"
        }
    }
    fn about(&self) -> &'static str {
        if self.toy {
            "seed 000's toy: 8 directories x 2 files removed with a sync per operation and per directory \
             (count the inode-table block writes); 8 inodes per block as in the seed"
        } else {
            "seed 000: N directories x 15 files of 1 KiB round-robin, cold cache, rm -rf in readdir order"
        }
    }
    fn size(&self, quick: bool) -> String {
        if self.toy {
            return format!("{TOY_DIRS} directories x {TOY_FILES} files, 512-byte inodes");
        }
        let cache = &self.uext4_defaults(quick)[0].1;
        format!(
            "{} directories x {IRESERVE_FILES} files of {IRESERVE_FILE} bytes; uext4 with cache_mb={cache} \
             (the inode tables touched are larger)",
            Self::dirs(quick)
        )
    }
    fn image_mb(&self, quick: bool) -> u64 {
        // Seed 000 used a 50 GB partition: room for windows of 128 slots.
        match (self.toy, quick) {
            (true, _) => 256,
            (false, true) => 20 << 10,
            (false, false) => 48 << 10,
        }
    }
    fn mkfs_args(&self, _quick: bool) -> Vec<String> {
        match self.toy {
            true => vec!["-I".into(), "512".into()],
            false => vec!["-i".into(), "8192".into()],
        }
    }
    fn uext4_defaults(&self, quick: bool) -> Vec<(String, String)> {
        vec![("cache_mb".into(), if quick { "32" } else { "64" }.into())]
    }
    fn run(&self, quick: bool, _input: &Path, phases: &mut dyn Phases) -> Result<(), BenchError> {
        let body = pattern(1, IRESERVE_FILE);
        if !self.toy {
            return self.scale(quick, phases, &body);
        }
        for (phase, per_operation) in [("sync per operation", true), ("sync per directory", false)] {
            let top = if per_operation { "toy-op" } else { "toy-dir" };
            phases.untimed(&mut |fs| {
                fs.mkdir(top, 0o755)?;
                (0..TOY_DIRS).try_for_each(|d| fs.mkdir(&format!("{top}/{d}"), 0o755))?;
                for f in 0..TOY_FILES {
                    for d in 0..TOY_DIRS {
                        fs.create(&format!("{top}/{d}/{f}"), 0o644)?.write_at(0, &body)?;
                    }
                }
                Ok(())
            })?;
            phases.timed(phase, TOY_DIRS * (TOY_FILES + 1), &mut |fs| {
                for d in 0..TOY_DIRS {
                    for f in 0..TOY_FILES {
                        fs.unlink(&format!("{top}/{d}/{f}"))?;
                        if per_operation {
                            fs.sync()?;
                        }
                    }
                    fs.rmdir(&format!("{top}/{d}"))?;
                    fs.sync()?;
                }
                Ok(())
            })?;
            phases.untimed(&mut |fs| fs.rmdir(top))?;
        }
        Ok(())
    }
}

impl IReserve {
    fn scale(&self, quick: bool, phases: &mut dyn Phases, body: &[u8]) -> Result<(), BenchError> {
        let n = Self::dirs(quick);
        phases.timed("mkdir", n, &mut |fs| (0..n).try_for_each(|d| fs.mkdir(&format!("d{d:05}"), 0o755)))?;
        phases.timed("create", n * IRESERVE_FILES, &mut |fs| {
            for f in 0..IRESERVE_FILES {
                for d in 0..n {
                    fs.create(&format!("d{d:05}/f{f:02}"), 0o644)?.write_at(0, body)?;
                }
            }
            Ok(())
        })?;
        phases.restart()?;
        phases.timed("remove", n * (IRESERVE_FILES + 1), &mut |fs| {
            for name in fs.read_dir("")? {
                if name == "lost+found" {
                    continue;
                }
                remove_tree(fs, &name)?;
                fs.rmdir(&name)?;
            }
            Ok(())
        })
    }
}

/// Seed 002's two programs (Alex Tomas's pdirops benchmark), on T = 1, 2, 4
/// threads in one directory. The directory first holds `prefill_names` names, so that
/// it is indexed, as a directory worth running in parallel is: pdirops locks by
/// name only there (a directory of one linear block takes every change whole).
/// Through any mount the kernel's VFS takes the directory's inode lock
/// exclusively for create, unlink and rename, so there these stay serial.
fn prefill_names(quick: bool) -> u64 {
    // 4 KiB blocks hold ~170 of these names: both sizes make an htree.
    if quick {
        1_000
    } else {
        5_000
    }
}

fn prefill(fs: &dyn FsOps, dir: &str, quick: bool) -> io::Result<()> {
    fs.mkdir(dir, 0o755)?;
    (0..prefill_names(quick)).try_for_each(|i| fs.create(&format!("{dir}/prefill-{i:05}"), 0o644).map(drop))
}

/// Runs `each(thread, i)` for `ops / threads` iterations on each of `threads` threads.
fn on_threads(
    fs: &dyn FsOps,
    threads: u64,
    ops: u64,
    each: &(dyn Fn(&dyn FsOps, u64, u64) -> io::Result<()> + Sync),
) -> io::Result<()> {
    std::thread::scope(|s| {
        let workers: Vec<_> =
            (0..threads).map(|t| s.spawn(move || (0..ops / threads).try_for_each(|i| each(fs, t, i)))).collect();
        workers.into_iter().try_for_each(|w| w.join().unwrap_or_else(|_| Err(io::Error::other("a worker panicked"))))
    })
}

fn crunl_rounds(quick: bool) -> u64 {
    if quick {
        4_000
    } else {
        200_000
    }
}

/// The names each crunl thread cycles through. In an htree leaf the cost of
/// finding a name grows with the entries before it, which the image's random
/// hash seed decides: with one fixed name per thread, one thread's name could
/// cost a quarter more than another's (one thread on one image: 121,000 to
/// 151,000 create+unlink a second, by name), and the phase, which ends with its
/// slowest thread, measured the names as much as the threads. Cycling spreads
/// every thread over the same mix of leaf positions.
const CRUNL_NAMES_PER_THREAD: u64 = 64;

fn crunl_name(thread: u64, i: u64) -> String {
    format!("f-{thread}-{}", i % CRUNL_NAMES_PER_THREAD)
}

/// crunl: each thread loops create + close + unlink of its own file (one of
/// its own names at a time).
struct Crunl;

impl Workload for Crunl {
    fn name(&self) -> &'static str {
        "crunl"
    }
    fn about(&self) -> &'static str {
        "seed 002's crunl: T = 1, 2, 4 threads each create, close and unlink their own file in one indexed directory (and 2 in directories of their own)"
    }
    fn size(&self, quick: bool) -> String {
        format!(
            "{} create+unlink per phase, split between the threads; {} names in the directory",
            crunl_rounds(quick),
            prefill_names(quick)
        )
    }
    fn image_mb(&self, _quick: bool) -> u64 {
        512
    }
    fn run(&self, quick: bool, _input: &Path, phases: &mut dyn Phases) -> Result<(), BenchError> {
        let n = crunl_rounds(quick);
        phases.untimed(&mut |fs| prefill(fs, "d", quick))?;
        // As the seed's programs, which changed into the directory: names
        // relative to it, opened once per phase (`DirOps`).
        for threads in [1u64, 2, 4] {
            phases.threads(threads);
            phases.timed(&format!("T={threads}"), n, &mut |fs| {
                let dir = fs.open_dir("d")?;
                on_threads(fs, threads, n, &|_, t, i| {
                    let name = crunl_name(t, i);
                    drop(dir.create(&name, 0o644)?);
                    dir.unlink(&name)
                })
            })?;
        }
        // The control: 2 threads in 2 directories of their own, which no
        // directory lock serialises: what the machine allows 2 threads here.
        phases.untimed(&mut |fs| (0..2).try_for_each(|t| prefill(fs, &format!("apart-{t}"), quick)))?;
        phases.threads(2);
        phases.timed("T=2 apart", n, &mut |fs| {
            let dirs = [fs.open_dir("apart-0")?, fs.open_dir("apart-1")?];
            on_threads(fs, 2, n, &|_, t, i| {
                let name = crunl_name(t, i);
                let dir = &dirs[t as usize];
                drop(dir.create(&name, 0o644)?);
                dir.unlink(&name)
            })
        })?;
        Ok(())
    }
}

/// rndrename: each thread creates a random name, renames it to another random
/// name, and unlinks it.
struct RndRename;

impl Workload for RndRename {
    fn name(&self) -> &'static str {
        "rndrename"
    }
    fn about(&self) -> &'static str {
        "seed 002's rndrename: T = 1, 2, 4 threads each create a random name, rename it to another, unlink it, in one indexed directory"
    }
    fn size(&self, quick: bool) -> String {
        format!(
            "{} create+rename+unlink per phase, split between the threads; {} names in the directory",
            crunl_rounds(quick) / 2,
            prefill_names(quick)
        )
    }
    fn image_mb(&self, _quick: bool) -> u64 {
        512
    }
    fn run(&self, quick: bool, _input: &Path, phases: &mut dyn Phases) -> Result<(), BenchError> {
        let n = crunl_rounds(quick) / 2;
        phases.untimed(&mut |fs| prefill(fs, "d", quick))?;
        for threads in [1u64, 2, 4] {
            phases.threads(threads);
            phases.timed(&format!("T={threads}"), n, &mut |fs| {
                let dir = fs.open_dir("d")?;
                on_threads(fs, threads, n, &|_, t, i| {
                    // Random names, distinct between threads (the thread in them).
                    let mut rng = Rng::new((threads << 40) ^ (t << 32) ^ i);
                    let from = format!("r{t}-{:016x}", rng.next_u64());
                    let to = format!("r{t}-{:016x}", rng.next_u64());
                    drop(dir.create(&from, 0o644)?);
                    dir.rename(&from, &to)?;
                    dir.unlink(&to)
                })
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_stamps_every_block_and_differs_by_tag() {
        let a = pattern(100, 3 * 4096 + 5);
        assert_eq!(a.len(), 3 * 4096 + 5);
        for k in 0..3 {
            assert_eq!(a[k * 4096..k * 4096 + 8], (100 + k as u64).to_le_bytes());
        }
        assert_eq!(a[3 * 4096..], (103u64).to_le_bytes()[..5]);
        assert_ne!(pattern(1, 4096), pattern(2, 4096));
    }

    #[test]
    fn workload_names_are_unique_and_found() {
        let names: Vec<&str> = all().iter().chain(by_name_only().iter()).map(|w| w.name()).collect();
        for name in &names {
            assert_eq!(names.iter().filter(|n| *n == name).count(), 1);
            assert_eq!(by_name(name).map(|w| w.name()), Some(*name));
        }
        assert!(by_name("nonesuch").is_none());
    }

    #[test]
    fn source_tree_places_every_entry_in_an_earlier_directory() {
        let entries = SourceTree { dirs: 30, files: 500 }.entries();
        let mut dirs = std::collections::HashSet::new();
        for e in &entries {
            let path = match e {
                SourceEntry::Dir(p) | SourceEntry::File(p, _) | SourceEntry::Symlink(p, _) => p,
            };
            if let Some((parent, _)) = path.rsplit_once('/') {
                assert!(dirs.contains(parent), "{path} comes before its directory");
            }
            if let SourceEntry::Dir(p) = e {
                dirs.insert(p.clone());
            }
        }
        assert_eq!(dirs.len(), 30);
        assert_eq!(entries.len(), 530);
    }
}
