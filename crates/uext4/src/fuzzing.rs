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
