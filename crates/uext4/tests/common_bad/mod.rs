//! Helpers for the bad-input tests: a watchdog, fixture images made without root by
//! `mkfs.ext4 -d` (and `e2fsck -fyD` to index their directories), a map of every
//! metadata block in them, and byte patches that keep checksums right.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uext4::dev::MemDevice;
use uext4::extent::MapKind;
use uext4::format::csum::crc32c;
use uext4::format::extent::ExtentNode;
use uext4::format::inode::{Inode, EXT4_EXTENTS_FL, EXT4_INDEX_FL, EXT4_INLINE_DATA_FL};
use uext4::fuzzing::{self, Budget, Report};
use uext4::{Error, FileType, Filesystem, Options, ROOT_INO};

// The oracle helpers are shared with the other integration tests.
pub use super::oracle::{have_tool, oracles_required, require_e2fsprogs, run, skip_unless};

/// Runs `f` on its own thread: Err with the panic message if it panics, or with a
/// note if it has not finished within `limit` (the thread is then abandoned).
pub fn bounded<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    let handle = std::thread::Builder::new()
        .stack_size(8 << 20)
        .spawn(move || {
            let _ = tx.send(f());
        })
        .expect("spawn a worker thread");
    match rx.recv_timeout(limit) {
        Ok(v) => {
            let _ = handle.join();
            Ok(v)
        }
        Err(mpsc::RecvTimeoutError::Timeout) => Err(format!("HANG: still running after {:?}", start.elapsed())),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            let payload = handle.join().err();
            let msg = payload
                .as_ref()
                .and_then(|p| {
                    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                })
                .unwrap_or_else(|| "(no message)".into());
            Err(format!("PANIC: {msg}"))
        }
    }
}

/// How an open-and-walk ended.
#[derive(Debug)]
pub enum Outcome {
    /// Opened; the report tallies what the walk met.
    Opened(Report),
    OpenCorrupt(String),
    OpenUnsupported(String),
    /// An open error of another kind: a bug for damaged input.
    OpenOther(String),
}

impl Outcome {
    pub fn of(r: uext4::Result<Report>) -> Outcome {
        match r {
            Ok(rep) => Outcome::Opened(rep),
            Err(e @ Error::Corrupt { .. }) => Outcome::OpenCorrupt(e.to_string()),
            Err(e @ Error::Unsupported { .. }) => Outcome::OpenUnsupported(e.to_string()),
            Err(e) => Outcome::OpenOther(format!("{e:?}: {e}")),
        }
    }

    /// Problems a damaged image must never cause (besides panics and hangs).
    pub fn bug(&self) -> Option<String> {
        match self {
            Outcome::OpenOther(m) => {
                Some(format!("open failed with an error that is neither Corrupt nor Unsupported: {m}"))
            }
            Outcome::Opened(r) if r.other > 0 => Some(format!(
                "walk met errors that are neither Corrupt nor Unsupported: {:?}",
                r.messages.iter().filter(|m| m.starts_with("OTHER")).collect::<Vec<_>>()
            )),
            _ => None,
        }
    }

    /// Every error message seen: the open's, or the walk's first few.
    pub fn messages(&self) -> Vec<String> {
        match self {
            Outcome::Opened(r) => r.messages.clone(),
            Outcome::OpenCorrupt(m) | Outcome::OpenUnsupported(m) | Outcome::OpenOther(m) => vec![m.clone()],
        }
    }

    pub fn is_clean(&self) -> bool {
        matches!(self, Outcome::Opened(r) if r.errors() == 0)
    }

    /// Whether some error message contains all of `words` (case-insensitive).
    pub fn mentions(&self, words: &[&str]) -> bool {
        self.messages().iter().any(|m| {
            let m = m.to_lowercase();
            words.iter().all(|w| m.contains(&w.to_lowercase()))
        })
    }

    pub fn short(&self) -> String {
        match self {
            Outcome::Opened(r) => format!(
                "opened: {} entries, {} bytes, {} corrupt / {} unsupported / {} other errors{}{}",
                r.entries,
                r.bytes_read,
                r.corrupt,
                r.unsupported,
                r.other,
                if r.budget_exhausted { ", budget hit" } else { "" },
                r.messages.first().map(|m| format!(" [{m}]")).unwrap_or_default()
            ),
            Outcome::OpenCorrupt(m) => format!("open: {m}"),
            Outcome::OpenUnsupported(m) => format!("open: {m}"),
            Outcome::OpenOther(m) => format!("open OTHER: {m}"),
        }
    }
}

pub fn opts(ignore_checksums: bool) -> Options {
    Options { ignore_checksums, cache_mb: 8, inode_cache_entries: 4096, ..Options::default() }
}

/// Opens `image` in memory and walks it under `budget`, on a watchdog thread.
pub fn try_image(image: Vec<u8>, ignore_checksums: bool, budget: &Budget, limit: Duration) -> Result<Outcome, String> {
    let budget = budget.clone();
    bounded(limit, move || Outcome::of(fuzzing::open_and_walk_bytes(image, opts(ignore_checksums), &budget)))
}

/// The budget for damaged fixtures: every file read whole, a bounded number of lookups.
pub fn trial_budget() -> Budget {
    Budget { lookups_per_dir: 200, ..Budget::thorough() }
}

/// Peak resident memory of this process, in MiB (Linux).
pub fn peak_rss_mib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb / 1024)
}

/// A small deterministic generator (xorshift64*), so every run damages the same bytes.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

// ---------------------------------------------------------------------------
// Fixture images

/// A host tree with every kind of thing the read path handles: files of many sizes
/// (empty, inline-sized, multi-block, sparse with hundreds of extents), a directory
/// big enough for an htree and one with long names for a two-level htree, short and
/// long symlinks, nested directories and, when the host allows, xattrs.
pub fn build_tree(root: &Path, big_dir_files: usize, deep_dir_files: usize) {
    let mk = |p: &Path| std::fs::create_dir_all(p).unwrap();
    mk(root);
    std::fs::write(root.join("empty"), b"").unwrap();
    std::fs::write(root.join("small"), b"tiny file\n").unwrap();
    std::fs::write(root.join("inline-size"), vec![b'i'; 100]).unwrap();
    std::fs::write(root.join("medium"), (0..150_000u32).map(|i| (i * 7 % 251) as u8).collect::<Vec<_>>()).unwrap();
    {
        // Data every other KiB: hundreds of extents, so a two-level extent tree.
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(root.join("sparse")).unwrap();
        for i in 0..400u64 {
            f.write_all_at(&[(i % 200) as u8 + 1; 1024], i * 2048).unwrap();
        }
        f.set_len(400 * 2048 + 3_000_000).unwrap();
    }
    let big = root.join("big");
    mk(&big);
    for i in 0..big_dir_files {
        std::fs::write(big.join(format!("file-with-a-longish-name-{i:05}")), format!("{i}\n")).unwrap();
    }
    let deep = root.join("deep");
    mk(&deep);
    for i in 0..deep_dir_files {
        std::fs::write(deep.join(format!("n{i:04}-{}", "x".repeat(200))), b"").unwrap();
    }
    let nest = root.join("a/b/c/d");
    mk(&nest);
    std::fs::write(nest.join("leaf"), b"leaf\n").unwrap();
    std::os::unix::fs::symlink("small", root.join("short-link")).unwrap();
    std::os::unix::fs::symlink("a/b/c/d/leaf", root.join("path-link")).unwrap();
    std::os::unix::fs::symlink(format!("{}small", "./".repeat(60)), root.join("long-link")).unwrap();
    std::os::unix::fs::symlink("loop-b", root.join("loop-a")).unwrap();
    std::os::unix::fs::symlink("loop-a", root.join("loop-b")).unwrap();
    if have_tool("setfattr") {
        let attrs = root.join("attrs");
        std::fs::write(&attrs, b"x").unwrap();
        for (k, v) in [("user.small", "1".to_string()), ("user.big", "v".repeat(600)), ("user.big2", "w".repeat(300))] {
            let _ = Command::new("setfattr").arg("-n").arg(k).arg("-v").arg(v).arg(&attrs).status();
        }
        let _ = Command::new("setfattr").arg("-n").arg("user.dir").arg("-v").arg("d").arg(&big).status();
    }
}

/// The image shapes the damage tests use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// mkfs.ext4 defaults with 1 KiB blocks: extents, 64bit, flex_bg, metadata_csum.
    Csum,
    InlineData,
    /// Indirect block maps (no extents, so no 64bit either).
    NoExtent,
    /// No metadata_csum: crc16 group descriptor checksums (uninit_bg) only.
    NoCsum,
}

impl Shape {
    pub const ALL: [Shape; 4] = [Shape::Csum, Shape::InlineData, Shape::NoExtent, Shape::NoCsum];

    pub fn mkfs_args(self) -> &'static [&'static str] {
        match self {
            Shape::Csum => &[],
            Shape::InlineData => &["-O", "inline_data", "-I", "256"],
            Shape::NoExtent => &["-O", "^extent,^64bit"],
            Shape::NoCsum => &["-O", "^metadata_csum,uninit_bg"],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Shape::Csum => "csum",
            Shape::InlineData => "inline_data",
            Shape::NoExtent => "no_extent",
            Shape::NoCsum => "no_csum",
        }
    }
}

/// Makes an image of `shape` (`size` like "6M", 1 KiB blocks) from `tree` without
/// root, and indexes its directories with `e2fsck -fyD`. Returns its bytes.
pub fn make_image(work: &Path, tree: &Path, shape: Shape, size: &str) -> Vec<u8> {
    let image = work.join(format!("{}.img", shape.name()));
    run(Command::new("mkfs.ext4")
        // Three block groups of 2048 blocks, so descriptors, tables and backups repeat.
        .args(["-q", "-F", "-b", "1024", "-g", "2048"])
        .args(shape.mkfs_args())
        .arg("-d")
        .arg(tree)
        .arg(&image)
        .arg(size));
    // -D rebuilds directories as htrees; exit 1 just says it changed the image.
    let st = Command::new("e2fsck").arg("-fyD").arg(&image).output().expect("run e2fsck");
    assert!(st.status.code().unwrap_or(8) <= 1, "e2fsck -fyD {}: {:?}", image.display(), st);
    std::fs::read(&image).unwrap()
}

/// The fixture images, built once per test binary run.
pub fn fixtures() -> &'static Vec<(Shape, Vec<u8>)> {
    static IMAGES: std::sync::OnceLock<Vec<(Shape, Vec<u8>)>> = std::sync::OnceLock::new();
    IMAGES.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        build_tree(&tree, 500, 800);
        Shape::ALL.iter().map(|&s| (s, make_image(dir.path(), &tree, s, "6M"))).collect()
    })
}

pub fn fixture(shape: Shape) -> Vec<u8> {
    fixtures().iter().find(|(s, _)| *s == shape).unwrap().1.clone()
}

/// Small images for the mini fuzz: fewer files, so one walk costs little.
pub fn small_fixtures() -> &'static Vec<(Shape, Vec<u8>)> {
    static IMAGES: std::sync::OnceLock<Vec<(Shape, Vec<u8>)>> = std::sync::OnceLock::new();
    IMAGES.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        build_tree(&tree, 120, 40);
        // The sparse file is a few MiB of holes; the images stay small anyway.
        Shape::ALL.iter().map(|&s| (s, make_image(dir.path(), &tree, s, "2M"))).collect()
    })
}

// ---------------------------------------------------------------------------
// Finding metadata

/// Kinds of metadata block the damage tests aim at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Superblock,
    GroupDescriptors,
    InodeTable,
    ExtentIndex,
    ExtentLeaf,
    IndirectBlock,
    DirLeaf,
    HtreeRoot,
    HtreeNode,
    XattrBlock,
    JournalSuperblock,
}

/// One metadata block and the byte ranges in it that the read path depends on (and
/// that a checksum covers, where the image has checksums).
#[derive(Clone, Debug)]
pub struct Meta {
    pub kind: Kind,
    pub block: u64,
    /// Byte ranges inside the block, [start, end).
    pub ranges: Vec<(usize, usize)>,
    /// The inode it belongs to, if any.
    pub ino: Option<u32>,
}

/// Every metadata block the walk depends on, found by walking the image with uext4.
pub fn metadata_map(image: &[u8]) -> Vec<Meta> {
    let fs = Filesystem::open_device(Arc::new(MemDevice::new(image.to_vec())), Options::default()).unwrap();
    let geo = fs.geometry().clone();
    let bs = geo.block_size;
    let sb = fs.superblock();
    let mut out = Vec::new();
    // The superblock is bytes 1024..2048: block 1 with 1 KiB blocks.
    let (sb_block, sb_off) = ((1024 / bs) as u64, 1024 % bs);
    out.push(Meta { kind: Kind::Superblock, block: sb_block, ranges: vec![(sb_off, sb_off + 1024)], ino: None });
    let mut gd_ranges: std::collections::BTreeMap<u64, Vec<(usize, usize)>> = Default::default();
    for g in 0..geo.group_count {
        let (b, off) = Filesystem::group_desc_location(&sb, g);
        gd_ranges.entry(b).or_default().push((off, off + geo.desc_size));
    }
    for (b, ranges) in gd_ranges {
        out.push(Meta { kind: Kind::GroupDescriptors, block: b, ranges, ino: None });
    }
    // Every inode reached by the walk, and its own metadata blocks.
    let mut inodes = BTreeSet::new();
    inodes.insert(ROOT_INO);
    fs.walk(ROOT_INO, &mut |_, st| {
        inodes.insert(st.ino);
        Ok(())
    })
    .unwrap();
    let mut itable: std::collections::BTreeMap<u64, Vec<(usize, usize)>> = Default::default();
    // The journal is read only to replay it: its blocks are listed, its inode slot is not.
    let journal = (sb.s_journal_inum != 0).then_some(sb.s_journal_inum);
    for &ino in inodes.iter().chain(journal.iter()) {
        if Some(ino) != journal {
            let (b, off) = inode_location(&fs, ino);
            itable.entry(b).or_default().push((off, off + geo.inode_size));
        }
        let inode = fs.inode(ino).unwrap();
        if Some(ino) == journal {
            if let Ok(MapKind::Mapped(p)) = fs.map_blocks(ino, &inode, 0, 1).map(|m| m.kind) {
                out.push(Meta { kind: Kind::JournalSuperblock, block: p, ranges: vec![(0, 1024)], ino: Some(ino) });
            }
            continue;
        }
        if inode.i_file_acl != 0 {
            out.push(Meta { kind: Kind::XattrBlock, block: inode.i_file_acl, ranges: vec![(0, bs)], ino: Some(ino) });
        }
        if inode.has_flag(EXT4_INLINE_DATA_FL) {
            continue;
        }
        let is_fast_link = inode.is_symlink() && fs.is_fast_symlink(&inode);
        if inode.has_flag(EXT4_EXTENTS_FL) {
            extent_blocks(&fs, ino, &inode, &mut out);
        } else if !is_fast_link && (inode.is_reg() || inode.is_dir() || inode.is_symlink()) {
            indirect_blocks(&fs, ino, &inode, &mut out);
        }
        if inode.is_dir() {
            dir_blocks(&fs, ino, &inode, &mut out);
        }
    }
    for (b, ranges) in itable {
        out.push(Meta { kind: Kind::InodeTable, block: b, ranges, ino: None });
    }
    out
}

/// Where inode `ino` lives: (block, byte offset in the block).
pub fn inode_location(fs: &Filesystem, ino: u32) -> (u64, usize) {
    let geo = fs.geometry();
    let group = (ino - 1) / geo.inodes_per_group;
    let index = (ino - 1) % geo.inodes_per_group;
    let byte = index as u64 * geo.inode_size as u64;
    let table = fs.group_desc(group).unwrap().bg_inode_table;
    (table + byte / geo.block_size as u64, (byte % geo.block_size as u64) as usize)
}

fn extent_blocks(fs: &Filesystem, ino: u32, inode: &Inode, out: &mut Vec<Meta>) {
    let mut todo: Vec<u64> = Vec::new();
    if let Ok(ExtentNode::Index(_, idx)) = ExtentNode::parse(&inode.i_block, None, "root") {
        todo.extend(idx.iter().map(|e| e.leaf));
    }
    while let Some(b) = todo.pop() {
        let buf = fs.cache().get(b).unwrap();
        let data = buf.read();
        let node = ExtentNode::parse(&data, None, "node").unwrap();
        let end = uext4::format::extent::tail_offset(node.header().eh_max) + 4;
        match node {
            ExtentNode::Index(_, idx) => {
                todo.extend(idx.iter().map(|e| e.leaf));
                out.push(Meta { kind: Kind::ExtentIndex, block: b, ranges: vec![(0, end)], ino: Some(ino) });
            }
            ExtentNode::Leaf(..) => {
                out.push(Meta { kind: Kind::ExtentLeaf, block: b, ranges: vec![(0, end)], ino: Some(ino) })
            }
        }
    }
}

fn indirect_blocks(fs: &Filesystem, ino: u32, inode: &Inode, out: &mut Vec<Meta>) {
    let bs = fs.geometry().block_size;
    let le32 = uext4::format::bytes::le32;
    // (block, levels of pointers below it)
    let mut todo: Vec<(u64, u32)> =
        (12..15).map(|i| (le32(&inode.i_block, i * 4) as u64, i as u32 - 11)).filter(|&(b, _)| b != 0).collect();
    while let Some((b, level)) = todo.pop() {
        let buf = fs.cache().get(b).unwrap();
        let data = buf.read();
        let used = (0..bs / 4).filter(|&i| le32(&data, i * 4) != 0).count();
        out.push(Meta { kind: Kind::IndirectBlock, block: b, ranges: vec![(0, used * 4)], ino: Some(ino) });
        if level > 1 {
            for i in 0..bs / 4 {
                let p = le32(&data, i * 4) as u64;
                if p != 0 {
                    todo.push((p, level - 1));
                }
            }
        }
    }
}

fn dir_blocks(fs: &Filesystem, ino: u32, inode: &Inode, out: &mut Vec<Meta>) {
    let bs = fs.geometry().block_size;
    let indexed = inode.has_flag(EXT4_INDEX_FL);
    let csum = fs.geometry().metadata_csum;
    let le16 = uext4::format::bytes::le16;
    let le32 = uext4::format::bytes::le32;
    for lblk in 0..inode.i_size / bs as u64 {
        let m = fs.map_blocks(ino, inode, lblk, 1).unwrap();
        let MapKind::Mapped(p) = m.kind else { continue };
        let buf = fs.cache().get(p).unwrap();
        let data = buf.read();
        let first_rec_len = le16(&data, 4) as usize;
        // Index nodes: the header, the used entries and (with checksums) the tail;
        // the unused entry slots matter to nobody.
        let dx = |countlimit: usize| {
            let limit = le16(&data, countlimit) as usize;
            let count = le16(&data, countlimit + 2) as usize;
            let mut r = vec![(0, countlimit + count * 8)];
            if csum {
                let tail = countlimit + limit * 8;
                r.push((tail, tail + 8));
            }
            r
        };
        let (kind, ranges) = if indexed && lblk == 0 {
            (Kind::HtreeRoot, dx(0x20))
        } else if indexed && le32(&data, 0) == 0 && first_rec_len == bs {
            (Kind::HtreeNode, dx(8))
        } else {
            (Kind::DirLeaf, vec![(0, bs)])
        };
        out.push(Meta { kind, block: p, ranges, ino: Some(ino) });
    }
}

// ---------------------------------------------------------------------------
// Editing images

pub fn block_size_of(image: &[u8]) -> usize {
    1024 << uext4::format::bytes::le32(image, 1024 + 0x18)
}

pub fn block_mut(image: &mut [u8], block: u64) -> &mut [u8] {
    let bs = block_size_of(image);
    let start = block as usize * bs;
    &mut image[start..start + bs]
}

/// Rewrites the superblock checksum after an edit (a no-op without metadata_csum).
pub fn fix_superblock_csum(image: &mut [u8]) {
    let sb = &mut image[1024..2048];
    let c = crc32c(!0, &sb[..0x3FC]);
    sb[0x3FC..0x400].copy_from_slice(&c.to_le_bytes());
}

/// Edits inode `ino` with `f` over its raw slot, then rewrites its checksum.
pub fn edit_inode(image: &mut [u8], ino: u32, f: impl FnOnce(&mut [u8])) {
    let fs = Filesystem::open_device(Arc::new(MemDevice::new(image.to_vec())), opts(true)).unwrap();
    let (b, off) = inode_location(&fs, ino);
    let isz = fs.geometry().inode_size;
    let seed = fs.geometry().metadata_csum.then_some(fs.geometry().csum_seed);
    drop(fs);
    let blk = block_mut(image, b);
    let slot = &mut blk[off..off + isz];
    f(slot);
    if let Some(seed) = seed {
        let inode = Inode::parse(slot).unwrap();
        let fixed = inode.to_bytes(ino, Some(seed));
        slot.copy_from_slice(&fixed);
    }
}

/// The checksum seed of inode `ino` (for its extent and directory blocks).
pub fn inode_seed(image: &[u8], ino: u32) -> u32 {
    let fs = Filesystem::open_device(Arc::new(MemDevice::new(image.to_vec())), opts(true)).unwrap();
    let inode = fs.inode(ino).unwrap();
    uext4::format::inode::inode_csum_seed(fs.geometry().csum_seed, ino, inode.i_generation)
}

pub fn is_csum(image: &[u8]) -> bool {
    uext4::format::bytes::le32(image, 1024 + 0x64) & 0x400 != 0
}

/// Inode number of an absolute path in `image`.
pub fn ino_of(image: &[u8], path: &str) -> u32 {
    let fs = Filesystem::open_device(Arc::new(MemDevice::new(image.to_vec())), opts(true)).unwrap();
    fs.lookup_path(path.as_bytes()).unwrap()
}

/// Runs `cmd` in `dir`, for decompressing corpus images.
pub fn decompress(src: &Path, dir: &Path) -> PathBuf {
    let name = src.file_name().unwrap().to_string_lossy().to_string();
    let (stem, tool) = if let Some(s) = name.strip_suffix(".gz") {
        (s.to_string(), "gzip")
    } else if let Some(s) = name.strip_suffix(".bz2") {
        (s.to_string(), "bzip2")
    } else {
        (name.clone(), "cat")
    };
    let dst = dir.join(&stem);
    let out = if tool == "cat" {
        std::fs::read(src).unwrap()
    } else {
        let o = Command::new(tool).arg("-dc").arg(src).output().unwrap_or_else(|e| panic!("run {tool}: {e}"));
        assert!(o.status.success(), "{tool} -dc {}: {}", src.display(), String::from_utf8_lossy(&o.stderr));
        o.stdout
    };
    std::fs::write(&dst, out).unwrap();
    dst
}

/// Whether the fixture has a directory of `kind` in it (e.g. a two-level htree).
pub fn has_kind(map: &[Meta], kind: Kind) -> bool {
    map.iter().any(|m| m.kind == kind)
}

pub fn first_of(map: &[Meta], kind: Kind) -> Option<&Meta> {
    map.iter().find(|m| m.kind == kind)
}

pub fn file_type_of(image: &[u8], ino: u32) -> FileType {
    let fs = Filesystem::open_device(Arc::new(MemDevice::new(image.to_vec())), opts(true)).unwrap();
    fs.stat(ino).unwrap().file_type
}

/// What `e2fsck -fn` finds wrong with `image`, one line per problem, so that two runs
/// compare as sets. Inode and block numbers stay; what changes on any write does
/// not: pass headers, the summary, "Fix? no" prompts, the ranges listed after
/// "bitmap differences", the numbers in "count wrong (have, counted=want)" and in
/// wrong i_blocks, i_size and link counts, and the paths directories are named by.
pub fn e2fsck_problems(image: &[u8]) -> BTreeSet<String> {
    e2fsck_problems_within(image, 600).expect("e2fsck -fn finishes")
}

/// As `e2fsck_problems`, or None when e2fsck takes more than `secs` seconds (with
/// -n it cannot repair, and on a few corpus images it then never ends). Such an
/// e2fsck may also ignore the SIGTERM `timeout` sends (a CI run waited on one for
/// twelve minutes): it is killed 5 s later.
pub fn e2fsck_problems_within(image: &[u8], secs: u32) -> Option<BTreeSet<String>> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("check.img");
    std::fs::write(&path, image).unwrap();
    let out = Command::new("timeout")
        .args(["-k", "5"])
        .arg(secs.to_string())
        .args(["e2fsck", "-fn"])
        .arg(&path)
        .output()
        .expect("run e2fsck");
    // 124: ended by SIGTERM at the limit; 137: killed after ignoring it.
    if matches!(out.status.code(), Some(124) | Some(137)) {
        return None;
    }
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let shown = path.display().to_string();
    let mut problems = BTreeSet::new();
    let mut last: Option<String> = None;
    for line in text.lines() {
        let mut l = line.replace(&shown, "IMAGE").trim().to_string();
        // "(logical block 0, physical block 1420, len 166)" details the extent of
        // the problem on the line before: one problem, one line.
        if l.starts_with("(logical block ") {
            if let Some(p) = last.take() {
                problems.remove(&p);
                let joined = format!("{p} {l}");
                problems.insert(joined.clone());
                last = Some(joined);
            }
            continue;
        }
        if let Some(i) = l.rfind("  ").filter(|_| l.ends_with("? no") || l.ends_with("? yes")) {
            l.truncate(i);
        }
        let skip = l.is_empty()
            || l.starts_with("Pass ")
            || l.starts_with("e2fsck ")
            || (l.ends_with("? no") && !l.contains("  "))
            || l.contains("WARNING: Filesystem still has errors")
            || l.contains("% non-contiguous)");
        if skip {
            continue;
        }
        for prefix in ["Block bitmap differences:", "Inode bitmap differences:"] {
            if l.starts_with(prefix) {
                l = prefix.to_string();
            }
        }
        // "Inode 188 (/small) has invalid mode": the path moves with a rename.
        if let (true, Some(open), Some(close)) = (l.starts_with("Inode "), l.find(" ("), l.find(") ")) {
            if open < close && l[6..open].bytes().all(|b| b.is_ascii_digit()) {
                l.replace_range(open..close + 1, "");
            }
        }
        // "Extended attribute block for inode 2 (/a/..) is invalid": the path moves
        // with the names around it, as above.
        if let Some(at) = l.find(" for inode ") {
            let from = at + " for inode ".len();
            let digits = l[from..].bytes().take_while(u8::is_ascii_digit).count();
            if digits > 0 && l[from + digits..].starts_with(" (") {
                if let Some(close) = l[from + digits..].find(") ") {
                    l.replace_range(from + digits..from + digits + close + 1, "");
                }
            }
        }
        // "Problem in HTREE directory inode 18: root node is invalid": for a damaged
        // root e2fsck's number here is not the directory's (the same image gave 18
        // and, after an unrelated change, 0); the directory is named in the line
        // before, which stays.
        if let Some(rest) = l.strip_prefix("Problem in HTREE directory inode ") {
            if let Some((_, what)) = rest.split_once(": ").filter(|(_, w)| *w == "root node is invalid") {
                l = format!("Problem in HTREE directory: {what}");
            }
        }
        // "File / (inode #2, mod time Wed Nov 25 13:48:47 2026)" in a report of shared
        // blocks: a change of that directory moves its time.
        if let Some(i) = l.find(", mod time ") {
            l.truncate(i);
            l.push(')');
        }
        // "Inode 19, i_blocks is 2, should be 1701023190498146.": with a damaged
        // xattr block e2fsck's figure is not even the same from run to run, and a
        // write to a file whose count was already wrong moves both numbers.
        for field in [", i_blocks is ", ", i_size is "] {
            if let Some(i) = l.find(field) {
                l.truncate(i + field.len() - 1);
                l.push_str(" wrong");
            }
        }
        // "... has an incorrect filetype (was 222, should be 1).": what it should be
        // follows the inode the entry names, which a damaged entry may see change.
        if let Some(i) = l.find(" has an incorrect filetype (") {
            l.truncate(i + " has an incorrect filetype".len());
        }
        // "Unconnected directory inode 15 (was in /a/b/c)", "'..' in /a/b/c/d (15)
        // is /a/b/c (14)": directories are named by paths that move with the names
        // around them; the inode numbers stay.
        if let Some(i) = l.find(" (was in ") {
            l.truncate(i);
        }
        l = without_paths(&l);
        // "Inode 2 ref count is 4, should be 3.": a new name there moves both numbers.
        if let Some(i) = l.find(" ref count is ") {
            l.truncate(i + " ref count is".len());
            l.push_str(" wrong");
        }
        // "Multiply-claimed block(s) in inode 8: 28 128", "(There are 2 inodes
        // containing multiply-claimed blocks.)": freeing one claimant of a shared
        // block shortens both; which inodes share blocks stays.
        if let Some(i) = l.find(": ").filter(|_| l.starts_with("Multiply-claimed block(s) in inode ")) {
            l.truncate(i + 1);
        }
        if l.starts_with("(There are ") && l.ends_with(" inodes containing multiply-claimed blocks.)") {
            l = "(There are inodes containing multiply-claimed blocks.)".to_string();
        }
        if l.contains("count wrong") {
            if let Some(i) = l.find(" (") {
                l.truncate(i);
            }
        }
        problems.insert(l.clone());
        last = Some(l);
    }
    Some(problems)
}

/// `line` with each path e2fsck names a directory by ("/a/b (14)", "... (15)",
/// "??? (11)") cut down to its inode number ("(14)"). Quoted names stay.
fn without_paths(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut quoted = false;
    let words: Vec<&str> = line.split(' ').collect();
    for (i, word) in words.iter().enumerate() {
        quoted ^= word.matches('\'').count() % 2 == 1;
        let next_is_number = words.get(i + 1).is_some_and(|n| {
            n.strip_prefix('(')
                .and_then(|n| n.split(')').next())
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        });
        let path = word.starts_with('/') || word.starts_with("...") || word.starts_with("???");
        if !quoted && path && next_is_number {
            continue;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    out
}

/// The problems e2fsck reports after that it did not before, less those that follow
/// from one already there: the superblock's free totals are the sums of the group
/// counts (the kernel writes them so too), and removing a name of an inode whose
/// links count was wrong leaves it unattached, or freed while another name remains
/// (as the kernel's unlink would: it trusts the count), as does freeing an inode
/// whose blocks e2fsck already found claimed twice; and freeing blocks claimed twice
/// leaves the bitmap short of the other claimant's. More such rules below, each
/// with the damage it follows from.
pub fn new_problems(before: &BTreeSet<String>, after: &BTreeSet<String>) -> Vec<String> {
    // e2fsck bounds a file's extents by its size only when the size is at least
    // one block long: a size the damage made too short, grown by a write or a
    // truncate, brings the extents the file already had under that bound.
    let bounded_inodes: Vec<&str> = after
        .iter()
        .filter_map(|p| p.strip_prefix("Inode ")?.split_once(", end of extent exceeds allowed value"))
        .map(|(ino, _)| ino)
        .filter(|ino| before.contains(&format!("Inode {ino}, i_size is wrong")))
        .collect();
    let implied = |p: &str| {
        // A wrong superblock total follows from a wrong group count; an inode left
        // without names after an unlink, from a links count that was already wrong.
        let total = before.iter().any(|b| b.starts_with(&format!("{p} for group")));
        let count_was_wrong = |ino: &str| before.contains(&format!("Inode {ino} ref count is wrong"));
        let unattached = p
            .strip_prefix("Unattached inode ")
            .or_else(|| p.strip_prefix("Unattached zero-length inode ").and_then(|n| n.strip_suffix('.')))
            .is_some_and(count_was_wrong);
        // ... or, the other way, freed with a name still naming it.
        // ... or when its blocks were shared with another inode's: freeing one frees
        // the other's too.
        let shared =
            |ino: &str| before.iter().any(|b| b.starts_with(&format!("Multiply-claimed block(s) in inode {ino}:")));
        // ... or when another damaged entry already named that free inode: the
        // allocator, trusting the bitmap, gave it to a new file, and the damaged
        // entry's removal (or reuse) then acts on the new file.
        let named_while_free = |ino: &str| {
            before.iter().any(|b| {
                b.ends_with(&format!(" has deleted/unused inode {ino}."))
                    || b.contains(&format!(" references inode {ino} found in group"))
            })
        };
        let unconnected = |dir: &str| before.contains(&format!("Unconnected directory inode {dir}"));
        let freed = p.strip_suffix('.').and_then(|p| p.rsplit_once(" has deleted/unused inode ")).is_some_and(
            |(entry, ino)| {
                count_was_wrong(ino)
                    || shared(ino)
                    || named_while_free(ino)
                    // The parent of a directory already cut off from the tree may be
                    // removed as empty: its '..' then names a freed inode.
                    || entry.strip_prefix("Entry '..' in (").and_then(|d| d.strip_suffix(')')).is_some_and(unconnected)
            },
        );
        let recounted =
            p.strip_prefix("Inode ").and_then(|p| p.strip_suffix(" ref count is wrong")).is_some_and(named_while_free);
        // A block bitmap that no longer covers a block, when blocks were claimed
        // twice: freeing one claimant's blocks frees the other's.
        // So does a shared xattr block whose reference count was too high: the last
        // inode using it takes a copy, and the old one keeps a count but no owner.
        let bitmap = p == "Block bitmap differences:"
            && before.iter().any(|b| {
                b.starts_with("Multiply-claimed block(s) in inode ")
                    || (b.starts_with("Extended attribute block ") && b.contains(" has reference count "))
            });
        // A name e2fsck already called a duplicate is reported again, in other
        // words, once the directory around it has changed.
        let duplicate =
            p.strip_prefix("Entry '").and_then(|rest| rest.split_once("' in ")).is_some_and(|(name, rest)| {
                rest.ends_with(" has a non-unique filename.")
                    && before.contains(&format!("Duplicate entry '{name}' found."))
            });
        // For an inode of `bounded_inodes` (above), what e2fsck would do to the
        // extents past its size (free them) is reported too: its block count and
        // tree depth, and the bitmap. Only those kinds of line: any other new problem of the inode still
        // counts. (The bitmap line carries no ranges here, so a block leaked
        // elsewhere in such an image would go unseen: a known gap of this rule.)
        let bounded = bounded_inodes.iter().any(|ino| {
            p.starts_with(&format!("Inode {ino}, end of extent exceeds allowed value"))
                || p == format!("Inode {ino}, i_blocks is wrong")
                || (p.starts_with(&format!("Inode {ino} extent tree (at level ")) && p.ends_with(") could be shorter."))
        }) || (p == "Block bitmap differences:" && !bounded_inodes.is_empty());
        total || unattached || freed || recounted || bitmap || duplicate || bounded
    };
    after.difference(before).filter(|p| !implied(p)).cloned().collect()
}
