//! Readers and writers in one directory at once.
//!
//! Two writers create, rename and unlink names in one directory, through its turn
//! from one linear block into an htree and through many leaf and index splits
//! (again in a fresh directory, epoch after epoch, until the readers have done
//! their lookups); readers
//! meanwhile look up and list names that exist for the whole run. No lookup may
//! miss one, none may fail, and every listing holds each of them exactly once.
//! Then e2fsck -fn must be silent and the kernel's listing must equal what the
//! writers say they left.
//!
//! Also the check-then-lock races of the namespace: a create racing the rmdir of
//! its directory, and a create racing a rename over its directory, never leave a
//! name in a removed directory.
//!
//! `UEXT4_DIR_RACE_LOOKUPS` sets the lookups per block size (default 1,000,000).

mod oracle;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, RwLock};
use uext4::{Error, Filesystem, Options, Owner, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };
const STABLE: usize = 24;
const READERS: usize = 2;
const WRITERS: usize = 2;
/// Names each writer leaves standing before an epoch ends: with both writers,
/// 12,000 names of ~60 bytes, about 850 leaves at 1 KiB and 200 at 4 KiB, well
/// inside a two-level index at 1 KiB (124 x 127 leaves).
const LIVE_PER_WRITER: usize = 6_000;

fn writable() -> Options {
    Options { read_only: false, ..Options::default() }
}

fn stable_name(i: usize) -> Vec<u8> {
    format!("stable-{i:03}").into_bytes()
}

/// One writer's names, created with a long common prefix so that leaves fill fast.
fn churn_name(w: usize, round: u64, i: usize) -> Vec<u8> {
    format!("churn-w{w}-r{round}-{i:06}-padding-to-fill-leaves-sooner").into_bytes()
}

fn lookups_wanted() -> u64 {
    std::env::var("UEXT4_DIR_RACE_LOOKUPS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000)
}

/// A directory the readers work on: made with its stable names (one linear
/// block), then grown by the writers through its turn into an htree and many
/// splits.
struct Epoch {
    dir: u32,
    want: Vec<(Vec<u8>, u32)>,
}

/// When the writers' names existed, by a clock of events (`tick`): a name's
/// life runs from just after its create (or rename to it) returned to just
/// before its unlink (or rename from it) was called. A listing that starts
/// after a name's birth and ends before its death must hold it exactly once.
/// (directory, name) → (born, dies).
type LifeMap = std::collections::HashMap<(u32, Vec<u8>), (u64, u64)>;

#[derive(Default)]
struct Lives {
    clock: AtomicU64,
    /// Writers' names the listings were checked for.
    checked: AtomicU64,
    /// One map per writer.
    by_writer: [std::sync::Mutex<LifeMap>; WRITERS],
}

impl Lives {
    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }
    fn born(&self, w: usize, dir: u32, name: &[u8]) {
        let t = self.tick();
        self.by_writer[w].lock().unwrap().insert((dir, name.to_vec()), (t, u64::MAX));
    }
    fn dies(&self, w: usize, dir: u32, name: &[u8]) {
        let t = self.tick();
        self.by_writer[w].lock().unwrap().get_mut(&(dir, name.to_vec())).expect("a name born before").1 = t;
    }
    /// The names of `dir` alive for the whole of (start, end).
    fn alive_throughout(&self, dir: u32, start: u64, end: u64) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for map in &self.by_writer {
            let map = map.lock().unwrap();
            out.extend(
                map.iter().filter(|((d, _), &(b, x))| *d == dir && b < start && x > end).map(|((_, n), _)| n.clone()),
            );
        }
        out
    }
}

/// Readers look up and list the stable names of the current epoch until
/// `stop`; returns (lookups, listings, failures described).
fn reader(
    fs: Arc<Filesystem>,
    current: Arc<RwLock<Arc<Epoch>>>,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
    lives: Arc<Lives>,
) -> (u64, u64, Vec<String>) {
    let mut failures = Vec::new();
    let (mut lookups, mut listings) = (0u64, 0u64);
    let mut i = 0usize;
    let mut epoch = current.read().unwrap().clone();
    while !stop.load(Ordering::Relaxed) && failures.len() < 20 {
        let (name, ino) = &epoch.want[i % epoch.want.len()];
        match fs.lookup(epoch.dir, name) {
            Ok(Some(found)) if found == *ino => {}
            other => failures.push(format!("lookup of {}: {other:?}", String::from_utf8_lossy(name))),
        }
        lookups += 1;
        i += 1;
        if i.is_multiple_of(64) {
            count.fetch_add(64, Ordering::Relaxed);
            epoch = current.read().unwrap().clone();
        }
        if i.is_multiple_of(5_000) {
            let start = lives.tick();
            let listed = fs.read_dir(epoch.dir);
            let end = lives.tick();
            match listed {
                Ok(entries) => {
                    let listed: std::collections::HashMap<&[u8], usize> =
                        entries.iter().fold(Default::default(), |mut m, e| {
                            *m.entry(e.name.as_slice()).or_default() += 1;
                            m
                        });
                    let alive = lives.alive_throughout(epoch.dir, start, end);
                    for name in &alive {
                        let n = listed.get(name.as_slice()).copied().unwrap_or(0);
                        if n != 1 {
                            failures.push(format!(
                                "listing holds {} {n} times, which lived through it",
                                String::from_utf8_lossy(name)
                            ));
                        }
                    }
                    lives.checked.fetch_add(alive.len() as u64, Ordering::Relaxed);
                    for (name, ino) in &epoch.want {
                        let n = entries.iter().filter(|e| &e.name == name).count();
                        if n != 1 || !entries.iter().any(|e| &e.name == name && e.ino == *ino) {
                            failures.push(format!("listing holds {} {n} times", String::from_utf8_lossy(name)));
                        }
                    }
                    let mut names = BTreeSet::new();
                    for e in &entries {
                        if !names.insert(e.name.clone()) {
                            failures.push(format!("listing holds {} twice", String::from_utf8_lossy(&e.name)));
                        }
                    }
                }
                Err(e) => failures.push(format!("read_dir: {e}")),
            }
            listings += 1;
        }
    }
    (lookups, listings, failures)
}

/// One writer's part of an epoch: rounds of creating names, renaming every 7th
/// and unlinking every 5th, until it has `LIVE_PER_WRITER` names standing. With
/// `clean`, it then unlinks them all, so the next epoch has inodes to use.
/// Returns the names it left.
fn writer(fs: &Filesystem, dir: u32, w: usize, epoch: u64, clean: bool, lives: &Lives) -> BTreeSet<Vec<u8>> {
    let mut left = BTreeSet::new();
    let mut i = 0;
    while left.len() < LIVE_PER_WRITER {
        let name = churn_name(w, epoch, i);
        fs.create(dir, &name, 0o644, ROOT).unwrap();
        lives.born(w, dir, &name);
        left.insert(name.clone());
        if i % 7 == 6 {
            let to = [name.as_slice(), b"-renamed"].concat();
            lives.dies(w, dir, &name);
            fs.rename(dir, &name, dir, &to, 0).unwrap();
            lives.born(w, dir, &to);
            left.remove(&name);
            left.insert(to);
        } else if i % 5 == 4 {
            lives.dies(w, dir, &name);
            fs.unlink(dir, &name).unwrap();
            left.remove(&name);
        }
        i += 1;
    }
    if clean {
        for name in std::mem::take(&mut left) {
            lives.dies(w, dir, &name);
            fs.unlink(dir, &name).unwrap();
        }
    }
    left
}

fn lookups_never_miss_during_splits(block_size: u32, pdirops: bool) {
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("fs.img");
    let status = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", &block_size.to_string(), "-N", "200000"])
        .arg(&image)
        .arg("400M")
        .status()
        .unwrap();
    assert!(status.success());
    let fs = Arc::new(Filesystem::open(&image, Options { pdirops, ..writable() }).unwrap());
    let new_epoch = |k: u64| {
        let dir = fs.mkdir(ROOT_INO, format!("d{k}").as_bytes(), 0o755, ROOT).unwrap().ino;
        let want: Vec<(Vec<u8>, u32)> =
            (0..STABLE).map(|i| (stable_name(i), fs.create(dir, &stable_name(i), 0o644, ROOT).unwrap().ino)).collect();
        assert_eq!(fs.stat(dir).unwrap().size, block_size as u64, "the directory starts as one linear block");
        Arc::new(Epoch { dir, want })
    };
    let current = Arc::new(RwLock::new(new_epoch(0)));

    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let lives = Arc::new(Lives::default());
    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let (fs, current, stop, count) = (fs.clone(), current.clone(), stop.clone(), count.clone());
            let lives = lives.clone();
            std::thread::spawn(move || reader(fs, current, stop, count, lives))
        })
        .collect();
    // Epochs until the readers have done their lookups: in each, the writers
    // grow a fresh directory from one linear block through its htree turn and
    // hundreds of splits; all but the last are emptied of churn names after.
    let wanted = lookups_wanted();
    let mut epochs = Vec::new();
    let mut left = BTreeSet::new();
    let mut blocks = Vec::new();
    for k in 0.. {
        let epoch = current.read().unwrap().clone();
        let last = count.load(Ordering::Relaxed) >= wanted * 3 / 4;
        let kept: Vec<Vec<u8>> = std::thread::scope(|s| {
            let (fs, dir, lives) = (&fs, epoch.dir, &lives);
            let workers: Vec<_> = (0..WRITERS).map(|w| s.spawn(move || writer(fs, dir, w, k, !last, lives))).collect();
            workers.into_iter().flat_map(|w| w.join().expect("a writer panicked")).collect()
        });
        left.extend(kept);
        let size = fs.stat(epoch.dir).unwrap().size / block_size as u64;
        // The last epoch may need more rounds in the same directory.
        if epochs.last().is_none_or(|e: &Arc<Epoch>| e.dir != epoch.dir) {
            epochs.push(epoch);
            blocks.push(size);
        } else {
            *blocks.last_mut().unwrap() = size;
        }
        if last && count.load(Ordering::Relaxed) >= wanted {
            break;
        }
        assert!(k < 40, "the readers made too little progress");
        if !last {
            *current.write().unwrap() = new_epoch(k + 1);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (mut lookups, mut listings, mut failures) = (0, 0, Vec::new());
    for r in readers {
        let (l, n, f) = r.join().expect("a reader panicked");
        lookups += l;
        listings += n;
        failures.extend(f);
    }
    eprintln!(
        "{block_size}-byte blocks, pdirops {pdirops}: {lookups} lookups and {listings} listings during {} epochs of {WRITERS} \
         writers (directories grew to {blocks:?} blocks; {} names left in the last)",
        epochs.len(),
        left.len()
    );
    assert!(failures.is_empty(), "{} failures, first: {:?}", failures.len(), &failures[..failures.len().min(5)]);
    assert!(lookups >= wanted, "{lookups} lookups");
    let checked = lives.checked.load(Ordering::Relaxed);
    eprintln!("listings were checked for {checked} writers' names that lived through them");
    assert!(checked >= 1_000, "only {checked} writers' names were checked in listings");
    assert!(blocks.iter().all(|&b| b > 100), "a directory grew to too few blocks: {blocks:?}");
    drop(fs);

    oracle::assert_e2fsck_clean(&image);
    let m = oracle::Mount::new(&image, "ro");
    for (k, epoch) in epochs.iter().enumerate() {
        let seen: BTreeSet<Vec<u8>> = std::fs::read_dir(m.dir.join(format!("d{k}")))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_encoded_bytes())
            .collect();
        let mut expect: BTreeSet<Vec<u8>> = epoch.want.iter().map(|(n, _)| n.clone()).collect();
        if k + 1 == epochs.len() {
            expect.extend(left.iter().cloned());
        }
        assert_eq!(seen.len(), expect.len(), "d{k}");
        assert!(seen == expect, "the kernel's listing of d{k} differs from what the writers left");
    }
    m.unmount();
}

#[test]
fn lookups_never_miss_during_splits_1k() {
    if oracle::require_e2fsprogs() && oracle::require_loop() {
        lookups_never_miss_during_splits(1024, true);
    }
}

#[test]
fn lookups_never_miss_during_splits_4k() {
    if oracle::require_e2fsprogs() && oracle::require_loop() {
        lookups_never_miss_during_splits(4096, true);
    }
}

#[test]
fn lookups_never_miss_during_splits_1k_pdirops_off() {
    if oracle::require_e2fsprogs() && oracle::require_loop() {
        lookups_never_miss_during_splits(1024, false);
    }
}

#[test]
fn lookups_never_miss_during_splits_4k_pdirops_off() {
    if oracle::require_e2fsprogs() && oracle::require_loop() {
        lookups_never_miss_during_splits(4096, false);
    }
}

/// A create into a directory that an rmdir or a rename over it removes at the
/// same moment: either the create comes first (and the removal then fails with
/// ENOTEMPTY) or it fails with ENOENT. Never both succeed. Every other pair of
/// rounds the victim is an empty indexed directory (filled past one block, then
/// emptied: directories never shrink), where pdirops takes the create by name.
#[test]
fn a_create_never_lands_in_a_removed_directory() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("fs.img");
    uext4::mkfs::mkfs(&image, &uext4::mkfs::MkfsOptions { size: 64 << 20, ..Default::default() }).unwrap();
    let fs = Arc::new(Filesystem::open(&image, writable()).unwrap());
    let (mut created, mut removed) = (0, 0);
    for round in 0..300 {
        let victim = format!("victim-{round}").into_bytes();
        let dir = fs.mkdir(ROOT_INO, &victim, 0o755, ROOT).unwrap().ino;
        if round % 4 >= 2 {
            let filler = |i: usize| format!("filler-{i:03}-long-enough-to-fill-a-block-soon").into_bytes();
            for i in 0..120 {
                fs.create(dir, &filler(i), 0o644, ROOT).unwrap();
            }
            for i in 0..120 {
                fs.unlink(dir, &filler(i)).unwrap();
            }
            assert!(fs.stat(dir).unwrap().size > 4096, "the victim became indexed");
        }
        let by_rename = round % 2 == 1;
        let other = format!("other-{round}").into_bytes();
        if by_rename {
            fs.mkdir(ROOT_INO, &other, 0o755, ROOT).unwrap();
        }
        let start = Arc::new(Barrier::new(2));
        let creator = {
            let (fs, start) = (fs.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                fs.create(dir, b"late", 0o644, ROOT).map(|_| ())
            })
        };
        start.wait();
        let removal = match by_rename {
            false => fs.rmdir(ROOT_INO, &victim),
            true => fs.rename(ROOT_INO, &other, ROOT_INO, &victim, 0),
        };
        let create = creator.join().unwrap();
        match (&create, &removal) {
            (Ok(()), Err(Error::NotEmpty(_))) => created += 1,
            (Err(Error::NotFound(_)), Ok(())) => removed += 1,
            other => panic!("round {round} (rename: {by_rename}): create and removal gave {other:?}"),
        }
    }
    eprintln!("{created} creates came first, {removed} removals came first");
    drop(fs);
    oracle::assert_e2fsck_clean(&image);
}

/// A rename is seen whole by lookups: while one thread renames a file along a
/// chain of new names in one indexed directory (n0 → n1 → n2 ...), another that
/// finds n(i+1) must not then find n(i), which never comes back. Under pdirops
/// the rename adds the new name before it removes the old one, each in its
/// leaf; lookups wait on the names' slots the rename holds.
#[test]
fn lookups_see_a_rename_whole() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("fs.img");
    uext4::mkfs::mkfs(&image, &uext4::mkfs::MkfsOptions { size: 64 << 20, ..Default::default() }).unwrap();
    let fs = Arc::new(Filesystem::open(&image, writable()).unwrap());
    let dir = fs.mkdir(ROOT_INO, b"d", 0o755, ROOT).unwrap().ino;
    for i in 0..400 {
        fs.create(dir, format!("filler-{i:04}-so-that-the-directory-is-an-htree").as_bytes(), 0o644, ROOT).unwrap();
    }
    let name = |i: u64| format!("moving-{i:06}").into_bytes();
    fs.create(dir, &name(0), 0o644, ROOT).unwrap();
    // At least this many renames, and more (up to ten times as many) until the
    // watcher has caught one between its two lookups: on a loaded machine that
    // takes longer.
    const STEPS: u64 = 100_000;
    let at = Arc::new(AtomicU64::new(0));
    let caught = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (fs, at, caught, done) = (fs.clone(), at.clone(), caught.clone(), done.clone());
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !done.load(Ordering::Acquire) {
                let i = at.load(Ordering::Acquire);
                if fs.lookup(dir, &name(i + 1)).unwrap().is_some() {
                    caught.fetch_add(1, Ordering::Relaxed);
                    if fs.lookup(dir, &name(i)).unwrap().is_some() {
                        seen.push(i);
                    }
                }
            }
            seen
        })
    };
    let mut i = 0;
    while i < STEPS || (caught.load(Ordering::Relaxed) == 0 && i < 10 * STEPS) {
        fs.rename(dir, &name(i), dir, &name(i + 1), 0).unwrap();
        at.store(i + 1, Ordering::Release);
        i += 1;
    }
    done.store(true, Ordering::Release);
    let seen = watcher.join().unwrap();
    let checks = caught.load(Ordering::Relaxed);
    eprintln!("{i} renames; {checks} times the new name was found first; the old one with it {} times", seen.len());
    // A watcher that never caught a rename between its two steps judged nothing
    // (a few thousand catches on two CPUs).
    assert!(checks > 0, "the watcher never found a new name before the renamer moved on");
    assert!(seen.is_empty(), "a lookup found both names of renames {:?}", &seen[..seen.len().min(5)]);
    drop(fs);
    oracle::assert_e2fsck_clean(&image);
}
