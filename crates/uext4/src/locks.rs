//! Tables of locks created on demand: one lock per inode (or per directory)
//! without a lock per inode in memory. `LockTable` holds mutexes,
//! `RwLockTable` reader-writer locks (a directory's structure lock).
//!
//! The map from key to lock is split over shards by key, each on cache lines of
//! its own, so operations on different inodes do not meet on one mutex (or one
//! line) just to find their lock. A lock nobody holds stays in its shard until
//! the shard passes `SWEEP_AT` entries, and is swept then: releasing a lock takes
//! no shard lock, and a directory's locks, taken by every change of its names,
//! are not freed and allocated again between two changes (on two threads each of
//! those had been a shard lock and an allocation freed by the other thread).
//! So a table holds at most `SHARDS * SWEEP_AT` free locks, plus those in use.
//!
//! Each thread also remembers the last few locks it found (`Memo`): a change
//! in one directory takes that directory's entries in several tables, each
//! several times, and every trip through a shard wrote the shard's mutex and
//! the lock's reference count, lines the other threads changing names in the
//! same directory wrote too. A remembered lock is found without either. A
//! memo holds a reference, so a remembered lock is never swept: all who ask
//! for a key get the one lock, and each thread keeps at most `MEMO_SLOTS`
//! locks of each kind alive beyond the bound above.
//!
//! Callers that take several must take them in ascending key order (the lock order
//! of docs/ARCHITECTURE.md); `lock_many`, `write_many` and `lock_modes` do that
//! for them.

use crate::memo::Memo;
use crate::number_map::NumberMap;
use crate::padded::CachePadded;
use parking_lot::{ArcMutexGuard, ArcRwLockReadGuard, ArcRwLockWriteGuard, Mutex, RawMutex, RawRwLock, RwLock};
use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::Arc;

const SHARDS: usize = 64;

/// Entries a shard keeps before it sweeps out the locks nobody holds or waits for.
const SWEEP_AT: usize = 32;

/// One shard: key -> lock.
type Shard<L> = CachePadded<Mutex<NumberMap<u64, Arc<L>>>>;

/// Locks of type `L`, one per key in use (and a bounded number of free ones), in shards.
struct Shards<L> {
    shards: Vec<Shard<L>>,
    /// This table among all tables ever made, for the memos: an address could
    /// be a dropped table's, whose locks are not this one's.
    id: u64,
}

impl<L: Default> Default for Shards<L> {
    fn default() -> Shards<L> {
        Shards { shards: (0..SHARDS).map(|_| CachePadded::default()).collect(), id: crate::memo::next_owner_id() }
    }
}

/// A kind of lock with a per-thread memo.
trait Memoized: Sized + Default + 'static {
    /// Runs `f` on this thread's memo, or on none while the thread is
    /// exiting and its memo is gone (a lock taken from another thread-local's
    /// destructor).
    fn with_memo<R>(f: impl FnOnce(Option<&mut Memo<Self>>) -> R) -> R;
}

/// `f` on the memo in `key`, or on none once the thread has dropped it.
fn on_memo<V: 'static, R, F: FnOnce(Option<&mut Memo<V>>) -> R>(
    key: &'static std::thread::LocalKey<RefCell<Memo<V>>>,
    f: F,
) -> R {
    let mut f = Some(f);
    match key.try_with(|m| (f.take().expect("run once"))(Some(&mut m.borrow_mut()))) {
        Ok(r) => r,
        Err(_) => (f.take().expect("not run yet"))(None),
    }
}

impl Memoized for Mutex<()> {
    fn with_memo<R>(f: impl FnOnce(Option<&mut Memo<Self>>) -> R) -> R {
        thread_local!(static MEMO: RefCell<Memo<Mutex<()>>> = RefCell::default());
        on_memo(&MEMO, f)
    }
}

impl Memoized for RwLock<()> {
    fn with_memo<R>(f: impl FnOnce(Option<&mut Memo<Self>>) -> R) -> R {
        thread_local!(static MEMO: RefCell<Memo<RwLock<()>>> = RefCell::default());
        on_memo(&MEMO, f)
    }
}

impl<L: Memoized> Shards<L> {
    /// Runs `f` on `key`'s lock, found through this thread's memo. `f` may
    /// block (taking the lock): the memo is this thread's alone.
    fn with<R>(&self, key: u64, f: impl FnOnce(&Arc<L>) -> R) -> R {
        L::with_memo(|memo| match memo {
            None => f(&self.get(key)),
            Some(memo) => match memo.find(self.id, key) {
                Some(lock) => f(lock),
                None => f(memo.remember(self.id, key, self.get(key))),
            },
        })
    }
}

impl<L: Default> Shards<L> {
    fn shard(&self, key: u64) -> &Mutex<NumberMap<u64, Arc<L>>> {
        &self.shards[crate::number_map::shard_of(key, SHARDS)]
    }

    /// `key`'s lock. A holder, a waiter or a memo owns a clone of the `Arc`, so
    /// an entry whose count is one (the map's own) is free, and only such are swept.
    fn get(&self, key: u64) -> Arc<L> {
        let mut map = self.shard(key).lock();
        if let Some(lock) = map.get(&key) {
            return lock.clone();
        }
        if map.len() >= SWEEP_AT {
            map.retain(|_, lock| Arc::strong_count(lock) > 1);
        }
        map.entry(key).or_default().clone()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

#[derive(Default)]
pub struct LockTable {
    locks: Shards<Mutex<()>>,
}

/// A hold on one key's lock, released when dropped. It borrows its table
/// only to keep holds from outliving it.
pub struct Held<'a> {
    _guard: ArcMutexGuard<RawMutex, ()>,
    _table: PhantomData<&'a LockTable>,
}

impl LockTable {
    pub fn lock(&self, key: u64) -> Held<'_> {
        Held { _guard: self.locks.with(key, Mutex::lock_arc), _table: PhantomData }
    }

    /// Takes the lock of `key` only if nobody holds it.
    pub fn try_lock(&self, key: u64) -> Option<Held<'_>> {
        self.locks.with(key, Mutex::try_lock_arc).map(|guard| Held { _guard: guard, _table: PhantomData })
    }

    /// Locks every distinct key, in ascending order.
    pub fn lock_many(&self, keys: &[u64]) -> Vec<Held<'_>> {
        let mut keys = keys.to_vec();
        keys.sort_unstable();
        keys.dedup();
        keys.into_iter().map(|k| self.lock(k)).collect()
    }
}

/// Reader-writer locks by key.
#[derive(Default)]
pub struct RwLockTable {
    locks: Shards<RwLock<()>>,
}

/// Held only to be dropped: dropping it releases the lock.
enum RwGuard {
    Read(#[allow(dead_code)] ArcRwLockReadGuard<RawRwLock, ()>),
    Write(#[allow(dead_code)] ArcRwLockWriteGuard<RawRwLock, ()>),
}

/// How a key of an `RwLockTable` is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    Shared,
    Exclusive,
}

/// A read or write hold on one key's lock, released when dropped.
pub struct RwHeld<'a> {
    #[cfg_attr(not(test), allow(dead_code))]
    guard: RwGuard,
    _table: PhantomData<&'a RwLockTable>,
}

impl RwLockTable {
    pub fn read(&self, key: u64) -> RwHeld<'_> {
        RwHeld { guard: RwGuard::Read(self.locks.with(key, RwLock::read_arc)), _table: PhantomData }
    }

    pub fn write(&self, key: u64) -> RwHeld<'_> {
        RwHeld { guard: RwGuard::Write(self.locks.with(key, RwLock::write_arc)), _table: PhantomData }
    }

    /// Takes the lock of `key` for writing only if nobody holds it.
    pub fn try_write(&self, key: u64) -> Option<RwHeld<'_>> {
        self.locks.with(key, RwLock::try_write_arc).map(|g| RwHeld { guard: RwGuard::Write(g), _table: PhantomData })
    }

    pub fn lock(&self, key: u64, mode: Mode) -> RwHeld<'_> {
        match mode {
            Mode::Shared => self.read(key),
            Mode::Exclusive => self.write(key),
        }
    }

    /// Write-locks every distinct key, in ascending order.
    pub fn write_many(&self, keys: &[u64]) -> Vec<RwHeld<'_>> {
        let keys: Vec<(u64, Mode)> = keys.iter().map(|&k| (k, Mode::Exclusive)).collect();
        self.lock_modes(&keys)
    }

    /// Locks every distinct key in ascending order, each in the strongest mode
    /// it is asked for (a key asked for shared and exclusive is held exclusive).
    pub fn lock_modes(&self, keys: &[(u64, Mode)]) -> Vec<RwHeld<'_>> {
        let mut keys = keys.to_vec();
        // Ascending key, exclusive first within a key, so dedup keeps it.
        keys.sort_unstable_by_key(|&(k, m)| (k, std::cmp::Reverse(m)));
        keys.dedup_by_key(|(k, _)| *k);
        keys.into_iter().map(|(k, m)| self.lock(k, m)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_exclude_and_release() {
        let table = LockTable::default();
        let a = table.lock(7);
        assert!(table.try_lock(7).is_none(), "held");
        drop(a);
        let b = table.try_lock(7).expect("free again");
        drop(b);
        let rw = RwLockTable::default();
        let r1 = rw.read(3);
        let r2 = rw.read(3);
        assert!(rw.try_write(3).is_none(), "read-held");
        drop((r1, r2));
        let w = rw.write_many(&[9, 3, 9]);
        assert_eq!(w.len(), 2, "9 is taken once");
        assert!(rw.try_write(3).is_none() && rw.try_write(9).is_none());
        drop(w);
        let mixed = rw.lock_modes(&[(5, Mode::Shared), (4, Mode::Shared), (5, Mode::Exclusive)]);
        assert_eq!(mixed.len(), 2);
        assert!(matches!(mixed[0].guard, RwGuard::Read(_)), "4 is held shared");
        assert!(matches!(mixed[1].guard, RwGuard::Write(_)), "5 is held exclusive");
        assert!(rw.try_write(5).is_none() && rw.try_write(4).is_none());
        drop(mixed);
        assert!(rw.try_write(4).is_some());
    }

    #[test]
    fn a_remembered_lock_is_the_one_every_thread_finds() {
        // This thread remembers table one's lock 5, then table one goes and
        // another table (perhaps at the same address) takes its place.
        let one = RwLockTable::default();
        drop(one.write(5));
        drop(one);
        let two = RwLockTable::default();
        let held = two.write(5);
        std::thread::scope(|s| {
            s.spawn(|| assert!(two.try_write(5).is_none(), "this thread holds table two's lock 5"));
        });
        drop(held);
        // Many keys through the memo, then a remembered one, held: still excludes.
        for k in 0..100 {
            drop(two.read(k));
        }
        let held = two.write(99);
        std::thread::scope(|s| {
            s.spawn(|| assert!(two.try_write(99).is_none()));
        });
        drop(held);
        let table = LockTable::default();
        let held = table.lock(1);
        std::thread::scope(|s| {
            s.spawn(|| assert!(table.try_lock(1).is_none()));
        });
        drop(held);
        assert!(table.try_lock(1).is_some());
    }

    #[test]
    fn free_locks_are_swept_and_held_ones_kept() {
        let table = RwLockTable::default();
        let held: Vec<RwHeld<'_>> = (0..100u64).map(|k| table.write(k)).collect();
        // A million keys taken and let go: each shard sweeps when it passes its bound.
        for k in 1_000..1_001_000u64 {
            drop(table.read(k));
        }
        assert!(
            table.locks.len() <= 100 + SHARDS * SWEEP_AT + crate::memo::MEMO_SLOTS,
            "{} entries",
            table.locks.len()
        );
        for k in 0..100u64 {
            assert!(table.try_write(k).is_none(), "lock {k} survived the sweeps while held");
        }
        drop(held);
        assert!(table.try_write(42).is_some());
    }
}
