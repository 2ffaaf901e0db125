//! Seed 003's experiment (issue 18), workload `rmtree`: one directory of
//! 1,000,000 empty files (200,000 at `--quick`), created, then deleted in the
//! orders the seed compares, each deletion of a directory made afresh:
//!
//! - `create`: the files, one after another, in name order;
//! - `readdir-order`: readdir the directory and unlink each name in the order
//!   it came (what a plain `rm` of each name does: hash order in an indexed
//!   directory, which jumps about the inode table);
//! - `inode-order`: the seed's `rm_all`: take the entries in chunks of 50,000,
//!   sort each chunk by inode number, unlink it;
//! - `remove_tree`: `FsOps::remove_tree`: the library's `Filesystem::remove_tree`
//!   (inode order, seed 003's option 3); on uext4's mounts `uext4 rm -r`, which
//!   has the daemon run it; on the kernel and fuse2fs GNU `rm -rf`, which sorts
//!   large directories by inode;
//! - `hash-goal-readdir-order`: readdir-order deletion of a directory made
//!   with `hash_goal=on` (uext4's library only: the target is reopened with it).
//!
//! uext4's cache is bounded well below the inode table the files occupy
//! (`cache_mb`), so that order decides how often an inode-table block is read
//! and written again. Each deletion phase starts cold (the target restarted)
//! and times only the deletion; the re-creation before it is untimed.

use crate::ops::FsOps;
use crate::workload::{tiny, Phases, Workload};
use crate::BenchError;
use std::io;
use std::path::Path;

pub struct RmTree;

/// The directory every phase makes and deletes.
const DIR: &str = "big";

/// The seed's rm_all reads this many entries before it sorts and unlinks them.
const RM_ALL_CHUNK: usize = 50_000;

impl RmTree {
    fn files(quick: bool) -> u64 {
        match (tiny(), quick) {
            (true, _) => 2_000,
            (false, true) => 200_000,
            (false, false) => 1_000_000,
        }
    }

    /// uext4's cache bound: the files' inodes take 256 bytes each, 51 MB at
    /// the quick size (3x the cache) and 256 MB at the full one (4x).
    fn cache_mb(quick: bool) -> u64 {
        match (tiny(), quick) {
            (true, _) => 1,
            (false, true) => 16,
            (false, false) => 64,
        }
    }
}

fn name(i: u64) -> String {
    format!("{DIR}/f{i:07}")
}

fn create_all(fs: &dyn FsOps, n: u64) -> io::Result<()> {
    fs.mkdir(DIR, 0o755)?;
    (0..n).try_for_each(|i| fs.create(&name(i), 0o644).map(drop))
}

fn delete_in_readdir_order(fs: &dyn FsOps) -> io::Result<()> {
    for entry in fs.read_dir(DIR)? {
        fs.unlink(&format!("{DIR}/{entry}"))?;
    }
    fs.rmdir(DIR)
}

/// rm_all: the entries as readdir gives them, each chunk of `RM_ALL_CHUNK`
/// sorted by inode number and unlinked before the next chunk is taken.
fn delete_in_inode_order(fs: &dyn FsOps) -> io::Result<()> {
    let entries = fs.read_dir_inodes(DIR)?;
    for chunk in entries.chunks(RM_ALL_CHUNK) {
        let mut chunk = chunk.to_vec();
        chunk.sort_unstable_by_key(|(_, ino)| *ino);
        for (entry, _) in chunk {
            fs.unlink(&format!("{DIR}/{entry}"))?;
        }
    }
    fs.rmdir(DIR)
}

impl Workload for RmTree {
    fn name(&self) -> &'static str {
        "rmtree"
    }
    fn about(&self) -> &'static str {
        "seed 003: a directory of empty files created, then deleted in readdir order, in inode order (rm_all), \
         by remove_tree (uext4 rm -r on uext4's mounts, GNU rm -rf on the kernel's), and in readdir order when made with hash_goal=on (library)"
    }
    fn size(&self, quick: bool) -> String {
        format!(
            "{} empty files in one directory per phase; uext4 with cache_mb={} (the files' inodes are {} MB)",
            Self::files(quick),
            Self::cache_mb(quick),
            Self::files(quick) * 256 / 1_000_000
        )
    }
    fn image_mb(&self, quick: bool) -> u64 {
        // mkfs's default of one inode per 16 KiB: 262,144 inodes in 4 GiB,
        // 1,048,576 in 16 GiB. The files are empty: the image stays sparse.
        match (tiny(), quick) {
            (true, _) => 256,
            (false, true) => 4 << 10,
            (false, false) => 16 << 10,
        }
    }
    fn uext4_defaults(&self, quick: bool) -> Vec<(String, String)> {
        vec![("cache_mb".into(), Self::cache_mb(quick).to_string())]
    }
    fn run(&self, quick: bool, _input: &Path, phases: &mut dyn Phases) -> Result<(), BenchError> {
        let n = Self::files(quick);
        phases.timed("create", n, &mut |fs| create_all(fs, n))?;
        phases.restart()?;
        phases.timed("readdir-order", n, &mut |fs| delete_in_readdir_order(fs))?;

        phases.untimed(&mut |fs| create_all(fs, n))?;
        phases.restart()?;
        phases.timed("inode-order", n, &mut |fs| delete_in_inode_order(fs))?;

        phases.untimed(&mut |fs| create_all(fs, n))?;
        phases.restart()?;
        phases.timed("remove_tree", n, &mut |fs| fs.remove_tree(DIR).map(drop))?;

        // Only a target that takes hash_goal runs the last phase.
        if phases.reopen_with(&[("hash_goal", "on")])? {
            phases.untimed(&mut |fs| create_all(fs, n))?;
            phases.restart()?;
            phases.timed("hash-goal-readdir-order", n, &mut |fs| delete_in_readdir_order(fs))?;
        }
        Ok(())
    }
}
