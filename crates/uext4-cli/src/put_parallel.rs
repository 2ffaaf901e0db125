//! `uext4 cp -r -j N HOSTDIR IMAGE:/path`: copying a host tree in with N threads,
//! so populating an image gets what pdirops allows (issue 16).
//!
//! Three steps, each leaving what `-j 1` (`cmd_put::Importer::copy`) leaves:
//! 1. every directory is made, parents first, in the order the serial copy
//!    makes them (one thread: they are few, and each child needs its parent);
//! 2. every other node — files with their data, symlinks, devices, fifos — is
//!    copied by N threads taking work from one list; the names of one
//!    multiply-linked host inode form one piece of work, so its first name is
//!    made before the others are linked to it;
//! 3. the directories' attributes and times, deepest first, once nothing is
//!    written into them any more.
//!
//! Names, content and metadata come out equal to the serial copy's; inode
//! numbers (and so the directories' hash-ordered blocks) may differ. The first
//! error stops every thread and is the one reported.

use crate::cmd_put::{host_children, host_error, Importer};
use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use uext4::{Error, Filesystem, Owner, Result};

/// One name to make: the host path, and where in the image.
struct Node {
    src: PathBuf,
    parent: u32,
    name: Vec<u8>,
}

/// Copies host directory `src` to `name` in image directory `parent` with
/// `jobs` threads; returns the files and bytes copied.
///
/// # Errors
/// The first error any thread met (host I/O, the image's refusals).
pub fn copy_tree(fs: &Filesystem, src: &Path, parent: u32, name: &[u8], jobs: usize) -> Result<(u64, u64)> {
    // SAFETY: geteuid and getegid have no preconditions.
    let caller = unsafe { Owner { uid: libc::geteuid(), gid: libc::getegid() } };
    let mut serial =
        Importer { fs, recursive: true, links: HashMap::new(), files: 0, bytes: 0, progress: None, buf: Vec::new() };

    // 1. Directories, parents first; the other names collected as work.
    let mut dirs: Vec<(PathBuf, std::fs::Metadata, u32)> = Vec::new();
    let mut work: Vec<Vec<Node>> = Vec::new();
    let mut linked: HashMap<(u64, u64), usize> = HashMap::new();
    let mut pending = vec![Node { src: src.to_path_buf(), parent, name: name.to_vec() }];
    while let Some(node) = pending.pop() {
        let md = std::fs::symlink_metadata(&node.src).map_err(|e| host_error(&node.src, e))?;
        if !md.is_dir() {
            if md.nlink() > 1 {
                let key = (md.dev(), md.ino());
                match linked.get(&key) {
                    Some(&i) => work[i].push(node),
                    None => {
                        linked.insert(key, work.len());
                        work.push(vec![node]);
                    }
                }
            } else {
                work.push(vec![node]);
            }
            continue;
        }
        let owner = Owner { uid: md.uid(), gid: md.gid() };
        let ino = fs.mkdir(node.parent, &node.name, (md.mode() & 0o7777) as u16, owner)?.ino;
        // Reversed onto the stack, so children come off it in the serial order.
        for child in host_children(&node.src)?.into_iter().rev() {
            pending.push(Node { src: node.src.join(&child), parent: ino, name: child.as_bytes().to_vec() });
        }
        dirs.push((node.src, md, ino));
    }

    // 2. Everything else, on `jobs` threads.
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    let totals = Mutex::new((0u64, 0u64));
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| {
                let _caller = fs.acting_as(caller);
                let mut im = Importer {
                    fs,
                    recursive: true,
                    links: HashMap::new(),
                    files: 0,
                    bytes: 0,
                    progress: None,
                    buf: Vec::new(),
                };
                while !failed.load(Ordering::Relaxed) {
                    let Some(names) = work.get(next.fetch_add(1, Ordering::Relaxed)) else { break };
                    for n in names {
                        if let Err(e) = im.copy(&n.src, n.parent, &n.name) {
                            failed.store(true, Ordering::Relaxed);
                            first_error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                            break;
                        }
                    }
                }
                let mut t = totals.lock().unwrap_or_else(|p| p.into_inner());
                t.0 += im.files;
                t.1 += im.bytes;
            });
        }
    });
    if let Some(e) = first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }

    // 3. Directory attributes and times, deepest first.
    for (path, md, ino) in dirs.iter().rev() {
        serial.finish(path, md, *ino)?;
    }
    let (files, bytes) = totals.into_inner().unwrap_or_else(|p| p.into_inner());
    Ok((files + serial.files, bytes))
}
