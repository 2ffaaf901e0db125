//! `uext4 cp -r -j N HOSTDIR IMAGE:/path`: copying a host tree in with N threads,
//! so populating an image gets what pdirops allows (issue 16).
//!
//! The calling thread walks the host tree and makes every directory, parents
//! first, in the order the serial copy (`cmd_put::Importer::copy`) makes them;
//! as soon as a directory is made, its other names (files with their data,
//! symlinks, devices, fifos) go to N copying threads in batches of at most
//! `BATCH` names. The copiers start with the walk, not after it, so the walk's
//! directory reads and `lstat`s overlap the copying, and each name's metadata
//! from the walk is passed on rather than read again.
//!
//! A copier takes a batch of a directory no other copier is working in when
//! the queue holds one: while a new directory is linear its changes take its
//! lock exclusively, and two copiers filling one such directory would take
//! turns. A tree with one huge directory still gets all copiers in it (it is
//! indexed after its first block, and then pdirops lets them go side by side).
//!
//! Names of a multiply-linked host inode are left to the end and made by the
//! calling thread, in walk order, the first one copied and the others linked
//! to it (which name comes first may differ from the serial copy's depth-first
//! order; the names, content and links do not). Last, the directories'
//! attributes and times, deepest first, once nothing is written into them.
//!
//! Names, content and metadata come out equal to the serial copy's; inode
//! numbers (and so the directories' hash-ordered blocks) may differ. The first
//! error stops the walk and every copier and is the one reported.

use crate::cmd_put::{host_children, host_error, Importer};
use std::collections::VecDeque;
use std::fs::Metadata;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use uext4::{Error, Filesystem, Owner, Result};

/// Names per batch: small enough that a directory of a thousand names is
/// shared out, large enough that taking a batch costs nothing beside copying it.
const BATCH: usize = 128;
/// How far into the queue a copier looks for a directory nobody works in.
const SCAN: usize = 64;
/// Batches the walk may get ahead of the copiers by: it is much faster than
/// they are, and the queue's memory stays bounded for any tree (about 200
/// bytes a name, so a few tens of MiB).
const MAX_QUEUED: usize = 1024;

/// One name to make: the host path and its metadata, and where in the image.
struct Node {
    src: PathBuf,
    md: Metadata,
    parent: u32,
    name: Vec<u8>,
}

/// Names of one image directory, in the serial copy's order.
struct Batch {
    dir: u32,
    nodes: Vec<Node>,
}

struct Queue {
    batches: VecDeque<Batch>,
    /// Directories copiers are working in now (one entry per copier).
    busy: Vec<u32>,
    /// The walk has put in everything it will.
    walked: bool,
}

/// What the walk and the copiers share.
struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when a batch is queued, the walk ends or a copy fails.
    more: Condvar,
    /// Signalled when a copier takes a batch or a copy fails.
    room: Condvar,
    failed: AtomicBool,
    first_error: Mutex<Option<Error>>,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn new() -> Shared {
        Shared {
            queue: Mutex::new(Queue { batches: VecDeque::new(), busy: Vec::new(), walked: false }),
            more: Condvar::new(),
            room: Condvar::new(),
            failed: AtomicBool::new(false),
            first_error: Mutex::new(None),
        }
    }

    fn fail(&self, e: Error) {
        locked(&self.first_error).get_or_insert(e);
        self.stop();
    }

    /// Stops the walk and every copier, waking any that wait.
    fn stop(&self) {
        self.failed.store(true, Ordering::Relaxed);
        // Taken so that no waiter checks `failed` and sleeps after this wakes it.
        drop(locked(&self.queue));
        self.more.notify_all();
        self.room.notify_all();
    }

    /// Queues `batch`, first waiting while the queue is full (unless a copy failed).
    fn put(&self, batch: Batch) {
        let mut q = locked(&self.queue);
        while q.batches.len() >= MAX_QUEUED && !self.failed.load(Ordering::Relaxed) {
            q = self.room.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        q.batches.push_back(batch);
        drop(q);
        self.more.notify_one();
    }

    fn walk_done(&self) {
        locked(&self.queue).walked = true;
        self.more.notify_all();
    }

    /// The next batch, from a directory nobody works in if the queue's first
    /// `SCAN` hold one; None once the walk is over and the queue empty, or
    /// after a failure.
    fn take(&self) -> Option<Batch> {
        let mut q = locked(&self.queue);
        loop {
            if self.failed.load(Ordering::Relaxed) {
                return None;
            }
            let free = q.batches.iter().take(SCAN).position(|b| !q.busy.contains(&b.dir));
            if let Some(batch) = q.batches.remove(free.unwrap_or(0)) {
                q.busy.push(batch.dir);
                drop(q);
                self.room.notify_one();
                return Some(batch);
            }
            if q.walked {
                return None;
            }
            q = self.more.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn done_with(&self, dir: u32) {
        let mut q = locked(&self.queue);
        if let Some(i) = q.busy.iter().position(|&d| d == dir) {
            q.busy.swap_remove(i);
        }
    }
}

/// Held by the walk and by each copier: one that ends by a panic (an image with
/// errors=panic does that on purpose) stops the others, who would otherwise wait
/// for batches or for room forever while the scope waits for them. The walk's
/// end, however it comes, also tells the copiers no more batches will come.
struct Ends<'a> {
    shared: &'a Shared,
    walk: bool,
}

impl Drop for Ends<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.shared.stop();
        }
        if self.walk {
            self.shared.walk_done();
        }
    }
}

/// Copies host directory `src` to `name` in image directory `parent` with
/// `jobs` copying threads; returns the files and bytes copied, and how many
/// host extended attributes the image did not take.
///
/// # Errors
/// The first error the walk or any copier met (host I/O, the image's refusals).
pub fn copy_tree(fs: &Filesystem, src: &Path, parent: u32, name: &[u8], jobs: usize) -> Result<(u64, u64, u64)> {
    // SAFETY: geteuid and getegid have no preconditions.
    let caller = unsafe { Owner { uid: libc::geteuid(), gid: libc::getegid() } };
    let shared = Shared::new();
    let mut serial = Importer::quiet(fs);
    let mut dirs: Vec<(PathBuf, Metadata, u32)> = Vec::new();
    let mut linked: Vec<Node> = Vec::new();
    let totals = std::thread::scope(|s| {
        let copiers: Vec<_> = (0..jobs.max(1))
            .map(|_| {
                let shared = &shared;
                s.spawn(move || {
                    let _ends = Ends { shared, walk: false };
                    let _caller = fs.acting_as(caller);
                    let mut im = Importer::quiet(fs);
                    while let Some(batch) = shared.take() {
                        for n in &batch.nodes {
                            if shared.failed.load(Ordering::Relaxed) {
                                break;
                            }
                            if let Err(e) = im.copy_with(&n.src, &n.md, n.parent, &n.name) {
                                shared.fail(e);
                                break;
                            }
                        }
                        shared.done_with(batch.dir);
                    }
                    (im.files, im.bytes, im.lost_attributes)
                })
            })
            .collect();
        let walk_ends = Ends { shared: &shared, walk: true };
        if let Err(e) = walk(fs, &shared, src, parent, name, &mut dirs, &mut linked) {
            shared.fail(e);
        }
        drop(walk_ends);
        copiers.into_iter().fold((0, 0, 0), |(f, b, l), c| {
            let (files, bytes, lost) = c.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            (f + files, b + bytes, l + lost)
        })
    });
    if let Some(e) = shared.first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    for n in &linked {
        serial.copy_with(&n.src, &n.md, n.parent, &n.name)?;
    }
    for (path, md, ino) in dirs.iter().rev() {
        serial.finish(path, md, *ino)?;
    }
    Ok((totals.0 + serial.files, totals.1 + serial.bytes, totals.2 + serial.lost_attributes))
}

/// Makes every directory of the tree at `src`, parents first, and hands the
/// other names to the copiers as each directory is made; names of multiply
/// linked inodes go to `linked`, the directories made to `dirs`.
fn walk(
    fs: &Filesystem,
    shared: &Shared,
    src: &Path,
    parent: u32,
    name: &[u8],
    dirs: &mut Vec<(PathBuf, Metadata, u32)>,
    linked: &mut Vec<Node>,
) -> Result<()> {
    let md = std::fs::symlink_metadata(src).map_err(|e| host_error(src, e))?;
    let mut pending = vec![Node { src: src.to_path_buf(), md, parent, name: name.to_vec() }];
    while let Some(dir) = pending.pop() {
        if shared.failed.load(Ordering::Relaxed) {
            return Ok(());
        }
        let owner = Owner { uid: dir.md.uid(), gid: dir.md.gid() };
        let ino = fs.mkdir(dir.parent, &dir.name, (dir.md.mode() & 0o7777) as u16, owner)?.ino;
        let mut subdirs = Vec::new();
        let mut batch = Vec::new();
        for child in host_children(&dir.src)? {
            let path = dir.src.join(&child);
            let md = std::fs::symlink_metadata(&path).map_err(|e| host_error(&path, e))?;
            let node = Node { src: path, md, parent: ino, name: child.as_bytes().to_vec() };
            if node.md.is_dir() {
                subdirs.push(node);
            } else if node.md.nlink() > 1 {
                linked.push(node);
            } else {
                batch.push(node);
                if batch.len() == BATCH {
                    shared.put(Batch { dir: ino, nodes: std::mem::take(&mut batch) });
                }
            }
        }
        if !batch.is_empty() {
            shared.put(Batch { dir: ino, nodes: batch });
        }
        // Reversed onto the stack, so they come off it in the serial order.
        pending.extend(subdirs.into_iter().rev());
        dirs.push((dir.src, dir.md, ino));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Runs `scenario` on a thread of its own; fails if it has not ended in 10 s.
    fn ends_within_seconds(scenario: impl FnOnce() + Send + 'static) {
        let (done, ended) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(scenario)).is_err();
            let _ = done.send(panicked);
        });
        let panicked = ended.recv_timeout(Duration::from_secs(10)).expect("the copy hung");
        assert!(panicked, "the panic was not passed on");
    }

    #[test]
    fn a_walk_that_panics_wakes_the_copiers_waiting_for_batches() {
        ends_within_seconds(|| {
            let shared = Shared::new();
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        let _ends = Ends { shared: &shared, walk: false };
                        assert!(shared.take().is_none());
                    });
                }
                let _walk = Ends { shared: &shared, walk: true };
                std::thread::sleep(Duration::from_millis(50));
                panic!("the walk panics (errors=panic)");
            });
        });
    }

    #[test]
    fn copiers_that_panic_wake_a_walk_waiting_for_room() {
        ends_within_seconds(|| {
            let shared = Shared::new();
            let batch = || Batch { dir: 2, nodes: Vec::new() };
            for _ in 0..MAX_QUEUED {
                shared.put(batch());
            }
            std::thread::scope(|s| {
                s.spawn(|| {
                    let _ends = Ends { shared: &shared, walk: false };
                    std::thread::sleep(Duration::from_millis(50));
                    panic!("a copier panics");
                });
                let _walk = Ends { shared: &shared, walk: true };
                // Full: waits for room until the copier's end stops the copy.
                shared.put(batch());
                assert!(shared.failed.load(Ordering::Relaxed));
            });
        });
    }
}
