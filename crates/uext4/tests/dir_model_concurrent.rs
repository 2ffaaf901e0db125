//! Concurrent changes in one directory judged against a model (issue 16).
//!
//! Four threads work in one shared directory, which starts as one linear block
//! and grows through its htree turn and many leaf splits (1 KiB blocks). Each
//! thread creates, unlinks, renames and looks up names of its own — nobody else
//! touches them, so each result must be exactly what the thread's own model
//! says — and, once per round, changes one of a few shared names, contended by
//! all: create, unlink, rename in with RENAME_NOREPLACE or replacing, rename
//! out, RENAME_EXCHANGE of two shared names, and link. Rounds are separated by a
//! barrier; after each, the shared names are looked up, and some serial order
//! of that round's shared operations must give every result the threads saw
//! and the names found (the model then takes those names).
//!
//! At the end the model must equal uext4's listing (names and inodes), e2fsck
//! -fn must be silent (link counts included), and the kernel's walk of the
//! directory must equal the model. Run with pdirops on and off.

mod oracle;

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier, Mutex};
use uext4::ns::rename::{RENAME_EXCHANGE, RENAME_NOREPLACE};
use uext4::{Error, Filesystem, Options, Owner, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };
const THREADS: usize = 4;
const SHARED: usize = 4;
const OWN: usize = 400;
const OWN_OPS_PER_ROUND: usize = 6;

fn rounds() -> usize {
    std::env::var("UEXT4_DIR_MODEL_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(6_000)
}

fn shared_name(s: usize) -> Vec<u8> {
    format!("shared-{s}").into_bytes()
}

fn own_name(t: usize, k: usize) -> Vec<u8> {
    format!("own-t{t}-{k:04}-with-a-long-tail-so-leaves-fill-and-split").into_bytes()
}

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
}

/// A change of the shared names, as issued.
#[derive(Clone, Debug)]
enum SharedOp {
    Create(usize),
    Unlink(usize),
    /// An own name holding `ino` renamed onto shared name `s`.
    RenameIn {
        s: usize,
        ino: u32,
        noreplace: bool,
    },
    /// Shared name `s` renamed onto a free own name.
    RenameOut(usize),
    Exchange(usize, usize),
    Link {
        s: usize,
        ino: u32,
    },
}

/// A shared change and what it gave.
#[derive(Clone, Debug)]
struct Done {
    op: SharedOp,
    /// Ok, or the error's name.
    result: Result<(), &'static str>,
    /// The inode a create made, or the one a rename out moved.
    ino: Option<u32>,
    /// A rename in that found its own inode already there: a no-op (POSIX).
    noop: bool,
}

/// Applies `d` to `state` if some state allows its result; false otherwise.
fn apply(state: &mut [Option<u32>], d: &Done) -> bool {
    use SharedOp::*;
    match (&d.op, d.result) {
        (Create(s), Ok(())) if state[*s].is_none() => state[*s] = d.ino,
        (Create(s), Err("exists")) => return state[*s].is_some(),
        (Unlink(s), Ok(())) if state[*s].is_some() => state[*s] = None,
        (Unlink(s), Err("not found")) => return state[*s].is_none(),
        (RenameIn { s, ino, .. }, Ok(())) if d.noop => return state[*s] == Some(*ino),
        (RenameIn { s, ino, noreplace }, Ok(())) if !noreplace || state[*s].is_none() => {
            if state[*s] == Some(*ino) {
                return false; // that would have been a no-op
            }
            state[*s] = Some(*ino)
        }
        (RenameIn { s, noreplace: true, .. }, Err("exists")) => return state[*s].is_some(),
        (RenameOut(s), Ok(())) if state[*s].is_some() && state[*s] == d.ino => state[*s] = None,
        (RenameOut(s), Err("not found")) => return state[*s].is_none(),
        (Exchange(a, b), Ok(())) if state[*a].is_some() && state[*b].is_some() => state.swap(*a, *b),
        (Exchange(a, b), Err("not found")) => return state[*a].is_none() || state[*b].is_none(),
        (Link { s, ino }, Ok(())) if state[*s].is_none() => state[*s] = Some(*ino),
        (Link { s, .. }, Err("exists")) => return state[*s].is_some(),
        _ => return false,
    }
    true
}

/// Whether some order of `done`, applied to `start`, gives every result and ends in `end`.
fn serializable(start: &[Option<u32>], done: &[Done], end: &[Option<u32>]) -> bool {
    fn search(state: &[Option<u32>], left: &[Done], end: &[Option<u32>]) -> bool {
        if left.is_empty() {
            return state == end;
        }
        (0..left.len()).any(|i| {
            let mut next = state.to_vec();
            if !apply(&mut next, &left[i]) {
                return false;
            }
            let rest: Vec<Done> = left.iter().enumerate().filter(|&(j, _)| j != i).map(|(_, d)| d.clone()).collect();
            search(&next, &rest, end)
        })
    }
    search(start, done, end)
}

fn kind(e: &Error) -> &'static str {
    match e {
        Error::Exists(_) => "exists",
        Error::NotFound(_) => "not found",
        other => panic!("unexpected error {other:?}"),
    }
}

/// One thread: its own names judged exactly, one shared change per round.
struct Worker {
    t: usize,
    fs: Arc<Filesystem>,
    dir: u32,
    own: BTreeMap<Vec<u8>, u32>,
    rng: Rng,
}

impl Worker {
    fn own_op(&mut self) {
        let (fs, dir) = (&self.fs, self.dir);
        let name = own_name(self.t, self.rng.below(OWN));
        let held = self.own.get(&name).copied();
        match self.rng.below(8) {
            // Creates outnumber unlinks, so the directory grows through splits.
            0..=3 => match (fs.create(dir, &name, 0o644, ROOT), held) {
                (Ok(st), None) => {
                    self.own.insert(name, st.ino);
                }
                (Err(Error::Exists(_)), Some(_)) => {}
                (r, h) => panic!("create of own {}: {r:?}, model {h:?}", String::from_utf8_lossy(&name)),
            },
            4 => match (fs.unlink(dir, &name), held) {
                (Ok(()), Some(_)) => {
                    self.own.remove(&name);
                }
                (Err(Error::NotFound(_)), None) => {}
                (r, h) => panic!("unlink of own {}: {r:?}, model {h:?}", String::from_utf8_lossy(&name)),
            },
            5 => {
                let to = own_name(self.t, self.rng.below(OWN));
                let r = fs.rename(dir, &name, dir, &to, 0);
                match (r, held) {
                    (Ok(()), Some(ino)) => {
                        // Onto a name of the same inode, rename does nothing.
                        if self.own.get(&to) != Some(&ino) {
                            self.own.remove(&name);
                            self.own.insert(to, ino);
                        }
                    }
                    (Err(Error::NotFound(_)), None) => {}
                    (r, h) => panic!("rename of own {}: {r:?}, model {h:?}", String::from_utf8_lossy(&name)),
                }
            }
            _ => {
                let found = fs.lookup(dir, &name).unwrap();
                assert_eq!(found, held, "lookup of own {}", String::from_utf8_lossy(&name));
            }
        }
    }

    /// An own name holding an inode, made if none is held.
    fn some_own(&mut self) -> (Vec<u8>, u32) {
        if let Some((n, &i)) = self.own.iter().nth(self.rng.below(self.own.len().max(1))) {
            return (n.clone(), i);
        }
        let name = own_name(self.t, self.rng.below(OWN));
        let ino = self.fs.create(self.dir, &name, 0o644, ROOT).unwrap().ino;
        self.own.insert(name.clone(), ino);
        (name, ino)
    }

    fn free_own(&mut self) -> Vec<u8> {
        loop {
            let name = own_name(self.t, self.rng.below(OWN));
            if !self.own.contains_key(&name) {
                return name;
            }
        }
    }

    fn shared_op(&mut self) -> Done {
        let (fs, dir) = (self.fs.clone(), self.dir);
        let s = self.rng.below(SHARED);
        let sn = shared_name(s);
        let done = |op, r: uext4::Result<()>, ino| Done { op, result: r.map_err(|e| kind(&e)), ino, noop: false };
        match self.rng.below(7) {
            0 => match fs.create(dir, &sn, 0o644, ROOT) {
                Ok(st) => done(SharedOp::Create(s), Ok(()), Some(st.ino)),
                Err(e) => done(SharedOp::Create(s), Err(e), None),
            },
            1 => done(SharedOp::Unlink(s), fs.unlink(dir, &sn), None),
            2 | 3 => {
                let noreplace = self.rng.below(2) == 0;
                let (own, ino) = self.some_own();
                let flags = if noreplace { RENAME_NOREPLACE } else { 0 };
                let r = fs.rename(dir, &own, dir, &sn, flags);
                let mut d = done(SharedOp::RenameIn { s, ino, noreplace }, r, None);
                if d.result.is_ok() {
                    // Still there: the shared name held this very inode.
                    d.noop = fs.lookup(dir, &own).unwrap() == Some(ino);
                    if !d.noop {
                        self.own.remove(&own);
                    }
                }
                d
            }
            4 => {
                let to = self.free_own();
                let r = fs.rename(dir, &sn, dir, &to, 0);
                let ino = match r {
                    Ok(()) => {
                        let ino = fs.lookup(dir, &to).unwrap().expect("the name renamed out is there");
                        self.own.insert(to, ino);
                        Some(ino)
                    }
                    Err(_) => None,
                };
                done(SharedOp::RenameOut(s), r, ino)
            }
            5 => {
                let b = (s + 1 + self.rng.below(SHARED - 1)) % SHARED;
                let r = fs.rename(dir, &sn, dir, &shared_name(b), RENAME_EXCHANGE);
                done(SharedOp::Exchange(s, b), r, None)
            }
            _ => {
                let (_, ino) = self.some_own();
                let r = fs.link(ino, dir, &sn).map(drop);
                done(SharedOp::Link { s, ino }, r, None)
            }
        }
    }
}

fn run(pdirops: bool) {
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("fs.img");
    let status = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "1024", "-N", "16384"])
        .arg(&image)
        .arg("64M")
        .status()
        .unwrap();
    assert!(status.success());
    let fs = Arc::new(Filesystem::open(&image, Options { read_only: false, pdirops, ..Options::default() }).unwrap());
    let dir = fs.mkdir(ROOT_INO, b"d", 0o755, ROOT).unwrap().ino;
    let rounds = rounds();
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let round_done: Arc<Mutex<Vec<Done>>> = Arc::default();
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (fs, barrier, round_done) = (fs.clone(), barrier.clone(), round_done.clone());
            std::thread::spawn(move || {
                let seed = 0x9e37_79b9_7f4a_7c15 ^ ((t as u64 + 1) << 20) ^ pdirops as u64;
                let mut w = Worker { t, fs, dir, own: BTreeMap::new(), rng: Rng(seed) };
                for _ in 0..rounds {
                    barrier.wait();
                    let at = w.rng.below(OWN_OPS_PER_ROUND + 1);
                    for i in 0..=OWN_OPS_PER_ROUND {
                        if i == at {
                            let d = w.shared_op();
                            round_done.lock().unwrap().push(d);
                        } else {
                            w.own_op();
                        }
                    }
                    barrier.wait();
                }
                w.own
            })
        })
        .collect();
    let mut state = vec![None; SHARED];
    let (mut succeeded, mut refused) = (0, 0);
    for round in 0..rounds {
        barrier.wait();
        barrier.wait();
        let done = std::mem::take(&mut *round_done.lock().unwrap());
        assert_eq!(done.len(), THREADS, "round {round}: a worker died");
        let end: Vec<Option<u32>> = (0..SHARED).map(|s| fs.lookup(dir, &shared_name(s)).unwrap()).collect();
        assert!(
            serializable(&state, &done, &end),
            "round {round}: no serial order gives {done:?} from {state:?} to {end:?}"
        );
        succeeded += done.iter().filter(|d| d.result.is_ok()).count();
        refused += done.iter().filter(|d| d.result.is_err()).count();
        state = end;
    }
    let mut model: BTreeMap<Vec<u8>, u32> = BTreeMap::new();
    for w in workers {
        model.extend(w.join().expect("a worker panicked"));
    }
    for (s, ino) in state.iter().enumerate() {
        if let Some(ino) = ino {
            model.insert(shared_name(s), *ino);
        }
    }
    let blocks = fs.stat(dir).unwrap().size / 1024;
    eprintln!(
        "pdirops {pdirops}: {rounds} rounds, {succeeded} shared changes done and {refused} refused, \
         {} names at the end in {blocks} blocks",
        model.len()
    );
    assert!(blocks > 50, "the directory grew to only {blocks} blocks");
    let listed: BTreeMap<Vec<u8>, u32> = fs
        .read_dir(dir)
        .unwrap()
        .into_iter()
        .filter(|e| e.name != b"." && e.name != b"..")
        .map(|e| (e.name, e.ino))
        .collect();
    assert!(listed == model, "uext4's listing differs from the model");
    drop(fs);

    oracle::assert_e2fsck_clean(&image);
    let m = oracle::Mount::new(&image, "ro");
    let walked: BTreeMap<Vec<u8>, u32> = std::fs::read_dir(m.dir.join("d"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            use std::os::unix::fs::DirEntryExt;
            (e.file_name().into_encoded_bytes(), e.ino() as u32)
        })
        .collect();
    m.unmount();
    assert_eq!(walked.len(), model.len());
    assert!(walked == model, "the kernel's walk differs from the model");
}

#[test]
fn concurrent_changes_match_a_serial_model_pdirops_on() {
    if oracle::require_e2fsprogs() && oracle::require_loop() {
        run(true);
    }
}

#[test]
fn concurrent_changes_match_a_serial_model_pdirops_off() {
    if oracle::require_e2fsprogs() && oracle::require_loop() {
        run(false);
    }
}

/// The checker itself: it refuses histories no serial order explains.
#[test]
fn the_checker_refuses_impossible_histories() {
    let ok = |op| Done { op, result: Ok(()), ino: Some(12), noop: false };
    // Two creates of one name both succeeding: impossible in any order.
    let both = [ok(SharedOp::Create(0)), ok(SharedOp::Create(0))];
    assert!(!serializable(&[None], &both, &[Some(12)]));
    // A create and an unlink both succeeding: create then unlink.
    let pair = [ok(SharedOp::Unlink(0)), ok(SharedOp::Create(0))];
    assert!(serializable(&[None], &pair, &[None]));
    assert!(!serializable(&[None], &pair, &[Some(12)]), "the end state must match too");
    // An exchange that succeeded although one side never existed.
    let ex = [Done { op: SharedOp::Exchange(0, 1), result: Ok(()), ino: None, noop: false }];
    assert!(!serializable(&[Some(3), None], &ex, &[None, Some(3)]));
}
