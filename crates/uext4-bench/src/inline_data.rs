//! Seed 004's experiments (issue 19): small files and directories kept in
//! their inode (`inline_data`) against the same in blocks. Every image here
//! is made with `-O inline_data`; the comparison is between targets:
//! `uext4` against `uext4:inline_data=off`, and `kernel` against
//! `kernel:features=^inline_data` (the image made without the feature).
//!
//! - `inline-find`: a tree shaped like a source tree, most directories holding
//!   a few names; cold, `find -name a` (read every directory, match no name),
//!   and cold again, a lookup of the absent name `a` in every directory.
//! - `inline-find-small`: the same phases on a tree whose every directory fits
//!   a 256-byte inode (0..=5 entries: the seed's "most of the dirs are
//!   inlined" case; `TreeShape::AllInline`).
//! - `inline-postmark`: postmark-like: files of 11..=500 bytes over many
//!   subdirectories, created, then transactions (a read or an append, then a
//!   create or a delete), then every file deleted; 1,024-byte inodes, so that
//!   files of ~500 bytes can be inline.
//! - `inline-fsmark`: 256-byte files created, written and fsync'd one after
//!   another (fs_mark -s 256 -S 1); 1,024-byte inodes.
//! - `inline-space`: the tree of `inline-find`, created; the image's bytes in
//!   use afterwards (`Workload::space_phase`).

use crate::ops::FsOps;
use crate::workload::{pattern, tiny, Phases, Rng, Workload};
use crate::BenchError;
use std::io;
use std::path::Path;

/// The feature on every image of these workloads; targets turn it off with
/// `features=^inline_data`.
fn with_inline_data(inode_size: Option<u32>) -> Vec<String> {
    let mut args = vec!["-O".to_string(), "inline_data".to_string()];
    if let Some(size) = inode_size {
        args.extend(["-I".to_string(), size.to_string()]);
    }
    args
}

/// Seed 004's fsstats of a home directory (13,671 directories, 11.6 entries
/// on average): per range of entries, the directories in it, in thousandths.
const SEED_DIR_SIZES: [(u64, u64, u64); 8] =
    [(0, 1, 380), (2, 3, 164), (4, 7, 166), (8, 15, 137), (16, 31, 82), (32, 63, 41), (64, 127, 17), (128, 255, 13)];

/// How many files a directory of the tree holds: a range drawn with the seed's
/// weights, a count drawn evenly within it.
fn files_in_a_directory(rng: &mut Rng) -> u64 {
    let mut pick = rng.below(1000);
    for (low, high, weight) in SEED_DIR_SIZES {
        if pick < weight {
            return low + rng.below(high - low + 1);
        }
        pick -= weight;
    }
    0
}

/// Which directories a `SmallTree` has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TreeShape {
    /// Each directory under a random earlier one, holding as many files as
    /// seed 004's fsstats histogram gives (`SEED_DIR_SIZES`: over half hold
    /// under 4 entries, 29% hold 8 or more and live in blocks either way); file
    /// sizes as in a source tree: one in 25 under 60 bytes, one in 25 60..500,
    /// most a few KiB, one in twenty up to 64 KiB.
    SeedHistogram,
    /// Every directory small enough to stay in a 256-byte inode: at most
    /// `INLINE_DIR_SUBDIRS` subdirectories and `INLINE_DIR_ENTRIES` names in
    /// all; a third of the files under 60 bytes (in i_block alone), a third of
    /// 60..128 (inline with the system.data xattr), a third 1..8 KiB.
    AllInline,
}

/// At most this many names in an `AllInline` directory. A 256-byte inode with
/// mkfs's 32-byte i_extra_isize holds an inline directory in i_block (a 4-byte
/// parent, then 56 bytes of entries) and in the system.data xattr's value (96
/// bytes of in-inode xattr space less the 4-byte magic, the 4-byte end and the
/// 20-byte entry named "data": 68 bytes). An entry is 8 bytes and its name
/// rounded up to 4: `fNNNNNN.c` takes 20, `dNNNNN` 16; entries do not straddle
/// the two parts, so the worst case, all files, is 2 in i_block (40 of 56) and
/// 3 in the xattr (60 of 68): 5.
const INLINE_DIR_ENTRIES: u64 = 5;
/// At most this many subdirectories in an `AllInline` directory, so that a
/// directory full of subdirectories still leaves room for a file or two.
const INLINE_DIR_SUBDIRS: u64 = 3;

/// A source-like tree of directories mostly small, nested under `src`, shaped
/// by `TreeShape`. Directories are `dNNNNN`, files `fNNNNNN.c`: a walk knows
/// which is which by the name, as find knows it by d_type, without a stat.
struct SmallTree {
    dirs: u64,
    shape: TreeShape,
}

enum Entry {
    Dir(String),
    File(String, usize),
}

impl SmallTree {
    fn for_size(quick: bool, shape: TreeShape) -> SmallTree {
        let dirs = match (tiny(), quick) {
            (true, _) => 60,
            (false, true) => 2_000,
            (false, false) => 13_000,
        };
        SmallTree { dirs, shape }
    }

    /// The tree's directories and files, each after its directory. The seed
    /// histogram's draws are those of the first runs (its results stay
    /// comparable); `AllInline` draws its own.
    fn entries(&self) -> Vec<Entry> {
        let mut rng = Rng::new(0x004_5eed);
        let mut dirs = vec![String::from("src")];
        let mut subdirs = vec![0u64];
        // AllInline: the directories that may take another subdirectory.
        let mut open = vec![0usize];
        let mut out = vec![Entry::Dir("src".into())];
        for d in 1..self.dirs {
            let parent = match self.shape {
                TreeShape::SeedHistogram => rng.below(dirs.len() as u64) as usize,
                TreeShape::AllInline => {
                    let k = rng.below(open.len() as u64) as usize;
                    let parent = open[k];
                    if subdirs[parent] + 1 == INLINE_DIR_SUBDIRS {
                        open.swap_remove(k);
                    }
                    open.push(dirs.len());
                    parent
                }
            };
            subdirs[parent] += 1;
            let dir = format!("{}/d{d:05}", dirs[parent]);
            out.push(Entry::Dir(dir.clone()));
            dirs.push(dir);
            subdirs.push(0);
        }
        let mut f = 0u64;
        for (dir, &subdirs) in dirs.iter().zip(&subdirs) {
            let files = match self.shape {
                TreeShape::SeedHistogram => files_in_a_directory(&mut rng),
                TreeShape::AllInline => rng.below(INLINE_DIR_ENTRIES - subdirs + 1),
            };
            for _ in 0..files {
                let len = match self.shape {
                    TreeShape::SeedHistogram => match rng.below(25) {
                        0 => 1 + rng.below(59),
                        1 => 60 + rng.below(440),
                        _ if rng.below(20) == 0 => rng.below(64 << 10),
                        _ => 500 + rng.below(8 << 10),
                    },
                    TreeShape::AllInline => match rng.below(3) {
                        0 => 1 + rng.below(59),
                        1 => 60 + rng.below(68),
                        _ => (1 << 10) + rng.below(7 << 10),
                    },
                };
                out.push(Entry::File(format!("{dir}/f{f:06}.c"), len as usize));
                f += 1;
            }
        }
        out
    }

    fn build(&self, fs: &dyn FsOps) -> io::Result<()> {
        for (i, entry) in self.entries().into_iter().enumerate() {
            match entry {
                Entry::Dir(path) => fs.mkdir(&path, 0o755)?,
                Entry::File(path, len) => {
                    let mut file = fs.create(&path, 0o644)?;
                    if len > 0 {
                        file.write_at(0, &pattern(i as u64, len))?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// `find DIR -name a`: every directory read, every name compared, no match.
fn find_name(fs: &dyn FsOps, dir: &str, wanted: &str) -> io::Result<u64> {
    let mut found = 0;
    for entry in fs.read_dir(dir)? {
        if entry == wanted {
            found += 1;
        }
        if entry.starts_with('d') {
            found += find_name(fs, &format!("{dir}/{entry}"), wanted)?;
        }
    }
    Ok(found)
}

fn dir_paths(tree: &SmallTree) -> Vec<String> {
    tree.entries()
        .into_iter()
        .filter_map(|e| match e {
            Entry::Dir(path) => Some(path),
            Entry::File(..) => None,
        })
        .collect()
}

/// `inline-find` (`TreeShape::SeedHistogram`) and `inline-find-small`
/// (`TreeShape::AllInline`).
pub struct InlineFind(pub TreeShape);

impl Workload for InlineFind {
    fn name(&self) -> &'static str {
        match self.0 {
            TreeShape::SeedHistogram => "inline-find",
            TreeShape::AllInline => "inline-find-small",
        }
    }
    fn about(&self) -> &'static str {
        match self.0 {
            TreeShape::SeedHistogram => {
                "seed 004: a source-like tree of small directories; cold, find -name a (read every directory), \
                 then cold, a lookup of the absent name in every directory"
            }
            TreeShape::AllInline => {
                "seed 004: inline-find on a source-like tree whose every directory holds 0-5 entries \
                 (all fit a 256-byte inode)"
            }
        }
    }
    fn size(&self, quick: bool) -> String {
        let tree = SmallTree::for_size(quick, self.0);
        let files = tree.entries().len() as u64 - tree.dirs;
        format!("{} directories, {files} files; image made with -O inline_data", tree.dirs)
    }
    fn image_mb(&self, quick: bool) -> u64 {
        if quick || tiny() || self.0 == TreeShape::AllInline {
            1024
        } else {
            4096
        }
    }
    fn mkfs_args(&self, _quick: bool) -> Vec<String> {
        with_inline_data(None)
    }
    fn run(&self, quick: bool, _input: &Path, phases: &mut dyn Phases) -> Result<(), BenchError> {
        let tree = SmallTree::for_size(quick, self.0);
        let dirs = dir_paths(&tree);
        phases.untimed(&mut |fs| tree.build(fs))?;
        phases.restart()?;
        phases.timed("find -name a", dirs.len() as u64, &mut |fs| match find_name(fs, "src", "a")? {
            0 => Ok(()),
            n => Err(io::Error::other(format!("find -name a found {n} names"))),
        })?;
        phases.restart()?;
        phases.timed("lookup a", dirs.len() as u64, &mut |fs| {
            for dir in &dirs {
                match fs.stat(&format!("{dir}/a")) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                    Ok(_) => return Err(io::Error::other(format!("{dir}/a exists"))),
                }
            }
            Ok(())
        })
    }
}

pub struct InlineSpace;

impl Workload for InlineSpace {
    fn name(&self) -> &'static str {
        "inline-space"
    }
    fn about(&self) -> &'static str {
        "seed 004: the source-like tree of inline-find created; the image's bytes in use afterwards"
    }
    fn size(&self, quick: bool) -> String {
        InlineFind(TreeShape::SeedHistogram).size(quick)
    }
    fn image_mb(&self, quick: bool) -> u64 {
        InlineFind(TreeShape::SeedHistogram).image_mb(quick)
    }
    fn mkfs_args(&self, _quick: bool) -> Vec<String> {
        with_inline_data(None)
    }
    fn space_phase(&self) -> Option<&'static str> {
        Some("create")
    }
    fn run(&self, quick: bool, _input: &Path, phases: &mut dyn Phases) -> Result<(), BenchError> {
        let tree = SmallTree::for_size(quick, TreeShape::SeedHistogram);
        let count = tree.entries().len() as u64;
        phases.timed("create", count, &mut |fs| tree.build(fs))
    }
}

/// Postmark's shape: (files, subdirectories, transactions).
fn postmark_shape(quick: bool) -> (u64, u64, u64) {
    match (tiny(), quick) {
        (true, _) => (300, 10, 300),
        (false, true) => (10_000, 100, 10_000),
        (false, false) => (50_000, 500, 50_000),
    }
}

const POSTMARK_MIN: u64 = 11;
const POSTMARK_MAX: u64 = 500;
/// An append adds 1..=this many bytes (postmark's read/write block is 512).
const POSTMARK_APPEND: u64 = 100;

pub struct InlinePostmark;

/// The files alive during the run: each slot's path and size (None: deleted).
struct PostmarkPool {
    files: Vec<Option<(String, usize)>>,
    subdirs: u64,
    next: u64,
}

impl PostmarkPool {
    fn create(&mut self, fs: &dyn FsOps, rng: &mut Rng) -> io::Result<()> {
        let n = self.next;
        self.next += 1;
        let path = format!("s{:03}/p{n:07}", rng.below(self.subdirs));
        let len = (POSTMARK_MIN + rng.below(POSTMARK_MAX - POSTMARK_MIN + 1)) as usize;
        fs.create(&path, 0o644)?.write_at(0, &pattern(n, len))?;
        self.files.push(Some((path, len)));
        Ok(())
    }

    /// A random live file (there is always one: deletions never take the last).
    fn pick(&self, rng: &mut Rng) -> usize {
        let start = rng.below(self.files.len() as u64) as usize;
        (0..self.files.len()).map(|k| (start + k) % self.files.len()).find(|&k| self.files[k].is_some()).unwrap_or(0)
    }

    fn live(&self) -> usize {
        self.files.iter().filter(|f| f.is_some()).count()
    }
}

impl Workload for InlinePostmark {
    fn name(&self) -> &'static str {
        "inline-postmark"
    }
    fn about(&self) -> &'static str {
        "seed 004: postmark-like: files of 11-500 bytes over many subdirectories created, then transactions \
         (read or append, then create or delete), then all deleted; 1,024-byte inodes"
    }
    fn size(&self, quick: bool) -> String {
        let (files, subdirs, transactions) = postmark_shape(quick);
        format!(
            "{files} files of {POSTMARK_MIN}-{POSTMARK_MAX} bytes in {subdirs} subdirectories, {transactions} \
             transactions (appends of 1-{POSTMARK_APPEND} bytes); -O inline_data -I 1024"
        )
    }
    fn image_mb(&self, quick: bool) -> u64 {
        if quick || tiny() {
            1024
        } else {
            2048
        }
    }
    fn mkfs_args(&self, _quick: bool) -> Vec<String> {
        with_inline_data(Some(1024))
    }
    fn run(&self, quick: bool, _input: &Path, phases: &mut dyn Phases) -> Result<(), BenchError> {
        let (files, subdirs, transactions) = postmark_shape(quick);
        let mut pool = PostmarkPool { files: Vec::new(), subdirs, next: 0 };
        let mut rng = Rng::new(0x9057_3a4c);
        phases.untimed(&mut |fs| (0..subdirs).try_for_each(|s| fs.mkdir(&format!("s{s:03}"), 0o755)))?;
        phases.timed("create", files, &mut |fs| (0..files).try_for_each(|_| pool.create(fs, &mut rng)))?;
        phases.timed("transactions", transactions, &mut |fs| {
            let mut buf = vec![0u8; 4096];
            for _ in 0..transactions {
                let k = pool.pick(&mut rng);
                let Some((path, len)) = pool.files[k].as_mut() else { continue };
                let mut file = fs.open(path)?;
                if rng.below(2) == 0 {
                    let mut got = 0;
                    while got < *len {
                        let n = file.read_at(got as u64, &mut buf[got..*len])?;
                        if n == 0 {
                            return Err(io::Error::other(format!("{path} ends at {got} of {len} bytes")));
                        }
                        got += n;
                    }
                } else {
                    let add = (1 + rng.below(POSTMARK_APPEND)) as usize;
                    file.write_at(*len as u64, &pattern(k as u64, add))?;
                    *len += add;
                }
                drop(file);
                if rng.below(2) == 0 || pool.live() < 2 {
                    pool.create(fs, &mut rng)?;
                } else {
                    let k = pool.pick(&mut rng);
                    if let Some((path, _)) = pool.files[k].take() {
                        fs.unlink(&path)?;
                    }
                }
            }
            Ok(())
        })?;
        let live = pool.live() as u64;
        phases.timed("delete", live, &mut |fs| {
            pool.files.iter_mut().filter_map(|f| f.take()).try_for_each(|(path, _)| fs.unlink(&path))
        })
    }
}

pub struct InlineFsmark;

impl InlineFsmark {
    fn files(quick: bool) -> u64 {
        match (tiny(), quick) {
            (true, _) => 50,
            (false, true) => 1_000,
            (false, false) => 10_000,
        }
    }
}

const FSMARK_FILE: usize = 256;

impl Workload for InlineFsmark {
    fn name(&self) -> &'static str {
        "inline-fsmark"
    }
    fn about(&self) -> &'static str {
        "seed 004: fs_mark -s 256 -S 1: 256-byte files created, written and fsync'd one after another; 1,024-byte inodes"
    }
    fn size(&self, quick: bool) -> String {
        format!("{} files of {FSMARK_FILE} bytes, each fsync'd; -O inline_data -I 1024", Self::files(quick))
    }
    fn image_mb(&self, _quick: bool) -> u64 {
        512
    }
    fn mkfs_args(&self, _quick: bool) -> Vec<String> {
        with_inline_data(Some(1024))
    }
    fn run(&self, quick: bool, _input: &Path, phases: &mut dyn Phases) -> Result<(), BenchError> {
        let n = Self::files(quick);
        phases.untimed(&mut |fs| fs.mkdir("fsmark", 0o755))?;
        phases.timed("create+fsync", n, &mut |fs| {
            for i in 0..n {
                let mut file = fs.create(&format!("fsmark/f{i:06}"), 0o644)?;
                file.write_at(0, &pattern(i, FSMARK_FILE))?;
                file.fsync()?;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_small_tree_puts_every_entry_under_an_earlier_directory() {
        let tree = SmallTree { dirs: 200, shape: TreeShape::SeedHistogram };
        let mut dirs = std::collections::HashSet::new();
        let (mut tiny_files, mut files) = (0, 0);
        for e in tree.entries() {
            let path = match &e {
                Entry::Dir(p) | Entry::File(p, _) => p.clone(),
            };
            if let Some((parent, _)) = path.rsplit_once('/') {
                assert!(dirs.contains(parent), "{path} comes before its directory");
            }
            match e {
                Entry::Dir(p) => {
                    // The root is src; below it, a walk tells directories by their d.
                    assert!(p == "src" || p.rsplit('/').next().unwrap().starts_with('d'), "{p}");
                    dirs.insert(p);
                }
                Entry::File(p, len) => {
                    assert!(p.rsplit('/').next().unwrap().starts_with('f'));
                    files += 1;
                    tiny_files += usize::from(len < 60);
                }
            }
        }
        assert_eq!(dirs.len(), 200);
        // Some files small enough for i_block alone, most not.
        assert!(tiny_files > 0 && tiny_files < files / 10, "{tiny_files} of {files}");
    }

    /// Bytes an inline directory's entries take, in the kernel's layout: 8 and
    /// the name rounded up to 4 each.
    fn entry_bytes(name: &str) -> usize {
        8 + name.len().div_ceil(4) * 4
    }

    #[test]
    fn every_directory_of_the_all_inline_tree_fits_a_256_byte_inode() {
        let tree = SmallTree { dirs: 2_000, shape: TreeShape::AllInline };
        let mut names: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        let (mut files, mut inline_files, mut nested) = (0, 0, 0);
        for e in tree.entries() {
            let (path, len) = match e {
                Entry::Dir(p) => {
                    names.entry(p.clone()).or_default();
                    (p, None)
                }
                Entry::File(p, len) => (p, Some(len)),
            };
            if let Some(len) = len {
                files += 1;
                inline_files += usize::from(len <= 128);
            }
            if let Some((parent, name)) = path.rsplit_once('/') {
                names.get_mut(parent).unwrap_or_else(|| panic!("{path} before its directory")).push(name.into());
                nested += usize::from(parent.contains('/'));
            }
        }
        assert_eq!(names.len(), 2_000);
        for (dir, entries) in &names {
            assert!(entries.len() as u64 <= INLINE_DIR_ENTRIES, "{dir}: {entries:?}");
            // First fit of the entries, in creation order, into i_block's 56
            // bytes after the parent, then into the xattr's 68.
            let (mut in_block, mut in_xattr) = (0, 0);
            for name in entries {
                let len = entry_bytes(name);
                if in_xattr == 0 && in_block + len <= 56 {
                    in_block += len;
                } else {
                    in_xattr += len;
                }
            }
            assert!(in_xattr <= 68, "{dir}: {entries:?}");
        }
        // Nested like a source tree, not a flat fan; some files inline, most
        // of the rest in blocks.
        assert!(nested > 1_500, "{nested}");
        assert!(inline_files > files / 2 && inline_files < files * 3 / 4, "{inline_files} of {files}");
    }
}
