//! Tables of locks created on demand and dropped when no one holds or waits for
//! them: one lock per inode (or per directory) without a lock per inode in memory.
//! `LockTable` holds mutexes, `RwLockTable` reader-writer locks (a directory's
//! structure lock).
//!
//! The map from key to lock is split over shards by key, so operations on
//! different inodes do not meet on one mutex just to find their lock.
//!
//! Callers that take several must take them in ascending key order (the lock order
//! of docs/ARCHITECTURE.md); `lock_many`, `write_many` and `lock_modes` do that
//! for them.

use crate::number_map::NumberMap;
use parking_lot::{ArcMutexGuard, ArcRwLockReadGuard, ArcRwLockWriteGuard, Mutex, RawMutex, RawRwLock, RwLock};
use std::sync::Arc;

const SHARDS: usize = 64;

/// Locks of type `L`, one per key in use, in shards.
struct Shards<L> {
    shards: Vec<Mutex<NumberMap<u64, Arc<L>>>>,
}

impl<L: Default> Default for Shards<L> {
    fn default() -> Shards<L> {
        Shards { shards: (0..SHARDS).map(|_| Mutex::new(NumberMap::default())).collect() }
    }
}

impl<L: Default> Shards<L> {
    fn shard(&self, key: u64) -> &Mutex<NumberMap<u64, Arc<L>>> {
        // Keys are inode numbers: consecutive ones land in different shards.
        &self.shards[(key % SHARDS as u64) as usize]
    }

    fn get(&self, key: u64) -> Arc<L> {
        self.shard(key).lock().entry(key).or_default().clone()
    }

    /// The caller dropped its hold on `key`'s lock (and its clone of the `Arc`):
    /// the entry goes when only the map's own reference is left.
    fn release(&self, key: u64) {
        let mut map = self.shard(key).lock();
        if map.get(&key).is_some_and(|m| Arc::strong_count(m) == 1) {
            map.remove(&key);
        }
    }
}

#[derive(Default)]
pub struct LockTable {
    locks: Shards<Mutex<()>>,
}

pub struct Held<'a> {
    table: &'a LockTable,
    key: u64,
    guard: Option<ArcMutexGuard<RawMutex, ()>>,
}

impl LockTable {
    pub fn lock(&self, key: u64) -> Held<'_> {
        let m = self.locks.get(key);
        Held { table: self, key, guard: Some(Mutex::lock_arc(&m)) }
    }

    /// Takes the lock of `key` only if nobody holds it.
    pub fn try_lock(&self, key: u64) -> Option<Held<'_>> {
        let m = self.locks.get(key);
        let guard = Mutex::try_lock_arc(&m);
        drop(m);
        match guard {
            Some(guard) => Some(Held { table: self, key, guard: Some(guard) }),
            None => {
                self.locks.release(key);
                None
            }
        }
    }

    /// Locks every distinct key, in ascending order.
    pub fn lock_many(&self, keys: &[u64]) -> Vec<Held<'_>> {
        let mut keys = keys.to_vec();
        keys.sort_unstable();
        keys.dedup();
        keys.into_iter().map(|k| self.lock(k)).collect()
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        self.table.locks.release(self.key);
    }
}

/// Reader-writer locks by key.
#[derive(Default)]
pub struct RwLockTable {
    locks: Shards<RwLock<()>>,
}

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

/// A read or write hold on one key's lock.
pub struct RwHeld<'a> {
    table: &'a RwLockTable,
    key: u64,
    guard: Option<RwGuard>,
}

impl RwLockTable {
    pub fn read(&self, key: u64) -> RwHeld<'_> {
        let l = self.locks.get(key);
        RwHeld { table: self, key, guard: Some(RwGuard::Read(RwLock::read_arc(&l))) }
    }

    pub fn write(&self, key: u64) -> RwHeld<'_> {
        let l = self.locks.get(key);
        RwHeld { table: self, key, guard: Some(RwGuard::Write(RwLock::write_arc(&l))) }
    }

    /// Takes the lock of `key` for writing only if nobody holds it.
    pub fn try_write(&self, key: u64) -> Option<RwHeld<'_>> {
        let l = self.locks.get(key);
        let guard = RwLock::try_write_arc(&l);
        drop(l);
        match guard {
            Some(g) => Some(RwHeld { table: self, key, guard: Some(RwGuard::Write(g)) }),
            None => {
                self.locks.release(key);
                None
            }
        }
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

impl Drop for RwHeld<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        self.table.locks.release(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_go_once_nobody_holds_or_waits() {
        let table = LockTable::default();
        let a = table.lock(7);
        assert!(table.try_lock(7).is_none(), "held");
        drop(a);
        assert!(table.locks.shard(7).lock().is_empty(), "a free lock leaves no entry");
        let b = table.try_lock(7).expect("free again");
        drop(b);
        let rw = RwLockTable::default();
        let r1 = rw.read(3);
        let r2 = rw.read(3);
        drop((r1, r2));
        let w = rw.write_many(&[9, 3, 9]);
        assert_eq!(w.iter().map(|h| h.key).collect::<Vec<_>>(), [3, 9]);
        drop(w);
        let mixed = rw.lock_modes(&[(5, Mode::Shared), (4, Mode::Shared), (5, Mode::Exclusive)]);
        assert_eq!(mixed.iter().map(|h| h.key).collect::<Vec<_>>(), [4, 5]);
        assert!(matches!(mixed[1].guard, Some(RwGuard::Write(_))), "5 is held exclusive");
        assert!(rw.try_write(5).is_none() && rw.try_write(4).is_none());
        drop(mixed);
        assert!(rw.try_write(4).is_some());
        assert!(rw.locks.shards.iter().all(|s| s.lock().is_empty()));
    }
}
