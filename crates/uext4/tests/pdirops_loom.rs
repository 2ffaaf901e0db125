//! The pdirops lock protocol (ns/pdirops.rs) checked by a model checker, loom,
//! on a reduced directory: every interleaving of a few threads, up to a bound
//! of preemptions, is run.
//!
//! The reduced directory keeps what the protocol is about and nothing else: an
//! index (hash start → leaf) behind the directory's structure lock, leaves of
//! two names behind their own (buffer) locks, and name-slot locks (two slots, so
//! different names also collide). Names are small numbers and hash to
//! themselves. The operations follow the library's steps: take the name's slot;
//! look the name up under the structure read lock; insert into its leaf under
//! the read lock and the leaf's lock; on a full leaf, drop the read lock, take
//! the write lock, and try again, splitting the leaf if it is still full.
//! Lookups take the read lock and the leaf's lock only.
//!
//! This checks the protocol as designed, on a model written for it; the
//! library's own code is exercised by tests/dir_races.rs and
//! tests/dir_model_concurrent.rs. The last test shows the checker catching a
//! protocol without slot locks.

use loom::sync::{Arc, Mutex, RwLock};
use loom::thread;

const LEAF_CAP: usize = 2;
const SLOTS: usize = 2;

struct Index {
    /// (first hash, leaf), ascending.
    entries: Vec<(u8, Arc<Mutex<Vec<u8>>>)>,
}

impl Index {
    fn leaf_for(&self, name: u8) -> Arc<Mutex<Vec<u8>>> {
        let at = self.entries.partition_point(|(h, _)| *h <= name).max(1) - 1;
        self.entries[at].1.clone()
    }
}

struct Dir {
    structure: RwLock<Index>,
    slots: Vec<Mutex<()>>,
    /// false: the broken protocol without slot locks (for the last test).
    name_locks: bool,
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Created,
    Exists,
}

impl Dir {
    fn new(names: &[u8], name_locks: bool) -> Arc<Dir> {
        let leaf = Arc::new(Mutex::new(names.to_vec()));
        Arc::new(Dir {
            structure: RwLock::new(Index { entries: vec![(0, leaf)] }),
            slots: (0..SLOTS).map(|_| Mutex::new(())).collect(),
            name_locks,
        })
    }

    fn lookup(&self, name: u8) -> bool {
        let index = self.structure.read().unwrap();
        let leaf = index.leaf_for(name);
        let found = leaf.lock().unwrap().contains(&name);
        found
    }

    fn create(&self, name: u8) -> Outcome {
        let _slot = self.name_locks.then(|| self.slots[name as usize % SLOTS].lock().unwrap());
        if self.lookup(name) {
            return Outcome::Exists;
        }
        {
            let index = self.structure.read().unwrap();
            let leaf = index.leaf_for(name);
            let mut names = leaf.lock().unwrap();
            if names.len() < LEAF_CAP {
                names.push(name);
                return Outcome::Created;
            }
        }
        // A full leaf: again under the write lock, where someone may have split it.
        let mut index = self.structure.write().unwrap();
        let leaf = index.leaf_for(name);
        let mut names = leaf.lock().unwrap();
        if names.len() >= LEAF_CAP {
            names.sort_unstable();
            let half = names.len() / 2;
            let upper = names.split_off(half);
            let start = upper[0];
            let new = Arc::new(Mutex::new(upper));
            drop(names);
            let at = index.entries.partition_point(|(h, _)| *h <= start);
            index.entries.insert(at, (start, new));
            let leaf = index.leaf_for(name);
            leaf.lock().unwrap().push(name);
        } else {
            names.push(name);
        }
        Outcome::Created
    }

    fn unlink(&self, name: u8) -> bool {
        let _slot = self.name_locks.then(|| self.slots[name as usize % SLOTS].lock().unwrap());
        let index = self.structure.read().unwrap();
        let leaf = index.leaf_for(name);
        let mut names = leaf.lock().unwrap();
        let before = names.len();
        names.retain(|&n| n != name);
        before != names.len()
    }

    /// Every name once, each in the leaf its hash leads to.
    fn check(&self) -> Vec<u8> {
        let index = self.structure.read().unwrap();
        let mut all = Vec::new();
        for (i, (start, leaf)) in index.entries.iter().enumerate() {
            let end = index.entries.get(i + 1).map(|(h, _)| *h);
            for &n in leaf.lock().unwrap().iter() {
                assert!(n >= *start || i == 0, "{n} in the leaf starting at {start}");
                assert!(end.is_none_or(|e| n < e), "{n} past its leaf's end");
                all.push(n);
            }
        }
        all.sort_unstable();
        let mut unique = all.clone();
        unique.dedup();
        assert_eq!(all, unique, "a name twice");
        all
    }
}

/// Runs `f` under every interleaving loom finds within 3 preemptions; returns
/// how many it ran (so a test can show the search is not trivially small).
fn model(f: impl Fn() + Sync + Send + 'static) -> usize {
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = runs.clone();
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f()
    });
    let n = runs.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("{n} interleavings");
    n
}

/// Two exclusive creates of one name into a full leaf (both take the split
/// path) while a reader looks up a name the split moves: one create wins, the
/// other says it exists, the reader never misses, and no interleaving deadlocks.
#[test]
fn one_name_two_creates_and_a_reader_during_the_split() {
    let runs = model(|| {
        let dir = Dir::new(&[1, 3], true);
        let creators: Vec<_> = (0..2)
            .map(|_| {
                let dir = dir.clone();
                thread::spawn(move || dir.create(2))
            })
            .collect();
        let reader = {
            let dir = dir.clone();
            thread::spawn(move || dir.lookup(3) && dir.lookup(1))
        };
        let outcomes: Vec<Outcome> = creators.into_iter().map(|c| c.join().unwrap()).collect();
        assert!(reader.join().unwrap(), "a lookup missed a name during the split");
        assert_eq!(outcomes.iter().filter(|o| **o == Outcome::Created).count(), 1, "{outcomes:?}");
        assert_eq!(dir.check(), [1, 2, 3]);
    });
    assert!(runs > 1_000, "only {runs} interleavings explored");
}

/// Different names (in different slots, and in one) into one full leaf, and an
/// unlink of a third: every name that should be there is there once, in its leaf.
#[test]
fn different_names_meet_only_on_their_leaf() {
    let runs = model(|| {
        let dir = Dir::new(&[1, 3], true);
        let a = {
            let dir = dir.clone();
            thread::spawn(move || dir.create(2))
        };
        let b = {
            let dir = dir.clone();
            thread::spawn(move || dir.create(4))
        };
        let c = {
            let dir = dir.clone();
            thread::spawn(move || dir.unlink(1))
        };
        assert_eq!(a.join().unwrap(), Outcome::Created);
        assert_eq!(b.join().unwrap(), Outcome::Created);
        assert!(c.join().unwrap(), "the unlink missed its name");
        assert_eq!(dir.check(), [2, 3, 4]);
    });
    assert!(runs > 1_000, "only {runs} interleavings explored");
}

/// The checker is not blind: without slot locks, some interleaving lets both
/// creates of one name succeed.
#[test]
#[should_panic(expected = "Created")]
fn without_slot_locks_two_creates_of_one_name_both_succeed() {
    model(|| {
        let dir = Dir::new(&[1], false);
        let creators: Vec<_> = (0..2)
            .map(|_| {
                let dir = dir.clone();
                thread::spawn(move || dir.create(2))
            })
            .collect();
        let outcomes: Vec<Outcome> = creators.into_iter().map(|c| c.join().unwrap()).collect();
        assert_eq!(outcomes.iter().filter(|o| **o == Outcome::Created).count(), 1, "{outcomes:?}");
    });
}
