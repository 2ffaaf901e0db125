//! Opening an untrusted image and reading everything in it under a budget: the one
//! routine the bad-input tests and the fuzz target share. Not a stable API.
//!
//! Every call the read path offers is made (stat, read, read_all, read_link, xattrs,
//! read_dir, lookup, lookup_path, walk), and every error is tallied by kind instead of
//! stopping the walk, so one bad block does not hide the rest of the image. The
//! budget bounds the work a hostile image can ask for; the engine itself must keep
//! each single call bounded.

use crate::dev::{BlockDevice, MemDevice};
use crate::error::{Error, Result};
use crate::fs::{Filesystem, Options};
use crate::ns::{FileType, Stat, ROOT_INO};
use std::collections::HashSet;
use std::sync::Arc;

/// Limits on one walk.
#[derive(Clone, Debug)]
pub struct Budget {
    /// Directory entries visited, all directories together.
    pub max_entries: u64,
    /// File bytes read, all files together.
    pub max_bytes: u64,
    /// Bytes read from any one file.
    pub max_file_bytes: u64,
    /// Files up to this size are read with `read_all`, larger ones in chunks.
    pub read_all_limit: u64,
    /// Chunk size of chunked reads.
    pub chunk: usize,
    /// Names of each directory looked up again with `lookup`.
    pub lookups_per_dir: usize,
    /// Symlinks resolved through `lookup_path`.
    pub path_lookups: usize,
}

impl Budget {
    /// For fuzzing: one input costs milliseconds.
    pub fn fuzz() -> Budget {
        Budget {
            max_entries: 4_000,
            max_bytes: 16 << 20,
            max_file_bytes: 1 << 20,
            read_all_limit: 256 << 10,
            chunk: 64 << 10,
            lookups_per_dir: 64,
            path_lookups: 16,
        }
    }

    /// For whole test images: everything up to 64 MiB per file.
    pub fn thorough() -> Budget {
        Budget {
            max_entries: 200_000,
            max_bytes: 1 << 30,
            max_file_bytes: 256 << 20,
            read_all_limit: 64 << 20,
            chunk: 1 << 20,
            lookups_per_dir: 4_096,
            path_lookups: 256,
        }
    }
}

/// What a walk met.
#[derive(Debug, Default)]
pub struct Report {
    pub entries: u64,
    pub dirs: u64,
    pub files_read: u64,
    pub bytes_read: u64,
    pub symlinks: u64,
    pub xattrs: u64,
    /// Names that read_dir listed but lookup did not find (a damaged index).
    pub lookup_misses: u64,
    pub corrupt: u64,
    pub unsupported: u64,
    /// Errors of any other kind: a damaged image should never cause one.
    pub other: u64,
    /// The first few error messages, kind-prefixed, for reports.
    pub messages: Vec<String>,
    pub budget_exhausted: bool,
}

const KEPT_MESSAGES: usize = 16;

impl Report {
    pub fn errors(&self) -> u64 {
        self.corrupt + self.unsupported + self.other
    }

    /// Records an error; kinds other than Corrupt and Unsupported count as `other`.
    pub fn note(&mut self, what: &str, e: &Error) {
        let kind = match e {
            Error::Corrupt { .. } => {
                self.corrupt += 1;
                "corrupt"
            }
            Error::Unsupported { .. } => {
                self.unsupported += 1;
                "unsupported"
            }
            _ => {
                self.other += 1;
                "OTHER"
            }
        };
        if self.messages.len() < KEPT_MESSAGES {
            self.messages.push(format!("{kind}: {what}: {e}"));
        }
    }

    /// Whether some error message contains every one of `words` (case-insensitive).
    pub fn mentions(&self, words: &[&str]) -> bool {
        self.messages.iter().any(|m| {
            let m = m.to_lowercase();
            words.iter().all(|w| m.contains(&w.to_lowercase()))
        })
    }
}

/// Opens `image` (in memory) and walks it. Err only when the open fails.
pub fn open_and_walk_bytes(image: Vec<u8>, opts: Options, budget: &Budget) -> Result<Report> {
    open_and_walk(Arc::new(MemDevice::new(image)), opts, budget)
}

/// Opens a device and walks it. Err only when the open fails.
pub fn open_and_walk(dev: Arc<dyn BlockDevice>, opts: Options, budget: &Budget) -> Result<Report> {
    let fs = Filesystem::open_device(dev, opts)?;
    let mut report = walk_everything(&fs, budget);
    if let Some(damage) = fs.damage_at_open() {
        // First among the messages: the walk's errors may follow from it.
        let kept = std::mem::take(&mut report.messages);
        report.note("open (went on read-only)", &Error::corrupt(damage, "group descriptors"));
        report.messages.extend(kept.into_iter().take(KEPT_MESSAGES - 1));
    }
    Ok(report)
}

struct Walker<'a> {
    fs: &'a Filesystem,
    budget: &'a Budget,
    report: Report,
    contents_seen: HashSet<u32>,
    symlink_paths: Vec<Vec<u8>>,
}

/// Paths longer than this are not kept (a deep chain would make them quadratic).
const MAX_KEPT_PATH: usize = 4096;

/// Reads everything reachable from the root, within `budget`.
pub fn walk_everything(fs: &Filesystem, budget: &Budget) -> Report {
    let mut w =
        Walker { fs, budget, report: Report::default(), contents_seen: HashSet::new(), symlink_paths: Vec::new() };
    w.tree();
    w.symlinks();
    w.api_walk();
    w.report
}

impl Walker<'_> {
    fn tree(&mut self) {
        let root = match self.fs.stat(ROOT_INO) {
            Ok(st) => st,
            Err(e) => return self.report.note("stat of the root", &e),
        };
        self.contents(&root);
        if root.file_type != FileType::Directory {
            return;
        }
        // Each directory is listed once, however many entries reach it: a damaged
        // image may link one directory from many places, or into a loop.
        let mut listed: HashSet<u32> = HashSet::new();
        let mut stack: Vec<(Option<Vec<u8>>, u32)> = vec![(Some(Vec::new()), ROOT_INO)];
        while let Some((path, dir)) = stack.pop() {
            if !listed.insert(dir) {
                continue;
            }
            self.report.dirs += 1;
            let entries = match self.fs.read_dir(dir) {
                Ok(v) => v,
                Err(e) => {
                    self.report.note(&format!("read_dir of inode {dir}"), &e);
                    continue;
                }
            };
            for (i, e) in entries.iter().enumerate() {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                if self.report.entries >= self.budget.max_entries {
                    self.report.budget_exhausted = true;
                    return;
                }
                self.report.entries += 1;
                if i < self.budget.lookups_per_dir {
                    match self.fs.lookup(dir, &e.name) {
                        Ok(Some(_)) => {}
                        Ok(None) => self.report.lookup_misses += 1,
                        Err(err) => self.report.note(&format!("lookup in directory inode {dir}"), &err),
                    }
                }
                let child = path.as_ref().filter(|p| p.len() + e.name.len() < MAX_KEPT_PATH).map(|p| {
                    let mut c = p.clone();
                    c.push(b'/');
                    c.extend_from_slice(&e.name);
                    c
                });
                let st = match self.fs.stat(e.ino) {
                    Ok(st) => st,
                    Err(err) => {
                        self.report.note(&format!("stat of inode {}", e.ino), &err);
                        continue;
                    }
                };
                self.contents(&st);
                if st.file_type == FileType::Directory {
                    stack.push((child, e.ino));
                } else if st.file_type == FileType::Symlink {
                    if let Some(c) = child {
                        if self.symlink_paths.len() < self.budget.path_lookups {
                            self.symlink_paths.push(c);
                        }
                    }
                }
            }
        }
    }

    /// Reads an inode's contents and xattrs, once per inode.
    fn contents(&mut self, st: &Stat) {
        if !self.contents_seen.insert(st.ino) {
            return;
        }
        match self.fs.xattrs(st.ino) {
            Ok(v) => self.report.xattrs += v.len() as u64,
            Err(e) => self.report.note(&format!("xattrs of inode {}", st.ino), &e),
        }
        match st.file_type {
            FileType::Regular => {
                if let Err(e) = self.read_file(st) {
                    self.report.note(&format!("reading inode {}", st.ino), &e);
                }
            }
            FileType::Symlink => {
                self.report.symlinks += 1;
                if let Err(e) = self.fs.read_link(st.ino) {
                    self.report.note(&format!("read_link of inode {}", st.ino), &e);
                }
            }
            _ => {}
        }
    }

    fn read_file(&mut self, st: &Stat) -> Result<()> {
        if self.report.bytes_read >= self.budget.max_bytes {
            self.report.budget_exhausted = true;
            return Ok(());
        }
        self.report.files_read += 1;
        if st.size <= self.budget.read_all_limit {
            let v = self.fs.read_all(st.ino)?;
            self.report.bytes_read += v.len() as u64;
        } else {
            let end = st.size.min(self.budget.max_file_bytes);
            let mut buf = vec![0u8; self.budget.chunk.max(1)];
            let mut off = 0u64;
            while off < end {
                let n = self.fs.read(st.ino, off, &mut buf)?;
                if n == 0 {
                    break;
                }
                off += n as u64;
                self.report.bytes_read += n as u64;
            }
        }
        // Reads at odd offsets: the middle, the last byte, and just past the end.
        let mut small = [0u8; 100];
        for off in [st.size / 2, st.size.saturating_sub(1), st.size, st.size.saturating_add(4096)] {
            let n = self.fs.read(st.ino, off, &mut small)?;
            self.report.bytes_read += n as u64;
        }
        Ok(())
    }

    /// Resolves paths through symlinks (following them, as "/link/." does).
    fn symlinks(&mut self) {
        for p in std::mem::take(&mut self.symlink_paths) {
            let mut path = p.clone();
            path.extend_from_slice(b"/.");
            for q in [&p, &path] {
                match self.fs.lookup_path(q) {
                    // Missing targets, loops and over-long components (ENAMETOOLONG,
                    // as the kernel) are ordinary answers for a symlink.
                    Ok(_)
                    | Err(Error::NotFound(_))
                    | Err(Error::NotADirectory(_))
                    | Err(Error::SymlinkLoop(_))
                    | Err(Error::NameTooLong(_))
                    | Err(Error::Invalid(_)) => {}
                    Err(e) => self.report.note("lookup_path", &e),
                }
            }
        }
    }

    /// The public walk, stopped once it has visited as many entries as the budget allows.
    fn api_walk(&mut self) {
        let cap = self.budget.max_entries;
        let mut seen = 0u64;
        let r = self.fs.walk(ROOT_INO, &mut |_path, _st| {
            seen += 1;
            if seen > cap {
                return Err(Error::Invalid("walk budget exhausted".into()));
            }
            Ok(())
        });
        match r {
            Ok(()) => {}
            Err(Error::Invalid(m)) if m == "walk budget exhausted" => self.report.budget_exhausted = true,
            Err(e) => self.report.note("walk", &e),
        }
    }
}

/// Applies a fuzzer's bytes to a seed image: each 6-byte record is (offset: u32 LE,
/// op, value), the offset taken modulo the image size. Ops xor, set, add, or write
/// an interesting 16- or 32-bit value (0, 1, all ones, top bit, ...).
pub fn mutate(seed: &[u8], data: &[u8]) -> Vec<u8> {
    let mut img = seed.to_vec();
    if img.is_empty() {
        return img;
    }
    const INTERESTING: [u32; 8] = [0, 1, 0x7f, 0x80, 0xffff, 0x8000_0000, 0x7fff_ffff, 0xffff_ffff];
    for rec in data.chunks_exact(6) {
        let off = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]) as usize % img.len();
        let v = rec[5];
        match rec[4] % 6 {
            0 => img[off] ^= v.max(1),
            1 => img[off] = v,
            2 => img[off] = img[off].wrapping_add(v),
            3 => img[off] = img[off].wrapping_sub(v.max(1)),
            4 => put(&mut img, off, &(INTERESTING[v as usize % 8] as u16).to_le_bytes()),
            _ => put(&mut img, off, &INTERESTING[v as usize % 8].to_le_bytes()),
        }
    }
    img
}

fn put(img: &mut [u8], off: usize, bytes: &[u8]) {
    let n = bytes.len().min(img.len() - off);
    img[off..off + n].copy_from_slice(&bytes[..n]);
}

/// What the write script met: each step's outcome, in order.
#[derive(Debug, Default)]
pub struct ScriptReport {
    /// Steps that succeeded.
    pub ok: u64,
    /// Steps refused with an ordinary answer for that call (ENOENT, EEXIST, ENOSPC,
    /// ENOTEMPTY, ENOTDIR, EISDIR, EOPNOTSUPP, EROFS when the image opens only
    /// read-only, ...): nothing was changed.
    pub refused: u64,
    /// Steps that found the image corrupt (EUCLEAN).
    pub corrupt: u64,
    /// Errors no damaged image should cause (I/O, EBUSY, EPERM, ...).
    pub other: u64,
    /// The first few error messages, with the step that met them.
    pub messages: Vec<String>,
}

impl ScriptReport {
    fn note<T>(&mut self, step: &str, r: Result<T>) -> Option<T> {
        let kind = match r {
            Ok(v) => {
                self.ok += 1;
                return Some(v);
            }
            Err(ref e @ Error::Corrupt { .. }) => {
                self.corrupt += 1;
                format!("corrupt: {e}")
            }
            Err(
                ref e @ (Error::NotFound(_)
                | Error::Exists(_)
                | Error::NoSpace(_)
                | Error::NotEmpty(_)
                | Error::NotADirectory(_)
                | Error::IsADirectory(_)
                | Error::TooManyLinks(_)
                | Error::FileTooLarge(_)
                | Error::ReadOnly(_)
                // An immutable or append-only inode the image holds (EPERM).
                | Error::NotPermitted(_)
                // The script's own arguments are valid: EINVAL comes from what the
                // image holds (a name that now leads to a directory, say).
                | Error::Invalid(_)
                | Error::Unsupported { .. }),
            ) => {
                self.refused += 1;
                format!("refused: {e}")
            }
            Err(e) => {
                self.other += 1;
                format!("OTHER: {e}")
            }
        };
        if self.messages.len() < KEPT_MESSAGES {
            self.messages.push(format!("{step}: {kind}"));
        }
        None
    }

    /// The script's last step. A filesystem that met corruption halfway through an
    /// operation is in its error state (journal aborted): its sync fails with EIO
    /// by design, which counts with the corruption that caused it, not as an
    /// unexpected error.
    fn note_sync(&mut self, fs: &Filesystem) {
        match fs.sync() {
            Err(e @ Error::Io(_)) if fs.has_failed() => {
                self.corrupt += 1;
                if self.messages.len() < KEPT_MESSAGES {
                    self.messages.push(format!("sync: in the error state: {e}"));
                }
            }
            r => {
                self.note("sync", r);
            }
        }
    }

    /// Whether every step either succeeded or was refused in an ordinary way: the
    /// result must then be as sound (per e2fsck) as the input was.
    pub fn clean(&self) -> bool {
        self.corrupt == 0 && self.other == 0
    }
}

/// Entries a tree removal visits at most: a hostile image cannot make it long.
const MAX_REMOVED: usize = 600;

/// The fixed script of changes the write-path fuzz target and its replay run on an
/// image made by `fuzz/make_seeds.sh` (names it lacks are simply not found): create,
/// write, truncate, rename, unlink, setxattr and removing a tree, then a sync.
pub fn write_script(fs: &Filesystem) -> ScriptReport {
    use crate::ns::change::{Owner, SetAttr};
    let mut r = ScriptReport::default();
    let owner = Owner { uid: 0, gid: 0 };
    let root = ROOT_INO;
    let find = |path: &[u8]| fs.lookup_path(path);

    if let Some(st) = r.note("mkdir /fz", fs.mkdir(root, b"fz", 0o755, owner)) {
        if let Some(f) = r.note("create /fz/f", fs.create(st.ino, b"f", 0o644, owner)) {
            let data: Vec<u8> = (0..10_000u32).map(|i| (i * 13 % 251) as u8).collect();
            r.note("write /fz/f", fs.write(f.ino, 0, &data));
            r.note("write /fz/f far", fs.write(f.ino, 200 << 10, &data[..3000]));
            let shrink = SetAttr { size: Some(5000), ..SetAttr::default() };
            r.note("truncate /fz/f", fs.setattr(f.ino, &shrink));
            r.note("rename /fz/f /renamed", fs.rename(st.ino, b"f", root, b"renamed", 0));
        }
        for i in 0..24u32 {
            let name = format!("n{i:02}-{}", "y".repeat(40));
            if r.note("create in /fz", fs.create(st.ino, name.as_bytes(), 0o600, owner)).is_none() {
                break;
            }
        }
    }
    // Files that already exist: their extent trees and blocks are the image's.
    for (path, off) in [(&b"/medium"[..], 1000u64), (b"/sparse", 3 * 1024 + 17), (b"/small", 4096)] {
        if let Some(ino) = r.note("lookup", find(path)) {
            let step = format!("write {}", String::from_utf8_lossy(path));
            r.note(&step, fs.write(ino, off, b"written by the fuzz script"));
        }
    }
    if let Some(ino) = r.note("lookup /sparse", find(b"/sparse")) {
        let shrink = SetAttr { size: Some(100_000), ..SetAttr::default() };
        r.note("truncate /sparse", fs.setattr(ino, &shrink));
    }
    if let Some(ino) = r.note("lookup /attrs", find(b"/attrs")) {
        r.note("setxattr /attrs", fs.set_xattr(ino, b"user.fuzz", &[7u8; 300], 0));
        r.note("removexattr /attrs", fs.remove_xattr(ino, b"user.small"));
    }
    if let Some(ino) = r.note("lookup /medium", find(b"/medium")) {
        r.note("setxattr /medium", fs.set_xattr(ino, b"user.fuzz", b"value", 0));
    }
    if let Some(fz) = r.note("lookup /fz", find(b"/fz")) {
        r.note("rename /small /fz/small", fs.rename(root, b"small", fz, b"small", 0));
    }
    r.note("unlink /short-link", fs.unlink(root, b"short-link"));
    r.note("unlink /renamed", fs.unlink(root, b"renamed"));
    let mut budget = MAX_REMOVED;
    for name in [&b"big"[..], b"a"] {
        remove_tree(fs, root, name, &mut budget, &mut r);
    }
    r.note_sync(fs);
    r
}

/// Removes `parent/name` and everything under it, depth first, within `budget`
/// entries; errors are noted and the removal goes on with the next entry.
fn remove_tree(fs: &Filesystem, parent: u32, name: &[u8], budget: &mut usize, r: &mut ScriptReport) {
    if *budget == 0 {
        return;
    }
    *budget -= 1;
    let Some(Some(ino)) = r.note("lookup in tree", fs.lookup(parent, name)) else { return };
    let Some(st) = r.note("stat in tree", fs.stat(ino)) else { return };
    if st.file_type != FileType::Directory {
        r.note("unlink in tree", fs.unlink(parent, name));
        return;
    }
    if let Some(entries) = r.note("read_dir in tree", fs.read_dir(ino)) {
        for e in entries {
            if e.name != b"." && e.name != b".." {
                remove_tree(fs, ino, &e.name, budget, r);
            }
        }
    }
    r.note("rmdir in tree", fs.rmdir(parent, name));
}

/// The changes the bad-input test makes to every image of the e2fsprogs corpus that
/// opens read-write: a new directory with a written file in it, then the removal of
/// the first directory the root holds (other than lost+found), then a sync.
pub fn corpus_write_script(fs: &Filesystem) -> ScriptReport {
    use crate::ns::change::Owner;
    let mut r = ScriptReport::default();
    let owner = Owner { uid: 0, gid: 0 };
    if let Some(st) = r.note("mkdir /uext4-new", fs.mkdir(ROOT_INO, b"uext4-new", 0o755, owner)) {
        if let Some(f) = r.note("create /uext4-new/file", fs.create(st.ino, b"file", 0o644, owner)) {
            let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
            r.note("write /uext4-new/file", fs.write(f.ino, 0, &data));
        }
    }
    let victim = r.note("read_dir /", fs.read_dir(ROOT_INO)).and_then(|entries| {
        entries.into_iter().find(|e| {
            e.name != b"." && e.name != b".." && e.name != b"lost+found" && e.name != b"uext4-new"
                // 2 is EXT4_FT_DIR; images without the filetype feature say 0.
                && (e.file_type == 2 || fs.stat(e.ino).is_ok_and(|st| st.file_type == FileType::Directory))
        })
    });
    if let Some(v) = victim {
        let mut budget = MAX_REMOVED;
        remove_tree(fs, ROOT_INO, &v.name, &mut budget, &mut r);
    }
    r.note_sync(fs);
    r
}

/// The image a fuzz input stands for: a whole image (at least 2 KiB with the ext4
/// magic where the superblock keeps it), or a selector byte and edit records that
/// `mutate` applies to seed `selector % seeds.len()`.
pub fn image_for(seeds: &[Vec<u8>], data: &[u8]) -> Vec<u8> {
    let whole = data.len() >= 2048 && data.get(1024 + 0x38..1024 + 0x3A) == Some(&[0x53, 0xEF][..]);
    if whole || seeds.is_empty() {
        return data.to_vec();
    }
    let (sel, edits) = data.split_first().map(|(s, e)| (*s as usize, e)).unwrap_or((0, &[]));
    mutate(&seeds[sel % seeds.len()], edits)
}

/// Opens `image` read-write in memory and runs the write script on it. Returns the
/// open's error, or the script's report; and the image as it was left (after the
/// filesystem was dropped, so written back).
pub fn open_and_write_bytes(image: Vec<u8>, opts: Options) -> (Result<ScriptReport>, Vec<u8>) {
    let dev = Arc::new(MemDevice::new(image));
    let result = match Filesystem::open_device(dev.clone(), Options { read_only: false, ..opts }) {
        Ok(fs) => Ok(write_script(&fs)),
        Err(e) => Err(e),
    };
    (result, dev.contents())
}
